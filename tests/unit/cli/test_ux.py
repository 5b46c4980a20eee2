"""The CLI's manners: --version, help and defaults on every option, --quiet/--json on every command, short
summaries that fit 80 columns, warnings for useless layouts, out-of-range filters as errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from plancc.cli import app
from plancc.version import __version__
from tests.support import REPO
from tests.support.plans import write_samples_file

runner = CliRunner()


def _run(*args):
    return runner.invoke(app, [str(a) for a in args])


def _commands() -> list[tuple[list[str], object]]:
    """Every leaf command of the app (click objects, as typer builds them), with its path of names."""
    out = []

    def walk(cmd, path: list[str]) -> None:
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(sub, [*path, name])
        else:
            out.append((path, cmd))

    walk(typer.main.get_command(app), [])
    return out


COMMANDS = _commands()
IDS = [" ".join(p) for p, _ in COMMANDS]


@pytest.fixture(scope="module")
def samples_file(tmp_path_factory) -> Path:
    return write_samples_file(tmp_path_factory.mktemp("src"), 5, 200, 200)


@pytest.fixture(scope="module")
def plan(tmp_path_factory, samples_file) -> Path:
    out = tmp_path_factory.mktemp("plan") / "p"
    res = _run("compile", samples_file, "-o", out, "--sequence-len", "256", "--world-size", "2", "--grad-accum", "2",
               "--epochs", "2", "--quiet")
    assert res.exit_code == 0, res.output
    return out


def test_the_command_list_is_complete():
    assert {"compile", "scan", "validate", "diff", "show", "inspect metrics", "inspect plan"} <= set(IDS)


def test_version():
    res = _run("--version")
    assert res.exit_code == 0 and res.output.strip() == f"plancc {__version__}"


@pytest.mark.parametrize(("path", "cmd"), COMMANDS, ids=IDS)
def test_every_command_has_quiet_json_help_and_shown_defaults(path, cmd):
    options = [p for p in cmd.params if p.param_type_name == "option"]
    flags = {f for p in options for f in p.opts}
    assert {"--quiet", "--json"} <= flags, path
    res = _run(*path, "--help")
    assert res.exit_code == 0 and "Example" in res.output
    for p in options:
        assert p.help, (path, p.opts)
        # a default is shown: a real one, a described one, or the option is a plain on/off flag (off by default)
        assert p.required or p.is_flag or p.default is not None or isinstance(p.show_default, str), (path, p.opts)


@pytest.mark.parametrize("flag", ["--seed", "--epochs", "--micro-batch-size", "--world-size", "--grad-accum"])
def test_compile_help_shows_the_real_defaults(flag):
    cmd = dict(zip(IDS, (c for _, c in COMMANDS), strict=True))["compile"]
    option = next(p for p in cmd.params if flag in p.opts)
    from plancc.config.settings import PlanSettings

    assert option.show_default == str(getattr(PlanSettings(), flag.lstrip("-").replace("-", "_")))


def _invocation(name: str, plan: Path, samples_file: Path, out: Path) -> list:
    """A successful invocation of each command (scan: test_scan_summary; show: tests/unit/review/test_show.py; merge:
    tests/unit/scan/test_shards.py)."""
    return {
        "compile": ["compile", samples_file, "-o", out, "--sequence-len", "256"],
        "validate": ["validate", plan],
        "diff": ["diff", plan, plan],
        "inspect metrics": ["inspect", "metrics", plan],
        "inspect plan": ["inspect", "plan", plan],
    }[name]


@pytest.mark.parametrize("name", [i for i in IDS if i not in ("scan", "show", "merge")])
def test_quiet_prints_nothing_and_json_parses(name, plan, samples_file, tmp_path):
    quiet = _run(*_invocation(name, plan, samples_file, tmp_path / "quiet"), "--quiet")
    assert quiet.exit_code == 0 and quiet.stdout == "", (name, quiet.output)
    loud = _run(*_invocation(name, plan, samples_file, tmp_path / "json"), "--json")
    assert loud.exit_code == 0, loud.output
    assert isinstance(json.loads(loud.stdout), dict)


def test_compile_summary_is_short_and_narrow(samples_file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = _run("compile", samples_file, "-o", "p", "--sequence-len", "256", "--epochs", "9")
    assert res.exit_code == 0, res.output
    lines = res.stdout.rstrip("\n").split("\n")
    assert len(lines) <= 12 and max(map(len, lines)) <= 80, res.stdout
    text = res.stdout
    assert "200 kept, 0 dropped" in text and "microbatches" in text and "→" in text
    assert "5 more epoch(s)" in text and "plancc inspect metrics p" in text and "plan       p" in text


def test_scan_summary(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows = [{"prompt": f"Q{i}: " + "x" * (5 * i), "completion": "y" * 10} for i in range(40)]
    src = tmp_path / "pc.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    scan_args = ("--sequence-len", "128", "--tokenizer", "builtin", "--max-dropped", "1", "--cache-dir",
                 tmp_path / "cache")
    res = _run("scan", src, "-o", "s", *scan_args)
    assert res.exit_code == 0, res.output
    lines = res.stdout.rstrip("\n").split("\n")
    assert len(lines) <= 8 and max(map(len, lines)) <= 80
    dropped = sum(len(r["prompt"]) + len(r["completion"]) + 1 > 128 for r in rows)  # byte-level: 1 token a byte
    assert f"{40 - dropped} kept, {dropped} dropped" in res.stdout and "40 rows read" in res.stdout
    quiet = _run("scan", src, "-o", tmp_path / "s2", *scan_args, "-q")
    assert quiet.exit_code == 0 and quiet.stdout == ""
    as_json = json.loads(_run("scan", src, "-o", tmp_path / "s3", *scan_args, "--json").stdout)
    assert as_json["retained"] == 40 - dropped


def test_too_few_microbatches_warn_with_the_numbers_and_the_flags(samples_file, tmp_path):
    res = _run("compile", samples_file, "-o", tmp_path / "p", "--sequence-len", "256", "--world-size", "256",
               "--grad-accum", "8", "--json")
    assert res.exit_code == 0
    assert "warning: epoch 0:" in res.stderr and "256 x 8 = 2048" in res.stderr
    assert "--world-size" in res.stderr and "--grad-accum" in res.stderr
    assert json.loads(res.stdout)["warnings"]
    ok = _run("compile", samples_file, "-o", tmp_path / "q", "--sequence-len", "256", "--quiet")
    assert ok.exit_code == 0 and "warning" not in ok.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--update", "999"], "--update 999 is out of range"),
        (["--epoch", "1", "--update", "999"], "updates in epoch 1"),
        (["--update", "-1"], "--update -1 is out of range"),
        (["--rank", "2"], "--rank 2 is out of range: the plan has 2 ranks (world size) (0..1)"),
        (["--micro-step", "2"], "--micro-step 2 is out of range: the plan has 2 micro-steps (grad accum) (0..1)"),
        (["--epoch", "7"], "--epoch 7: the plan has epochs [0, 1]"),
    ],
)
def test_inspect_plan_filters_out_of_range_exit_2(plan, args, message):
    res = _run("inspect", "plan", plan, *args)
    assert res.exit_code == 2 and message in res.output, res.output


def test_inspect_plan_micro_step_filters(plan):
    res = json.loads(_run("inspect", "plan", plan, "--micro-step", "1", "--limit", "0", "--json").stdout)
    assert res["microbatches"] and {m["micro_step"] for m in res["microbatches"]} == {1}


def test_inspect_metrics_compact_fits_80_columns(plan):
    proc = subprocess.run([sys.executable, "-m", "plancc", "inspect", "metrics", str(plan), "--compact"],
                          capture_output=True, text=True, check=True)
    lines = proc.stdout.splitlines()
    assert lines and max(map(len, lines)) <= 80
    assert "label_cv" in proc.stdout and "after" in proc.stdout
    full = _run("inspect", "metrics", plan).stdout
    assert len(full.splitlines()) > len(lines)


def test_compile_summary_names_tokenizer_template_and_drops(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows = [{"messages": [{"role": "user", "content": "hi " * (1 + 40 * (i % 10 == 0))},
                          {"role": "assistant", "content": f"answer {i}"}]} for i in range(50)]
    Path("chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = _run("compile", "chat.jsonl", "-o", "p", "--tokenizer", "builtin", "--chat-template", "chatml",
               "--sequence-len", "100", "--max-dropped", "0.2")
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert "samples    45 kept, 5 dropped (10.0%), 0 truncated" in lines
    assert any(line.startswith("tokenizer  plancc-byte-level (") for line in lines)
    assert any(line.startswith("template   chatml (") for line in lines)
    assert len(lines) <= 12 and max(map(len, lines)) <= 80


def test_the_package_version_is_the_one_pyproject_declares():
    import tomllib

    import plancc

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert plancc.__version__ == __version__ == pyproject["project"]["version"]
