"""`Plan`: a compiled plan directory, the one type the API, the runtime and the review commands all hand around.

`plancc.open_plan` opens one (the plan file's footer only); `verified_plan` (what the runtime opens with) also
checks every epoch and holds the plan's token store, on the same object. Every read a user makes is verified:
`plan.epoch(e)` reads epoch `e`'s rows (the plan file is sorted by (epoch, rank, index) in row groups, so other
epochs are not decoded), checks all of them against the layout and the epoch's plan fingerprint, then keeps the
rank's share asked for. The nested `sample_ids` column becomes three flat arrays, the same CSR shape the compiler
uses::

    sample_ids  = [7, 2, 9, 4, 0, 5]   in plan order
    row_bounds  = [0, 2, 3, 6]         row k = sample_ids[row_bounds[k]:row_bounds[k+1]]
    batch_bounds= [0, 1, 3]            microbatch j = rows[batch_bounds[j]:batch_bounds[j+1]]

Elastic replay: a plan compiled for (W, G) is read for (W', G') with W'·G' = W·G. The global order is unchanged;
rank r' takes every W'-th microbatch (`plancc.core.layout`). What a plan's files are and how they vouch for each
other is `plan.files` (`plancc.store.plan_store.PlanFiles`), the reader `validate`, `inspect` and `diff` use.
"""

from __future__ import annotations

import warnings
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
from plancc.store.manifest import Manifest
from plancc.store.parquet import column, nested_arrays
from plancc.store.plan_store import PlanFiles, PlanIntegrityError
from plancc.store.scan_record import ScanRecord
from plancc.store.schemas import EVAL_FILE, SAMPLES_FILE, StoreError

SHARE_COLUMNS = ["sample_ids", "tokens", "label_count", "num_items"]  # what a share of an epoch is read for


