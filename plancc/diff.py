"""Compare two plan directories the way a reviewer or a CI job wants: what changed, why, and how much it moved.

`diff_plans(old, new)` returns one JSON-able report (schema: `schemas/diff.schema.json`):

* config: every plan setting whose value differs, setting by setting;
* fingerprints: dataset, metadata, config, plancc version and the plan digest of every epoch, old vs new;
* metrics: per (epoch, stage) the metrics whose value changed, with the delta;
* regressions: after-stage metrics that got worse beyond the tolerance (the rule: `plancc.diff_rules`);
* churn: per epoch, the share of common samples whose update / rank changed, the share of microbatches that are
  identical (same sample ids in the same rows, at the same global index) and the first differing microbatch.

Churn is a columnar compare, never a loop over samples: each plan's `sample_ids` column becomes flat CSR arrays
(`store.nested_arrays`), each sample's (update, rank) key is scattered into a dense id-indexed array (or
matched by sort when ids are sparse), and microbatches of equal shape are compared element-wise through one
gather. Epochs whose plan fingerprints are equal are not read at all: equal digests mean equal rows.

`render_text` and `render_markdown` turn the report into a terminal summary and a compact CI comment.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from plancc import store
from plancc.diff_rules import ABS_FLOOR, DEFAULT_TOLERANCE, FAIL_ON, REGRESSION_METRICS
from plancc.metrics import METRIC_COLUMNS

# metrics shown in the compact summaries (all changed metrics are in the JSON report)
SUMMARY_METRICS = ("batches", "updates", "label_cv", "update_label_cv", "packing_efficiency", "padding_ratio",
                   "max_naive_weight_skew")


MAX_DETAIL_ROWS = 200  # keeps the CI comment far below GitHub's 65,536-character limit


class PlanDirError(store.StoreError):
    """A diff input is not a plan directory written by plancc."""


# ---------------------------------------------------------------- loading


class PlanInfo:
    """The read-side view of one plan directory: its fingerprints, settings and metrics (plan rows on demand)."""

    def __init__(self, path: str | Path):
        p = Path(path)
        if p.is_file() and p.name == store.PLAN_FILE:
            p = p.parent
        if not p.exists():
            raise PlanDirError(f"{path} does not exist")
        if not p.is_dir():
            raise PlanDirError(f"{path} is not a plan directory (expected a directory holding {store.PLAN_FILE})")
        if not (p / store.PLAN_FILE).exists():
            raise PlanDirError(f"{path} is not a plan directory (no {store.PLAN_FILE}); write one with "
                               "`plancc compile SOURCE -o PLAN_DIR`")
        self.path = p
        meta = store.read_file_meta(p / store.PLAN_FILE)
        if meta.get("kind") != "plan":
            raise PlanDirError(f"{p / store.PLAN_FILE} is a plancc '{meta.get('kind')}' file, not a plan")
        self.fingerprints: dict[str, Any] = meta["fingerprints"]
        self.settings: dict[str, Any] = meta["settings"]
        metrics = store.read_table(p / store.METRICS_FILE, store.metrics_schema()).to_pylist()
        self.metrics: dict[tuple[int, str], dict[str, Any]] = {}
        self.stages: dict[int, list[str]] = {}
        for row in metrics:
            e, stage = int(row.pop("epoch")), row.pop("stage")
            row["padding_ratio"] = padding_ratio(row)
            self.metrics[(e, stage)] = row
            self.stages.setdefault(e, []).append(stage)

    @property
    def epochs(self) -> list[int]:
        return sorted(int(e) for e in self.fingerprints.get("plan", {}))

    def read_rows(self) -> pa.Table:
        """Columns churn needs, in file order (sorted by epoch, rank, index)."""
        return store.read_table(self.path / store.PLAN_FILE, store.PLAN_SCHEMA,
                                columns=["epoch", "index", "update", "rank", "sample_ids"])


def padding_ratio(row: dict[str, Any]) -> float | None:
    cost, pad = row.get("total_batch_cost"), row.get("padding_tokens")
    if cost is None or pad is None:
        return None
    return pad / cost if cost else 0.0


# ---------------------------------------------------------------- churn (columnar)


class EpochRows:
    """One epoch of one plan as flat arrays, addressable by global microbatch index."""

    def __init__(self, table: pa.Table):
        ids, row_bounds, batch_bounds = store.nested_arrays(table.column("sample_ids"))
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


def _identical_churn(info: PlanInfo, epoch: int) -> dict[str, Any]:
    after = info.metrics.get((epoch, "after"), {})
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


def _load_rows(info: PlanInfo, epochs: list[int]) -> dict[int, EpochRows]:
    slices = _epoch_slices(info.read_rows())
    return {e: EpochRows(slices[e]) for e in epochs if e in slices}


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
    """The full comparison of two plan directories (see module docstring); raises StoreError on bad input."""
    if not (tolerance >= 0 and math.isfinite(tolerance)):
        raise store.StoreError(f"--tolerance must be a non-negative number, got {tolerance}")
    old, new = PlanInfo(old_path), PlanInfo(new_path)
    fo, fn = old.fingerprints, new.fingerprints

    config = [
        {"setting": k, "old": old.settings.get(k), "new": new.settings.get(k)}
        for k in sorted(set(old.settings) | set(new.settings))
        if old.settings.get(k) != new.settings.get(k) or (k in old.settings) != (k in new.settings)
    ]
    fingerprints = [
        {"name": name, "old": fo.get(name), "new": fn.get(name), "changed": fo.get(name) != fn.get(name)}
        for name in ("dataset", "metadata", "config", "plancc", "schema")
    ]
    plan_o, plan_n = fo.get("plan", {}), fn.get("plan", {})
    epochs = sorted({int(e) for e in plan_o} | {int(e) for e in plan_n})
    for e in epochs:
        a, b = plan_o.get(str(e)), plan_n.get(str(e))
        fingerprints.append({"name": f"plan[{e}]", "old": a, "new": b, "changed": a != b})

    metrics = []
    for e in epochs:
        stages = list(dict.fromkeys(old.stages.get(e, []) + new.stages.get(e, [])))
        for stage in stages:
            mo, mn = old.metrics.get((e, stage)), new.metrics.get((e, stage))
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

    regressions = []
    for e in epochs:
        mo, mn = old.metrics.get((e, "after")), new.metrics.get((e, "after"))
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
                raise store.StoreError(f"epoch {e} is listed in the fingerprints but has no rows in "
                                       f"{(old if e not in old_rows else new).path / store.PLAN_FILE}")
            c = epoch_churn(old_rows[e], new_rows[e], show_ids=show_ids)
        else:
            c = _identical_churn(old, e)
        churn.append({"epoch": e, "status": "compared", **c})

    changes = {
        "config": fo.get("config") != fn.get("config") or bool(config),
        "dataset": fo.get("dataset") != fn.get("dataset"),
        "metadata": fo.get("metadata") != fn.get("metadata"),
        "plan": plan_o != plan_n,
        "plancc": fo.get("plancc") != fn.get("plancc") or fo.get("schema") != fn.get("schema"),
        "metrics_regression": bool(regressions),
    }
    identical = not (changes["config"] or changes["dataset"] or changes["metadata"] or changes["plan"])
    return {
        "old": str(old.path),
        "new": str(new.path),
        "identical": identical,
        "changes": changes,
        "config": config,
        "fingerprints": fingerprints,
        "metrics": metrics,
        "tolerance": tolerance,
        "regressions": regressions,
        "churn": churn,
    }


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
        elif f == "dataset" and (ch["dataset"] or ch["metadata"]):
            reasons.append("dataset: the samples' content changed (dataset/metadata fingerprint)")
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
                raise store.StoreError(f"--fail-on must be one of {', '.join(FAIL_ON)}; got {part!r}")
            if part not in out:
                out.append(part)
    return out


# ---------------------------------------------------------------- rendering


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.0f}"
    return str(v)


def _fmt_delta(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:+.4g}"
    return f"{v:+d}" if isinstance(v, int) else str(v)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _short(fp: Any) -> str:
    return str(fp)[:12] if isinstance(fp, str) and len(fp) > 12 else _fmt(fp)


def summary_line(report: dict[str, Any]) -> str:
    if report["identical"]:
        return "plans are identical (dataset, metadata, config and every epoch's plan fingerprint match)"
    ch = report["changes"]
    what = [k for k in ("config", "dataset", "metadata", "plan") if ch[k]]
    line = f"plans differ: {', '.join(what)} changed"
    if ch["config"] and report["config"]:
        line += " (settings: " + ", ".join(c["setting"] for c in report["config"]) + ")"
    if report["regressions"]:
        line += f"; {len(report['regressions'])} metric regression(s)"
    return line


def _after_rows(report: dict[str, Any]) -> list[tuple[int, str, Any, Any]]:
    """(epoch, metric, old, new) of the summary metrics at the after stage, changed or not (from the report)."""
    out = []
    for entry in report["metrics"]:
        if entry["stage"] != "after" or entry["status"] != "both":
            continue
        for c in entry["changes"]:
            if c["metric"] in SUMMARY_METRICS:
                out.append((entry["epoch"], c["metric"], c["old"], c["new"]))
    order = {m: i for i, m in enumerate(SUMMARY_METRICS)}
    return sorted(out, key=lambda r: (r[0], order[r[1]]))


def render_text(report: dict[str, Any], failed: list[str] | None = None) -> str:
    lines = [f"old: {report['old']}", f"new: {report['new']}", summary_line(report)]
    if report["config"]:
        lines.append("config changes:")
        lines += [f"  {c['setting']}: {_fmt(c['old'])} -> {_fmt(c['new'])}" for c in report["config"]]
    changed_fp = [f for f in report["fingerprints"] if f["changed"]]
    if changed_fp:
        lines.append("fingerprint changes:")
        lines += [f"  {f['name']}: {_short(f['old'])} -> {_short(f['new'])}" for f in changed_fp]
    metric_lines = []
    for entry in report["metrics"]:
        if entry["status"] != "both":
            metric_lines.append(f"  epoch {entry['epoch']} {entry['stage']}: only in {entry['status'][:3]}")
            continue
        for c in entry["changes"]:
            metric_lines.append(f"  epoch {entry['epoch']} {entry['stage']:<8} {c['metric']:<28} "
                                f"{_fmt(c['old']):>12} -> {_fmt(c['new']):<12} ({_fmt_delta(c['delta'])})")
    if metric_lines:
        lines.append("metric deltas (epoch, stage, metric, old -> new):")
        lines += metric_lines
    if report["regressions"]:
        lines.append(f"metric regressions (tolerance {report['tolerance']}):")
        lines += [f"  epoch {r['epoch']} {r['metric']}: {_fmt(r['old'])} -> {_fmt(r['new'])} "
                  f"(worse by {abs(r['delta']):.4g}, allowed {r['allowed']:.4g})" for r in report["regressions"]]
    churn_lines = []
    for c in report["churn"]:
        if c["status"] != "compared":
            churn_lines.append(f"  epoch {c['epoch']}: only in {c['status'][:3]} plan")
            continue
        if c["first_differing_microbatch"] is None:
            continue
        line = (f"  epoch {c['epoch']}: update changed {_pct(c['update_changed_share'])}, rank changed "
                f"{_pct(c['rank_changed_share'])} of {c['common_samples']} common samples; microbatches identical "
                f"{c['identical_microbatches']}/{max(c['microbatches_old'], c['microbatches_new'])} "
                f"({_pct(c['identical_microbatch_share'])}); first differing microbatch "
                f"{c['first_differing_microbatch']}")
        if c["added_samples"] or c["removed_samples"]:
            line += f"; samples +{c['added_samples']} -{c['removed_samples']}"
        churn_lines.append(line)
        fd = c["first_difference"]
        for side in ("old", "new"):
            d = fd[side] if fd else None
            churn_lines.append(f"    {side}: " + ("(none)" if d is None else
                               f"update {d['update']} rank {d['rank']}, {d['samples']} samples, ids "
                               f"{_ids(d['sample_ids'], d['samples'])}"))
    if churn_lines:
        lines.append("membership churn:")
        lines += churn_lines
    if failed:
        lines.append("FAILED: " + "; ".join(failed))
    return "\n".join(lines) + "\n"


def _ids(rows: list[list[int]], total: int) -> str:
    shown = sum(len(r) for r in rows)
    text = " | ".join(",".join(str(i) for i in r) for r in rows)
    return f"[{text}{' ...' if shown < total else ''}]"


def render_markdown(report: dict[str, Any], failed: list[str] | None = None) -> str:
    """A compact CI comment: one verdict line, one table of what moved, the rest folded. No paths, no times."""
    out = ["### plancc plan diff", ""]
    icon = "✅" if report["identical"] else ("❌" if failed else "⚠️")
    out.append(f"{icon} {summary_line(report)}")
    if failed:
        out.append("")
        out.append("**Failing:** " + "; ".join(failed))
    if report["identical"]:
        return "\n".join(out) + "\n"
    out.append("")
    rows: list[tuple[str, str, str, str]] = []
    for c in report["config"]:
        rows.append(("setting", f"`{c['setting']}`", _fmt(c["old"]), _fmt(c["new"])))
    for f in report["fingerprints"]:
        if f["changed"] and f["name"] in ("dataset", "metadata", "plancc", "schema"):
            rows.append(("fingerprint", f["name"], f"`{_short(f['old'])}`", f"`{_short(f['new'])}`"))
    plan_changed = [f for f in report["fingerprints"] if f["changed"] and f["name"].startswith("plan[")]
    if plan_changed:
        rows.append(("fingerprint", "plan", f"{len(plan_changed)} epoch(s) changed", ""))
    for e, metric, a, b in _after_rows(report):
        delta = (b - a) if a is not None and b is not None else None
        rows.append((f"epoch {e}", metric, _fmt(a), f"{_fmt(b)} ({_fmt_delta(delta)})"))
    for c in report["churn"]:
        if c["status"] != "compared":
            rows.append((f"epoch {c['epoch']}", "epoch", "present" if c["status"] == "old_only" else "absent",
                         "present" if c["status"] == "new_only" else "absent"))
        elif c["first_differing_microbatch"] is not None:
            rows.append((f"epoch {c['epoch']}", "churn", "",
                         f"update {_pct(c['update_changed_share'])}, rank {_pct(c['rank_changed_share'])}, "
                         f"identical microbatches {_pct(c['identical_microbatch_share'])}, first diff "
                         f"#{c['first_differing_microbatch']}"))
    if rows:
        out.append("| where | what | old | new |")
        out.append("|---|---|---|---|")
        out += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    if report["regressions"]:
        out.append("")
        out.append(f"**Regressions** (tolerance {report['tolerance']}): " + ", ".join(
            f"{r['metric']} epoch {r['epoch']} {_fmt(r['old'])} → {_fmt(r['new'])}" for r in report["regressions"]))
    detail = []
    for entry in report["metrics"]:
        if entry["status"] == "both" and entry["changes"]:
            detail += [f"| {entry['epoch']} | {entry['stage']} | {c['metric']} | {_fmt(c['old'])} | {_fmt(c['new'])} "
                       f"| {_fmt_delta(c['delta'])} |" for c in entry["changes"]]
    if detail:
        more = len(detail) - MAX_DETAIL_ROWS
        summary = "All metric deltas" if more <= 0 else f"Metric deltas (first {MAX_DETAIL_ROWS} of {len(detail)})"
        out += ["", f"<details><summary>{summary}</summary>", "",
                "| epoch | stage | metric | old | new | Δ |", "|---|---|---|---|---|---|", *detail[:MAX_DETAIL_ROWS]]
        if more > 0:
            out.append(f"\n{more} more in `plancc diff --format json`")
        out += ["", "</details>"]
    return "\n".join(out) + "\n"
