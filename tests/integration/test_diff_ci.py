"""examples/ci as shipped: the workflow installs plancc from where it says, and `plan_diff.sh` gives the five kinds
of pull request their exit codes and reports in a real git repository whose committed plan has no `tokens/`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import orjson
import pytest
import yaml

from tests.support import REPO

ROOT = REPO
CI = ROOT / "examples" / "ci"
pytestmark = [pytest.mark.slow,  # runs the CI script (git, the CLI) in subprocesses
              pytest.mark.skipif(shutil.which("git") is None or shutil.which("bash") is None, reason="needs git and bash")]
WORDS = ("plan", "token", "label", "rank", "update", "batch", "sample", "epoch", "seed", "row", "loss", "step")
CONFIG = 'tokenizer = "builtin"\nsequence_len = 1024\nworld_size = 2\ngrad_accum = 2\nseed = 0\n'


def test_workflow_is_valid_yaml_and_wired():
    wf = yaml.safe_load((CI / "plan-diff.yml").read_text())
    on = wf.get("on", wf.get(True))  # YAML 1.1 reads the key `on` as True
    assert "pull_request" in on
    assert wf["permissions"]["pull-requests"] == "write"
    job = wf["jobs"]["plan-diff"]
    steps = job["steps"]
    runs = " ".join(s.get("run", "") for s in steps)
    assert "plan_diff.sh" in runs and "github.base_ref" in runs
    assert any(s.get("uses", "").startswith("actions/github-script") for s in steps)
    assert steps[-1]["if"] == "steps.diff.outcome == 'failure'"
    # plancc is not on a package registry: the workflow installs what PLANCC_INSTALL names (a wheel built from the
    # repository, or the repository itself)
    (install,) = [s for s in steps if s.get("name") == "Install plancc"]
    assert install["run"] == 'pip install "$PLANCC_INSTALL"'
    assert job["env"]["PLANCC_INSTALL"].endswith("-py3-none-any.whl")
    assert "masks" in job["env"]["PLANCC_FAIL_ON"]


def test_the_wheel_the_workflow_installs_builds_from_the_repository(tmp_path):
    """`pip wheel --no-deps -w ci/ /path/to/plancc` (what the example says) gives the wheel PLANCC_INSTALL names,
    and it installs a working `plancc`."""
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard"], capture_output=True,
                           text=True, check=True).stdout.split()
    src = tmp_path / "plancc-src"
    for f in files:
        if (ROOT / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / f, src / f)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                        str(tmp_path / "ci"), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    wanted = yaml.safe_load((CI / "plan-diff.yml").read_text())["jobs"]["plan-diff"]["env"]["PLANCC_INSTALL"]
    wheel = tmp_path / wanted
    assert wheel.is_file(), sorted(p.name for p in (tmp_path / "ci").iterdir())
    names = zipfile.ZipFile(wheel).namelist()
    assert "plancc/review/diff.py" in names and any(n.endswith("entry_points.txt") for n in names)
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "plancc", "diff", "--help"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(site)}, cwd=tmp_path)
    assert r.returncode == 0 and "masks" in r.stdout


def rows(n: int, seed: int) -> list[dict[str, str]]:
    rng = np.random.default_rng(seed)
    return [{"prompt": " ".join(rng.choice(WORDS, rng.integers(3, 40))),
             "completion": " ".join(rng.choice(WORDS, rng.integers(2, 60)))} for _ in range(n)]


def write_jsonl(path: Path, data: list[dict[str, str]]) -> None:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in data))


def _run(cmd: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                "GIT_COMMITTER_EMAIL": "t@t", **env}
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True)


BASE_ROWS = rows(1000, 0)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """A data repository as the example sets one up: data, settings, the plan committed without its tokens/."""
    root = tmp_path_factory.mktemp("repo")
    os.environ.setdefault("PLANCC_CACHE", str(tmp_path_factory.mktemp("cache")))
    (root / "data").mkdir()
    write_jsonl(root / "data" / "train.jsonl", BASE_ROWS)
    (root / "plancc.toml").write_text(CONFIG)
    shutil.copyfile(CI / "gitignore", root / ".gitignore")
    r = _run([sys.executable, "-m", "plancc", "compile", "data/train.jsonl", "--config", "plancc.toml", "-o",
              "plans/train", "--quiet"], root)
    assert r.returncode == 0, r.stderr
    for cmd in (["git", "init", "-q", "-b", "main"], ["git", "add", "."], ["git", "commit", "-q", "-m", "plan"],
                ["git", "checkout", "-q", "-b", "pr"]):
        assert _run(cmd, root).returncode == 0
    assert _run(["git", "ls-files", "plans/train/tokens"], root).stdout == ""  # kept out of git
    return root


@pytest.fixture
def pr(repo):
    """The repository's PR branch, reset to main after the test."""
    yield repo
    _run(["git", "checkout", "-q", "--", "."], repo)
    write_jsonl(repo / "data" / "train.jsonl", BASE_ROWS)
    (repo / "plancc.toml").write_text(CONFIG)


