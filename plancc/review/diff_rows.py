"""Which source rows of a dataset were added, removed or edited between two plans.

A sample's source key is where it came from, which the samples table already records: its dataset (the `dataset`
column of a recipe) and its row there (`sample_id - first_id`: the row of the dataset's files in their sorted
order; the scan records each file's name and row count, `ScanRecord.source_files`, so a row is named as "file row
r"). Rows are matched by content first (`token_hash`: equal hashes are the same tokens and labels, wherever the row
now sits), then by position: an unmatched old row and an unmatched new row that lie between the same two matched
rows are one row edited, pairwise in order; what is left over was removed (old) or added (new). Inserting or
deleting rows therefore does not turn every later row into an edit, as comparing row numbers would:

    old  A B X C D        matched by content: A B C D
    new  A B Y C E D      edited X -> Y (both after B), added E (after C)

Everything is a sort or a scan over arrays (no per-row Python): a few sorts of each side's rows in all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

EXAMPLES = 10  # rows the report names per kind of change (`--rows` lists them all)


@dataclass(frozen=True)
class RowChanges:
    """One dataset's rows old vs new: each array holds dataset rows (old rows for `removed` and `edited_old`)."""

    unchanged: int
    added: np.ndarray
    removed: np.ndarray
    edited_old: np.ndarray
    edited_new: np.ndarray

    @property
    def changed(self) -> bool:
        """Whether any row was added, removed or edited."""
        return bool(self.added.size or self.removed.size or self.edited_new.size)


def _rank_in_runs(values: np.ndarray) -> np.ndarray:
    """Each entry's position within its run of equal neighbours ([5, 5, 7, 5] -> [0, 1, 0, 0])."""
    idx = np.arange(values.size, dtype=np.int64)
    starts = np.ones(values.size, dtype=bool)
    starts[1:] = values[1:] != values[:-1]
    return idx - np.maximum.accumulate(np.where(starts, idx, 0))


def _occurrence(values: np.ndarray) -> np.ndarray:
    """Each entry's rank among the entries equal to it, in array order (0 for the first); only repeated values
    are ranked by a stable sort (most rows are unique)."""
    out = np.zeros(values.size, dtype=np.int64)
    ranked = np.sort(values)
    repeated = np.unique(ranked[1:][ranked[1:] == ranked[:-1]])
    if repeated.size == 0:
        return out
    at = np.flatnonzero(np.isin(values, repeated))
    sub = values[at]
    order = np.argsort(sub, kind="stable")
    out[at[order]] = _rank_in_runs(sub[order])
    return out


MIX = np.uint64(0x9E3779B97F4A7C15)  # spreads a repeat count over 64 bits: (hash, k) as one key


def _keys(hashes: np.ndarray) -> np.ndarray:
    """One int64 key per entry, unique within the side: its content hash, mixed with its repeat count for rows
    whose content occurs more than once (the k-th copy on one side pairs with the k-th on the other)."""
    with np.errstate(over="ignore"):
        return (hashes + _occurrence(hashes).astype(np.uint64) * MIX).view(np.int64)


def _match(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions (in a, in b) of equal keys; keys are unique within each side."""
    if a.size == 0 or b.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    oa, ob = np.argsort(a), np.argsort(b)
    sa, sb = a[oa], b[ob]
    pos = np.minimum(np.searchsorted(sa, sb), a.size - 1)  # sorted queries: one sequential pass
    hit = sa[pos] == sb
    return oa[pos[hit]], ob[hit]


def _gaps(matched: np.ndarray) -> np.ndarray:
    """For each unmatched entry, one key: the count of matched entries before it (its gap between two matched
    rows) in the high 32 bits, its rank within that gap in the low ones."""
    gap = (np.cumsum(matched) - matched)[~matched]  # non-decreasing: one run per gap
    return (gap << 32) | _rank_in_runs(gap)


def row_changes(old_rows: np.ndarray, old_hash: np.ndarray, new_rows: np.ndarray, new_hash: np.ndarray
                ) -> RowChanges:
    """The rows added, removed and edited between two versions of a dataset (module docstring); each side's rows
    and content hashes are given in row order."""
    ia, ib = _match(_keys(old_hash.astype(np.uint64, copy=False)), _keys(new_hash.astype(np.uint64, copy=False)))
    m_old = np.zeros(old_rows.size, dtype=bool)
    m_old[ia] = True
    m_new = np.zeros(new_rows.size, dtype=bool)
    m_new[ib] = True
    rest_old, rest_new = np.flatnonzero(~m_old), np.flatnonzero(~m_new)
    eo, en = _match(_gaps(m_old), _gaps(m_new))
    e_old = np.zeros(rest_old.size, dtype=bool)
    e_old[eo] = True
    e_new = np.zeros(rest_new.size, dtype=bool)
    e_new[en] = True
    order = np.argsort(rest_new[en], kind="stable")  # edits in new-row order, each with its old row
    return RowChanges(unchanged=int(ia.size), added=new_rows[rest_new[~e_new]], removed=old_rows[rest_old[~e_old]],
                      edited_old=old_rows[rest_old[eo]][order], edited_new=new_rows[rest_new[en]][order])


# ---------------------------------------------------------------- naming rows


@dataclass(frozen=True)
class RowNames:
    """Names a dataset's rows: "file row r" from the files it recorded (`source_files`), else "row r"."""

    files: tuple[tuple[str, int], ...] = ()
    lone: str | None = None  # how a one-file dataset's file is shown (its path as the user gave it)

    def name(self, row: int) -> dict[str, Any]:
        """{file, row} of a dataset row: the file holding it and its row there (file None when not recorded)."""
        if not self.files:
            return {"file": self.lone, "row": int(row)}
        ends = np.cumsum([n for _, n in self.files])
        i = int(np.searchsorted(ends, row, side="right"))
        if i >= len(self.files):
            return {"file": None, "row": int(row)}
        start = int(ends[i - 1]) if i else 0
        shown = self.lone if len(self.files) == 1 and self.lone else self.files[i][0]
        return {"file": shown, "row": int(row) - start}


def changes_json(c: RowChanges, old_names: RowNames, new_names: RowNames, limit: int | None = EXAMPLES
                 ) -> dict[str, Any]:
    """The counts and up to `limit` named rows of each kind (all of them when `limit` is None)."""
    cut = slice(None) if limit is None else slice(0, limit)
    return {
        "unchanged": c.unchanged, "added": int(c.added.size), "removed": int(c.removed.size),
        "edited": int(c.edited_new.size), "listed": "all" if limit is None else "examples",
        "examples": {
            "added": [new_names.name(r) for r in c.added[cut].tolist()],
            "removed": [old_names.name(r) for r in c.removed[cut].tolist()],
            "edited": [{**new_names.name(r), "old": old_names.name(o)}
                       for r, o in zip(c.edited_new[cut].tolist(), c.edited_old[cut].tolist(), strict=True)],
        },
    }


def ref(where: dict[str, Any]) -> str:
    """A named row as people read it: `data/train.jsonl row 17` (or `row 17`)."""
    return f"{where['file']} row {where['row']}" if where.get("file") else f"row {where['row']}"
