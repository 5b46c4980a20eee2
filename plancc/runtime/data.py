"""The tokenized dataset a plan points at, loaded as flat arrays the collator slices by sample id.

`sample_id` is the row of the tokenized dataset. The store keeps every column as one flat array plus CSR offsets,
so fetching a microbatch's tokens is one vectorized gather, whatever the number of samples::

    input_ids = [5, 6, 7, 8, 9, 1, 2]      all samples' tokens, concatenated
    offsets   = [0, 3, 5, 7]               sample 1 = input_ids[3:5]

`targets` is the label column the plan's shift semantics read: `labels` for shift `sample`/`row`, the already
shifted `shift_labels` for shift `none` (falling back to `labels` when the dataset stored the shifted labels under
that name). Loading checks the data against the plan (`verify`): "counts" compares every planned sample's length
and supervised-label count with the plan's samples table; "hash" (default) also recomputes each sample's content
hash and so proves the dataset fingerprint; a mismatch is a `PlanMismatchError` unless `allow_dataset_change`.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from plancc import store
from plancc.runtime.plan import PlanMismatchError, RuntimePlan, open_plan

VERIFY_MODES = ("hash", "counts", "none")


@dataclass(frozen=True)
class TokenStore:
    input_ids: np.ndarray  # int32, flat
    targets: np.ndarray  # int32, flat: labels (shift sample/row) or shift_labels (shift none)
    offsets: np.ndarray  # int64, samples + 1

    def __len__(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @classmethod
    def from_table(cls, table: pa.Table, *, shift: str = "sample", where: str = "dataset") -> TokenStore:
        """From a table with `input_ids` and `labels` (or `shift_labels` for shift none) list columns."""
        if "input_ids" not in table.column_names:
            raise PlanMismatchError(f"{where}: no 'input_ids' column (columns: {table.column_names})")
        name = "shift_labels" if shift == "none" and "shift_labels" in table.column_names else "labels"
        if name not in table.column_names:
            raise PlanMismatchError(f"{where}: no '{name}' column for shift '{shift}' (columns: {table.column_names})")
        ids, ids_off = _flat(table.column("input_ids"), where, "input_ids")
        lab, lab_off = _flat(table.column(name), where, name)
        if not np.array_equal(ids_off, lab_off):
            bad = int(np.flatnonzero(np.diff(ids_off) != np.diff(lab_off))[0])
            raise PlanMismatchError(f"{where}: row {bad} has {int(np.diff(ids_off)[bad])} input_ids but "
                                    f"{int(np.diff(lab_off)[bad])} {name}")
        return cls(ids, lab, ids_off)

    @classmethod
    def from_lists(cls, input_ids: list[list[int]], targets: list[list[int]]) -> TokenStore:
        return cls.from_table(pa.table({"input_ids": input_ids, "labels": targets}))


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


# ---------------------------------------------------------------- reading the plan's data


def _read_any(path: Path) -> pa.Table:
    """One tokenized file: Parquet, Arrow IPC (file or stream, as `datasets` writes), JSON lines, or a
    `datasets.Dataset.save_to_disk` directory (its Arrow shards in order)."""
    if path.is_dir():
        state = path / "state.json"
        if not state.exists():
            raise PlanMismatchError(f"{path} is a directory but not a saved dataset (no state.json)")
        files = [path / f["filename"] for f in json.loads(state.read_text())["_data_files"]]
        return pa.concat_tables([_read_any(f) for f in files])
    if not path.exists():
        raise PlanMismatchError(f"the plan's tokenized data {path} does not exist; pass data= to load_tokens")
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            return pq.read_table(path)
        if suffix == ".arrow":
            with pa.memory_map(str(path)) as src:
                try:
                    return pa.ipc.open_file(src).read_all()
                except pa.ArrowInvalid:
                    src.seek(0)
                    return pa.ipc.open_stream(src).read_all()
        if suffix in (".jsonl", ".json"):
            import pyarrow.json as pj

            return pj.read_json(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise PlanMismatchError(f"cannot read tokenized data {path}: {exc}") from None
    raise PlanMismatchError(f"cannot read tokenized data {path}: unsupported file type '{suffix}'")


def data_paths(plan: RuntimePlan) -> list[Path]:
    data = plan.dir.data
    if "tokenized" in data:
        return [plan.path / data["tokenized"]]
    if data.get("source"):  # absolute; else relative to the plan (plan and data moved together)
        relative = data.get("source_relative") or [None] * len(data["source"])
        return [Path(p) if Path(p).exists() or rel is None else plan.path / rel
                for p, rel in zip(data["source"], relative, strict=True)]
    raise PlanMismatchError(f"{plan.path}: the plan names no tokenized data; pass data= to load_tokens")


def load_tokens(plan: str | Path | RuntimePlan, *, data: str | Path | pa.Table | None = None,
                verify: str = "hash", allow_dataset_change: bool = False) -> TokenStore:
    """The tokenized dataset of `plan` (or `data`: a path or an Arrow table), checked against the plan."""
    plan = open_plan(plan)
    if verify not in VERIFY_MODES:
        raise ValueError(f"verify must be one of {VERIFY_MODES}, got {verify!r}")
    if isinstance(data, pa.Table):
        table, where = data, "the given dataset"
    else:
        paths = [Path(data)] if data is not None else data_paths(plan)
        table = pa.concat_tables([_read_any(p) for p in paths]) if len(paths) > 1 else _read_any(paths[0])
        where = ", ".join(str(p) for p in paths)
    tokens = TokenStore.from_table(table, shift=plan.shift, where=where)
    if verify != "none":
        problem = check_tokens(plan, tokens, hashes=verify == "hash")
        if problem:
            msg = (f"{where} does not match the plan {plan.path}: {problem}. The data changed since the plan was "
                   "compiled; recompile the plan")
            if not allow_dataset_change:
                raise PlanMismatchError(msg + ", or pass allow_dataset_change=True to train on it anyway")
            warnings.warn(msg + " (allowed by allow_dataset_change=True)", stacklevel=2)
    return tokens


def check_tokens(plan: RuntimePlan, tokens: TokenStore, *, hashes: bool = True) -> str | None:
    """None when every planned sample has the plan's length, label count (and content hash); else what differs."""
    samples = plan.samples_table()
    sid = samples.column("sample_id").to_numpy()
    if sid.size and (sid.min() < 0 or sid.max() >= len(tokens)):
        return f"the plan uses sample_id {int(sid.max())} but the dataset has {len(tokens)} rows"
    starts, ends = tokens.offsets[sid], tokens.offsets[sid + 1]
    length = ends - starts
    bad = np.flatnonzero(length != samples.column("length").to_numpy())
    if bad.size:
        return f"{bad.size} samples changed length (first: sample_id {int(sid[bad[0]])})"
    supervised = np.concatenate([[0], np.cumsum(tokens.targets != -100, dtype=np.int64)])
    counts = supervised[ends] - supervised[starts]
    bad = np.flatnonzero(counts != samples.column("label_count").to_numpy())
    if bad.size:
        return f"{bad.size} samples changed their supervised label count (first: sample_id {int(sid[bad[0]])})"
    if hashes:
        from plancc.fingerprint import token_hashes  # lazy: compiled hashing, only when asked

        h = token_hashes(tokens.input_ids, tokens.offsets, tokens.targets, tokens.offsets)[sid]
        bad = np.flatnonzero(h != samples.column("token_hash").to_numpy())
        if bad.size:
            return (f"{bad.size} samples changed content (dataset fingerprint mismatch; first: sample_id "
                    f"{int(sid[bad[0]])})")
    return None


__all__ = ["TokenStore", "check_tokens", "data_paths", "load_tokens", "store"]
