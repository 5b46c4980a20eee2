"""The options `compile` and `scan` share are one declaration: every scan setting either takes is a flag of both,
with the same names, help and shown default, in the same order; and `grouped` hands each value to the command."""

from __future__ import annotations

import dataclasses

import typer
from typer.testing import CliRunner

from plancc.cli import app
from plancc.cli.options import GROUP, SCAN_FLAGS, Flags, grouped
from plancc.config.settings import ScanOptions


def _params(name: str) -> list[tuple]:
    command = typer.main.get_command(app).commands[name]
    return [(p.name, tuple(p.opts), tuple(p.secondary_opts), p.help, p.show_default) for p in command.params]


def test_compile_and_scan_share_the_scan_options():
    settings = {f.name for f in dataclasses.fields(ScanOptions)}
    compile_, scan = ([p for p in _params(n) if p[0] in settings] for n in ("compile", "scan"))
    assert compile_ == scan
    assert [p[0] for p in scan] == [p.name for p in SCAN_FLAGS]


def test_grouped_hands_the_groups_values_to_the_command():
    seen = {}
    demo = typer.Typer()

    @demo.command()
    @grouped(flags=SCAN_FLAGS[:2])
    def run(path: str, flags: Flags = GROUP, loud: bool = False) -> None:
        seen.update(path=path, flags=dict(flags), loud=loud)

    res = CliRunner().invoke(demo, ["p", "--tokenizer", "builtin", "--loud"])
    assert res.exit_code == 0, res.output
    assert seen == {"path": "p", "flags": {"format": None, "tokenizer": "builtin"}, "loud": True}
