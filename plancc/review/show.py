"""One sample as the model will see it: its token ids, which of them are supervised, and the decoded text.

`sample_view(DIR, sample_id)` reads a plan or scan directory's samples table (the counts the plan used) and its
token store row (`tokens/`, `sample_id` is the row), and decodes with the tokenizer the scan recorded. A token is
supervised when it is some position's target: `labels != -100`, or, when the stored labels are already shifted
(`--shift none`), the token after such a label. `segments` are runs of equal supervision, decoded run by run so
that multi-byte characters stay whole.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from plancc.core.plan_arrays import IGNORE_INDEX
from plancc.errors import InputError
from plancc.store import parquet, schemas
from plancc.store.samples_source import StoredSamples, open_samples
from plancc.store.scan_record import Counted


@dataclass(frozen=True)
class SampleView:
    """One sample as `plancc show` prints it: its recorded counts, its tokens and the decoded, marked text."""

    sample_id: int
    length: int  # tokens, as recorded in the samples table
    label_count: int  # labels the loss counts, as recorded
    first_label_supervised: bool
    input_ids: np.ndarray
    labels: np.ndarray
    supervised: np.ndarray  # bool per token
    segments: list[tuple[str, bool]]  # (decoded text, supervised) runs
    pieces: list[str]  # each token decoded alone
    tokenizer: str
    dataset: str | None = None  # a recipe's: the sample's dataset and its row there (`plancc.build.recipe`)
    row: int | None = None
    trained: str = ""  # what the scan trained (`plancc.scan.describe.trained`)
    # preference data (docs/preference.md): the completion's pair and role, or its label; and the pair's other one
    pair_id: int | None = None
    pair_role: str | None = None
    desirable: bool | None = None
    partner: SampleView | None = None

    def to_json(self) -> dict[str, Any]:
        """The view as `show --json` prints it."""
        kind = {k: v for k, v in (("pair_id", self.pair_id), ("pair_role", self.pair_role),
                                  ("desirable", self.desirable)) if v is not None}
        if self.partner is not None:
            kind["partner"] = self.partner.to_json()
        return {**kind, "sample_id": self.sample_id, "dataset": self.dataset, "row": self.row,
                "length": self.length, "label_count": self.label_count,
                "first_label_supervised": self.first_label_supervised, "tokenizer": self.tokenizer,
                "trained": self.trained,
                "supervised_tokens": int(self.supervised.sum()),
                "segments": [{"text": t, "supervised": s} for t, s in self.segments],
                "input_ids": self.input_ids.tolist(), "labels": self.labels.tolist(),
                "supervised": self.supervised.tolist()}


def _stored(directory: str | Path) -> StoredSamples | None:
    """The samples of a plan or scan directory (`open_samples`), None for anything else."""
    d = Path(directory)
    stored = open_samples(d) if d.is_dir() else None
    return stored if stored is not None and stored.kind != "table" else None


def _recipe(stored: StoredSamples) -> dict[str, Any]:
    """A recipe plan's `recipe` entry ({} for one source, or a scan)."""
    return (stored.plan.manifest.recipe if stored.plan is not None else None) or {}


