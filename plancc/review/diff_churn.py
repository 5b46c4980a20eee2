"""Membership churn between two plans, per epoch: the share of common samples whose update or rank changed, the
share of microbatches that are identical (same sample ids in the same rows, at the same global index) and the first
differing microbatch.

A columnar compare, never a loop over samples: each plan's `sample_ids` column becomes flat CSR arrays
(`parquet.nested_arrays`), each sample's (update, rank) key is scattered into a dense id-indexed array (or
matched by sort when ids are sparse), and microbatches of equal shape are compared element-wise through one
gather. Epochs whose plan fingerprints are equal are not read at all: equal digests mean equal rows.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa

from plancc.store import parquet, schemas
from plancc.store.plan import Plan

MetricsByStage = dict[tuple[int, str], dict[str, Any]]  # (epoch, stage) -> metrics row, in the file's order


def metrics_by_stage(plan: Plan) -> MetricsByStage:
    """A plan's metrics rows (`Plan.metrics`, with padding_ratio) by (epoch, stage)."""
    return {(int(row["epoch"]), row["stage"]): row for row in plan.metrics()}


CHURN_COLUMNS = ["epoch", "index", "update", "rank", "sample_ids"]


# ---------------------------------------------------------------- churn (columnar)


class EpochRows:
    """One epoch of one plan as flat arrays, addressable by global microbatch index."""

    def __init__(self, table: pa.Table):
        ids, row_bounds, batch_bounds = parquet.nested_arrays(table.column("sample_ids"))
        n = table.num_rows
        index = table.column("index").to_numpy()
        # position (row of the file slice) of each global microbatch index
        pos = np.empty(n, dtype=np.int64)
        pos[index] = np.arange(n, dtype=np.int64)
        self.n = n
        self.ids = ids
        self.row_sizes = np.diff(row_bounds)
        self.batch_bounds = batch_bounds  # rows of each microbatch (by file position)
        self.flat_bounds = row_bounds[batch_bounds]  # flat samples of each microbatch (by file position)
        self.pos = pos
        self.update = table.column("update").to_numpy()
        self.rank = table.column("rank").to_numpy()
        per_batch = np.diff(self.flat_bounds)
        self.sample_update = np.repeat(self.update.astype(np.int64), per_batch)
        self.sample_rank = np.repeat(self.rank.astype(np.int64), per_batch)

    def batch_ids(self, i: int, limit: int = 8) -> list[list[int]]:
        """Microbatch `i`'s rows of sample ids, at most `limit` ids in all (for the report's first
        difference)."""
        p = self.pos[i]
        r0, r1 = self.batch_bounds[p], self.batch_bounds[p + 1]
        out, shown = [], 0
        for r in range(r0, r1):
            lo = int(self.flat_bounds[p]) + int(self.row_sizes[r0:r].sum())
            row = self.ids[lo: lo + int(self.row_sizes[r])][: max(limit - shown, 0)].tolist()
            shown += len(row)
            out.append(row)
        return out


def _segments_equal(a_vals: np.ndarray, a_bounds: np.ndarray, a_idx: np.ndarray,
                    b_vals: np.ndarray, b_bounds: np.ndarray, b_idx: np.ndarray) -> np.ndarray:
    """Element-wise equality of segments a_idx of (a_vals, a_bounds) and b_idx of (b_vals, b_bounds).

    Segments of different sizes are unequal; equal-size ones are compared through one vectorized gather.
    """
    a_size = a_bounds[a_idx + 1] - a_bounds[a_idx]
    b_size = b_bounds[b_idx + 1] - b_bounds[b_idx]
    equal = a_size == b_size
    cand = np.flatnonzero(equal)
    if cand.size == 0:
        return equal
    sizes = a_size[cand]
    total = int(sizes.sum())
    if total == 0:
        return equal
    starts = np.cumsum(sizes) - sizes
    offs = np.arange(total, dtype=np.int64) - np.repeat(starts, sizes)
    a = a_vals[np.repeat(a_bounds[a_idx[cand]], sizes) + offs]
    b = b_vals[np.repeat(b_bounds[b_idx[cand]], sizes) + offs]
    differs = np.zeros(cand.size, dtype=bool)
    differs[np.repeat(np.arange(cand.size, dtype=np.int64), sizes)[a != b]] = True
    equal[cand[differs]] = False
    return equal


RANK_BITS = 24  # (update << RANK_BITS) | rank: one int64 key per sample, one scatter per plan


def _placement_changes(old: EpochRows, new: EpochRows) -> tuple[int, int, int]:
    """(common samples, of them placed in another update, of them placed on another rank).

    Dense ids (the usual case: rows of the tokenized dataset) are compared in id space: each plan scatters one
    (update, rank) key per sample into an id-indexed array, one random write per sample, the rest sequential.
    Sparse ids fall back to matching by sort (`np.intersect1d`).
    """
    if old.ids.size == 0 or new.ids.size == 0:
        return 0, 0, 0
    ko = (old.sample_update << RANK_BITS) | old.sample_rank
    kn = (new.sample_update << RANK_BITS) | new.sample_rank
    lo = int(min(old.ids.min(), new.ids.min()))
    hi = int(max(old.ids.max(), new.ids.max()))
    span = hi - lo + 1
    if lo >= 0 and span <= 4 * max(old.ids.size, new.ids.size) + 1024:
        by_id_old = np.full(span, -1, dtype=np.int64)
        by_id_old[old.ids - lo] = ko
        by_id_new = np.full(span, -1, dtype=np.int64)
        by_id_new[new.ids - lo] = kn
        both = (by_id_old >= 0) & (by_id_new >= 0)
        a, b = by_id_old[both], by_id_new[both]
    else:
        _, ia, ib = np.intersect1d(old.ids, new.ids, assume_unique=True, return_indices=True)
        a, b = ko[ia], kn[ib]
    mask = (1 << RANK_BITS) - 1
    return int(a.size), int(((a >> RANK_BITS) != (b >> RANK_BITS)).sum()), int(((a & mask) != (b & mask)).sum())


