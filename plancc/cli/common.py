"""What every command shares: the typer app, error-to-exit-code mapping, JSON output and progress."""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from typer.core import TyperCommand

from plancc.cli.watchdog import watchdog
from plancc.errors import PlanccError, PlanccWarning, descriptors_hint, out_of_descriptors, out_of_memory

MESSAGE_LIMIT = 1000  # an error is a few lines: whatever a message quotes (values, types, paths) is cut to fit

app = typer.Typer(
    name="plancc",
    help="Compile fine-tuning datasets into packed, label-balanced, token-exact training plans.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing but warnings and errors (the exit "
                                                              "code tells).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print a machine-readable result.")]


def _print_version(value: bool) -> None:
    if value:
        from plancc.version import __version__

        typer.echo(f"plancc {__version__}")
        raise typer.Exit(0)


@app.callback()
def main(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.", callback=_print_version,
                                          is_eager=True)] = False,
) -> None:
    """Compile fine-tuning datasets into packed, label-balanced, token-exact training plans."""
    _one_command_process()


@functools.cache
def _one_command_process() -> None:
    """A command's process ends when the command does, so Python's cyclic collector is tuned for that (once).

    The imports a command needs (numpy, pyarrow, numba) leave ~125k long-lived objects that the default gen-0
    threshold of 700 has the collector rescan hundreds of times during start-up, and the interpreter's exit
    collects them all again, several times: much of a small compile's CPU (docs/benchmarks.md). A gen-0 threshold
    of 50,000 still collects young cycles; freezing the heap at exit only skips collecting what is about to be freed
    anyway.
    """
    gc.set_threshold(50_000)
    atexit.register(gc.freeze)


def warn(lines: tuple[str, ...] | list[str]) -> None:
    """Warnings go to stderr, also under --quiet and --json: they say what to change."""
    for line in lines:
        typer.echo(f"warning: {line}", err=True)


def _terminated(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(signum)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    if issubclass(category, PlanccWarning):
        typer.echo(f"warning: {message}", err=True)
    else:
        _default_show_warning(message, category, filename, lineno, file, line)


_default_show_warning = warnings.showwarning


def _takes_over(handler: Any) -> bool:
    """Whether a command may install its own handler over `handler`: Python's default, or the start-up one of
    `plancc.__main__` (which exits at once: nothing is written before a command starts)."""
    return handler is signal.SIG_DFL or getattr(handler, "plancc_startup", False)


@contextlib.contextmanager
def fail_on_errors(output: str | Path | None = None, what: str = "plan") -> Iterator[None]:
    """Bad input, usage or files: a one-line message on stderr and exit code 2, never a traceback.

    SIGTERM is handled like Ctrl-C, so both end with a message saying what is on disk at `output` (the command's
    `-o`, a `what`): the old one, nothing, or the new one (`plancc.api.interrupted_message`).
    """
    main_thread = threading.current_thread() is threading.main_thread()
    term = signal.getsignal(signal.SIGTERM) if main_thread else None
    if main_thread and _takes_over(signal.getsignal(signal.SIGINT)):
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C raises KeyboardInterrupt again
    if _takes_over(term):
        signal.signal(signal.SIGTERM, _terminated)
    warnings.showwarning = _show_warning
    try:
        with watchdog(lambda: _interrupted(output, what)):
            yield
    except PlanccError as exc:
        text = str(exc)
        if len(text) > MESSAGE_LIMIT:
            text = f"{text[:MESSAGE_LIMIT]}... ({len(text)} chars)"
        typer.echo(f"error: {_with_hint(text, exc)}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt as exc:
        typer.echo(getattr(exc, "message", None) or _interrupted(output, what), err=True)
        signum = getattr(exc, "signum", exc.args[0] if exc.args and isinstance(exc.args[0], int) else signal.SIGINT)
        raise typer.Exit(128 + signum) from None
    except BaseException as exc:  # out of memory in whatever words a library says it (a tokenizer's panic too)
        ran_out = out_of_memory(exc)
        if ran_out is not None:
            typer.echo(f"error: out of memory while {_doing(exc)}{_THREAD if ran_out == 'thread' else ''}; free "
                       "memory or raise the limit (`ulimit -v`), lower --num-proc, or scan in shards (`plancc scan "
                       "--shard I/N`)", err=True)
        elif isinstance(exc, OSError):
            where = f" {exc.filename}" if getattr(exc, "filename", None) else ""
            typer.echo(f"error:{where} {_with_hint(str(exc.strerror or exc), exc)}", err=True)
        else:
            raise
        raise typer.Exit(2) from None
    finally:
        warnings.showwarning = _default_show_warning
        if _takes_over(term):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


_THREAD = ": a thread could not start (each reserves `ulimit -s` of the address space `ulimit -v` allows)"


def _with_hint(text: str, exc: BaseException) -> str:
    """`text` with what to do when the machine ran out of file descriptors under it (the same hint wherever)."""
    hint = descriptors_hint()
    return f"{text}; {hint}" if out_of_descriptors(exc) and hint not in text else text


def _interrupted(output: str | Path | None, what: str) -> str:
    if output is None:
        return "interrupted: nothing was written"
    from plancc import api

    return api.interrupted_message(output, what)


def _doing(exc: BaseException) -> str:
    """The plancc module that ran out of memory (the innermost frame of plancc's own), so that the message says
    whether reading, tokenizing or planning did; nothing is imported here, memory being short."""
    modules = [frame.f_globals.get("__name__", "") for frame, _ in traceback.walk_tb(exc.__traceback__)]
    ours = [m for m in modules if m.startswith("plancc.") and not m.startswith("plancc.cli")]
    return f"running {ours[-1]}" if ours else "starting"


class SourceCommand(TyperCommand):
    """A command taking one SOURCE: surplus arguments are most likely a glob the shell expanded, so say so."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        """Click's parsing, with an unquoted glob's extra arguments explained (the shell expanded it)."""
        try:
            return super().parse_args(ctx, args)
        except Exception as exc:  # click's UsageError, vendored by typer under a private name
            if "unexpected extra argument" in str(getattr(exc, "message", "")):
                exc.message += ("; SOURCE is one argument: quote a glob so the shell does not expand it, e.g. "
                                "'data/*.jsonl'")
            raise


def print_json(obj: Any) -> None:
    """One JSON document on stdout, keys sorted and indented (what every `--json` prints)."""
    sys.stdout.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode() + "\n")


@contextlib.contextmanager
def reporter(quiet: bool) -> Iterator[Callable[[str, int, int], None] | None]:
    """A progress callback `(phase, done, total)` drawing one bar per phase on stderr; None when quiet."""
    if quiet:
        yield None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    tasks: dict[str, Any] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=Console(stderr=True), transient=False) as bar:

        def progress(phase: str, done: int, total: int) -> None:
            # "tokenizing · 1,234 tokens/s": one bar per phase, its rate after the dot updating the description
            name = phase.split(" · ")[0]
            if name not in tasks:
                tasks[name] = bar.add_task(phase, total=max(total, 1))
            bar.update(tasks[name], completed=done, total=max(total, 1), description=phase)

        yield progress
