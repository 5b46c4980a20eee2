"""Subset trades between two microbatches: the local move behind microbatch, fixed-count and within-update balance.

A window is a set of at most 64 microbatches. Each round sorts them by label count and pairs the heaviest half with
the lightest half — round 0 heaviest with lightest, round r rotating the light partners by r — and each pair
trades the subsets of samples (up to three a side) that bring their label counts closest to each other::

    row A (high):  [a1 a2 a3 a4]  labels 900        give {a2}     (len 310, 250 labels)
    row B (low):   [b1 b2 b3]     labels 300        take {b3, b1} (len 305,  40 labels)
    after:         A 690, B 510   — lengths moved net 5 tokens, which fit B's free space

Rows filled to 99.99% by first-fit-decreasing leave almost no free space, so a trade needs subsets of (nearly)
equal length: single swaps rarely find one, subsets of two and three samples multiply the candidates (a row of 27
samples has 378 subsets of size <= 2; the first SUB_CAP are kept: a table of 128 trades as well as one of 1024 at
capacity 16384, and at 4096 reaches label CV 0.191 instead of 0.189 with 256 in two thirds of the time), and the
feasible ones are found by a merge join of the two rows' length-sorted tables (cached per row, rebuilt only after
the row trades). Rotating partners matters as much: a heavy row of a few long samples shares equal-length subsets
with only some rows, and meets a new one every round.

A trade is taken only if it strictly narrows the pair's label gap (for `flattened`, neither the label gap nor the
token gap may widen), and only if neither microbatch's padded cost grows past the plan's peak nor the pair's cost
total past what it was. The pair's label total is unchanged, so a narrower gap always lowers the plan's label
variance: every trade is an improvement, and no change is kept that is not one.

It stops on its own: a window ends after `rounds` pairing rounds, or after IDLE rounds in a row that lower its
spread by under MIN_GAIN; a pass ends when its windows do; the caller runs at most `balance_passes` passes and
stops after one that makes no trade. Cost per round and pair: the two rows' subset tables (at most SUB_CAP
subsets, rebuilt only after their row traded: O(SUB_CAP log) each) and a merge join of at most SUB_CAP x
`scan_limit` candidates, so O(microbatches x rounds x passes) with a constant of ~4k candidate checks, in
parallel over windows.

The kernel's data is three structures: `State` (the plan's arrays the trades read and change), `Rules` (the
scalars that bound a trade and a window) and `Tables` (one window's subset tables).

Modes (`cost_mode`): PACKED (rows of items, capacity per row, microbatch cost = rows x padded longest row),
FLATTENED (one row, exact item counts, cost = tokens), PADDED (one group of items per microbatch, exact counts,
cost = items x padded longest item). Under `--shift row` the first sample of every row stays put (`pinned`), so each
row's "first label is not a target" correction never changes.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from plancc.jit import numba

SUB_CAP = 128  # subsets enumerated per row (singles, then pairs, then triples)
IDLE = 8  # idle rounds in a row before a window gives up
MIN_GAIN = 0.002  # a round is idle when it lowers the window's spread (`_spread`) by less than this share
LOCAL = 62  # samples of a row that take part (bit masks); the rest of a long row stays put

# the kernel's cost modes (a layout's mode as a number numba compiles in as a constant)
PACKED, FLATTENED, PADDED = 0, 1, 2


class State(NamedTuple):
    """The plan as the trades see it, over kernel rows (packed/flattened: plan rows; padded: one a microbatch).
    Trades change `row_of` and the four totals in place; the rest is read only."""

    row_items_bounds: np.ndarray  # CSR over kernel rows of the items each holds at the start
    row_items: np.ndarray
    row_of: np.ndarray  # kernel row of each item
    pinned: np.ndarray  # items that never move (row shift: a row's first sample)
    item_len: np.ndarray
    item_val: np.ndarray  # labels an item brings (see `_common.item_values`)
    row_tok: np.ndarray  # tokens and labels per kernel row
    row_val: np.ndarray
    mb_val: np.ndarray  # labels and the secondary value (tokens, or attention with `Rules.square`) per microbatch
    mb_tok: np.ndarray
    row_cap: np.ndarray  # tokens a kernel row may hold
    batch_bounds: np.ndarray  # CSR of kernel rows per microbatch


class Rules(NamedTuple):
    """What a trade may do and when a window stops (scalars)."""

    pm: int  # pad multiple
    peak: int  # no microbatch's padded cost above this
    cost_mode: int  # PACKED, FLATTENED or PADDED (module docstring)
    max_sub: int  # items a side of a trade
    tok_weight: float  # weight of the squared secondary gap (`mb_tok`: flattened tokens, or attention), else 0
    square: bool  # the secondary value of an item is its squared length (attention work), not its length
    rounds: int  # pairing rounds per window
    scan_limit: int  # partner subsets examined per subset
    tol: int  # label gaps this small are left alone


class Tables(NamedTuple):
    """One window's subset tables, a slot per kernel row of the window (`slot_of`), rebuilt after a trade."""

    slot_of: np.ndarray  # kernel row -> slot (shared by all windows; each writes its own rows)
    valid: np.ndarray  # slot's table is up to date
    n: np.ndarray  # items of the slot (at most LOCAL, unpinned)
    items: np.ndarray  # (slots, LOCAL)
    k: np.ndarray  # subsets of the slot
    sub_len: np.ndarray  # (slots, SUB_CAP): each subset's tokens, labels, item bit mask
    sub_val: np.ndarray
    sub_mask: np.ndarray
    order: np.ndarray  # subsets by length
    sorted_len: np.ndarray  # their lengths in that order
    tmp: np.ndarray  # scratch for sorting
    keep_a: np.ndarray  # scratch for a trade's item lists
    keep_b: np.ndarray


