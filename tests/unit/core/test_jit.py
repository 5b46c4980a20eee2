"""Compiled kernels: numba's disk cache lives in the plancc cache dir, and a cold start says it is compiling."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from plancc.core import jit
from tests.support import REPO

ROOT = REPO


def test_every_kernel_module_is_listed():
    importing = set()
    for path in (ROOT / "plancc").rglob("*.py"):
        if re.search(r"^from plancc\.core\.jit import numba$", path.read_text(), re.M):
            importing.add(".".join(path.relative_to(ROOT).with_suffix("").parts))
    assert importing == set(jit.KERNEL_MODULES)
    for path in set((ROOT / "plancc").rglob("*.py")) - {ROOT / "plancc" / "core" / "jit.py"}:  # none bypasses jit
        assert not re.search(r"^import numba", path.read_text(), re.M), path


def _cache_dir_of(package_parent: Path, plancc_cache: Path) -> Path:
    """numba's cache dir in a fresh process importing the plancc found under `package_parent`."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(PLANCC_CACHE=str(plancc_cache), PYTHONPATH=str(package_parent))
    out = subprocess.run([sys.executable, "-c", "import plancc.core.jit, numba; print(numba.config.CACHE_DIR)"],
                         env=env, capture_output=True, text=True, check=True, cwd=package_parent).stdout.strip()
    return Path(out)


def test_kernels_cache_in_the_installation_keyed_by_every_kernel_source(tmp_path):
    """The kernels live beside the package (a fresh PLANCC_CACHE starts warm), in a folder named by the source of
    every kernel module: an edit of any of them is a new folder (the stale one removed), an edit elsewhere is not."""
    shutil.copytree(ROOT / "plancc", tmp_path / "plancc", ignore=shutil.ignore_patterns("_kernels", "__pycache__"))
    package = tmp_path / "plancc"
    first = _cache_dir_of(tmp_path, tmp_path / "cache")
    assert first == package / "_kernels" / jit.kernel_key(package) and first.is_dir()
    cli = package / "cli" / "__init__.py"
    cli.write_text(cli.read_text() + "\n# not a kernel module\n")
    assert _cache_dir_of(tmp_path, tmp_path / "other-cache") == first
    callee = package / "planner" / "balance" / "_subset_tables.py"  # inlined into _exchange's kernels
    callee.write_text(callee.read_text() + "\n# changed\n")
    second = _cache_dir_of(tmp_path, tmp_path / "cache")
    assert second.parent == first.parent and second != first and not first.exists()


def test_a_read_only_installation_caches_under_the_plancc_cache(tmp_path):
    """Where the package folder cannot take the cache (here `_kernels` is a file: root may write anywhere), kernels
    go to `$PLANCC_CACHE/numba/<key>`."""
    shutil.copytree(ROOT / "plancc", tmp_path / "plancc", ignore=shutil.ignore_patterns("_kernels", "__pycache__"))
    (tmp_path / "plancc" / "_kernels").write_text("not a folder")
    got = _cache_dir_of(tmp_path, tmp_path / "cache")
    assert got == tmp_path / "cache" / "numba" / jit.kernel_key(tmp_path / "plancc")


def test_the_notice_comes_from_compiles_not_cache_loads():
    """A function numba compiles says COMPILING once (and done); the same function again, compiled, says nothing."""

    @jit.numba.njit
    def twice(x):
        return 2 * x

    said: list[list[tuple]] = []
    for _ in range(2):
        said.append([])
        with jit.compile_notice(lambda *call: said[-1].append(call)):
            assert twice(21) == 42
    assert said == [[(jit.COMPILING, 0, 1), (jit.COMPILING, 1, 1)], []]


_WARM_RUN = """
import contextlib, io, json, sys
import plancc.core.jit, numba.core.event
from plancc.cli import app

with numba.core.event.install_recorder("numba:compile") as compiles:
    for args in json.loads(sys.argv[1]):
        with contextlib.redirect_stdout(io.StringIO()):
            app(args, prog_name="plancc", standalone_mode=False)
    compiled = len(compiles.buffer)
    plancc.core.jit.numba.njit(lambda x: x + 1)(1)  # the recorder sees a compile: the count above can fail
    assert len(compiles.buffer) > compiled
loaded = [name for name in plancc.core.jit.KERNEL_MODULES if any(
    sum(f.stats.cache_hits.values()) for f in vars(sys.modules.get(name, sys)).values()
    if isinstance(f, numba.core.registry.CPUDispatcher) and f.py_func.__module__ == name)]
print(json.dumps([compiled, loaded]))
"""


