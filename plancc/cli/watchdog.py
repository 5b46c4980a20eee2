"""SIGINT and SIGTERM end plancc even when a native call never returns.

Python runs a signal handler in the main thread between bytecodes. A native call that never returns (a
tokenizer's allocation-failure path deadlocking under `ulimit -v`, a lock that a dead thread held) keeps the
main thread from ever getting there, and so does joining a worker thread stuck in one: plancc then ignored SIGTERM
and Ctrl-C for as long as the call lasted. While a command runs, the C-level handler also writes each signal to a
pipe (`signal.set_wakeup_fd`) that a daemon thread reads; after SIGINT or SIGTERM it gives plancc's own handler
`GRACE` seconds to end the command its way (the message saying what is on disk, the exit code), then says the
same and ends the process itself. Every plancc output is written atomically, so an end at any point leaves the old
or the new result, never a mixture; a temporary directory left behind is removed by the next write there.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator

GRACE = 10.0  # seconds plancc's own handler has to end the command after SIGINT or SIGTERM
_ENDING = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def watchdog(message: Callable[[], str], grace: float = GRACE) -> Iterator[None]:
    """Watch for SIGINT/SIGTERM while the block runs (module docstring); `message()` is what the end says. Only
    the main thread can watch, and only when nothing else (an event loop) uses the wakeup descriptor."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    except ValueError:
        previous = None
    if previous != -1:  # not ours to take (or not possible here)
        if previous is not None:
            signal.set_wakeup_fd(previous)
        os.close(read_end)
        os.close(write_end)
        yield
        return
    done = threading.Event()
    watcher = threading.Thread(target=_watch, args=(read_end, done, message, grace), daemon=True,
                               name="plancc-watchdog")
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(-1)
        done.set()  # the command ended: a watcher that a signal armed stands down
        os.close(write_end)  # an idle watcher reads end-of-file and ends


def _watch(read_end: int, done: threading.Event, message: Callable[[], str], grace: float) -> None:
    """Read signal numbers; after SIGINT or SIGTERM, end the process if it is still here `grace` seconds on. The
    read end stays open until the command ends (`done`): a later signal written to a closed pipe would print a
    `BrokenPipeError` from the C handler."""
    try:
        signum = None
        while signum is None:
            data = os.read(read_end, 64)
            if not data:
                return
            signum = next((s for s in data if s in _ENDING), None)
        if done.wait(grace):  # the command's own handler ended it, message, exit code and all
            return
    finally:
        os.close(read_end)
    try:
        said = message()
    except Exception:  # what is on disk could not be read: say the rest
        said = "interrupted"
    with contextlib.suppress(OSError):
        os.write(2, f"{said} (plancc ended itself {grace:g} s after the signal: a native call did not return)\n"
                 .encode())
    os._exit(128 + signum)
