"""Shared plumbing of the balancing stages: the balanced span, label values per shift mode, windows, rebuilding.

Only the microbatches of complete updates are ever touched (`span`); the tail — the microbatches of the incomplete
final update — is copied through as is (docs/spec.md §5).
"""

from __future__ import annotations

import numpy as np

from plancc.config.settings import PlanSettings
from plancc.core.layout import complete_batches
from plancc.core.plan_arrays import (
    Batches,
    SampleArrays,
    batch_cost,
    row_sums,
    row_targets,
    row_tokens,
    segment_sum,
)
from plancc.planner.balance._exchange import FLATTENED, PACKED, PADDED, Rules, State, exchange_windows
from plancc.planner.balance._subset_tables import SUB_CAP
from plancc.planner.sort import stable_order

ORDERS_BYTES = 64 << 20  # subset tables keep their sort orders from pass to pass up to this size (a byte a subset)
SCAN = 32  # partner subsets examined per subset (the length-sorted candidates nearest in length)


def span(batches: Batches, settings: PlanSettings) -> int:
    """Number of leading microbatches that belong to complete updates (the rest is the untouched tail)."""
    return complete_batches(batches.num_batches, settings.world_size, settings.grad_accum)


def item_values(batches: Batches, samples: SampleArrays, shift: str) -> np.ndarray:
    """Per plan position, the targets its sample adds to a row it does not start (row shift) or always
    (`SampleArrays.targets`, gathered first: no temporaries the size of the samples table)."""
    values = samples.label_count[batches.samples].astype(np.int64, copy=False)
    if shift == "sample":
        values -= samples.first_label_supervised[batches.samples]
    return values


def stratified_windows(values: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Windows (CSR bounds, members) of at most `window` microbatches, each spanning the whole range of `values`.

    Microbatches are sorted by value and dealt round-robin into ceil(n / window) windows, so every window holds
    heavy and light microbatches alike and its mean sits near the global mean: balancing inside windows then
    balances the whole plan, while each trade still touches only the microbatches of one window.
    """
    n = values.shape[0]
    if n == 0:
        return np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    nw = -(-n // window)
    low = int(values.min())
    keys = (values - low).astype(np.int64, copy=False)
    order = stable_order(keys, int(values.max()) - low + 1, True)  # heaviest first, ties by position
    # the deal: window w takes ranks w, w + nw, w + 2 nw, ... (a transposed grid, not an argsort of rank % nw)
    ranks = np.arange(-(-n // nw) * nw, dtype=np.int64).reshape(-1, nw).T.ravel()
    members = order[ranks[ranks < n]]
    bounds = np.zeros(nw + 1, dtype=np.int64)
    np.cumsum(np.bincount(np.arange(n, dtype=np.int64) % nw, minlength=nw), out=bounds[1:])
    return bounds, members


def contiguous_windows(n: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Windows (CSR bounds, members) of `size` neighbours each over `0..n-1` (the last may be shorter)."""
    bounds = np.append(np.arange(0, n, size, dtype=np.int64), n).astype(np.int64)
    return bounds, np.arange(n, dtype=np.int64)


def csr_by(keys: np.ndarray, n_keys: int) -> tuple[np.ndarray, np.ndarray]:
    """(bounds, members): positions grouped by key, in position order inside a key."""
    order = stable_order(keys, n_keys)
    bounds = np.zeros(n_keys + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=n_keys), out=bounds[1:])
    return bounds, order


def split(batches: Batches, n_span: int) -> tuple[Batches, np.ndarray, np.ndarray, np.ndarray]:
    """(the span's Batches, tail samples, tail row sizes, tail rows per batch)."""
    r_end = int(batches.batch_bounds[n_span])
    p_end = int(batches.row_bounds[r_end])
    head = Batches(batches.samples[:p_end], batches.row_bounds[: r_end + 1], batches.batch_bounds[: n_span + 1])
    return head, batches.samples[p_end:], np.diff(batches.row_bounds[r_end:]), np.diff(batches.batch_bounds[n_span:])


