"""The tokenized dataset a plan points at, as flat arrays the collator slices by sample id.

`sample_id` is the row of the tokenized dataset. Every column is one flat array plus CSR offsets, so fetching a
microbatch's tokens is one vectorized gather, whatever the number of samples::

    input_ids = [5, 6, 7, 8, 9, 1, 2]      all samples' tokens, concatenated
    offsets   = [0, 3, 5, 7]               sample 1 = input_ids[3:5]

A plan's data is its token store (`plancc.store.token_store`, the `tokens/` folder a compile writes; one store or the
parts of a sharded scan, mapped as one dataset): the arrays are
memory maps, so opening costs the same for 1M or 10B tokens, the ranks of a node share the pages through the OS
page cache, and a process's memory grows only with what it reads. `targets` is the label column the plan's shift
reads (the store's `labels`, already shifted under shift `none`). Other data (`data=` a file of a type a scan reads,
`plancc.store.data_files`; a `datasets.save_to_disk` folder, an Arrow table, or an older plan's `tokenized.parquet`)
is read into memory, as before the store existed.

The data is the plan's own `tokens/` (opened with the plan, its digest compared with the `fingerprints.tokens` the
plan binds) or what the caller gives (`data=`); no path is ever read from the plan's metadata.

Checks (`verify`): "chunks" (default) checks at open what costs nothing (the store's files, sizes and chunk index,
and that it is the store the plan binds: its digest), then each chunk's hash the first time the collator reads a
sample of it, before any of its tokens reach a batch; a changed chunk is refused naming the first planned sample
that differs. "hash" rehashes everything at open (every chunk, and every planned sample against the plan's
`token_hash`: the dataset fingerprint, proven); "counts" compares every planned sample's length and label count;
"none" checks nothing. Data that is not the bound store (a store of another digest, or files) gets the full
"hash" check under "chunks" and "counts": only the bound store's digest vouches for its chunk hashes. A
mismatch is a `PlanMismatchError` unless `allow_dataset_change` (then a warning).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from plancc.core.choices import Shift
from plancc.errors import InputError, PlanMismatchError, out_of_descriptors
from plancc.store import token_digest, token_parts, token_store
from plancc.store.plan import Plan, verified_plan

VERIFY_MODES = ("chunks", "hash", "counts", "none")


class TokenStore:
    """Flat `input_ids` and `targets` (int32) with int64 `offsets` (rows + 1); in memory or memory-mapped.

    `check(rows)` is called by the collator before it reads rows: for a mapped store it verifies every chunk
    holding them that this process has not verified yet (a no-op once all are).
    """

    def __init__(self, input_ids: np.ndarray, targets: np.ndarray, offsets: np.ndarray, *,
                 guard: ChunkGuard | None = None, max_id: int | None = None):
        self.input_ids, self.targets, self.offsets, self.guard = input_ids, targets, offsets, guard
        self._max_id = max_id

    def __len__(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def lengths(self) -> np.ndarray:
        """Tokens of each row."""
        return np.diff(self.offsets)

    @property
    def max_id(self) -> int:
        """The largest token id (-1 when empty): a mapped store's header says it, so no id is read."""
        if self._max_id is None:
            self._max_id = int(self.input_ids.max()) if self.input_ids.size else -1
        return self._max_id

    def check(self, rows: np.ndarray) -> None:
        """Verify the chunks holding `rows` on their first read (a no-op once every chunk is checked)."""
        if self.guard is not None and self.guard.pending:
            self.guard.check(rows)

    def __reduce__(self):
        """DataLoader workers started by spawn (or forkserver) reopen the maps (and verify their own reads), never
        copy them. The plan's own store is reopened through the plan directory this run holds, its descriptor
        passed to the worker as it starts (a recompile or a move of the plan since changes nothing for the run's
        workers); other data by its path, refused unless it is still the store this run opened."""
        if self.guard is None:
            return (TokenStore, (self.input_ids, self.targets, self.offsets))
        g = self.guard
        if g.own:
            return (_reopen_own, (_passed(g.plan.files.dir_fd), str(g.plan_path), g.mapped.digest,
                                  g.allow_dataset_change, g.verify))
        return (_reopen, (str(g.mapped.path), str(g.plan_path), g.mapped.digest, g.allow_dataset_change, g.verify))

    @classmethod
    def from_table(cls, table: pa.Table, *, shift: str = "sample", where: str = "dataset") -> TokenStore:
        """From a table with `input_ids` and `labels` (or `shift_labels` for shift none) list columns."""
        if "input_ids" not in table.column_names:
            raise PlanMismatchError(f"{where}: no 'input_ids' column (columns: {table.column_names})")
        name = "shift_labels" if shift == Shift.NONE and "shift_labels" in table.column_names else "labels"
        if name not in table.column_names:
            raise PlanMismatchError(f"{where}: no '{name}' column for shift '{shift}' (columns: {table.column_names})")
        ids, ids_off = _flat(table.column("input_ids"), where, "input_ids")
        lab, lab_off = _flat(table.column(name), where, name)
        if not np.array_equal(ids_off, lab_off):
            bad = int(np.flatnonzero(np.diff(ids_off) != np.diff(lab_off))[0])
            raise PlanMismatchError(f"{where}: row {bad} has {int(np.diff(ids_off)[bad])} input_ids but "
                                    f"{int(np.diff(lab_off)[bad])} {name}")
        return cls(ids, lab, ids_off)


