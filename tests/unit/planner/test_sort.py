"""The counting sort is the stable order numpy gives, on any key range (it replaces argsorts in packing)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from plancc.planner.sort import longest_first, stable_order


@given(st.lists(st.integers(0, 40), max_size=200), st.integers(0, 5))
def test_stable_order_is_numpys_stable_argsort(keys, spare):
    keys = np.array(keys, dtype=np.int64)
    n_keys = int(keys.max()) + 1 + spare if keys.size else spare
    assert np.array_equal(stable_order(keys, n_keys), np.argsort(keys, kind="stable"))


@given(st.lists(st.integers(0, 5000), max_size=200))
def test_longest_first_is_a_stable_descending_argsort(lengths):
    lengths = np.array(lengths, dtype=np.int64)
    assert np.array_equal(longest_first(lengths), np.argsort(-lengths, kind="stable"))
