"""The counting sort is the stable order numpy gives, on any key range (it replaces argsorts in packing)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from plancc.planner.sort import longest_first, longest_first_of, stable_order


@given(st.lists(st.integers(0, 40), max_size=200), st.integers(0, 5))
def test_stable_order_is_numpys_stable_argsort(keys, spare):
    keys = np.array(keys, dtype=np.int64)
    n_keys = int(keys.max()) + 1 + spare if keys.size else spare
    assert np.array_equal(stable_order(keys, n_keys), np.argsort(keys, kind="stable"))


@given(st.lists(st.integers(0, 5000), max_size=200))
def test_longest_first_is_a_stable_descending_argsort(lengths):
    lengths = np.array(lengths, dtype=np.int64)
    assert np.array_equal(longest_first(lengths), np.argsort(-lengths, kind="stable"))


@given(st.lists(st.integers(0, 5000), min_size=1, max_size=200), st.data())
def test_longest_first_of_items_is_the_gathered_order(lengths, data):
    lengths = np.array(lengths, dtype=np.int32)  # as a samples table stores them
    items = np.array(data.draw(st.lists(st.integers(0, len(lengths) - 1), max_size=300)), dtype=np.int64)
    n_keys = int(lengths.max()) + 1 + data.draw(st.integers(0, 3))
    assert np.array_equal(longest_first_of(items, lengths, n_keys), items[longest_first(lengths[items])])
