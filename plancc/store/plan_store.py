"""The verified plan reader, `PlanDir`: every file of a plan checked against what its plan file binds.

A plan directory holds `plan.parquet`, `samples.parquet`, `metrics.parquet` and a `manifest.json` mirror. Every
Parquet file carries the plan's fingerprints and settings in its key-value metadata, so one file is
self-describing; `plan.parquet` carries the whole manifest. The plan table is written sorted by (epoch, rank, index)
in row groups, so that one epoch (or one rank's) is read by skipping row groups on their statistics instead of
decoding the whole file. `PlanDir` (end of this module) is the verified reader: every file is checked against what
the plan file's fingerprints and checksums bind.
"""


from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from plancc.config.settings import PlanSettings
from plancc.core import layout
from plancc.errors import SettingsError
from plancc.store import atomic, token_store
from plancc.store.fingerprint import (
    before_checksum,
    config_fingerprint,
    eval_fingerprint,
    metrics_checksum,
    plan_fingerprint,
)
from plancc.store.parquet import (
    Held,
    as_held,
    column,
    hold,
    open_parquet,
    read_file_meta,
    read_samples,
    read_table,
    sample_arrays,
)
from plancc.store.plan_files import eval_summary, kind_counts, samples_fingerprints
from plancc.store.scan_record import ScanRecord
from plancc.store.schemas import (
    BEFORE_FILE,
    BEFORE_SCHEMA,
    EVAL_FILE,
    EVAL_SCHEMA,
    KIND_PLAN_FIELDS,
    MANIFEST_FILE,
    METRICS_FILE,
    PLAN_FILE,
    SAMPLES_FILE,
    SCHEMA_VERSION,
    TOKENS_DIR,
    StoreError,
    metrics_schema,
    plan_schema,
)

# ---------------------------------------------------------------- verified reading (PlanDir)
#
# How the files of a plan vouch for each other: `plan.parquet`'s metadata is the root (the manifest, with the
# fingerprints and settings); its settings must hash to the config fingerprint, each epoch's rows to that epoch's
# plan fingerprint and the layout of docs/spec.md §4; `samples.parquet` must hash to the dataset and metadata fingerprints,
# `metrics.parquet` to the metrics checksum; every sibling file's metadata and `manifest.json` must equal the
# plan file's. Checks return lists of problems (validate reports them all; the runtime raises on the first).

PLAN_META_KEYS = ("checksums", "data", "epochs", "fingerprints", "kind", "plancc", "samples", "scan", "schema",
                  "settings")
EPOCH_COLUMNS = ["index", "update", "rank", "micro_step", "sample_ids", "tokens", "label_count", "cost", "num_items",
                 "complete_update"]


class PlanIntegrityError(StoreError):
    """A plan file's content or metadata does not match what the plan's fingerprints and checksums bind."""


_META_TYPES = {"checksums": dict, "data": dict, "epochs": list, "fingerprints": dict, "scan": dict, "settings": dict,
               "samples": int}


def meta_shape_problem(meta: dict[str, Any]) -> str | None:
    """What in a plan file's metadata has the wrong shape (`data = []`, `data.tokens = 5`, `fingerprints.plan =
    "x"`), else None: readers index into these values, so a wrong type would be a traceback, not a message."""
    for key, type_ in _META_TYPES.items():
        if not isinstance(meta[key], type_) or isinstance(meta[key], bool):
            return f"{key} is {meta[key]!r}, expected {'an object' if type_ is dict else 'a ' + type_.__name__}"
    data, fingerprints = meta["data"], meta["fingerprints"]
    if "tokens" in data and data["tokens"] != TOKENS_DIR:
        return (f"data.tokens is {data['tokens']!r}; a plan's token store is always its {TOKENS_DIR!r} folder (plancc "
                "reads no other path from a plan)")
    for key in ("source", "source_relative"):
        if key in data and not (isinstance(data[key], list) and all(isinstance(p, str) for p in data[key])):
            return f"data.{key} is {data[key]!r}, expected a list of paths"
    if not isinstance(fingerprints.get("plan"), dict):
        return f"fingerprints.plan is {fingerprints.get('plan')!r}, expected an object (epoch: fingerprint)"
    if "tokens" in fingerprints and not isinstance(fingerprints["tokens"], str):
        return f"fingerprints.tokens is {fingerprints['tokens']!r}, expected the token store's digest (a string)"
    return None


