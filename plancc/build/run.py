"""Build a plan directory: load the samples (scan a source or reuse a scan; a recipe's datasets joined), settle the
settings once against any stored scan, plan every epoch, write it atomically.

`plancc.api.compile` resolves the settings (`plancc.config.resolve`) and calls `compile_plan`, the one place a
compile is orchestrated; tests and benchmarks reuse `write_plan_dir`.

Data flows one way: source -> samples table (scan) -> per-epoch plans (compile) -> Parquet (store).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from plancc.build.carry import Stored, settle
from plancc.build.recipe import epoch_metrics, join_recipe
from plancc.build.samples import Samples, open_stored, scan_source
from plancc.config.resolve import Resolved
from plancc.config.settings import PlanSettings
from plancc.core.faults import fault
from plancc.core.machine import available_memory
from plancc.core.plan_arrays import SampleArrays
from plancc.errors import InputError
from plancc.planner import budget, holdout
from plancc.planner.evaluation import EvalPlan, eval_columns
from plancc.planner.metrics import SourceDrops
from plancc.planner.pipeline import EpochPlan, Progress, compile_run, plan_columns
from plancc.store import outputs, parquet, plan_tables, schemas, spill, token_store, token_writer
from plancc.store.fingerprint import (
    before_checksum,
    config_fingerprint,
    eval_fingerprint,
    metrics_checksum,
    plan_fingerprint,
)
from plancc.store.manifest import DataPaths, EpochSummary, EvalSummary, Manifest
from plancc.store.samples import kind_counts, samples_fingerprints
from plancc.store.scan_record import ScanRecord
from plancc.version import __version__


def compile_plan(resolved: Resolved, out_dir: str | Path, *, cache_dir: Path | None = None,
                 progress: Progress | None = None, overwrite: bool = False) -> Manifest:
    """Load the samples of `resolved.source` (or of the recipe `resolved.datasets`), plan every epoch and write
    PLAN_DIR atomically; returns its manifest.

    The output is checked first (`outputs.check_output`): a refused `-o` costs no work and gets nothing written.
    A stored scan's sequence_len and shift become the plan's (`plancc.build.carry`), and the settings given on
    purpose (`resolved.given`) must not contradict them."""
    outputs.check_output(out_dir, overwrite=overwrite)
    budget.check_fits(None, resolved.plan, available_memory())  # what the settings alone ask for, before any work
    if resolved.datasets is None:
        resolved, samples = _one_source(resolved.source, resolved, cache_dir=cache_dir, progress=progress)
    else:
        resolved, samples = join_recipe(resolved, cache_dir=cache_dir, progress=progress)
    settings = resolved.plan
    s = parquet.sample_arrays(samples.table)
    per_row = 2 if s.kind == "preference" else 1  # the scan counts pairs; the metrics count samples
    drops = SourceDrops(per_row * samples.record.dropped_samples, per_row * samples.record.truncated_samples)
    eval_ids, shared = _eval_set(s, samples, settings)
    budget.check_fits(_trained_sizes(s, samples.index, settings, eval_ids), settings, available_memory(),
                      per_unit=2 if s.kind == "preference" else 1)
    samples = dataclasses.replace(samples, table=spill.spill_columns(samples.table, spill.WRITER_COLUMNS,
                                                                     spill.spill_directory(out_dir)))
    s = parquet.sample_arrays(samples.table)  # a view of the spilled table: the old one kept the old columns alive
    pa.default_memory_pool().release_unused()  # their buffers, freed now, back to the system
    run = compile_run(s, settings, progress=progress, drops=drops, eval_ids=eval_ids, index=samples.index)
    mixed = None if samples.datasets is None else {
        "datasets": samples.datasets, "metrics": epoch_metrics(run.epochs, samples, settings.shift)}
    fault("prepared")
    return write_plan_dir(out_dir, samples.table, run.train, settings, run.epochs, samples.record, samples.tokens,
                          progress, overwrite=overwrite, recipe=mixed, evaluation=run.evaluation,
                          notes=(shared,) if shared else ())


def _with_notes(record: ScanRecord, notes: tuple[str, ...]) -> ScanRecord:
    """The scan record a plan holds, with the plan's own warnings after the scan's (the manifest's warnings)."""
    return record.but(warnings=(*record.warnings, *notes)) if notes else record


def _eval_set(s: SampleArrays, samples: Samples, settings: PlanSettings) -> tuple[np.ndarray | None, str | None]:
    """The held-out sample ids (None: no eval plan), and the warning when some have a training sample's tokens
    (an eval dataset that copies training data is refused: `holdout.shared_content`)."""
    eval_ids = holdout.eval_sample_ids(s, settings, samples.index) if len(s) else None
    if eval_ids is None:
        return None, None
    return eval_ids, holdout.shared_content(parquet.column(samples.table, "token_hash"), s.sample_id, eval_ids,
                                            samples.index, settings.mixture)


def _trained_sizes(s: SampleArrays, index: np.ndarray | None, settings: PlanSettings,
                   eval_ids: np.ndarray | None) -> np.ndarray:
    """The units (samples, or pairs: what a mixture counts) each mixture entry trains on (for one source: all but
    the held-out ones)."""
    trained = ~np.isin(s.sample_id, eval_ids) if eval_ids is not None else np.ones(len(s), dtype=bool)
    if s.kind == "preference":
        trained &= s.chosen  # a pair counted once: by its chosen completion
    if index is None:
        return np.array([int(trained.sum())])
    return np.bincount(index[trained & (index >= 0)], minlength=len(settings.mixture))


def _one_source(source: str, resolved: Resolved, *, cache_dir: Path | None, progress: Progress | None
                ) -> tuple[Resolved, Samples]:
    """The samples of one source (read as stored, or scanned) and the settings settled by a stored scan."""
    stored = open_stored(source)
    if stored is None:
        return resolved, scan_source(source, resolved.scan, num_proc=resolved.run.num_proc, cache_dir=cache_dir,
                                     progress=progress)
    if schemas.DATASET_COLUMN in stored.table.column_names:
        raise InputError(f"{source} holds a recipe's samples (several datasets): compile the recipe again (its config "
                         "or sources), or list it as one dataset of a recipe")
    return settle(resolved, [Stored(None, f"the scan of {source}", stored, resolved.scan)]), stored


# scan record entries kept out of the plan: where this call found the source (`data` holds it), how long the scan
# took (a cold and a warm cache must give the same plan bytes), and the parts a merged scan was joined from (a
# local, a Ray and a sharded-then-merged scan of the same rows must give the same plan bytes)
NOT_PLANNED = ("source_paths", "seconds", "merged_from")


def data_paths(out_dir: str | Path, source_paths: tuple[str, ...], has_tokens: bool) -> DataPaths:
    """The manifest's `data`: whether the plan ships its token store (a relative folder, so the plan moves as
    one), and the source files, absolute and relative to the plan (a trainer may run from any folder, and a plan
    moved together with its data still finds it)."""
    plan_dir = os.path.realpath(out_dir)
    absolute = tuple(os.path.abspath(p) for p in source_paths)
    return DataPaths(has_tokens, absolute, tuple(os.path.relpath(p, plan_dir) for p in absolute))


def _epoch_tables(epochs: list[EpochPlan], s: SampleArrays, settings: PlanSettings
                  ) -> tuple[plan_tables.PlanRows, dict[str, str], list[dict[str, Any]], tuple[EpochSummary, ...]]:
    """The planned epochs as the plan table's rows (sorted by epoch, rank, index: one rank's epoch is a filtered
    read), each epoch's plan fingerprint, the metric rows and what the manifest says of each epoch."""
    columns, fingerprints, metric_rows, summaries = [], {}, [], []
    for p in epochs:
        cols = plan_columns(p, s, settings)
        fingerprints[str(p.epoch)] = plan_fingerprint(cols)
        columns.append(cols)
        metric_rows += [{"epoch": p.epoch, "stage": stage, **row} for stage, row in p.metrics]
        after = p.metrics[-1][1]
        summaries.append(EpochSummary(p.epoch, after["batches"], after["updates"], after["samples"],
                                      after["dropped_samples"]))
    return plan_tables.PlanRows(columns, schemas.plan_schema(s.kind)), fingerprints, metric_rows, tuple(summaries)


def _eval_table(evaluation: EvalPlan, settings: PlanSettings) -> tuple[pa.Table, EvalSummary, str]:
    """The eval plan as its table, what the manifest says of it, and its fingerprint."""
    cols = eval_columns(evaluation, settings)
    summary = EvalSummary.of(cols, settings.world_size, kind_counts(evaluation.samples))
    return plan_tables.eval_table(cols), summary, eval_fingerprint(cols)


def write_plan_dir(out_dir: str | Path, samples_table: pa.Table, s: SampleArrays, settings: PlanSettings,
                   epochs: list[EpochPlan], scan_record: ScanRecord, tokenized: Path | None,
                   progress: Progress | None = None, *, overwrite: bool = False,
                   recipe: dict[str, Any] | None = None, evaluation: EvalPlan | None = None,
                   notes: tuple[str, ...] = ()) -> Manifest:
    """Write PLAN_DIR atomically from planned epochs (over the training samples `s`) and the eval plan, if any:
    plan, samples (all of `samples_table`), metrics, before and eval tables, the manifest (and the token store,
    hard-linked); returns the manifest. `recipe`: a recipe's datasets and their metrics; `notes`: the plan's own
    warnings, after the scan's."""
    if progress:
        progress("writing plan", 0, 1)
    fingerprints: dict[str, Any] = {
        **samples_fingerprints(samples_table, scan_record.identity),
        "config": config_fingerprint(settings.to_dict()),
        "plancc": __version__,
        "schema": schemas.SCHEMA_VERSION,
    }
    if tokenized is not None:  # binds the token store: a reader compares its digest at open
        fingerprints["tokens"] = token_store.open_store(tokenized).digest
    rows, fingerprints["plan"], metric_rows, summaries = _epoch_tables(epochs, s, settings)
    eval_table, eval_summary = None, None
    if evaluation is not None:
        eval_table, eval_summary, fingerprints["eval"] = _eval_table(evaluation, settings)
    metrics = plan_tables.metrics_table(metric_rows, s.kind)  # preference data adds its pair (or label) metrics
    before = plan_tables.before_table([p.epoch for p in epochs], [p.before_labels for p in epochs])
    manifest = Manifest(
        plancc=__version__, schema=schemas.SCHEMA_VERSION, fingerprints=fingerprints, settings=settings,
        scan=_with_notes(scan_record.without(*NOT_PLANNED), notes),
        data=data_paths(out_dir, scan_record.source_paths, tokenized is not None),
        epochs=summaries, samples=samples_table.num_rows,
        checksums={"metrics": metrics_checksum(metrics.to_pylist()),
                   "before": before_checksum(parquet.column(before, "epoch"), parquet.column(before, "label_count"))},
        eval=eval_summary, recipe=recipe, data_kind=s.kind)
    with outputs.atomic_directory(out_dir, overwrite=overwrite) as tmp:
        plan_tables.write_plan_files(tmp, manifest, rows, samples_table, metrics, before, eval_table)
        if tokenized is not None:  # hard links when the cache shares the filesystem: no second copy of the tokens
            token_writer.link_store(tokenized, tmp / schemas.TOKENS_DIR)
            if token_store.open_store(tmp / schemas.TOKENS_DIR).digest != fingerprints["tokens"]:
                raise token_store.TokenStoreError(f"token store {tokenized} changed while the plan was written; "
                                                  "compile again")
    if progress:
        progress("writing plan", 1, 1)
    return manifest
