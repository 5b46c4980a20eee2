"""Replace a whole output directory so that its path always holds the complete old or the complete new one.

The protocol, for a target `D/NAME` (all names hidden, beside the target, never inside it):

1. Lock: `D/.NAME.lock`, held with `flock` (the kernel drops it when its process dies, so a dead writer's lock
   never blocks) and unlinked by its holder when done (no litter). A second live writer is refused.
2. Recover (also run by every reader of a plan or scan directory, see `recover`): leftovers of dead writers
   beside the target are reclaimed, see the crash states below.
3. Write the new directory as `D/.NAME.plancc-tmp-PID-HEX`, fsync every file and the directory. The caller's
   check of the target (`outputs.check_output`: nothing in it that plancc did not write) runs before and after.
4. Commit: `renameat2(tmp, D/NAME, RENAME_EXCHANGE)` swaps the two paths in one step (the old directory now sits
   under the temporary name), or `rename(tmp, D/NAME)` when there is no old one. Where the filesystem has no
   exchange, two renames: `D/NAME -> D/.NAME.plancc-old-PID-HEX`, then `tmp -> D/NAME`. Then fsync `D`.
   SIGINT and SIGTERM are held back (in the main thread) for the few system calls of the commit, so an interrupt
   lands before it (old directory unchanged) or after it (new directory in place), and the message says which.
5. Remove the old directory, unless a reader holds it (see below): then it stays under its hidden name until no
   process reads it, and a later command removes it. Unlink the lock.

**Readers.** A process that reads a plan (`plancc.store.plan_store.PlanFiles`) holds its directory open with a
shared `flock` (`hold_for_reading`) for as long as it reads it. Removal (step 5, and recovery's) takes the
directory's lock exclusively without waiting first and leaves a held directory in place, so a run keeps the plan it
opened, its spawned workers included (they read through the same descriptor), while a recompile puts a new one at
the path. The kernel drops a reader's lock with its last descriptor of the directory (its process's end included).
Where the filesystem has no `flock` on directories, nothing is held and removal is as before.

Crash states (SIGKILL or power loss at each step) and what the next command does with them:

| killed after           | at D/NAME                | left beside it             | recovery                               |
|------------------------|--------------------------|----------------------------|----------------------------------------|
| 3 (written or synced)  | complete old (or none)   | tmp holding a partial new  | tmp removed                            |
| 4, exchange            | complete new             | tmp holding the old        | tmp removed                            |
| 4, first of two renames| nothing                  | old + complete new tmp     | old renamed back (rolled back), tmp removed |
| 4, second rename       | complete new             | old                        | old removed                            |
| 5                      | complete new             | (part of) the old          | removed                                |
| any step               | as above                 | its `.NAME.lock` file      | removed (it blocks nothing meanwhile)  |
| 5, a reader holds old  | complete new             | the old (hidden)           | removed once no reader holds it        |

Only leftovers whose lock can be taken are touched, so a live writer's temporaries are never reclaimed.
The tests crash a replace at the named points of this sequence (`plancc.core.faults`): `written`, `synced`,
`moved_old` (two-rename fallback only), `swapped`, `cleanup`.

Step 3 fails as a whole: an OSError while writing (a full disk, whichever file a copy read) is `WriteFailed`,
naming the target and saying that what was there is unchanged.

`PLANCC_REPLACE=rename` forces the two-rename fallback (to test it on a filesystem that has the exchange).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import re
import shutil
import signal
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from plancc.core.faults import fault
from plancc.errors import PlanccError

_EXCHANGE = os.environ.get("PLANCC_REPLACE", "exchange") != "rename"
# DOTALL and fullmatch: a name may hold any character but "/" and NUL, a newline too
_LEFTOVER = re.compile(r"\.(?P<name>.+)\.plancc-(?:tmp|old)-\d+-[0-9a-f]+", re.DOTALL)
_LOCK = re.compile(r"\.(?P<name>.+)\.lock", re.DOTALL)
_LOCK_MARK = b"plancc pid "


class OutputBusy(PlanccError):
    """Another live plancc process is writing the same output directory."""


class WriteFailed(PlanccError):
    """Writing the new directory failed (no space, no permission, ...); the message names the target and says
    that what was there is unchanged."""


class Interrupted(KeyboardInterrupt):
    """SIGINT/SIGTERM during a replace; `message` says truthfully what is at the path now."""

    def __init__(self, message: str, signum: int = signal.SIGINT) -> None:
        super().__init__(message)
        self.message = message
        self.signum = signum


def read_regular(path: Path) -> bytes | None:
    """The bytes of `path` when it is a regular file (not followed through a link), else None: a FIFO, device or
    socket where plancc expects its own file is never opened for reading, which could block forever."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    except OSError:
        return None
    finally:
        os.close(fd)


