"""Re-check a plan on disk, every file it ships: invariants of docs/spec.md §4-6, fingerprints, checksums and the mirror.

Nothing is trusted from the writer. `Plan` (`plan.files`, `PlanFiles`) checks how the files vouch for each other
(settings against the config fingerprint, each epoch's rows against the layout and its plan fingerprint, samples
against the dataset and metadata fingerprints, metrics against their checksum, every file's metadata and
`manifest.json` against the plan file's). On top, this module checks what the plan must satisfy against the
samples table, with code of its own rather than the compiler's, so that a compiler bug shows as a violation
instead of agreeing with itself: coverage (each sample once, or its mixture count: the recipe's draw made again,
`plancc.store.redraw`), capacity, per-microbatch tokens, targets and cost and each epoch's summary figures
(`recount`), the eval plan (the held-out samples drawn again, each exactly once, none of them in training, none a
copy of a training sample's tokens the plan does not warn of, in the training layout, counted right, against the
eval fingerprint), that the settings the plan shares with its scan
(`sequence_len`, `shift`) are the scan's, and the tokenized data the trainer will load: every header value against
its `header_hash`, present, complete and, unless `fast`, equal in content to the dataset fingerprint (each planned
sample's hash against the samples table). The result is a list of violations, each naming its file and row or
field (empty when the plan is sound).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from plancc.config.registry import BOTH
from plancc.config.settings import PlanSettings
from plancc.core import pairs
from plancc.core.choices import DatasetRole, Mode, Shift
from plancc.core.layout import tail_batches
from plancc.core.plan_arrays import SampleArrays
from plancc.errors import SettingsError
from plancc.review import recount, recount_pairs
from plancc.review.recount import Microbatches, Rows
from plancc.store import parquet, redraw, schemas, token_digest, token_store
from plancc.store.file_checks import first_difference, repeated_sample, schema_problems, statistics_problems
from plancc.store.plan import Plan
from plancc.store.plan_store import PlanIntegrityError, eval_set_problem
from plancc.store.samples import dataset_codes


def _shared_problems(plan: Plan) -> list[str]:
    """A plan compiled from a scan holds the scan's sequence_len and shift (`plancc.build.carry`): its samples were cut,
    dropped and counted under them. A plan whose settings say otherwise was edited (or built by hand)."""
    recorded = plan.scan_record.options
    if recorded is None:
        return []
    return [f"{plan.files.plan_file} metadata: settings.{name} is {getattr(plan.settings, name)!r}, but its samples were "
            f"scanned with {name} {getattr(recorded, name)!r} (scan.options.{name})"
            for name in BOTH if getattr(recorded, name) != getattr(plan.settings, name)]


def _mismatch(name: str, where: str, got: np.ndarray, want: np.ndarray) -> str | None:
    bad = np.flatnonzero(got != want)
    if bad.size == 0:
        return None
    i = int(bad[0])
    return (f"{where} row {i}: {name} is {got[i]}, recomputed from {schemas.SAMPLES_FILE} "
            f"{want[i]} ({bad.size} rows differ)")


def mixture_counts(sample_id: np.ndarray) -> np.ndarray:
    """How often the epoch must hold each sample of a sorted multiset of ids, at its first occurrence (0 at the
    others): a plain epoch holds every sample once, a recipe's its mixture count."""
    first = np.r_[True, sample_id[1:] != sample_id[:-1]] if sample_id.size else np.zeros(0, dtype=bool)
    starts = np.flatnonzero(first)
    want = np.zeros(sample_id.shape[0], dtype=np.int64)
    want[starts] = np.diff(np.append(starts, sample_id.shape[0]))
    return want


Checked = tuple[list[str], Rows | None, Microbatches | None]


def check_epoch(epoch: int, table: pa.Table, s: SampleArrays, settings: PlanSettings) -> Checked:
    """Coverage (each sample exactly its mixture count: once, for one source), capacity, microbatch shape and
    per-microbatch counts of one epoch against the epoch's samples (`redraw.epoch_positions` for a recipe)."""
    return check_rows(f"{schemas.PLAN_FILE} epoch {epoch}", table, s, settings)