def epoch_churn(old: EpochRows, new: EpochRows, *, show_ids: int = 8) -> dict[str, Any]:
    """Membership churn of one epoch between two plans (see module docstring)."""
    common, update_changed, rank_changed = _placement_changes(old, new)

    m = min(old.n, new.n)
    idx = np.arange(m, dtype=np.int64)
    po, pn = old.pos[idx], new.pos[idx]
    same = _segments_equal(old.row_sizes, old.batch_bounds, po, new.row_sizes, new.batch_bounds, pn)
    cand = np.flatnonzero(same)
    same[cand] = _segments_equal(old.ids, old.flat_bounds, po[cand], new.ids, new.flat_bounds, pn[cand])
    identical = int(same.sum())
    differing = np.flatnonzero(~same)
    if differing.size:
        first: int | None = int(differing[0])
    elif old.n != new.n:
        first = m
    else:
        first = None
    denom = max(old.n, new.n)
    out: dict[str, Any] = {
        "samples_old": int(old.ids.size),
        "samples_new": int(new.ids.size),
        "common_samples": common,
        "added_samples": int(new.ids.size) - common,
        "removed_samples": int(old.ids.size) - common,
        "update_changed": update_changed,
        "update_changed_share": update_changed / common if common else 0.0,
        "rank_changed": rank_changed,
        "rank_changed_share": rank_changed / common if common else 0.0,
        "microbatches_old": old.n,
        "microbatches_new": new.n,
        "identical_microbatches": identical,
        "identical_microbatch_share": identical / denom if denom else 1.0,
        "first_differing_microbatch": first,
        "first_difference": None,
    }
    if first is not None:
        out["first_difference"] = {
            "index": first,
            "old": _describe(old, first, show_ids),
            "new": _describe(new, first, show_ids),
        }
    return out


def _describe(rows: EpochRows, i: int, show_ids: int) -> dict[str, Any] | None:
    if i >= rows.n:
        return None
    p = rows.pos[i]
    return {"update": int(rows.update[p]), "rank": int(rows.rank[p]),
            "samples": int(rows.flat_bounds[p + 1] - rows.flat_bounds[p]),
            "sample_ids": rows.batch_ids(i, show_ids)}


def _identical_churn(metrics: MetricsByStage, epoch: int) -> dict[str, Any]:
    after = metrics.get((epoch, "after"), {})
    n, samples = int(after.get("batches") or 0), int(after.get("samples") or 0)
    return {
        "samples_old": samples, "samples_new": samples, "common_samples": samples,
        "added_samples": 0, "removed_samples": 0,
        "update_changed": 0, "update_changed_share": 0.0, "rank_changed": 0, "rank_changed_share": 0.0,
        "microbatches_old": n, "microbatches_new": n, "identical_microbatches": n,
        "identical_microbatch_share": 1.0, "first_differing_microbatch": None, "first_difference": None,
    }


def _epoch_slices(table: pa.Table) -> dict[int, pa.Table]:
    epochs = table.column("epoch").to_numpy()
    out = {}
    for e in np.unique(epochs).tolist():
        lo, hi = np.searchsorted(epochs, [e, e + 1])
        out[int(e)] = table.slice(int(lo), int(hi - lo))
    return out


def _load_rows(plan: Plan, epochs: list[int]) -> dict[int, EpochRows]:
    slices = _epoch_slices(plan.files.read_rows(CHURN_COLUMNS))  # file order: (epoch, rank, index)
    return {e: EpochRows(slices[e]) for e in epochs if e in slices}




def churn(old: Plan, new: Plan, epochs: list[int], show_ids: int, old_metrics: MetricsByStage
          ) -> list[dict[str, Any]]:
    """Per epoch: in one plan only, or compared (rows of the epochs whose plans differ are read and diffed)."""
    plan_o, plan_n = old.fingerprints.get("plan", {}), new.fingerprints.get("plan", {})
    changed_epochs = [e for e in epochs if plan_o.get(str(e)) != plan_n.get(str(e))
                      and str(e) in plan_o and str(e) in plan_n]
    churn = []
    old_rows: dict[int, EpochRows] = {}
    new_rows: dict[int, EpochRows] = {}
    if changed_epochs:
        # the two plans are read and unpacked concurrently (Arrow and large numpy ops release the GIL)
        with ThreadPoolExecutor(max_workers=2) as pool:
            jobs = [pool.submit(_load_rows, info, changed_epochs) for info in (old, new)]
            old_rows, new_rows = (j.result() for j in jobs)
    for e in epochs:
        if str(e) not in plan_o or str(e) not in plan_n:
            churn.append({"epoch": e, "status": "old_only" if str(e) in plan_o else "new_only"})
            continue
        if e in changed_epochs:
            if e not in old_rows or e not in new_rows:
                raise schemas.StoreError(f"epoch {e} is listed in the fingerprints but has no rows in "
                                       f"{(old if e not in old_rows else new).path / schemas.PLAN_FILE}")
            c = epoch_churn(old_rows[e], new_rows[e], show_ids=show_ids)
        else:
            c = _identical_churn(old_metrics, e)
        churn.append({"epoch": e, "status": "compared", **c})
    return churn
