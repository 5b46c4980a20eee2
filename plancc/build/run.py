"""Build a plan directory: load the samples (scan a source or reuse a scan), plan every epoch, write it atomically.

The public API (`plancc.api`) and the CLI call `compile_to_dir`; tests and benchmarks reuse `write_plan_dir`.

Data flows one way: source -> samples table (scan) -> per-epoch plans (compile) -> Parquet (store).
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from plancc.build.carry import carry
from plancc.build.samples import load_samples
from plancc.config.recipe import DatasetSpec
from plancc.config.settings import PlanSettings, ScanOptions
from plancc.core.faults import fault
from plancc.core.plan_arrays import SampleArrays
from plancc.errors import InputError
from plancc.planner.evaluation import EvalPlan, eval_columns
from plancc.planner.metrics import SourceDrops
from plancc.planner.pipeline import EpochPlan, Progress, compile_run, plan_columns
from plancc.store import outputs, parquet, plan_tables, schemas, token_store, token_writer
from plancc.store.fingerprint import (
    before_checksum,
    config_fingerprint,
    eval_fingerprint,
    metrics_checksum,
    plan_fingerprint,
)
from plancc.store.manifest import DataPaths, EpochSummary, EvalSummary, Manifest
from plancc.store.samples import samples_fingerprints
from plancc.store.scan_record import ScanRecord
from plancc.version import __version__


def compile_to_dir(source: str, scan_options: ScanOptions, settings: PlanSettings, out_dir: str | Path, *,
                   num_proc: int = 1, cache_dir: Path | None = None, progress: Progress | None = None,
                   given: Collection[str] = (), overwrite: bool = False) -> Manifest:
    """Scan (or reuse) `source`, plan every epoch and write PLAN_DIR atomically; returns its manifest.

    The output is checked first (`outputs.check_output`): a refused `-o` costs no work and gets nothing written.
    The scan's sequence_len and shift become the plan's (`plancc.build.carry`); for a scan or plan directory as `source`
    that is what it was made with, and `given` (the settings the caller set on purpose) must not contradict it."""
    outputs.check_output(out_dir, overwrite=overwrite)
    samples_table, scan_record, tokenized = load_samples(
        source, scan_options, num_proc=num_proc, cache_dir=cache_dir, progress=progress
    )
    if schemas.DATASET_COLUMN in samples_table.column_names:
        raise InputError(f"{source} holds a recipe's samples (several datasets): compile the recipe again (its config "
                         "or sources), or list it as one dataset of a recipe")
    settings = carry(scan_record, scan_options, settings, given, f"the scan of {source}")
    s = parquet.sample_arrays(samples_table)
    drops = SourceDrops(scan_record.dropped_samples, scan_record.truncated_samples)
    run = compile_run(s, settings, progress=progress, drops=drops)
    fault("prepared")
    return write_plan_dir(out_dir, samples_table, run.train, settings, run.epochs, scan_record, tokenized, progress,
                          overwrite=overwrite, evaluation=run.evaluation)


def compile_recipe(specs: tuple[DatasetSpec, ...], scan_options: ScanOptions, settings: PlanSettings,
                   out_dir: str | Path, *, num_proc: int = 1, cache_dir: Path | None = None,
                   progress: Progress | None = None, given: Collection[str] = (), overwrite: bool = False
                   ) -> Manifest:
    """`compile_to_dir` for a recipe: each dataset scanned (or reused) on its own, joined into one samples table and
    token store (`plancc.build.recipe`), planned as the recipe's mixture; returns the manifest."""
    from plancc.build import recipe as recipe_data

    outputs.check_output(out_dir, overwrite=overwrite)
    joined = recipe_data.load(specs, scan_options, settings, given, num_proc=num_proc, cache_dir=cache_dir,
                              progress=progress)
    settings = joined.settings
    s = parquet.sample_arrays(joined.table)
    drops = SourceDrops(joined.record.dropped_samples, joined.record.truncated_samples)
    run = compile_run(s, settings, progress=progress, drops=drops, index=joined.index)
    recipe = {"datasets": joined.datasets, "metrics": recipe_data.epoch_metrics(run.epochs, joined, settings.shift)}
    return write_plan_dir(out_dir, joined.table, run.train, settings, run.epochs, joined.record, joined.tokens,
                          progress, overwrite=overwrite, recipe=recipe, evaluation=run.evaluation)