def check_rows(where: str, table: pa.Table, s: SampleArrays, settings: PlanSettings) -> Checked:
    """`check_epoch` of any plan rows (an epoch's, or the eval plan's) named `where` in the messages: they must
    hold each sample of the multiset `s` as often as it is in it (all unless --drop-last), fit the layout, and
    count what `s` says (`recount`); returns the rows as positions in `s` and what their microbatches hold."""
    problems: list[str] = []
    ids, row_bounds, batch_bounds = parquet.nested_arrays(table.column("sample_ids"))
    pos = np.minimum(np.searchsorted(s.sample_id, ids), len(s) - 1)
    unknown = s.sample_id[pos] != ids
    if unknown.any():
        among = f"the epoch's mixture draw of {schemas.SAMPLES_FILE}" if settings.mixture else schemas.SAMPLES_FILE
        return [f"{where}: {int(unknown.sum())} sample ids are not in {among} "
                f"(first: {int(ids[np.flatnonzero(unknown)[0]])})"], None, None
    rows = Rows(pos, row_bounds, batch_bounds)
    mb = recount.microbatches(rows, s, settings)
    n = rows.num_batches

    counts, want = np.bincount(pos, minlength=len(s)), mixture_counts(s.sample_id)
    over = np.flatnonzero(counts > want)
    if over.size and not settings.mixture:
        row, sid, first = repeated_sample(ids, row_bounds[batch_bounds])
        problems.append(f"{where} row {row}: sample_id {sid} again (already in row {first}); "
                        f"{int((counts > 1).sum())} samples appear more than once")
    elif over.size:
        problems.append(f"{where}: sample_id {int(s.sample_id[over[0]])} appears "
                        f"{int(counts[over[0]])} times, its mixture count is {int(want[over[0]])} ({over.size} "
                        "samples appear more often than the mixture says)")
    short = np.flatnonzero(counts < want)
    if short.size and not settings.drop_last:
        problems.append(f"{where}: {int((want - counts)[short].sum())} retained samples are "
                        f"missing (first: sample_id {int(s.sample_id[short[0]])})")
    if settings.drop_last and tail_batches(n, settings.world_size, settings.grad_accum):
        problems.append(f"{where}: --drop-last plan ends with an incomplete update")

    capacity = recount_pairs.row_settings(settings, s.kind).row_capacity
    over = np.flatnonzero(mb.row_tokens > capacity)
    if over.size:
        problems.append(f"{where}: {over.size} rows exceed capacity {capacity} (first: row {over[0]})")
    per_unit = 2 if s.kind == recount_pairs.PAIRED else 1  # a preference microbatch holds micro_batch_size pairs
    if settings.mode == Mode.PACKED:
        too_many = np.flatnonzero(np.diff(batch_bounds) > (settings.micro_batch_size if settings.real_batches else 1))
        if too_many.size:
            problems.append(f"{where} row {too_many[0]}: the microbatch has too many rows")
    else:
        per_batch = recount.sums(np.diff(row_bounds), batch_bounds)
        most = settings.micro_batch_size * per_unit
        short = np.count_nonzero(per_batch != most)  # the remainder's one microbatch
        if short > 1 or (n and not per_unit <= per_batch.min() <= per_batch.max() <= most):
            problems.append(f"{where}: microbatches do not hold exactly {most} samples (but one, holding the "
                            "remainder)")
    if s.kind == recount_pairs.PAIRED:
        problems += recount_pairs.pair_problems(where, rows, s, settings.mode)
    stored = recount_pairs.update_counts(recount_pairs.counts(rows, s, settings), settings) \
        if "num_items" in table.column_names else {}  # a training plan's rows (not the eval plan's)
    for name, want in (("tokens", mb.tokens), ("label_count", mb.label_count), ("cost", mb.cost),
                       *stored.items()):
        msg = _mismatch(name, where, parquet.column(table, name), want)
        if msg:
            problems.append(msg)
    return problems, rows, mb


