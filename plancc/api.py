"""The public Python API: `plancc.compile(source, output, **settings) -> Plan` and `plancc.open_plan(path) -> Plan`.

The `plancc` commands are a thin layer over this module: `compile` and `scan` turn flags into the same keyword
settings, and the review commands call `validate`, `diff`, `metrics`, `plan_layout`, `sample`, ... (the last
section), which return data for the command to print. `import plancc` stays light: these names are imported on
first use (see `plancc/__init__.py`).

    import plancc
    plan = plancc.compile("data/train.jsonl", "plans/train", sequence_len=2048, micro_batch_size=4, world_size=8)
    plan.epochs                # [0]
    plan.epoch(0)[0]           # microbatch 0 of epoch 0: its rows of sample ids
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq

from plancc.config import resolve as resolution
from plancc.config.resolve import Resolved
from plancc.config.settings import PlanSettings, ScanOptions
from plancc.core.faults import fault
from plancc.core.paths import cache_path
from plancc.errors import InputError, SettingsError
from plancc.review.diff_rules import DEFAULT_TOLERANCE
from plancc.store import atomic, outputs
from plancc.store.plan import (
    EpochMicrobatches,  # noqa: F401 (public: plancc.EpochMicrobatches)
    Plan,
)

if TYPE_CHECKING:
    from plancc.review.inspect import PlanView
    from plancc.review.show import SampleView

Progress = Callable[[str, int, int], None]


def open_plan(path: str | Path) -> Plan:
    """Open a plan directory written by `compile` (or `plancc compile`); nothing is read but the plan file's
    metadata (the manifest, of which `manifest.json` is only the mirror). The runtime takes the same `Plan` and
    verifies it before step 1 (`plancc.store.plan.Plan.verify`)."""
    return Plan(path)


def _materialize(dataset: Any, cache_dir: Path | None) -> str:
    """An in-memory `datasets.Dataset` as a Parquet file in the cache, named by its content digest."""
    from datasets import Dataset

    if not isinstance(dataset, Dataset):
        raise SettingsError(f"source must be a path, glob, Hub id or datasets.Dataset, got {type(dataset).__name__}")
    folder = cache_path(cache_dir, "datasets")
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{uuid.uuid4().hex}.parquet"
    try:
        pq.write_table(dataset.with_format("arrow")[:], tmp)  # rows in dataset order, selections applied
        digest = hashlib.blake2b(tmp.read_bytes(), digest_size=16).hexdigest()
        final = folder / f"{digest}.parquet"
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return str(final)


def _engine(engine: str, ray_address: str | None, num_proc: int | None, progress: Progress | None
            ) -> tuple[Callable[..., Any] | None, int]:
    """The scan's shard runner (None: the local engine, `num_proc` processes) and its default shard rows."""
    from plancc.scan.shard import SHARD_ROWS

    if engine == "local":
        if ray_address is not None:
            raise SettingsError("--ray-address needs --engine ray")
        return None, SHARD_ROWS
    if engine != "ray":
        raise SettingsError(f"--engine {engine}: expected local or ray")
    from plancc.scan import ray_engine

    return ray_engine.ray_engine(address=ray_address, num_cpus=num_proc, progress=progress), ray_engine.SHARD_ROWS


def resolve(source: Any = None, *, config: str | Path | None = None, config_format: str = "auto",
            num_proc: int | None = None, mix: str | list[str] | dict[str, tuple[str, float]] | None = None,
            scan: ScanOptions | None = None, plan: PlanSettings | None = None, **settings: Any) -> Resolved:
    """The settings `compile` would use, resolved once (`plancc.config.resolve`): defaults < `config` file <
    `scan=`/`plan=` fields and keyword settings (see `compile`); also a recipe's datasets, and the note on an
    Axolotl or TRL config's unused keys. `compile(None, output, resolved=...)` takes the result."""
    return resolution.resolve(source, config=config, config_format=config_format, mix=mix, scan=scan, plan=plan,
                              num_proc=num_proc, **settings)


def scan_settings(*, config: str | Path | None = None, config_format: str = "auto", num_proc: int | None = None,
                  scan: ScanOptions | None = None, **settings: Any) -> Resolved:
    """The settings `scan` would use (`resolve` without a recipe: a scan reads one source)."""
    return resolution.resolve(None, config=config, config_format=config_format, scan=scan, num_proc=num_proc,
                              recipe_allowed=False, **settings)