class _Chunks:
    """One single store's chunks (a multi-part store's part), and which of them this process has verified."""

    def __init__(self, m: token_store.MappedTokens, first_row: int):
        self.m, self.first_row = m, first_row  # `first_row`: its row 0 in the whole store (a sample id)
        self.bounds = np.asarray(m.chunks)  # a plain view: cheaper to search than the memmap object
        self.verified = np.zeros(m.num_chunks, dtype=bool)
        self.pending = m.num_chunks


class ChunkGuard:
    """Verifies a mapped store chunk by chunk, the first time this process reads a row of each chunk (a multi-part
    store part by part: a part's chunk index is read when one of its rows first is). `pending`: chunks (of a
    multi-part store: parts) not yet all verified; none under `verify=False` (verify="none": the guard then only
    says how a worker reopens the store, and its copy checks nothing either)."""

    def __init__(self, mapped: token_store.MappedTokens, plan: Plan | Path, allow_dataset_change: bool, *,
                 own: bool = False, verify: bool = True):
        self.mapped, self._plan, self.allow_dataset_change = mapped, plan, allow_dataset_change
        self.own, self.verify = own, verify  # own: `mapped` is the plan's own store (`Plan.tokens`)
        self._single = None if mapped.parts else _Chunks(mapped, 0)
        self._parts: dict[int, _Chunks] = {}
        self.pending = 0 if not verify else self._single.pending if self._single is not None else len(mapped.parts)

    @property
    def plan_path(self) -> Path:
        """The plan directory."""
        return self._plan.path if isinstance(self._plan, Plan) else self._plan

    @property
    def plan(self) -> Plan:
        """The plan; a worker's copy (given its path) opens it only to name the sample of a changed chunk, so that
        starting a worker does not verify every epoch again."""
        if not isinstance(self._plan, Plan):
            self._plan = Plan(self._plan, threads=False)
        return self._plan

    def check(self, rows: np.ndarray) -> None:
        """Hash each not yet verified chunk that `rows` touch; refuse a changed one naming its first planned
        sample."""
        if self._single is not None:
            self._check(self._single, rows)
            self.pending = self._single.pending
            return
        try:  # a part is opened (and checked against the header) when a row of it, or of its block, is first read
            self._check_parts(rows)
        except (token_store.TokenStoreError, token_store.FileTypeError) as exc:
            if out_of_descriptors(exc):  # not the data: this process's limit (the message says so)
                raise
            raise PlanMismatchError(f"{exc}; recompile the plan (or rescan the data)") from None

    def _check_parts(self, rows: np.ndarray) -> None:
        parts = self.mapped.parts
        which = parts.of_rows(rows)
        for k in np.flatnonzero(np.bincount(which, minlength=1)).tolist():
            chunks = self._parts.get(k)
            if chunks is None:
                chunks = self._parts[k] = _Chunks(parts[k], int(parts.row_starts[k]))
            if chunks.pending:
                self._check(chunks, rows[which == k] - chunks.first_row)
                self.pending -= chunks.pending == 0

    def check_all(self) -> None:
        """Verify every chunk now (reads the whole store)."""
        self.check(np.arange(int(self.mapped.header["rows"]), dtype=np.int64))

    def _check(self, chunks: _Chunks, rows: np.ndarray) -> None:
        ks = np.searchsorted(chunks.bounds, rows, side="right") - 1
        seen = chunks.verified[ks]
        if seen.all():
            return
        for k in np.flatnonzero(np.bincount(ks[~seen], minlength=1)).tolist():
            lo, hi = int(chunks.bounds[k]) + chunks.first_row, int(chunks.bounds[k + 1]) + chunks.first_row
            if not token_store.verify_rows(self.mapped, lo, hi):  # the whole store's block hashes: its digest's
                self._changed(chunks, k)
            chunks.verified[k] = True
            chunks.pending -= 1

    def _changed(self, chunks: _Chunks, k: int) -> None:
        lo, hi = int(chunks.bounds[k]) + chunks.first_row, int(chunks.bounds[k + 1]) + chunks.first_row
        where = f"{chunks.m.path} chunk {k} (rows {lo}..{hi - 1})"
        problem = _first_differing(self.plan, self.mapped, lo, hi)
        if problem is None:
            warnings.warn(f"{where} changed since it was written, but not in any sample of the plan {self.plan.path}"
                          "; training on it", stacklevel=4)
        else:
            _refuse(self.plan, where, problem, self.allow_dataset_change)