# ---------------------------------------------------------------- locks


WRITER_PATIENCE = 5.0  # seconds a write waits for the lock before calling the output busy (a reader's recovery)


@contextlib.contextmanager
def _lock(parent: Path, name: str, *, wait: bool = False, patience: float = 0.0) -> Iterator[bool]:
    """Hold `parent/.name.lock`; yields False (holding nothing) when a live process has it and `wait` is off, after
    trying again for `patience` seconds (a reader's recovery holds it for a moment: `recover`).

    The holder unlinks the file before releasing it; a process that locked a file already unlinked (it opened it
    just before) sees the path point elsewhere and tries again, so two processes never both hold the lock.
    """
    path = parent / f".{name}.lock"
    deadline = time.monotonic() + patience
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OutputBusy(f"{path} is not a plancc lock file (not a regular file): remove it, or choose another -o")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            if time.monotonic() < deadline:
                time.sleep(0.02)
                continue
            yield False
            return
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, _LOCK_MARK + str(os.getpid()).encode() + b"\n")
        yield True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)


@contextlib.contextmanager
def exclusive(parent: Path, name: str) -> Iterator[None]:
    """Hold `parent/.name.lock` for the block, waiting while a live process holds it (a dead one's frees itself):
    serializes work that must not run twice at once, e.g. two scans of one source filling one cache entry."""
    parent.mkdir(parents=True, exist_ok=True)
    with _lock(parent, name, wait=True):
        yield


def _lock_owner(parent: Path, name: str) -> str:
    raw = read_regular(parent / f".{name}.lock") or b""
    if raw.startswith(_LOCK_MARK):
        return f" (pid {raw[len(_LOCK_MARK):].strip().decode(errors='replace')})"
    return ""


# ---------------------------------------------------------------- recovery


def _remove(path: Path) -> None:
    """Remove a leftover file or directory; a directory a reader holds (`hold_for_reading`) is left for later."""
    if not (path.is_dir() and not path.is_symlink()):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        shutil.rmtree(path, ignore_errors=True)
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # a run reads it: a later command removes it once none does
        except OSError:
            pass  # no locks on this filesystem: nothing can be held
        shutil.rmtree(path, ignore_errors=True)
    finally:
        os.close(fd)


def hold_for_reading(fd: int) -> None:
    """Hold the directory open at `fd` for reading: a shared `flock` (waiting while a remover holds it) that keeps
    a replace or a recovery from removing it (module docstring, Readers). Best effort: a filesystem without locks
    on directories holds nothing."""
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_SH)


def is_at(fd: int, path: Path) -> bool:
    """Whether the directory open at `fd` is still the one at `path` (not replaced or removed since it was
    opened)."""
    try:
        here, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _recover_name(parent: Path, name: str, leftovers: list[Path]) -> None:
    """With NAME's lock held: roll back an unfinished two-rename swap, then remove every leftover of NAME."""
    target = parent / name
    olds = sorted(p for p in leftovers if ".plancc-old-" in p.name)
    if olds and not os.path.lexists(target):
        os.rename(olds[0], target)  # killed between the two renames: the old directory is whole, put it back
        fsync_dir(parent)
        leftovers = [p for p in leftovers if p != olds[0]]
    for p in leftovers:
        _remove(p)


def recover(target: str | Path) -> None:
    """Reclaim what dead writers left beside `target` (in its parent directory), restoring a target that an
    interrupted two-rename swap left missing. Best effort: a read-only parent is left as it is."""
    parent = Path(os.path.realpath(target)).parent
    try:
        entries = os.listdir(parent)
    except OSError:
        return
    names: dict[str, list[Path]] = {}
    for entry in entries:
        m = _LEFTOVER.fullmatch(entry)
        if m:
            names.setdefault(m["name"], []).append(parent / entry)
        else:
            m = _LOCK.fullmatch(entry)
            if m and _is_our_lock(parent / entry):
                names.setdefault(m["name"], [])
    for name, leftovers in names.items():
        with contextlib.suppress(OSError, OutputBusy), _lock(parent, name) as held:
            if held:
                _recover_name(parent, name, leftovers)


def _is_our_lock(path: Path) -> bool:
    return (read_regular(path) or b"").startswith(_LOCK_MARK)


# ---------------------------------------------------------------- durability and the swap


def fsync_dir(path: str | Path) -> None:
    """fsync a directory, so that the renames inside it survive a power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for f in files:
            fd = os.open(os.path.join(dirpath, f), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276}


def _renameat2() -> Callable[..., int] | None:
    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is not None:
        return fn
    number = _SYS_RENAMEAT2.get(os.uname().machine)
    if number is None:
        return None
    return lambda *args: libc.syscall(number, *args)


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically; False when this OS or filesystem cannot (then nothing changed)."""
    fn = _renameat2() if _EXCHANGE else None
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


