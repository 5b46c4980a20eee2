"""`python -m plancc` and the `plancc` script: the CLI, with SIGINT/SIGTERM answered from the first moment.

Start-up (importing typer, pyarrow, numba: up to seconds) writes nothing, so an interrupt then exits at once with
a message that says so; each command's `fail_on_errors` takes over from there (`plancc.cli.common`).
"""

import atexit
import contextlib
import os
import signal
import sys

from plancc.core.faults import fault


def _startup_interrupt(signum: int, _frame: object) -> None:
    os.write(2, b"interrupted while plancc was starting: nothing was written\n")
    os._exit(128 + signum)


_startup_interrupt.plancc_startup = True  # type: ignore[attr-defined]  # what fail_on_errors may take over


def main() -> None:
    """Install the start-up interrupt handler, then import and run the CLI."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _startup_interrupt)
    fault("startup")  # the tests' crash point before the CLI is imported (`plancc.core.faults`)
    from plancc.cli import app

    try:
        app(prog_name="plancc")
    except SystemExit as done:
        _leave(done.code)
    _leave(0)


def _leave(code: int | str | None) -> None:
    """Exit with `code` after Python's own exit work (atexit handlers, buffered output) but without the C++ static
    destructors: Arrow's thread pool can abort a process there after its work is done (SIGABRT, "terminate called
    without an active exception", apache/arrow#34314), which would turn a finished command into exit 134."""
    if isinstance(code, str):  # sys.exit("message"): Python prints it and exits 1
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BrokenPipeError, ValueError):  # `plancc ... | head` closed the pipe
            stream.flush()
    os._exit(code or 0)


if __name__ == "__main__":
    main()
