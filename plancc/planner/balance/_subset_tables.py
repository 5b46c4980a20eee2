"""A window's subset tables: for each kernel row of the window, the subsets of its samples a trade may move
(`_exchange`), with their tokens, labels and item bit masks, sorted by length for the trade's merge join.

A row's table is built when a round first pairs its microbatch and rebuilt only after the row trades
(`Tables.valid`); only its first LOCAL unpinned samples take part (a bit each in a mask), and only the first SUB_CAP
subsets are kept: singles, then pairs, then triples (a longer table finds barely better trades for much more time).
A table is stored in length order, each column (tokens, labels, mask) contiguous: the merge join reads candidates
one after another, and most of them (99% in fixed-count layouts) fail its first test, so a candidate's test must
cost a few contiguous loads, not a lookup through an index.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from plancc.core.jit import numba

SUB_CAP = 128  # subsets enumerated per row (singles, then pairs, then triples)
SHORT = 32  # tables of at most this many subsets are sorted by insertion (no digit counts to clear and sum)
LOCAL = 62  # samples of a row that take part (bit masks); the rest of a long row stays put


LEN, VAL, MASK, TOP, REST = 0, 1, 2, 3, 4  # a subset table's columns (TOP and REST: padded only)
BITS = 3  # packed only: column 3 holds the table's lengths as a bitmap (`has_length`), 32 bits to each of its words
SPAN = 32 * SUB_CAP  # lengths the bitmap tells apart (longer ones share its bits, modulo SPAN: a power of two)
ORDER, SORT, DIGITS = 3, 4, 5  # rows of `Tables.scratch` after a table's LEN, VAL, MASK as enumerated: its order by
# length, scratch for sorting, and the sort's digit counts


class Tables(NamedTuple):
    """One window's subset tables, a slot per kernel row of the window (`slot_of`), rebuilt after a trade.
    Every array is int64 but `valid`. Columns share an array (`subsets`, `scratch`, `keep`): every call that takes
    the structure reference-counts each of its arrays (`_exchange`), and a table is built about once per kernel
    row and pass."""

    slot_of: np.ndarray  # (kernel rows,) kernel row -> slot (shared by all windows; each writes its own rows)
    valid: np.ndarray  # bool (slots,) the slot's table is up to date
    n_items: np.ndarray  # (slots,) items of the slot (at most LOCAL, unpinned)
    items: np.ndarray  # (slots, LOCAL) the slot's items
    n_subsets: np.ndarray  # (slots,) subsets of the slot (-1: not built yet in this window)
    # (slots, 3 to 5 columns, SUB_CAP) the slot's subsets by length (ties: as enumerated): column LEN their tokens,
    # VAL their labels, MASK their items (a bit per position in `items`); packed also BITS, the lengths present;
    # padded also TOP, each subset's longest item, and REST, the slot's longest item outside it
    subsets: np.ndarray
    # (6, >= SUB_CAP and 257) a slot's subsets as enumerated (LEN, VAL, MASK), their ORDER by length, SORT, DIGITS
    scratch: np.ndarray
    keep: np.ndarray  # (2, LOCAL) scratch for a trade's item lists


@numba.njit(cache=True, inline="always")
def fill_subsets(items, n_items, item_len, item_val, max_sub, exact, out):
    """Fill a subset table: subsets of `items[:n_items]` of size 0 (unless `exact`), 1, 2, 3 (up to `max_sub`; triples
    only for rows of at most 16 items), at most SUB_CAP of them; returns how many.

    Args:
        items: int64 (LOCAL,) — a slot's items.
        n_items: int — how many of them count.
        item_len, item_val: `_exchange.State` arrays.
        max_sub: int — largest subset.
        exact: bool — no empty subset (trades keep item counts).
        out: int64 (>= 3, SUB_CAP) — rows LEN, VAL, MASK written: each subset's tokens, labels and item bit mask.
    """
    count = 0
    if not exact:
        out[LEN, 0] = 0
        out[VAL, 0] = 0
        out[MASK, 0] = 0
        count = 1
    for x in range(n_items):
        if count >= SUB_CAP:
            return count
        out[LEN, count] = item_len[items[x]]
        out[VAL, count] = item_val[items[x]]
        out[MASK, count] = np.int64(1) << x
        count += 1
    if max_sub >= 2:
        for x in range(n_items):
            len_x = item_len[items[x]]
            val_x = item_val[items[x]]
            for y in range(x + 1, n_items):
                if count >= SUB_CAP:
                    return count
                out[LEN, count] = len_x + item_len[items[y]]
                out[VAL, count] = val_x + item_val[items[y]]
                out[MASK, count] = (np.int64(1) << x) | (np.int64(1) << y)
                count += 1
    if max_sub >= 3 and n_items <= 16:
        for x in range(n_items):
            len_x = item_len[items[x]]
            val_x = item_val[items[x]]
            for y in range(x + 1, n_items):
                len_xy = len_x + item_len[items[y]]
                val_xy = val_x + item_val[items[y]]
                for z in range(y + 1, n_items):
                    if count >= SUB_CAP:
                        return count
                    out[LEN, count] = len_xy + item_len[items[z]]
                    out[VAL, count] = val_xy + item_val[items[z]]
                    out[MASK, count] = (np.int64(1) << x) | (np.int64(1) << y) | (np.int64(1) << z)
                    count += 1
    return count


@numba.njit(cache=True, inline="always")
def popcount(mask):
    """Items in a subset bit mask (int64)."""
    count = 0
    while mask:
        mask &= mask - 1
        count += 1
    return count


@numba.njit(cache=True, inline="always")
def radix_order(keys, count, order, scratch, digits):
    """Stable ascending order of the non-negative `keys[:count]` into `order[:count]`: LSD radix sort in as few
    passes of at most 8 bits as the largest key needs, the bits shared evenly between them.

    A subset table is re-sorted after every trade of its row; there this beats argsort, which allocates. Even
    digits matter there: a table's keys (at most three lengths) take 14 bits at capacity 4096, two passes of 7
    bits clear and sum 2 x 129 counts where 8 + 6 bits would clear and sum 2 x 257 (a third of the sort). A short
    table (a fixed-count microbatch of four samples has ten subsets) is sorted by insertion instead: the same
    stable order without digit counts to clear and sum.

    Args:
        keys: int64 (>= count,) — the keys.
        count: int — how many to sort.
        order: int64 (>= count,) — written: positions of `keys` in ascending order, ties in position order.
        scratch: int64 (>= count,) — scratch.
        digits: int64 (>= 257,) — scratch for the digit counts (the caller's: a table's sort allocates nothing).
    """
    if count <= SHORT:
        _insertion_order(keys, count, order)
        return
    top = 0
    for i in range(count):
        order[i] = i
        top = max(top, keys[i])
    bits = 0
    while top >> bits:
        bits += 1
    passes = (bits + 7) // 8
    width = (bits + passes - 1) // passes if passes else 0
    mask = (1 << width) - 1
    src, dst = order, scratch
    flipped = False
    for p in range(passes):
        shift = p * width
        for d in range(mask + 2):
            digits[d] = 0
        for i in range(count):  # (the count of a digit does not depend on the order)
            digits[((keys[i] >> shift) & mask) + 1] += 1
        for d in range(mask + 1):
            digits[d + 1] += digits[d]
        for i in range(count):
            d = (keys[src[i]] >> shift) & mask
            dst[digits[d]] = src[i]
            digits[d] += 1
        src, dst = dst, src
        flipped = not flipped
    if flipped:
        for i in range(count):  # a loop, not a slice copy: numba compiles a slice's shape check to a formatted error
            order[i] = scratch[i]


@numba.njit(cache=True, inline="always")
def _insertion_order(keys, count, order):
    """`radix_order` of a short table (args as `radix_order`): stable insertion sort of positions by key."""
    for i in range(count):
        key = keys[i]
        j = i - 1
        while j >= 0 and keys[order[j]] > key:
            order[j + 1] = order[j]
            j -= 1
        order[j + 1] = i


@numba.njit(cache=True, inline="always")
def refill(items, slot, incoming, n_in, in_mask, own, n_own, own_mask):
    """Write slot `slot`'s items after a trade: those it receives, then those it keeps (at most LOCAL); returns
    the count. Inlined: `_exchange._apply_trade` then makes no call.

    Args:
        items: int64 (slots, LOCAL) — `Tables.items`, row `slot` written.
        incoming: int64 (LOCAL,) — the partner slot's items before the trade; `n_in` of them count.
        in_mask: int64 — bit mask of those the slot receives.
        own: int64 (LOCAL,) — the slot's items before the trade; `n_own` of them count.
        own_mask: int64 — bit mask of those it gives up.
    """
    count = 0
    for x in range(n_in):
        if (in_mask >> x) & 1 and count < LOCAL:
            items[slot, count] = incoming[x]
            count += 1
    for x in range(n_own):
        if not (own_mask >> x) & 1 and count < LOCAL:
            items[slot, count] = own[x]
            count += 1
    return count


@numba.njit(cache=True)
def rebuild_stale(pairs, n_pairs, batch_bounds, tables, item_len, item_val, max_sub, exact, tops, bits, orders,
                  ordered):
    """Build the stale tables (`Tables.valid`: not built yet, or their row traded) of every kernel row of a round's
    pairs, before their searches: enumerate (`fill_subsets`), sort (`radix_order`), store by length.

    A row's first table of a window lists its items as every pass deals them (by item, `window_tables`), so a row
    that has not traded since an earlier pass built it has the same table: its order by length, kept from then
    (`orders` where `ordered`), saves the sort, the larger part of a build. Two thirds of a plan's builds are such
    first looks (one a row and pass); the order is kept only from a first build, and a trade clears it
    (`_exchange._apply_trade`).

    The builds of a round share one call: a call reference-counts each array it takes (`_exchange`), 20 atomic
    operations a table when each build was one. A round's pairs share no microbatch, so no search of the round
    changes a table another one reads. Its rows lie anywhere in the plan, so what their builds read (their items'
    tokens and labels, their kept orders) is first read in one sweep, whose cache misses overlap, where one build
    after another would wait on each of its misses in turn (the sum is stored so that the compiler keeps the
    loads; a call of its own would cost the reference counts again).

    Args:
        pairs: int64 (>= n_pairs, >= 2) — the round's pairs: columns 0 and 1 their microbatches
            (`_rounds.pair_up`).
        n_pairs: int — pairs of the round.
        batch_bounds: int64 (microbatches + 1,) — `_exchange.State.batch_bounds`.
        tables: `Tables` (the stale slots' tables written).
        item_len, item_val, max_sub, exact: as `fill_subsets`.
        tops: bool — also fill columns TOP and REST (padded costs: the merge join then tests a trade's costs
            with four loads, not two scans of the slots' items).
        bits: bool — also fill column BITS (`has_length`).
        orders: uint8 (kernel rows, SUB_CAP), or no rows (no orders kept) — `_exchange.State.orders`, written.
        ordered: bool (as many rows) — which rows' `orders` hold, written.
    """
    keep = orders.shape[0] > 0
    ahead = 0
    for build in range(2):  # the same stale rows twice: first their inputs read, then their tables built
        for pair in range(n_pairs):
            for side in range(2):
                mb = pairs[pair, side]
                for row in range(batch_bounds[mb], batch_bounds[mb + 1]):
                    slot = tables.slot_of[row]
                    if tables.valid[slot]:
                        continue
                    n_items = tables.n_items[slot]
                    if not build:
                        for x in range(n_items):
                            ahead += item_len[tables.items[slot, x]] + item_val[tables.items[slot, x]]
                        if keep:
                            ahead += orders[row, 0] + orders[row, SUB_CAP - 1]
                        continue
                    count = fill_subsets(tables.items[slot], n_items, item_len, item_val, max_sub, exact,
                                         tables.scratch)
                    first = keep and tables.n_subsets[slot] < 0  # the window's first build: items as dealt
                    if first and ordered[row]:
                        for i in range(count):
                            tables.scratch[ORDER, i] = orders[row, i]
                    else:
                        radix_order(tables.scratch[LEN], count, tables.scratch[ORDER], tables.scratch[SORT],
                                    tables.scratch[DIGITS])
                        if first:
                            for i in range(count):
                                orders[row, i] = tables.scratch[ORDER, i]
                            ordered[row] = True
                    for i in range(count):
                        k = tables.scratch[ORDER, i]
                        tables.subsets[slot, LEN, i] = tables.scratch[LEN, k]
                        tables.subsets[slot, VAL, i] = tables.scratch[VAL, k]
                        tables.subsets[slot, MASK, i] = tables.scratch[MASK, k]
                    if tops:
                        _tops(tables.subsets, tables.items, slot, count, n_items, item_len)
                    if bits:
                        _bits(tables.subsets, slot, count)
                    tables.n_subsets[slot] = count
                    tables.valid[slot] = True
        if not build:
            tables.scratch[SORT, 0] = ahead


@numba.njit(cache=True, inline="always")
def _tops(subsets, items, slot, count, n_items, item_len):
    """Columns TOP and REST of `slot`'s first `count` subsets (padded costs): each one's longest item, and the
    slot's longest item outside it.

    Args:
        subsets, items: `Tables` arrays (`subsets` written).
        slot, count, n_items: int — the slot, its subsets and its items.
        item_len: `_exchange.State.item_len`.
    """
    for i in range(count):
        mask = subsets[slot, MASK, i]
        inside = 0
        outside = 0
        for x in range(n_items):
            length = item_len[items[slot, x]]
            if (mask >> x) & 1:
                inside = max(inside, length)
            else:
                outside = max(outside, length)
        subsets[slot, TOP, i] = inside
        subsets[slot, REST, i] = outside


@numba.njit(cache=True, inline="always")
def _bits(subsets, slot, count):
    """Column BITS of `slot`'s table: bit `length % SPAN` set for the length of each of its first `count` subsets.

    Args:
        subsets: `Tables.subsets` (`slot`'s BITS written).
        slot, count: int — the slot and its subsets.
    """
    for word in range(SUB_CAP):
        subsets[slot, BITS, word] = 0
    for i in range(count):
        at = subsets[slot, LEN, i] & (SPAN - 1)
        subsets[slot, BITS, at >> 5] |= np.int64(1) << (at & 31)


@numba.njit(cache=True, inline="always")
def has_length(subsets, slot, low, high):
    """Whether `slot`'s table may hold a subset of `low` to `high` tokens (`high - low < 32`): False only where none
    does. A few loads that rarely branch, where a step of the merge join mispredicts: most subsets of a nearly full
    row meet no partner (`_exchange`).

    Args:
        subsets: `Tables.subsets` with column BITS.
        slot: int — the slot.
        low, high: int — the lengths, 0 <= low, high - low < 32 (none when high < low).
    """
    if high < low:
        return False
    at = low & (SPAN - 1)
    word, shift = at >> 5, at & 31
    window = (subsets[slot, BITS, word] >> shift) | (subsets[slot, BITS, (word + 1) & (SUB_CAP - 1)] << (32 - shift))
    return (window & ((np.int64(1) << (high - low + 1)) - 1)) != 0


@numba.njit(cache=True)
def window_tables(window_mbs, state, slot_of, columns):
    """Subset tables for the kernel rows of the window's microbatches: item lists filled (by item), every table
    stale and never built (`n_subsets` -1).

    Args:
        window_mbs: int64 (window,) — the window's microbatches.
        state: `_exchange.State`.
        slot_of: int64 (kernel rows,) — written for the window's rows: each one's slot.
        columns: int — a table's columns: 3, 4 (packed: BITS) or 5 (padded: TOP and REST).
    """
    n_slots = 0
    for mb in window_mbs:
        n_slots += state.batch_bounds[mb + 1] - state.batch_bounds[mb]
    tables = Tables(slot_of, np.zeros(n_slots, dtype=np.bool_), np.zeros(n_slots, dtype=np.int64),
                    np.empty((n_slots, LOCAL), np.int64), np.full(n_slots, -1, dtype=np.int64),
                    np.empty((n_slots, columns, SUB_CAP), np.int64),
                    np.empty((6, max(SUB_CAP, 257)), np.int64),
                    np.empty((2, LOCAL), np.int64))
    slot = 0
    for mb in window_mbs:
        for row in range(state.batch_bounds[mb], state.batch_bounds[mb + 1]):
            slot_of[row] = slot
            for x in range(state.row_items_bounds[row], state.row_items_bounds[row + 1]):
                item = state.row_items[x]
                if not state.pinned[item] and tables.n_items[slot] < LOCAL:
                    tables.items[slot, tables.n_items[slot]] = item
                    tables.n_items[slot] += 1
            slot += 1
    return tables
