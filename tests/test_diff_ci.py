"""examples/ci: the workflow is well-formed and `plan_diff.sh` does what it promises in a real git repository."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

CI = Path(__file__).resolve().parents[1] / "examples" / "ci"
pytestmark = [pytest.mark.slow,  # runs the CI script (git, the CLI) in subprocesses
              pytest.mark.skipif(shutil.which("git") is None or shutil.which("bash") is None, reason="needs git and bash")]


def test_workflow_is_valid_yaml_and_wired():
    wf = yaml.safe_load((CI / "plan-diff.yml").read_text())
    on = wf.get("on", wf.get(True))  # YAML 1.1 reads the key `on` as True
    assert "pull_request" in on
    assert wf["permissions"]["pull-requests"] == "write"
    steps = wf["jobs"]["plan-diff"]["steps"]
    runs = " ".join(s.get("run", "") for s in steps)
    assert "plan_diff.sh" in runs and "github.base_ref" in runs
    assert any(s.get("uses", "").startswith("actions/github-script") for s in steps)
    assert steps[-1]["if"] == "steps.diff.outcome == 'failure'"


def _samples(n: int = 300, edit: bool = False) -> pa.Table:
    rng = np.random.default_rng(0)
    length = rng.integers(16, 300, n)
    token_hash = rng.integers(0, 2**63, n).astype(np.uint64)
    if edit:
        token_hash[5] ^= np.uint64(1)
    return pa.table({
        "sample_id": pa.array(np.arange(n), pa.int64()),
        "length": pa.array(length, pa.int32()),
        "label_count": pa.array(length // 2, pa.int32()),
        "first_label_supervised": pa.array(np.zeros(n, dtype=bool)),
        "token_hash": pa.array(token_hash),
    })


def _run(cmd: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                "GIT_COMMITTER_EMAIL": "t@t", **env}
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    (root / "data").mkdir()
    pq.write_table(_samples(), root / "data" / "samples.parquet")
    (root / "plancc.toml").write_text("sequence_len = 512\nworld_size = 2\ngrad_accum = 2\n")
    r = _run([sys.executable, "-m", "plancc", "compile", "data/samples.parquet", "-o", "plans/train", "--config",
              "plancc.toml", "--quiet"], root)
    assert r.returncode == 0, r.stderr
    for cmd in (["git", "init", "-q", "-b", "main"], ["git", "add", "."], ["git", "commit", "-q", "-m", "plan"],
                ["git", "checkout", "-q", "-b", "pr"]):
        assert _run(cmd, root).returncode == 0
    return root


def script(repo: Path, base: str, **env: str) -> tuple[int, str]:
    env = {"PLANCC_SOURCE": "data/samples.parquet", "PLANCC_CONFIG": "plancc.toml", "PLANCC_PLAN_DIR": "plans/train",
           **env}
    r = _run(["bash", str(CI / "plan_diff.sh"), base], repo, **env)
    assert "Traceback" not in r.stderr, r.stderr
    md = (repo / "plan-diff.md").read_text() if (repo / "plan-diff.md").exists() else ""
    return r.returncode, md


def test_unchanged_branch_is_identical(repo):
    rc, md = script(repo, "main", PLANCC_FAIL_ON="any")
    assert rc == 0 and "identical" in md and "stale" not in md and "not what this branch" not in md


def test_edited_data_fails_on_dataset_and_flags_the_stale_plan(repo):
    pq.write_table(_samples(edit=True), repo / "data" / "samples.parquet")
    try:
        rc, md = script(repo, "main", PLANCC_FAIL_ON="dataset")
        assert rc == 1 and "| fingerprint | dataset |" in md and "**Failing:** dataset" in md
        assert "not what this branch compiles to" in md
    finally:
        pq.write_table(_samples(), repo / "data" / "samples.parquet")


def test_base_without_plan_and_bad_source(repo):
    rc, md = script(repo, "main", PLANCC_PLAN_DIR="plans/other")
    assert rc == 0 and "nothing to compare" in md
    rc, md = script(repo, "main", PLANCC_SOURCE="data/missing.parquet")
    assert rc == 2 and "failed" in md
