"""The Python API: `plancc.compile` on an in-memory Dataset and on a file, `plancc.open_plan`, `import plancc`
staying light, and compiling importing no torch."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from datasets import Dataset

import plancc
from plancc.config.settings import PlanSettings
from plancc.errors import PlanccError, PlanMismatchError, SettingsError
from tests.support.sources import pc_rows, write_rows


def _rows(n: int = 40) -> list[dict]:
    return [{"prompt": f"Question {i}: " + "why? " * (i % 5), "completion": "because " * (1 + i % 7)}
            for i in range(n)]


def test_compile_an_in_memory_dataset_and_open_it(tmp_path):
    settings = {"tokenizer": "builtin", "sequence_len": 256, "micro_batch_size": 2, "world_size": 2, "grad_accum": 2, "epochs": 2, "seed": 3}
    plan = plancc.compile(Dataset.from_list(_rows()), tmp_path / "p", cache_dir=tmp_path / "cache", **settings)
    assert isinstance(plan, plancc.Plan)
    assert plan.settings == PlanSettings(**{k: v for k, v in settings.items() if k != "tokenizer"})
    assert plan.epochs == [0, 1] and plan.scan_record.format == "prompt_completion" and plan.scan_record.retained == 40
    opened = plancc.open_plan(tmp_path / "p")
    assert opened == plan
    assert repr(plan) == (f"Plan({str(tmp_path / 'p')!r}, samples=40, epochs=[0, 1], mode='packed', world_size=2, "
                          "grad_accum=2)")
    assert {m["stage"] for m in opened.metrics(0)} >= {"before", "after"}
    epoch = opened.epoch(1)
    assert len(epoch) == opened.manifest.epochs[1].batches
    seen = sorted(i for b in range(len(epoch)) for row in epoch[b] for i in row)
    assert seen == list(range(40))  # every sample exactly once per epoch
    one_rank = opened.epoch(1, rank=1)
    assert set(one_rank.rank.tolist()) == {1} and len(one_rank) == int(np.sum(epoch.rank == 1))
    # the same content as a file gives the same plan
    src = write_rows(tmp_path / "pc.jsonl", _rows())
    again = plancc.compile(src, tmp_path / "q", cache_dir=tmp_path / "cache", **settings)
    assert again.fingerprints == plan.fingerprints
    # a selection (here: reversed rows) is what is compiled, in its order
    reversed_rows = Dataset.from_list(_rows()).select(range(39, -1, -1))
    flipped = plancc.compile(reversed_rows, tmp_path / "r", cache_dir=tmp_path / "cache", **settings)
    from_file = plancc.compile(write_rows(tmp_path / "rev.jsonl", _rows()[::-1]), tmp_path / "s",
                               cache_dir=tmp_path / "cache", **settings)
    assert flipped.fingerprints == from_file.fingerprints != plan.fingerprints


@pytest.mark.slow
def test_compile_matches_the_cli(tmp_path):
    from typer.testing import CliRunner

    from plancc.cli import app

    src = write_rows(tmp_path / "pc.jsonl", pc_rows(30))
    res = CliRunner().invoke(app, ["compile", str(src), "-o", str(tmp_path / "cli"), "--sequence-len", "128",
                                   "--world-size", "2", "--tokenizer", "builtin", "--cache-dir", str(tmp_path / "c"),
                                   "--json"])
    assert res.exit_code == 0, res.output
    plan = plancc.compile(str(src), tmp_path / "api", sequence_len=128, world_size=2, tokenizer="builtin",
                          cache_dir=tmp_path / "c")
    assert json.loads(res.stdout)["fingerprints"] == plan.fingerprints


def test_config_file_under_keywords(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('tokenizer = "builtin"\nsequence_len = 256\nmicro_batch_size = 3\nseed = 5\n')
    plan = plancc.compile(Dataset.from_list(_rows()), tmp_path / "p", config=config, seed=9,
                          cache_dir=tmp_path / "cache")
    assert (plan.settings.micro_batch_size, plan.settings.seed) == (3, 9)


def test_bad_settings_and_sources_are_plancc_errors(tmp_path):
    with pytest.raises(SettingsError, match="did you mean 'world_size'"):
        plancc.compile(Dataset.from_list(_rows()), tmp_path / "p", world_sise=2)
    with pytest.raises(SettingsError, match="source must be a path"):
        plancc.compile(12, tmp_path / "p")
    with pytest.raises(PlanccError, match="not a plan directory"):
        plancc.open_plan(tmp_path)
    assert not (tmp_path / "p").exists()


def test_epoch_out_of_range(tmp_path):
    plan = plancc.compile(Dataset.from_list(_rows()), tmp_path / "p", sequence_len=256, tokenizer="builtin",
                          cache_dir=tmp_path / "c")
    with pytest.raises(PlanMismatchError, match=r"epoch 3: the plan has epochs \[0\]"):
        plan.epoch(3)
    with pytest.raises(SettingsError, match=r"ranks 0..0"):
        plan.epoch(0, rank=1)


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print('\\n'.join(sys.modules))"],
                         capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_import_plancc_is_light():
    loaded = _modules_after("import plancc; plancc.__version__")
    assert not {"pyarrow", "numba", "torch", "datasets", "typer", "plancc.api"} & loaded


@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_and_version_load_no_array_stack(flag):
    """`plancc --help` builds every command's help, so no command module may import numpy/pyarrow/numba at the top
    (--help <= 0.3 s)."""
    loaded = _modules_after("import contextlib, io\nfrom plancc.cli import app\n"
                            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
                            f"    app([{flag!r}], prog_name='plancc', standalone_mode=False)")
    assert "plancc.cli" in loaded and not {"numpy", "pyarrow", "numba", "torch", "datasets"} & loaded


def test_compiling_imports_no_torch(tmp_path):
    src = write_rows(tmp_path / "pc.jsonl", pc_rows(20))
    code = (f"import plancc.cli\nfrom typer.testing import CliRunner\n"
            f"r = CliRunner().invoke(plancc.cli.app, ['compile', {str(src)!r}, '-o', {str(tmp_path / 'p')!r}, "
            f"'--sequence-len', '128', '--tokenizer', 'builtin', '--cache-dir', {str(tmp_path / 'c')!r}, '--quiet'])\n"
            "assert r.exit_code == 0, r.output\n"
            f"plancc.compile({str(src)!r}, {str(tmp_path / 'q')!r}, sequence_len=128, tokenizer='builtin', "
            f"cache_dir={str(tmp_path / 'c')!r})")
    loaded = _modules_after(code)
    assert {"plancc.planner.pipeline", "plancc.api"} <= loaded and "torch" not in loaded
    assert (tmp_path / "p" / "plan.parquet").is_file() and (tmp_path / "q" / "plan.parquet").is_file()
