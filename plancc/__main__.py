"""`python -m plancc` and the `plancc` script: the CLI, with SIGINT/SIGTERM answered from the first moment.

Start-up (importing typer, pyarrow, numba: up to seconds) writes nothing, so an interrupt then exits at once with
a message that says so; each command's `fail_on_errors` takes over from there (`plancc.cli.common`).
"""

import os
import signal


def _startup_interrupt(signum: int, _frame: object) -> None:
    os.write(2, b"interrupted while plancc was starting: nothing was written\n")
    os._exit(128 + signum)


_startup_interrupt.plancc_startup = True  # type: ignore[attr-defined]  # what fail_on_errors may take over


def main() -> None:
    """Install the start-up interrupt handler, then import and run the CLI."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _startup_interrupt)
    if os.environ.get("PLANCC_FAULT"):  # tests only; plancc.store.atomic is not imported for nothing
        from plancc.store import atomic

        atomic.fault("startup")
    from plancc.cli import app

    app(prog_name="plancc")


if __name__ == "__main__":
    main()
