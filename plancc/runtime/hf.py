"""Hugging Face `Trainer` integration: the plan's sampler and batches, the plan's `num_items_in_batch`, exact resume.

    from plancc.runtime.hf import PlanTrainer
    trainer = PlanTrainer(model=model, args=TrainingArguments(..., gradient_accumulation_steps=G), plan=plan_dir)
    trainer.train()                                   # or train(resume_from_checkpoint=True)

What it changes in `Trainer` (transformers is imported only here, and only when this module is):
- the train dataloader is a `PlanDataLoader` over the plan for this process's rank (`args.process_index`,
  `args.world_size`); `args.world_size * gradient_accumulation_steps` must equal the plan's microbatches per
  update (elastic replay allowed); `per_device_train_batch_size` is ignored: the plan decides the batches;
- the run's epochs (`num_train_epochs`, or all of the plan's with `max_steps`) are one stream to the Trainer, in
  which every update is exactly `gradient_accumulation_steps` batches (tail updates are padded with
  zero-gradient placeholders): epochs may differ in length, and ranks stay in lockstep, as in the plain loop;
- each accumulation window is checked to be exactly one plan update, and `num_items_in_batch` is the plan's
  global count for it (no gather, no recount);
- the forward gets `model_inputs(batch, model.config._attn_implementation, explicit_mask=...)`: varlen kwargs
  for flash attention, or with `explicit_mask=True` a 4D block-diagonal causal mask;
- the loss is the plan's token mean (fp32 CE, sum, / num_items, x world size) by one of the paths of
  `plancc.runtime.forward`, chosen with `loss=`: `"chunked"` (default: from the hidden states and the output head,
  a chunk of tokens at a time, never every token's logits), `"logits"` (full logits, `token_loss`) or `"model"`
  (the model's own loss function handed `labels`, `shift_labels` and the plan's `num_items_in_batch`: the way in
  for a fused kernel patched into the model, Liger or cut-cross-entropy). A `compute_loss_func(outputs, labels,
  num_items_in_batch=N)` gets the plan's count for its window and returns sum / N (the Trainer's convention);
- every checkpoint gets each rank's sampler state at that optimizer step (`plancc_sampler.json` for rank 0,
  `plancc_sampler.rank<r>.json` for the others), written atomically once the Trainer's own files are saved and
  fsynced; it is the checkpoint's completion mark, and `save_total_limit` rotation waits for it, so a kill
  mid-save never leaves the run without a complete checkpoint. Resuming checks the states against the plan
  (fingerprints, validity, world size) and that every rank's names the same step (one all_gather: a mix is
  refused, naming each rank's step) before the Trainer skips the consumed batches; a checkpoint without them is
  refused. `resume_from_checkpoint=True` takes the newest checkpoint complete on every rank (a warning says
  which newer ones it skipped). The skip itself goes through the sampler only (no batch is collated).
- `evaluate()` (and `eval_strategy`/`eval_steps` during training; "epoch" means each plan epoch) runs the plan's
  eval plan (a plan compiled with `--val-set-size` or with a recipe's eval datasets): each rank its share, one
  all-reduce of (sum of CE, targets), logged as `eval_loss`, the exact token mean over the whole eval set
  (`plancc.runtime.evaluate`). `eval_dataset` defaults to it; another plan directory evaluates that plan's eval
  plan; any other dataset is refused (its batches are not planned).
Label smoothing is not supported (it would change the objective the plan counts for).
"""

from __future__ import annotations

import bisect
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import (
    PREFIX_CHECKPOINT_DIR,
    IntervalStrategy,
    rotate_checkpoints,
    speed_metrics,
)

from plancc.errors import PlanMismatchError
from plancc.runtime.checkpoint import (
    CheckpointError,
    _all_gather_rows,
    _barrier,
    agree_on_step,
    crash_point,
    read_sealed_json,
    together,
    write_sealed_json,
)
from plancc.runtime.collator import PlanCollator
from plancc.runtime.data import TokenStore, load_tokens
from plancc.runtime.evaluate import eval_result, eval_totals
from plancc.runtime.forward import LOSS_PATHS, microbatch_loss
from plancc.runtime.loader import PlanDataLoader, PlanDataset, eval_loader
from plancc.runtime.sampler import PlanEvalSampler, PlanSampler
from plancc.runtime.tokenizer import check_tokenizer
from plancc.store.atomic import fsync_dir
from plancc.store.plan import Plan, replay_grad_accum, verified_plan

