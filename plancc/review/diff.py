"""Compare two plan directories the way a reviewer or a CI job wants: what changed, why, and how much it moved.

`diff_plans(old, new)` returns one JSON-able report (schema: `schemas/diff.schema.json`):

* config: every plan setting whose value differs, setting by setting;
* fingerprints: dataset, metadata, config, plancc version and the plan digest of every epoch, old vs new;
* metrics: per (epoch, stage) the metrics whose value changed, with the delta;
* regressions: after-stage metrics that got worse beyond the tolerance (the rule: `plancc.review.diff_rules`);
* eval: whether either plan has an eval plan, how its sizes moved and which held-out samples came and went;
* churn: per epoch, the share of common samples whose update / rank changed, the share of microbatches that are
  identical (same sample ids in the same rows, at the same global index) and the first differing microbatch.

Churn is a columnar compare, never a loop over samples: each plan's `sample_ids` column becomes flat CSR arrays
(`parquet.nested_arrays`), each sample's (update, rank) key is scattered into a dense id-indexed array (or
matched by sort when ids are sparse), and microbatches of equal shape are compared element-wise through one
gather. Epochs whose plan fingerprints are equal are not read at all: equal digests mean equal rows.

`failures` applies the `--fail-on` policy to a report; `plancc.cli.diff_render` turns it into text or markdown.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from plancc.core.metric_columns import METRIC_COLUMNS
from plancc.errors import SettingsError
from plancc.review.diff_rules import ABS_FLOOR, DEFAULT_TOLERANCE, FAIL_ON, REGRESSION_METRICS
from plancc.store import parquet, schemas
from plancc.store.plan import Plan

# ---------------------------------------------------------------- loading


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


# ---------------------------------------------------------------- the eval plan


EVAL_SIZES = ("samples", "tokens", "label_count", "batches", "cost")


def _eval_ids(plan: Plan) -> np.ndarray:
    return np.unique(parquet.nested_arrays(plan.files.read_eval().column("sample_ids"))[0])


def eval_changes(old: Plan, new: Plan) -> dict[str, Any]:
    """How the eval plans differ: which plan has one, its sizes (old, new, delta) and the held-out samples added
    and removed. Equal eval fingerprints mean equal eval plans: nothing is read."""
    has = (old.manifest.has_eval, new.manifest.has_eval)
    status = {(True, True): "both", (True, False): "old_only", (False, True): "new_only"}.get(has, "none")
    out: dict[str, Any] = {"status": status, "changed": old.fingerprints.get("eval") != new.fingerprints.get("eval"),
                           "sizes": [], "added_samples": 0, "removed_samples": 0}
    if status == "none" or not out["changed"]:
        return out
    so, sn = (p.manifest.eval.to_json() if p.manifest.eval is not None else {} for p in (old, new))
    out["sizes"] = [{"metric": m, "old": so.get(m), "new": sn.get(m),
                     "delta": sn[m] - so[m] if m in so and m in sn else None}
                    for m in EVAL_SIZES if so.get(m) != sn.get(m)]
    ids_o, ids_n = (_eval_ids(info) if h else np.zeros(0, dtype=np.int64)
                    for info, h in zip((old, new), has, strict=True))
    out["added_samples"] = int(np.setdiff1d(ids_n, ids_o).size)
    out["removed_samples"] = int(np.setdiff1d(ids_o, ids_n).size)
    return out


# ---------------------------------------------------------------- the report


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _changed(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is not b
    if isinstance(a, float) or isinstance(b, float):
        return not math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=1e-15)
    return a != b


def diff_plans(old_path: str | Path, new_path: str | Path, *, tolerance: float = DEFAULT_TOLERANCE,
               show_ids: int = 8) -> dict[str, Any]:
    """The full comparison of two plan directories (see module docstring).

    Raises `schemas.StoreError` for an input that is not a readable plan, `SettingsError` for a bad tolerance."""
    if not (tolerance >= 0 and math.isfinite(tolerance)):
        raise SettingsError(f"--tolerance must be a non-negative number, got {tolerance}")
    old, new = Plan(old_path), Plan(new_path)
    m_old, m_new = metrics_by_stage(old), metrics_by_stage(new)
    fo, fn = old.fingerprints, new.fingerprints
    plan_o, plan_n = fo.get("plan", {}), fn.get("plan", {})
    epochs = sorted(set(old.epochs) | set(new.epochs))
    config = _config_changes(old, new)
    regressions = _regressions(m_old, m_new, epochs, tolerance)
    datasets = dataset_changes(old.manifest.recipe, new.manifest.recipe)
    changes = {
        "datasets": any(d["status"] != "unchanged" for d in datasets),
        "config": fo.get("config") != fn.get("config") or bool(config),
        "dataset": fo.get("dataset") != fn.get("dataset"),
        "metadata": fo.get("metadata") != fn.get("metadata"),
        "plan": plan_o != plan_n,
        "eval": fo.get("eval") != fn.get("eval"),
        "plancc": fo.get("plancc") != fn.get("plancc") or fo.get("schema") != fn.get("schema"),
        "metrics_regression": bool(regressions),
    }
    identical = not (changes["config"] or changes["dataset"] or changes["metadata"] or changes["plan"]
                     or changes["eval"])
    return {
        "old": str(old.path),
        "new": str(new.path),
        "identical": identical,
        "changes": changes,
        "config": config,
        "datasets": datasets,
        "fingerprints": _fingerprint_rows(fo, fn, epochs),
        "metrics": _metric_changes(m_old, m_new, epochs),
        "tolerance": tolerance,
        "regressions": regressions,
        "churn": _churn(old, new, epochs, show_ids, m_old),
        "eval": eval_changes(old, new),
    }


def _config_changes(old: Plan, new: Plan) -> list[dict[str, Any]]:
    """Each setting that differs (or is set in one plan only), by name, as the JSON report shows them."""
    so, sn = old.settings.to_dict(), new.settings.to_dict()
    return [
        {"setting": k, "old": so.get(k), "new": sn.get(k)}
        for k in sorted(set(so) | set(sn))
        if so.get(k) != sn.get(k) or (k in so) != (k in sn)
    ]


def _fingerprint_rows(fo: dict[str, Any], fn: dict[str, Any], epochs: list[int]) -> list[dict[str, Any]]:
    """Old and new fingerprint of every part, then of every epoch's plan, each marked changed or not."""
    rows = [
        {"name": name, "old": fo.get(name), "new": fn.get(name), "changed": fo.get(name) != fn.get(name)}
        for name in ("dataset", "metadata", "config", "plancc", "schema")
    ]
    plan_o, plan_n = fo.get("plan", {}), fn.get("plan", {})
    for e in epochs:
        a, b = plan_o.get(str(e)), plan_n.get(str(e))
        rows.append({"name": f"plan[{e}]", "old": a, "new": b, "changed": a != b})
    if "eval" in fo or "eval" in fn:
        rows.append({"name": "eval", "old": fo.get("eval"), "new": fn.get("eval"),
                     "changed": fo.get("eval") != fn.get("eval")})
    return rows