def _first_differing(plan: Plan, m: token_store.MappedTokens, lo: int, hi: int) -> str | None:
    """What differs in the first planned sample among rows [lo, hi) (None: no planned sample there differs)."""
    samples = plan.samples_table()
    a, b = np.searchsorted(samples.column("sample_id").to_numpy(), [lo, hi])
    if a == b:
        return None
    return token_digest.compare_samples(m.input_ids, m.labels, m.offsets, samples.slice(a, b - a))


def _flat(col: pa.ChunkedArray, where: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)) or not pa.types.is_integer(
        arr.type.value_type
    ):
        raise PlanMismatchError(f"{where}: column '{name}' has type {arr.type}, expected a list of integers")
    if arr.null_count:
        raise PlanMismatchError(f"{where}: column '{name}' has null rows")
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    offsets = offsets - offsets[0]
    values = arr.flatten().to_numpy(zero_copy_only=False)
    if values.dtype != np.int32:
        if values.size and (values.min() < np.iinfo(np.int32).min or values.max() > np.iinfo(np.int32).max):
            raise PlanMismatchError(f"{where}: column '{name}' has values outside int32")
        values = values.astype(np.int32)
    return values, offsets


# ---------------------------------------------------------------- finding and reading the plan's data


def _read_any(path: Path) -> pa.Table:
    """One tokenized file read into memory, by its suffix as a scan reads a source (`plancc.store.data_files`:
    Parquet, Arrow IPC file or stream, JSON lines, JSON), or a `datasets.Dataset.save_to_disk` directory (its Arrow
    shards in order)."""
    from plancc.store import data_files  # a file given as data= only: its readers load with it

    if path.is_dir():
        state = path / "state.json"
        if not state.exists():
            raise PlanMismatchError(f"{path} is a directory but neither a token store nor a saved dataset")
        files = [path / f["filename"] for f in json.loads(state.read_text())["_data_files"]]
        return pa.concat_tables([_read_any(f) for f in files])
    try:
        table, loose = data_files.read_file(str(path), threads=False)  # a training process: `parquet.read_table`
    except InputError as exc:
        raise PlanMismatchError(f"cannot read tokenized data: {exc}") from None
    if loose:
        raise PlanMismatchError(f"cannot read tokenized data: {path}: column '{next(iter(loose))}' holds values of "
                                "mixed types, expected lists of integers")
    return table