STATE_FILE = "plancc_sampler.json"
# the trainers of each kind of plan (`Manifest.data_kind`), named when a plan reaches another kind's trainer
TRAINER_OF = {"sft": "PlanTrainer or PlanSFTTrainer",
              "preference": "PlanDPOTrainer (plancc.runtime.trl_preference)",
              "unpaired_preference": "PlanKTOTrainer (plancc.runtime.trl_preference)"}


class _EpochStream:
    """The epochs of one Trainer run as one stream of microbatches (a DataLoader `batch_sampler`).

    The Trainer sees a single epoch holding all of them, every update `G` batches long (the sampler pads tail
    updates with placeholders, `full_updates=True`), so epochs of different lengths, tails, resume across an epoch
    boundary and the optimizer-step count (for LR schedules) need no special case in the Trainer's loop.
    """

    def __init__(self, sampler: PlanSampler, epochs: int):
        self.sampler, self.epochs = sampler, epochs

    def __len__(self) -> int:
        return sum(self.sampler.epoch_lengths()[:self.epochs])

    def __iter__(self):
        for epoch in range(self.epochs):
            self.sampler.set_epoch(epoch)
            yield from self.sampler

    def set_epoch(self, epoch: int) -> None:
        """The Trainer's epoch 0 is the whole stream: nothing to do."""

    def mark_consumed(self, batch: Any) -> None:
        self.sampler.mark_consumed(batch)


def state_file(rank: int) -> str:
    """The name of rank `rank`'s sampler state in a checkpoint directory (rank 0's is `STATE_FILE`)."""
    return STATE_FILE if rank == 0 else f"plancc_sampler.rank{rank}.json"


def _checkpoint_step(ckpt: Path) -> int | None:
    name = ckpt.name
    prefix = f"{PREFIX_CHECKPOINT_DIR}-"
    return int(name[len(prefix):]) if name.startswith(prefix) and name[len(prefix):].isdigit() else None


class _PlanEpoch(TrainerCallback):
    """The Trainer runs the plan's epochs as its one epoch (see `_EpochStream`): report the plan's epochs instead,
    and under `eval_strategy="epoch"` evaluate at the end of each plan epoch (once: not again when the stream ends
    with one)."""

    def __init__(self, trainer: PlanTrainer):
        self.trainer = trainer

    def _ends_plan_epoch(self, args, state) -> bool:
        return (args.eval_strategy == IntervalStrategy.EPOCH and args.eval_delay <= state.epoch
                and state.global_step in self.trainer._update_bounds()[1:])

    def on_step_end(self, args, state, control, **kwargs):
        state.epoch = self.trainer.plan_epoch_progress(state.global_step)
        if self._ends_plan_epoch(args, state):
            control.should_evaluate = True
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        if self._ends_plan_epoch(args, state):  # evaluated at this step's end already
            control.should_evaluate = False
        return control


