"""The one exception family the CLI turns into exit code 2 with a clear message and no traceback."""


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
