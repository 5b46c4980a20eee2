"""A recipe's mixture: which samples (and how many times each) one epoch holds, from `PlanSettings.mixture`.

Each dataset of a recipe mixes by one of:

* `repeat` r: the epoch holds round(r * n) of its n samples: r = 2 every sample twice, r = 0.5 a seeded half;
* `weight` w: its share of the weighted datasets' samples per epoch, w / sum(w) of `samples_per_epoch` (default:
  the largest weighted dataset's size). Counts are rounded by largest remainder, so they sum exactly to the
  total and each is the floor or ceiling of its target.

A count c of n samples is c // n full passes plus c % n samples taken from a seeded stream of permutations of the
dataset: epoch e takes stream positions [e * part, (e + 1) * part). So 0.5 gives different halves in different
epochs, every sample once over two epochs. Where a window crosses from permutation k-1 into k, permutation k puts
the crossing window's earlier samples last, so no window holds a sample twice: a sample appears twice in one epoch
only when the count asks for more than n. The stream is seeded from (seed, dataset), the epoch picks the window:
the same settings give the same multiset on any machine.

Preference data is drawn by pairs: the pipeline gives each pair one position (`plancc.core.pairs`), so every count
above counts pairs and a pair is taken, repeated or left out with both its completions.

`eval` datasets (a recipe's `eval_datasets`) are in the samples table but never in a training epoch:
`eval_positions` names them for the eval plan. A mixture is `PlanSettings.mixture`: a tuple of `MixEntry`.
"""

from __future__ import annotations

import numpy as np

from plancc.config.settings import MixEntry
from plancc.core.choices import DatasetRole, MixKind

MIX_TAG = 0x6D6978  # separates the mixture's random streams from the epochs' (`pipeline.epoch_rng`)


def largest_remainder(targets: np.ndarray, total: int) -> np.ndarray:
    """Integers that sum to `total`, each the floor or ceiling of its target (targets sum to `total`)."""
    base = np.floor(targets).astype(np.int64)
    short = int(total - base.sum())
    order = np.argsort(-(targets - base), kind="stable")
    base[order[:short]] += 1
    return base


def _weighted(mixture: tuple[MixEntry, ...]) -> list[int]:
    return [i for i, m in enumerate(mixture) if m.role == DatasetRole.TRAIN and m.kind == MixKind.WEIGHT]


def epoch_sizes(sizes: np.ndarray, mixture: tuple[MixEntry, ...], samples_per_epoch: int | None) -> np.ndarray:
    """Samples each mixture entry asks of an epoch, as floats (0 for eval datasets): what `epoch_counts` rounds,
    measured first, so that a mixture too large for the machine is refused before any count is made."""
    sizes = np.asarray(sizes, dtype=np.float64)
    out = np.zeros(len(mixture), dtype=np.float64)
    for i, m in enumerate(mixture):
        if m.role == DatasetRole.TRAIN and m.kind == MixKind.REPEAT:
            out[i] = m.value * sizes[i]
    weighted = _weighted(mixture)
    if weighted:
        w = np.array([mixture[i].value for i in weighted], dtype=np.float64)
        out[weighted] = w / w.sum() * (samples_per_epoch if samples_per_epoch is not None else sizes[weighted].max())
    return out


def epoch_counts(sizes: np.ndarray, mixture: tuple[MixEntry, ...], samples_per_epoch: int | None) -> np.ndarray:
    """Samples each mixture entry contributes to every epoch (0 for eval datasets)."""
    targets = epoch_sizes(sizes, mixture, samples_per_epoch)
    counts = np.floor(targets + 0.5).astype(np.int64)
    weighted = _weighted(mixture)
    if weighted:
        total = samples_per_epoch if samples_per_epoch is not None else int(np.asarray(sizes)[weighted].max())
        counts[weighted] = largest_remainder(targets[weighted], total)
    return counts


