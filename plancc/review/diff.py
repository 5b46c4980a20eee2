"""Compare two plan directories the way a reviewer or a CI job wants: what changed, what it does to training, and
whether anything got worse beyond noise.

`diff_plans(old, new)` returns one JSON-able report (schema: `schemas/diff.schema.json`, documented in
docs/ci.md):

* config: every setting that differs, by its name, both values, its dataset (a recipe's own settings) and its
  kind: plan, data, masks or mix (`plancc.review.diff_settings`), with `notes` on what could not be compared;
* datasets: per dataset (a one-source plan is one), added, removed, content_changed (its source data changed),
  rederived (its samples changed but its source did not: a setting made them anew), reweighted or unchanged, and
  its rows added, removed and edited with example rows (`plancc.review.diff_rows`);
* training: what the change does to training, summed over each plan's epochs: samples, tokens, updates, label
  tokens and each dataset's share of them;
* fingerprints, metrics (every metric that changed, per epoch and stage), quality (the quality metrics that moved
  beyond noise), spread (the seed-to-seed spread they were judged by: `plancc.review.diff_noise`), regressions;
* churn (`plancc.review.diff_churn`) and eval (the eval plans' sizes and held-out samples).

`failures` applies the `--fail-on` policy to a report; `plancc.cli.diff_render` turns it into text or markdown.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from plancc.core import pairs
from plancc.core.metric_columns import KIND_METRIC_COLUMNS, METRIC_COLUMNS
from plancc.errors import SettingsError
from plancc.review import diff_noise, diff_rows
from plancc.review.diff_churn import MetricsByStage, churn, metrics_by_stage
from plancc.review.diff_rules import DEFAULT_TOLERANCE, FAIL_ON, QUALITY_METRICS, rows_summary
from plancc.review.diff_settings import DatasetSide, dataset_sides, setting_changes
from plancc.store import parquet, schemas
from plancc.store.parquet import column
from plancc.store.plan import Plan

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


# ---------------------------------------------------------------- datasets and their rows

PAIR_MIX = np.uint64(0x9E3779B97F4A7C15)  # an odd constant: (chosen, rejected) hashes -> one pair hash, order kept


def _status(a: DatasetSide | None, b: DatasetSide | None) -> str:
    if a is None or b is None:
        return "added" if a is None else "removed"
    if a.fingerprints.get("dataset") != b.fingerprints.get("dataset"):
        same_source = a.source_fingerprint is not None and a.source_fingerprint == b.source_fingerprint
        return "rederived" if same_source else "content_changed"
    return "reweighted" if a.mix != b.mix else "unchanged"


def _dataset_rows(samples: pa.Table, side: DatasetSide, recipe: bool) -> tuple[np.ndarray, np.ndarray]:
    """(dataset rows, content hashes) of one dataset's samples, in row order. A preference pair is one source row:
    its row is its pair id's (less the dataset's `first_pair`), its content both completions' hashes mixed."""
    if recipe and schemas.DATASET_COLUMN in samples.column_names:
        samples = samples.filter(pc.equal(samples.column(schemas.DATASET_COLUMN), side.name))
    hashes = column(samples, "token_hash")
    if schemas.PAIR_ID_COLUMN not in samples.column_names:
        return column(samples, "sample_id").astype(np.int64) - side.first_id, hashes
    pair_id = column(samples, schemas.PAIR_ID_COLUMN)
    members = pairs.pair_members(column(samples, "sample_id"), pair_id,
                                 pc.equal(samples.column(schemas.PAIR_ROLE_COLUMN), "chosen").to_numpy())
    chosen, rejected = hashes[members[:, 0]], hashes[members[:, 1]]
    return pairs.per_pair(pair_id, members) - side.first_pair, chosen * PAIR_MIX ^ rejected


def _names(side: DatasetSide) -> diff_rows.RowNames:
    return diff_rows.RowNames(side.files, side.source)


def datasets_report(old: Plan, new: Plan, sides: dict[str, tuple[DatasetSide | None, DatasetSide | None]],
                    rows_limit: int | None) -> list[dict[str, Any]]:
    """Each dataset's status, both sides and, where its samples changed, its rows added, removed and edited."""
    statuses = {name: _status(a, b) for name, (a, b) in sides.items()}
    changed = [n for n, s in statuses.items() if s in ("content_changed", "rederived")]
    samples = (old.files.read_samples(), new.files.read_samples()) if changed else None
    out = []
    for name, (a, b) in sides.items():
        entry = {"name": name, "status": statuses[name], "old": a.to_json() if a else None,
                 "new": b.to_json() if b else None, "rows": None}
        if name in changed:
            c = diff_rows.row_changes(*_dataset_rows(samples[0], a, bool(old.settings.mixture)),
                                      *_dataset_rows(samples[1], b, bool(new.settings.mixture)))
            entry["rows"] = diff_rows.changes_json(c, _names(a), _names(b), rows_limit)
        out.append(entry)
    return out