def _stored_row(path: Path, row: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """Row `row` of a token store (ids, stored labels, whether those labels are already shifted): two small slices
    of its memory maps, nothing else read."""
    from plancc.store import token_store

    try:
        m = token_store.open_store(path)
    except token_store.TokenStoreError as exc:
        raise InputError(str(exc)) from None
    if not 0 <= row < len(m.offsets) - 1:
        raise InputError(f"{path}: no row {row} ({len(m.offsets) - 1} rows)")
    a, b = int(m.offsets[row]), int(m.offsets[row + 1])
    return (np.asarray(m.input_ids[a:b], dtype=np.int64), np.asarray(m.labels[a:b], dtype=np.int64),
            bool(m.header["labels_shifted"]))


def _dataset_row(recipe: dict[str, Any], table: Any, at: int, sample_id: int) -> tuple[str | None, int | None]:
    """A recipe plan's sample: (its dataset's name, its row in that dataset); (None, None) for one source."""
    if schemas.DATASET_COLUMN not in table.column_names:
        return None, None
    name = table.column(schemas.DATASET_COLUMN)[at].as_py()
    first = {d["name"]: d["first_id"] for d in recipe.get("datasets", [])}
    return name, (sample_id - first[name] if name in first else None)


def sample_view(directory: str | Path, sample_id: int, tokenizer: str | None = None) -> SampleView:
    """Sample `sample_id` of a plan or scan directory; `tokenizer` overrides where the recorded one is now. A
    preference completion comes with the other completion of its pair (`partner`)."""
    stored = _stored(directory)
    if stored is None:
        raise InputError(f"{directory} is not a plan or scan directory (no {schemas.SAMPLES_FILE})")
    table = stored.table
    ids = parquet.column(table, "sample_id")
    at = int(np.searchsorted(ids, sample_id))
    if at == len(ids) or ids[at] != sample_id:
        dropped = " (the scan dropped it: see `plancc scan` or the manifest's scan report)" if (
            0 <= sample_id <= ids[-1]) else ""
        raise InputError(f"--sample {sample_id}: no such sample in {directory}{dropped}; sample ids run "
                         f"{int(ids[0])}..{int(ids[-1])} ({len(ids):,} samples)")
    if stored.tokens is None:
        raise InputError(f"{directory} has no {schemas.TOKENS_DIR}/ (it was compiled from a bare samples table): "
                         "nothing to decode")
    view = _decoded(stored, at, tokenizer)
    if schemas.PAIR_ID_COLUMN not in table.column_names:
        return view
    pair = parquet.column(table, schemas.PAIR_ID_COLUMN)
    other = np.flatnonzero((pair == pair[at]) & (ids != sample_id))
    return replace(view, partner=_decoded(stored, int(other[0]), tokenizer) if other.size else None)


def _decoded(stored: StoredSamples, at: int, tokenizer: str | None) -> SampleView:
    """The view of the sample at row `at` of the stored samples table."""
    from plancc.scan.describe import recorded_tokenizer, trained

    table, record = stored.table, stored.record
    sample_id = int(parquet.column(table, "sample_id")[at])
    sequences = 2 if schemas.PAIR_ID_COLUMN in table.column_names else 1  # samples of a source row (a pair: 2)
    first_row = record.part.lo * sequences if record.part else 0  # a partial scan's store starts at its first row
    input_ids, labels, shifted = _stored_row(stored.tokens, sample_id - first_row)
    supervised = labels != IGNORE_INDEX
    if shifted:
        supervised = np.concatenate([[False], supervised[:-1]])
    tok = recorded_tokenizer(record, tokenizer)
    decode = tok.tokenizer.decode
    bounds = np.flatnonzero(np.diff(supervised.astype(np.int8))) + 1
    runs = zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [len(input_ids)]]), strict=True)
    segments = [(decode(input_ids[a:b].tolist(), skip_special_tokens=False), bool(supervised[a])) for a, b in runs]
    pieces = [decode([int(i)], skip_special_tokens=False) for i in input_ids]
    names = table.column_names
    kind = {"pair_id": int(parquet.column(table, schemas.PAIR_ID_COLUMN)[at]) if schemas.PAIR_ID_COLUMN in names
            else None,
            "pair_role": table.column(schemas.PAIR_ROLE_COLUMN)[at].as_py() if schemas.PAIR_ROLE_COLUMN in names
            else None,
            "desirable": bool(parquet.column(table, schemas.DESIRABLE_COLUMN)[at]) if schemas.DESIRABLE_COLUMN in names
            else None}
    return SampleView(sample_id, int(parquet.column(table, "length")[at]),
                      int(parquet.column(table, "label_count")[at]),
                      bool(parquet.column(table, "first_label_supervised")[at]), input_ids, labels, supervised,
                      segments, pieces, tok.name, *_dataset_row(_recipe(stored), table, at, sample_id),
                      trained(record), **kind)


def _targets(labels: np.ndarray, offsets: np.ndarray, shifted: bool) -> np.ndarray:
    """Targets of each row: its labels != -100, less a supervised first label (never a target) unless shifted."""
    sup = np.zeros(len(labels) + 1, np.int64)
    np.cumsum(np.asarray(labels) != IGNORE_INDEX, out=sup[1:])
    counts = sup[offsets[1:]] - sup[offsets[:-1]]
    if shifted:
        return counts
    nonempty = np.diff(offsets) > 0
    first = np.zeros(len(counts), bool)
    first[nonempty] = np.asarray(labels)[offsets[:-1][nonempty]] != IGNORE_INDEX
    return counts - first


def dropped_rows(directory: str | Path) -> dict[str, Any]:
    """Every source row a plan or scan directory's scan dropped, with why, and its truncated rows (count and the
    first the record names; a recipe's record has the count only): derived from its token store (one row per source row, dropped ones included), its
    samples table (the kept ones) and its scan record, so nothing extra is stored or fingerprinted."""
    from plancc.store import token_store

    stored = _stored(directory)
    if stored is None or stored.tokens is None:
        raise InputError(f"{directory} is not a plan or scan directory with its {schemas.TOKENS_DIR}/")
    table, record = stored.table, stored.record
    try:
        m = token_store.open_store(stored.tokens)
    except token_store.TokenStoreError as exc:
        raise InputError(str(exc)) from None
    offsets = np.asarray(m.offsets, dtype=np.int64)
    first_row = record.part.lo if record.part else 0
    kept = np.zeros(len(offsets) - 1, bool)
    kept[parquet.column(table, "sample_id").astype(np.int64) - first_row] = True
    lengths = np.diff(offsets)
    targets = _targets(m.labels, offsets, bool(m.header["labels_shifted"]))
    seq = record.sequence_len
    names = _dataset_starts(_recipe(stored))
    rows = []
    for r in np.flatnonzero(~kept).tolist():
        if seq is not None and lengths[r] > seq:
            why = f"longer than sequence_len {seq}"
        elif targets[r] <= 0:
            why = "no supervised target"
        else:
            why = "trains on the end of turn alone (drop_eos_only)"
        rows.append({"row": first_row + r, **names(first_row + r), "reason": why, "tokens": int(lengths[r])})
    truncated = record.truncated if "truncated" in record.keys else Counted(record.truncated_samples, ())
    return {"dropped": rows, "truncated": truncated.to_json()}


def _dataset_starts(recipe: dict[str, Any]):
    """A function naming a recipe plan's row (`recipe`: its manifest entry): {dataset, dataset_row}; {} for one
    source."""
    starts = sorted((d["first_id"], d["name"]) for d in recipe.get("datasets", []))
    if not starts:
        return lambda row: {}
    firsts = np.array([s for s, _ in starts], np.int64)

    def name(row: int) -> dict[str, Any]:
        at = int(np.searchsorted(firsts, row, side="right")) - 1
        return {"dataset": starts[at][1], "dataset_row": row - starts[at][0]}

    return name
