"""`plancc.core.layout`, the one statement of docs/spec.md §4's layout: the global mapping, the positions a rank walks, and
elastic replay, checked against each other (no plan, no torch)."""

from __future__ import annotations

import ast

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from plancc.core import layout
from tests.support import REPO


@given(n=st.integers(0, 200), W=st.integers(1, 8), G=st.integers(1, 6), full=st.booleans())
def test_a_ranks_walk_visits_its_microbatches_in_mapping_order(n, W, G, full):
    """Position p of rank r holds the r-th microbatch of its (update, micro-step), when there is one."""
    update, rank, micro_step = layout.update_mapping(n, W, G)
    walk = layout.rank_walk(n, W, G, full_updates=full)
    assert walk.complete == layout.complete_updates(n, W, G)
    assert walk.updates == layout.optimizer_updates(n, W, G)  # what the plan's metrics and manifest call updates
    for r in range(W):
        mine = layout.rank_indices(n, W, r)
        assert (rank[mine] == r).all() and mine.size <= walk.length
        for p in range(walk.length):
            u, m, steps = layout.locate(p, walk, G)
            assert 0 <= m < steps <= G
            if p < mine.size:  # real microbatches come first; the rest are placeholders
                assert (u, m) == (update[mine[p]], micro_step[mine[p]])
        assert layout.locate(walk.length, walk, G) == (walk.updates, 0, 0)
    for u in range(walk.updates + 1):
        p = layout.position_of_update(u, walk, G)
        assert layout.locate(p, walk, G)[:2] == (u, 0)


@given(W=st.integers(1, 8), G=st.integers(1, 8), W2=st.integers(1, 16))
def test_elastic_replay_keeps_every_update(W, G, W2):
    """W'G' = WG: the same microbatches form every update; only the rank running each changes."""
    G2 = layout.elastic_grad_accum(W * G, W2)
    if G2 is None:
        assert (W * G) % W2
        return
    assert W2 * G2 == W * G
    n = 3 * W * G + 1
    assert np.array_equal(layout.update_mapping(n, W, G)[0], layout.update_mapping(n, W2, G2)[0])


@given(n=st.integers(0, 300), W=st.integers(1, 8), G=st.integers(1, 6))
def test_update_spans_partition_the_epoch_and_the_counts_agree(n, W, G):
    """Update bounds cover [0, n) without gap or overlap: full updates of W*G first, then at most one shorter tail;
    every count (complete, optimizer updates, complete and tail microbatches) is read off the same spans."""
    bounds = layout.update_bounds(n, W, G)
    sizes = np.diff(bounds)
    assert bounds[0] == 0 and bounds[-1] == n and (sizes > 0).all()
    assert sizes.size == layout.optimizer_updates(n, W, G)
    complete = layout.complete_updates(n, W, G)
    assert (sizes[:complete] == layout.batches_per_update(W, G)).all()
    assert (sizes[complete:] < W * G).all() and sizes[complete:].size <= 1
    assert layout.complete_batches(n, W, G) == bounds[complete]
    assert layout.tail_batches(n, W, G) == n - bounds[complete] == sizes[complete:].sum()
    assert np.array_equal(layout.in_complete_update(n, W, G), np.arange(n) < bounds[complete])


@given(n=st.integers(0, 300), W=st.integers(1, 8), G=st.integers(1, 6))
def test_every_microbatch_has_exactly_one_place(n, W, G):
    """(update, rank, micro_step) is a bijection onto the places i = u*W*G + m*W + r; every rank's indices are
    those with its rank, the ranks' shares partition the epoch, and none is longer than `steps_per_rank`."""
    update, rank, micro_step = layout.update_mapping(n, W, G)
    assert ((rank >= 0) & (rank < W) & (micro_step >= 0) & (micro_step < G)).all()
    assert np.array_equal(update * W * G + micro_step * W + rank, np.arange(n))
    assert np.array_equal(layout.ranks(n, W), rank)
    shares = [layout.rank_indices(n, W, r) for r in range(W)]
    assert np.array_equal(np.sort(np.concatenate(shares)), np.arange(n))
    assert all((rank[s] == r).all() for r, s in enumerate(shares))
    assert max(s.size for s in shares) == layout.steps_per_rank(n, W)


@given(labels=st.lists(st.integers(0, 10**6), max_size=200), W=st.integers(1, 6), G=st.integers(1, 5))
def test_num_items_is_the_label_total_of_the_update(labels, W, G):
    """Each microbatch carries its whole update's targets (tail included); the complete updates' grid holds the
    microbatch at [update, micro_step, rank] and sums to the same totals."""
    x = np.array(labels, dtype=np.int64)
    update, rank, micro_step = layout.update_mapping(x.size, W, G)
    totals = {u: int(x[update == u].sum()) for u in np.unique(update)}
    assert layout.num_items(x, W, G).tolist() == [totals[u] for u in update]
    grid = layout.update_grid(x, W, G)
    assert grid.shape == (layout.complete_updates(x.size, W, G), G, W)
    full = layout.complete_batches(x.size, W, G)
    assert np.array_equal(grid[update[:full], micro_step[:full], rank[:full]], x[:full])
    assert grid.sum(axis=(1, 2)).tolist() == [totals[u] for u in range(grid.shape[0])]