def paired_sides(old: Plan, new: Plan) -> dict[str, tuple[DatasetSide | None, DatasetSide | None]]:
    """Both plans' datasets by name, old order first (two one-source plans: their one dataset each, whatever the
    sources are called)."""
    a, b = dataset_sides(old), dataset_sides(new)
    if not (old.settings.mixture or new.settings.mixture):
        ((_, one_a),), ((name, one_b),) = a.items(), b.items()
        return {name: (one_a, one_b)}
    return {name: (a.get(name), b.get(name)) for name in dict.fromkeys([*a, *b])}


# ---------------------------------------------------------------- what it does to training


TOTALS = (("samples", "samples"), ("tokens", "total_tokens"), ("updates", "updates"),
          ("label_tokens", "total_label_count"))


def _totals(plan: Plan, metrics: MetricsByStage) -> dict[str, int]:
    rows = [metrics[(e, "after")] for e in plan.epochs if (e, "after") in metrics]
    return {key: sum(int(r.get(col) or 0) for r in rows) for key, col in TOTALS}


def _label_shares(plan: Plan) -> dict[str, float]:
    """Each recipe dataset's share of the label tokens the plan trains on, all epochs."""
    rows = [r for r in (plan.manifest.recipe or {}).get("metrics", []) if r.get("stage") == "after"]
    by: dict[str, int] = {}
    for r in rows:
        by[r["dataset"]] = by.get(r["dataset"], 0) + int(r.get("label_tokens") or 0)
    total = sum(by.values())
    return {k: v / total for k, v in by.items()} if total else {}


def training(old: Plan, new: Plan, m_old: MetricsByStage, m_new: MetricsByStage) -> dict[str, Any]:
    """Samples, tokens, updates and label tokens trained on, summed over each plan's epochs, and each dataset's
    share of the label tokens (a recipe's)."""
    to, tn = _totals(old, m_old), _totals(new, m_new)
    so, sn = _label_shares(old), _label_shares(new)
    out: dict[str, Any] = {"epochs": {"old": len(old.epochs), "new": len(new.epochs)}}
    out |= {key: {"old": to[key], "new": tn[key]} for key, _ in TOTALS}
    out["label_shares"] = [{"dataset": d, "old": so.get(d), "new": sn.get(d)} for d in dict.fromkeys([*so, *sn])]
    return out


# ---------------------------------------------------------------- metrics


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


KINDS = tuple(c for cols in KIND_METRIC_COLUMNS.values() for c in cols)  # preference plans' metrics


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
                for name in [c for c, _ in (*METRIC_COLUMNS, *KINDS)] + ["padding_ratio"]:
                    a, b = mo.get(name), mn.get(name)
                    if _changed(a, b):
                        delta = (b - a) if a is not None and b is not None else None
                        entry["changes"].append({"metric": name, "old": _jsonable(a), "new": _jsonable(b),
                                                 "delta": _jsonable(delta)})
            metrics.append(entry)
    return metrics


def _quality(m_old: MetricsByStage, m_new: MetricsByStage, epochs: list[int], tolerance: float,
             spread: diff_noise.Spread | None) -> list[dict[str, Any]]:
    """The after-stage quality metrics that moved beyond both limits (either way), per epoch."""
    out = []
    for e in epochs:
        a, b = m_old.get((e, "after")), m_new.get((e, "after"))
        for name in QUALITY_METRICS if a and b else ():
            x, y = a.get(name), b.get(name)
            if x is None or y is None or not (math.isfinite(x) and math.isfinite(y)):
                continue
            j = diff_noise.judged(name, x, y, tolerance, spread)
            if j["beyond"]:
                out.append({"epoch": e, "metric": name, "old": x, "new": y, "delta": y - x, "worse": j["worse"],
                            "allowed": j["allowed"]})
    return out


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


# ---------------------------------------------------------------- the report


