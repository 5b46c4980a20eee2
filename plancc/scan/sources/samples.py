"""From flat token/label arrays to the samples table: long-sample policy, label counts, drops, content hashes.

All vectorized over the CSR layout (`offsets`), so the cost per sample is a few array operations in total:

    labels   [-100 -100  7  9 | -100 4 ]      offsets [0, 4, 6]
    supervised cumsum → label_count [2, 1];  first_label_supervised [False, False]

Label semantics (docs/spec.md §3): `label_count` counts labels != -100; under shift sample/row the first label of a sample
is never a target, so a sample has `label_count - first_label_supervised` targets; under shift none labels are
already shifted and `first_label_supervised` is False.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from plancc.config.settings import ScanOptions
from plancc.core.plan_arrays import IGNORE_INDEX
from plancc.errors import InputError
from plancc.scan.formats.base import Encoded
from plancc.store import schemas
from plancc.store.fingerprint import token_hashes
from plancc.store.scan_record import Counted, ScanRecord

FIRST_ROWS = 10


def _first_rows(mask: np.ndarray) -> Counted:
    rows = np.flatnonzero(mask)
    return Counted(int(rows.size), tuple(rows[:FIRST_ROWS].tolist()))


def _truncate(enc: Encoded, limit: int) -> Encoded:
    lengths = np.diff(enc.offsets)
    new_len = np.minimum(lengths, limit)
    pos = np.arange(len(enc.ids), dtype=np.int64) - np.repeat(enc.offsets[:-1], lengths)
    keep = pos < limit
    offsets = np.zeros_like(enc.offsets)
    np.cumsum(new_len, out=offsets[1:])
    return Encoded(enc.ids[keep], enc.labels[keep], offsets, enc.end_only, enc.attributes)


def _shift_left(enc: Encoded) -> Encoded:
    """labels[t] := labels[t+1] inside each sample, last position -100 (pre-shifted labels for --shift none)."""
    out = np.full_like(enc.labels, IGNORE_INDEX)
    out[:-1] = enc.labels[1:]
    ends = enc.offsets[1:][np.diff(enc.offsets) > 0] - 1
    out[ends] = IGNORE_INDEX
    return Encoded(enc.ids, out, enc.offsets, enc.end_only, enc.attributes)


@dataclass
class Finished:
    """A scan's result before writing: the samples table, the tokenized rows and their counts."""

    samples: pa.Table
    tokenized: Encoded  # every source row, after truncation (one row per source row)
    report: ScanRecord  # the counts (rows_read, retained, dropped and truncated samples, COUNTS)


def _per_row(mask: np.ndarray, k: int) -> np.ndarray:
    """Per source row, whether any of its `k` sequences is marked."""
    return mask.reshape(-1, k).any(axis=1) if k > 1 else mask