def nested_arrays(sample_ids: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(flat sample ids, row bounds, batch bounds) of a `list<list<int64>>` column, without a Python loop."""
    batches = sample_ids.combine_chunks() if isinstance(sample_ids, pa.ChunkedArray) else sample_ids
    rows = batches.flatten()
    batch_bounds = np.asarray(batches.offsets, dtype=np.int64) - batches.offsets[0].as_py()
    row_bounds = np.asarray(rows.offsets, dtype=np.int64) - rows.offsets[0].as_py()
    return rows.flatten().to_numpy().astype(np.int64), row_bounds, batch_bounds


def first_difference(got: Any, want: Any, where: str = "") -> str | None:
    """Path of the first place two JSON values differ (`settings.grad_accum`, `epochs[0].batches`), else None."""
    if isinstance(got, dict) and isinstance(want, dict):
        for key in sorted(set(got) | set(want)):
            if key not in got or key not in want:
                return f"{where}{key} ({'missing' if key not in got else 'unexpected'})"
            found = first_difference(got[key], want[key], f"{where}{key}.")
            if found:
                return found
        return None
    if isinstance(got, list) and isinstance(want, list):
        for i, (a, b) in enumerate(zip(got, want, strict=False)):
            found = first_difference(a, b, f"{where.rstrip('.')}[{i}].")
            if found:
                return found
        return None if len(got) == len(want) else f"{where.rstrip('.')} (length {len(got)}, expected {len(want)})"
    if got == want and type(got) is type(want):
        return None
    return f"{where.rstrip('.')} ({got!r}, expected {want!r})"


def schema_problems(source: Path | Held, expected: pa.Schema) -> list[str]:
    """Columns, types and nullability of a Parquet file against its schema (stricter than `read_table`)."""
    try:
        held = as_held(source)
        path, got = held.path, held.parquet().schema_arrow
    except StoreError as exc:
        return [str(exc)]
    if got.names != expected.names:
        return [f"{path}: columns {got.names}, expected {expected.names}"]
    return [f"{path}: column '{f.name}' is {g.type} (nullable {g.nullable}), expected {f.type} (nullable {f.nullable})"
            for f, g in zip(expected, got, strict=True) if not (g.type.equals(f.type) and g.nullable == f.nullable)]


def statistics_problems(source: Path | Held) -> list[str]:
    """Row-group statistics of every column against the values they describe.

    Filtered reads (one epoch, one rank) skip row groups on their min/max, so a wrong statistic would hide rows
    from some reader while a full read looks sound. plancc writes statistics for every column; a column with
    values but without min/max was changed too.
    """
    path = source.path if isinstance(source, Held) else source
    try:
        pf = open_parquet(source)
        md = pf.metadata
        problems = []
        for i in range(md.num_row_groups):
            group = md.row_group(i)
            table = pf.read_row_group(i)
            for j in range(group.num_columns):
                meta = group.column(j)
                values = table.column(meta.path_in_schema.split(".")[0]).combine_chunks()
                nested = pa.types.is_list(values.type)
                while pa.types.is_list(values.type):
                    values = values.flatten()
                st = meta.statistics
                present = len(values) - values.null_count
                if st is None or (present and not st.has_min_max):
                    problems.append(f"{path} row group {i} column {meta.path_in_schema}: statistics are missing")
                    continue
                bounds = pc.min_max(values)
                checks = [("values", st.num_values, present)]
                if not nested:
                    checks.append(("nulls", st.null_count, values.null_count))
                if present:
                    checks += [("min", st.min, bounds["min"].as_py()), ("max", st.max, bounds["max"].as_py())]
                problems += [f"{path} row group {i} column {meta.path_in_schema}: statistics {what} is {got!r}, its "
                             f"values give {want!r}" for what, got, want in checks if got != want][:1]
        return problems
    except StoreError as exc:
        return [str(exc)]
    except (pa.ArrowException, OSError, ValueError, KeyError) as exc:  # a column name changed: Key/ValueError
        return [f"{path} is corrupt: {exc}"]


@dataclass(frozen=True)
class EpochMicrobatches:
    """One epoch's microbatches (optionally one rank's share) in global order, as flat CSR arrays.

    Microbatch `i` holds rows `row_bounds[batch_bounds[i]:batch_bounds[i+1]]`; row `r` holds the sample ids
    `sample_ids[row_bounds[r]:row_bounds[r+1]]`. `index` is its global position in the epoch; `update`, `rank`,
    `micro_step` say where it runs.
    """

    index: np.ndarray
    update: np.ndarray
    rank: np.ndarray
    micro_step: np.ndarray
    sample_ids: np.ndarray
    row_bounds: np.ndarray
    batch_bounds: np.ndarray

    def __len__(self) -> int:
        return len(self.update)

    def __getitem__(self, i: int) -> list[list[int]]:
        """Microbatch `i` of the share as its rows of sample ids."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"microbatch {i} out of range (0..{len(self) - 1})")
        i %= len(self)
        r0, r1 = int(self.batch_bounds[i]), int(self.batch_bounds[i + 1])
        return [self.sample_ids[self.row_bounds[r]:self.row_bounds[r + 1]].tolist() for r in range(r0, r1)]


