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


class PlanccWarning(UserWarning):
    """Something the user should know that does not stop the command (the CLI prints it as one line)."""


_NO_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


def out_of_descriptors(exc: BaseException | None) -> bool:
    """Whether `exc`, or an exception it was raised from or while handling (shown or not), is running out of file
    descriptors: wherever it happens (reading a part, writing the cache, opening a plan) it gets one hint."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _NO_DESCRIPTORS:
            return True
        if any(os.strerror(code) in str(exc) for code in _NO_DESCRIPTORS):  # a message made from one
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def descriptors_hint() -> str:
    """What to do when the process runs out of file descriptors: the limit it has, and how to raise it."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return (f"too many open files (this process may open {soft}, see `ulimit -n`): raise the limit (e.g. "
            "`ulimit -n 4096`) or lower --num-proc")