def _eval_problems(plan: Plan, s, index: np.ndarray | None) -> tuple[list[str], np.ndarray]:
    """(violations of the eval plan, the eval sample ids training must not hold). The eval rows must hold the
    samples compile held out (`redraw.eval_ids`, drawn again here: a recipe's eval datasets, `--val-set-size`'s
    draw) each exactly once, fit the training layout and count what the samples table says; layout, eval
    fingerprint and manifest summary: `PlanFiles.eval_problems`."""
    size, path, none = plan.settings.val_set_size, plan.path / schemas.EVAL_FILE, np.zeros(0, dtype=np.int64)
    try:
        expected = recount_pairs.eval_ids(s, plan.settings, index) if len(s) else none
    except SettingsError as exc:
        return [f"{plan.files.plan_file} metadata: {exc}"], none
    if not plan.manifest.has_eval:
        if expected.size:
            return [f"{plan.files.plan_file} metadata: the settings hold out {expected.size} eval samples (val_set_size "
                    f"{size}, eval datasets) but fingerprints.eval is missing (no eval plan)"], expected
        return ([f"{path}: an eval plan, but {plan.files.plan_file} has no eval fingerprint"] if path.exists() else []), expected
    held = plan.files.source(schemas.EVAL_FILE)
    problems = [*schema_problems(held, schemas.EVAL_SCHEMA), *statistics_problems(held),
                *plan.files.companion_problems(schemas.EVAL_FILE, "eval")]
    try:
        table = plan.files.read_eval()
    except schemas.StoreError as exc:
        return [*problems, str(exc)], expected
    problems += plan.files.eval_problems(table)
    found = eval_set_problem(parquet.nested_arrays(table.column("sample_ids"))[0], expected, plan.settings)
    if found:
        problems.append(f"{path}: {found}")
        return problems, expected
    found, _, _ = check_rows(str(path), table, s.take(np.flatnonzero(np.isin(s.sample_id, expected))),
                             replace(plan.settings, drop_last=False, mixture=(), samples_per_epoch=None))
    return problems + found, expected


def _eval_copies(plan: Plan, samples: pa.Table, eval_ids: np.ndarray, index: np.ndarray | None,
                 notes: list[str]) -> list[str]:
    """An eval set is held out by content too: an eval dataset whose every sample has a training sample's tokens
    (`token_hash`) is a violation (compile refuses it), and eval samples with a training sample's tokens must be
    what the plan warns of (its warning then goes into `notes`)."""
    if not eval_ids.size:
        return []
    token_hash, ids = parquet.column(samples, "token_hash"), parquet.column(samples, "sample_id")
    held = np.isin(ids, eval_ids)
    copied = np.zeros(ids.shape[0], dtype=bool)
    copied[held] = np.isin(token_hash[held], token_hash[~held])
    for d, m in enumerate(plan.settings.mixture if index is not None else ()):
        mine = index == d
        if m.role == DatasetRole.EVAL and mine.any() and copied[mine].all():
            return [f"{schemas.EVAL_FILE}: eval dataset {m.name!r}: all {int(mine.sum()):,} of its samples have the "
                    "same tokens as training samples: it is training data, not held out"]
    if not copied.any():
        return []
    said = (f"{int(copied.sum()):,} of {int(held.sum()):,} eval samples have the same tokens (token_hash) as a "
            "training sample")
    warned = [w for w in plan.warnings if w.startswith(said)]
    notes += warned
    return [] if warned else [f"{schemas.EVAL_FILE}: {said} (first: sample_id {int(ids[copied][0])}); the plan does "
                              "not warn of it"]


def _held_out_in_training(epoch: int, table: pa.Table, eval_ids: np.ndarray) -> list[str]:
    """Held-out samples must never be trained on."""
    ids = parquet.nested_arrays(table.column("sample_ids"))[0]
    leaked = np.intersect1d(ids, eval_ids)
    return [f"{schemas.PLAN_FILE} epoch {epoch}: {leaked.size} held-out eval samples are in the training plan "
            f"(first: sample_id {int(leaked[0])})"] if leaked.size else []


