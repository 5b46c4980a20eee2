"""A compiled plan as the runtime sees it: manifest, fingerprints, settings, and one rank's epoch as flat arrays.

Reading one rank's epoch is a filtered Parquet read (the plan file is sorted by (epoch, rank, index) in row
groups), so a 10M-sample plan loads one rank's epoch without decoding the rest. The nested `sample_ids` column
becomes three flat arrays, the same CSR shape the compiler uses::

    samples     = [7, 2, 9, 4, 0, 5]   sample ids, in plan order
    row_bounds  = [0, 2, 3, 6]         row k = samples[row_bounds[k]:row_bounds[k+1]]
    batch_bounds= [0, 1, 3]            microbatch j = rows[batch_bounds[j]:batch_bounds[j+1]]

Elastic replay: a plan compiled for (W, G) is read for (W', G') with W'·G' = W·G. The global order is unchanged;
rank r' takes every W'-th microbatch (`index % W' == r'`), so it reads the original ranks r with
`r ≡ r' (mod gcd(W, W'))` and keeps its own rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from plancc import store
from plancc.errors import PlanccError


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
    label_count: np.ndarray  # int64 supervised targets (SPEC 3)
    num_items: np.ndarray  # int64 global targets of the microbatch's update
    total_batches: int  # microbatches of the whole epoch (all ranks)
    tail_num_items: int  # global targets of the incomplete final update (0 when there is none)

    def __len__(self) -> int:
        return int(self.index.shape[0])


class RuntimePlan:
    """A plan directory opened for training: validated manifest, fingerprints and settings; lazy epoch reads."""

    def __init__(self, plan_dir: str | Path):
        self.path = Path(plan_dir)
        self.manifest: dict[str, Any] = store.read_manifest(self.path)
        meta = store.read_file_meta(self.path / store.PLAN_FILE)
        if meta.get("kind") != "plan":
            raise PlanMismatchError(f"{self.path / store.PLAN_FILE} is a '{meta.get('kind')}' file, not a plan")
        fps = self.manifest.get("fingerprints", {})
        if meta.get("fingerprints") != fps:
            raise PlanMismatchError(
                f"{self.path / store.PLAN_FILE} does not belong to {self.path / store.MANIFEST_FILE}: their "
                "fingerprints differ (a file was replaced or mixed from two plans); recompile the plan"
            )
        self.fingerprints: dict[str, Any] = fps
        self.settings: dict[str, Any] = self.manifest["settings"]
        self._epoch_batches = {int(e["epoch"]): int(e["batches"]) for e in self.manifest.get("epochs", [])}

    # ------------------------------------------------------------ settings
    @property
    def world_size(self) -> int:
        return int(self.settings["world_size"])

    @property
    def grad_accum(self) -> int:
        return int(self.settings["grad_accum"])

    @property
    def batches_per_update(self) -> int:
        return self.world_size * self.grad_accum

    @property
    def mode(self) -> str:
        return str(self.settings["mode"])

    @property
    def shift(self) -> str:
        return str(self.settings["shift"])

    @property
    def epochs(self) -> int:
        return int(self.settings["epochs"])

    def replay_grad_accum(self, world_size: int, grad_accum: int | None = None) -> int:
        """The grad_accum a run of `world_size` uses; refuses a replay that would change the updates."""
        per_update = self.batches_per_update
        if world_size == self.world_size and grad_accum is None:
            return self.grad_accum
        if grad_accum is None:
            raise PlanMismatchError(
                f"this plan was compiled for world_size {self.world_size} x grad_accum {self.grad_accum} "
                f"({per_update} microbatches per update) but the run has world_size {world_size}; recompile with "
                f"--world-size {world_size}, or replay it elastically by passing grad_accum so that world_size x "
                f"grad_accum = {per_update}"
                + (f" (grad_accum={per_update // world_size})" if per_update % world_size == 0 else
                   f" (impossible: {world_size} does not divide {per_update})")
            )
        if world_size * grad_accum != per_update:
            raise PlanMismatchError(
                f"world_size {world_size} x grad_accum {grad_accum} = {world_size * grad_accum} microbatches per "
                f"update, but this plan's updates hold {per_update} (compiled for world_size {self.world_size} x "
                f"grad_accum {self.grad_accum}); elastic replay needs the same product"
            )
        return int(grad_accum)

    # ------------------------------------------------------------ reads
    def total_batches(self, epoch: int) -> int:
        self._check_epoch(epoch)
        if epoch not in self._epoch_batches:
            t = store.read_table(self.path / store.PLAN_FILE, store.PLAN_SCHEMA, columns=["index"],
                                 filters=[("epoch", "=", int(epoch))])
            self._epoch_batches[epoch] = len(t)
        return self._epoch_batches[epoch]

    def _check_epoch(self, epoch: int) -> None:
        if not 0 <= int(epoch) < self.epochs:
            raise PlanMismatchError(f"epoch {epoch} is not in this plan (it has epochs 0..{self.epochs - 1}); "
                                    "compile with more --epochs")

    def read_rank_epoch(self, epoch: int, rank: int, world_size: int) -> RankEpoch:
        """Rank `rank`'s microbatches of `epoch` when the plan is replayed on `world_size` ranks."""
        self._check_epoch(epoch)
        if not 0 <= rank < world_size:
            raise PlanMismatchError(f"rank {rank} is outside world_size {world_size}")
        g = math.gcd(self.world_size, world_size)
        ranks = [r for r in range(self.world_size) if r % g == rank % g]
        filters: list[Any] = [("epoch", "=", int(epoch))]
        filters.append(("rank", "=", ranks[0]) if len(ranks) == 1 else ("rank", "in", ranks))
        table = store.read_table(self.path / store.PLAN_FILE, store.PLAN_SCHEMA, columns=PLAN_COLUMNS,
                                 filters=filters)
        index = table.column("index").to_numpy()
        if world_size != self.world_size:
            keep = np.flatnonzero(index % world_size == rank)
            table = table.take(pa.array(keep))
            index = index[keep]
        if index.shape[0] > 1 and not bool(np.all(index[1:] > index[:-1])):
            order = pc.sort_indices(table, [("index", "ascending")])
            table = table.take(order)
            index = table.column("index").to_numpy()
        outer = table.column("sample_ids").combine_chunks()
        batch_bounds = np.asarray(outer.offsets, dtype=np.int64)
        rows = outer.flatten()
        batch_bounds -= batch_bounds[0] if batch_bounds.shape[0] else 0
        row_bounds = np.asarray(rows.offsets, dtype=np.int64)
        samples = rows.flatten().to_numpy().astype(np.int64, copy=False)
        row_bounds -= row_bounds[0] if row_bounds.shape[0] else 0
        total = self.total_batches(epoch)
        per_update = self.batches_per_update
        tail_start = (total // per_update) * per_update
        tail_num_items = 0
        num_items = table.column("num_items").to_numpy()
        if tail_start < total:
            in_tail = np.flatnonzero(index >= tail_start)
            if in_tail.size:
                tail_num_items = int(num_items[in_tail[0]])
            else:  # this rank has no real microbatch in the tail: read the tail's total from its first row
                t = store.read_table(self.path / store.PLAN_FILE, store.PLAN_SCHEMA, columns=["num_items"],
                                     filters=[("epoch", "=", int(epoch)), ("index", "=", int(tail_start))])
                tail_num_items = int(t.column("num_items")[0].as_py())
        return RankEpoch(
            epoch=int(epoch),
            index=index.astype(np.int64, copy=False),
            samples=samples,
            row_bounds=row_bounds,
            batch_bounds=batch_bounds,
            tokens=table.column("tokens").to_numpy(),
            label_count=table.column("label_count").to_numpy(),
            num_items=num_items,
            total_batches=total,
            tail_num_items=tail_num_items,
        )

    def samples_table(self) -> pa.Table:
        path = self.path / store.SAMPLES_FILE
        if store.read_file_meta(path).get("fingerprints") != self.fingerprints:
            raise PlanMismatchError(f"{path} does not belong to {self.path / store.MANIFEST_FILE}: their "
                                    "fingerprints differ; recompile the plan")
        return store.read_samples(path)


def open_plan(plan: str | Path | RuntimePlan) -> RuntimePlan:
    return plan if isinstance(plan, RuntimePlan) else RuntimePlan(plan)