@dataclass(frozen=True)
class EpochMicrobatches:
    """Microbatches of one epoch (all of them, or one rank's share) in global order, as flat CSR arrays.

    Microbatch `i` holds rows `row_bounds[batch_bounds[i]:batch_bounds[i+1]]`; row `r` holds the sample ids
    `sample_ids[row_bounds[r]:row_bounds[r+1]]`. `index` is its global position in the epoch; `update`, `rank`,
    `micro_step` say where it runs under the replay it was read for; `tokens`, `label_count` (supervised targets,
    docs/spec.md §3) and `num_items` (its update's global targets) are the plan's columns. `total_batches` counts
    the whole epoch's microbatches (all ranks), `tail_num_items` the global targets of its incomplete final update
    (0 when there is none).
    """

    epoch: int
    index: np.ndarray
    update: np.ndarray
    rank: np.ndarray
    micro_step: np.ndarray
    sample_ids: np.ndarray
    row_bounds: np.ndarray
    batch_bounds: np.ndarray
    tokens: np.ndarray
    label_count: np.ndarray
    num_items: np.ndarray
    total_batches: int
    tail_num_items: int
    # a preference plan's update totals by column (`PlanFiles.kind_columns`: pairs, chosen targets, ...), and the tail's
    counts: dict[str, np.ndarray] = field(default_factory=dict)
    tail_counts: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.index.shape[0])

    def __getitem__(self, i: int) -> list[list[int]]:
        """Microbatch `i` of the share as its rows of sample ids."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"microbatch {i} out of range (0..{len(self) - 1})")
        i %= len(self)
        r0, r1 = int(self.batch_bounds[i]), int(self.batch_bounds[i + 1])
        return [self.sample_ids[self.row_bounds[r]:self.row_bounds[r + 1]].tolist() for r in range(r0, r1)]


@dataclass(frozen=True)
class EvalMicrobatches:
    """The eval plan's microbatches (all, or one rank's share under a `world_size` split), in plan order: CSR
    arrays as `EpochMicrobatches`; `total_batches` and `total_label_count` count the whole eval plan (all ranks):
    the eval loss divides its sum of CE by `total_label_count`."""

    index: np.ndarray
    sample_ids: np.ndarray
    row_bounds: np.ndarray
    batch_bounds: np.ndarray
    label_count: np.ndarray
    total_batches: int
    total_label_count: int
    counts: dict[str, int] = field(default_factory=dict)  # a preference plan's eval totals (`eval_counts`)

    def __len__(self) -> int:
        return int(self.index.shape[0])


class Plan:
    """A plan directory: where it is (`path`), what it records of itself (`manifest`: `settings`, `fingerprints`,
    `scan_record`, `warnings`, `epochs`), and its contents, each read verified: `epoch`, `eval`, `samples_table`,
    `metrics`, `tokens`. `verify()` checks all of it at once (what a trainer does before step 1); `files` is the
    reader underneath, for the review commands.

    One type for every reader, so that settings, fingerprints and epochs are read in one place and mean one thing:
    the API returns it, inspect/diff/validate/show read through it, and the runtime trains on it. Opening is cheap
    (the plan file's footer, the token store's header and maps) and holds the directory and every file open, so a
    plan recompiled into the same directory (`--overwrite`) while a run trains changes nothing for it (the old
    directory stays, hidden, while it is held: `plancc.store.atomic`); a read that finds a file changed since
    compile raises `PlanMismatchError` with the first problem (`validate` lists them all instead). `dir_fd`: the
    plan directory already open (what a spawned DataLoader worker gets from its parent).
    """

    def __init__(self, path: str | Path, *, dir_fd: int | None = None, threads: bool = True):
        self.files = PlanFiles(path, dir_fd=dir_fd, threads=threads)  # threads: `parquet.read_table`'s
        self.path: Path = self.files.path
        self.manifest: Manifest = self.files.manifest
        self._tokens: token_store.MappedTokens | None = None  # the plan's own token store
        self._tokens_problem: str | None = None  # why it could not be held (raised when it is asked for)
        if self.manifest.binds_tokens or self.files.data_problems():
            try:  # mapped now, from the directory just opened: a recompile or a move later changes nothing
                self._tokens = self.files.open_tokens()
            except (PlanIntegrityError, token_store.FileTypeError) as exc:
                self._tokens_problem = str(exc)
        self._verified_all = False
        self._body_verified: bool | None = None  # whether the plan file's body digest vouched for every row
        self._epoch: tuple[int, pa.Table] | None = None  # the last epoch read and verified
        self._eval: pa.Table | None = None  # the eval plan, once read and verified
        self._checked: set[str] = set()  # what `_header` and `_companion` checked

    def __repr__(self) -> str:  # the manifest is long: name the plan, not its contents
        return (f"Plan({str(self.path)!r}, samples={self.manifest.samples}, epochs={self.epochs}, "
                f"mode={self.settings.mode!r}, world_size={self.settings.world_size}, "
                f"grad_accum={self.settings.grad_accum})")

    def __eq__(self, other: object) -> bool:  # the same plan: the same directory holding the same plan file
        return isinstance(other, Plan) and (self.path, self.manifest.to_json()) == (other.path,
                                                                                    other.manifest.to_json())

    __hash__ = None  # type: ignore[assignment]  # a plan directory's content can change: no hashing

    # ------------------------------------------------------------ what the plan is
    @property
    def settings(self) -> PlanSettings:
        """The plan's settings, typed (hashed into the config fingerprint)."""
        return self.manifest.settings

    @property
    def fingerprints(self) -> dict[str, Any]:
        """`dataset`, `metadata`, `config`, `plan` ({epoch: hash}), `eval`, `tokens`, `plancc`, `schema`."""
        return self.manifest.fingerprints

    @property
    def epochs(self) -> list[int]:
        """The plan's epoch numbers, ascending (`PlanFiles.header_problems` checks the plan fingerprints name the
        same)."""
        return list(range(self.settings.epochs))

    @property
    def scan_record(self) -> ScanRecord:
        """How the plan's samples were made: the scan's record (tokenizer, template, options, counts, drops)."""
        return self.manifest.scan

    @property
    def warnings(self) -> tuple[str, ...]:
        """What compile found suspicious (drops, chat template markers that are not single tokens, ...), and every
        epoch without one complete update."""
        return (*self.manifest.warnings, *degenerate_warnings(self.manifest))

    # ------------------------------------------------------------ its contents, verified
    def epoch(self, epoch: int, rank: int | None = None, *, world_size: int | None = None,
              grad_accum: int | None = None) -> EpochMicrobatches:
        """The microbatches of `epoch` (only `rank`'s when given), verified: the settings against the config
        fingerprint, and every row of the epoch against the layout and the epoch's plan fingerprint, before any is
        returned. `world_size` (and `grad_accum`) replay the plan elastically (`replay_grad_accum`):
        `update`, `rank` and `micro_step` are then the replay's."""
        check_epoch(self.epochs, epoch)
        W = self.settings.world_size if world_size is None else int(world_size)
        G = replay_grad_accum(self.settings, W, grad_accum)
        if rank is not None and not 0 <= rank < W:
            raise SettingsError(f"rank {rank}: the plan has ranks 0..{W - 1}" if world_size is None
                                else f"rank {rank} is outside world_size {W}")
        kinds = self.files.kind_columns  # a preference plan's update totals (pairs, ...)
        total, keep, mine, tail = self._share(int(epoch), W, rank, kinds)
        ids, row_bounds, batch_bounds = nested_arrays(mine.column("sample_ids"))
        update, ranks, micro_step = (a[keep] for a in layout.update_mapping(total, W, G))
        return EpochMicrobatches(
            int(epoch), keep, update, ranks, micro_step, ids, row_bounds, batch_bounds, column(mine, "tokens"),
            column(mine, "label_count"), column(mine, "num_items"), total, tail["num_items"],
            {name: column(mine, name) for name in kinds}, {name: tail[name] for name in kinds})

    def _share(self, epoch: int, world_size: int, rank: int | None, kinds: list[str]
               ) -> tuple[int, np.ndarray, pa.Table, dict[str, int]]:
        """(the epoch's microbatches, the global indices of `rank`'s share under `world_size` (all when None),
        their rows in that order, the tail update's `num_items` and `kinds` totals (0 without a tail)). A plan
        whose body digest vouches for its rows (`verify`) reads only the share's row groups; an older plan's epoch
        is read whole and verified first."""
        s, body = self.settings, self._body()
        table = None if body else self._verified_epoch(epoch)
        total = self.manifest.epochs[epoch].batches if table is None else table.num_rows  # `_body` checked the count
        keep = np.arange(total, dtype=np.int64) if rank is None else layout.rank_indices(total, world_size, rank)
        tail = layout.complete_batches(total, s.world_size, s.grad_accum)
        counted = ["num_items", *kinds]
        if table is not None:
            tail_row = table.select(counted).slice(tail, 1) if tail < total else None
            mine = table.select([*SHARE_COLUMNS, *kinds]).take(pa.array(keep))
        else:
            try:
                mine = self.files.read_microbatches(epoch, keep, [*SHARE_COLUMNS, *kinds])
                tail_row = self.files.read_microbatches(epoch, np.array([tail]), counted) if tail < total else None
            except PlanIntegrityError as exc:
                _refuse([str(exc)])
        return total, keep, mine, {name: int(column(tail_row, name)[0]) if tail_row is not None else 0
                                   for name in counted}

    def eval(self, rank: int | None = None, world_size: int = 1) -> EvalMicrobatches:
        """The eval plan's microbatches (only `rank`'s of a `world_size` split when given: every `world_size`-th,
        from `rank`, so any world size sees each eval sample once), verified once against its layout, the eval
        fingerprint and the manifest's eval summary. Refused for a plan without one, saying how to compile one."""
        if rank is not None:
            check_rank(rank, world_size)
        table = self._verified_eval()
        keep = layout.rank_indices(table.num_rows, world_size, rank or 0) if rank is not None else \
            np.arange(table.num_rows, dtype=np.int64)
        mine = table.select(["sample_ids", "label_count"]).take(pa.array(keep))
        ids, row_bounds, batch_bounds = nested_arrays(mine.column("sample_ids"))
        assert self.manifest.eval is not None  # checked by `_verified_eval`
        return EvalMicrobatches(keep, ids, row_bounds, batch_bounds, column(mine, "label_count"), table.num_rows,
                                self.manifest.eval.label_count, eval_counts(self.manifest))

    def samples_table(self) -> pa.Table:
        """The plan's samples table, checked against the dataset and metadata fingerprints (and its file's
        metadata against the plan's)."""
        self._companion(SAMPLES_FILE, "samples")
        table = self.files.read_samples()
        _refuse(self.files.samples_problems(table))
        return table

    def metrics(self, epoch: int | None = None) -> list[dict[str, Any]]:
        """Metric rows `{epoch, stage, metric..., padding_ratio}` (stages `before` ... `after`) of every epoch (or
        one), as stored (checked against the plan's metrics checksum) and as `plancc inspect metrics` shows them."""
        table = self.files.read_metrics()
        _refuse(self.files.metrics_problems(table))
        rows = table.to_pylist()
        out = [{**r, "padding_ratio": padding_ratio(r)} for r in rows if epoch is None or r["epoch"] == epoch]
        if epoch is not None and not out:
            raise PlanccError(f"--epoch {epoch}: the plan has no such epoch "
                              f"(epochs: {sorted({r['epoch'] for r in rows})})")
        return out

    def tokens(self) -> token_store.MappedTokens | None:
        """The plan's own token store (`tokens/`), opened with the plan through the directory opened with it and
        checked against the digest the plan binds; None for a plan that ships none (compiled from a bare samples
        table). Refused (`PlanMismatchError`) when it was gone or was not the store the plan was compiled with."""
        if self._tokens_problem is not None:
            raise PlanMismatchError(f"{self._tokens_problem}; recompile the plan")
        return self._tokens

    def verify(self) -> Plan:
        """Check the plan for training once and hold its token store; returns the plan.

        Refuses (`PlanMismatchError`, the first problem) settings that do not hash to the config fingerprint, a
        samples file of another plan, a `manifest.json` that differs from the plan file's metadata, and any row of
        any epoch that is not as compile wrote it, so a changed row is refused before step 1 on every rank: the
        plan file's body digest vouches for every row without decoding them (`plancc.store.plan_body`: one hash
        pass over the file, each epoch's row count from its epoch column), and a rank then decodes only its own
        rows (`epoch`). A plan written before the digest existed has each epoch's rows decoded and checked against
        the layout and the epoch's plan fingerprint instead. (The token store was opened with the plan; one that
        was gone or not the plan's is refused when it is asked for, `tokens()`: a caller may pass its data
        elsewhere.)
        """
        if self._verified_all:
            return self
        self._header()
        _refuse(self.files.manifest_problems(required=False))
        self._companion(SAMPLES_FILE, "samples")
        if not self._body():
            for epoch in reversed(self.epochs):
                self._verified_epoch(epoch)
        self._verified_all = True
        return self

    # ------------------------------------------------------------ the checks behind the reads
    def _header(self) -> None:
        """The settings against the config fingerprint, the epochs the fingerprints and summaries name (once)."""
        if "header" not in self._checked:
            _refuse(self.files.header_problems())
            self._checked.add("header")

    def _body(self) -> bool:
        """Whether the plan file's body digest vouches for every row (checked once, with each epoch's row count;
        refused when it does not hold); False for a plan written before the digest existed."""
        if self._body_verified is None:
            self._header()
            if self.files.has_rows_digest:
                _refuse(self.files.body_problems())
            self._body_verified = self.files.has_rows_digest
        return self._body_verified

    def _companion(self, name: str, kind: str) -> None:
        """A sibling file's metadata against the plan file's (once)."""
        if name not in self._checked:
            _refuse(self.files.companion_problems(name, kind))
            self._checked.add(name)

    def _verified_epoch(self, epoch: int) -> pa.Table:
        """All rows of `epoch` in global order, verified (every rank reads and checks the whole epoch: plan rows are
        small, and so no rank replays a row that was edited, deleted or reordered, and every rank sees the same
        tail)."""
        if self._epoch is None or self._epoch[0] != epoch:
            self._header()
            table = self.files.read_epoch(epoch)
            _refuse(self.files.epoch_problems(epoch, table))
            self._epoch = (epoch, table)
        return self._epoch[1]

    def _verified_eval(self) -> pa.Table:
        if not self.manifest.has_eval:
            raise PlanMismatchError(f"the plan {self.path} has no eval plan: compile it with --val-set-size "
                                    "(e.g. 0.05, or a count of samples) to hold out an eval set")
        if self._eval is None:
            try:
                table = self.files.read_eval()
            except StoreError as exc:
                raise PlanMismatchError(str(exc)) from None
            _refuse([*self.files.companion_problems(EVAL_FILE, "eval"), *self.files.eval_problems(table),
                     *self.files.eval_draw_problems(table)])
            self._eval = table
        return self._eval

    # ------------------------------------------------------------ names an earlier Plan had
    def __getattr__(self, name: str) -> Any:
        moved = _MOVED.get(name)
        if moved is None:
            raise AttributeError(f"'Plan' object has no attribute {name!r}")
        warnings.warn(f"Plan.{name} is deprecated: {moved[1]}", DeprecationWarning, stacklevel=2)
        return moved[0](self)