def _changes(fo: dict[str, Any], fn: dict[str, Any], config: list[dict[str, Any]],
             datasets: list[dict[str, Any]], regressions: list[dict[str, Any]]) -> dict[str, bool]:
    return {
        "config": fo.get("config") != fn.get("config") or bool(config),
        "masks": any(c["kind"] == "masks" for c in config),
        "data": any(d["status"] in ("added", "removed", "content_changed") for d in datasets),
        "datasets": any(d["status"] != "unchanged" for d in datasets),
        "rows": any(d["rows"] is not None and (d["rows"]["added"] or d["rows"]["removed"] or d["rows"]["edited"])
                    for d in datasets),
        "dataset": fo.get("dataset") != fn.get("dataset"),
        "metadata": fo.get("metadata") != fn.get("metadata"),
        "plan": fo.get("plan", {}) != fn.get("plan", {}),
        "eval": fo.get("eval") != fn.get("eval"),
        "plancc": fo.get("plancc") != fn.get("plancc") or fo.get("schema") != fn.get("schema"),
        "metrics_regression": bool(regressions),
    }


def diff_plans(old_path: str | Path, new_path: str | Path, *, tolerance: float = DEFAULT_TOLERANCE,
               show_ids: int = 8, rows: bool = False) -> dict[str, Any]:
    """The full comparison of two plan directories (see module docstring); `rows`: name every changed row, not
    only the first `diff_rows.EXAMPLES` of each kind.

    Raises `schemas.StoreError` for an input that is not a readable plan, `SettingsError` for a bad tolerance."""
    if not (tolerance >= 0 and math.isfinite(tolerance)):
        raise SettingsError(f"--tolerance must be a non-negative number, got {tolerance}")
    old, new = Plan(old_path), Plan(new_path)
    m_old, m_new = metrics_by_stage(old), metrics_by_stage(new)
    fo, fn = old.fingerprints, new.fingerprints
    epochs = sorted(set(old.epochs) | set(new.epochs))
    sides = paired_sides(old, new)
    config, notes = setting_changes(old, new, sides)
    datasets = datasets_report(old, new, sides, None if rows else diff_rows.EXAMPLES)
    spread = diff_noise.measure(old, new, m_old, m_new) \
        if diff_noise.candidates(m_old, m_new, epochs, tolerance) else None
    regressions = diff_noise.regressions(m_old, m_new, epochs, tolerance, spread)
    changes = _changes(fo, fn, config, datasets, regressions)
    identical = not (changes["config"] or changes["dataset"] or changes["metadata"] or changes["plan"]
                     or changes["eval"])
    return {
        "old": str(old.path), "new": str(new.path), "identical": identical, "changes": changes,
        "config": config, "notes": notes, "datasets": datasets, "training": training(old, new, m_old, m_new),
        "fingerprints": _fingerprint_rows(fo, fn, epochs),
        "metrics": _metric_changes(m_old, m_new, epochs),
        "quality": _quality(m_old, m_new, epochs, tolerance, spread),
        "tolerance": tolerance, "spread": spread.to_json() if spread else None, "regressions": regressions,
        "churn": churn(old, new, epochs, show_ids, m_old),
        "eval": eval_changes(old, new),
    }


# ---------------------------------------------------------------- --fail-on


def _data_reasons(report: dict[str, Any]) -> list[str]:
    out = []
    for d in report["datasets"]:
        if d["status"] in ("added", "removed"):
            out.append(f"{d['name']} {d['status']}")
        elif d["status"] == "content_changed":
            out.append(f"{d['name']}: " + (rows_summary(d["rows"], noun=True) if d["rows"] else "content changed"))
    return out


def failures(report: dict[str, Any], fail_on: list[str]) -> list[str]:
    """Reasons the diff fails under `fail_on` (empty: exit 0)."""
    ch = report["changes"]
    config = report["config"]

    def named(kinds: tuple[str, ...]) -> str:
        return ", ".join(f"{c['dataset'] + ': ' if c['dataset'] else ''}{c['setting']}" for c in config
                         if c["kind"] in kinds)

    reasons = []
    for f in fail_on:
        if f == "any" and not report["identical"]:
            reasons.append("any: the plans differ")
        elif f == "config" and ch["config"]:
            reasons.append(f"config: settings changed ({named(('plan', 'data', 'masks', 'mix')) or 'config fingerprint'})")
        elif f == "dataset" and ch["data"]:
            reasons.append("dataset: " + "; ".join(_data_reasons(report)))
        elif f == "masks" and ch["masks"]:
            reasons.append(f"masks: what is trained changed ({named(('masks',))})")
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