@numba.njit(cache=True, inline="always")
def _padded(x, pm):
    return -(-x // pm) * pm


@numba.njit(cache=True)
def _mb_cost(mb, row_a, new_a, row_b, new_b, batch_bounds, row_tok, pm, cost_mode):
    """Cost of microbatch `mb` if rows row_a/row_b took new token totals (packed and flattened)."""
    longest = 0
    for r in range(batch_bounds[mb], batch_bounds[mb + 1]):
        t = row_tok[r]
        if r == row_a:
            t = new_a
        elif r == row_b:
            t = new_b
        if t > longest:
            longest = t
    if cost_mode == FLATTENED:
        return _padded(longest, pm)
    return (batch_bounds[mb + 1] - batch_bounds[mb]) * _padded(longest, pm)


@numba.njit(cache=True)
def _subsets(items, n, item_len, item_val, max_sub, exact, out_len, out_val, out_mask):
    """Subsets of `items[:n]` of size 0 (unless `exact`), 1, 2, 3 (up to `max_sub`), at most SUB_CAP of them."""
    k = 0
    if not exact:
        out_len[0] = 0
        out_val[0] = 0
        out_mask[0] = 0
        k = 1
    for x in range(n):
        if k >= SUB_CAP:
            return k
        out_len[k] = item_len[items[x]]
        out_val[k] = item_val[items[x]]
        out_mask[k] = np.int64(1) << x
        k += 1
    if max_sub >= 2:
        for x in range(n):
            lx = item_len[items[x]]
            vx = item_val[items[x]]
            for y in range(x + 1, n):
                if k >= SUB_CAP:
                    return k
                out_len[k] = lx + item_len[items[y]]
                out_val[k] = vx + item_val[items[y]]
                out_mask[k] = (np.int64(1) << x) | (np.int64(1) << y)
                k += 1
    if max_sub >= 3 and n <= 16:
        for x in range(n):
            lx = item_len[items[x]]
            vx = item_val[items[x]]
            for y in range(x + 1, n):
                lxy = lx + item_len[items[y]]
                vxy = vx + item_val[items[y]]
                for z in range(y + 1, n):
                    if k >= SUB_CAP:
                        return k
                    out_len[k] = lxy + item_len[items[z]]
                    out_val[k] = vxy + item_val[items[z]]
                    out_mask[k] = (np.int64(1) << x) | (np.int64(1) << y) | (np.int64(1) << z)
                    k += 1
    return k


@numba.njit(cache=True, inline="always")
def _popcount(m):
    c = 0
    while m:
        m &= m - 1
        c += 1
    return c


@numba.njit(cache=True, inline="always")
def _secondary(items, sl, mask, item_len, length, square):
    """A subset's secondary value: its `length`, or the sum of its items' squared lengths."""
    if not square:
        return length
    out = 0
    for x in range(LOCAL):
        if (mask >> x) & 1:
            out += item_len[items[sl, x]] * item_len[items[sl, x]]
    return out


@numba.njit(cache=True)
def _max_len_after(c_items, sl, n, item_len, out_mask, sl_in, in_mask):
    """Longest item of table row `sl` after removing its `out_mask` items and adding `in_mask` of row `sl_in`."""
    m = 0
    for x in range(n):
        if (out_mask >> x) & 1:
            continue
        m = max(m, item_len[c_items[sl, x]])
    for x in range(LOCAL):
        if (in_mask >> x) & 1:
            m = max(m, item_len[c_items[sl_in, x]])
    return m


@numba.njit(cache=True)
def _stable_order(keys, k, order, tmp):
    """Stable ascending order of the non-negative `keys[:k]` into `order[:k]`: LSD radix sort, 8 bits a pass.

    A subset table is re-sorted after every trade of its row; this is three times faster there than argsort.
    """
    top = 0
    for i in range(k):
        order[i] = i
        top = max(top, keys[i])
    count = np.empty(257, dtype=np.int64)
    src, dst = order, tmp
    flipped = False
    shift = 0
    while (top >> shift) > 0:
        count[:] = 0
        for i in range(k):
            count[((keys[src[i]] >> shift) & 255) + 1] += 1
        for d in range(256):
            count[d + 1] += count[d]
        for i in range(k):
            d = (keys[src[i]] >> shift) & 255
            dst[count[d]] = src[i]
            count[d] += 1
        src, dst = dst, src
        flipped = not flipped
        shift += 8
    if flipped:
        order[:k] = tmp[:k]


@numba.njit(cache=True, inline="always")
def _rebuild(sl, t, item_len, item_val, max_sub, exact):
    """Rebuild the subset table of slot `sl` after its row changed (callers check `t.valid` first)."""
    k = _subsets(t.items[sl], t.n[sl], item_len, item_val, max_sub, exact, t.sub_len[sl], t.sub_val[sl],
                 t.sub_mask[sl])
    order = t.order[sl]
    _stable_order(t.sub_len[sl], k, order, t.tmp)
    for i in range(k):
        t.sorted_len[sl, i] = t.sub_len[sl, order[i]]
    t.k[sl] = k
    t.valid[sl] = True


@numba.njit(cache=True)
def _trade_round(mbs, order, rnd, s, r, t):
    """One pairing round of a window (`order`: its microbatches by label count, heaviest first; see
    `exchange_windows`). Each pair makes its best trade, if any, in place; returns the number made.

    A pair's best trade leaves the smallest label gap (plus weighted token gap) within the rules; the first one
    leaving a gap within `tol` is good enough. For each subset of an A row, by length, B's subsets that keep both
    rows within their capacity form a window of lengths that only moves up: a merge join of the two length-sorted
    tables, `scan_limit` candidates each. The search is written inline, in one call per round: a call per pair
    pays reference counting on every array it is given, and as an inlined function with early returns it ran
    12-15% slower (capacity 4096, one thread, interleaved).
    """
    k = mbs.shape[0]
    half = k // 2
    made = 0
    for q in range(half):
        mb_a = mbs[order[q]]  # more labels
        mb_b = mbs[order[k - 1 - (q + rnd) % half]]
        if s.mb_val[mb_a] - s.mb_val[mb_b] <= r.tol and r.tok_weight == 0.0:
            continue
        bb = s.batch_bounds
        done = False
        sorted_len, sub_order, sub_len, sub_mask, sub_val = t.sorted_len, t.order, t.sub_len, t.sub_mask, t.sub_val
        exact = r.cost_mode != PACKED
        gap0 = s.mb_val[mb_a] - s.mb_val[mb_b]
        tgap0 = abs(s.mb_tok[mb_a] - s.mb_tok[mb_b])
        best_score = float(gap0) * gap0 + r.tok_weight * float(tgap0) * tgap0
        best = (np.int64(-1), np.int64(-1), np.int64(0), np.int64(0), np.int64(0), np.int64(0), np.int64(0),
                np.int64(0), np.int64(0), np.int64(0))
        simple_cost = r.cost_mode == PACKED and r.pm == 1 and bb[mb_a + 1] - bb[mb_a] == 1 and bb[mb_b + 1] - bb[mb_b] == 1
        for ra in range(bb[mb_a], bb[mb_a + 1]):
            sl_a = t.slot_of[ra]
            if not t.valid[sl_a]:
                _rebuild(sl_a, t, s.item_len, s.item_val, r.max_sub, exact)
            na = t.n[sl_a]
            ka = t.k[sl_a]
            for rb in range(bb[mb_b], bb[mb_b + 1]):
                sl_b = t.slot_of[rb]
                if not t.valid[sl_b]:
                    _rebuild(sl_b, t, s.item_len, s.item_val, r.max_sub, exact)
                nb = t.n[sl_b]
                kb = t.k[sl_b]
                if ka == 0 or kb == 0:
                    continue
                free_a = s.row_cap[ra] - s.row_tok[ra]
                free_b = s.row_cap[rb] - s.row_tok[rb]
                old_a = 0
                old_b = 0
                if r.cost_mode == PADDED:
                    old_a = na * _padded(_max_len_after(t.items, sl_a, na, s.item_len, 0, sl_b, 0), r.pm)
                    old_b = nb * _padded(_max_len_after(t.items, sl_b, nb, s.item_len, 0, sl_a, 0), r.pm)
                elif not simple_cost:
                    old_a = _mb_cost(mb_a, -1, 0, -1, 0, bb, s.row_tok, r.pm, r.cost_mode)
                    old_b = _mb_cost(mb_b, -1, 0, -1, 0, bb, s.row_tok, r.pm, r.cost_mode)
                start = 0
                for i in range(ka):
                    x = sub_order[sl_a, i]
                    la = sub_len[sl_a, x]
                    mask_a = sub_mask[sl_a, x]
                    sza = _popcount(mask_a)
                    # B's subset length lb: row_a ends at tok_a - la + lb <= cap_a, row_b at tok_b - lb + la <= cap_b
                    lo = la - free_b
                    hi = la + free_a
                    while start < kb and sorted_len[sl_b, start] < lo:
                        start += 1
                    scanned = 0
                    for y in range(start, kb):
                        if sorted_len[sl_b, y] > hi or scanned >= r.scan_limit:
                            break
                        scanned += 1
                        z = sub_order[sl_b, y]
                        mask_b = sub_mask[sl_b, z]
                        if sza == 0 and mask_b == 0:
                            continue
                        if exact and _popcount(mask_b) != sza:
                            continue
                        lb = sub_len[sl_b, z]
                        va = sub_val[sl_a, x]
                        vb = sub_val[sl_b, z]
                        gap = gap0 - 2 * (va - vb)  # va - vb labels move from A to B
                        if abs(gap) >= abs(gap0):
                            continue
                        tgap = 0
                        sa = la
                        sb = lb
                        if r.cost_mode == FLATTENED or r.tok_weight > 0.0:  # the secondary gap may not widen either
                            sa = _secondary(t.items, sl_a, mask_a, s.item_len, la, r.square)
                            sb = _secondary(t.items, sl_b, mask_b, s.item_len, lb, r.square)
                            tgap = abs((s.mb_tok[mb_a] - sa + sb) - (s.mb_tok[mb_b] - sb + sa))
                            if tgap > tgap0:
                                continue
                        score = float(gap) * gap + r.tok_weight * float(tgap) * tgap
                        if score >= best_score:
                            continue
                        if not simple_cost:  # neither microbatch above the peak, the pair's total not above before
                            if r.cost_mode == PADDED:
                                ca = na * _padded(_max_len_after(t.items, sl_a, na, s.item_len, mask_a, sl_b, mask_b),
                                                  r.pm)
                                cb = nb * _padded(_max_len_after(t.items, sl_b, nb, s.item_len, mask_b, sl_a, mask_a),
                                                  r.pm)
                            else:
                                new_a = s.row_tok[ra] - la + lb
                                new_b = s.row_tok[rb] - lb + la
                                ca = _mb_cost(mb_a, ra, new_a, rb, new_b, bb, s.row_tok, r.pm, r.cost_mode)
                                cb = _mb_cost(mb_b, ra, new_a, rb, new_b, bb, s.row_tok, r.pm, r.cost_mode)
                            if ca > r.peak or cb > r.peak or ca + cb > old_a + old_b:
                                continue
                        best_score = score
                        best = (np.int64(ra), np.int64(rb), mask_a, mask_b, la, lb, va, vb, sa, sb)
                        if abs(gap) <= r.tol and r.tok_weight == 0.0:
                            done = True
                            break
                    if done:
                        break
                if done:
                    break
            if done:
                break
        if best[0] >= 0:
            _apply_trade(mb_a, mb_b, best, s, t)
            made += 1
    return made


@numba.njit(cache=True)
def _refill(items, sl, incoming, n_in, in_mask, own, n_own, own_mask):
    """Table slot `sl`'s items after a trade: those it receives, then those it keeps (at most LOCAL); returns the
    count."""
    n = 0
    for x in range(n_in):
        if (in_mask >> x) & 1 and n < LOCAL:
            items[sl, n] = incoming[x]
            n += 1
    for x in range(n_own):
        if not (own_mask >> x) & 1 and n < LOCAL:
            items[sl, n] = own[x]
            n += 1
    return n


@numba.njit(cache=True, inline="always")
def _apply_trade(mb_a, mb_b, trade, s, t):
    """Row ra gives its `mask_a` items (la tokens, va labels) to rb for rb's `mask_b` items (lb, vb): the items'
    rows, both subset tables' item lists (marked for rebuilding) and the row and microbatch totals."""
    ra, rb, mask_a, mask_b, la, lb, va, vb, sa, sb = trade
    sl_a = t.slot_of[ra]
    sl_b = t.slot_of[rb]
    n_a = t.n[sl_a]
    n_b = t.n[sl_b]
    t.keep_a[:n_a] = t.items[sl_a, :n_a]
    t.keep_b[:n_b] = t.items[sl_b, :n_b]
    for x in range(n_a):
        if (mask_a >> x) & 1:
            s.row_of[t.keep_a[x]] = rb
    for x in range(n_b):
        if (mask_b >> x) & 1:
            s.row_of[t.keep_b[x]] = ra
    t.n[sl_a] = _refill(t.items, sl_a, t.keep_b, n_b, mask_b, t.keep_a, n_a, mask_a)
    t.n[sl_b] = _refill(t.items, sl_b, t.keep_a, n_a, mask_a, t.keep_b, n_b, mask_b)
    t.valid[sl_a] = False
    t.valid[sl_b] = False
    s.row_tok[ra] += lb - la
    s.row_tok[rb] += la - lb
    s.row_val[ra] += vb - va
    s.row_val[rb] += va - vb
    s.mb_val[mb_a] += vb - va
    s.mb_val[mb_b] += va - vb
    s.mb_tok[mb_a] += sb - sa
    s.mb_tok[mb_b] += sa - sb


@numba.njit(cache=True)
def _spread(mbs, mb_val, mb_tok, tok_weight):
    """What the trades of a window lower: the sum of squared label deviations (plus weighted token deviations)."""
    k = mbs.shape[0]
    mv = 0.0
    mt = 0.0
    for m in mbs:
        mv += mb_val[m]
        mt += mb_tok[m]
    mv /= k
    mt /= k
    out = 0.0
    for m in mbs:
        out += (mb_val[m] - mv) ** 2 + tok_weight * (mb_tok[m] - mt) ** 2
    return out


@numba.njit(cache=True)
def _by_labels(order, mbs, mb_val):
    """Sort `order` (positions in `mbs`) by label count, heaviest first, ties by position: insertion sort, as a
    round changes only the few microbatches that traded (an argsort per round cost a sixth of the kernel)."""
    for i in range(1, order.shape[0]):
        x = order[i]
        v = mb_val[mbs[x]]
        j = i - 1
        while j >= 0 and (mb_val[mbs[order[j]]] < v or (mb_val[mbs[order[j]]] == v and order[j] > x)):
            order[j + 1] = order[j]
            j -= 1
        order[j + 1] = x


@numba.njit(cache=True)
def _tables(mbs, s, slot_of):
    """Subset tables for the kernel rows of microbatches `mbs` (item lists filled, tables to be built)."""
    nr = 0
    for m in mbs:
        nr += s.batch_bounds[m + 1] - s.batch_bounds[m]
    t = Tables(slot_of, np.zeros(nr, dtype=np.bool_), np.zeros(nr, dtype=np.int64), np.empty((nr, LOCAL), np.int64),
               np.zeros(nr, dtype=np.int64), np.empty((nr, SUB_CAP), np.int64), np.empty((nr, SUB_CAP), np.int64),
               np.empty((nr, SUB_CAP), np.int64), np.empty((nr, SUB_CAP), np.int64),
               np.empty((nr, SUB_CAP), np.int64), np.empty(SUB_CAP, np.int64), np.empty(LOCAL, np.int64),
               np.empty(LOCAL, np.int64))
    nr = 0
    for m in mbs:
        for row in range(s.batch_bounds[m], s.batch_bounds[m + 1]):
            slot_of[row] = nr
            for x in range(s.row_items_bounds[row], s.row_items_bounds[row + 1]):
                p = s.row_items[x]
                if not s.pinned[p] and t.n[nr] < LOCAL:
                    t.items[nr, t.n[nr]] = p
                    t.n[nr] += 1
            nr += 1
    return t


@numba.njit(cache=True)
def _window(mbs, s, r, slot_of):
    """Pairing rounds of one window (see `exchange_windows`); touches only the window's rows and samples."""
    t = _tables(mbs, s, slot_of)
    idle = 0
    trades = 0
    order = np.arange(mbs.shape[0])
    spread = _spread(mbs, s.mb_val, s.mb_tok, r.tok_weight)
    for rnd in range(r.rounds):
        _by_labels(order, mbs, s.mb_val)
        trades += _trade_round(mbs, order, rnd, s, r, t)
        before, spread = spread, _spread(mbs, s.mb_val, s.mb_tok, r.tok_weight)
        idle = 0 if before - spread > MIN_GAIN * before else idle + 1
        if idle >= IDLE:
            break
    return trades


@numba.njit(cache=True, parallel=True)
def exchange_windows(win_bounds, win_mbs, s, r):
    """Pairing rounds inside every window (CSR `win_bounds` over `win_mbs`) of the plan `s` (a `State`, changed
    in place) under `r` (`Rules`); returns the number of trades made.

    Round 0 pairs the heaviest microbatch with the lightest, the second with the second lightest, ...; round r
    rotates the light partners by r, so a heavy microbatch meets a new partner (and new exact-length subsets) each
    round. Pairs whose label gap is at most `tol` are left alone. A window stops after IDLE idle rounds in a row
    (rounds that lower its spread by under MIN_GAIN: at small capacities trades go on finding crumbs for long).
    Windows share no microbatch, row or sample, so they run in parallel with the same result on any thread count.
    """
    n_win = win_bounds.shape[0] - 1
    slot_of = np.zeros(s.row_tok.shape[0], dtype=np.int64)
    made = np.zeros(n_win, dtype=np.int64)
    for w in numba.prange(n_win):
        mbs = win_mbs[win_bounds[w]:win_bounds[w + 1]]
        if mbs.shape[0] >= 2:
            made[w] = _window(mbs, s, r, slot_of)
    return made.sum()