@given(W=st.integers(1, 8), G=st.integers(1, 8), W2=st.integers(1, 16), G2=st.none() | st.integers(1, 16))
def test_replay_is_accepted_exactly_when_the_updates_stay_whole(W, G, W2, G2):
    """W'G' = WG (or no G' on the plan's own world size) replays; anything else gets the one message, which names
    the fitting grad_accum in the caller's spelling when there is one."""
    problem = layout.replay_problem(W, G, W2, G2)
    assert (problem is None) == (W2 * G2 == W * G if G2 is not None else W2 == W)
    if problem is None:
        return
    assert f"compiled for world_size {W} x grad_accum {G} ({W * G} microbatches per update)" in problem
    fits = layout.elastic_grad_accum(W * G, W2)
    spelled = layout.replay_problem(W, G, W2, G2, flag="--grad-accum", sep=" ")
    for message, fix in ((problem, f"pass grad_accum={fits}"), (spelled, f"pass --grad-accum {fits}")):
        assert (fix if fits is not None else f"{W2} does not divide {W * G}") in message
        assert message.count("\n") == 0


# ---------------------------------------------------------------- the arithmetic stays here
REPO = REPO
WORLD = {"world_size", "W", "world"}
ACCUM = {"grad_accum", "G", "gas", "gradient_accumulation_steps"}
# PlanSettings may import neither numpy nor the layout (docs/architecture.md): its `batches_per_update` is the
# settings' own W*G, which layout.batches_per_update states for everyone else
ALLOWED = {("plancc/config/settings.py", "self.world_size * self.grad_accum")}


def _name(node: ast.AST) -> str | None:
    """The identifier an operand ends in: `W`, `settings.world_size`, `complete_updates(...)`."""
    if isinstance(node, ast.Call):
        return _name(node.func)
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _factors(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return [*_factors(node.left), *_factors(node.right)]
    return [node]


def layout_arithmetic(source: str) -> list[tuple[int, str, str]]:
    """(line, expression, what to call instead) for each piece of layout arithmetic in `source`: a product of a
    world size and a grad_accum, complete updates times anything, a floor division or remainder by a world size
    (ranks, steps per rank), or any floor division or remainder of `batches_per_update` (updates, elastic
    replay). A local `per_update` or `P` inside a balancing kernel is that kernel's own matrix shape."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.BinOp):
            continue
        if isinstance(node.op, ast.Mult):
            names = {_name(f) for f in _factors(node)}
            if names & WORLD and names & ACCUM:
                found.append((node.lineno, ast.unparse(node), "layout.batches_per_update, complete_batches, update_grid"))
            elif "complete_updates" in names:
                found.append((node.lineno, ast.unparse(node), "layout.complete_batches"))
        elif isinstance(node.op, ast.FloorDiv | ast.Mod):
            if _name(node.right) in {"world_size", "W"}:
                found.append((node.lineno, ast.unparse(node), "layout.ranks, steps_per_rank, update_mapping"))
            elif "batches_per_update" in {_name(node.left), _name(node.right)}:
                found.append((node.lineno, ast.unparse(node), "layout.complete_updates, elastic_grad_accum"))
    return found


def test_no_module_redoes_the_layout_arithmetic():
    """Outside `plancc/core/layout.py`, the package and the examples ask the layout: a second copy of the arithmetic
    could drift from the one the compiler, the store checks and the sampler agree on."""
    bad = []
    for path in sorted([*(REPO / "plancc").rglob("*.py"), *(REPO / "examples").rglob("*.py")]):
        rel = path.relative_to(REPO).as_posix()
        if rel != "plancc/core/layout.py":
            bad += [f"{rel}:{line} {expr} (use {use})" for line, expr, use in
                    layout_arithmetic(path.read_text(encoding="utf-8")) if (rel, expr) not in ALLOWED]
    assert not bad, "layout arithmetic outside plancc/core/layout.py: " + "; ".join(bad)


def test_the_arithmetic_checker_sees_each_form():
    """The checker itself: every form it forbids is found, the kernels' local shapes and unrelated divisions are
    not, and the one allowed product is really there (a checker that sees nothing would pass everything)."""
    bad = ("u = i // (settings.world_size * settings.grad_accum)", "full = n_upd * W * G",
           "k = complete_updates(n, W, G) * P", "r = index % settings.world_size", "s = -(-n // world_size)",
           "g = plan.batches_per_update // world", "m = n % self.batches_per_update")
    assert [len(layout_arithmetic(line)) for line in bad] == [1] * len(bad)
    fine = "threads = (os.cpu_count() or 1) // world\nn_upd = n_span // per_update\nx = rows * P"
    assert layout_arithmetic(fine) == []
    config = (REPO / "plancc" / "config" / "settings.py").read_text(encoding="utf-8")
    assert {("plancc/config/settings.py", expr) for _, expr, _ in layout_arithmetic(config)} == ALLOWED
