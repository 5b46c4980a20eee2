"""The structure rules, read with `ast` over plancc/: data flows one way (docs/architecture.md), and every public
function and class says what it is for.

Imports, at module level or inside a function, are checked against the table below (a module belongs to the
first rule whose prefix it has): the flat shared modules (settings, errors, plan arrays, layout) lie below every
package; then store (files on disk) < scan (source -> samples table) and planner (samples -> plan arrays, arrays
only) < review (reads what the store holds) and runtime (training on a plan) < integrations (other trainers' plugins,
on the runtime) < build (source -> PLAN_DIR) < api < cli.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests.support import REPO

ROOT = REPO / "plancc"

# The packages, lowest first: each may import the shared ones (core, the leaf; config; errors, version: below every
# package) and the packages listed before it, never one after it.
STORE, SCAN, PLANNER, REVIEW, RUNTIME = "plancc.store", "plancc.scan", "plancc.planner", "plancc.review", "plancc.runtime"
INTEGRATIONS = "plancc.integrations"  # other trainers' plugins: on top of the runtime
ORCHESTRATION = ("plancc.build",)  # source -> PLAN_DIR: scan, plan, store
FRONT = ("plancc.api", "plancc.cli", "plancc.__main__")
SHARED = ("plancc.core", "plancc.config", "plancc.errors", "plancc.version")
ABOVE_SHARED = (STORE, SCAN, PLANNER, REVIEW, RUNTIME, INTEGRATIONS, *ORCHESTRATION, *FRONT)
# the CLI parses, calls `plancc.api` and prints: besides the API, only plain values for its help text and messages
CLI_MAY = ("plancc.cli", "plancc.api", "plancc.config.settings", "plancc.config.registry", "plancc.errors",
           "plancc.core.numbers",
           "plancc.core.metric_columns", "plancc.review.diff_rules", "plancc.version")


# what the compiler counts a plan's rows with: the read side's checks count them with code of their own
COMPILER_SUMS = ("Batches", "batch_sums", "batch_cost", "batch_targets", "batch_tokens", "batch_attention",
                 "row_sums", "row_tokens", "row_targets", "segment_sum", "segment_max")


def matches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_but(*allowed: str) -> tuple[str, ...]:
    """Every plancc module except `allowed`, those below them and the packages holding them (whose `__init__` an
    import runs anyway): what a rule lists to say what a module may import rather than what it may not."""
    names = (module_name(p) for p in sorted(ROOT.rglob("*.py")))
    return tuple(n for n in names if not any(matches(n, a) or matches(a, n) for a in allowed))


# (module prefix, what it must not import: plancc module prefixes or top-level packages), first match wins
RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("plancc.core.layout", ("plancc", "pyarrow", "torch")),  # numpy only
    ("plancc.core.metric_columns", ("plancc", "numpy", "pyarrow")),  # data only
    ("plancc.core.numbers", ("plancc", "numpy", "pyarrow")),
    ("plancc.review.diff_rules", ("plancc", "numpy", "pyarrow")),  # plain values: `plancc --help` quotes them
    # the declarations (what the CLI's help is made of): plain values, never numpy or the layout
    *((name, (*ABOVE_SHARED, "plancc.core.layout", "numpy", "pyarrow", "torch", "yaml"))
      for name in ("plancc.config.fields", "plancc.config.checks", "plancc.config.settings", "plancc.config.registry")),
    ("plancc.config", (*ABOVE_SHARED, "numpy", "pyarrow", "torch")),
    ("plancc.core", (*ABOVE_SHARED, "plancc.config", "pyarrow", "torch", "typer", "datasets")),  # the leaf
    *((name, (*ABOVE_SHARED, "pyarrow", "torch", "typer", "datasets")) for name in SHARED),
    (STORE, (SCAN, PLANNER, REVIEW, RUNTIME, INTEGRATIONS, *ORCHESTRATION, *FRONT, "torch", "typer", "datasets")),
    # the row formats read rows and give tokens: no files, no store (the scan writes what they give through it)
    ("plancc.scan.formats", (STORE, PLANNER, REVIEW, RUNTIME, INTEGRATIONS, *ORCHESTRATION, *FRONT, "torch", "typer", "datasets")),
    (SCAN, (PLANNER, REVIEW, RUNTIME, INTEGRATIONS, *ORCHESTRATION, *FRONT, "torch", "typer")),
    # the algorithms: arrays in, arrays out (numpy and numba only; pyarrow stays in the store)
    (PLANNER, (STORE, SCAN, REVIEW, RUNTIME, INTEGRATIONS, *ORCHESTRATION, *FRONT, "pyarrow", "torch", "typer",
               "datasets")),
    # validate checks the plan with code of its own: it must not share the compiler's sums (core.plan_arrays,
    # core.row_sums) or draws (planner), or a bug there would make it agree with a wrong plan
    *((name, (SCAN, PLANNER, RUNTIME, INTEGRATIONS, *ORCHESTRATION, *FRONT, "torch", "typer", "datasets",
               "plancc.core.row_sums",
              *(f"plancc.core.plan_arrays.{n}" for n in COMPILER_SUMS)))
      for name in ("plancc.review.validate", "plancc.review.recount")),
    (REVIEW, (SCAN, PLANNER, RUNTIME, INTEGRATIONS, *ORCHESTRATION, *FRONT, "torch", "typer", "datasets")),
    (RUNTIME, (SCAN, PLANNER, REVIEW, INTEGRATIONS, *ORCHESTRATION, *FRONT, "typer", "datasets")),
    # a trainer's plugin replays the plan through the runtime; it never compiles (datasets: the trainers' own type)
    (INTEGRATIONS, (SCAN, PLANNER, REVIEW, *ORCHESTRATION, *FRONT, "typer")),
    *((name, (REVIEW, RUNTIME, INTEGRATIONS, *FRONT, "torch", "typer")) for name in ORCHESTRATION),
    ("plancc.api", ("plancc.cli", RUNTIME, INTEGRATIONS, "torch", "typer")),
    ("plancc.cli", (*all_but(*CLI_MAY), "torch")),
    # the script runs the CLI, and the interrupt tests' start-up crash point (a small leaf module)
    ("plancc.__main__", (*all_but("plancc.cli", "plancc.core.faults"), "torch")),
    ("plancc", ("torch",)),  # the package itself: compiling never imports torch
)
EXCEPTIONS = {
    ("plancc.runtime.trl", "datasets"),  # TRL's SFTTrainer takes nothing but a datasets.Dataset
    ("plancc.runtime.trl_preference", "datasets"),  # nor do its DPOTrainer and KTOTrainer
    # show decodes a sample with the plan's tokenizer, loaded exactly as the scan loaded it, and says what its format
    # trained: through the scan's one public entry for that
    ("plancc.review.show", "plancc.scan.describe"),
    # diff measures the seed-to-seed spread of a plan's metrics by planning its own samples with other seeds, with
    # the compiler's own function (a stand-in planner would measure another planner's noise)
    ("plancc.review.diff_noise", PLANNER),
}


def excepted(module: str, name: str) -> bool:
    """Whether `module` may import `name` by one of the EXCEPTIONS (a module prefix or a top-level package)."""
    return any(module == m and matches(name, allowed) for m, allowed in EXCEPTIONS)


def imports(path: Path) -> set[str]:
    """Every module `path` imports (absolute names; `from plancc import x` also yields `plancc.x`)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return found