def _files_member(name: str) -> Any:
    return lambda plan: getattr(plan.files, name)


_MOVED: dict[str, tuple[Any, str]] = {
    "scan": (lambda p: p.scan_record.to_json(), "use plan.scan_record (a typed ScanRecord)"),
    "meta": (lambda p: {**p.manifest.to_json(), "kind": "plan"}, "use plan.manifest"),
    "has_eval": (lambda p: p.manifest.has_eval, "use plan.manifest.has_eval"),
    "eval_label_count": (lambda p: p.eval().total_label_count, "use plan.eval().total_label_count"),
    "check_epoch": (lambda p: lambda e: check_epoch(p.epochs, e), "use plan.epochs"),
    "total_batches": (lambda p: lambda e: p.epoch(e).total_batches, "use plan.epoch(e).total_batches"),
    "epoch_rows": (lambda p: p._verified_epoch, "use plan.epoch(e)"),
    "read_rank_epoch": (lambda p: lambda e, r, w: p.epoch(e, r, world_size=w), "use plan.epoch(e, rank, world_size=)"),
    "read_rank_eval": (lambda p: lambda r, w: p.eval(r, w), "use plan.eval(rank, world_size)"),
    "eval_rows": (lambda p: p._verified_eval, "use plan.eval()"),
    "own_tokens": (lambda p: p.tokens, "use plan.tokens()"),
    "replay_grad_accum": (lambda p: lambda w, g=None, **kw: replay_grad_accum(p.settings, w, g, **kw),
                          "use plancc.store.plan.replay_grad_accum"),
    **{name: (_files_member(name), f"use plan.files.{name} (the reader underneath)") for name in (
        "plan_file", "held", "source", "data_problems", "open_tokens", "header_problems", "manifest_problems",
        "companion_problems", "read_samples", "samples_problems", "read_metrics", "metrics_problems", "has_before",
        "read_before", "before_problems", "before_labels", "read_eval", "eval_problems", "read_rows", "read_epoch",
        "epoch_problems", "row_count")},
}


