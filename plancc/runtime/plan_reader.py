"""A compiled plan as the runtime sees it: verified fingerprints and settings, and one rank's epoch as flat arrays.

Reading an epoch is a filtered Parquet read of that epoch's rows (the plan file is sorted by (epoch, rank, index)
in row groups, so other epochs are not decoded); all of its rows are checked against the layout and the epoch's
plan fingerprint before any is replayed, then the rank keeps its own. The nested `sample_ids` column becomes three
flat arrays, the same CSR shape the compiler uses::

    samples     = [7, 2, 9, 4, 0, 5]   sample ids, in plan order
    row_bounds  = [0, 2, 3, 6]         row k = samples[row_bounds[k]:row_bounds[k+1]]
    batch_bounds= [0, 1, 3]            microbatch j = rows[batch_bounds[j]:batch_bounds[j+1]]

Elastic replay: a plan compiled for (W, G) is read for (W', G') with W'·G' = W·G. The global order is unchanged;
rank r' takes every W'-th microbatch (`plancc.layout`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from plancc import layout
from plancc.config import PlanSettings
from plancc.errors import PlanccError
from plancc.store import parquet, plan_store, schemas, token_store


class PlanMismatchError(PlanccError):
    """The plan, the data, the run's world size or a saved sampler state do not fit together; the message says how."""


PLAN_COLUMNS = ["index", "sample_ids", "tokens", "label_count", "num_items"]


@dataclass(frozen=True)
class RankEpoch:
    """One rank's microbatches of one epoch under a (world_size, grad_accum) replay, in plan order."""

    epoch: int
    index: np.ndarray  # int64, global microbatch index
    samples: np.ndarray  # int64 sample ids
    row_bounds: np.ndarray  # int64
    batch_bounds: np.ndarray  # int64
    tokens: np.ndarray  # int64
    label_count: np.ndarray  # int64 supervised targets (docs/spec.md §3)
    num_items: np.ndarray  # int64 global targets of the microbatch's update
    total_batches: int  # microbatches of the whole epoch (all ranks)
    tail_num_items: int  # global targets of the incomplete final update (0 when there is none)

    def __len__(self) -> int:
        return int(self.index.shape[0])


@dataclass(frozen=True)
class RankEval:
    """One rank's share of the eval plan under a `world_size` split, in plan order."""

    index: np.ndarray  # int64, global eval microbatch index
    samples: np.ndarray  # int64 sample ids
    row_bounds: np.ndarray  # int64
    batch_bounds: np.ndarray  # int64
    label_count: np.ndarray  # int64 supervised targets per microbatch
    total_batches: int  # eval microbatches on all ranks
    total_label_count: int  # eval targets on all ranks

    def __len__(self) -> int:
        return int(self.index.shape[0])