def finish(enc: Encoded, options: ScanOptions, where: Callable[[int], str], *, labels_shifted: bool,
           sequences: int = 1, first_row: int = 0) -> Finished:
    """Apply the long policy and shift, count labels, drop unsupervised samples, hash, build the samples table
    (rows of one shard starting at source row `first_row`: `check_retained` checks the whole scan kept some).

    A format giving `sequences` k > 1 a row (a preference pair: `plancc.scan.formats`) keeps or drops a row's
    sequences together: one too long (under `--long drop`) or without a target drops the row, each is truncated on
    its own; counts are of rows. Sample `first_row * k + i` is sequence i; the rows' attributes (`pair_role`,
    `desirable`) become the samples table's columns, a pair's `pair_id` its row."""
    k = sequences
    lengths = np.diff(enc.offsets)
    over = lengths > options.sequence_len
    row_over = _per_row(over, k)
    counts: dict[str, Any] = {"rows_read": len(lengths) // k}
    if over.any() and options.long == "error":
        seq = int(np.flatnonzero(over)[0])
        raise InputError(f"{where(seq // k)}: sample has {lengths[seq]} tokens, more than --sequence-len "
                         f"{options.sequence_len} (use --long truncate or --long drop, or raise --sequence-len)")
    dropped_long = row_over & (options.long == "drop")
    counts["truncated"] = _first_rows(row_over if options.long == "truncate" else np.zeros_like(row_over))
    counts["dropped_long"] = _first_rows(dropped_long)
    if options.long == "truncate" and over.any():
        enc = _truncate(enc, options.sequence_len)
        lengths = np.diff(enc.offsets)
    if options.shift == "none" and not labels_shifted:
        enc = _shift_left(enc)
    sup = np.zeros(len(enc.labels) + 1, np.int64)
    np.cumsum(enc.labels != IGNORE_INDEX, out=sup[1:])
    label_count = sup[enc.offsets[1:]] - sup[enc.offsets[:-1]]
    nonempty = lengths > 0
    first = np.zeros(len(lengths), bool)
    if options.shift != "none":
        first[nonempty] = enc.labels[enc.offsets[:-1][nonempty]] != IGNORE_INDEX
    masked = _per_row(label_count - first <= 0, k) & ~dropped_long
    counts["dropped_all_masked"] = _first_rows(masked)
    end_only = _per_row(enc.end_only_rows(), k) & ~masked & ~dropped_long
    counts["end_only"] = _first_rows(end_only)
    counts["blank_turns"] = _first_rows(_per_row(enc.attributes.get("blank", np.zeros(len(lengths), bool)), k))
    keep_row = ~masked & ~dropped_long & ~(end_only & options.drop_eos_only)
    counts["retained"] = int(keep_row.sum())
    counts["dropped_samples"] = len(keep_row) - counts["retained"]
    counts["truncated_samples"] = counts["truncated"].count
    keep = np.repeat(keep_row, k)
    hashes = token_hashes(enc.ids, enc.offsets, enc.labels, enc.offsets)
    ids = np.flatnonzero(keep).astype(np.int64)
    kind = schemas.data_kind_of({*enc.attributes, schemas.PAIR_ID_COLUMN} if k > 1 else enc.attributes)
    columns = {
        "sample_id": pa.array(ids + first_row * k, pa.int64()),
        "length": pa.array(lengths[keep].astype(np.int32), pa.int32()),
        "label_count": pa.array(label_count[keep].astype(np.int32), pa.int32()),
        "first_label_supervised": pa.array(first[keep], pa.bool_()),
        "token_hash": pa.array(hashes[keep], pa.uint64()),
    }
    if kind == "preference":
        columns[schemas.PAIR_ID_COLUMN] = pa.array(ids // k + first_row, pa.int64())
    for name in (schemas.PAIR_ROLE_COLUMN, schemas.DESIRABLE_COLUMN):
        if name in enc.attributes:
            columns[name] = pa.array(np.asarray(enc.attributes[name])[keep])
    samples = pa.table(columns, schema=schemas.samples_schema(False, kind))
    return Finished(samples, enc, ScanRecord.of(**counts))


def check_retained(report: ScanRecord) -> None:
    """A scan that keeps no sample is an error naming why (a shard may keep none; the whole scan may not)."""
    if report.retained == 0:
        raise InputError(
            f"{report.source or 'source'}: no supervised samples: of {report.rows_read} rows, "
            f"{report.dropped_all_masked.count} have no supervised target and "
            f"{report.dropped_long.count} are longer than --sequence-len {report.sequence_len}"
        )


def _end_only(report: ScanRecord) -> tuple[int, bool]:
    """(samples training on an end of turn alone, whether they were dropped)."""
    return report.end_only.count, bool(report.options is not None and report.options.drop_eos_only)


def _drop_parts(report: ScanRecord) -> tuple[int, int, str]:
    rows, dropped = report.rows_read, report.dropped_samples
    share = dropped / rows if rows else 0.0
    why = (f"{report.dropped_long.count} longer than --sequence-len {report.sequence_len}, "
           f"{report.dropped_all_masked.count} without a supervised target")
    ends, gone = _end_only(report)
    if ends and gone:
        why += f", {ends} training on the end of turn alone (drop_eos_only)"
    return dropped, rows, f"{dropped} of {rows} samples ({share:.1%}): {why}"


def _end_only_warning(report: ScanRecord) -> list[str]:
    """The line for kept samples whose supervised part is only an end of turn (an empty completion or reply)."""
    ends, gone = _end_only(report)
    if not ends or gone:
        return []
    rows = ", ".join(map(str, report.end_only.first_rows[:5]))
    return [f"{ends} samples have an empty completion or reply and train on the end of turn (EOS) alone "
            f"(rows {rows}{', ...' if ends > 5 else ''}); drop them with drop_eos_only = true"]


def _blank_warning(report: ScanRecord) -> list[str]:
    """The line for conversations with a turn to train whose text renders to nothing (left untrained)."""
    blank = report.blank_turns
    if not blank.count:
        return []
    rows = ", ".join(map(str, blank.first_rows[:5]))
    return [f"{blank.count} conversations have a turn to train with no text (empty, or whitespace the template "
            f"trims): that turn and its end of turn are not trained, as Axolotl does (rows {rows}"
            f"{', ...' if blank.count > 5 else ''})"]


def drop_warning(report: ScanRecord) -> str | None:
    """One line saying how many samples the scan dropped or truncated, why, and how many train on an end of turn
    alone; None when none of these happened."""
    dropped, _, text = _drop_parts(report)
    truncated = report.truncated_samples
    parts = ([f"dropped {text}"] if dropped else []) + (
        [f"truncated {truncated} samples to --sequence-len {report.sequence_len}"]
        if truncated else []) + _end_only_warning(report) + _blank_warning(report)
    return "; ".join(parts) or None


def check_drops(report: ScanRecord, max_dropped: float) -> None:
    """More than `max_dropped` of the rows dropped is an error: the plan would silently train on far less data."""
    dropped, rows, text = _drop_parts(report)
    if rows and dropped / rows > max_dropped:
        fixes = (["raise --sequence-len, use --long truncate"] if report.dropped_long.count else []) + (
            ["check which field is the completion (--format, --columns)"] if report.dropped_all_masked.count
            else [])
        raise InputError(
            f"{report.source or 'source'}: dropped {text}, more than --max-dropped {max_dropped:g}; "
            f"{', '.join(fixes)}, or accept it with --max-dropped {-(-dropped * 100 // rows) / 100:g}"
        )
