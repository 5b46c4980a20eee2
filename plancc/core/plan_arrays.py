"""Plan arrays: one epoch's microbatches as compressed index arrays, and the quantities derived from them.

A microbatch holds rows; a row holds samples. Both levels are CSR offsets, so a plan of 10M samples is three
integer arrays and every derived quantity is a vectorized reduction::

    samples     = [7, 2, 9, 4, 0, 5]      positions in the samples table, in plan order
    row_bounds  = [0, 2, 3, 6]            row 0 = samples[0:2], row 1 = samples[2:3], row 2 = samples[3:6]
    batch_bounds= [0, 1, 3]               microbatch 0 = rows [0:1], microbatch 1 = rows [1:3]

Layouts map onto this shape: `packed` has one row per microbatch (or `micro_batch_size` rows with real
batches), `padded` one row per sample, `flattened` one row per microbatch. Algorithms in `pack/` and `balance/`
take and return these arrays; nothing here knows about files, tokenizers or torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from plancc.core.choices import Mode, Shift

IGNORE_INDEX = -100  # a label that is no target: what the scan writes and the loss skips (PyTorch's default)


@dataclass(frozen=True)
class SampleArrays:
    """Per-sample facts the planner needs, indexed by position in the samples table.

    Lengths and label counts are int32 as a samples table stores them (or int64): whoever computes with them
    gathers what it needs and widens that to int64 first, so no sum, product or difference can wrap."""

    sample_id: np.ndarray  # int64
    length: np.ndarray  # int32 or int64
    label_count: np.ndarray  # int32 or int64, labels != -100 (or shift_labels != -100 for shift "none")
    first_label_supervised: np.ndarray  # bool
    # preference data (docs/preference.md): pairs name each completion's pair and whether it is the chosen one;
    # unpaired (KTO) data its label. None for SFT samples.
    pair_id: np.ndarray | None = None  # int64
    chosen: np.ndarray | None = None  # bool
    desirable: np.ndarray | None = None  # bool

    def __len__(self) -> int:
        return int(self.length.shape[0])

    @property
    def kind(self) -> str:
        """`sft`, `preference` (pairs: the planner's unit is a pair) or `unpaired_preference` (KTO)."""
        if self.pair_id is not None:
            return "preference"
        return "unpaired_preference" if self.desirable is not None else "sft"

    def take(self, positions: np.ndarray) -> SampleArrays:
        """The samples at `positions` (a multiset: a recipe's epoch, `plancc.planner.mixture`; a position twice is the
        sample twice)."""
        def part(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a[positions]

        return SampleArrays(self.sample_id[positions], self.length[positions], self.label_count[positions],
                            self.first_label_supervised[positions], part(self.pair_id), part(self.chosen),
                            part(self.desirable))

    def targets(self, shift: str) -> np.ndarray:
        """Supervised targets each sample contributes when it starts its own sequence (docs/spec.md §3).

        `sample` and `row` drop the first label (no token predicts it); `none` counts pre-shifted labels as they
        are. Under `row` shift this is exact for the first sample of a row; later samples in a row gain back
        their first label (see `row_targets`).
        """
        if shift == Shift.NONE:
            return self.label_count.astype(np.int64, copy=False)
        return self.label_count - self.first_label_supervised.astype(np.int64)

    @cached_property
    def facts(self) -> np.ndarray:
        """Length, label count and first-label flag packed into one int64 a sample (`row_sums`' input)."""
        from plancc.core.row_sums import pack_facts

        return pack_facts(self.length, self.label_count, self.first_label_supervised)


@dataclass(frozen=True)
class Batches:
    """One epoch's ordered microbatches (see module docstring)."""

    samples: np.ndarray  # int64
    row_bounds: np.ndarray  # int64, rows + 1
    batch_bounds: np.ndarray  # int64, batches + 1
    # `row_sums` of these microbatches by shift, with the samples they were taken over: a stage, its summary and
    # the next stage all ask for them (plan arrays are never changed in place, so they stay true)
    sums: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def num_batches(self) -> int:
        """Microbatches in the epoch."""
        return int(self.batch_bounds.shape[0] - 1)

    @property
    def num_rows(self) -> int:
        """Rows in the epoch (packed rows, padded samples or flattened rows)."""
        return int(self.row_bounds.shape[0] - 1)

    def rows_per_batch(self) -> np.ndarray:
        """Rows of each microbatch."""
        return np.diff(self.batch_bounds)

    def samples_per_row(self) -> np.ndarray:
        """Samples of each row."""
        return np.diff(self.row_bounds)

    def row_of_sample(self) -> np.ndarray:
        """Row index of each entry of `samples`."""
        return np.repeat(np.arange(self.num_rows, dtype=np.int64), self.samples_per_row())

    def batch_of_row(self) -> np.ndarray:
        """Microbatch index of each row."""
        return np.repeat(np.arange(self.num_batches, dtype=np.int64), self.rows_per_batch())


def segment_sum(values: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Sums of `values` over CSR segments `bounds` (empty segments give 0)."""
    csum = np.zeros(values.shape[0] + 1, dtype=np.int64)
    np.cumsum(values, out=csum[1:])
    return csum[bounds[1:]] - csum[bounds[:-1]]


def segment_max(values: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Maxima of non-negative `values` over non-empty CSR segments."""
    if values.shape[0] == 0:
        return np.zeros(bounds.shape[0] - 1, dtype=np.int64)
    return np.maximum.reduceat(values, bounds[:-1]).astype(np.int64)


@dataclass(frozen=True)
class RowSums:
    """Per-row sums of a plan (see `row_sums`)."""

    tokens: np.ndarray  # int64, unpadded tokens
    targets: np.ndarray  # int64, supervised targets as the collator feeds the loss (docs/spec.md §3)
    squares: np.ndarray  # int64, sum of the samples' squared lengths (varlen attention work)


def row_sums(b: Batches, s: SampleArrays, shift: str = Shift.NONE) -> RowSums:
    """Tokens, targets under `shift` and squared lengths of every row, in one pass over the samples.

    Under `row` shift only a row's first sample loses its first label; under `sample` every sample does.
    """
    from plancc.core import row_sums as kernel

    shift = Shift(shift)
    taken = b.sums.get(shift)
    if taken is not None and taken[0] is s:
        return taken[1]
    code = {Shift.NONE: kernel.NONE, Shift.SAMPLE: kernel.SAMPLE, Shift.ROW: kernel.ROW}[shift]
    samples = b.samples.astype(np.int64, copy=False)
    run = kernel.row_sums_threaded if samples.shape[0] >= kernel.PARALLEL_FROM else kernel.row_sums
    out = run(samples, b.row_bounds.astype(np.int64, copy=False), s.facts, code)
    out.flags.writeable = False  # shared by every caller: a copy for whoever changes it
    rows = RowSums(*out)
    b.sums[shift] = (s, rows)
    return rows


def _shift_free_sums(b: Batches, s: SampleArrays) -> RowSums:
    """Row sums under whichever shift was taken already (tokens and squares do not depend on it), else under none."""
    for taken_s, rows in b.sums.values():
        if taken_s is s:
            return rows
    return row_sums(b, s)


def row_tokens(b: Batches, s: SampleArrays) -> np.ndarray:
    """Unpadded tokens per row."""
    return _shift_free_sums(b, s).tokens


def row_targets(b: Batches, s: SampleArrays, shift: str) -> np.ndarray:
    """Supervised targets per row, exactly as the collator feeds the loss (docs/spec.md §3)."""
    return row_sums(b, s, shift).targets


def batch_tokens(b: Batches, s: SampleArrays) -> np.ndarray:
    """Unpadded tokens per microbatch."""
    return segment_sum(row_tokens(b, s), b.batch_bounds)


def batch_targets(b: Batches, s: SampleArrays, shift: str) -> np.ndarray:
    """Supervised targets per microbatch (docs/spec.md §3): the plan's `label_count` column."""
    return segment_sum(row_targets(b, s, shift), b.batch_bounds)


def _padded_cost(b: Batches, row_tok: np.ndarray, pad_multiple: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows per microbatch, its longest row rounded up to `pad_multiple`)."""
    longest = segment_max(row_tok, b.batch_bounds)
    return b.rows_per_batch(), -(-longest // pad_multiple) * pad_multiple


def batch_cost(b: Batches, s: SampleArrays, pad_multiple: int) -> np.ndarray:
    """Token slots the collator allocates: rows x longest row, rounded up to `pad_multiple`.

    Padded: rows are samples, so cost = samples x padded max length. Flattened: one row, cost = its tokens.
    Packed: the microbatch's rows padded to the longest of them.
    """
    rows, padded = _padded_cost(b, row_tokens(b, s), pad_multiple)
    return rows * padded


@dataclass(frozen=True)
class BatchSums:
    """Per-microbatch totals of a plan, all from one `row_sums` pass (see `batch_sums`)."""

    rows: RowSums
    targets: np.ndarray  # the plan's `label_count` column
    tokens: np.ndarray  # unpadded tokens
    cost: np.ndarray  # token slots the collator allocates (`batch_cost`)
    attention: np.ndarray  # attention work (`batch_attention`)


def batch_sums(b: Batches, s: SampleArrays, shift: str, mode: str, pad_multiple: int) -> BatchSums:
    """Targets, tokens, cost and attention work of every microbatch: what a summary or the plan table needs."""
    rows = row_sums(b, s, shift)
    n_rows, padded = _padded_cost(b, rows.tokens, pad_multiple)
    return BatchSums(rows, segment_sum(rows.targets, b.batch_bounds), segment_sum(rows.tokens, b.batch_bounds),
                     n_rows * padded, _attention(b, rows, mode, n_rows, padded))


def _attention(b: Batches, rows: RowSums, mode: str, n_rows: np.ndarray, padded: np.ndarray) -> np.ndarray:
    """`batch_attention` from row sums and `_padded_cost`."""
    if mode == Mode.PADDED:  # padded rows run dense attention: each costs its padded length squared
        return n_rows * padded * padded
    return segment_sum(rows.squares, b.batch_bounds)


def batch_attention(b: Batches, s: SampleArrays, mode: str, pad_multiple: int) -> np.ndarray:
    """Attention work per microbatch: the sum of squared segment lengths, what varlen attention spends (each sample
    attends within itself). Padded rows run dense attention: each row costs its padded length squared."""
    rows = _shift_free_sums(b, s)
    return _attention(b, rows, mode, *_padded_cost(b, rows.tokens, pad_multiple))


def from_rows(samples: np.ndarray, row_bounds: np.ndarray, rows_per_batch: int) -> Batches:
    """Group consecutive rows into microbatches of `rows_per_batch` (the last may hold fewer)."""
    n_rows = row_bounds.shape[0] - 1
    batch_bounds = np.arange(0, n_rows + rows_per_batch, rows_per_batch, dtype=np.int64)
    batch_bounds[-1] = n_rows
    if batch_bounds.shape[0] >= 2 and batch_bounds[-2] == n_rows:
        batch_bounds = batch_bounds[:-1]
    return Batches(samples.astype(np.int64, copy=False), row_bounds.astype(np.int64, copy=False), batch_bounds)


def permute_rows(b: Batches, row_order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(samples, row_bounds) with rows taken in `row_order`."""
    sizes = b.samples_per_row()[row_order]
    bounds = np.zeros(row_order.shape[0] + 1, dtype=np.int64)
    np.cumsum(sizes, out=bounds[1:])
    starts = b.row_bounds[:-1][row_order]
    gather = np.repeat(starts - bounds[:-1], sizes)
    gather += np.arange(bounds[-1], dtype=np.int64)  # in place: one item-sized temporary, not two
    return b.samples[gather], bounds


def permute_batches(b: Batches, batch_order: np.ndarray) -> Batches:
    """The same microbatches in another order (contents untouched)."""
    rows_per = b.rows_per_batch()[batch_order]
    row_order = np.repeat(b.batch_bounds[:-1][batch_order], rows_per) + (
        np.arange(rows_per.sum(), dtype=np.int64) - np.repeat(np.cumsum(rows_per) - rows_per, rows_per)
    )
    samples, row_bounds = permute_rows(b, row_order)
    batch_bounds = np.zeros(batch_order.shape[0] + 1, dtype=np.int64)
    np.cumsum(rows_per, out=batch_bounds[1:])
    return Batches(samples, row_bounds, batch_bounds)
