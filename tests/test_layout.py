"""`plancc.layout`, the one statement of SPEC 4's layout: the global mapping, the positions a rank walks, and
elastic replay, checked against each other (no plan, no torch)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from plancc import layout


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
