"""The two seeded draws a plan's rows must follow, drawn again by the read side: the held-out eval set and a
recipe epoch's mixture. Written from their documented rules (docs/spec.md; `plancc.planner.holdout`,
`plancc.planner.mixture`), not with the planner's code, which the store may not import: a bug in the compiler's
draw makes `validate` (and the runtime's eval check) disagree with the plan instead of agreeing with it.

**Held out** (`eval_ids`): `val_set_size` of the samples (a count, or a fraction of them rounded to the nearest),
drawn from the sorted ids, per dataset in proportion to its size (floors, then one more to the largest remainders,
ties to the earlier dataset); each dataset (in label order) takes the first samples of one permutation of its
sorted ids from the generator `SeedSequence([seed], spawn_key=(1,))`. A recipe adds every sample of its eval
datasets and draws from its training datasets only.

**Mixture** (`epoch_positions`): dataset d of n samples contributes c samples an epoch (`repeat` r: floor(r·n +
1/2); `weight` w: w/Σw of `samples_per_epoch`, default the largest weighted dataset's size, rounded by largest
remainder): c // n full passes, and c % n = p samples from a stream of permutations of its positions drawn from
`SeedSequence([seed, 0x6D6978, d])`. Epoch e takes stream positions [e·p, (e+1)·p). Permutation 0 is a
permutation of range(n); permutation j permutes the first n - t entries of permutation j-1 and, after them, its
last t = (j·n) mod p (the window that crosses into permutation j keeps its earlier samples out of reach).

**Pairs** (preference data): both draws are made over pairs, not completions: a pair is one id (its `pair_id`,
`pair_eval_ids`) or one position (pairs in `pair_id` order, each with its chosen completion's dataset:
`plancc.core.pairs`), and what is drawn is both completions of each pair drawn.
"""

from __future__ import annotations

import numpy as np

from plancc.config.settings import PlanSettings
from plancc.core.choices import DatasetRole, MixKind
from plancc.errors import SettingsError

HOLDOUT_SPAWN_KEY = 1
MIXTURE_TAG = 0x6D6978


def _largest_remainder(exact: np.ndarray, total: int) -> np.ndarray:
    """Integers summing to `total`: each the floor of its `exact` share, plus one for the largest remainders."""
    whole = np.floor(exact).astype(np.int64)
    order = np.argsort(whole - exact, kind="stable")  # largest remainder first, ties to the earlier
    whole[order[: total - int(whole.sum())]] += 1
    return whole


def held_out_count(n: int, val_set_size: int | float) -> int:
    """Samples `val_set_size` holds out of `n`; refused when that leaves none to evaluate or none to train."""
    k = val_set_size if isinstance(val_set_size, int) else round(val_set_size * n)
    if not 1 <= k < n:
        raise SettingsError(f"val_set_size {val_set_size} holds out {k} of {n} samples (must be 1..{n - 1})",
                            "val_set_size")
    return int(k)


def held_out(sample_ids: np.ndarray, val_set_size: int | float, seed: int,
             labels: np.ndarray | None = None) -> np.ndarray:
    """The sorted ids `val_set_size` holds out of `sample_ids` (per value of `labels`, in proportion)."""
    ids = np.asarray(sample_ids, dtype=np.int64)
    labels = np.zeros(ids.size, dtype=np.int64) if labels is None else np.asarray(labels)
    k = held_out_count(ids.size, val_set_size)
    names = np.unique(labels)
    sizes = np.array([np.count_nonzero(labels == v) for v in names], dtype=np.int64)
    shares = _largest_remainder(sizes * (k / ids.size), k)
    rng = np.random.default_rng(np.random.SeedSequence([seed], spawn_key=(HOLDOUT_SPAWN_KEY,)))
    taken = []
    for value, share in zip(names, shares.tolist(), strict=True):
        members = np.sort(ids[labels == value])
        taken.append(members[rng.permutation(members.size)[:share]])
    return np.sort(np.concatenate(taken))