# scan record entries kept out of the plan: where this call found the source (`data` holds it), and how long the scan
# took (a cold and a warm cache must give the same plan bytes)
NOT_PLANNED = ("source_paths", "seconds")


def data_paths(out_dir: str | Path, source_paths: tuple[str, ...], has_tokens: bool) -> DataPaths:
    """The manifest's `data`: whether the plan ships its token store (a relative folder, so the plan moves as
    one), and the source files, absolute and relative to the plan (a trainer may run from any folder, and a plan
    moved together with its data still finds it)."""
    plan_dir = os.path.realpath(out_dir)
    absolute = tuple(os.path.abspath(p) for p in source_paths)
    return DataPaths(has_tokens, absolute, tuple(os.path.relpath(p, plan_dir) for p in absolute))


def write_plan_dir(out_dir: str | Path, samples_table: pa.Table, s: SampleArrays, settings: PlanSettings,
                   epochs: list[EpochPlan], scan_record: ScanRecord, tokenized: Path | None,
                   progress: Progress | None = None, *, overwrite: bool = False,
                   recipe: dict[str, Any] | None = None, evaluation: EvalPlan | None = None) -> Manifest:
    """Write PLAN_DIR atomically from planned epochs (over the training samples `s`) and the eval plan, if any:
    plan, samples (all of `samples_table`), metrics, before and eval tables, the manifest (and the token store,
    hard-linked); returns the manifest. `recipe`: a recipe's datasets and their metrics."""
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
    tables, plan_fps, metric_rows, summaries = [], {}, [], []
    for p in epochs:
        cols = plan_columns(p, s, settings)
        plan_fps[str(p.epoch)] = plan_fingerprint(cols)
        tables.append(plan_tables.plan_table(cols))
        metric_rows += [{"epoch": p.epoch, "stage": stage, **row} for stage, row in p.metrics]
        after = p.metrics[-1][1]
        summaries.append(EpochSummary(p.epoch, after["batches"], after["updates"], after["samples"],
                                      after["dropped_samples"]))
    fingerprints["plan"] = plan_fps
    eval_table, eval_summary = None, None
    if evaluation is not None:
        cols = eval_columns(evaluation, settings)
        fingerprints["eval"] = eval_fingerprint(cols)
        eval_table, eval_summary = plan_tables.eval_table(cols), EvalSummary.of(cols, settings.world_size)
    rows = pa.concat_tables(tables)  # the plan table, stored by (epoch, rank, index): one rank's epoch is a filtered read
    rows = rows.take(pc.sort_indices(rows, [("epoch", "ascending"), ("rank", "ascending"), ("index", "ascending")]))
    metrics = plan_tables.metrics_table(metric_rows)
    before = plan_tables.before_table([p.epoch for p in epochs], [p.before_labels for p in epochs])
    manifest = Manifest(
        plancc=__version__, schema=schemas.SCHEMA_VERSION, fingerprints=fingerprints, settings=settings,
        scan=scan_record.without(*NOT_PLANNED),
        data=data_paths(out_dir, scan_record.source_paths, tokenized is not None),
        epochs=tuple(summaries), samples=samples_table.num_rows,
        checksums={"metrics": metrics_checksum(metrics.to_pylist()),
                   "before": before_checksum(parquet.column(before, "epoch"), parquet.column(before, "label_count"))},
        eval=eval_summary, recipe=recipe)
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
