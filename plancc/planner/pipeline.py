"""The pipeline: samples -> per-epoch plans (pack, drop the tail if asked, balance) -> metrics. Nothing else.

Randomness enters here only: one `numpy.random.Generator` per epoch, made from `(seed, epoch)`, passed down to
every algorithm in turn. Identical samples and settings therefore give identical plans on any machine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from plancc.config.settings import PlanSettings
from plancc.core import jit, layout, pairs
from plancc.core.plan_arrays import Batches, SampleArrays, batch_sums, batch_targets, segment_sum
from plancc.errors import SettingsError
from plancc.planner import balance, evaluation, holdout, mixture, pack
from plancc.planner.metrics import NO_DROPS, SourceDrops, entry_targets, summarize_units
from plancc.planner.units import PAIRED, UNPAIRED, Units, planning_units, update_totals

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class EpochPlan:
    """One epoch planned: the final microbatches, each stage's metrics, and what the read side shows of `before`."""

    epoch: int
    batches: Batches
    metrics: list[tuple[str, dict]]  # (stage, metrics row) in pipeline order, ending with "after"
    before_labels: np.ndarray  # int64 supervised targets per microbatch of the `before` stage (inspect's histograms)
    # a recipe's epoch: the samples it holds (`batches` index these) and their positions in the samples table
    samples: SampleArrays | None = None
    positions: np.ndarray | None = None


def epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    """The only source of randomness of a plan."""
    return np.random.default_rng(np.random.SeedSequence([seed, epoch]))


def drop_tail(b: Batches, settings: PlanSettings) -> Batches:
    """Remove the incomplete final update (`--drop-last`); its samples are reported as dropped."""
    keep = layout.complete_batches(b.num_batches, settings.world_size, settings.grad_accum)
    if keep == b.num_batches:
        return b
    batch_bounds = b.batch_bounds[: keep + 1]
    row_bounds = b.row_bounds[: batch_bounds[-1] + 1]
    return Batches(b.samples[: row_bounds[-1]], row_bounds, batch_bounds)


def check_fits(s: SampleArrays, settings: PlanSettings, unit: str = "sample") -> None:
    """Every sample (or pair, its `unit`) must fit one row; the scan drops or truncates over-long ones, a foreign
    table may not."""
    too_long = np.flatnonzero(s.length > settings.max_sample_len)
    if too_long.size:
        i = int(too_long[0])
        raise SettingsError(
            f"{too_long.size} {unit}s are longer than {settings.max_sample_len} tokens (first: {unit}_id "
            f"{int(s.sample_id[i])}, length {int(s.length[i])}); raise --sequence-len or rescan with --long drop"
        )


def before_batches(s: SampleArrays, settings: PlanSettings, epoch: int) -> tuple[Batches, np.random.Generator]:
    """The `before` plan of `epoch` (packed or grouped, tail dropped if asked) and the rng balancing continues with."""
    rng = epoch_rng(settings.seed, epoch)
    b = pack.initial_batches(s, settings, rng)
    if settings.drop_last:
        full = drop_tail(b, settings)
        if full.num_batches == 0:
            raise SettingsError(
                f"--drop-last leaves nothing: epoch {epoch} has {b.num_batches} microbatches, fewer than one update "
                f"of {settings.batches_per_update} (world size x grad accum); lower them or use --keep-last"
            )
        b = full
    return b, rng


def plan_epoch(s: SampleArrays | Units, settings: PlanSettings, epoch: int, progress: Progress | None = None,
               drops: SourceDrops = NO_DROPS, index: np.ndarray | None = None) -> EpochPlan:
    """Pack `epoch` (a recipe's: its mixture, `index` each unit's dataset), then run every balancing stage in
    turn, summarizing the plan after each. Pack and balance move units (`plancc.planner.units`: samples, or the
    pairs of preference data); the epoch's microbatches name samples."""
    units = s if isinstance(s, Units) else planning_units(s, settings)
    positions = mixture.plan_positions(index, settings, epoch)
    if positions is not None:
        if positions.size == 0:
            raise SettingsError(f"epoch {epoch} of the recipe holds no training sample")
        units, positions = units.take(positions)
    b, rng = before_batches(units.facts, units.settings, epoch)
    before_labels = batch_targets(units.expand(b), units.samples, settings.shift)
    metrics = [("before", summarize_units(units, b, settings, drops))]
    passes = balance.stages(units.settings, rng)
    for done, (name, stage) in enumerate(passes, 1):
        b = stage(b, units.objective(name), units.settings)
        metrics.append((name, summarize_units(units, b, settings, drops)))
        if progress:
            progress(f"balancing epoch {epoch}", done, len(passes))
    metrics.append(("after", metrics[-1][1]))
    return EpochPlan(epoch, units.expand(b), metrics, before_labels, units.samples if positions is not None else None,
                     positions)