def _metric_changes(old: MetricsByStage, new: MetricsByStage, epochs: list[int]) -> list[dict[str, Any]]:
    """Per epoch and stage (of either plan): where it exists, and each metric that changed."""
    metrics = []
    for e in epochs:
        stages = list(dict.fromkeys(stage for by in (old, new) for epoch, stage in by if epoch == e))
        for stage in stages:
            mo, mn = old.get((e, stage)), new.get((e, stage))
            entry: dict[str, Any] = {"epoch": e, "stage": stage,
                                     "status": "both" if mo and mn else ("old_only" if mo else "new_only"),
                                     "changes": []}
            if mo and mn:
                for name in [c for c, _ in METRIC_COLUMNS] + ["padding_ratio"]:
                    a, b = mo.get(name), mn.get(name)
                    if _changed(a, b):
                        delta = (b - a) if a is not None and b is not None else None
                        entry["changes"].append({"metric": name, "old": _jsonable(a), "new": _jsonable(b),
                                                 "delta": _jsonable(delta)})
            metrics.append(entry)
    return metrics


def _regressions(old: MetricsByStage, new: MetricsByStage, epochs: list[int], tolerance: float
                 ) -> list[dict[str, Any]]:
    """The final-stage metrics that got worse by more than `tolerance` (relative, at least ABS_FLOOR)."""
    regressions = []
    for e in epochs:
        mo, mn = old.get((e, "after")), new.get((e, "after"))
        if not (mo and mn):
            continue
        for name, worse in REGRESSION_METRICS.items():
            a, b = mo.get(name), mn.get(name)
            if a is None or b is None:
                continue
            allowed = max(ABS_FLOOR, tolerance * abs(a))
            if (b - a) * worse > allowed:
                regressions.append({"epoch": e, "metric": name, "old": a, "new": b, "delta": b - a,
                                    "allowed": allowed})
    return regressions