def _first_row(bad: np.ndarray) -> int:
    return int(np.flatnonzero(bad)[0])


class PlanDir:
    """A plan directory opened for reading, with the checks that bind its files together (see above).

    Opening opens the directory and each of its files once (`Held`: every later read comes from what was opened, so
    a plan replaced under a reader changes nothing for it) and reads only the plan file's footer: refuses a
    missing, foreign or other-schema plan file, a file that is not a regular file, metadata without the manifest's
    keys or of the wrong shape, and types the settings (`PlanSettings`). The `*_problems` methods check one file
    each; `read_epoch` + `epoch_problems` check one epoch's rows against the layout and the plan fingerprint.
    """

    def __init__(self, path: str | Path):
        p = Path(path)
        if p.is_file() and p.name == PLAN_FILE:
            p = p.parent
        atomic.recover(p)  # a plan an interrupted replace left behind is put back (or finished) before it is read
        if not p.is_dir():
            raise StoreError(f"{path} is not a plan directory" + ("" if p.exists() else " (it does not exist)"))
        if not (p / PLAN_FILE).exists():
            raise StoreError(f"{path} is not a plan directory (no {PLAN_FILE}); write one with "
                             "`plancc compile SOURCE -o PLAN_DIR`")
        self.path = p
        self.plan_file = p / PLAN_FILE
        self._dir_fd = token_store.open_dir(p, StoreError)
        weakref.finalize(self, os.close, self._dir_fd)
        self._files = {name: self._hold(name) for name in (PLAN_FILE, SAMPLES_FILE, METRICS_FILE, BEFORE_FILE,
                                                           MANIFEST_FILE, EVAL_FILE)}
        self.meta: dict[str, Any] = read_file_meta(self.held(PLAN_FILE))
        if self.meta.get("kind") != "plan":
            raise PlanIntegrityError(f"{self.plan_file} is a plancc '{self.meta.get('kind')}' file, not a plan")
        missing = sorted(set(PLAN_META_KEYS) - set(self.meta))
        if missing:
            raise PlanIntegrityError(f"{self.plan_file}: metadata lacks {missing} (written by an older plancc, or "
                                     "edited); recompile the plan")
        shape = meta_shape_problem(self.meta)
        if shape:
            raise PlanIntegrityError(f"{self.plan_file} metadata: {shape}; recompile the plan")
        self.fingerprints: dict[str, Any] = self.meta["fingerprints"]
        try:
            self.settings = PlanSettings(**self.meta["settings"])
        except (TypeError, SettingsError) as exc:
            raise PlanIntegrityError(f"{self.plan_file}: settings this plancc cannot use ({exc})") from None

    def _hold(self, name: str) -> Held | None:
        """`name` opened through the directory opened at init (None when it is absent)."""
        try:
            return hold(self.path / name, dir_fd=self._dir_fd, name=name)
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

    @property
    def data(self) -> dict[str, Any]:
        """What compile recorded of the trainer's data, for people: {"tokens": "tokens" (the token store folder in
        this directory), "source": [paths], "source_relative": [paths]}. Readers never follow these paths: the token
        store is `tokens/` (bound by `fingerprints.tokens`) or what the caller gives."""
        return self.meta["data"]

    @property
    def data_kind(self) -> str:
        """What the plan trains: `sft`, or preference data's `preference` (pairs) or `unpaired_preference` (KTO)
        (docs/preference.md)."""
        return self.meta.get("data_kind", "sft")

    @property
    def kind_columns(self) -> list[str]:
        """The plan table's columns for its `data_kind` (`schemas.KIND_PLAN_FIELDS`; none for SFT)."""
        return [f.name for f in KIND_PLAN_FIELDS.get(self.data_kind, ())]

    @property
    def binds_tokens(self) -> bool:
        """Whether the plan ships a token store (its digest is `fingerprints.tokens`)."""
        return "tokens" in self.fingerprints

    def data_problems(self) -> list[str]:
        """`data.tokens` and `fingerprints.tokens` must agree: a plan either ships and binds `tokens/`, or neither."""
        if ("tokens" in self.data) == self.binds_tokens:
            return []
        if self.binds_tokens:
            return [f"{self.plan_file} metadata: fingerprints.tokens binds a token store but data.tokens is missing"]
        return [f"{self.plan_file} metadata: data.tokens names a token store that no fingerprints.tokens binds "
                "(written by an older plancc, or edited); recompile the plan"]

    def open_tokens(self) -> token_store.MappedTokens:
        """The plan's token store, `tokens/` in the directory opened at init, refused (`PlanIntegrityError`) unless
        it is the one the plan was compiled with: its digest (constant work: a header hash over its chunk hashes)
        must be `fingerprints.tokens`."""
        problems = self.data_problems()
        if problems or not self.binds_tokens:
            raise PlanIntegrityError(problems[0] if problems else f"{self.path} ships no token store")
        where = self.path / TOKENS_DIR
        try:
            fd = token_store.open_dir(TOKENS_DIR, token_store.TokenStoreError, dir_fd=self._dir_fd,
                                      shown=f"token store {where}")
        except FileNotFoundError:
            raise PlanIntegrityError(f"{where} does not exist: the plan's token store was deleted or moved") from None
        try:
            m = token_store.open_store(where, fd)
        except token_store.TokenStoreError as exc:
            raise PlanIntegrityError(str(exc)) from None
        finally:
            os.close(fd)
        if m.digest != self.fingerprints["tokens"]:
            raise PlanIntegrityError(f"{where} is not the token store this plan was compiled with (its digest "
                                     f"{m.digest}, the plan binds {self.fingerprints['tokens']}): its tokens were "
                                     "changed and rehashed, or another store was put in its place")
        return m

    def header_problems(self) -> list[str]:
        """The settings hash to the config fingerprint and the plan fingerprints name exactly the plan's epochs."""
        problems = []
        if config_fingerprint(self.meta["settings"]) != self.fingerprints.get("config"):
            problems.append(f"{self.plan_file}: its settings do not hash to its config fingerprint (a setting such as "
                            "grad_accum or world_size was edited); recompile the plan")
        epochs = sorted(self.fingerprints.get("plan", {}))
        if epochs != sorted(str(e) for e in range(self.settings.epochs)):
            problems.append(f"{self.plan_file}: plan fingerprints for epochs {epochs}, but settings say "
                            f"epochs={self.settings.epochs}")
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
        found = first_difference(manifest, {k: v for k, v in self.meta.items() if k != "kind"})
        return [f"{path}: {found} differs from {PLAN_FILE}'s metadata"] if found else []

    def companion_problems(self, name: str, kind: str) -> list[str]:
        """A sibling Parquet file's metadata: its kind, and the plan's schema version, fingerprints and settings."""
        path = self.path / name
        try:
            meta = read_file_meta(self.held(name))
        except StoreError as exc:
            return [str(exc)]
        want = {"fingerprints": self.fingerprints, "kind": kind, "schema": SCHEMA_VERSION,
                "settings": self.meta["settings"]}
        found = first_difference(meta, want)
        return [f"{path}: metadata {found} differs from {PLAN_FILE}'s"] if found else []

    # ------------------------------------------------------------ samples and metrics
    def read_samples(self) -> pa.Table:
        """The plan's samples table (check it with `samples_problems`)."""
        return read_samples(self.held(SAMPLES_FILE))

    def samples_problems(self, table: pa.Table) -> list[str]:
        """The samples' content against the dataset and metadata fingerprints."""
        return [f"{self.path / SAMPLES_FILE}: its rows do not hash to the plan's {key} fingerprint "
                f"({'token hashes' if key == 'dataset' else 'ids, lengths or label counts'} changed)"
                for key, value in samples_fingerprints(table, self.scan_record.identity).items()
                if value != self.fingerprints.get(key)]

    @property
    def scan_record(self) -> ScanRecord:
        """How the plan's samples were made (the manifest's `scan` entry)."""
        return ScanRecord.from_json(self.meta.get("scan") or {}, f"{self.plan_file} metadata scan")

    def read_metrics(self) -> pa.Table:
        """The plan's metrics table (check it with `metrics_problems`)."""
        return read_table(self.held(METRICS_FILE), metrics_schema())

    def metrics_problems(self, table: pa.Table) -> list[str]:
        """The metrics rows against the checksum the plan file records."""
        if metrics_checksum(table.to_pylist()) != self.meta["checksums"].get("metrics"):
            return [f"{self.path / METRICS_FILE}: its rows do not match the metrics checksum in {PLAN_FILE}"]
        return []

    @property
    def has_before(self) -> bool:
        """Whether compile stored the before stage (plans of older plancc versions did not)."""
        return "before" in self.meta["checksums"]

    def read_before(self) -> pa.Table:
        """The before stage's label count per microbatch of every epoch, as compile stored it."""
        return read_table(self.held(BEFORE_FILE), BEFORE_SCHEMA)

    def before_problems(self, table: pa.Table) -> list[str]:
        """The before rows against the checksum the plan file records, and their (epoch, index) order."""
        epoch, index = column(table, "epoch"), column(table, "index")
        if before_checksum(epoch, column(table, "label_count")) != self.meta["checksums"].get("before"):
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
    @property
    def has_eval(self) -> bool:
        """Whether the plan holds an eval plan (compiled with held-out samples)."""
        return "eval" in self.fingerprints

    def read_eval(self) -> pa.Table:
        """The eval plan's rows in file (= index) order (check them with `eval_problems`)."""
        return read_table(self.source(EVAL_FILE), EVAL_SCHEMA, columns=EVAL_SCHEMA.names)

    def eval_problems(self, table: pa.Table) -> list[str]:
        """The eval rows against their layout (index, rank = index % world_size), the eval fingerprint and the
        manifest's eval summary (its global target count is what the eval loss divides by)."""
        path, n, W = self.path / EVAL_FILE, table.num_rows, self.settings.world_size
        cols = {name: column(table, name) for name in EVAL_SCHEMA.names if name != "sample_ids"}
        ids, row_bounds, batch_bounds = nested_arrays(table.column("sample_ids"))
        cols.update(sample_ids=ids, row_bounds=row_bounds, batch_bounds=batch_bounds)
        problems = []
        for name, want, why in (("index", np.arange(n), "the row's position"),
                                ("rank", layout.ranks(n, W), f"index % world_size = index % {W}")):
            bad = cols[name] != want
            if bad.any():
                i = _first_row(bad)
                problems.append(f"{path} row {i}: {name} is {cols[name][i]}, but {why} gives {want[i]}")
        if eval_fingerprint(cols) != self.fingerprints.get("eval"):
            problems.append(f"{path}: its {n} rows do not hash to the plan's eval fingerprint (rows edited, deleted, "
                            "reordered or samples exchanged)")
        kinds = None
        if self.data_kind != "sft":  # what a preference loss divides the eval set's sum by: from the samples held out
            held = sample_arrays(self.read_samples())
            kinds = kind_counts(held.take(np.searchsorted(held.sample_id, ids)))
        found = first_difference(self.meta.get("eval"), eval_summary(cols, W, kinds))
        if found:
            problems.append(f"{self.plan_file} metadata: eval.{found} (recomputed from {EVAL_FILE})")
        return problems

    # ------------------------------------------------------------ plan rows
    def read_rows(self, columns: list[str] | None = None, filters: list[tuple] | None = None) -> pa.Table:
        """Plan rows matching Parquet `filters` on the plan columns (row groups skipped on their statistics), in
        file order: (epoch, rank, index)."""
        return read_table(self.held(PLAN_FILE), plan_schema(self.data_kind), columns=columns, filters=filters)

    def read_share(self, epoch: int, rank: int | None = None) -> EpochMicrobatches:
        """The microbatches of `epoch` (only those of `rank` when given) in global order, as flat CSR arrays."""
        filters = [("epoch", "=", int(epoch))] + ([] if rank is None else [("rank", "=", int(rank))])
        table = self.read_rows(["index", "update", "rank", "micro_step", "sample_ids"], filters)
        table = table.take(pc.sort_indices(table, [("index", "ascending")]))
        flat, row_bounds, batch_bounds = nested_arrays(table.column("sample_ids"))
        return EpochMicrobatches(*(column(table, c) for c in ("index", "update", "rank", "micro_step")),
                                 flat, row_bounds, batch_bounds)

    def read_epoch(self, epoch: int, columns: list[str] | None = None) -> pa.Table:
        """One epoch's rows in global order (a filtered read: the same one the runtime verifies and replays)."""
        table = read_table(self.held(PLAN_FILE), plan_schema(self.data_kind),
                           columns=columns or EPOCH_COLUMNS + self.kind_columns, filters=[("epoch", "=", int(epoch))])
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
        W, G, P = self.settings.world_size, self.settings.grad_accum, self.settings.batches_per_update
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
                i = _first_row(bad)
                problems.append(f"{self.plan_file} epoch {epoch} row {i}: {name} is {cols[name][i]}, but {why} "
                                f"gives {want[i]} ({int(bad.sum())} rows differ)")
        ids, row_bounds, batch_bounds = nested_arrays(table.column("sample_ids"))
        recorded = self.fingerprints.get("plan", {}).get(str(epoch))
        nested = {"sample_ids": ids, "row_bounds": row_bounds, "batch_bounds": batch_bounds}
        if plan_fingerprint({**cols, **nested}) != recorded:
            plain = not problems and not self.settings.mixture  # a recipe's epoch may hold a sample twice
            again = repeated_sample(ids, row_bounds[batch_bounds]) if plain else None  # names a row
            if again is not None:
                problems.append(f"{self.plan_file} epoch {epoch} row {again[0]}: sample_id {again[1]} again "
                                f"(already in row {again[2]})")
            problems.append(f"{self.plan_file} epoch {epoch}: its {n} rows do not hash to the epoch's plan "
                            "fingerprint (rows edited, deleted, reordered or samples exchanged)")
        return problems


def repeated_sample(ids: np.ndarray, batch_starts: np.ndarray) -> tuple[int, int, int] | None:
    """(row, sample id, earlier row) of the first sample an epoch holds twice, or None (a sound plan).

    `ids` are the epoch's sample ids in plan order, `batch_starts` the position of each row's first id.
    """
    again = np.ones(ids.shape[0], dtype=bool)
    again[np.unique(ids, return_index=True)[1]] = False
    if not again.any():
        return None
    at = _first_row(again)
    first = int(np.flatnonzero(ids == ids[at])[0])
    row, earlier = np.searchsorted(batch_starts, [at, first], side="right") - 1
    return int(row), int(ids[at]), int(earlier)