def eval_counts(manifest: Manifest) -> dict[str, int]:
    """A preference plan's eval totals under the plan table's column names (what a preference loss over the whole
    eval set divides by: `num_pairs`, or `num_desirable` and `num_undesirable`); empty for SFT or without an eval
    plan."""
    counts = manifest.eval.counts if manifest.eval is not None else {}
    return {f"num_{name}": value for name, value in counts.items()}


def check_epoch(epochs: list[int], epoch: int) -> None:
    """Refuse an epoch the plan does not hold (`PlanMismatchError`, naming the ones it does)."""
    if int(epoch) not in epochs:
        raise PlanMismatchError(f"epoch {epoch}: the plan has epochs {epochs}; compile with more --epochs")


def check_rank(rank: int, world_size: int) -> None:
    """Refuse a rank a run of `world_size` processes does not have (`PlanMismatchError`)."""
    if not 0 <= rank < world_size:
        raise PlanMismatchError(f"rank {rank} is outside world_size {world_size}")


def replay_grad_accum(settings: PlanSettings, world_size: int, grad_accum: int | None = None, *,
                      flag: str = "grad_accum") -> int:
    """The grad_accum a run of `world_size` uses to replay a plan of `settings` (`grad_accum`, or the plan's own);
    refuses a replay that would change the updates (`layout.replay_problem`, naming grad_accum as `flag`)."""
    problem = layout.replay_problem(settings.world_size, settings.grad_accum, world_size, grad_accum, flag=flag)
    if problem is not None:
        raise PlanMismatchError(problem)
    return settings.grad_accum if grad_accum is None else int(grad_accum)