def _churn(old: Plan, new: Plan, epochs: list[int], show_ids: int, old_metrics: MetricsByStage
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


MIX_KEYS = ("role", "repeat", "weight")


def _dataset_status(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str:
    if a is None or b is None:
        return "added" if a is None else "removed"
    if a["fingerprints"] != b["fingerprints"]:
        return "content_changed"
    if any(a.get(k) != b.get(k) for k in MIX_KEYS):
        return "reweighted"
    return "unchanged"


def dataset_changes(old: dict[str, Any] | None, new: dict[str, Any] | None) -> list[dict[str, Any]]:
    """A recipe's datasets old vs new, by name: added, removed, content_changed (its fingerprints), reweighted (its
    repeat, weight or role), or unchanged, with both sides' mix and fingerprints. Empty when neither is a recipe."""
    a = {d["name"]: d for d in (old or {}).get("datasets", [])}
    b = {d["name"]: d for d in (new or {}).get("datasets", [])}
    out = []
    for name in list(dict.fromkeys([*a, *b])):
        side = {k: ({m: d.get(m) for m in (*MIX_KEYS, "fingerprints", "retained")} if d else None)
                for k, d in (("old", a.get(name)), ("new", b.get(name)))}
        out.append({"name": name, "status": _dataset_status(a.get(name), b.get(name)), **side})
    return out


def failures(report: dict[str, Any], fail_on: list[str]) -> list[str]:
    """Reasons the diff fails under `fail_on` (empty: exit 0)."""
    ch = report["changes"]
    reasons = []
    for f in fail_on:
        if f == "any" and not report["identical"]:
            reasons.append("any: the plans differ")
        elif f == "config" and ch["config"]:
            names = ", ".join(c["setting"] for c in report["config"]) or "config fingerprint"
            reasons.append(f"config: settings changed ({names})")
        elif f == "dataset" and (ch["dataset"] or ch["metadata"] or ch.get("datasets")):
            named = [f"{d['name']} {d['status'].replace('_', ' ')}" for d in report.get("datasets", [])
                     if d["status"] != "unchanged"]
            reasons.append("dataset: " + (", ".join(named) if named else
                                          "the samples' content changed (dataset/metadata fingerprint)"))
        elif f == "metrics-regression" and ch["metrics_regression"]:
            names = ", ".join(f"{r['metric']} (epoch {r['epoch']})" for r in report["regressions"])
            reasons.append(f"metrics-regression: {names}")
    return reasons


def parse_fail_on(values: list[str] | None) -> list[str]:
    """Repeated and/or comma-separated `--fail-on` values, checked."""
    out: list[str] = []
    for v in values or []:
        for part in v.split(","):
            part = part.strip().lower()
            if not part:
                continue
            if part not in FAIL_ON:
                raise SettingsError(f"--fail-on must be one of {', '.join(FAIL_ON)}; got {part!r}")
            if part not in out:
                out.append(part)
    return out