def rule_for(module: str) -> tuple[str, ...]:
    return next(forbidden for prefix, forbidden in RULES if matches(module, prefix))


FILES = sorted(ROOT.rglob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=[module_name(p) for p in FILES])
def test_no_upward_import(path):
    module = module_name(path)
    forbidden = rule_for(module)
    bad = sorted(name for name in imports(path) for f in forbidden
                 if matches(name, f) and not matches(name, module) and not excepted(module, name)
                 and not (f == "plancc" and name == "plancc"))
    assert not bad, f"{module} imports {bad}, which docs/architecture.md's one-way flow forbids it"


def test_the_cli_may_import_the_api_and_plain_values_only():
    """The CLI's rule names what it may import: the API and plain values pass, any other plancc module fails."""
    forbidden = rule_for("plancc.cli.inspect_cmd")
    for name in ("plancc.api", "plancc.config.settings", "plancc.config.registry", "plancc.review.diff_rules",
                 "plancc.cli.common", "plancc"):
        assert not any(matches(name, f) for f in forbidden), name
    for name in ("plancc.review.inspect", "plancc.review.validate", "plancc.store.atomic", "plancc.scan.scanner",
                 "plancc.config.foreign", "plancc.config.resolve", "plancc.build.run", "torch"):
        assert any(matches(name, f) for f in forbidden), name
    assert any(matches("plancc.api", f) for f in rule_for("plancc.__main__"))
    assert any(matches("plancc.store.plan_store", f) for f in rule_for("plancc.__main__"))
    assert any(matches("plancc.store.atomic", f) for f in rule_for("plancc.__main__"))


