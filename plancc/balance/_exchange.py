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

Modes (`cost_mode`): 0 packed (rows of items, capacity per row, microbatch cost = rows x padded longest row),
1 flattened (one row, exact item counts, cost = tokens), 2 padded (one group of items per microbatch, exact counts,
cost = items x padded longest item). Under `--shift row` the first sample of every row stays put (`pinned`), so each
row's "first label is not a target" correction never changes.
"""

from __future__ import annotations

import numpy as np

from plancc.jit import numba

SUB_CAP = 128  # subsets enumerated per row (singles, then pairs, then triples)
IDLE = 8  # idle rounds in a row before a window gives up
MIN_GAIN = 0.002  # a round is idle when it lowers the window's spread (`_spread`) by less than this share
LOCAL = 62  # samples of a row that take part (bit masks); the rest of a long row stays put


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
    if cost_mode == 1:
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


@numba.njit(cache=True)
def _rebuild(sl, item_len, item_val, max_sub, exact, c_valid, c_n, c_items, c_k, c_len, c_val, c_mask, c_order,
             c_sorted, tmp):
    """Rebuild the subset table of slot `sl` after its row changed (callers check `c_valid` first: a call costs
    reference counting on every array argument, which would dominate the cached case)."""
    n = c_n[sl]
    k = _subsets(c_items[sl], n, item_len, item_val, max_sub, exact, c_len[sl], c_val[sl], c_mask[sl])
    order = c_order[sl]
    _stable_order(c_len[sl], k, order, tmp)
    for i in range(k):
        c_sorted[sl, i] = c_len[sl, order[i]]
    c_k[sl] = k
    c_valid[sl] = True


@numba.njit(cache=True)
def _trade_round(mbs, order, rnd, row_of, item_len, row_tok, row_val, mb_val, mb_tok, row_cap, batch_bounds, pm, peak,
                 cost_mode, max_sub, tok_weight, scan_limit, keep_a, keep_b, slot_of, c_valid, c_n, c_items, c_k,
                 c_len, c_val, c_mask, c_order, c_sorted, tmp, item_val, tol):
    """One pairing round of a window (`order`: its microbatches by label count, heaviest first; see
    `exchange_windows`). Each pair makes its best trade, if any, in place; returns the number made.

    One call per round rather than per pair: a call pays reference counting on each of its array arguments, which
    cost as much as the search itself when most pairs find no trade.
    """
    k = mbs.shape[0]
    half = k // 2
    exact = cost_mode != 0
    made = 0
    for x in range(half):
        mb_a = mbs[order[x]]  # more labels
        mb_b = mbs[order[k - 1 - (x + rnd) % half]]
        if mb_val[mb_a] - mb_val[mb_b] <= tol and tok_weight == 0.0:
            continue
        gap0 = mb_val[mb_a] - mb_val[mb_b]
        tgap0 = abs(mb_tok[mb_a] - mb_tok[mb_b])
        best_score = float(gap0) * gap0 + tok_weight * float(tgap0) * tgap0
        found = False
        best_ra = -1
        best_rb = -1
        best_ma = 0
        best_mb = 0
        best_la = 0
        best_lb = 0
        best_va = 0
        best_vb = 0
        simple_cost = cost_mode == 0 and pm == 1 and batch_bounds[mb_a + 1] - batch_bounds[mb_a] == 1 and \
            batch_bounds[mb_b + 1] - batch_bounds[mb_b] == 1
        done = False  # a trade leaving a gap within `tol` is good enough: stop looking
        for ra in range(batch_bounds[mb_a], batch_bounds[mb_a + 1]):
            sl_a = slot_of[ra]
            if not c_valid[sl_a]:
                _rebuild(sl_a, item_len, item_val, max_sub, exact, c_valid, c_n, c_items, c_k, c_len, c_val, c_mask,
                         c_order, c_sorted, tmp)
            na = c_n[sl_a]
            ka = c_k[sl_a]
            for rb in range(batch_bounds[mb_b], batch_bounds[mb_b + 1]):
                sl_b = slot_of[rb]
                if not c_valid[sl_b]:
                    _rebuild(sl_b, item_len, item_val, max_sub, exact, c_valid, c_n, c_items, c_k, c_len, c_val,
                             c_mask, c_order, c_sorted, tmp)
                nb = c_n[sl_b]
                kb = c_k[sl_b]
                if ka == 0 or kb == 0:
                    continue
                free_a = row_cap[ra] - row_tok[ra]
                free_b = row_cap[rb] - row_tok[rb]
                old_a = 0
                old_b = 0
                if cost_mode == 2:
                    old_a = na * _padded(_max_len_after(c_items, sl_a, na, item_len, 0, sl_b, 0), pm)
                    old_b = nb * _padded(_max_len_after(c_items, sl_b, nb, item_len, 0, sl_a, 0), pm)
                elif not simple_cost:
                    old_a = _mb_cost(mb_a, -1, 0, -1, 0, batch_bounds, row_tok, pm, cost_mode)
                    old_b = _mb_cost(mb_b, -1, 0, -1, 0, batch_bounds, row_tok, pm, cost_mode)
                start = 0
                for i in range(ka):  # A's subsets by length: B's feasible window [lo, hi] only moves up (merge join)
                    x = c_order[sl_a, i]
                    la = c_len[sl_a, x]
                    mask_a = c_mask[sl_a, x]
                    sza = _popcount(mask_a)
                    # B's subset length lb: row_a ends at tok_a - la + lb <= cap_a, row_b at tok_b - lb + la <= cap_b
                    lo = la - free_b
                    hi = la + free_a
                    while start < kb and c_sorted[sl_b, start] < lo:
                        start += 1
                    scanned = 0
                    for y in range(start, kb):
                        if c_sorted[sl_b, y] > hi or scanned >= scan_limit:
                            break
                        scanned += 1
                        z = c_order[sl_b, y]
                        mask_b = c_mask[sl_b, z]
                        if sza == 0 and mask_b == 0:
                            continue
                        if exact and _popcount(mask_b) != sza:
                            continue
                        lb = c_len[sl_b, z]
                        va = c_val[sl_a, x]
                        vb = c_val[sl_b, z]
                        d = va - vb  # labels moving from A to B
                        gap = gap0 - 2 * d
                        if abs(gap) >= abs(gap0):
                            continue
                        tgap = 0
                        if cost_mode == 1:
                            tgap = abs((mb_tok[mb_a] - la + lb) - (mb_tok[mb_b] - lb + la))
                            if tgap > tgap0:
                                continue
                        score = float(gap) * gap + tok_weight * float(tgap) * tgap
                        if score >= best_score:
                            continue
                        if not simple_cost:  # neither microbatch above the peak, the pair's total not above before
                            if cost_mode == 2:
                                ca = na * _padded(_max_len_after(c_items, sl_a, na, item_len, mask_a, sl_b, mask_b), pm)
                                cb = nb * _padded(_max_len_after(c_items, sl_b, nb, item_len, mask_b, sl_a, mask_a), pm)
                            else:
                                new_a = row_tok[ra] - la + lb
                                new_b = row_tok[rb] - lb + la
                                ca = _mb_cost(mb_a, ra, new_a, rb, new_b, batch_bounds, row_tok, pm, cost_mode)
                                cb = _mb_cost(mb_b, ra, new_a, rb, new_b, batch_bounds, row_tok, pm, cost_mode)
                            if ca > peak or cb > peak or ca + cb > old_a + old_b:
                                continue
                        best_score = score
                        found = True
                        best_ra = ra
                        best_rb = rb
                        best_ma = mask_a
                        best_mb = mask_b
                        best_la = la
                        best_lb = lb
                        best_va = va
                        best_vb = vb
                        if abs(gap) <= tol and tok_weight == 0.0:
                            done = True
                            break
                    if done:
                        break
                if done:
                    break
            if done:
                break
        if not found:
            continue
        _apply_trade(best_ra, best_rb, mb_a, mb_b, best_ma, best_mb, best_la, best_lb, best_va, best_vb, row_of,
                     slot_of, c_items, c_n, c_valid, keep_a, keep_b, row_tok, row_val, mb_val, mb_tok)
        made += 1
    return made


@numba.njit(cache=True)
def _refill(c_items, sl, incoming, n_in, in_mask, own, n_own, own_mask):
    """Table slot `sl`'s items after a trade: those it receives, then those it keeps (at most LOCAL); returns the
    count."""
    n = 0
    for x in range(n_in):
        if (in_mask >> x) & 1 and n < LOCAL:
            c_items[sl, n] = incoming[x]
            n += 1
    for x in range(n_own):
        if not (own_mask >> x) & 1 and n < LOCAL:
            c_items[sl, n] = own[x]
            n += 1
    return n


@numba.njit(cache=True)
def _apply_trade(ra, rb, mb_a, mb_b, mask_a, mask_b, la, lb, va, vb, row_of, slot_of, c_items, c_n, c_valid,
                 keep_a, keep_b, row_tok, row_val, mb_val, mb_tok):
    """Row ra gives its `mask_a` items (la tokens, va labels) to rb for rb's `mask_b` items (lb, vb): the items'
    rows, both subset tables' item lists (marked for rebuilding) and the row and microbatch totals."""
    sl_a = slot_of[ra]
    sl_b = slot_of[rb]
    n_a = c_n[sl_a]
    n_b = c_n[sl_b]
    keep_a[:n_a] = c_items[sl_a, :n_a]
    keep_b[:n_b] = c_items[sl_b, :n_b]
    for x in range(n_a):
        if (mask_a >> x) & 1:
            row_of[keep_a[x]] = rb
    for x in range(n_b):
        if (mask_b >> x) & 1:
            row_of[keep_b[x]] = ra
    c_n[sl_a] = _refill(c_items, sl_a, keep_b, n_b, mask_b, keep_a, n_a, mask_a)
    c_n[sl_b] = _refill(c_items, sl_b, keep_a, n_a, mask_a, keep_b, n_b, mask_b)
    c_valid[sl_a] = False
    c_valid[sl_b] = False
    row_tok[ra] += lb - la
    row_tok[rb] += la - lb
    row_val[ra] += vb - va
    row_val[rb] += va - vb
    mb_val[mb_a] += vb - va
    mb_val[mb_b] += va - vb
    mb_tok[mb_a] += lb - la
    mb_tok[mb_b] += la - lb


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
def _window(mbs, row_items_bounds, row_items, row_of, pinned, item_len, item_val, row_tok, row_val, mb_val, mb_tok,
            row_cap, batch_bounds, pm, peak, cost_mode, max_sub, tok_weight, rounds, scan_limit, tol, slot_of):
    """Pairing rounds of one window (see `exchange_windows`); touches only the window's rows and samples."""
    k = mbs.shape[0]
    nr = 0
    for m in mbs:
        nr += batch_bounds[m + 1] - batch_bounds[m]
    keep_a = np.empty(LOCAL, dtype=np.int64)
    keep_b = np.empty(LOCAL, dtype=np.int64)
    c_valid = np.zeros(nr, dtype=np.bool_)
    c_n = np.zeros(nr, dtype=np.int64)
    c_k = np.zeros(nr, dtype=np.int64)
    c_items = np.empty((nr, LOCAL), dtype=np.int64)
    c_len = np.empty((nr, SUB_CAP), dtype=np.int64)
    c_val = np.empty((nr, SUB_CAP), dtype=np.int64)
    c_mask = np.empty((nr, SUB_CAP), dtype=np.int64)
    c_order = np.empty((nr, SUB_CAP), dtype=np.int64)
    c_sorted = np.empty((nr, SUB_CAP), dtype=np.int64)
    tmp = np.empty(SUB_CAP, dtype=np.int64)
    nr = 0
    for m in mbs:
        for r in range(batch_bounds[m], batch_bounds[m + 1]):
            slot_of[r] = nr
            for x in range(row_items_bounds[r], row_items_bounds[r + 1]):
                p = row_items[x]
                if not pinned[p] and c_n[nr] < LOCAL:
                    c_items[nr, c_n[nr]] = p
                    c_n[nr] += 1
            nr += 1
    idle = 0
    trades = 0
    order = np.arange(k)
    spread = _spread(mbs, mb_val, mb_tok, tok_weight)
    for rnd in range(rounds):
        _by_labels(order, mbs, mb_val)
        made = _trade_round(mbs, order, rnd, row_of, item_len, row_tok, row_val, mb_val, mb_tok, row_cap,
                            batch_bounds, pm, peak, cost_mode, max_sub, tok_weight, scan_limit, keep_a, keep_b,
                            slot_of, c_valid, c_n, c_items, c_k, c_len, c_val, c_mask, c_order, c_sorted, tmp,
                            item_val, tol)
        trades += made
        before, spread = spread, _spread(mbs, mb_val, mb_tok, tok_weight)
        idle = 0 if before - spread > MIN_GAIN * before else idle + 1
        if idle >= IDLE:
            break
    return trades