def _recipe_index(plan: Plan, samples: pa.Table) -> tuple[np.ndarray | None, list[str]]:
    """A recipe plan's dataset of each sample (its position in the mixture), and what is wrong with the column."""
    if not plan.settings.mixture:
        return None, []
    if schemas.DATASET_COLUMN not in samples.column_names:
        return None, [f"{schemas.SAMPLES_FILE}: a recipe's samples table lacks its '{schemas.DATASET_COLUMN}' column"]
    codes, names = dataset_codes(samples)
    index = redraw.dataset_index(codes, names, plan.settings)
    if (index < 0).any():
        row = int(np.flatnonzero(index < 0)[0])
        return index, [f"{schemas.SAMPLES_FILE} row {row}: dataset {names[codes[row]]!r} is not one of the recipe's "
                       f"({', '.join(m.name for m in plan.settings.mixture)})"]
    return index, []


def _dataset_after(epoch: int, rows: Rows, s_e: SampleArrays, index: np.ndarray, plan: Plan) -> list[dict[str, Any]]:
    """One epoch's per-dataset `after` metrics recounted from its rows (`rows` indexes the epoch's samples `s_e`,
    whose datasets `index` gives)."""
    names = [m.name for m in plan.settings.mixture]
    return recount.dataset_figures(epoch, names, index[rows.pos], s_e.length[rows.pos],
                                   recount.entry_targets(rows, s_e, plan.settings.shift),
                                   None if s_e.chosen is None else s_e.chosen[rows.pos])


def _recipe_metrics_problems(plan: Plan, recomputed: list[dict[str, Any]]) -> list[str]:
    """The manifest's per-dataset `after` metrics against those recomputed from the plan's rows."""
    if not plan.settings.mixture:
        return []
    stored = [r for r in (plan.manifest.recipe or {}).get("metrics", []) if r.get("stage") == "after"]
    key = ("epoch", "dataset")
    stored_by = {tuple(r[k] for k in key): r for r in stored}
    for row in recomputed:
        got = stored_by.get(tuple(row[k] for k in key))
        found = first_difference(got, row) if got is not None else "the row is missing"
        if found:
            return [f"{schemas.PLAN_FILE} metadata: recipe metrics of dataset {row['dataset']!r} epoch {row['epoch']} "
                    f"after: {found} (recomputed from the rows)"]
    return []


def _metrics_problems(plan: Plan, metrics: pa.Table, after: dict[int, dict[str, Any]]) -> list[str]:
    """Each epoch's stored `after` row against the figures recounted from its rows (`recount.FIGURES`); the
    manifest's epoch summary."""
    problems = []
    stored = {(int(r["epoch"]), r["stage"]): r for r in metrics.to_pylist()}
    for epoch, again in after.items():
        row = stored.get((epoch, "after"))
        if row is None:
            problems.append(f"{schemas.METRICS_FILE}: no 'after' row for epoch {epoch}")
            continue
        for name, value in again.items():
            if recount.differs(row[name], value):
                problems.append(f"{schemas.METRICS_FILE} epoch {epoch} stage after: {name} is {row[name]}, recomputed "
                                f"from {schemas.PLAN_FILE} {value}")
                break
    epochs = [{"epoch": e, **{k: a[k] for k in ("batches", "updates", "samples", "dropped_samples")}}
              for e, a in sorted(after.items())]
    found = first_difference([e.to_json() for e in plan.manifest.epochs], epochs)
    if found:
        problems.append(f"{schemas.PLAN_FILE} metadata: epochs {found} (recomputed from the rows)")
    return problems


def _before_problems(plan: Plan, before: pa.Table, metrics: pa.Table) -> list[str]:
    """Each epoch's stored before counts against its stored `before` metrics row (count, total, spread)."""
    stored = {int(r["epoch"]): r for r in metrics.to_pylist() if r["stage"] == "before"}
    problems = []
    for epoch in plan.epochs:
        labels, row = plan.files.before_labels(epoch, before), stored.get(epoch)
        if row is None:
            problems.append(f"{schemas.METRICS_FILE}: no 'before' row for epoch {epoch}")
            continue
        again = {"batches": labels.size, "total_label_count": int(labels.sum()),
                 "std_label_count": float(labels.std()) if labels.size else 0.0}
        for name, value in again.items():
            if not np.isclose(row[name], value, rtol=1e-12, atol=0):
                problems.append(f"{schemas.BEFORE_FILE} epoch {epoch}: {name} of its rows is {value}, the stored "
                                f"before metrics say {row[name]}")
                break
    return problems


