"""Label-aware packing into a given number of rows: the starting point of microbatch balance.

First-fit-decreasing rows hold items of one size class each (rows of a few long samples, rows of many short
ones) and leave almost no free space, so their label counts are far apart and few exact-length trades exist
between them. This packer deals instead: items are taken longest first in chunks of `rows` items, and each chunk
is dealt one item per row, the item whose labels most exceed its length's share (labels - rho * length, rho the
dataset's label density) to the row that is shortest of labels by the same measure. Once the dealt items hold
`1 - small` of all tokens, best fit places the short rest into the remaining space (an item that would overflow
its row on the deal joins the rest). Every row then mixes long and short samples at a label count near the mean.

Rows as full as first-fit-decreasing leaves them (often under one token of slack a row, the rows lower bound)
must close almost exactly. Best fit of the short rest gets most of the way, but can end with a few items of ~40
tokens that fit no gap while hundreds of rows keep gaps of 1-38 tokens; `left_out.close_left_out` then repacks the
rows with gaps and a stride of others. Without it, the repacking failed on many draws, more of them the larger
the plan, and balance fell off a cliff (label CV an order of magnitude higher).

`small` climbs a ladder until everything fits; when no rung fits (rows of one long sample, as at small
capacities), there is no label-aware packing and balancing starts from the plain one.
"""

from __future__ import annotations

import numpy as np

from plancc.planner.pack.best_fit import best_fit
from plancc.planner.pack.left_out import close_left_out
from plancc.planner.sort import longest_first

LADDER = (0.3, 0.5, 0.7)  # shares of tokens left to best fit, tried in turn


def pack_label_aware(lengths: np.ndarray, values: np.ndarray, capacity: int, start_tok: np.ndarray,
                     start_val: np.ndarray, rng: np.random.Generator) -> np.ndarray | None:
    """Row of each item, every row within `capacity` and non-empty; None if no rung fits.

    There are `len(start_tok)` rows; row r already holds `start_tok[r]` tokens with `start_val[r]` labels (the
    samples pinned first in their rows, or nothing). `rng` orders the rows that `close_left_out` packs again.
    """
    return pack_by_excess(lengths, *label_excess(lengths, values, start_tok, start_val), capacity, start_tok, rng)


def label_excess(lengths: np.ndarray, values: np.ndarray, start_tok: np.ndarray, start_val: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(each item's, each row's start) labels beyond their length's share: values - rho * lengths, rho the labels
    a token over items and rows together. A caller that holds nothing else of `values` frees them before packing."""
    rho = (values.sum() + start_val.sum()) / max(int(lengths.sum() + start_tok.sum()), 1)
    excess = lengths * -rho  # with one item-sized temporary instead of two
    excess += values
    return excess, start_val - rho * start_tok


def pack_by_excess(lengths: np.ndarray, excess: np.ndarray, start_excess: np.ndarray, capacity: int,
                   start_tok: np.ndarray, rng: np.random.Generator) -> np.ndarray | None:
    """`pack_label_aware` from `label_excess`'s figures."""
    rows = start_tok.shape[0]
    if rows == 0 or lengths.shape[0] + np.count_nonzero(start_tok) < rows:
        return None
    for small in LADDER:
        assign = _deal_then_fill(lengths, excess, capacity, start_tok, start_excess, small, rng)
        if assign is not None:
            return assign
    return None


def _deal_then_fill(lengths: np.ndarray, excess: np.ndarray, capacity: int, start_tok: np.ndarray,
                    start_excess: np.ndarray, small: float, rng: np.random.Generator) -> np.ndarray | None:
    """One rung: items dealt longest first, `excess` each item's labels beyond its length's share. Each item-sized
    array is freed once used (the order too: a rung that fails sorts again), for the sake of 100M-sample plans."""
    n, rows = lengths.shape[0], start_tok.shape[0]
    order = longest_first(lengths)
    row_tok = start_tok.astype(np.int64)
    row_excess = start_excess.astype(np.float64)
    assign = np.full(n, -1, dtype=np.int64)
    dealt_limit = (1.0 - small) * float(lengths.sum())
    dealt = 0.0
    deferred = []
    k = 0
    tie_order = rng.permutation(rows)  # rows of equal excess in a seeded order, not by position: with few chunks
    # (capacity 4096) the first chunk's deal would otherwise leave label counts falling along the plan
    while k < n and dealt < dealt_limit:
        chunk = order[k: k + rows]
        k += chunk.shape[0]
        items = chunk[np.argsort(-excess[chunk], kind="stable")]
        to = tie_order[np.argsort(row_excess[tie_order], kind="stable")][: items.shape[0]]
        fits = row_tok[to] + lengths[items] <= capacity
        items, to, late = items[fits], to[fits], items[~fits]
        assign[items] = to
        row_tok[to] += lengths[items]
        row_excess[to] += excess[items]
        dealt += float(lengths[items].sum())
        deferred.append(late)
    rest = np.concatenate([*deferred, order[k:]])
    del deferred, order
    rest = rest[longest_first(lengths[rest])]
    placed, _ = best_fit(lengths[rest].astype(np.int64, copy=False), int(capacity), row_tok, False)
    assign[rest] = placed  # every item is dealt or in `rest`: any item left out is one of `placed`
    del rest, placed
    if (assign < 0).any() and not close_left_out(lengths, assign, start_tok, capacity, rng):
        return None
    if (np.bincount(assign, minlength=rows) + start_tok).min() == 0:
        return None
    return assign
