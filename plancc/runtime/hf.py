"""Hugging Face `Trainer` integration: the plan's sampler and batches, the plan's `num_items_in_batch`, exact resume.

    from plancc.runtime.hf import PlanTrainer
    trainer = PlanTrainer(model=model, args=TrainingArguments(..., gradient_accumulation_steps=G), plan=plan_dir)
    trainer.train()                                   # or train(resume_from_checkpoint=True)

What it changes in `Trainer` (transformers is imported only here, and only when this module is):
- the train dataloader is a `PlanDataLoader` over the plan for this process's rank (`args.process_index`,
  `args.world_size`); `args.world_size * gradient_accumulation_steps` must equal the plan's microbatches per
  update (elastic replay allowed); `per_device_train_batch_size` is ignored: the plan decides the batches;
- each accumulation window is checked to be exactly one plan update, and `num_items_in_batch` is the plan's
  global count for it (no gather, no recount);
- the loss is `plancc.runtime.token_loss` (fp32 CE, sum, / num_items, x world size), whatever the model's own
  loss function does with `num_items_in_batch`, so a model that ignores the kwarg cannot reintroduce the bug;
- every checkpoint gets each rank's sampler state at that optimizer step (`plancc_sampler.json` for rank 0,
  `plancc_sampler.rank<r>.json` for the others), written atomically once the Trainer's own files are saved and
  fsynced; it is the checkpoint's completion mark, and `save_total_limit` rotation waits for it, so a kill
  mid-save never leaves the run without a complete checkpoint. Resuming checks the states against the plan
  (fingerprints, validity, world size) and that every rank's names the same step (one all_gather: a mix is
  refused, naming each rank's step) before the Trainer skips the consumed batches; a checkpoint without them is
  refused. `resume_from_checkpoint=True` takes the newest checkpoint complete on every rank (a warning says
  which newer ones it skipped). The skip itself goes through the sampler only (no batch is collated).
Label smoothing and `compute_loss_func` are not supported (they would change the objective the plan counts for).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

from plancc.runtime.checkpoint import (
    _all_gather_rows,
    _barrier,
    _fault_from_env,
    agree_on_step,
    fsync_dir,
    together,
    write_json_atomic,
)
from plancc.runtime.collator import MODEL_KEYS, PlanCollator
from plancc.runtime.data import TokenStore, load_tokens
from plancc.runtime.loader import PlanDataLoader, PlanDataset
from plancc.runtime.loss import token_loss
from plancc.runtime.plan import PlanMismatchError, RuntimePlan, open_plan
from plancc.runtime.sampler import PlanSampler

STATE_FILE = "plancc_sampler.json"
CONTROL_KEYS = ("plan", "num_items_in_batch", "label_count", "cu_seqlens", "max_seqlen")


def state_file(rank: int) -> str:
    """The name of rank `rank`'s sampler state in a checkpoint directory (rank 0's is `STATE_FILE`)."""
    return STATE_FILE if rank == 0 else f"plancc_sampler.rank{rank}.json"


def _checkpoint_step(ckpt: Path) -> int | None:
    name = ckpt.name
    prefix = f"{PREFIX_CHECKPOINT_DIR}-"
    return int(name[len(prefix):]) if name.startswith(prefix) and name[len(prefix):].isdigit() else None


class PlanTrainer(Trainer):
    """A `Trainer` that replays a plancc plan (see module docstring). Extra keyword arguments: `plan` (a plan
    directory or `RuntimePlan`), `tokens` (a `TokenStore`; default: the plan's data, verified), `verify`,
    `allow_dataset_change`, `pad_token_id`."""

    def __init__(self, *args: Any, plan: str | Path | RuntimePlan, tokens: TokenStore | None = None,
                 verify: str = "chunks", allow_dataset_change: bool = False, pad_token_id: int = 0, **kwargs: Any):
        self.plan = open_plan(plan)
        self.allow_dataset_change = allow_dataset_change
        self.plan_tokens = tokens if tokens is not None else load_tokens(
            self.plan, verify=verify, allow_dataset_change=allow_dataset_change)
        self.plan_collator = PlanCollator.from_plan(self.plan, pad_token_id=pad_token_id)
        kwargs.setdefault("train_dataset", PlanDataset(self.plan_tokens, self.plan_collator))
        super().__init__(*args, **kwargs)
        if self.compute_loss_func is not None or self.args.label_smoothing_factor:
            raise PlanMismatchError("PlanTrainer computes the plan's token-mean loss itself: compute_loss_func and "
                                    "label_smoothing_factor are not supported")
        gas, world = self.args.gradient_accumulation_steps, self.args.world_size
        per_update = self.plan.batches_per_update
        if gas * world != per_update:
            hint = (f"set gradient_accumulation_steps={per_update // world}" if per_update % world == 0
                    else f"run on a number of processes that divides {per_update}, or recompile the plan")
            raise PlanMismatchError(
                f"the plan was compiled for world_size {self.plan.world_size} x grad_accum {self.plan.grad_accum} "
                f"({per_update} microbatches per update) but this run has {world} process(es) x "
                f"gradient_accumulation_steps {gas}; {hint}")
        self.plan_grad_accum = self.plan.replay_grad_accum(world, gas)
        # Our loss is already normalized by the update's global count: the Trainer must not rescale it.
        self.model_accepts_loss_kwargs = True
        if hasattr(self, "loss_is_scaled_for_ga"):
            self.loss_is_scaled_for_ga = True
        self.plan_sampler = self._make_sampler()

    # ------------------------------------------------------------ data
    def _make_sampler(self) -> PlanSampler:
        return PlanSampler(self.plan, rank=self.args.process_index, world_size=self.args.world_size,
                           grad_accum=self.plan_grad_accum)

    def get_train_dataloader(self) -> PlanDataLoader:
        self.plan_sampler = self._make_sampler()
        return PlanDataLoader(self.train_dataset, self.plan_sampler,
                              num_workers=self.args.dataloader_num_workers,
                              pin_memory=self.args.dataloader_pin_memory)

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

    # ------------------------------------------------------------ loss
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if num_items_in_batch is None:
            num_items_in_batch = inputs["num_items_in_batch"]
        kwargs = {k: inputs[k] for k in MODEL_KEYS if k in inputs}
        outputs = model(**kwargs, use_cache=False)
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
        loss = token_loss(logits, inputs["shift_labels"], num_items_in_batch, world_size=self.args.world_size)
        return (loss, outputs) if return_outputs else loss

    # ------------------------------------------------------------ checkpoints
    def _epoch_lengths_check(self) -> None:
        lengths = self.plan_sampler.epoch_lengths()
        epochs = self.args.num_train_epochs if self.args.max_steps <= 0 else None
        if epochs is not None and int(-(-epochs // 1)) > self.plan.epochs:
            raise PlanMismatchError(f"num_train_epochs {epochs} exceeds the plan's {self.plan.epochs} epochs; "
                                    "compile the plan with more --epochs")
        if len(set(lengths)) > 1:
            raise PlanMismatchError(
                f"the plan's epochs have different numbers of microbatches per rank ({lengths}); the Trainer assumes "
                "equal epochs. Train one epoch per train() call, or use --mode padded/flattened")

    def plan_state(self, global_step: int) -> dict[str, Any]:
        """The sampler state right after optimizer step `global_step` (from the Trainer's own count)."""
        per_epoch = self.plan_sampler.updates_per_epoch(0)
        epoch, update = divmod(global_step, per_epoch)
        length = self.plan_sampler.epoch_lengths()[min(epoch, self.plan.epochs - 1)]
        if epoch >= self.plan.epochs:
            epoch, position = self.plan.epochs - 1, length
        else:
            position = min(update * self.plan_grad_accum, length)
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
        _fault_from_env("tensors_written", step, rank)
        _barrier()  # every rank's Trainer files are written
        if self.args.should_save:  # durable before anything vouches for them
            for path in ckpt.rglob("*"):
                if path.is_file():
                    with open(path, "rb") as f:
                        os.fsync(f.fileno())
            fsync_dir(ckpt)
        _barrier()
        write_json_atomic(ckpt / state_file(rank), {**self.plan_state(step), "global_step": step})
        _fault_from_env("rank_saved", step, rank)
        _barrier()  # the checkpoint is complete on every rank
        if self.args.should_save:
            rotate_checkpoints(output_dir=str(run_dir), save_total_limit=limit, use_mtime=True,
                               best_model_checkpoint=self.state.best_model_checkpoint)

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any):
        self._epoch_lengths_check()
        if resume_from_checkpoint:
            resume_from_checkpoint = str(self.resume_checkpoint(resume_from_checkpoint))
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _state_step(self, ckpt: Path) -> int | None:
        """The step this rank's sampler state in `ckpt` was saved at; None when it is missing or unreadable."""
        try:
            step = json.loads((ckpt / state_file(self.args.process_index)).read_bytes()).get("global_step")
            return step if isinstance(step, int) and (ckpt / "trainer_state.json").exists() else None
        except (OSError, ValueError, AttributeError):
            return None

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
        names = ", ".join(f"rank {r}: " + {-1: "no state", -2: "unreadable"}.get(s, f"step {s}")
                          for r, s in enumerate(steps))
        if -1 in steps:
            raise PlanMismatchError(f"{ckpt} lacks a plancc sampler state ({names}): it was not saved by "
                                    "PlanTrainer, or its save did not finish, so its data position is unknown and "
                                    "exact resume is impossible")
        if len(set(steps)) > 1 or -2 in steps:
            raise PlanMismatchError(f"{ckpt}: the ranks' sampler states disagree ({names}); resume from a "
                                    "checkpoint every rank saved completely (resume_from_checkpoint=True finds one)")
        together(lambda: self._check_state(ckpt, json.loads(path.read_text())), f"resume from {ckpt}")

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