_CHAINS: dict[tuple[int, int, int, int], tuple[int, np.ndarray, dict]] = {}  # see `_permutation`
_CHAINS_KEPT = 16


def _permutation(n: int, part: int, seed: int, dataset: int, k: int) -> np.ndarray:
    """Permutation k of a dataset's stream (read-only). Each is made from the one before, so the last one made is
    kept with its generator's state (`_CHAINS`): epochs planned in order make each permutation once, not again
    for every later epoch; the result is the same either way."""
    key = (n, part, seed, dataset)
    kept = _CHAINS.get(key)
    if kept is not None and kept[0] <= k:
        j, perm, state = kept
        rng = np.random.default_rng()
        rng.bit_generator.state = state
    else:
        rng = np.random.default_rng(np.random.SeedSequence([seed, MIX_TAG, dataset]))
        j, perm = 0, rng.permutation(n)
    while j < k:  # the crossing window's samples of permutation j go last in permutation j + 1
        j += 1
        tail = (j * n) % part
        head = rng.permutation(perm[: n - tail])
        perm = np.concatenate([head, rng.permutation(perm[n - tail:])]) if tail else head
    if len(_CHAINS) >= _CHAINS_KEPT and key not in _CHAINS:
        _CHAINS.clear()
    perm.flags.writeable = False
    _CHAINS[key] = (k, perm, rng.bit_generator.state)
    return perm


def _stream_window(n: int, part: int, epoch: int, seed: int, dataset: int) -> np.ndarray:
    """Positions (0..n-1) stream window `epoch` of length `part` < n holds (see the module docstring)."""
    start, stop = epoch * part, (epoch + 1) * part
    first = start // n
    taken = [_permutation(n, part, seed, dataset, first)[start - first * n: min(stop - first * n, n)]]
    if stop > (first + 1) * n:  # it crosses into the next permutation
        taken.append(_permutation(n, part, seed, dataset, first + 1)[: stop - (first + 1) * n])
    return np.concatenate(taken)


def epoch_positions(index: np.ndarray, mixture: tuple[MixEntry, ...], samples_per_epoch: int | None, seed: int,
                    epoch: int) -> np.ndarray:
    """Sorted positions in the samples table of the samples epoch `epoch` holds (a multiset).

    `index` is each sample's mixture entry (`dataset_index`)."""
    members = [np.flatnonzero(index == d) for d in range(len(mixture))]
    counts = epoch_counts(np.array([m.size for m in members]), mixture, samples_per_epoch)
    out = []
    for d, (m, c) in enumerate(zip(members, counts, strict=True)):
        if c == 0 or m.size == 0:
            continue
        full, part = divmod(int(c), m.size)
        out += [m] * full
        if part:
            out.append(m[_stream_window(m.size, part, epoch, seed, d)])
    return np.sort(np.concatenate(out)) if out else np.zeros(0, dtype=np.int64)


def dataset_index(codes: np.ndarray, names: list[str], mixture: tuple[MixEntry, ...]) -> np.ndarray:
    """Each sample's mixture entry, from its dataset as `codes` into `names` (-1: a name the mixture lacks)."""
    where = {m.name: i for i, m in enumerate(mixture)}
    lookup = np.array([where.get(n, -1) for n in names] + [-1], dtype=np.int64)
    return lookup[np.asarray(codes, dtype=np.int64)]


def eval_positions(index: np.ndarray, mixture: tuple[MixEntry, ...]) -> np.ndarray:
    """Positions of the samples of the recipe's `eval` datasets."""
    evals = [i for i, m in enumerate(mixture) if m.role == DatasetRole.EVAL]
    return np.flatnonzero(np.isin(index, evals))


def plan_positions(index: np.ndarray | None, settings, epoch: int) -> np.ndarray | None:
    """`epoch_positions` under a plan's settings (`PlanSettings`); None for a plan of one source (all, once)."""
    if not settings.mixture:
        return None
    return epoch_positions(index, settings.mixture, settings.samples_per_epoch, settings.seed, epoch)