def scan(source: Any, output: str | Path, *, overwrite: bool = False, config: str | Path | None = None,
         config_format: str = "auto", num_proc: int | None = None, cache_dir: str | Path | None = None,
         progress: Progress | None = None, shard: str | tuple[int, int] | None = None, shard_rows: int | None = None,
         engine: str = "local", ray_address: str | None = None, scan: ScanOptions | None = None,
         resolved: Resolved | None = None, **settings: Any) -> dict[str, Any]:
    """Tokenize and scan `source` only, write the scan directory `output` (compile it later); returns its report.

    Takes the scan's settings of `compile` (`scan=ScanOptions(...)` and/or `format`, `tokenizer`, `sequence_len`,
    `long`, `shift`, ... by name, as there, or `resolved=scan_settings(...)`) and its `overwrite` rule for
    `output`. `shard="I/N"` (or `(I, N)`) scans only shard I of N of the source's rows into a partial scan, for
    `merge` to join with the others; `shard_rows` is the scan's shard size (memory, resume granularity and, on
    Ray, the unit of work; the result is the same for any value). `engine="ray"` scans on Ray
    (`plancc.scan.ray_engine`): a local Ray of `num_proc` CPUs (default all) started for the call, or the cluster
    at `ray_address` (`"auto"`: the one this machine belongs to); the result is the local engine's, byte for byte.
    """
    from plancc.scan import scanner as scan_mod

    cache = Path(cache_dir) if cache_dir is not None else None
    if resolved is None:
        resolved = scan_settings(config=config, config_format=config_format, num_proc=num_proc, scan=scan,
                                 **settings)
    elif config or scan or any(v is not None for v in (num_proc, *settings.values())):
        raise SettingsError("resolved= holds every setting: give no other")
    options, procs = resolved.scan, resolved.run.num_proc
    index_count = parse_shard(shard) if shard is not None else None
    # Ray: the processes asked for, else all of the machine's
    runner, default_rows = _engine(engine, ray_address, procs if "num_proc" in resolved.given else None, progress)
    if runner is not None and index_count is not None:
        raise SettingsError("--shard scans one part in this process (a job runner runs the others): use "
                            "--engine local, or --engine ray without --shard for the whole source")
    outputs.check_output(output, overwrite=overwrite)  # before any work
    if not isinstance(source, str | os.PathLike):
        source = _materialize(source, cache)
    if index_count is not None:
        return scan_mod.scan_shard(str(source), options, *index_count, Path(output), overwrite=overwrite,
                                   num_proc=procs, progress=progress).to_json()
    result = scan_mod.scan(str(source), options, num_proc=procs, cache_dir=cache, progress=progress,
                           shard_rows=default_rows if shard_rows is None else shard_rows, engine=runner)
    fault("prepared")
    scan_mod.write_scan(result, Path(output), overwrite=overwrite)
    return result.report.to_json()


def parse_shard(spec: str | tuple[int, int]) -> tuple[int, int]:
    """`--shard I/N` as (I, N): shard I (from 0) of N."""
    if isinstance(spec, tuple):
        index, count = spec
    else:
        try:
            index, count = (int(x) for x in str(spec).split("/"))
        except ValueError:
            raise InputError(f"--shard {spec}: expected I/N, e.g. --shard 0/8 (shard I from 0 of N)") from None
    from plancc.scan.shard import shard_range

    shard_range(0, index, count)  # checks 0 <= I < N
    return index, count


def merge(parts: list[str | Path], output: str | Path, *, overwrite: bool = False) -> dict[str, Any]:
    """Join the partial scans `parts` (`scan(..., shard="I/N")`) into the scan directory `output` after checking
    they fit (same source, options, tokenizer, template; disjoint and complete rows); returns its report."""
    from plancc.scan import merge as merge_mod

    return merge_mod.merge([Path(p) for p in parts], output, overwrite=overwrite).to_json()