def _refuse(problems: list[str]) -> None:
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise PlanMismatchError(f"{problems[0]}{more}; this plan was changed after it was compiled: recompile it "
                                "(`plancc validate PLAN_DIR` lists every problem)")


def degenerate_warnings(manifest: Manifest) -> list[str]:
    """Settings that make a plan useless for training: an epoch without one complete update (at most a partial
    tail, which balancing cannot even out)."""
    s = manifest.settings
    return [f"epoch {e.epoch}: {e.batches} microbatches, no complete update: one update takes world_size x "
            f"grad_accum = {s.world_size} x {s.grad_accum} = {s.batches_per_update} microbatches; lower "
            "--world-size or --grad-accum (or --micro-batch-size)"
            for e in manifest.epochs if e.batches < s.batches_per_update]


def verified_plan(plan: str | Path | Plan) -> Plan:
    """`plan` (a path, or a `Plan` already open) verified for training (`Plan.verify`): what every runtime entry
    point opens with, so that no microbatch of a changed plan is replayed. Its files are decoded on the calling
    thread from then on (a training process exits as Python does, with no Arrow worker thread alive:
    `parquet.read_table`)."""
    if not isinstance(plan, Plan):
        try:
            plan = Plan(plan, threads=False)
        except (PlanIntegrityError, token_store.FileTypeError) as exc:
            raise PlanMismatchError(str(exc)) from None
    plan.files.threads = False
    return plan.verify()