def join(head: Batches, tail_samples: np.ndarray, tail_rows: np.ndarray, tail_batches: np.ndarray) -> Batches:
    """`split`'s inverse: the span followed by the tail as it was."""
    samples = np.concatenate([head.samples, tail_samples]).astype(np.int64, copy=False)  # no second copy
    row_bounds = np.concatenate([head.row_bounds, head.row_bounds[-1] + np.cumsum(tail_rows)]).astype(np.int64)
    batch_bounds = np.concatenate([head.batch_bounds, head.batch_bounds[-1] + np.cumsum(tail_batches)])
    return Batches(samples, row_bounds, batch_bounds.astype(np.int64))


def rebuild_rows(head: Batches, row_of: np.ndarray, pinned: np.ndarray) -> Batches:
    """The span with samples regrouped by `row_of` (pinned samples first in their row, then plan order)."""
    key = 2 * row_of
    key += ~pinned  # in place: one 10M temporary, not two
    order = stable_order(key, 2 * head.num_rows)
    del key
    counts = np.bincount(row_of, minlength=head.num_rows)
    row_bounds = np.zeros(head.num_rows + 1, dtype=np.int64)
    np.cumsum(counts, out=row_bounds[1:])
    return Batches(head.samples[order], row_bounds, head.batch_bounds.copy())


def label_sse(values: np.ndarray) -> float:
    """Sum of squared deviations from the mean: the variance every balancing stage compares before and after."""
    v = values.astype(np.float64)
    return float(((v - v.mean()) ** 2).sum()) if v.size else 0.0


__all__ = [
    "batch_cost",
    "contiguous_windows",
    "csr_by",
    "item_values",
    "join",
    "label_sse",
    "rebuild_rows",
    "row_targets",
    "row_tokens",
    "segment_sum",
    "span",
    "split",
    "stratified_windows",
]


def exchange(batches: Batches, samples: SampleArrays, settings: PlanSettings, *, windows, passes: int, rounds: int,
             tol_share: float = 0.0, square: bool = False) -> Batches:
    """Subset exchanges over the complete updates of `batches` (the tail copied through), never above today's peak cost.

    `windows(pass, mb_labels)` groups the span's microbatches; see `_exchange_span`. With `square` (packed and
    flattened) the trades' secondary gap, weighed and never widened, is the attention work (sum of squared
    lengths) instead of flattened's tokens.
    """
    n_span = span(batches, settings)
    if n_span < 2:
        return batches
    peak = int(batch_cost(batches, samples, settings.pad_multiple).max())
    head, *tail = split(batches, n_span)
    weight = attention_weight(head, samples, settings) if square else token_weight(head, samples, settings)
    new = _exchange_span(head, samples, settings, windows=windows, passes=passes, rounds=rounds, tol_share=tol_share,
                         max_sub=max_sub(settings), tok_weight=weight, peak=peak, square=square)
    return join(new, *tail)