class PlanTrainer(Trainer):
    """A `Trainer` that replays a plancc plan (see module docstring). Extra keyword arguments: `plan` (a plan
    directory or `Plan`), `tokens` (a `TokenStore`; default: the plan's data, verified), `verify`,
    `allow_dataset_change`, `pad_token_id`, `explicit_mask` (see `plancc.runtime.model_inputs`), `loss` (see
    `plancc.runtime.forward`; the Trainer's `compute_loss_func` takes precedence over it). A
    `processing_class` must be the tokenizer the plan was compiled with (`plancc.runtime.check_tokenizer`)."""

    data_kind = "sft"  # what the plans it trains hold (`Manifest.data_kind`): preference trainers train theirs
    loss_paths: tuple[str, ...] = LOSS_PATHS

    def __init__(self, *args: Any, plan: str | Path | Plan, tokens: TokenStore | None = None,
                 verify: str = "chunks", allow_dataset_change: bool = False, pad_token_id: int = 0,
                 explicit_mask: bool = False, loss: str = "chunked", **kwargs: Any):
        if loss not in self.loss_paths:
            raise ValueError(f"loss={loss!r}: choose one of {', '.join(self.loss_paths)}")
        self.plan, self.plan_loss = verified_plan(plan), loss
        if self.plan.manifest.data_kind != self.data_kind:
            raise PlanMismatchError(f"{self.plan.path} holds {self.plan.manifest.data_kind} data; {type(self).__name__} trains "
                                    f"{self.data_kind} data: use {TRAINER_OF[self.plan.manifest.data_kind]}")
        if kwargs.get("processing_class") is not None:  # saved with every checkpoint: it must be the plan's
            check_tokenizer(self.plan, kwargs["processing_class"])
        self.allow_dataset_change, self.explicit_mask = allow_dataset_change, explicit_mask
        self.plan_tokens = tokens if tokens is not None else load_tokens(
            self.plan, verify=verify, allow_dataset_change=allow_dataset_change)
        self.plan_collator = PlanCollator.from_plan(self.plan, pad_token_id=pad_token_id)
        kwargs.setdefault("train_dataset", PlanDataset(self.plan_tokens, self.plan_collator))
        self.eval_plan = self._eval_plan_of(kwargs.get("eval_dataset"))
        if self.eval_plan is None and getattr(kwargs.get("args", args[1] if len(args) > 1 else None),
                                              "eval_strategy", "no") != "no":
            self.plan.eval()  # refused, saying how to compile one: the Trainer's own message would ask for an eval_dataset
        kwargs["eval_dataset"] = None if self.eval_plan is None else self._eval_stand_in()
        super().__init__(*args, **kwargs)
        if self.args.label_smoothing_factor:
            raise PlanMismatchError("PlanTrainer trains the plan's token-mean loss: label_smoothing_factor is not "
                                    "supported")
        gas, world = self.args.gradient_accumulation_steps, self.args.world_size
        self.plan_grad_accum = replay_grad_accum(self.plan.settings, world, gas, flag="gradient_accumulation_steps")
        # Our loss is already normalized by the update's global count: the Trainer must not rescale it.
        self.model_accepts_loss_kwargs = True
        if hasattr(self, "loss_is_scaled_for_ga"):
            self.loss_is_scaled_for_ga = True
        self.plan_sampler = self._make_sampler()
        self.add_callback(_PlanEpoch(self))

    # ------------------------------------------------------------ data
    def _make_sampler(self) -> PlanSampler:
        return PlanSampler(self.plan, rank=self.args.process_index, world_size=self.args.world_size,
                           grad_accum=self.plan_grad_accum, full_updates=True)

    def _train_epochs(self) -> int:
        """Plan epochs this run covers: all of them with `max_steps`, else `num_train_epochs` (a whole number)."""
        if self.args.max_steps > 0:
            return len(self.plan.epochs)
        epochs = self.args.num_train_epochs
        if epochs != int(epochs) or not 1 <= epochs <= len(self.plan.epochs):
            raise PlanMismatchError(
                f"num_train_epochs {epochs} must be a whole number of the plan's {len(self.plan.epochs)} epochs; use "
                "max_steps for a partial epoch, or compile the plan with more --epochs")
        return int(epochs)

    def _update_bounds(self) -> list[int]:
        """Optimizer steps before each epoch of the plan (and after the last): `[0, U0, U0 + U1, ...]`."""
        bounds = [0]
        for e in self.plan.epochs:
            bounds.append(bounds[-1] + self.plan_sampler.updates_per_epoch(e))
        return bounds

    def _epoch_at(self, global_step: int) -> tuple[int, int, int]:
        """(epoch, optimizer steps done in it, its optimizer steps) after `global_step` steps of the stream; past
        the end, the last epoch with more steps done than it has."""
        bounds = self._update_bounds()
        epoch = min(bisect.bisect_right(bounds, global_step), len(self.plan.epochs)) - 1
        return epoch, global_step - bounds[epoch], bounds[epoch + 1] - bounds[epoch]

    def get_train_dataloader(self) -> PlanDataLoader:
        """The plan's loader over every training epoch as one stream of whole updates (see module docstring)."""
        self.plan_sampler = self._make_sampler()
        stream = _EpochStream(self.plan_sampler, self._train_epochs())
        total = self._update_bounds()[-1]
        if self.args.max_steps > total:
            raise PlanMismatchError(f"max_steps {self.args.max_steps} exceeds the plan's {total} optimizer steps; "
                                    "compile the plan with more --epochs")
        return PlanDataLoader(PlanDataset(self.plan_tokens, self.plan_collator), stream,
                              num_workers=self.args.dataloader_num_workers,
                              pin_memory=self.args.dataloader_pin_memory)

    def set_initial_training_values(self, args, dataloader, *rest):
        """One Trainer epoch is the whole stream (see `_EpochStream`); its optimizer steps are the plan's."""
        values = list(super().set_initial_training_values(args, dataloader, *rest))
        updates = self._update_bounds()[self._train_epochs()]  # each `G` batches of the stream (`_EpochStream`)
        values[0], values[1], values[5] = 1, updates, len(dataloader)
        values[6] = args.max_steps if args.max_steps > 0 else updates
        return tuple(values)

    def plan_epoch_progress(self, global_step: int) -> float:
        """Epochs of the plan done after `global_step` optimizer steps (what the Trainer logs as `epoch`)."""
        epoch, done, steps = self._epoch_at(global_step)
        return epoch + done / max(steps, 1)

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """One plan update's batches and its global target count from the plan."""
        batches = []
        for _ in range(num_batches):
            try:
                batches.append(next(epoch_iterator))
            except StopIteration:
                break
        if not batches:
            return batches, None
        updates = {(b["plan"]["epoch"], b["plan"]["update"]) for b in batches}
        if len(updates) != 1 or not batches[-1]["plan"]["last_in_update"]:
            raise PlanMismatchError(
                f"the Trainer's accumulation window of {len(batches)} batches spans plan updates {sorted(updates)}; "
                "it must hold exactly one update: check gradient_accumulation_steps and that nothing else "
                "re-batches the plan's dataloader")
        num_items = int(batches[0]["num_items_in_batch"])
        return batches, torch.tensor(num_items, dtype=torch.int64, device=device)

    # ------------------------------------------------------------ evaluation
    def _eval_plan_of(self, eval_dataset: Any) -> Plan | None:
        """The plan whose eval plan `evaluate` runs: this plan's by default (None when it has none), or the plan
        given as `eval_dataset`; anything else is refused (its batches would not be the plan's)."""
        if eval_dataset is None:
            return self.plan if self.plan.manifest.has_eval else None
        if isinstance(eval_dataset, str | os.PathLike | Plan):
            plan = verified_plan(eval_dataset)
            plan.eval()  # refused when it holds none
            return plan
        raise PlanMismatchError(
            f"PlanTrainer evaluates the plan's eval plan, not a {type(eval_dataset).__name__}: compile the plan with "
            "--val-set-size (a fraction such as 0.05, or a count of samples) to hold out an eval set, and leave "
            "eval_dataset unset (or pass a plan directory compiled that way)")

    def _eval_stand_in(self) -> Any:
        """What the Trainer holds as `eval_dataset` (it only checks that there is one): the plan's dataset."""
        return PlanDataset(self.plan_tokens, self.plan_collator)

    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
        """The exact token-mean loss over the eval plan on every rank (`plancc.runtime.evaluate`), logged as
        `<prefix>_loss` with `<prefix>_targets` (the global count it divides by) and the Trainer's speed metrics."""
        plan = self.eval_plan if eval_dataset is None else self._eval_plan_of(eval_dataset)
        if plan is None:
            self.plan.eval()  # refused: it holds none
        self._memory_tracker.start()
        start = time.time()
        tokens = self.plan_tokens if plan is self.plan else load_tokens(
            plan, allow_dataset_change=self.allow_dataset_change)
        sampler = PlanEvalSampler(plan, rank=self.args.process_index, world_size=self.args.world_size)
        collator = PlanCollator.from_plan(plan, pad_token_id=self.plan_collator.pad_token_id)
        loader = eval_loader(PlanDataset(tokens, collator), sampler, num_workers=self.args.dataloader_num_workers,
                             pin_memory=self.args.dataloader_pin_memory)
        model = self.model_wrapped if self.model_wrapped is not None else self.model
        was_training = self.model.training
        self.model.eval()  # while logging too: what TRL's `log` reads to tell eval logs from training ones
        try:
            metrics = {**self.plan_eval_metrics(model, loader, plan, metric_key_prefix),
                       **speed_metrics(metric_key_prefix, start, num_samples=plan.manifest.eval.samples,
                                       num_steps=len(sampler))}
            self.log(metrics)
        finally:
            self.model.train(was_training)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        self._memory_tracker.stop_and_update_metrics(metrics)
        return metrics

    def plan_eval_metrics(self, model: Any, loader: Any, plan: Plan, prefix: str) -> dict[str, float]:
        """The eval plan's figures (this rank's batches in `loader`, one all-reduce): `<prefix>_loss`, the exact
        token-mean loss, and `<prefix>_targets`, the global count it divides by."""
        totals = eval_totals(model, loader, explicit_mask=self.explicit_mask, loss=self._eval_loss_path())
        result = eval_result(totals, plan, distributed=self.args.world_size > 1)
        return {f"{prefix}_loss": result.loss, f"{prefix}_targets": result.targets}

    # ------------------------------------------------------------ loss
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """plancc's token-mean loss for one microbatch, normalized by the update's global count from the
        plan."""
        if num_items_in_batch is None:
            num_items_in_batch = inputs["num_items_in_batch"]
        outputs, loss = microbatch_loss(model, inputs, num_items_in_batch, path=self.plan_loss,
                                        world_size=self.args.world_size, explicit_mask=self.explicit_mask,
                                        compute_loss_func=self.compute_loss_func)
        return (loss, outputs) if return_outputs else loss

    def _eval_loss_path(self) -> str:
        """How evaluation sums CE: as training does."""
        return self.plan_loss

    # ------------------------------------------------------------ checkpoints
    def plan_state(self, global_step: int) -> dict[str, Any]:
        """The sampler state right after optimizer step `global_step` (from the Trainer's own count)."""
        epoch, done, _ = self._epoch_at(global_step)
        position = self.plan_sampler.update_position(done, epoch)
        invalid = None
        own = self.plan_sampler
        if own.epoch == epoch and own._consumed is not None and own._consumed != position:
            invalid = (f"the Trainer is at step {global_step} (epoch {epoch}, position {position}) but the plan "
                       f"sampler consumed {own._consumed} microbatches")
        return own.state_at(epoch, position, invalid=invalid)

    def _save_checkpoint(self, model, trial) -> None:
        """The Trainer's save, then each rank's sampler state (atomic: the checkpoint's completion mark), then
        the rotation of old checkpoints (held back until now, so the previous one outlives an unfinished save)."""
        limit = self.args.save_total_limit
        self.args.save_total_limit = None
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.save_total_limit = limit
        run_dir, step, rank = Path(self._get_output_dir(trial=trial)), self.state.global_step, self.args.process_index
        ckpt = run_dir / f"{PREFIX_CHECKPOINT_DIR}-{step}"
        crash_point("tensors_written", step, rank)
        _barrier()  # every rank's Trainer files are written
        if self.args.should_save:  # durable before anything vouches for them
            for path in ckpt.rglob("*"):
                if path.is_file():
                    with open(path, "rb") as f:
                        os.fsync(f.fileno())
            fsync_dir(ckpt)
        _barrier()
        write_sealed_json(ckpt / state_file(rank), {**self.plan_state(step), "global_step": step})
        crash_point("rank_saved", step, rank)
        _barrier()  # the checkpoint is complete on every rank
        if self.args.should_save:
            rotate_checkpoints(output_dir=str(run_dir), save_total_limit=limit, use_mtime=True,
                               best_model_checkpoint=self.state.best_model_checkpoint)

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any):
        """`Trainer.train`, resuming from the newest checkpoint complete on every rank when asked."""
        if resume_from_checkpoint:
            resume_from_checkpoint = str(self.resume_checkpoint(resume_from_checkpoint))
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _read_state(self, ckpt: Path) -> dict[str, Any]:
        """This rank's sampler state in `ckpt`, checked against its checksum (CheckpointError when edited or
        damaged: an edited position would otherwise resume silently at another microbatch)."""
        state = read_sealed_json(ckpt / state_file(self.args.process_index))
        state.pop("checksum")
        return state

    def _state_step(self, ckpt: Path) -> int | None:
        """The step this rank's sampler state in `ckpt` was saved at; None when it is missing or unreadable."""
        try:
            step = self._read_state(ckpt).get("global_step")
        except CheckpointError:
            return None
        return step if isinstance(step, int) and (ckpt / "trainer_state.json").exists() else None

    def resume_checkpoint(self, ckpt: str | os.PathLike | bool) -> Path:
        """The checkpoint to resume from, checked on every rank (see `check_checkpoint`); for `True`, the newest
        checkpoint in `output_dir` whose sampler states every rank has complete."""
        if ckpt is not True:
            self.check_checkpoint(ckpt)
            return Path(ckpt)
        out = Path(self.args.output_dir)
        found = sorted(((s, p) for p in (out.iterdir() if out.is_dir() else ()) if p.is_dir()
                        and (s := _checkpoint_step(p)) is not None), reverse=True)
        mine = [s for s, p in found if self._state_step(p) == s][:32]
        rows = _all_gather_rows(mine + [-1] * (32 - len(mine)))
        step, why = agree_on_step([[s for s in r if s >= 0] for r in rows])
        if step is None:
            raise PlanMismatchError(f"no checkpoint in {out} to resume from that every rank saved completely"
                                    + (f": {why}" if why else ""))
        skipped = [p.name for s, p in found if s > step]
        if skipped:
            warnings.warn(f"resuming from {PREFIX_CHECKPOINT_DIR}-{step}: skipped {', '.join(skipped)} (not "
                          f"complete on every rank{f': {why}' if why else ''})", stacklevel=3)
        ckpt = out / f"{PREFIX_CHECKPOINT_DIR}-{step}"
        self.check_checkpoint(ckpt)
        return ckpt

    def check_checkpoint(self, ckpt: str | os.PathLike) -> None:
        """Refuse a checkpoint whose plan, validity, position, or step on some rank does not fit this run.

        Every rank must call it: the ranks compare their steps in one all_gather and all raise alike.
        """
        ckpt = Path(ckpt)
        path = ckpt / state_file(self.args.process_index)
        step = self._state_step(ckpt) if path.exists() else -1
        steps = [r[0] for r in _all_gather_rows([-2 if step is None else step])]
        names = ", ".join(f"rank {r}: " + {-1: "no state", -2: "unreadable, edited or damaged"}.get(s, f"step {s}")
                          for r, s in enumerate(steps))
        if -1 in steps:
            raise PlanMismatchError(f"{ckpt} lacks a plancc sampler state ({names}): it was not saved by "
                                    "PlanTrainer, or its save did not finish, so its data position is unknown and "
                                    "exact resume is impossible")
        if len(set(steps)) > 1 or -2 in steps:
            raise PlanMismatchError(f"{ckpt}: the ranks' sampler states disagree ({names}); resume from a "
                                    "checkpoint every rank saved completely (resume_from_checkpoint=True finds one)")
        together(lambda: self._check_state(ckpt, self._read_state(ckpt)), f"resume from {ckpt}")

    def _check_state(self, ckpt: Path, saved: dict[str, Any]) -> None:
        probe = self._make_sampler()
        probe.load_state_dict(saved, allow_dataset_change=self.allow_dataset_change)  # plan, validity, shape
        trainer_state = json.loads((ckpt / "trainer_state.json").read_text())
        expected = self.plan_state(int(trainer_state["global_step"]))
        if (expected["epoch"], expected["update"]) != (saved["epoch"], saved["update"]):
            raise PlanMismatchError(
                f"{ckpt}: the Trainer would resume at epoch {expected['epoch']} update {expected['update']} but the "
                f"plan sampler was saved at epoch {saved['epoch']} update {saved['update']}")


__all__ = ["STATE_FILE", "PlanTrainer", "state_file"]