def data_location(plan: Plan, data: str | Path | None = None) -> Path | None:
    """The data the caller gives (`load_tokens(..., data=)`): a token store folder (that of a plan or scan folder)
    or a tokenized file; None for the plan's own token store (`Plan.tokens`)."""
    if data is None:
        return None
    p = Path(data)
    if not p.exists():
        raise PlanMismatchError(f"the data given for plan {plan.path} ({p}) does not exist")
    if not (p.is_dir() or p.is_file()):
        raise PlanMismatchError(f"the data given for plan {plan.path} ({p}) is neither a regular file nor a folder")
    return token_store.store_in(p) or p  # a plan or scan directory: its store; else the file or folder given


def _own_tokens(plan: Plan) -> token_store.MappedTokens:
    """The plan's token store as opened with the plan; refused for a plan that ships none or does not bind it."""
    try:
        held = plan.tokens()
    except PlanMismatchError as exc:  # tokens/ gone (moved away), or not the plan's: the caller may give data=
        raise PlanMismatchError(f"{exc}; or pass data= (a plan, scan or token store folder, or a tokenized file) to "
                                "load_tokens") from None
    if held is None:
        raise PlanMismatchError(f"{plan.path}: the plan holds no tokenized data (compiled from a bare samples "
                                "table); pass data= to load_tokens")
    return held


def load_tokens(plan: str | Path | Plan, *, data: str | Path | pa.Table | None = None,
                verify: str = "chunks", allow_dataset_change: bool = False) -> TokenStore:
    """The tokenized dataset of `plan` (or `data`), checked against the plan (module docstring: `verify`)."""
    plan = verified_plan(plan)
    if verify not in VERIFY_MODES:
        raise ValueError(f"verify must be one of {VERIFY_MODES}, got {verify!r}")
    if isinstance(data, pa.Table):
        return _checked(plan, TokenStore.from_table(data, shift=plan.settings.shift, where="the given dataset"),
                        "the given dataset", verify, allow_dataset_change)
    where = data_location(plan, data)
    if where is None:
        return _mapped(plan, _own_tokens(plan), verify, allow_dataset_change, own=True)
    if token_store.is_store(where):
        try:
            m = token_store.open_store(where)
        except (token_store.TokenStoreError, token_store.FileTypeError) as exc:
            raise PlanMismatchError(f"{exc}; recompile the plan (or rescan the data)") from None
        return _mapped(plan, m, verify, allow_dataset_change)
    return _checked(plan, TokenStore.from_table(_read_any(where), shift=plan.settings.shift, where=str(where)), str(where),
                    verify, allow_dataset_change)


def _mapped(plan: Plan, m: token_store.MappedTokens, verify: str, allow: bool, *, own: bool = False) -> TokenStore:
    path = m.path
    guard = ChunkGuard(m, plan, allow, own=own, verify=verify != "none")
    tokens = _over_maps(m, guard)
    if verify == "none":
        return tokens
    if m.header.get("labels_shifted", False) != (plan.settings.shift == Shift.NONE):
        _refuse(plan, str(path), f"it holds {'shifted' if plan.settings.shift != 'none' else 'unshifted'} labels but the "
                                 f"plan has shift {plan.settings.shift!r}", allow)
    fp, want = m.header.get("fingerprints", {}).get("dataset"), plan.fingerprints.get("dataset")
    if verify == "hash" or m.digest != plan.fingerprints.get("tokens"):  # every chunk now, then the proof
        guard.check_all()
        return _checked(plan, tokens, str(path), "hash", allow)
    if fp != want:
        _refuse(plan, str(path), f"it holds dataset fingerprint {fp}, the plan was compiled from {want} (another "
                                 "dataset, or a changed one; verify='hash' checks it sample by sample)", allow)
    if verify == "counts":
        _checked(plan, tokens, str(path), "counts", allow)
    return tokens


