"""The plan reader's core, `PlanFiles`: a plan directory's files opened once, and the checks that bind them.

A plan directory holds `plan.parquet`, `samples.parquet`, `metrics.parquet`, `before.parquet`, `eval.parquet`
(when samples are held out), `tokens/` and a `manifest.json` mirror. Every Parquet file carries the plan's
fingerprints and settings in its key-value metadata, so one file is self-describing; `plan.parquet` carries the
whole manifest (`plancc.store.manifest`). The plan table is written sorted by (epoch, rank, index) in row groups,
so that one epoch (or one rank's) is read by skipping row groups on their statistics instead of decoding the
whole file.

How the files vouch for each other: `plan.parquet`'s metadata is the root; its settings must hash to the config
fingerprint, each epoch's rows to that epoch's plan fingerprint and the layout of docs/spec.md §4,
`samples.parquet` to the dataset and metadata fingerprints, `metrics.parquet` and `before.parquet` to their
checksums, `eval.parquet` to the eval fingerprint, `tokens/` to the tokens fingerprint; every sibling file's
metadata and `manifest.json` must equal the plan file's. Each check returns a list of problems: `Plan` (the one
plan type, `plancc.store.plan`) raises on the first, `validate` reports them all.
"""

from __future__ import annotations

import os
import weakref
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from plancc.config.settings import PlanSettings
from plancc.core import layout
from plancc.errors import SettingsError
from plancc.store import atomic, parquet_footer, plan_body, redraw, token_store
from plancc.store.file_checks import first_difference, first_row, repeated_sample, schema_problems
from plancc.store.fingerprint import (
    before_checksum,
    config_fingerprint,
    eval_fingerprint,
    metrics_checksum,
    plan_fingerprint,
)
from plancc.store.manifest import EvalSummary, Manifest, ManifestError
from plancc.store.parquet import (
    Held,
    column,
    hold,
    nested_arrays,
    read_file_meta,
    read_samples,
    read_table,
    sample_arrays,
)
from plancc.store.samples import dataset_codes, kind_counts, samples_fingerprints
from plancc.store.schemas import (
    BEFORE_FILE,
    BEFORE_SCHEMA,
    DATASET_COLUMN,
    EVAL_FILE,
    EVAL_SCHEMA,
    KIND_PLAN_FIELDS,
    MANIFEST_FILE,
    METRICS_FILE,
    PAIR_ID_COLUMN,
    PAIR_ROLE_COLUMN,
    PLAN_FILE,
    SAMPLES_FILE,
    SCHEMA_VERSION,
    TOKENS_DIR,
    StoreError,
    metrics_schema,
    plan_schema,
    samples_schema,
)

EPOCH_COLUMNS = ["index", "update", "rank", "micro_step", "sample_ids", "tokens", "label_count", "cost", "num_items",
                 "complete_update"]


def eval_set_problem(ids: np.ndarray, expected: np.ndarray, settings: PlanSettings) -> str | None:
    """What differs between the samples an eval plan holds (`ids`) and the held-out set (`expected`, sorted), or
    None when they are the same set."""
    held = np.sort(ids)
    held = held[np.r_[True, held[1:] != held[:-1]]] if held.size else held
    extra, lacking = np.setdiff1d(held, expected, assume_unique=True), np.setdiff1d(expected, held, assume_unique=True)
    if not (extra.size or lacking.size):
        return None
    first = int(extra[0]) if extra.size else int(lacking[0])
    return (f"holds {extra.size} samples the eval set (eval datasets and the held-out draw of val_set_size "
            f"{settings.val_set_size}, seed {settings.seed}) does not and lacks {lacking.size} it does (first: "
            f"sample_id {first})")


class PlanIntegrityError(StoreError):
    """A plan file's content or metadata does not match what the plan's fingerprints and checksums bind."""