@pytest.mark.slow
def test_a_warm_run_compiles_nothing(tmp_path):
    """Every kernel module's own kernels (but the rare fallback's) come from numba's disk cache in a second fresh process that scans and compiles
    every layout, with a plancc cache dir of its own (a new CI job, node or container): nothing is compiled again.
    The first process fills the installation's kernel cache where it is cold."""
    src = tmp_path / "pc.jsonl"
    src.write_text("".join(f'{{"prompt": "question {i} {"x" * i}", "completion": "answer {i}"}}\n'
                           for i in range(60)))
    said = []
    for run in range(2):
        commands = [["compile", str(src), "-o", str(tmp_path / f"{mode}{run}"), "--mode", mode, "--tokenizer",
                     "builtin", "--sequence-len", "256", "--micro-batch-size", "2", "--world-size", "2",
                     "--grad-accum", "2", "--cache-dir", str(tmp_path / f"c{mode}{run}")]
                    for mode in ("packed", "padded", "flattened")]
        env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
        env["PLANCC_CACHE"] = str(tmp_path / f"plancc-cache-{run}")
        out = subprocess.run([sys.executable, "-c", _WARM_RUN, json.dumps(commands)], capture_output=True,
                             text=True, check=True, env=env)
        said.append(json.loads(out.stdout))
    compiled, loaded = said[1]
    rare = {"plancc.planner.pack._rows", "plancc.planner.pack.exact_fill"}  # closing left-out items: no small compile gets there
    # only _exchange's kernels call these: cached inside theirs
    inner = {"plancc.planner.balance._subset_tables", "plancc.planner.balance._rounds"}
    assert compiled == 0 and loaded == [m for m in jit.KERNEL_MODULES if m not in rare | inner], said


def _kernels() -> list[tuple[str, str, list[str], str]]:
    """(module, name, parameters, docstring) of every @numba.njit function under plancc/."""
    import ast

    found = []
    for path in sorted((ROOT / "plancc").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any("njit" in ast.unparse(d) for d in node.decorator_list):
                module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
                found.append((module, node.name, [a.arg for a in node.args.args], ast.get_docstring(node) or ""))
    return found


def test_the_kernel_checks_read_every_kernel_module():
    """The docs checks below read the kernels of every module that holds some, wherever the packages put it."""
    assert {module for module, *_ in _kernels()} == set(jit.KERNEL_MODULES)


def test_every_kernel_says_what_its_parameters_are():
    """A kernel has no type annotations, so its docstring names every parameter (its Args block, or the sentence
    of a one-line helper); one that says its args are another kernel's (`args as X`) names X's."""
    kernels = _kernels()
    docs = {name: doc for _, name, _, doc in kernels}
    missing = []
    for module, name, params, doc in kernels:
        same_as = re.search(r"[Aa]rgs as `(\w+)`", doc)
        text = doc + (docs.get(same_as.group(1), "") if same_as else "")
        missing += [f"{module}:{name}({p})" for p in params if not re.search(rf"\b{p}\b", text)]
    assert len(kernels) > 30 and not missing, missing


def test_no_kernel_parameter_is_one_letter():
    short = [f"{module}:{name}({p})" for module, name, params, _ in _kernels() for p in params if len(p) == 1]
    assert not short, short


def test_no_inlined_kernel_takes_a_structure():
    """An `inline="always"` kernel's parameters are copied into the caller on every call, and numba reference-counts
    each array of a NamedTuple it copies (atomic operations): inlining a helper that takes the trade kernel's `State`,
    `Rules` or `Tables` made the trades a third slower. Such helpers are plain calls on rare paths instead."""
    import ast

    structures = {"state", "rules", "tables"}  # the kernel's names for them (a hash's `state` elsewhere is a number)
    inlined = []
    for path in sorted((ROOT / "plancc" / "planner").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any(
                    "inline" in ast.unparse(d) and "always" in ast.unparse(d) for d in node.decorator_list):
                inlined.append((node.name, {a.arg for a in node.args.args} & structures))
    assert inlined and not [(name, taken) for name, taken in inlined if taken], inlined


def test_install_step_warms_every_layout(tmp_path):
    """`make install` runs `python -m plancc.build.kernels`: it compiles a plan in every layout through the public
    settings path, so an API change that breaks it fails here and not on a user's first install."""
    from plancc.build import kernels

    kernels.warm(tmp_path)
    plans = sorted(p.name for p in tmp_path.glob("plan-*"))
    assert plans == [f"plan-{k}" for k in range(len(kernels.RUNS))]
    assert all((tmp_path / name / "manifest.json").is_file() for name in plans)
