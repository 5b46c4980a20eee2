"""Row-level changes (`plancc.review.diff_rows`): counts that always add up, edits, insertions and deletions
recovered exactly when they are apart, duplicates and moves, and rows named by file."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from plancc.review.diff_rows import RowNames, changes_json, row_changes


def changes(old: list[int], new: list[int]):
    return row_changes(np.arange(len(old)), np.array(old, np.uint64), np.arange(len(new)), np.array(new, np.uint64))


def test_by_hand():
    c = changes([1, 2, 3, 4, 5], [1, 2, 9, 4, 7, 5])
    assert c.unchanged == 4 and c.added.tolist() == [4] and c.removed.tolist() == []
    assert (c.edited_old.tolist(), c.edited_new.tolist()) == ([2], [2])


def test_deleting_a_row_does_not_edit_every_later_one():
    c = changes([1, 2, 3, 4, 5, 6], [1, 3, 4, 5, 6])
    assert c.removed.tolist() == [1] and c.edited_new.size == 0 and c.unchanged == 5


def test_moved_and_duplicated_rows_are_unchanged():
    assert not changes([1, 2, 3], [3, 1, 2]).changed  # reordered: the same content
    c = changes([7, 7, 8], [7, 8, 7, 7])
    assert c.unchanged == 3 and c.added.size == 1 and c.removed.size == 0  # the third copy is new


def test_every_row_re_derived_is_an_edit_each():
    c = changes([1, 2, 3], [4, 5, 6])
    assert c.unchanged == 0 and c.edited_new.tolist() == [0, 1, 2] and c.edited_old.tolist() == [0, 1, 2]


def test_empty_sides():
    assert changes([], [1, 2]).added.tolist() == [0, 1]
    assert changes([1], []).removed.tolist() == [0]
    assert not changes([], []).changed


@st.composite
def edited_dataset(draw):
    """A dataset of unique rows, and a new version with edits, insertions and deletions at sites at least two rows
    apart, plus rows appended (not after a deleted last row: that is the last row edited); with the changes that
    were made."""
    n = draw(st.integers(0, 120))
    sites = sorted(draw(st.sets(st.integers(0, max(n - 1, 0)), max_size=n // 3)) if n else [])
    sites = [s for i, s in enumerate(sites) if i == 0 or s - sites[i - 1] >= 2]
    kinds = {s: draw(st.sampled_from(["edit", "insert", "delete"])) for s in sites}
    fresh = iter(range(10**9, 2 * 10**9))
    new, added, removed, edited = [], [], [], []
    for i in range(n):
        kind = kinds.get(i)
        if kind == "insert":
            added.append(len(new))
            new.append(next(fresh))
        if kind == "delete":
            removed.append(i)
            continue
        if kind == "edit":
            edited.append((len(new), i))
            new.append(next(fresh))
        else:
            new.append(i + 1)
    appended = draw(st.integers(0, 5)) if kinds.get(n - 1) != "delete" else 0  # else: the last row edited
    for _ in range(appended):
        added.append(len(new))
        new.append(next(fresh))
    return [i + 1 for i in range(n)], new, added, removed, edited


@settings(max_examples=150, deadline=None)
@given(edited_dataset())
def test_changes_apart_are_recovered_exactly(case):
    old, new, added, removed, edited = case
    c = changes(old, new)
    assert c.added.tolist() == added and c.removed.tolist() == removed
    assert list(zip(c.edited_new.tolist(), c.edited_old.tolist(), strict=True)) == edited
    assert c.unchanged == len(old) - len(removed) - len(edited)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 6), max_size=40), st.lists(st.integers(0, 6), max_size=40))
def test_counts_always_add_up(old, new):
    c = changes(old, new)
    assert c.unchanged + c.edited_new.size + c.removed.size == len(old)
    assert c.unchanged + c.edited_new.size + c.added.size == len(new)
    # each row is used once: no new row is both added and edited, no old row both removed and edited
    assert not set(c.added.tolist()) & set(c.edited_new.tolist())
    assert not set(c.removed.tolist()) & set(c.edited_old.tolist())
    # content kept is never reported: as many unchanged rows as the two multisets share
    shared = sum(min(old.count(v), new.count(v)) for v in set(old))
    assert c.unchanged == shared


def test_rows_named_by_file():
    names = RowNames((("a.jsonl", 3), ("b.jsonl", 2)))
    assert [names.name(r) for r in (0, 2, 3, 4)] == [
        {"file": "a.jsonl", "row": 0}, {"file": "a.jsonl", "row": 2}, {"file": "b.jsonl", "row": 0},
        {"file": "b.jsonl", "row": 1}]
    assert RowNames((("train.jsonl", 5),), "data/train.jsonl").name(4) == {"file": "data/train.jsonl", "row": 4}
    assert RowNames((), "data/x.parquet").name(7) == {"file": "data/x.parquet", "row": 7}  # files not recorded
    c = changes(list(range(1, 31)), list(range(101, 131)))
    j = changes_json(c, RowNames(), RowNames())
    assert j["edited"] == 30 and len(j["examples"]["edited"]) == 10 and j["listed"] == "examples"
    assert len(changes_json(c, RowNames(), RowNames(), None)["examples"]["edited"]) == 30