def script(repo: Path, base: str = "main", **env: str) -> tuple[int, str]:
    env = {"PLANCC_SOURCE": "data/train.jsonl", "PLANCC_CONFIG": "plancc.toml", "PLANCC_PLAN_DIR": "plans/train",
           **env}
    (repo / "plan-diff.md").unlink(missing_ok=True)
    r = _run(["bash", str(CI / "plan_diff.sh"), base], repo, **env)
    assert "Traceback" not in r.stderr, r.stderr
    md = (repo / "plan-diff.md").read_text() if (repo / "plan-diff.md").exists() else ""
    return r.returncode, md


RECOMPILE = "`plancc compile data/train.jsonl --config plancc.toml -o plans/train --overwrite`"


def test_a_pr_that_changes_nothing_passes_as_identical(pr):
    rc, md = script(pr)
    assert rc == 0 and "✅ plans are identical" in md and "not what this branch" not in md


def test_a_data_pr_names_its_rows_and_fails_on_dataset_only(pr):
    data = [dict(r) for r in BASE_ROWS]
    for i in (3, 150, 400, 700, 900):
        data[i]["completion"] += " edited"
    data = [r for i, r in enumerate(data) if i not in (50, 500, 950)] + rows(20, 1)
    write_jsonl(pr / "data" / "train.jsonl", data)
    rc, md = script(pr)
    assert rc == 1, md
    assert "**Failing:** dataset: train: 5 edited, 20 added, 3 removed rows" in md
    assert "metrics-regression" not in md  # 17 more rows under the same settings: noise, not a regression
    assert "- rows: 5 edited, 20 added, 3 removed (1,000 → 1,017 samples)" in md
    assert "- `train` edited: data/train.jsonl row 3, row 149 (was row 150), row 399 (was row 400)" in md
    assert "- `train` removed: data/train.jsonl row 50, row 500, row 950" in md
    assert "- `train` added: data/train.jsonl rows 997-1006 … (+10 more)" in md
    assert f"not what this branch compiles to: run {RECOMPILE} and commit it" in md


def test_a_settings_pr_names_the_setting(pr):
    (pr / "plancc.toml").write_text(CONFIG.replace("grad_accum = 2", "grad_accum = 4"))
    rc, md = script(pr)
    assert rc == 0, md  # a plan setting is reported, not failed, by the default rule
    assert "- `grad_accum` 2 → 4" in md and "| updates |" in md and "rows:" not in md
    rc, _ = script(pr, PLANCC_FAIL_ON="config")
    assert rc == 1


def test_a_pr_with_broken_json_exits_2_and_says_where(pr):
    with (pr / "data" / "train.jsonl").open("a") as f:
        f.write('{"prompt": "unterminated\n')
    rc, md = script(pr)
    assert rc == 2 and "failed" in md and "train.jsonl" in md and "line 1001" in md


def test_a_seed_pr_is_membership_churn_only(pr):
    (pr / "plancc.toml").write_text(CONFIG.replace("seed = 0", "seed = 1"))
    rc, md = script(pr)
    assert rc == 0, md
    changed = md.split("**Changed**\n")[1].split("\n\n")[0].splitlines()
    assert changed[0] == "- `seed` 0 → 1" and changed[1].startswith("- membership: ") and len(changed) == 2
    assert "**Training (1 epoch)**: unchanged" in md and "Regressions" not in md and "Rows" not in md


def test_the_committed_plan_without_tokens_validates_what_it_holds(repo, tmp_path):
    """The plan as git holds it (a clone, or `git archive` as the script reads the base branch's)."""
    archive = _run(["bash", "-c", f"git archive main plans/train | tar -x -C {tmp_path}"], repo)
    assert archive.returncode == 0 and not (tmp_path / "plans" / "train" / "tokens").exists()
    r = _run([sys.executable, "-m", "plancc", "validate", "plans/train"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "skipped: token data: plans/train/tokens is not there" in r.stderr


def test_base_without_plan_and_bad_source(pr):
    rc, md = script(pr, PLANCC_PLAN_DIR="plans/other")
    assert rc == 0 and "nothing to compare" in md
    assert "`plancc compile data/train.jsonl --config plancc.toml -o plans/other --overwrite`" in md
    rc, md = script(pr, PLANCC_SOURCE="data/missing.jsonl")
    assert rc == 2 and "failed" in md