def compile(source: Any, output: str | Path, *, overwrite: bool = False, config: str | Path | None = None,
            config_format: str = "auto", num_proc: int | None = None, cache_dir: str | Path | None = None,
            progress: Progress | None = None, mix: str | list[str] | dict[str, tuple[str, float]] | None = None,
            scan: ScanOptions | None = None, plan: PlanSettings | None = None, resolved: Resolved | None = None,
            **settings: Any) -> Plan:
    """Scan `source` (or reuse its scan), plan every epoch and write the plan directory `output`.

    `source` is what `plancc compile` takes (file, glob, `save_to_disk` dir, Hub id, samples table, scan or plan
    directory) or an in-memory `datasets.Dataset` (written once into the cache as Parquet). A list of them (or of
    dataset entries, dicts with a config entry's keys: `path`, `name`, `format`, `repeat`, `weight`, ...) is a
    recipe (`plancc.config.recipe`), as is a config file listing `datasets` (then `source` is None). `mix` is `--mix`:
    "chat=2x,alpaca=0.5" (a repeat with x, else a weight). The settings are typed, `scan=ScanOptions(...)` and
    `plan=PlanSettings(...)`, and/or the flags' names with underscores (`sequence_len=2048, world_size=8,
    tokenizer="tok/"`), which override the objects' fields (`plancc.config.resolve.typed_settings`); `config` is a
    TOML/YAML file under both (an Axolotl or TRL config too: `config_format`, `plancc.config.foreign`); or all of
    them resolved beforehand, `resolved=resolve(source, ...)` (which holds the source: then give neither). `output`
    must be absent, empty, or (with `overwrite`) a plan or scan to replace that holds only what plancc wrote
    (anything else there is refused, `outputs.OutputError`, before any work). Errors are
    `plancc.errors.PlanccError` with a message naming the setting to change.
    """
    from plancc.build.run import compile_plan

    cache = Path(cache_dir) if cache_dir is not None else None
    if resolved is None:
        source = [_as_path(s, cache) for s in source] if isinstance(source, list | tuple) else \
            _as_path(source, cache)
        resolved = resolve(source, config=config, config_format=config_format, num_proc=num_proc, mix=mix, scan=scan,
                           plan=plan, **settings)
    elif source is not None or config or scan or plan or mix or any(v is not None
                                                                    for v in (num_proc, *settings.values())):
        raise SettingsError("resolved= holds the source and every setting: give no other")
    compile_plan(resolved, output, cache_dir=cache, progress=progress, overwrite=overwrite)
    return open_plan(output)


def _as_path(source: Any, cache: Path | None) -> Any:
    """A source as `resolve` reads it: an in-memory `datasets.Dataset` written into the cache, anything else as
    it is (a path, Hub id or recipe entry)."""
    return source if source is None or isinstance(source, str | os.PathLike | dict) else _materialize(source, cache)


# ---------------------------------------------------------------- review: what `plancc validate|diff|inspect|show` ask


@dataclasses.dataclass(frozen=True)
class Validation:
    """What `validate` found: every violation (none: the plan is sound), whether an eval plan was checked, and what
    it found true but worth saying (`notes`: eval samples with a training sample's tokens, as the plan warns)."""

    problems: tuple[str, ...]
    has_eval: bool
    skipped: tuple[str, ...] = ()  # checks the directory's contents did not allow, each with why
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """No violation."""
        return not self.problems


def validate(plan_dir: str | Path, *, dataset: str | None = None, tokenizer: str | None = None, fast: bool = False,
             num_proc: int | None = None, cache_dir: str | Path | None = None) -> Validation:
    """Re-check every invariant and fingerprint of a plan on disk (`plancc.review.validate`).

    `dataset` is where the plan's data is now: a plan, scan or token store folder is checked against the plan
    chunk by chunk; any other source is rescanned with the plan's scan options (its tokenizer at `tokenizer`
    when it moved) and its content fingerprint compared. `fast` checks the token store's metadata only."""
    from plancc.review.validate import skipped_checks, validate_plan
    from plancc.store.token_store import store_in

    tokens_dir, dataset_fp = (store_in(dataset) if dataset is not None else None), None
    if dataset is not None and tokens_dir is None:
        dataset_fp = _rescanned_fingerprint(Path(plan_dir), dataset, tokenizer, num_proc, cache_dir)
    notes: list[str] = []
    problems, has_eval = validate_plan(str(plan_dir), dataset_fp, fast=fast, tokens_dir=tokens_dir, notes=notes)
    skipped = skipped_checks(Plan(plan_dir), tokens_dir) if not problems else []
    return Validation(tuple(problems), has_eval, tuple(skipped), tuple(notes))


