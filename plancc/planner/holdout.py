"""Which retained samples are held out for evaluation: a seeded draw, a pure function of the ids.

`hold_out(sample_ids, val_set_size, seed, datasets=None)` draws `--val-set-size` of the samples (a fraction or a
count), per dataset in proportion to its size when dataset labels are given. It depends on the ids (and labels)
only, never on lengths or order, so the same data and seed hold out the same samples whatever the layout, and
`validate` redraws it to check the eval plan. Each dataset's samples are drawn in one seeded order and its first
ones held out, so raising `--val-set-size` only adds samples (to each dataset whose share grows).

`eval_ids` is what a plan evaluates on: that draw, and for a recipe its eval datasets' samples plus the draw from
its training datasets in proportion (their held-out samples then leave the mixture: `without`). The training plan
is compiled from the rest (`split`), the eval plan (`plancc.planner.evaluation`) from the eval ids.
"""

from __future__ import annotations

import numpy as np

from plancc.config.settings import MixEntry, PlanSettings
from plancc.core import pairs
from plancc.core.plan_arrays import SampleArrays
from plancc.errors import SettingsError
from plancc.planner.mixture import eval_positions
from plancc.planner.units import PAIRED, pair_members

HOLDOUT_STREAM = 1  # spawn keys of the two random streams next to the epochs' (seed, epoch) ones
ORDER_STREAM = 2


def stream_rng(seed: int, stream: int) -> np.random.Generator:
    """A generator independent of every epoch's (`pipeline.epoch_rng`): the same seed spawns a separate stream."""
    return np.random.default_rng(np.random.SeedSequence([seed], spawn_key=(stream,)))


def eval_count(n: int, val_set_size: int | float) -> int:
    """Samples `val_set_size` holds out of `n`: a count as given, a fraction rounded to the nearest sample."""
    k = int(val_set_size) if isinstance(val_set_size, int) else round(val_set_size * n)
    if k < 1:
        raise SettingsError(f"--val-set-size {val_set_size} holds out no sample of the {n} retained: raise it",
                            "val_set_size")
    if k >= n:
        raise SettingsError(f"--val-set-size {val_set_size} holds out {k} of the {n} retained samples, leaving "
                            "nothing to train on: lower it", "val_set_size")
    return k


def _proportional(sizes: np.ndarray, k: int) -> np.ndarray:
    """`k` split over groups of `sizes` in proportion (largest remainder; ties to the earlier group)."""
    exact = sizes * (k / sizes.sum())
    share = np.floor(exact).astype(np.int64)
    rest = np.argsort(-(exact - share), kind="stable")[: k - int(share.sum())]
    share[rest] += 1
    return share


def hold_out(sample_ids: np.ndarray, val_set_size: int | float, seed: int,
             datasets: np.ndarray | None = None) -> np.ndarray:
    """Sorted sample ids held out for evaluation: `val_set_size` of `sample_ids` (a fraction or a count), drawn
    with `seed`, per value of `datasets` (one label per sample) in proportion to its samples."""
    ids = np.asarray(sample_ids, dtype=np.int64)
    k = eval_count(ids.shape[0], val_set_size)
    labels = np.zeros(ids.shape[0], dtype=np.int64) if datasets is None else np.asarray(datasets)
    groups, group_of = np.unique(labels, return_inverse=True)
    order = np.argsort(ids, kind="stable")  # the draw depends on the set of ids, not on their order
    ids, group_of = ids[order], group_of[order]
    rng = stream_rng(seed, HOLDOUT_STREAM)
    taken = []
    for g, share in enumerate(_proportional(np.bincount(group_of, minlength=groups.shape[0]), k).tolist()):
        members = ids[group_of == g]
        taken.append(members[rng.permutation(members.shape[0])[:share]])  # a larger size only adds samples
    return np.sort(np.concatenate(taken))


def eval_ids(sample_ids: np.ndarray, settings: PlanSettings, index: np.ndarray | None = None) -> np.ndarray | None:
    """The sample ids a plan evaluates on and never trains on (None: no eval plan): a recipe's eval datasets'
    samples (`index`: each sample's mixture entry) and `--val-set-size`'s draw from the rest, per training dataset
    in proportion. The same samples and settings give the same ids: `validate` redraws them."""
    ids = np.asarray(sample_ids, dtype=np.int64)
    if index is None:
        return hold_out(ids, settings.val_set_size, settings.seed) if settings.val_set_size else None
    is_eval = np.zeros(ids.shape[0], dtype=bool)
    is_eval[eval_positions(index, settings.mixture)] = True
    out = ids[is_eval]
    if settings.val_set_size:
        train = ~is_eval & (index >= 0)
        drawn = hold_out(ids[train], settings.val_set_size, settings.seed, datasets=index[train])
        _check_left(index[train & ~np.isin(ids, drawn)], index[train], settings)
        out = np.union1d(out, drawn)
    return out if out.size else None


