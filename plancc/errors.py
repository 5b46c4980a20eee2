"""The one exception family the CLI turns into exit code 2 with a clear message and no traceback."""


class PlanccError(Exception):
    """Bad input, usage or file; the message says where (file, row, column) and what to change."""


class InputError(PlanccError):
    """A source file, row or column cannot be used."""
