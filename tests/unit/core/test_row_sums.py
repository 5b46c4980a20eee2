"""The one-pass row sums are the plain per-row reductions, under every shift, on any plan shape."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from plancc.core import row_sums as kernel
from plancc.core.choices import Shift
from plancc.core.plan_arrays import Batches, SampleArrays, row_sums


@st.composite
def plans(draw):
    n = draw(st.integers(0, 60))
    length = np.array(draw(st.lists(st.integers(1, 2**31 - 1), min_size=n, max_size=n)), dtype=np.int64)
    label_count = np.array([draw(st.integers(0, int(x))) for x in length], dtype=np.int64)
    first = np.array([draw(st.booleans()) and c > 0 for c in label_count], dtype=bool)
    s = SampleArrays(np.arange(n, dtype=np.int64), length, label_count, first)
    samples = np.array(draw(st.permutations(range(n))), dtype=np.int64)
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=8)))
    row_bounds = np.array([0, *cuts, n], dtype=np.int64)  # empty rows included
    return s, Batches(samples, row_bounds, np.array([0, row_bounds.shape[0] - 1], dtype=np.int64))


@given(plans(), st.sampled_from(list(Shift)))
def test_row_sums_equal_the_per_row_reductions(plan, shift):
    s, b = plan
    got = row_sums(b, s, shift)
    for r in range(b.num_rows):
        members = b.samples[b.row_bounds[r]:b.row_bounds[r + 1]]
        length, labels, first = s.length[members], s.label_count[members], s.first_label_supervised[members]
        if shift == Shift.SAMPLE:
            targets = int((labels - first).sum())
        elif shift == Shift.ROW:
            targets = int(labels.sum()) - (int(first[0]) if members.size else 0)
        else:
            targets = int(labels.sum())
        assert got.tokens[r] == int(length.sum())
        assert got.targets[r] == targets
        squares = sum(int(x) * int(x) for x in length)
        assert got.squares[r] == squares or squares >= 2**63  # int64 attention work: rows up to ~3e9 tokens


def test_threaded_row_sums_equal_the_serial_pass():
    rng = np.random.default_rng(0)
    n = 50_000
    length = rng.integers(1, 4096, n)
    facts = kernel.pack_facts(length, rng.integers(0, length + 1), rng.random(n) < 0.3)
    samples = rng.permutation(n).astype(np.int64)
    row_bounds = np.unique(np.concatenate([[0, n], rng.integers(0, n, 3000)])).astype(np.int64)
    for shift in (kernel.NONE, kernel.SAMPLE, kernel.ROW):
        serial = kernel.row_sums(samples, row_bounds, facts, shift)
        assert np.array_equal(kernel.row_sums_threaded(samples, row_bounds, facts, shift), serial)