class RuntimePlan:
    """A plan directory opened for training, verified before step 1 (`plan_store.PlanDir` does the checks).

    Opening refuses a plan whose settings do not hash to the config fingerprint, whose samples or metrics file
    belongs to another plan, or whose `manifest.json` differs from the plan file's metadata (settings and
    fingerprints are read from the Parquet metadata the fingerprints cover, never from the manifest), and
    verifies every epoch's rows (layout, `num_items`, plan fingerprint), so that a changed last epoch is refused
    before step 1, not when it starts; reading an epoch verifies its rows again before any is replayed. The plan's
    token store (`tokens/`) is opened and its digest compared with the one the plan binds. The samples table is
    checked against the dataset and metadata fingerprints when it is read.

    Every file is opened once (`plan_store.PlanDir`, `token_store.open_store`): a plan recompiled into the same
    directory (`--overwrite`) while this run trains changes nothing for it; a process that opens afterwards gets
    the new plan, whole.

    `data` repoints the plan at its tokenized data elsewhere (a plan, scan or token store folder, or tokenized
    files); `load_tokens` checks it against the plan's samples.
    """

    def __init__(self, plan_dir: str | Path, *, data: str | Path | None = None):
        try:
            self.dir = plan_store.PlanDir(plan_dir)
        except (plan_store.PlanIntegrityError, token_store.FileTypeError) as exc:
            raise PlanMismatchError(str(exc)) from None
        self.path = self.dir.path
        self.data = Path(data) if data is not None else None
        if self.data is not None and not self.data.exists():
            raise PlanMismatchError(f"the data given for plan {self.path} ({self.data}) does not exist")
        _refuse([*self.dir.header_problems(), *self.dir.manifest_problems(required=False),
                 *self.dir.companion_problems(schemas.SAMPLES_FILE, "samples")])
        self.fingerprints: dict[str, Any] = self.dir.fingerprints
        self.settings: PlanSettings = self.dir.settings
        self._verified: tuple[int, pa.Table] | None = None  # the last epoch read and verified
        self._epoch_batches: dict[int, int] = {}
        self._eval: pa.Table | None = None  # the eval plan, once read and verified
        for epoch in reversed(range(self.epochs)):  # every epoch now; the first stays cached for step 1
            self.epoch_rows(epoch)
        self.tokens: token_store.MappedTokens | None = None  # the plan's own token store, opened with the plan
        if self.data is None and self.dir.binds_tokens and os.path.lexists(self.path / schemas.TOKENS_DIR):
            try:
                self.tokens = self.dir.open_tokens()
            except (plan_store.PlanIntegrityError, token_store.FileTypeError) as exc:
                raise PlanMismatchError(f"{exc}; recompile the plan") from None

    # ------------------------------------------------------------ settings
    @property
    def world_size(self) -> int:
        """Ranks the plan was compiled for."""
        return self.settings.world_size

    @property
    def grad_accum(self) -> int:
        """Micro-steps per update the plan was compiled for."""
        return self.settings.grad_accum

    @property
    def batches_per_update(self) -> int:
        """Microbatches of one update (world_size x grad_accum): fixed under elastic replay."""
        return layout.batches_per_update(self.world_size, self.grad_accum)

    @property
    def mode(self) -> str:
        """The plan's layout."""
        return self.settings.mode

    @property
    def shift(self) -> str:
        """The plan's label semantics."""
        return self.settings.shift

    @property
    def epochs(self) -> int:
        """Epochs in the plan."""
        return self.settings.epochs

    def replay_grad_accum(self, world_size: int, grad_accum: int | None = None) -> int:
        """The grad_accum a run of `world_size` uses (`grad_accum`, or the plan's own); refuses a replay that would
        change the updates (`layout.replay_problem`)."""
        problem = layout.replay_problem(self.world_size, self.grad_accum, world_size, grad_accum)
        if problem is not None:
            raise PlanMismatchError(problem)
        return self.grad_accum if grad_accum is None else int(grad_accum)

    # ------------------------------------------------------------ reads
    def epoch_rows(self, epoch: int) -> pa.Table:
        """All rows of `epoch` in global order, verified against the layout and the epoch's plan fingerprint.

        Every rank reads and checks the whole epoch (plan rows are small: ids and a few integers per microbatch),
        so no rank replays a row that was edited, deleted or reordered, and every rank sees the same tail.
        """
        self._check_epoch(epoch)
        if self._verified is None or self._verified[0] != epoch:
            table = self.dir.read_epoch(epoch)
            _refuse(self.dir.epoch_problems(epoch, table))
            self._verified = (int(epoch), table)
            self._epoch_batches[int(epoch)] = table.num_rows
        return self._verified[1]

    def total_batches(self, epoch: int) -> int:
        """Microbatches of `epoch` on all ranks (reads and verifies the epoch once)."""
        if epoch not in self._epoch_batches:
            self.epoch_rows(epoch)
        return self._epoch_batches[epoch]

    def _check_epoch(self, epoch: int) -> None:
        if not 0 <= int(epoch) < self.epochs:
            raise PlanMismatchError(f"epoch {epoch} is not in this plan (it has epochs 0..{self.epochs - 1}); "
                                    "compile with more --epochs")

    def read_rank_epoch(self, epoch: int, rank: int, world_size: int) -> RankEpoch:
        """Rank `rank`'s microbatches of `epoch` when the plan is replayed on `world_size` ranks.

        Elastic replay needs nothing special here: rank r' of W' takes every W'-th row of the verified epoch.
        """
        if not 0 <= rank < world_size:
            raise PlanMismatchError(f"rank {rank} is outside world_size {world_size}")
        table = self.epoch_rows(epoch)
        total = table.num_rows
        keep = layout.rank_indices(total, world_size, rank)  # rows are the verified epoch in index order
        mine = table.select(PLAN_COLUMNS).take(pa.array(keep))
        ids, row_bounds, batch_bounds = plan_store.nested_arrays(mine.column("sample_ids"))
        tail_start = layout.complete_batches(total, self.world_size, self.grad_accum)
        return RankEpoch(
            epoch=int(epoch),
            index=keep,
            samples=ids,
            row_bounds=row_bounds,
            batch_bounds=batch_bounds,
            tokens=parquet.column(mine, "tokens"),
            label_count=parquet.column(mine, "label_count"),
            num_items=parquet.column(mine, "num_items"),
            total_batches=total,
            tail_num_items=int(parquet.column(table, "num_items")[tail_start]) if tail_start < total else 0,
        )

    # ------------------------------------------------------------ eval plan
    @property
    def has_eval(self) -> bool:
        """Whether the plan holds an eval plan (compiled with `--val-set-size` or a recipe's eval datasets)."""
        return self.dir.has_eval

    @property
    def eval_label_count(self) -> int:
        """Supervised targets of the whole eval plan (all ranks): what the eval loss divides its sum of CE by."""
        self.require_eval()
        return int(self.dir.meta["eval"]["label_count"])

    def require_eval(self) -> None:
        """Refuse a plan without an eval plan, saying how to compile one."""
        if not self.has_eval:
            raise PlanMismatchError(f"the plan {self.path} has no eval plan: compile it with --val-set-size "
                                    "(e.g. 0.05, or a count of samples) to hold out an eval set")

    def eval_rows(self) -> pa.Table:
        """The eval plan's rows in index order, verified (layout, eval fingerprint, manifest summary) once."""
        self.require_eval()
        if self._eval is None:
            try:
                table = self.dir.read_eval()
            except schemas.StoreError as exc:
                raise PlanMismatchError(str(exc)) from None
            _refuse([*self.dir.companion_problems(schemas.EVAL_FILE, "eval"), *self.dir.eval_problems(table)])
            self._eval = table
        return self._eval

    def read_rank_eval(self, rank: int, world_size: int) -> RankEval:
        """Rank `rank`'s eval microbatches when evaluated on `world_size` ranks (every `world_size`-th, from
        `rank`): any world size splits the eval plan so that each sample is seen once."""
        if not 0 <= rank < world_size:
            raise PlanMismatchError(f"rank {rank} is outside world_size {world_size}")
        table = self.eval_rows()
        keep = layout.rank_indices(table.num_rows, world_size, rank)
        mine = table.select(["sample_ids", "label_count"]).take(pa.array(keep))
        ids, row_bounds, batch_bounds = plan_store.nested_arrays(mine.column("sample_ids"))
        return RankEval(keep, ids, row_bounds, batch_bounds, parquet.column(mine, "label_count"), table.num_rows,
                        self.eval_label_count)

    def samples_table(self) -> pa.Table:
        """The plan's samples table, checked against the dataset and metadata fingerprints."""
        table = self.dir.read_samples()
        _refuse(self.dir.samples_problems(table))
        return table


def _refuse(problems: list[str]) -> None:
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise PlanMismatchError(f"{problems[0]}{more}; this plan was changed after it was compiled: recompile it "
                                "(`plancc validate PLAN_DIR` lists every problem)")


def open_plan(plan: str | Path | RuntimePlan) -> RuntimePlan:
    """`plan` itself when already open, else the plan directory opened and verified."""
    return plan if isinstance(plan, RuntimePlan) else RuntimePlan(plan)
