"""Re-check a plan on disk against its own samples table: every invariant and fingerprint of SPEC 4-6.

Nothing is trusted from the writer: coverage, capacity, the update/rank/micro-step mapping, per-microbatch
tokens, targets, cost and per-update totals are recomputed from the samples table and compared, and the
fingerprints are recomputed from content. The result is a list of violations (empty when the plan is sound).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from plancc import store
from plancc.api import plan_fingerprint, sample_arrays
from plancc.config import PlanSettings
from plancc.fingerprint import config_fingerprint, samples_fingerprints, scan_identity
from plancc.plan import (
    Batches,
    batch_cost,
    batch_targets,
    batch_tokens,
    complete_updates,
    row_tokens,
    segment_sum,
    update_mapping,
)


def nested_arrays(sample_ids: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(flat sample ids, row bounds, batch bounds) of a `list<list<int64>>` column, without a Python loop."""
    batches = sample_ids.combine_chunks() if isinstance(sample_ids, pa.ChunkedArray) else sample_ids
    rows = batches.flatten()
    batch_bounds = np.asarray(batches.offsets, dtype=np.int64) - batches.offsets[0].as_py()
    row_bounds = np.asarray(rows.offsets, dtype=np.int64) - rows.offsets[0].as_py()
    return rows.flatten().to_numpy().astype(np.int64), row_bounds, batch_bounds


def _mismatch(name: str, epoch: int, got: np.ndarray, want: np.ndarray) -> str | None:
    bad = np.flatnonzero(got != want)
    if bad.size == 0:
        return None
    i = int(bad[0])
    return f"epoch {epoch}: {name} differs at microbatch {i} (plan {got[i]}, recomputed {want[i]}); {bad.size} in all"


def check_epoch(epoch: int, table: pa.Table, s, settings: PlanSettings, recorded_fp: str | None,
                dropped_metric: int | None) -> list[str]:
    problems: list[str] = []
    ids, row_bounds, batch_bounds = nested_arrays(table.column("sample_ids"))
    pos = np.searchsorted(s.sample_id, ids)
    pos = np.minimum(pos, len(s) - 1)
    unknown = s.sample_id[pos] != ids
    if unknown.any():
        return [f"epoch {epoch}: {int(unknown.sum())} sample ids are not in the samples table "
                f"(first: {int(ids[np.flatnonzero(unknown)[0]])})"]
    b = Batches(pos, row_bounds, batch_bounds)
    n = b.num_batches

    counts = np.bincount(pos, minlength=len(s))
    if (counts > 1).any():
        problems.append(f"epoch {epoch}: {int((counts > 1).sum())} samples appear more than once "
                        f"(first: sample_id {int(s.sample_id[np.flatnonzero(counts > 1)[0]])})")
    missing = int((counts == 0).sum())
    if missing and not settings.drop_last:
        problems.append(f"epoch {epoch}: {missing} retained samples are missing "
                        f"(first: sample_id {int(s.sample_id[np.flatnonzero(counts == 0)[0]])})")
    if settings.drop_last and dropped_metric is not None and missing != dropped_metric:
        problems.append(f"epoch {epoch}: {missing} samples missing but the metrics report {dropped_metric} "
                        "dropped by --drop-last")
    if settings.drop_last and n % settings.batches_per_update:
        problems.append(f"epoch {epoch}: --drop-last plan ends with an incomplete update")

    over = np.flatnonzero(row_tokens(b, s) > settings.row_capacity)
    if over.size:
        problems.append(f"epoch {epoch}: {over.size} rows exceed capacity {settings.row_capacity} (first: row {over[0]})")
    if settings.mode == "packed":
        too_many = np.flatnonzero(b.rows_per_batch() > (settings.micro_batch_size if settings.real_batches else 1))
        if too_many.size:
            problems.append(f"epoch {epoch}: microbatch {too_many[0]} has too many rows")
    else:
        per_batch = segment_sum(b.samples_per_row(), b.batch_bounds)
        wrong = np.flatnonzero(per_batch[:-1] != settings.micro_batch_size) if n else np.array([])
        if wrong.size or (n and per_batch[-1] > settings.micro_batch_size):
            problems.append(f"epoch {epoch}: microbatches do not hold exactly {settings.micro_batch_size} samples")

    update, rank, micro_step = update_mapping(n, settings.world_size, settings.grad_accum)
    labels = batch_targets(b, s, settings.shift)
    bounds = np.append(np.arange(0, n, settings.batches_per_update, dtype=np.int64), n)
    expect = {
        "index": np.arange(n),
        "update": update,
        "rank": rank,
        "micro_step": micro_step,
        "tokens": batch_tokens(b, s),
        "label_count": labels,
        "cost": batch_cost(b, s, settings.pad_multiple),
        "num_items": np.repeat(segment_sum(labels, bounds), np.diff(bounds)),
        "complete_update": update < complete_updates(n, settings.world_size, settings.grad_accum),
    }
    for name, want in expect.items():
        msg = _mismatch(name, epoch, table.column(name).to_numpy(zero_copy_only=False), want)
        if msg:
            problems.append(msg)
    if not problems and recorded_fp is not None:
        cols = {name: table.column(name).to_numpy(zero_copy_only=False) for name in expect}
        cols.update(sample_ids=ids, row_bounds=row_bounds, batch_bounds=batch_bounds)
        if plan_fingerprint(cols) != recorded_fp:
            problems.append(f"epoch {epoch}: plan fingerprint does not match its rows")
    return problems


