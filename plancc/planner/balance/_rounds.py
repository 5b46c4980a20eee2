"""A window's rounds (`_exchange`): who meets whom each round, which pairs are not worth a search, and when the
window stops.

Round r pairs the q-th heaviest microbatch of the window with the (q + r)-th lightest (mod window // 2), so a
heavy microbatch meets a new partner (and new equal-length subsets) each round; a pair that found nothing is not
searched again until one of its microbatches trades. A window stops after IDLE rounds in a row that lower its
spread by under MIN_GAIN (at small capacities trades go on finding crumbs for long).
"""

from __future__ import annotations

from plancc.core.jit import numba

IDLE = 8  # idle rounds in a row before a window gives up
MIN_GAIN = 0.002  # a round is idle when it lowers the window's spread (`window_spread`) by less than this share


@numba.njit(cache=True)
def pair_up(window_mbs, order, round_index, pairs, memo, mb_val, rules):
    """The pairs of a round worth searching, written to `pairs`; returns how many.

    Round r pairs the q-th heaviest microbatch with the (q + r)-th lightest (mod window // 2). A pair's search reads
    only its two microbatches, so a pair that found no trade finds none again until one of them trades: `memo`
    skips it (rotating partners bring the same pairs back every `window // 2` rounds).

    Args:
        window_mbs: int64 (window,) — the window's microbatches.
        order: int64 (window,) — positions in `window_mbs` by label count, heaviest first (`by_labels`).
        round_index: int — the round: the light partners rotate by it (`exchange_windows`).
        pairs: int64 (window // 2, 5) — written: (mb_a, mb_b, traded, position of mb_a, of mb_b) per pair (one
            allocation a window, not a round); `traded` is left to the search.
        memo: int64 (window + 1, window) — rows 0..window-1: the round a pair of positions last found no trade
            (-1: never); row `window`: the round each position last traded (-1: never) (`remember`).
        mb_val: `State.mb_val`.
        rules: `Rules`.
    """
    size = window_mbs.shape[0]
    half = size // 2
    n_pairs = 0
    for q in range(half):  # the pairs share no microbatch, so a trade never changes whether another pair trades
        pos_a, pos_b = order[q], order[size - 1 - (q + round_index) % half]  # pos_a: more labels
        mb_a, mb_b = window_mbs[pos_a], window_mbs[pos_b]
        fruitless = memo[pos_a, pos_b] > memo[size, pos_a] and memo[pos_a, pos_b] > memo[size, pos_b]
        # a gap of one label cannot narrow (labels move in whole units): searching it finds nothing
        if (mb_val[mb_a] - mb_val[mb_b] > max(rules.tol, 1) or rules.tok_weight != 0.0) and not fruitless:
            pairs[n_pairs, 0], pairs[n_pairs, 1] = mb_a, mb_b
            pairs[n_pairs, 3], pairs[n_pairs, 4] = pos_a, pos_b
            n_pairs += 1
    return n_pairs


@numba.njit(cache=True)
def remember(pairs, n_pairs, memo, round_index):
    """Book the round's outcome in `memo` (`pair_up`): the round each traded position last traded, or the round
    a pair last found nothing.

    Args:
        pairs: int64 (>= n_pairs, 5) — the round's pairs, `traded` written by the search.
        n_pairs: int — pairs of the round.
        memo: int64 (window + 1, window) — `pair_up`'s memo, changed in place.
        round_index: int — the round.
    """
    size = memo.shape[1]
    for pair in range(n_pairs):
        pos_a, pos_b = pairs[pair, 3], pairs[pair, 4]
        if pairs[pair, 2]:
            memo[size, pos_a] = memo[size, pos_b] = round_index
        else:
            memo[pos_a, pos_b] = round_index


@numba.njit(cache=True)
def window_spread(window_mbs, mb_val, mb_tok, tok_weight):
    """What the trades of a window lower: the sum of squared label deviations (plus weighted secondary ones).

    Args:
        window_mbs: int64 (window,) — the window's microbatches.
        mb_val, mb_tok: `State` arrays.
        tok_weight: float — `Rules.tok_weight`.
    """
    size = window_mbs.shape[0]
    mean_val = 0.0
    mean_tok = 0.0
    for mb in window_mbs:
        mean_val += mb_val[mb]
        mean_tok += mb_tok[mb]
    mean_val /= size
    mean_tok /= size
    out = 0.0
    for mb in window_mbs:
        out += (mb_val[mb] - mean_val) ** 2 + tok_weight * (mb_tok[mb] - mean_tok) ** 2
    return out


@numba.njit(cache=True)
def by_labels(order, window_mbs, mb_val):
    """Sort `order` in place by label count, heaviest first, ties by position: insertion sort, since a round
    changes only the few microbatches that traded (an argsort per round would sort from scratch).

    Args:
        order: int64 (window,) — positions in `window_mbs`, in last round's order.
        window_mbs: int64 (window,) — the window's microbatches.
        mb_val: `State.mb_val`.
    """
    for i in range(1, order.shape[0]):
        pos = order[i]
        val = mb_val[window_mbs[pos]]
        j = i - 1
        while j >= 0 and (mb_val[window_mbs[order[j]]] < val or (mb_val[window_mbs[order[j]]] == val
                                                                  and order[j] > pos)):
            order[j + 1] = order[j]
            j -= 1
        order[j + 1] = pos