def _exchange_span(
    head: Batches,
    samples: SampleArrays,
    settings: PlanSettings,
    *,
    windows,
    passes: int,
    rounds: int,
    tol_share: float,
    max_sub: int,
    tok_weight: float,
    peak: int,
    square: bool = False,
) -> Batches:
    """Run subset exchanges (see `_exchange`) over `head`, whose microbatches are grouped by `windows(mb_labels)`.

    `cost_mode` follows the layout: packed rows, flattened rows with exact counts, padded groups with exact counts.
    """
    mode = {"packed": PACKED, "flattened": FLATTENED, "padded": PADDED}[settings.mode]
    n_items = head.samples.shape[0]
    if head.num_batches < 2 or n_items == 0:
        return head
    lengths = samples.length[head.samples].astype(np.int64, copy=False)
    values = item_values(head, samples, settings.shift)
    row_of = head.row_of_sample()
    if mode == PADDED:  # one kernel row per microbatch holding its samples
        row_of = head.batch_of_row()[row_of]
        k_batch_bounds = np.arange(head.num_batches + 1, dtype=np.int64)
        n_rows = head.num_batches
    else:
        k_batch_bounds = head.batch_bounds.astype(np.int64)
        n_rows = head.num_rows
    pinned = np.zeros(n_items, dtype=np.bool_)
    if settings.shift == "row" and mode != PADDED:
        pinned[head.row_bounds[:-1][head.samples_per_row() > 0]] = True
    # exact targets per row (row shift: minus the first sample's first label)
    rows = row_sums(head, samples, settings.shift)
    if mode == PADDED:  # kernel rows are microbatches
        row_tok, row_val, row_sq = (segment_sum(x, head.batch_bounds)
                                    for x in (rows.tokens, rows.targets, rows.squares))
    else:
        row_tok, row_val, row_sq = rows.tokens.copy(), rows.targets.copy(), rows.squares  # the kernel changes both
    del rows
    mb_val = segment_sum(row_val, k_batch_bounds)
    # the secondary value per microbatch: attention work (the sum of its samples' squared lengths) or tokens
    mb_tok = segment_sum(row_sq if square else row_tok, k_batch_bounds)
    rows_in = np.diff(k_batch_bounds)
    if mode == PACKED:
        row_cap = np.minimum(settings.row_capacity, peak // np.repeat(rows_in, rows_in)).astype(np.int64)
    else:
        row_cap = np.full(n_rows, peak if mode == FLATTENED else 1 << 60, dtype=np.int64)
    mean = float(mb_val.mean()) if mb_val.size else 0.0
    rules = Rules(pad_multiple=int(settings.pad_multiple), peak=int(peak), cost_mode=mode, max_sub=int(max_sub),
                  tok_weight=float(tok_weight), square=bool(square), rounds=int(rounds), scan_limit=SCAN,
                  tol=int(tol_share * mean))  # label gaps this small are not worth a trade
    # the tables' orders from pass to pass (`State.orders`): none for one pass (padded's passes, within-update)
    kept = n_rows if passes > 1 and n_rows * SUB_CAP <= ORDERS_BYTES else 0
    orders, ordered = np.empty((kept, SUB_CAP), dtype=np.uint8), np.zeros(kept, dtype=np.bool_)
    for p in range(passes):
        w_bounds, w_members = windows(p, mb_val)
        if p == 0 and mode != PADDED:  # samples still in plan order: each row's items are its CSR range
            ri_bounds, ri = head.row_bounds, np.arange(n_items, dtype=np.int64)
        else:
            ri_bounds, ri = csr_by(row_of, n_rows)
        state = State(ri_bounds, ri, row_of, pinned, lengths, values, row_tok, row_val, mb_val, mb_tok, row_cap,
                      k_batch_bounds, orders, ordered)
        made = exchange_windows(w_bounds, w_members, state, rules)
        del state, ri  # 10M-item arrays: freed before the next pass's grouping and the rebuild below
        if made == 0:
            break
    del lengths, values
    if mode == PADDED:
        order = stable_order(row_of, n_rows)
        return Batches(head.samples[order], head.row_bounds.copy(), head.batch_bounds.copy())
    return rebuild_rows(head, row_of, pinned)


def max_sub(settings: PlanSettings) -> int:
    """Largest subset a side of a trade: triples for packed rows, pairs for fixed-count microbatches."""
    return 3 if settings.mode == "packed" else 2


def attention_weight(head: Batches, samples: SampleArrays, settings: PlanSettings) -> float:
    """Weight of the squared attention gap against the squared label gap: (labels / attention work)^2."""
    if head.num_batches == 0:
        return 0.0
    length = samples.length[head.samples].astype(np.float64)
    labels = float(row_targets(head, samples, settings.shift).sum())
    work = float((length * length).sum())
    return (labels / work) ** 2 if work > 0 else 0.0


def token_weight(head: Batches, samples: SampleArrays, settings: PlanSettings) -> float:
    """Weight of the squared token gap against the squared label gap (flattened only): (mean labels / tokens)^2."""
    if settings.mode != "flattened" or head.num_batches == 0:
        return 0.0
    tokens = float(samples.length[head.samples].sum())
    labels = float(row_targets(head, samples, settings.shift).sum())
    return (labels / tokens) ** 2 if tokens > 0 else 0.0