def _passed(fd: int) -> object | None:
    """`fd` handed to the process being started (spawn, forkserver: multiprocessing passes it on as the child
    starts), else None: pickled for anything else, a descriptor's number would mean nothing."""
    from multiprocessing import context, reduction

    return reduction.DupFd(fd) if context.get_spawning_popen() is not None else None


def _reopen_own(handle: Any, plan_path: str, digest: str, allow: bool, verify: bool) -> TokenStore:
    """A worker's copy of the plan's own store: the plan opened through the directory its parent holds (by path
    when no descriptor came), its store refused unless it is the one the parent opened."""
    plan = Plan(plan_path, threads=False) if handle is None else Plan(plan_path, dir_fd=handle.detach(), threads=False)
    try:
        m = plan.tokens()
    except PlanMismatchError as exc:
        raise PlanMismatchError(f"the token store of {plan_path} was replaced since this run opened it ({exc}): "
                                "restart the run") from None
    if m is None or m.digest != digest:
        raise PlanMismatchError(f"the token store of {plan_path} was replaced since this run opened it (digest "
                                f"{m.digest if m else None}, the run opened {digest}): restart the run")
    return _over_maps(m, ChunkGuard(m, plan, allow, own=True, verify=verify))


def _reopen(path: str, plan_path: str, digest: str, allow: bool, verify: bool) -> TokenStore:
    """A worker's copy of data given as `data=`: the store reopened by path, refused unless it is the one the
    parent opened (a store replaced meanwhile would give this worker other tokens than the parent's batches
    expect)."""
    m = token_store.open_store(path)
    if m.digest != digest:
        raise PlanMismatchError(f"token store {path} was replaced since this run opened it (digest {m.digest}, the "
                                f"run opened {digest}): restart the run")
    return _over_maps(m, ChunkGuard(m, Path(plan_path), allow, verify=verify))


def _over_maps(m: token_store.MappedTokens, guard: ChunkGuard | None) -> TokenStore:
    """Plain ndarray views of the maps (slicing a `np.memmap` runs Python code per slice, a view does not); a
    multi-part store's arrays stay its parts' as one (`token_parts`: each part mapped when first read)."""
    def view(a):
        return a if isinstance(a, token_parts.Concat | token_parts.PartOffsets) else np.asarray(a)

    return TokenStore(view(m.input_ids), view(m.labels), view(m.offsets), guard=guard,
                      max_id=int(m.header["max_id"]))


def _refuse(plan: Plan, where: str, problem: str, allow: bool) -> None:
    msg = f"{where} does not match the plan {plan.path}: {problem}. The data changed since the plan was compiled; " \
          "recompile the plan"
    if not allow:
        raise PlanMismatchError(msg + ", or pass allow_dataset_change=True to train on it anyway")
    warnings.warn(msg + " (allowed by allow_dataset_change=True)", stacklevel=4)


def _checked(plan: Plan, tokens: TokenStore, where: str, verify: str, allow: bool) -> TokenStore:
    if verify != "none":
        problem = check_tokens(plan, tokens, hashes=verify in ("hash", "chunks"))
        if problem:
            _refuse(plan, where, problem, allow)
    return tokens


def check_tokens(plan: Plan, tokens: TokenStore, *, hashes: bool = True) -> str | None:
    """None when every planned sample has the plan's length, label count (and content hash); else what differs."""
    return token_digest.compare_samples(tokens.input_ids, tokens.targets, tokens.offsets, plan.samples_table(),
                                       hashes=hashes)


__all__ = ["ChunkGuard", "TokenStore", "check_tokens", "data_location", "load_tokens"]