def tokenized_problems(plan: Plan, samples: pa.Table, *, fast: bool,
                       tokens_dir: Path | None = None) -> list[str]:
    """The token data the trainer loads, found as the runtime finds it: the plan's own `tokens/` (which must be the
    store the plan binds: `fingerprints.tokens`), or `tokens_dir` when repointed (`--dataset`); see
    `check_token_data`. No path is read from the metadata: a plan compiled from a bare samples table ships no data,
    and its trainer passes data=."""
    if tokens_dir is not None:
        try:
            return check_token_data(token_store.open_store(tokens_dir), samples, plan.fingerprints,
                                    shift=plan.settings.shift, fast=fast)
        except token_store.TokenStoreError as exc:
            return [str(exc)]
    older = plan.manifest.data.older_tokenized
    if older is not None:
        return [f"{plan.path}: ships {older} (an older plancc's tokenized data), which this plancc no "
                "longer checks; recompile the plan to get a token store"]
    problems = plan.files.data_problems()
    if problems:
        return problems
    if not plan.manifest.binds_tokens:
        own = plan.path / schemas.TOKENS_DIR
        return [f"{own} is there but the plan binds no token store (its metadata was edited)"] \
            if os.path.lexists(own) else []
    if skipped_checks(plan, tokens_dir):
        return []
    try:
        m = plan.files.open_tokens()
    except PlanIntegrityError as exc:
        return [str(exc)]
    return check_token_data(m, samples, plan.fingerprints, shift=plan.settings.shift, fast=fast)


def skipped_checks(plan: Plan, tokens_dir: Path | None = None) -> list[str]:
    """The checks `validate` cannot run on what the directory holds, each with why and how to run it: the token
    data, when the plan binds a token store that is not there (a plan kept in git without its `tokens/`, which
    `plancc diff` does not need; the runtime refuses to train on it without `data=`)."""
    own = plan.path / schemas.TOKENS_DIR
    if tokens_dir is not None or not plan.manifest.binds_tokens or os.path.lexists(own):
        return []
    return [f"token data: {own} is not there (the plan binds token store {plan.fingerprints['tokens'][:12]}); "
            "check the data training will read with --dataset DIR"]


def check_token_data(m: token_store.MappedTokens, samples: pa.Table, fingerprints: dict[str, Any], *, shift: str,
                     fast: bool = False) -> list[str]:
    """An opened token store (the open-time checks passed: header, every file's size and dtype, chunk index hash)
    against the plan: its dataset/metadata fingerprints, label layout and row count; unless `fast`, also every
    chunk hash, the chunk layout, and every planned sample's length, label count and content hash (reads the
    store)."""
    tokens_dir = m.path
    problem = token_store.parts_problem(m)
    if problem:
        return [problem]
    for key in ("dataset", "metadata"):
        got = m.header["fingerprints"].get(key)
        if got != fingerprints[key]:
            return [f"{tokens_dir}: its {key} fingerprint {got} is not the plan's {fingerprints[key]}: the store "
                    "was swapped in from another plan or scan (or rebuilt from changed data)"]
    if m.header["labels_shifted"] != (shift == Shift.NONE):
        return [f"{tokens_dir}: labels_shifted is {m.header['labels_shifted']}, but the plan's shift is {shift!r}"]
    sid = parquet.column(samples, "sample_id")
    rows = int(m.offsets.shape[0] - 1)
    if sid.size and int(sid[-1]) >= rows:
        return [f"{tokens_dir} has {rows} rows but the plan uses sample_id {int(sid[-1])}: the store is incomplete"]
    if fast:
        return []
    layout = token_store.layout_problem(m)
    if layout:
        return [layout]
    problems = []
    bad = token_store.verify_all(m)
    if bad is not None:
        problems.append(f"{token_store.chunk_where(m, bad)} changed since it was written")
    else:  # a multi-part store's own max_id is its parts' largest (checked at open)
        problems += [f"{part.path}: {token_store.HEADER_FILE} max_id {part.header['max_id']} is not the largest id"
                     for part in m.parts or (m,)
                     if part.header["max_id"] != (int(part.input_ids.max()) if part.input_ids.size else -1)][:1]
    problem = token_digest.compare_samples(m.input_ids, m.labels, m.offsets, samples)  # names the changed sample
    return [*problems, f"{tokens_dir} does not match the plan: {problem}"] if problem else problems


