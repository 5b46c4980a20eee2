"""What pack and balance move as one piece: a sample, or for preference data a pair (docs/preference.md).

The planner's algorithms know samples only. Preference data is planned as *units*, one per pair, whose length,
targets and first label are the pair's; `Units.expand` then puts each unit's chosen completion and its rejected one
side by side in the unit's place::

    units      [u3 u0 | u1]             row_bounds [0, 2, 3]     (packed, flattened: a row holds whole pairs)
    expanded   [c3 r3 c0 r0 | c1 r1]    row_bounds [0, 4, 6]
    padded     [c3] [r3] [c0] [r0] ...  each unit's row becomes two adjacent rows of its microbatch

So every rule the SFT planner keeps for a sample (once per epoch, capacity, padded cost and peak, the tail) holds
for a pair, and a pair is never split across rows, microbatches, ranks or micro-steps: no second copy of any
kernel. A microbatch holds `micro_batch_size` pairs, as TRL's `per_device_train_batch_size` counts them, each
completion (prompt included) at most `sequence_len` tokens: a packed row holds `micro_batch_size x 2 x
sequence_len` tokens (`--real-batches`: `micro_batch_size` rows of `2 x sequence_len`), a padded or flattened
microbatch exactly `micro_batch_size` pairs. The unit's facts make the unit plan cost what the expanded one does:

    packed, flattened   length = L_chosen + L_rejected                (the row's tokens)
    padded              length = 2 x max(L_chosen, L_rejected), pad_multiple x 2  (two rows, padded alike)
    targets             the two completions' targets under the plan's shift (the rejected one keeps its first
                        label where it continues the chosen one's row under `--shift row`)

(`--cost attention` sees a packed pair's squared total length, an upper bound of its two squares.)

Balancing evens out pairs per microbatch and per update (the DPO denominator) and the chosen completions' targets
per update (ORPO's NLL denominator), while pack keeps rows full and the stages keep cost and peak
(`_pair_objectives`). Unpaired (KTO) data is planned sample by sample, its accumulation stage evening out desirable
and undesirable completions per update (`_labelled`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from plancc.config.settings import PlanSettings
from plancc.core import layout, pairs
from plancc.core.choices import Mode, Shift
from plancc.core.plan_arrays import Batches, SampleArrays

PAIRED, UNPAIRED = "preference", "unpaired_preference"
LEXICAL_MOST = 4096  # a desirable completion's weight in the accumulation objective, at most (see `_labelled`)


@dataclass(frozen=True)
class Units:
    """The samples of a plan and the units pack and balance move (see module docstring)."""

    samples: SampleArrays  # what the plan's rows name
    facts: SampleArrays  # one entry per unit: what pack and balance plan
    settings: PlanSettings  # what pack and balance see (a pair's capacity)
    members: np.ndarray | None = None  # int64 (units, 2): each pair's chosen and rejected position in `samples`
    # balancing stage -> unit facts whose label counts that stage evens out instead of the units' targets
    objectives: dict[str, SampleArrays] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        """`sft`, `preference` or `unpaired_preference` (`SampleArrays.kind`)."""
        return self.samples.kind

    def objective(self, stage: str) -> SampleArrays:
        """The unit facts balancing stage `stage` evens out."""
        return self.objectives.get(stage, self.facts)

    def take(self, positions: np.ndarray) -> tuple[Units, np.ndarray]:
        """The units at `positions` (a recipe's epoch: a multiset) and the positions of their samples."""
        if self.members is None:
            return dataclasses.replace(self, samples=self.samples.take(positions), facts=self.facts.take(positions),
                                       objectives={k: v.take(positions) for k, v in self.objectives.items()}), positions
        held = pairs.pair_samples(self.members, positions)
        members = np.arange(held.shape[0], dtype=np.int64).reshape(-1, 2)
        return dataclasses.replace(self, samples=self.samples.take(held), facts=self.facts.take(positions),
                                   members=members,
                                   objectives={k: v.take(positions) for k, v in self.objectives.items()}), held

    def expand(self, b: Batches) -> Batches:
        """Microbatches of units as microbatches of samples: each pair's chosen then its rejected completion in
        the unit's place (one row in packed and flattened layouts, two adjacent rows padded)."""
        if self.members is None:
            return b
        samples = pairs.pair_samples(self.members, b.samples)
        if self.settings.mode == Mode.PADDED:
            return Batches(samples, np.arange(samples.shape[0] + 1, dtype=np.int64), b.batch_bounds * 2)
        return Batches(samples, b.row_bounds * 2, b.batch_bounds)


def capacity_settings(settings: PlanSettings, kind: str) -> PlanSettings:
    """`settings` with the row capacity the plan's rows have: a packed or flattened preference row holds
    `micro_batch_size` pairs of two completions of `sequence_len` (padded rows, one completion each, and other
    data: as set)."""
    if kind != PAIRED or settings.mode == Mode.PADDED:
        return settings
    return dataclasses.replace(settings, sequence_len=2 * settings.sequence_len)


def _unit_settings(settings: PlanSettings) -> PlanSettings:
    """What pack and balance see of a preference plan: a unit is two completions (module docstring)."""
    if settings.mode == Mode.PADDED:
        return dataclasses.replace(settings, sequence_len=2 * settings.sequence_len,
                                   pad_multiple=2 * settings.pad_multiple)
    return capacity_settings(settings, PAIRED)


def pair_members(s: SampleArrays) -> np.ndarray:
    """(pairs, 2) positions of each pair's chosen and rejected completion in `s` (`plancc.core.pairs.pair_members`)."""
    return pairs.pair_members(s.sample_id, s.pair_id, s.chosen)


def _pair_facts(s: SampleArrays, members: np.ndarray, settings: PlanSettings) -> SampleArrays:
    """One entry per pair: the unit facts of the module docstring."""
    c, r = members[:, 0], members[:, 1]
    if settings.mode == Mode.PADDED:
        length = 2 * np.maximum(s.length[c], s.length[r])
    else:
        length = s.length[c] + s.length[r]
    # the rejected completion starts its own sequence (its first label no target) except where it continues the
    # chosen one's row under a plain row shift
    own_start = settings.shift == Shift.SAMPLE or (settings.shift == Shift.ROW and settings.mode == Mode.PADDED)
    second = s.first_label_supervised[r].astype(np.int64) if own_start else 0
    return SampleArrays(s.pair_id[c], length, s.label_count[c] + s.label_count[r] - second,
                        s.first_label_supervised[c].copy())


def _counting(facts: SampleArrays, weight: np.ndarray) -> SampleArrays:
    """`facts` whose label counts are `weight` (an integer per unit, no first label): a stage balancing them
    evens out the weights' totals."""
    return dataclasses.replace(facts, label_count=weight.astype(np.int64),
                               first_label_supervised=np.zeros(len(facts), dtype=bool))


def _labelled(s: SampleArrays, settings: PlanSettings) -> SampleArrays:
    """Unpaired data's accumulation objective: a desirable completion weighs K + 1, an undesirable one 1, so an
    update's total is K x desirable + all; K above any update's completions makes evening out the totals even out
    the desirable count first, then the completions (and so the undesirable count). K is capped at LEXICAL_MOST so
    the kernels' squared totals stay far from int64's range (and lower where updates hold very many)."""
    most = min(len(s), settings.batches_per_update * settings.row_capacity)  # completions an update may hold
    k = max(1, min(most + 1, LEXICAL_MOST, 2**29 // max(most, 1)))
    return _counting(s, np.where(s.desirable, k + 1, 1))


def _pair_objectives(s: SampleArrays, members: np.ndarray, facts: SampleArrays,
                     settings: PlanSettings) -> dict[str, SampleArrays]:
    """What each balancing stage evens out in a preference plan: the chosen completions' targets (ORPO's NLL
    denominator) per update and, where packing lets the count vary, pairs per microbatch (the DPO denominator: even
    per microbatch, its update totals are even too). In fixed-count layouts every microbatch holds
    `micro_batch_size` pairs, so the targets are all there is to even out."""
    chosen = _counting(facts, s.targets(settings.shift)[members[:, 0]])
    out = dict.fromkeys(("fixed_count", "accumulation", "within_update", "rank_order"), chosen)
    if settings.mode == Mode.PACKED:
        pairs = _counting(facts, np.ones(len(facts), dtype=np.int64))
        out.update(microbatch=pairs, within_update=pairs)
    return out


def planning_units(s: SampleArrays, settings: PlanSettings) -> Units:
    """The units of `s` for `settings` (module docstring)."""
    if s.kind == PAIRED:
        members = pair_members(s)
        facts = _pair_facts(s, members, settings)
        return Units(s, facts, _unit_settings(settings), members, _pair_objectives(s, members, facts, settings))
    if s.kind == UNPAIRED:
        return Units(s, s, settings, None, {"accumulation": _labelled(s, settings)})
    return Units(s, s, settings)


def update_totals(values: np.ndarray, settings: PlanSettings) -> np.ndarray:
    """Per microbatch, the total of `values` over its whole update on all ranks (`layout.num_items`)."""
    return layout.num_items(values.astype(np.int64, copy=False), settings.world_size, settings.grad_accum)
