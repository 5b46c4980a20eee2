"""Preference data's names (docs/preference.md): the samples table's columns of a pair or a label, the two roles of a
pair's completions, and the kinds of data a plan trains. Plain values, below every package: the formats write them,
the store types them, the planner and the runtime read them.

And the one mapping between completions and pairs that every draw over a recipe's data goes through (the planner's
mixture and held-out draws, `validate`'s redraw of them): `pair_members` finds each pair's two completions, and a
draw made over pairs (`per_pair` gives each pair its dataset) names completions again with `pair_samples`. A draw
therefore takes, repeats or leaves out a pair whole, on either side.
"""

from __future__ import annotations

import numpy as np

from plancc.errors import InputError

PAIR_ID_COLUMN = "pair_id"  # int64: the pair a completion belongs to (its source row)
PAIR_ROLE_COLUMN = "pair_role"  # "chosen" or "rejected"
DESIRABLE_COLUMN = "desirable"  # bool: an unpaired (KTO) completion's label
PAIR_ROLES = ("chosen", "rejected")
DATA_KINDS = ("sft", "preference", "unpaired_preference")


def pair_members(sample_id: np.ndarray, pair_id: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """(pairs, 2) positions of each pair's chosen and rejected completion, pairs in `pair_id` order; a pair
    without exactly one of each is an error naming it."""
    order = np.lexsort((~chosen, pair_id))
    pid, role = pair_id[order], chosen[order]
    starts = np.flatnonzero(np.r_[True, pid[1:] != pid[:-1]])
    sizes = np.diff(np.r_[starts, pid.shape[0]])
    bad = np.flatnonzero(sizes != 2)
    if bad.size == 0:
        bad = np.flatnonzero(~role[starts] | role[starts + 1])
    if bad.size:
        k = starts[bad[0]]
        ids = sample_id[order[k:k + sizes[bad[0]]]].tolist()
        roles = ["chosen" if c else "rejected" for c in role[k:k + sizes[bad[0]]]]
        raise InputError(f"samples table: pair {int(pid[k])} has completions {roles} (sample ids {ids}); a pair "
                         "holds one chosen and one rejected completion, kept or dropped together")
    return order.reshape(-1, 2)


def per_pair(values: np.ndarray, members: np.ndarray | None) -> np.ndarray:
    """A per-completion array (a recipe's dataset of each sample) per pair: its chosen completion's value. Without
    pairs (`members` None) the samples are the units: `values` as they are."""
    return values if members is None else values[members[:, 0]]


def pair_samples(members: np.ndarray | None, positions: np.ndarray) -> np.ndarray:
    """The completions of the pairs at `positions` (a draw over pairs, a multiset), each pair's chosen then its
    rejected one, in the draw's order; without pairs `positions` are the samples."""
    # take: indexing rows of a 2-D array is ~7x slower (a plan's every stage expands its pairs through here)
    return positions if members is None else np.take(members, positions, axis=0).reshape(-1)