def eval_sample_ids(s: SampleArrays, settings: PlanSettings, index: np.ndarray | None = None) -> np.ndarray | None:
    """`eval_ids` of the samples `s`; preference pairs are drawn as pairs (by `pair_id`, one draw a pair) and held
    out whole."""
    if s.kind != PAIRED:
        return eval_ids(s.sample_id, settings, index)
    members = pair_members(s)
    pair_ids = pairs.per_pair(s.pair_id, members)
    held = eval_ids(pair_ids, settings, None if index is None else pairs.per_pair(index, members))
    if held is None:
        return None
    return np.sort(s.sample_id[pairs.pair_samples(members, np.flatnonzero(np.isin(pair_ids, held)))])


def _check_left(left: np.ndarray, before: np.ndarray, settings: PlanSettings) -> None:
    """A training dataset the draw takes whole would silently leave the mixture: refused, naming it."""
    for d in np.setdiff1d(before, left).tolist():
        raise SettingsError(f"--val-set-size {settings.val_set_size} holds out every sample of dataset "
                            f"{settings.mixture[d].name!r}, leaving it nothing to train on: lower it", "val_set_size")


def without(index: np.ndarray, sample_ids: np.ndarray, held: np.ndarray) -> np.ndarray:
    """A recipe's `index` with the held-out samples in no dataset (-1: `mixture.epoch_positions` skips them)."""
    return np.where(np.isin(sample_ids, held), -1, index)


def split(s: SampleArrays, eval_ids: np.ndarray) -> tuple[SampleArrays, SampleArrays]:
    """(training samples, eval samples): `s` without and with `eval_ids` (each in samples-table order)."""
    held = np.isin(s.sample_id, eval_ids)
    return subset(s, ~held), subset(s, held)


def subset(s: SampleArrays, keep: np.ndarray) -> SampleArrays:
    """The samples where `keep` is true, in table order."""
    return s.take(np.flatnonzero(keep))


def training_twins(token_hash: np.ndarray, sample_id: np.ndarray, eval_ids: np.ndarray) -> np.ndarray:
    """For each sample of the table (sorted by `sample_id`), the id of a training sample (one not in `eval_ids`, a
    sorted subset of the ids) with the same tokens (`token_hash`: input ids and labels), or -1; -1 for every
    training sample. Eval samples copied from training data pass the id checks yet measure the eval loss on what
    the model trained on."""
    token_hash = np.asarray(token_hash, dtype=np.uint64)
    held = np.searchsorted(sample_id, eval_ids)
    train = np.ones(token_hash.shape[0], dtype=bool)
    train[held] = False
    twins = np.full(token_hash.shape[0], -1, dtype=np.int64)
    if not train.any() or not held.size:
        return twins
    train_hash, train_ids = token_hash[train], np.asarray(sample_id, dtype=np.int64)[train]
    eval_hash, by_value = token_hash[held], np.sort(train_hash)  # a sort, not an argsort: 10x faster
    copied = by_value[np.minimum(np.searchsorted(by_value, eval_hash), by_value.size - 1)] == eval_hash
    values = np.unique(eval_hash[copied])  # the tokens shared: usually few; then the first training sample of each
    if values.size:
        at = np.minimum(np.searchsorted(values, train_hash), values.size - 1)
        hit = np.flatnonzero(values[at] == train_hash)
        _, first = np.unique(train_hash[hit], return_index=True)  # sorted like `values`, each found
        twins[held[copied]] = train_ids[hit[first]][np.searchsorted(values, eval_hash[copied])]
    return twins


def shared_content(token_hash: np.ndarray, sample_id: np.ndarray, eval_ids: np.ndarray,
                   index: np.ndarray | None = None, mix: tuple[MixEntry, ...] = ()) -> str | None:
    """The warning naming how many eval samples have a training sample's tokens (None: none has), which the plan
    keeps and `validate` recounts. An eval dataset of a recipe (`index`: each sample's entry of `mix`) whose every
    sample is training data is refused: it is a copy of the training data, not a held-out set."""
    twins = training_twins(token_hash, sample_id, eval_ids)
    if index is not None:
        for d in np.unique(index[eval_positions(index, mix)]).tolist():
            members = twins[index == d]
            if members.size and (members >= 0).all():
                first = int(np.flatnonzero(index == d)[0])
                raise SettingsError(f"eval dataset {mix[d].name!r}: all {members.size:,} of its samples have the "
                                    "same tokens as training samples (first: sample_id "
                                    f"{int(sample_id[first])} = training sample_id {int(members[0])}): it is "
                                    "training data, not held out; evaluate on data that is not in [[datasets]]")
    shared = np.flatnonzero(twins >= 0)
    if not shared.size:
        return None
    total = int(np.asarray(eval_ids).size)
    return (f"{shared.size:,} of {total:,} eval samples have the same tokens (token_hash) as a training sample "
            f"(first: sample_id {int(sample_id[shared[0]])} = training sample_id {int(twins[shared[0]])}): the eval "
            "loss partly measures training data; deduplicate the data to hold them out")