def test_validate_shares_no_counting_code_with_the_compiler():
    """The rule that keeps validate independent catches the imports it forbids."""
    forbidden = rule_for("plancc.review.validate")
    for name in ("plancc.planner.holdout", "plancc.core.plan_arrays.batch_cost", "plancc.core.row_sums"):
        assert any(matches(name, f) for f in forbidden), name
    assert not any(matches("plancc.core.plan_arrays.SampleArrays", f) for f in forbidden)  # the samples' container


def test_the_checker_sees_imports():
    """The reader itself: relative, aliased and function-level imports are all found (a checker that sees nothing
    would pass everything)."""
    found = imports(ROOT / "runtime" / "sampler.py")
    assert "plancc.store.plan" in found and "numpy" in found
    assert any(matches(n, "plancc.planner.pipeline") for n in imports(ROOT / "build" / "run.py"))
    assert set(sys.stdlib_module_names) & imports(ROOT / "store" / "plan_store.py")


def test_benchmarks_and_examples_import_nothing_from_tests():
    """Benchmarks and examples stand alone: what they share with the tests lives in `benchmarks/synthetic.py`."""
    repo = ROOT.parent
    for path in sorted([*(repo / "benchmarks").rglob("*.py"), *(repo / "examples").rglob("*.py")]):
        bad = sorted(n for n in imports(path) if matches(n, "tests"))
        assert not bad, f"{path.relative_to(repo)} imports {bad}"


def test_every_public_function_and_class_has_a_docstring():
    missing = []
    for path in FILES:
        stack = [(ast.parse(path.read_text(encoding="utf-8")), "")]
        while stack:
            node, prefix = stack.pop()
            for n in ast.iter_child_nodes(node):
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and not n.name.startswith("_"):
                    if ast.get_docstring(n) is None:
                        missing.append(f"{path.relative_to(ROOT.parent)}:{n.lineno} {prefix}{n.name}")
                    if isinstance(n, ast.ClassDef):
                        stack.append((n, f"{prefix}{n.name}."))
    assert not missing, "no docstring: " + ", ".join(missing)


def import_graph() -> dict[str, set[str]]:
    """plancc module -> the plancc modules it imports (at module level or inside a function), without the
    packages above it, which importing any module of a package runs first anyway."""
    modules = {module_name(p): p for p in FILES}
    return {name: {n for n in imports(path) if n in modules and n != name and not matches(name, n)}
            for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle of `graph` found by a depth-first walk, each as the modules along it."""
    found, state, path = [], dict.fromkeys(graph, 0), []  # 0 unseen, 1 on the walk, 2 done

    def walk(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state[nxt] == 1:
                found.append([*path[path.index(nxt):], nxt])
            elif state[nxt] == 0:
                walk(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if state[node] == 0:
            walk(node)
    return found


def test_no_import_circle():
    """No module reaches itself through its imports, counting imports inside functions (best_fit and exact_fill once
    reached each other that way; config and config_import, build and recipe_data did too)."""
    assert circles(import_graph()) == []


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c", "a"]]


def package_of(module: str) -> str:
    """The package a module belongs to (`plancc.store.parquet` -> `plancc.store`; a flat module is its own)."""
    return ".".join(module.split(".")[:2])


def test_no_package_imports_another_packages_private_names():
    """A package uses another only through its public names: scan knows no store internals, the runtime none of
    the store's, and so on (a `_name` is free to change inside its package)."""
    bad = []
    for path in FILES:
        module = module_name(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("plancc"):
                bad += [f"{module}: {node.module}.{a.name}" for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")
                        and package_of(node.module) != package_of(module)]
    assert not bad, bad