def eval_ids(sample_ids: np.ndarray, settings: PlanSettings, index: np.ndarray | None = None) -> np.ndarray:
    """The ids a plan of `settings` evaluates on (empty: no eval plan); `index`: a recipe's dataset of each sample
    (its position in `settings.mixture`, -1 for none)."""
    ids = np.asarray(sample_ids, dtype=np.int64)
    if index is None:
        return held_out(ids, settings.val_set_size, settings.seed) if settings.val_set_size else ids[:0]
    evals = [d for d, entry in enumerate(settings.mixture) if entry.role == DatasetRole.EVAL]
    is_eval = np.isin(index, evals)
    out = ids[is_eval]
    if settings.val_set_size:
        train = ~is_eval & (index >= 0)
        out = np.union1d(out, held_out(ids[train], settings.val_set_size, settings.seed, index[train]))
    return np.sort(out)


def pair_eval_ids(sample_ids: np.ndarray, pair_ids: np.ndarray, chosen: np.ndarray, settings: PlanSettings,
                  index: np.ndarray | None = None) -> np.ndarray:
    """`eval_ids` as preference data holds out: whole pairs, drawn by their `pair_id` (one id a pair, the chosen
    completion's `index`), both completions of each held-out pair."""
    first = np.flatnonzero(chosen)
    held = eval_ids(pair_ids[first], settings, None if index is None else index[first])
    return np.sort(np.asarray(sample_ids, dtype=np.int64)[np.isin(pair_ids, held)])


def mixture_counts(sizes: np.ndarray, settings: PlanSettings) -> np.ndarray:
    """Samples each mixture entry contributes to an epoch (0 for eval datasets)."""
    counts = np.zeros(len(settings.mixture), dtype=np.int64)
    weighted = []
    for d, entry in enumerate(settings.mixture):
        if entry.role != DatasetRole.TRAIN:
            continue
        if entry.kind == MixKind.REPEAT:
            counts[d] = int(np.floor(entry.value * int(sizes[d]) + 0.5))
        else:
            weighted.append(d)
    if weighted:
        w = np.array([settings.mixture[d].value for d in weighted], dtype=np.float64)
        total = settings.samples_per_epoch or int(max(int(sizes[d]) for d in weighted))
        counts[weighted] = _largest_remainder(w / w.sum() * total, total)
    return counts


def _stream(n: int, part: int, seed: int, dataset: int, upto: int) -> list[np.ndarray]:
    """Permutations 0..`upto` of a dataset's stream (module docstring)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, MIXTURE_TAG, dataset]))
    perms = [rng.permutation(n)]
    for j in range(1, upto + 1):
        prev, kept = perms[-1], n - (j * n) % part
        head = rng.permutation(prev[:kept])
        perms.append(np.concatenate([head, rng.permutation(prev[kept:])]) if kept < n else head)
    return perms


def epoch_positions(index: np.ndarray, settings: PlanSettings, epoch: int) -> np.ndarray:
    """Sorted positions (a multiset) of the samples epoch `epoch` of a recipe holds; `index` as in `eval_ids`."""
    members = [np.flatnonzero(index == d) for d in range(len(settings.mixture))]
    counts = mixture_counts(np.array([m.size for m in members]), settings)
    out = [np.zeros(0, dtype=np.int64)]
    for d, (m, c) in enumerate(zip(members, counts.tolist(), strict=True)):
        if c == 0 or m.size == 0:
            continue
        full, part = divmod(c, m.size)
        out += [m] * full
        if part:
            start, first = epoch * part, epoch * part // m.size  # the window starts in permutation `first`
            perms = _stream(m.size, part, settings.seed, d, (start + part - 1) // m.size)[first:]
            offset = start - first * m.size
            out.append(m[np.concatenate(perms)[offset:offset + part]])
    return np.sort(np.concatenate(out))


def dataset_index(codes: np.ndarray, names: list[str], settings: PlanSettings) -> np.ndarray:
    """Each sample's mixture entry from its dataset as `codes` into `names` (-1: a dataset the mixture lacks)."""
    position = {entry.name: d for d, entry in enumerate(settings.mixture)}
    return np.array([position.get(n, -1) for n in names] + [-1], dtype=np.int64)[np.asarray(codes, dtype=np.int64)]