def validate_plan(plan_dir: str, dataset_fingerprint: str | None = None, *, fast: bool = False,
                  tokens_dir: str | Path | None = None, notes: list[str] | None = None) -> tuple[list[str], bool]:
    """(violations, whether the plan holds an eval plan) for PLAN_DIR; `dataset_fingerprint` is the rescanned source's, when given;
    `tokens_dir` a token store to check instead of the plan's own (`validate --dataset` repointing); `notes`, when
    given, gets what was found true but is worth saying (the plan's warning that eval samples have a training
    sample's tokens, recounted).

    Raises `StoreError` only when PLAN_DIR is not a plan directory at all, and `token_store.FileTypeError` when a
    file of it is a FIFO, device or directory (refused before reading); a plan file that cannot be read or
    trusted is a violation like any other. Each violation is listed once (a missing file fails every check of it).
    """
    problems, plan = _violations(plan_dir, dataset_fingerprint, fast=fast, tokens_dir=tokens_dir,
                                 notes=[] if notes is None else notes)
    return list(dict.fromkeys(problems)), plan is not None and plan.manifest.has_eval


def _violations(plan_dir: str, dataset_fingerprint: str | None, *, fast: bool,
                tokens_dir: str | Path | None, notes: list[str]) -> tuple[list[str], Plan | None]:
    if not (Path(plan_dir) / schemas.PLAN_FILE).exists():
        Plan(plan_dir)  # raises the "not a plan directory" error
    try:
        plan = Plan(plan_dir)
    except schemas.StoreError as exc:
        return [str(exc)], None
    files = plan.files
    kind = plan.manifest.data_kind
    problems = _file_problems(plan, dataset_fingerprint)
    try:
        samples = files.read_samples()
        metrics = files.read_metrics()
        before = files.read_before() if files.has_before else None
    except schemas.StoreError as exc:
        return [*problems, str(exc)], plan
    problems += files.samples_problems(samples) + files.metrics_problems(metrics)
    if before is not None:
        problems += files.before_problems(before) + _before_problems(plan, before, metrics)
    s = parquet.sample_arrays(samples)
    if s.kind != kind:
        return [*problems, f"{schemas.SAMPLES_FILE} holds {s.kind} data but {schemas.PLAN_FILE} metadata says {kind} "
                           "(data_kind)"], plan
    if (np.diff(s.sample_id) <= 0).any():
        return [*problems, f"{schemas.SAMPLES_FILE} is not sorted by unique sample_id"], plan
    if plan.manifest.samples != len(s):
        problems.append(f"{schemas.PLAN_FILE} metadata: samples is {plan.manifest.samples}, {schemas.SAMPLES_FILE} holds "
                        f"{len(s)}")
    index, recipe_problems = _recipe_index(plan, samples)
    problems += recipe_problems
    found, eval_ids = _eval_problems(plan, s, index)
    problems += found + _eval_copies(plan, samples, eval_ids, index, notes)
    train = s if index is not None else s.take(np.flatnonzero(~np.isin(s.sample_id, eval_ids)))
    if index is not None:  # a recipe's held-out samples are in no dataset (they leave the mixture)
        index = np.where(np.isin(s.sample_id, eval_ids), -1, index)
    found, after, recipe_rows = _epochs_problems(plan, train, index, eval_ids)
    if after is None:  # an epoch could not be read: nothing to recount
        return [*problems, *found], plan
    problems += found + _metrics_problems(plan, metrics, after) + _recipe_metrics_problems(plan, recipe_rows)
    problems += tokenized_problems(plan, samples, fast=fast,
                                   tokens_dir=Path(tokens_dir) if tokens_dir is not None else None)
    return problems, plan