@contextlib.contextmanager
def _signals_held() -> Iterator[list[int]]:
    """Hold back SIGINT/SIGTERM (main thread only; elsewhere Python delivers none); re-deliver after."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return
    sigs = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, _: caught.append(signum)) for s in sigs}
    try:
        yield caught
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _commit(tmp: Path, target: Path, stamp: str) -> Path | None:
    """Put `tmp` at `target`; returns where the old directory now is (None when there was none)."""
    if not os.path.lexists(target):
        os.rename(tmp, target)
        fault("swapped")
        return None
    if exchange(tmp, target):
        fault("swapped")
        return tmp
    old = target.parent / f".{target.name}.plancc-old-{stamp}"
    os.rename(target, old)
    fault("moved_old")
    try:
        os.rename(tmp, target)
    except OSError:
        os.rename(old, target)  # put the old directory back before reporting the error
        raise
    fault("swapped")
    return old


_replaced: set[Path] = set()  # targets this process has replaced (committed), for `interrupted_message`


def interrupted_message(target: str | Path, what: str) -> str:
    """What an interrupt outside a replace (during the work before it, or the summary after it) leaves at
    `target`, truthfully: the new directory when this process replaced it, else whatever was there."""
    target = Path(os.path.realpath(target))
    if target in _replaced:
        return f"interrupted after the new {what} was written: the new {what} is in place at {target}"
    return f"interrupted before the {what} was written: {untouched(target, what)}"


def untouched(target: Path, what: str) -> str:
    """What is at `target` when a replace did not happen: the old directory, or nothing plancc wrote."""
    try:
        kept = target.is_dir() and any(os.scandir(target))
    except OSError:
        kept = False
    return f"the old {what} is unchanged at {target}" if kept else f"nothing was written at {target}"


def _reason(exc: OSError, tmp: Path, target: Path) -> str:
    """An OSError of the write as the user's paths: a full disk is the target's, whichever file the copy read
    (a copy's error names its source first); other errors name their file, under `target` not the temporary."""
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or not exc.filename:
        return reason
    where = os.fsdecode(exc.filename)
    if where.startswith(f"{tmp}{os.sep}"):
        where = str(target / os.path.relpath(where, tmp))
    return f"{reason} ({where})"


@contextlib.contextmanager
def replace_directory(target: str | Path, check: Callable[[Path], None] | None = None, *,
                      what: str = "output") -> Iterator[Path]:
    """Yield a fresh temporary directory beside `target`; when the block ends without error it replaces
    `target` whole (see the module docstring). `check(target)` runs under the lock, before anything is created
    and again just before the commit (what was added to `target` meanwhile is not lost), and raises to refuse the
    target. On error or interrupt `target` is left as it was; a failed write (`WriteFailed`) and an interrupt
    (`Interrupted`) name `target` and say so."""
    target = Path(os.path.realpath(target))
    parent, name = target.parent, target.name
    parent.mkdir(parents=True, exist_ok=True)
    with _lock(parent, name, patience=WRITER_PATIENCE) as held:
        if not held:
            raise OutputBusy(f"another plancc process{_lock_owner(parent, name)} is writing {target} now; wait "
                             "for it or choose another -o")
        recover(target)  # the lock on NAME is ours: other names' leftovers are reclaimed, NAME's below
        _recover_name(parent, name, [parent / e for e in os.listdir(parent)
                                     if (m := _LEFTOVER.fullmatch(e)) and m["name"] == name])
        if check is not None:
            check(target)
        stamp = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        tmp = parent / f".{name}.plancc-tmp-{stamp}"
        tmp.mkdir()
        old: Path | None = None
        committed = False
        try:
            yield tmp
            fault("written")
            _fsync_tree(tmp)
            fault("synced")
            if check is not None:
                check(target)
            with _signals_held() as caught:
                old = _commit(tmp, target, stamp)
                committed = True
                _replaced.add(target)
                fsync_dir(parent)
            for signum in caught[:1]:
                signal.raise_signal(signum)  # the held-back interrupt, now that the new directory is in place
            fault("cleanup")
        except KeyboardInterrupt as exc:
            signum = exc.args[0] if exc.args and isinstance(exc.args[0], int) else signal.SIGINT
            if committed:
                raise Interrupted(f"interrupted after the new {what} was written: the new {what} is in place at "
                                  f"{target}", signum) from None
            raise Interrupted(f"interrupted before the {what} was replaced: {untouched(target, what)}", signum
                              ) from None
        except OSError as exc:
            if committed:
                raise
            raise WriteFailed(f"cannot write the {what} at {target}: {_reason(exc, tmp, target)}; "
                              f"{untouched(target, what)}") from None
        finally:
            if not committed:
                _remove(tmp)
            elif old is not None:
                _remove(old)