def compile_plan(s: SampleArrays, settings: PlanSettings, progress: Progress | None = None,
                 drops: SourceDrops = NO_DROPS, index: np.ndarray | None = None) -> list[EpochPlan]:
    """Plan every epoch of `settings.epochs`; `drops` (what the scan left out) goes into the metrics; `index`: a
    recipe's dataset of each sample (its position in `settings.mixture`)."""
    if len(s) == 0:
        raise SettingsError("the samples table is empty: nothing to plan")
    units = planning_units(s, settings)
    check_fits(units.facts, units.settings, "pair" if units.members is not None else "sample")
    if index is not None:  # each unit's dataset: the mixture draws pairs whole
        index = pairs.per_pair(index, units.members)
    plans = []
    with jit.compile_notice(progress):
        for epoch in range(settings.epochs):
            if progress:
                progress("planning epochs", epoch, settings.epochs)
            plans.append(plan_epoch(units, settings, epoch, progress, drops, index))
        if progress:
            progress("planning epochs", settings.epochs, settings.epochs)
    return plans


@dataclass(frozen=True)
class CompiledRun:
    """A whole run planned: the training samples (the retained ones not held out), their epochs, the eval plan."""

    train: SampleArrays
    epochs: list[EpochPlan]
    evaluation: evaluation.EvalPlan | None


def compile_run(s: SampleArrays, settings: PlanSettings, progress: Progress | None = None,
                drops: SourceDrops = NO_DROPS, eval_ids: np.ndarray | None = None,
                index: np.ndarray | None = None) -> CompiledRun:
    """Hold out the eval samples (`eval_ids`, else `holdout.eval_ids`: a recipe's eval datasets and
    `--val-set-size`'s draw), plan training on the rest and build the eval plan of the held-out ones; without
    either, the plain `compile_plan` of every sample. `index`: a recipe's dataset of each sample, whose held-out
    samples leave the mixture (index -1), so each dataset's counts apply to the samples it trains on."""
    if eval_ids is None and len(s):
        eval_ids = holdout.eval_sample_ids(s, settings, index)
    if eval_ids is None:
        return CompiledRun(s, compile_plan(s, settings, progress, drops, index), None)
    train, held = holdout.split(s, eval_ids)
    if index is not None:  # a recipe plans over the whole table (positions), its held-out samples in no dataset
        train, index = s, holdout.without(index, s.sample_id, eval_ids)
    return CompiledRun(train, compile_plan(train, settings, progress, drops, index),
                       evaluation.eval_plan(held, settings))


def plan_columns(p: EpochPlan, s: SampleArrays, settings: PlanSettings) -> dict[str, np.ndarray]:
    """One row per microbatch: the plan table's columns as arrays (store turns them into Parquet)."""
    b = p.batches
    s = p.samples if p.samples is not None else s
    n = b.num_batches
    W, G = settings.world_size, settings.grad_accum
    update, rank, micro_step = layout.update_mapping(n, W, G)
    sums = batch_sums(b, s, settings.shift, settings.mode, settings.pad_multiple)
    labels = sums.targets
    return {
        "epoch": np.full(n, p.epoch, dtype=np.int32),
        "index": np.arange(n, dtype=np.int64),
        "update": update,
        "rank": rank,
        "micro_step": micro_step,
        "sample_ids": s.sample_id[b.samples],
        "row_bounds": b.row_bounds,
        "batch_bounds": b.batch_bounds,
        "tokens": sums.tokens,
        "label_count": labels,
        "cost": sums.cost,
        "num_items": layout.num_items(labels, W, G),
        "complete_update": layout.in_complete_update(n, W, G),
        **kind_columns(b, s, settings),
    }


def kind_columns(b: Batches, s: SampleArrays, settings: PlanSettings) -> dict[str, np.ndarray]:
    """The plan table's columns for preference data (docs/preference.md), each the total of its microbatch's whole
    update on all ranks: pairs and the chosen completions' targets (paired), desirable and undesirable completions
    (unpaired); none for SFT."""
    def per_batch(per_entry: np.ndarray) -> np.ndarray:
        return update_totals(segment_sum(segment_sum(per_entry.astype(np.int64), b.row_bounds), b.batch_bounds),
                             settings)

    if s.kind == PAIRED:
        chosen = s.chosen[b.samples]
        return {"num_pairs": per_batch(chosen), "num_chosen_items": per_batch(
            entry_targets(b, s, settings.shift) * chosen)}
    if s.kind == UNPAIRED:
        desirable = s.desirable[b.samples]
        return {"num_desirable": per_batch(desirable), "num_undesirable": per_batch(~desirable)}
    return {}
