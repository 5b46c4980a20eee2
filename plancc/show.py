"""One sample as the model will see it: its token ids, which of them are supervised, and the decoded text.

`sample_view(DIR, sample_id)` reads a plan or scan directory's samples table (the counts the plan used) and its
token store row (`tokens/`, `sample_id` is the row), and decodes with the tokenizer the scan recorded. A token is
supervised when it is some position's target: `labels != -100`, or, when the stored labels are already shifted
(`--shift none`), the token after such a label. `segments` are runs of equal supervision, decoded run by run so
that multi-byte characters stay whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from plancc import store
from plancc.errors import InputError


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
    dataset: str | None = None  # a recipe's: the sample's dataset and its row there (`plancc.recipe_data`)
    row: int | None = None
    trained: str = ""  # what the scan trained (`trained_summary`)

    def to_json(self) -> dict[str, Any]:
        """The view as `show --json` prints it."""
        return {"sample_id": self.sample_id, "dataset": self.dataset, "row": self.row,
                "length": self.length, "label_count": self.label_count,
                "first_label_supervised": self.first_label_supervised, "tokenizer": self.tokenizer,
                "trained": self.trained,
                "supervised_tokens": int(self.supervised.sum()),
                "segments": [{"text": t, "supervised": s} for t, s in self.segments],
                "input_ids": self.input_ids.tolist(), "labels": self.labels.tolist(),
                "supervised": self.supervised.tolist()}


def trained_summary(report: dict[str, Any]) -> str:
    """What the scan supervised, in one line: the what-is-trained settings (`ScanOptions`) that apply to its
    format, defaults included."""
    from plancc.config import ScanOptions

    options = report.get("options") or {}
    default = ScanOptions()

    def get(name: str) -> Any:
        return options.get(name, getattr(default, name))

    fmt = report.get("format")
    eos = f"train_on_eos {get('train_on_eos')}"
    if fmt == "messages":
        template = report.get("chat_template") or {}
        if template.get("generation"):
            return f"the chat template's {{% generation %}} blocks, train_on {get('train_on')}"
        return f"roles_to_train {','.join(get('roles_to_train'))}, {eos}, train_on {get('train_on')}"
    if fmt in ("alpaca", "prompt_completion"):
        return f"train_on_inputs {str(get('train_on_inputs')).lower()}, {eos}"
    if fmt == "text":
        return eos
    return "the source's own labels" if fmt == "tokenized" else ""


def _report(directory: Path, info: dict[str, Any]) -> dict[str, Any]:
    if info.get("report"):
        return info["report"]
    if (directory / store.MANIFEST_FILE).is_file():
        return store.read_manifest(directory).get("scan", {})
    return {}


def _stored_row(path: Path, row: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """Row `row` of a token store (ids, stored labels, whether those labels are already shifted): two small slices
    of its memory maps, nothing else read."""
    from plancc import token_store

    try:
        m = token_store.open_store(path)
    except token_store.TokenStoreError as exc:
        raise InputError(str(exc)) from None
    if not 0 <= row < len(m.offsets) - 1:
        raise InputError(f"{path}: no row {row} ({len(m.offsets) - 1} rows)")
    a, b = int(m.offsets[row]), int(m.offsets[row + 1])
    return (np.asarray(m.input_ids[a:b], dtype=np.int64), np.asarray(m.labels[a:b], dtype=np.int64),
            bool(m.header["labels_shifted"]))


def _dataset_row(directory: Path, table: Any, at: int, sample_id: int) -> tuple[str | None, int | None]:
    """A recipe plan's sample: (its dataset's name, its row in that dataset); (None, None) for one source."""
    if store.DATASET_COLUMN not in table.column_names:
        return None, None
    name = table.column(store.DATASET_COLUMN)[at].as_py()
    recipe = store.read_manifest(directory).get("recipe") or {} if (directory / store.MANIFEST_FILE).is_file() else {}
    first = {d["name"]: d["first_id"] for d in recipe.get("datasets", [])}
    return name, (sample_id - first[name] if name in first else None)


def sample_view(directory: str | Path, sample_id: int, tokenizer: str | None = None) -> SampleView:
    """Sample `sample_id` of a plan or scan directory; `tokenizer` overrides where the recorded one is now."""
    from plancc.scan import options_from_report
    from plancc.sources.tokenizer import load_tokenizer
    from plancc.token_store import IGNORE_INDEX

    d = Path(directory)
    given = store.read_samples_source(d) if d.is_dir() else None
    if given is None:
        raise InputError(f"{directory} is not a plan or scan directory (no {store.SAMPLES_FILE})")
    table, info = given
    ids = store.column(table, "sample_id")
    at = int(np.searchsorted(ids, sample_id))
    report = _report(d, info)
    if at == len(ids) or ids[at] != sample_id:
        dropped = " (the scan dropped it: see `plancc scan` or the manifest's scan report)" if (
            0 <= sample_id <= ids[-1]) else ""
        raise InputError(f"--sample {sample_id}: no such sample in {directory}{dropped}; sample ids run "
                         f"{int(ids[0])}..{int(ids[-1])} ({len(ids):,} samples)")
    if not info.get("tokenized_path"):
        raise InputError(f"{directory} has no {store.TOKENS_DIR}/ (it was compiled from a bare samples table): "
                         "nothing to decode")
    first_row = int((report.get("part") or {}).get("lo", 0))  # a partial scan's store starts at its first row
    input_ids, labels, shifted = _stored_row(Path(info["tokenized_path"]), sample_id - first_row)
    supervised = labels != IGNORE_INDEX
    if shifted:
        supervised = np.concatenate([[False], supervised[:-1]])
    tok = load_tokenizer(options_from_report(report, tokenizer).tokenizer)
    decode = tok.tokenizer.decode
    bounds = np.flatnonzero(np.diff(supervised.astype(np.int8))) + 1
    runs = zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [len(input_ids)]]), strict=True)
    segments = [(decode(input_ids[a:b].tolist(), skip_special_tokens=False), bool(supervised[a])) for a, b in runs]
    pieces = [decode([int(i)], skip_special_tokens=False) for i in input_ids]
    return SampleView(int(sample_id), int(store.column(table, "length")[at]),
                      int(store.column(table, "label_count")[at]),
                      bool(store.column(table, "first_label_supervised")[at]), input_ids, labels, supervised,
                      segments, pieces, tok.name, *_dataset_row(d, table, at, int(sample_id)),
                      trained_summary(report))