@numba.njit(cache=True, parallel=True)
def exchange_windows(win_bounds, win_mbs, row_items_bounds, row_items, row_of, pinned, item_len, item_val,
                     row_tok, row_val, mb_val, mb_tok, row_cap, batch_bounds, pm, peak, cost_mode, max_sub,
                     tok_weight, rounds, scan_limit, tol):
    """Pairing rounds inside every window (CSR `win_bounds` over `win_mbs`); returns the number of trades made.

    Round 0 pairs the heaviest microbatch with the lightest, the second with the second lightest, ...; round r
    rotates the light partners by r, so a heavy microbatch meets a new partner (and new exact-length subsets) each
    round. Pairs whose label gap is at most `tol` are left alone. A window stops after IDLE idle rounds in a row
    (rounds that lower its spread by under MIN_GAIN: at small capacities trades go on finding crumbs for long).
    Windows share no microbatch, row or sample, so they run in parallel with the same result on any thread count.
    """
    n_win = win_bounds.shape[0] - 1
    slot_of = np.zeros(row_tok.shape[0], dtype=np.int64)
    made = np.zeros(n_win, dtype=np.int64)
    for w in numba.prange(n_win):
        mbs = win_mbs[win_bounds[w]:win_bounds[w + 1]]
        if mbs.shape[0] >= 2:
            made[w] = _window(mbs, row_items_bounds, row_items, row_of, pinned, item_len, item_val, row_tok, row_val,
                              mb_val, mb_tok, row_cap, batch_bounds, pm, peak, cost_mode, max_sub, tok_weight,
                              rounds, scan_limit, tol, slot_of)
    return made.sum()