class PlanFiles:
    """A plan directory opened for reading: its files, each opened once, the manifest, and the checks above.

    Opening opens the directory, holds it for reading (a recompile into the same path moves it aside instead of
    removing it: `atomic.hold_for_reading`) and opens each of its files once (`Held`: every later read comes from
    what was opened, so a plan replaced under a reader changes nothing for it), and reads only the plan file's
    footer. `dir_fd`: the directory already open (a spawned DataLoader worker's copy of its parent's). Refuses a
    missing, foreign or other-schema plan file, a file that is not a regular file, and a manifest plancc did not
    write (`Manifest.from_json`). `read_*` read one file; `*_problems` check one file each.
    """

    def __init__(self, path: str | Path, *, dir_fd: int | None = None, threads: bool = True):
        p = Path(path)
        self.threads = threads  # whether Arrow may decode on its worker threads (`parquet.read_table`)
        if p.is_file() and p.name == PLAN_FILE:
            p = p.parent
        self.path = p
        self.plan_file = p / PLAN_FILE
        self._group_starts: np.ndarray | None = None  # the plan file's row group bounds (`read_microbatches`)
        if dir_fd is not None:  # a directory opened elsewhere (a DataLoader worker's, its parent's): held here too
            atomic.hold_for_reading(dir_fd)
        self.dir_fd = self._open_dir(p) if dir_fd is None else dir_fd
        weakref.finalize(self, os.close, self.dir_fd)
        self._files = {name: self._hold(name) for name in (PLAN_FILE, SAMPLES_FILE, METRICS_FILE, BEFORE_FILE,
                                                           MANIFEST_FILE, EVAL_FILE)}
        if self._files[PLAN_FILE] is None:
            raise StoreError(f"{path} is not a plan directory (no {PLAN_FILE}); write one with "
                             "`plancc compile SOURCE -o PLAN_DIR`")
        meta = read_file_meta(self.held(PLAN_FILE))
        if meta.get("kind") != "plan":
            raise PlanIntegrityError(f"{self.plan_file} is a plancc '{meta.get('kind')}' file, not a plan")
        try:
            self.manifest = Manifest.from_json({k: v for k, v in meta.items() if k != "kind"}, str(self.plan_file))
        except ManifestError as exc:
            raise PlanIntegrityError(str(exc)) from None

    @staticmethod
    def _open_dir(p: Path) -> int:
        """The plan directory at `p`, opened and held for reading (`atomic.hold_for_reading`: a recompile into `p`
        then moves it aside instead of removing it). Opened again when `p` was replaced between the open and the
        hold: what is held is a plan that was at `p`, whole."""
        atomic.recover(p)  # a plan an interrupted replace left behind is put back (or finished) before it is read
        for _ in range(16):
            if not p.is_dir():
                raise StoreError(f"{p} is not a plan directory" + ("" if p.exists() else " (it does not exist)"))
            if not (p / PLAN_FILE).exists():
                raise StoreError(f"{p} is not a plan directory (no {PLAN_FILE}); write one with "
                                 "`plancc compile SOURCE -o PLAN_DIR`")
            fd = token_store.open_dir(p, StoreError)
            atomic.hold_for_reading(fd)
            if atomic.is_at(fd, p):
                return fd
            os.close(fd)
        raise StoreError(f"{p} was replaced 16 times while it was being opened; try again")

    def _hold(self, name: str) -> Held | None:
        """`name` opened through the directory opened at init (None when it is absent)."""
        try:
            return hold(self.path / name, dir_fd=self.dir_fd, name=name)
        except StoreError:
            if os.path.lexists(self.path / name):
                raise
            return None

    def held(self, name: str) -> Held:
        """One of the plan's files as opened at init; refused when it was absent."""
        found = self._files.get(name)
        if found is None:
            raise StoreError(f"{self.path / name} does not exist")
        return found

    def source(self, name: str) -> Held | Path:
        """One of the plan's files as opened at init, or its path when it was absent (a reader then names it)."""
        return self._files.get(name) or self.path / name

    # ------------------------------------------------------------ the token store
    @property
    def data_kind(self) -> str:
        """What the plan trains: `sft`, or preference data's `preference` (pairs) or `unpaired_preference` (KTO)
        (docs/preference.md)."""
        return self.manifest.data_kind

    @property
    def kind_columns(self) -> list[str]:
        """The plan table's columns for its `data_kind` (`schemas.KIND_PLAN_FIELDS`; none for SFT)."""
        return [f.name for f in KIND_PLAN_FIELDS.get(self.data_kind, ())]

    def data_problems(self) -> list[str]:
        """`data.tokens` and `fingerprints.tokens` must agree: a plan either ships and binds `tokens/`, or neither."""
        m = self.manifest
        if m.data.tokens == m.binds_tokens:
            return []
        if m.binds_tokens:
            return [f"{self.plan_file} metadata: fingerprints.tokens binds a token store but data.tokens is missing"]
        return [f"{self.plan_file} metadata: data.tokens names a token store that no fingerprints.tokens binds "
                "(written by an older plancc, or edited); recompile the plan"]

    def open_tokens(self) -> token_store.MappedTokens:
        """The plan's token store, `tokens/` in the directory opened at init, refused (`PlanIntegrityError`) unless
        it is the one the plan was compiled with: its digest (constant work: a header hash over its chunk hashes)
        must be `fingerprints.tokens`."""
        problems = self.data_problems()
        if problems or not self.manifest.binds_tokens:
            raise PlanIntegrityError(problems[0] if problems else f"{self.path} ships no token store")
        where, bound = self.path / TOKENS_DIR, self.manifest.fingerprints["tokens"]
        try:
            fd = token_store.open_dir(TOKENS_DIR, token_store.TokenStoreError, dir_fd=self.dir_fd,
                                      shown=f"token store {where}")
        except FileNotFoundError:
            raise PlanIntegrityError(f"{where} does not exist: the plan's token store was deleted or moved") from None
        try:
            m = token_store.open_store(where, fd)
        except token_store.TokenStoreError as exc:
            raise PlanIntegrityError(str(exc)) from None
        finally:
            os.close(fd)
        if m.digest != bound:
            raise PlanIntegrityError(f"{where} is not the token store this plan was compiled with (its digest "
                                     f"{m.digest}, the plan binds {bound}): its tokens were changed and rehashed, or "
                                     "another store was put in its place")
        return m

    # ------------------------------------------------------------ the plan file and its mirrors
    def header_problems(self) -> list[str]:
        """The settings hash to the config fingerprint; the plan fingerprints and epoch summaries name exactly the
        plan's epochs."""
        settings, fingerprints, problems = self.manifest.settings, self.manifest.fingerprints, []
        if config_fingerprint(self.manifest.to_json()["settings"]) != fingerprints.get("config"):
            problems.append(f"{self.plan_file}: its settings do not hash to its config fingerprint (a setting such as "
                            "grad_accum or world_size was edited); recompile the plan")
        epochs = sorted(fingerprints.get("plan", {}))
        if epochs != sorted(str(e) for e in range(settings.epochs)):
            problems.append(f"{self.plan_file}: plan fingerprints for epochs {epochs}, but settings say "
                            f"epochs={settings.epochs}")
        summarized = [e.epoch for e in self.manifest.epochs]
        if summarized != list(range(settings.epochs)):
            problems.append(f"{self.plan_file} metadata: epoch summaries for epochs {summarized}, but settings say "
                            f"epochs={settings.epochs}")
        return problems

    def manifest_problems(self, *, required: bool = True) -> list[str]:
        """`manifest.json` must equal the plan file's metadata (it is its mirror, never read for settings)."""
        path = self.path / MANIFEST_FILE
        if self._files[MANIFEST_FILE] is None:
            return [f"{path} is missing (it mirrors {PLAN_FILE}'s metadata)"] if required else []
        try:
            manifest = orjson.loads(self.held(MANIFEST_FILE).buffer.to_pybytes())
        except orjson.JSONDecodeError as exc:
            return [f"{path} is not valid JSON: {exc}"]
        found = first_difference(manifest, self.manifest.to_json())
        return [f"{path}: {found} differs from {PLAN_FILE}'s metadata"] if found else []

    def companion_problems(self, name: str, kind: str) -> list[str]:
        """A sibling Parquet file's metadata: its kind, and the plan's schema version, fingerprints and settings."""
        path = self.path / name
        try:
            meta = read_file_meta(self.held(name))
        except StoreError as exc:
            return [str(exc)]
        plan = self.manifest.to_json()
        want = {"fingerprints": plan["fingerprints"], "kind": kind, "schema": SCHEMA_VERSION,
                "settings": plan["settings"]}
        found = first_difference(meta, want)
        return [f"{path}: metadata {found} differs from {PLAN_FILE}'s"] if found else []

    # ------------------------------------------------------------ samples and metrics
    def read_samples(self) -> pa.Table:
        """The plan's samples table (check it with `samples_problems`)."""
        return read_samples(self.held(SAMPLES_FILE), threads=self.threads)

    def samples_problems(self, table: pa.Table) -> list[str]:
        """The samples' content against the dataset and metadata fingerprints."""
        return [f"{self.path / SAMPLES_FILE}: its rows do not hash to the plan's {key} fingerprint "
                f"({'token hashes' if key == 'dataset' else 'ids, lengths or label counts'} changed)"
                for key, value in samples_fingerprints(table, self.manifest.scan.identity).items()
                if value != self.manifest.fingerprints.get(key)]

    def read_metrics(self) -> pa.Table:
        """The plan's metrics table (check it with `metrics_problems`)."""
        return read_table(self.held(METRICS_FILE), metrics_schema(), threads=self.threads)

    def metrics_problems(self, table: pa.Table) -> list[str]:
        """The metrics rows against the checksum the plan file records."""
        if metrics_checksum(table.to_pylist()) != self.manifest.checksums.get("metrics"):
            return [f"{self.path / METRICS_FILE}: its rows do not match the metrics checksum in {PLAN_FILE}"]
        return []

    @property
    def has_before(self) -> bool:
        """Whether compile stored the before stage (plans of older plancc versions did not)."""
        return "before" in self.manifest.checksums

    def read_before(self) -> pa.Table:
        """The before stage's label count per microbatch of every epoch, as compile stored it."""
        return read_table(self.held(BEFORE_FILE), BEFORE_SCHEMA, threads=self.threads)

    def before_problems(self, table: pa.Table) -> list[str]:
        """The before rows against the checksum the plan file records, and their (epoch, index) order."""
        epoch, index = column(table, "epoch"), column(table, "index")
        if before_checksum(epoch, column(table, "label_count")) != self.manifest.checksums.get("before"):
            return [f"{self.path / BEFORE_FILE}: its rows do not match the before checksum in {PLAN_FILE}"]
        starts = np.r_[True, epoch[1:] != epoch[:-1]] if epoch.size else np.zeros(0, dtype=bool)
        expected = np.arange(epoch.size) - np.maximum.accumulate(np.where(starts, np.arange(epoch.size), 0))
        if not np.array_equal(index, expected):
            return [f"{self.path / BEFORE_FILE}: rows are not in (epoch, index) order"]
        return []

    def before_labels(self, epoch: int, table: pa.Table | None = None) -> np.ndarray | None:
        """The before stage's label count per microbatch of `epoch` (None for a plan that did not store it)."""
        if not self.has_before:
            return None
        table = self.read_before() if table is None else table
        epochs = column(table, "epoch")
        return column(table, "label_count")[epochs == epoch]

    # ------------------------------------------------------------ eval plan
    def read_eval(self) -> pa.Table:
        """The eval plan's rows in file (= index) order (check them with `eval_problems`)."""
        return read_table(self.source(EVAL_FILE), EVAL_SCHEMA, columns=EVAL_SCHEMA.names, threads=self.threads)

    def eval_problems(self, table: pa.Table) -> list[str]:
        """The eval rows against their layout (index, rank = index % world_size), the eval fingerprint and the
        manifest's eval summary (its global target count is what the eval loss divides by)."""
        path, n, W = self.path / EVAL_FILE, table.num_rows, self.manifest.settings.world_size
        cols = {name: column(table, name) for name in EVAL_SCHEMA.names if name != "sample_ids"}
        ids, row_bounds, batch_bounds = nested_arrays(table.column("sample_ids"))
        cols.update(sample_ids=ids, row_bounds=row_bounds, batch_bounds=batch_bounds)
        problems = []
        for name, want, why in (("index", np.arange(n), "the row's position"),
                                ("rank", layout.ranks(n, W), f"index % world_size = index % {W}")):
            bad = cols[name] != want
            if bad.any():
                i = first_row(bad)
                problems.append(f"{path} row {i}: {name} is {cols[name][i]}, but {why} gives {want[i]}")
        if eval_fingerprint(cols) != self.manifest.fingerprints.get("eval"):
            problems.append(f"{path}: its {n} rows do not hash to the plan's eval fingerprint (rows edited, deleted, "
                            "reordered or samples exchanged)")
        recorded = self.manifest.eval.to_json() if self.manifest.eval is not None else None
        counts = None
        if self.data_kind != "sft":  # what a preference loss divides the eval set's sum by: from the samples held out
            held = sample_arrays(self.read_samples())
            counts = kind_counts(held.take(np.searchsorted(held.sample_id, ids)))
        found = first_difference(recorded, EvalSummary.of(cols, W, counts).to_json())
        if found:
            problems.append(f"{self.plan_file} metadata: eval.{found} (recomputed from {EVAL_FILE})")
        return problems

    def eval_draw_problems(self, table: pa.Table) -> list[str]:
        """The eval rows must hold exactly the samples compile held out: the draw made again from the samples
        table's ids and the settings (`redraw.eval_ids`). Rows swapped for training samples, with the eval
        fingerprint and summary recomputed into every file, hash consistently but are not that draw."""
        s = self.manifest.settings
        paired = self.data_kind == "preference"
        columns = ["sample_id", *([DATASET_COLUMN] if s.mixture else []),
                   *([PAIR_ID_COLUMN, PAIR_ROLE_COLUMN] if paired else [])]
        try:
            samples = read_table(self.held(SAMPLES_FILE), samples_schema(bool(s.mixture), self.data_kind),
                                 columns=columns, threads=self.threads)
            index = redraw.dataset_index(*dataset_codes(samples), s) if s.mixture else None
            ids = column(samples, "sample_id")
            expected = (redraw.eval_ids(ids, s, index) if not paired else redraw.pair_eval_ids(
                ids, column(samples, PAIR_ID_COLUMN), pc.equal(samples.column(PAIR_ROLE_COLUMN), "chosen").to_numpy(),
                s, index))
        except (StoreError, SettingsError, KeyError) as exc:
            return [f"{self.path / EVAL_FILE}: the held-out draw cannot be made again ({exc})"]
        found = eval_set_problem(nested_arrays(table.column("sample_ids"))[0], expected, s)
        return [f"{self.path / EVAL_FILE}: {found}"] if found else []

    # ------------------------------------------------------------ plan rows
    @property
    def has_rows_digest(self) -> bool:
        """Whether the plan file carries its body digest (`plan_body`): then `body_problems` vouches for every row
        and `read_ranks` reads one rank's; plans of earlier plancc versions are verified epoch by epoch."""
        return plan_body.has_digest(self.held(PLAN_FILE))

    def body_problems(self) -> list[str]:
        """Every row of every epoch as compile wrote it, without decoding them (`plan_body.body_problems`), and each
        epoch's row count (its `epoch` column) as the manifest's `epochs[e].batches`, what samplers size epochs by."""
        held = self.held(PLAN_FILE)
        schema = plan_schema(self.data_kind)
        problems = schema_problems(held, schema) or plan_body.body_problems(held, len(schema))
        if problems:
            return problems
        try:
            epoch = column(held.parquet().read(columns=["epoch"], use_threads=self.threads), "epoch")
        except (pa.ArrowException, OSError, ValueError) as exc:
            return [f"{self.plan_file} is corrupt: {exc}"]
        want = np.array([e.batches for e in self.manifest.epochs], dtype=np.int64)
        got = np.bincount(epoch.clip(0, want.size), minlength=want.size + 1)
        if (epoch.size and (np.any(np.diff(epoch) < 0) or epoch[0] < 0)) or got[-1] or not np.array_equal(got[:-1], want):
            return [f"{self.plan_file}: its epochs hold {got[:-1].tolist()} rows (and {int(got[-1])} of other epochs), "
                    f"its metadata's epochs[].batches say {want.tolist()}"]
        return []

    def read_microbatches(self, epoch: int, indices: np.ndarray, columns: list[str]) -> pa.Table:
        """Rows of the global microbatch `indices` (ascending) of `epoch`, in that order, decoding only the row
        groups that hold them (a rank's own rows are a block of the file: `plan_body`). Each row's epoch and index
        are checked against where the layout puts it (`PlanIntegrityError` otherwise)."""
        batches = [e.batches for e in self.manifest.epochs]
        held = self.held(PLAN_FILE)
        if self._group_starts is None:
            try:
                self._group_starts = plan_body.group_starts(plan_body.groups(held))
            except parquet_footer.FooterError as exc:
                raise PlanIntegrityError(f"{self.plan_file}: its footer is damaged ({exc})") from None
        starts = self._group_starts
        pos = sum(batches[:epoch]) + layout.rank_order_positions(indices, batches[epoch],
                                                                 self.manifest.settings.world_size)
        group = np.searchsorted(starts, pos, "right") - 1
        groups = np.flatnonzero(np.bincount(group, minlength=1))  # not np.unique: it imports numpy.ma
        before = np.concatenate([[0], np.cumsum(np.diff(starts)[groups])])  # rows read before each group
        local = pos - starts[group] + before[np.searchsorted(groups, group)]
        try:
            table = held.parquet().read_row_groups(groups.tolist(), columns=sorted({*columns, "epoch", "index"}),
                                                   use_threads=False)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise PlanIntegrityError(f"{self.plan_file} is corrupt: {exc}") from None
        contiguous = bool(np.all(np.diff(local) == 1))  # one rank's own rows: a slice, no copy
        table = table.slice(int(local[0]) if local.size else 0, local.size) if contiguous else table.take(local)
        if not (np.array_equal(column(table, "index"), indices) and bool(np.all(column(table, "epoch") == epoch))):
            raise PlanIntegrityError(f"{self.plan_file}: the rows of epoch {epoch} are not where the layout puts them "
                                     "(the file was edited)")
        return table.select(columns)

    def read_rows(self, columns: list[str] | None = None, filters: list[tuple] | None = None) -> pa.Table:
        """Plan rows matching Parquet `filters` on the plan columns (row groups skipped on their statistics), in
        file order: (epoch, rank, index)."""
        return read_table(self.held(PLAN_FILE), plan_schema(self.data_kind), columns=columns, filters=filters,
                          threads=self.threads)

    def row_count(self) -> int:
        """Rows of the plan file, all epochs, from its footer (`validate` compares it with the epochs' rows)."""
        return self.held(PLAN_FILE).parquet().metadata.num_rows

    def read_epoch(self, epoch: int, columns: list[str] | None = None) -> pa.Table:
        """One epoch's rows in global order (a filtered read: the same one the runtime verifies and replays)."""
        table = read_table(self.held(PLAN_FILE), plan_schema(self.data_kind),
                           columns=columns or EPOCH_COLUMNS + self.kind_columns,
                           filters=[("epoch", "=", int(epoch))], threads=self.threads)
        index = column(table, "index")
        if index.shape[0] > 1 and not bool(np.all(index[1:] > index[:-1])):
            table = table.take(pc.sort_indices(table, [("index", "ascending")]))
        return table

    def epoch_problems(self, epoch: int, table: pa.Table) -> list[str]:
        """One epoch's rows (`EPOCH_COLUMNS`, global order) against the layout of docs/spec.md §4 and the plan fingerprint.

        The layout names the first row that breaks it (index, update/rank/micro_step, the update's `num_items` as
        the sum of its label counts, `complete_update`); rows that keep it but differ from what was compiled
        (samples exchanged, ids or counts edited consistently) fail the fingerprint, which covers every column.
        """
        settings = self.manifest.settings
        W, G, P = settings.world_size, settings.grad_accum, settings.batches_per_update
        n = table.num_rows
        cols = {name: column(table, name) for name in EPOCH_COLUMNS + self.kind_columns if name != "sample_ids"}
        update, rank, micro_step = layout.update_mapping(n, W, G)
        expect = {
            "index": (np.arange(n), "the row's position in the epoch"),
            "update": (update, f"index // (world_size*grad_accum) = index // {P}"),
            "rank": (rank, f"index % world_size = index % {W}"),
            "micro_step": (micro_step, f"(index % {P}) // {W}"),
            "num_items": (layout.num_items(cols["label_count"], W, G), "the sum of its update's label_count"),
            "complete_update": (layout.in_complete_update(n, W, G), f"whether its update holds all {P} rows"),
        }
        problems = []
        for name, (want, why) in expect.items():
            bad = cols[name] != want
            if bad.any():
                i = first_row(bad)
                problems.append(f"{self.plan_file} epoch {epoch} row {i}: {name} is {cols[name][i]}, but {why} "
                                f"gives {want[i]} ({int(bad.sum())} rows differ)")
        ids, row_bounds, batch_bounds = nested_arrays(table.column("sample_ids"))
        recorded = self.manifest.fingerprints["plan"].get(str(epoch))
        nested = {"sample_ids": ids, "row_bounds": row_bounds, "batch_bounds": batch_bounds}
        if plan_fingerprint({**cols, **nested}) != recorded:
            plain = not problems and not settings.mixture  # a recipe's epoch may hold a sample twice
            again = repeated_sample(ids, row_bounds[batch_bounds]) if plain else None  # names a row
            if again is not None:
                problems.append(f"{self.plan_file} epoch {epoch} row {again[0]}: sample_id {again[1]} again "
                                f"(already in row {again[2]})")
            problems.append(f"{self.plan_file} epoch {epoch}: its {n} rows do not hash to the epoch's plan "
                            "fingerprint (rows edited, deleted, reordered or samples exchanged)")
        summary = self.manifest.epochs[epoch] if 0 <= epoch < len(self.manifest.epochs) else None
        if summary is None or summary.batches != n:
            problems.append(f"{self.plan_file} metadata: epochs[{epoch}].batches is "
                            f"{summary.batches if summary else None}, the epoch holds {n} rows")
        return problems