def _file_problems(plan: Plan, dataset_fingerprint: str | None) -> list[str]:
    """What each file says of itself: header, manifest, body digest, schemas, statistics, companions, and the
    given source's dataset fingerprint against the plan's."""
    files, kind = plan.files, plan.manifest.data_kind
    problems = files.header_problems() + files.manifest_problems() + _shared_problems(plan)
    if files.has_rows_digest:  # what the runtime checks at open: the bytes and layout compile wrote
        problems += files.body_problems()
    tables = [(schemas.SAMPLES_FILE, "samples", schemas.samples_schema(bool(plan.settings.mixture), kind)),
              (schemas.METRICS_FILE, "metrics", schemas.metrics_schema(kind)),
              (schemas.PLAN_FILE, "plan", schemas.plan_schema(kind))]
    if files.has_before:
        tables.append((schemas.BEFORE_FILE, "before", schemas.BEFORE_SCHEMA))
    for name, role, schema in tables:
        problems += schema_problems(files.source(name), schema) + statistics_problems(files.source(name))
        if role != "plan":
            problems += files.companion_problems(name, role)
    if dataset_fingerprint is not None and dataset_fingerprint != plan.fingerprints["dataset"]:
        problems.append(f"dataset fingerprint {dataset_fingerprint} of the given source differs from the plan's "
                        f"{plan.fingerprints['dataset']}: the data changed since compile")
    return problems


def _epochs_problems(plan: Plan, train: SampleArrays, index: np.ndarray | None, eval_ids: np.ndarray
                     ) -> tuple[list[str], dict[int, dict[str, Any]] | None, list[dict[str, Any]]]:
    """Every epoch's rows checked against the training samples (a recipe's drawn again from `index`), the epoch's
    figures recounted from them (metrics after each stage; None when an epoch cannot be read, its error last among
    the problems) and a recipe's per-dataset rows."""
    files, kind = plan.files, plan.manifest.data_kind
    problems: list[str] = []
    after: dict[int, dict[str, Any]] = {}
    recipe_rows: list[dict[str, Any]] = []
    rows = 0
    members = pairs.pair_members(train.sample_id, train.pair_id, train.chosen) \
        if index is not None and kind == recount_pairs.PAIRED else None  # the mixture draws pairs whole
    for e in plan.epochs:
        try:
            table = files.read_epoch(e)
        except schemas.StoreError as exc:
            return [*problems, str(exc)], None, recipe_rows
        rows += table.num_rows
        found = files.epoch_problems(e, table) + _held_out_in_training(e, table, eval_ids)
        positions = None if index is None else np.sort(pairs.pair_samples(members, redraw.epoch_positions(
            pairs.per_pair(index, members), plan.settings, e)))
        s_e = train.take(positions) if positions is not None else train
        more, epoch_rows, mb = check_epoch(e, table, s_e, plan.settings)
        problems += sorted(found + more, key=lambda p: " row " not in p)  # those naming a row first
        if epoch_rows is not None and mb is not None:
            per_row = 2 if kind == recount_pairs.PAIRED else 1  # the scan counts pairs, the metrics samples
            after[e] = {**recount.epoch_figures(epoch_rows, mb, len(s_e), recount_pairs.row_settings(plan.settings, kind),
                                                per_row * plan.manifest.dropped_samples,
                                                per_row * plan.manifest.truncated_samples),
                        **recount_pairs.figures(recount_pairs.counts(epoch_rows, s_e, plan.settings), plan.settings)}
            if positions is not None:
                recipe_rows += _dataset_after(e, epoch_rows, s_e, index[positions], plan)
    total = files.row_count()
    if total != rows:
        problems.append(f"{schemas.PLAN_FILE} holds {total} rows, its epochs {plan.epochs[0]}..{plan.epochs[-1]} {rows}")
    return problems, after, recipe_rows