def validate_plan(plan_dir: str, dataset_fingerprint: str | None = None) -> tuple[list[str], dict[str, Any]]:
    """(violations, summary) for PLAN_DIR; `dataset_fingerprint` is the rescanned source's, when given."""
    manifest = store.read_manifest(plan_dir)
    problems: list[str] = []
    fps = manifest["fingerprints"]
    for name in (store.PLAN_FILE, store.SAMPLES_FILE, store.METRICS_FILE):
        meta = store.read_file_meta(f"{plan_dir}/{name}")
        if meta["fingerprints"] != fps:
            problems.append(f"{name}: fingerprints in its metadata differ from {store.MANIFEST_FILE}")
    settings = PlanSettings(**manifest["settings"])
    if config_fingerprint(settings.to_dict()) != fps["config"]:
        problems.append("config fingerprint does not match the recorded settings")
    samples_table = store.read_samples(f"{plan_dir}/{store.SAMPLES_FILE}")
    for key, value in samples_fingerprints(samples_table, scan_identity(manifest.get("scan") or {})).items():
        if value != fps[key]:
            problems.append(f"{key} fingerprint does not match samples.parquet")
    if dataset_fingerprint is not None and dataset_fingerprint != fps["dataset"]:
        problems.append(f"dataset fingerprint {dataset_fingerprint} of the given source differs from the plan's "
                        f"{fps['dataset']}: the data changed since compile")
    s = sample_arrays(samples_table)
    if (np.diff(s.sample_id) <= 0).any():
        problems.append("samples.parquet is not sorted by unique sample_id")
        return problems, manifest
    metrics = store.read_table(f"{plan_dir}/{store.METRICS_FILE}", store.metrics_schema()).to_pylist()
    dropped = {m["epoch"]: m["tail_dropped_samples"] for m in metrics if m["stage"] == "after"}
    plan = store.read_plan(plan_dir)
    epochs = plan.column("epoch").to_numpy()
    for e in range(settings.epochs):
        lo, hi = np.searchsorted(epochs, [e, e + 1])
        problems += check_epoch(e, plan.slice(lo, hi - lo), s, settings, fps["plan"].get(str(e)), dropped.get(e))
    extra = set(np.unique(epochs).tolist()) - set(range(settings.epochs))
    if extra:
        problems.append(f"plan holds epochs {sorted(extra)} beyond --epochs {settings.epochs}")
    return problems, manifest