def _rescanned_fingerprint(plan_dir: Path, dataset: str, tokenizer: str | None, num_proc: int | None,
                           cache_dir: str | Path | None) -> str:
    """The content fingerprint of `dataset` scanned with the options the plan's scan recorded."""
    from plancc.scan import scanner as scan_mod
    from plancc.store.samples import samples_fingerprints

    plan = Plan(plan_dir)
    if plan.settings.mixture:
        raise InputError(f"--dataset {dataset}: {plan_dir} is a recipe of several datasets, one source cannot be "
                         "rescanned for it; give a plan, scan or token store folder")
    options = scan_mod.options_from_record(plan.scan_record, tokenizer)
    result = scan_mod.scan(dataset, options, num_proc=num_proc or 1,
                           cache_dir=Path(cache_dir) if cache_dir is not None else None)
    return samples_fingerprints(result.samples)["dataset"]


def diff(old: str | Path, new: str | Path, *, fail_on: list[str] | None = None,
         tolerance: float = DEFAULT_TOLERANCE, rows: bool = False) -> dict[str, Any]:
    """Compare two plan directories (`plancc.review.diff.diff_plans`): the JSON-able report, with `fail_on` (the
    checks asked for: any, config, dataset, masks, metrics-regression; repeated or comma-separated) and `failed`
    (why those checks fail; empty: none does). `rows`: name every changed row (else the first 10 of each kind)."""
    from plancc.review import diff as diff_mod

    checks = diff_mod.parse_fail_on(fail_on)
    report = diff_mod.diff_plans(old, new, tolerance=tolerance, rows=rows)
    return {**report, "fail_on": checks, "failed": diff_mod.failures(report, checks)}


def metrics(plan_dir: str | Path | Plan, epoch: int | None = None) -> list[dict[str, Any]]:
    """The metric rows `{epoch, stage, metric...}` of every epoch (or one) as compile stored them."""
    from plancc.review.inspect import read_metrics

    return read_metrics(plan_dir, epoch)


def eval_sizes(plan_dir: str | Path | Plan) -> dict[str, Any] | None:
    """The eval plan's samples, tokens, label tokens and batches (None: the plan holds no eval plan)."""
    from plancc.review import inspect

    return inspect.eval_sizes(plan_dir)


def dataset_metrics(plan_dir: str | Path, epoch: int | None = None) -> list[dict[str, Any]]:
    """A recipe plan's per-dataset samples, tokens and label tokens, before and after planning."""
    from plancc.review.inspect import read_dataset_metrics

    return read_dataset_metrics(plan_dir, epoch)


def plot_metrics(plan_dir: str | Path | Plan, out: str | Path, epochs: list[int] | None = None) -> list[str]:
    """Write before/after label histograms to the PNG `out` (needs matplotlib); one note per epoch."""
    from plancc.review.plot import plot_metrics as plot

    return plot(plan_dir, out, epochs)


def plan_layout(plan_dir: str | Path, *, epoch: int | None = None, update: int | None = None,
                rank: int | None = None, micro_step: int | None = None, limit: int = 20) -> PlanView:
    """The microbatches matching the filters in global order, the first `limit` (0: all) with their sample ids."""
    from plancc.review.inspect import plan_view

    return plan_view(plan_dir, epoch=epoch, update=update, rank=rank, micro_step=micro_step, limit=limit)


def sample(directory: str | Path, sample_id: int, tokenizer: str | None = None) -> SampleView:
    """One sample of a plan or scan decoded with its recorded tokenizer (at `tokenizer` when it moved), its
    supervised tokens marked."""
    from plancc.review.show import sample_view

    return sample_view(directory, sample_id, tokenizer)


def dropped(directory: str | Path) -> dict[str, Any]:
    """The rows a plan's or scan's scan dropped (with why) and the count and first rows it truncated."""
    from plancc.review.show import dropped_rows

    return dropped_rows(directory)


def interrupted_message(output: str | Path, what: str) -> str:
    """What an interrupted command left at `output` (a `what`: plan or scan): the old one, nothing, or the new."""
    return atomic.interrupted_message(output, what)
