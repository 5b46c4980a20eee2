"""The one exception family the CLI turns into exit code 2 with a clear message and no traceback, and how a message
says that the machine ran out of something."""

import errno
import os
import resource


class PlanccError(Exception):
    """Bad input, usage or file; the message says where (file, row, column) and what to change."""


class InputError(PlanccError):
    """A source file, row or column cannot be used."""


class SettingsError(PlanccError):
    """A setting is missing, out of range or inconsistent; the message names it (`setting`: its name, when one
    setting alone is wrong, so that `plancc.config.resolve` can say which config file set it)."""

    def __init__(self, message: str, setting: str | None = None):
        super().__init__(message)
        self.setting = setting


class PlanMismatchError(PlanccError):
    """The plan, the data, the run's world size or a saved sampler state do not fit together; the message says how."""


def clip(value: object, limit: int = 120) -> str:
    """`str(value)` cut to `limit` characters on one line, so a deeply nested type or value cannot flood a message."""
    text = " ".join(str(value).split())
    return text if len(text) <= limit else f"{text[: limit - 15]}... ({len(text)} chars)"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed from: missing, damaged, or not the same step on every rank."""


class PlanccWarning(UserWarning):
    """Something the user should know that does not stop the command (the CLI prints it as one line)."""


_NO_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


def out_of_descriptors(exc: BaseException | None) -> bool:
    """Whether `exc`, or an exception it was raised from or while handling (shown or not), is running out of file
    descriptors: wherever it happens (reading a part, writing the cache, opening a plan) it gets one hint."""
    return any((isinstance(e, OSError) and e.errno in _NO_DESCRIPTORS)
               or any(os.strerror(code) in str(e) for code in _NO_DESCRIPTORS)  # a message made from one
               for e in _chain(exc))


def descriptors_hint() -> str:
    """What to do when the process runs out of file descriptors: the limit it has, and how to raise it."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return (f"too many open files (this process may open {soft}, see `ulimit -n`): raise the limit (e.g. "
            "`ulimit -n 4096`) or lower --num-proc")


# what libraries say when a thread cannot start (its stack does not fit under `ulimit -v`, or no task is left):
# Python's threading, Arrow's thread pool, the tokenizer's (Rust rayon) pool
_NO_THREAD = ("can't start new thread", "Failed to launch worker thread", "ThreadPoolBuildError")


def _chain(exc: BaseException | None) -> list[BaseException]:
    """`exc` and what it was raised from or while handling, shown or not."""
    out: list[BaseException] = []
    while exc is not None and all(e is not exc for e in out):
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


def out_of_memory(exc: BaseException) -> str | None:
    """What ran out when `exc` (or what it came from) means the process is out of memory: "memory" (a MemoryError,
    ENOMEM), "thread" (a thread could not start, a library's way of saying so), else None."""
    for e in _chain(exc):
        if any(text in str(e) for text in _NO_THREAD):
            return "thread"
        if isinstance(e, MemoryError) or (isinstance(e, OSError) and e.errno == errno.ENOMEM):
            return "memory"
    return None
