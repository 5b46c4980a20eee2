"""`Plan`: a compiled plan directory, the one type the API, the runtime and the review commands all hand around.

`plancc.open_plan` opens one (the plan file's footer only); `verified_plan` (what the runtime opens with) also
checks every epoch and holds the plan's token store, on the same object. Reading an epoch for training is a
filtered Parquet read of that epoch's rows (the plan file is sorted by (epoch, rank, index) in row groups, so other
epochs are not decoded); all of its rows are checked against the layout and the epoch's plan fingerprint before any
is replayed, then the rank keeps its own. The nested `sample_ids` column becomes three flat arrays, the same CSR
shape the compiler uses::

    samples     = [7, 2, 9, 4, 0, 5]   sample ids, in plan order
    row_bounds  = [0, 2, 3, 6]         row k = samples[row_bounds[k]:row_bounds[k+1]]
    batch_bounds= [0, 1, 3]            microbatch j = rows[batch_bounds[j]:batch_bounds[j+1]]

Elastic replay: a plan compiled for (W, G) is read for (W', G') with W'·G' = W·G. The global order is unchanged;
rank r' takes every W'-th microbatch (`plancc.core.layout`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from plancc.config.settings import PlanSettings
from plancc.core import layout
from plancc.core.numbers import padding_ratio
from plancc.errors import PlanccError, PlanMismatchError, SettingsError
from plancc.store import token_store
from plancc.store.parquet import column
from plancc.store.plan_store import EpochMicrobatches, PlanDir, PlanIntegrityError, nested_arrays
from plancc.store.schemas import EVAL_FILE, PLAN_FILE, SAMPLES_FILE, TOKENS_DIR, StoreError

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
    # a preference plan's update totals by column (`Plan.kind_columns`: pairs, chosen targets, ...), and the tail's
    counts: dict[str, np.ndarray] = field(default_factory=dict)
    tail_counts: dict[str, int] = field(default_factory=dict)

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
    counts: dict[str, int] = field(default_factory=dict)  # a preference plan's eval totals (`Plan.eval_counts`)

    def __len__(self) -> int:
        return int(self.index.shape[0])


class Plan(PlanDir):
    """A plan directory: where it is (`path`), what made it (`settings`, a `PlanSettings`; `scan`, the scan report;
    `fingerprints`; `manifest`, the plan file's metadata), its `epochs` (the sorted epoch numbers), `warnings`, and
    its microbatches per epoch.

    One type for every reader, so that settings, fingerprints and epochs are read in one place and mean one thing:
    the API returns it, inspect/diff/validate/show read through it, and the runtime trains on it. It *is* the
    verified reader (`PlanDir`: every file opened once, each checkable against what the plan file binds) plus the
    views a reader wants; the runtime's needs are methods on the same object, not a second wrapper: `verify()`
    checks the header, the manifest mirror, the samples file's metadata and every epoch's rows before step 1 (so a
    changed last epoch is refused before training starts) and holds the plan's token store, so that a plan
    recompiled into the same directory (`--overwrite`) while a run trains changes nothing for it. Opening is cheap
    (the plan file's footer); nothing is verified until a reader asks (`validate` lists every problem instead).
    """

    def __init__(self, path: str | Path):
        super().__init__(path)
        self.manifest: dict[str, Any] = {k: v for k, v in self.meta.items() if k != "kind"}
        self.tokens: token_store.MappedTokens | None = None  # the plan's own token store, held by `verify`
        self._tokens_problem: str | None = None  # why `verify` could not hold it (raised when it is asked for)
        self._verified_all = False
        self._verified: tuple[int, pa.Table] | None = None  # the last epoch read and verified
        self._epoch_batches: dict[int, int] = {}
        self._eval: pa.Table | None = None  # the eval plan, once read and verified

    def __repr__(self) -> str:  # the manifest is long: name the plan, not its contents
        return (f"Plan({str(self.path)!r}, samples={self.manifest.get('samples')}, epochs={self.epochs}, "
                f"mode={self.settings.mode!r}, world_size={self.settings.world_size}, "
                f"grad_accum={self.settings.grad_accum})")

    def __eq__(self, other: object) -> bool:  # the same plan: the same directory holding the same plan file
        return isinstance(other, Plan) and (self.path, self.meta) == (other.path, other.meta)

    __hash__ = None  # type: ignore[assignment]  # a plan directory's content can change: no hashing

    # ------------------------------------------------------------ what the plan is
    @property
    def epochs(self) -> list[int]:
        """The plan's epoch numbers, ascending (`header_problems` checks the plan fingerprints name the same)."""
        return list(range(self.settings.epochs))

    @property
    def scan(self) -> dict[str, Any]:
        """The scan report (tokenizer, format, drops, ...)."""
        return self.manifest.get("scan", {})

    @property
    def warnings(self) -> tuple[str, ...]:
        """What compile found suspicious (drops, chat template markers that are not single tokens, ...), and every
        epoch without one complete update."""
        return (*self.manifest.get("warnings", []), *degenerate_warnings(self.manifest, self.settings))

    def row_count(self) -> int:
        """Rows of the plan file, all epochs, from its footer (`validate` compares it with the epochs' rows)."""
        return self.held(PLAN_FILE).parquet().metadata.num_rows

    def check_epoch(self, epoch: int) -> None:
        """Refuse an epoch the plan does not hold (`PlanMismatchError`, naming the ones it does)."""
        if int(epoch) not in self.epochs:
            raise PlanMismatchError(f"epoch {epoch}: the plan has epochs {self.epochs}; compile with more --epochs")

    def epoch(self, epoch: int, rank: int | None = None) -> EpochMicrobatches:
        """The microbatches of `epoch` (only those of `rank` when given), read with Parquet filters."""
        self.check_epoch(epoch)
        if rank is not None and not 0 <= rank < self.settings.world_size:
            raise SettingsError(f"rank {rank}: the plan has ranks 0..{self.settings.world_size - 1}")
        return self.read_share(epoch, rank)

    def metrics(self, epoch: int | None = None) -> list[dict[str, Any]]:
        """Metric rows `{epoch, stage, metric..., padding_ratio}` (stages `before` ... `after`) of every epoch (or
        one), as stored and as `plancc inspect metrics` shows them."""
        rows = self.read_metrics().to_pylist()
        out = [{**r, "padding_ratio": padding_ratio(r)} for r in rows if epoch is None or r["epoch"] == epoch]
        if epoch is not None and not out:
            raise PlanccError(f"--epoch {epoch}: the plan has no such epoch "
                              f"(epochs: {sorted({r['epoch'] for r in rows})})")
        return out

    # ------------------------------------------------------------ verified for training
    def verify(self) -> Plan:
        """Check the plan for training once (module and class docstrings) and hold its token store; returns it.

        Refuses (`PlanMismatchError`, the first problem) settings that do not hash to the config fingerprint, a
        samples file of another plan, a `manifest.json` that differs from the plan file's metadata, and any
        epoch's rows that break the layout or the plan fingerprint; the first epoch stays cached for step 1.
        """
        if self._verified_all:
            return self
        _refuse([*self.header_problems(), *self.manifest_problems(required=False),
                 *self.companion_problems(SAMPLES_FILE, "samples")])
        for epoch in reversed(self.epochs):
            self.epoch_rows(epoch)
        if self.binds_tokens and os.path.lexists(self.path / TOKENS_DIR):
            try:
                self.tokens = self.open_tokens()
            except (PlanIntegrityError, token_store.FileTypeError) as exc:
                self._tokens_problem = f"{exc}; recompile the plan"
        self._verified_all = True
        return self

    def own_tokens(self) -> token_store.MappedTokens | None:
        """The token store `verify` held (None when the plan binds none or `tokens/` was gone at open); refused when
        it could not be trusted."""
        if self._tokens_problem is not None:
            raise PlanMismatchError(self._tokens_problem)
        return self.tokens

    def replay_grad_accum(self, world_size: int, grad_accum: int | None = None, *, flag: str = "grad_accum") -> int:
        """The grad_accum a run of `world_size` uses (`grad_accum`, or the plan's own); refuses a replay that would
        change the updates (`layout.replay_problem`, naming grad_accum as the caller's `flag`)."""
        problem = layout.replay_problem(self.settings.world_size, self.settings.grad_accum, world_size, grad_accum,
                                        flag=flag)
        if problem is not None:
            raise PlanMismatchError(problem)
        return self.settings.grad_accum if grad_accum is None else int(grad_accum)

    def epoch_rows(self, epoch: int) -> pa.Table:
        """All rows of `epoch` in global order, verified against the layout and the epoch's plan fingerprint.

        Every rank reads and checks the whole epoch (plan rows are small: ids and a few integers per microbatch),
        so no rank replays a row that was edited, deleted or reordered, and every rank sees the same tail.
        """
        self.check_epoch(epoch)
        if self._verified is None or self._verified[0] != epoch:
            table = self.read_epoch(epoch)
            _refuse(self.epoch_problems(epoch, table))
            self._verified = (int(epoch), table)
            self._epoch_batches[int(epoch)] = table.num_rows
        return self._verified[1]

    def total_batches(self, epoch: int) -> int:
        """Microbatches of `epoch` on all ranks (reads and verifies the epoch once)."""
        if epoch not in self._epoch_batches:
            self.epoch_rows(epoch)
        return self._epoch_batches[epoch]

    def read_rank_epoch(self, epoch: int, rank: int, world_size: int) -> RankEpoch:
        """Rank `rank`'s microbatches of `epoch` when the plan is replayed on `world_size` ranks.

        Elastic replay needs nothing special here: rank r' of W' takes every W'-th row of the verified epoch.
        """
        check_rank(rank, world_size)
        table = self.epoch_rows(epoch)
        total = table.num_rows
        keep = layout.rank_indices(total, world_size, rank)  # rows are the verified epoch in index order
        mine = table.select(PLAN_COLUMNS + self.kind_columns).take(pa.array(keep))
        ids, row_bounds, batch_bounds = nested_arrays(mine.column("sample_ids"))
        tail_start = layout.complete_batches(total, self.settings.world_size, self.settings.grad_accum)
        tail = tail_start < total
        return RankEpoch(
            epoch=int(epoch),
            index=keep,
            samples=ids,
            row_bounds=row_bounds,
            batch_bounds=batch_bounds,
            tokens=column(mine, "tokens"),
            label_count=column(mine, "label_count"),
            num_items=column(mine, "num_items"),
            total_batches=total,
            tail_num_items=int(column(table, "num_items")[tail_start]) if tail else 0,
            counts={name: column(mine, name) for name in self.kind_columns},
            tail_counts={name: int(column(table, name)[tail_start]) if tail else 0 for name in self.kind_columns},
        )

    def samples_table(self) -> pa.Table:
        """The plan's samples table, checked against the dataset and metadata fingerprints."""
        table = self.read_samples()
        _refuse(self.samples_problems(table))
        return table

    # ------------------------------------------------------------ eval plan
    @property
    def eval_label_count(self) -> int:
        """Supervised targets of the whole eval plan (all ranks): what the eval loss divides its sum of CE by."""
        self.require_eval()
        return int(self.meta["eval"]["label_count"])

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
                table = self.read_eval()
            except StoreError as exc:
                raise PlanMismatchError(str(exc)) from None
            _refuse([*self.companion_problems(EVAL_FILE, "eval"), *self.eval_problems(table)])
            self._eval = table
        return self._eval

    def read_rank_eval(self, rank: int, world_size: int) -> RankEval:
        """Rank `rank`'s eval microbatches when evaluated on `world_size` ranks (every `world_size`-th, from
        `rank`): any world size splits the eval plan so that each sample is seen once."""
        check_rank(rank, world_size)
        table = self.eval_rows()
        keep = layout.rank_indices(table.num_rows, world_size, rank)
        mine = table.select(["sample_ids", "label_count"]).take(pa.array(keep))
        ids, row_bounds, batch_bounds = nested_arrays(mine.column("sample_ids"))
        return RankEval(keep, ids, row_bounds, batch_bounds, column(mine, "label_count"), table.num_rows,
                        self.eval_label_count, self.eval_counts)

    @property
    def eval_counts(self) -> dict[str, int]:
        """A preference plan's eval totals under the plan table's column names (what a preference loss over the
        whole eval set divides by: `num_pairs`, or `num_desirable` and `num_undesirable`); empty for SFT."""
        summary = self.meta["eval"]
        names = {"num_pairs": "pairs", "num_desirable": "desirable", "num_undesirable": "undesirable"}
        return {name: int(summary[names[name]]) for name in self.kind_columns if name in names}


def check_rank(rank: int, world_size: int) -> None:
    """Refuse a rank a run of `world_size` processes does not have (`PlanMismatchError`)."""
    if not 0 <= rank < world_size:
        raise PlanMismatchError(f"rank {rank} is outside world_size {world_size}")


def _refuse(problems: list[str]) -> None:
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise PlanMismatchError(f"{problems[0]}{more}; this plan was changed after it was compiled: recompile it "
                                "(`plancc validate PLAN_DIR` lists every problem)")


def degenerate_warnings(manifest: dict[str, Any], settings: PlanSettings) -> list[str]:
    """Settings that make a plan useless for training: an epoch without one complete update (at most a partial
    tail, which balancing cannot even out)."""
    per_update = settings.batches_per_update
    out = []
    for e in manifest.get("epochs", []):
        if e["batches"] < per_update:
            out.append(f"epoch {e['epoch']}: {e['batches']} microbatches, no complete update: one update "
                       f"takes world_size x grad_accum = {settings.world_size} x {settings.grad_accum} = "
                       f"{per_update} microbatches; lower --world-size or --grad-accum (or --micro-batch-size)")
    return out


def verified_plan(plan: str | Path | Plan) -> Plan:
    """`plan` (a path, or a `Plan` already open) verified for training (`Plan.verify`): what every runtime entry
    point opens with, so that no microbatch of a changed plan is replayed."""
    if not isinstance(plan, Plan):
        try:
            plan = Plan(plan)
        except (PlanIntegrityError, token_store.FileTypeError) as exc:
            raise PlanMismatchError(str(exc)) from None
    return plan.verify()
