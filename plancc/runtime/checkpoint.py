"""Checkpoints: the sampler state plus what makes it exact, written so that a kill never costs the last good one.

At an update boundary the sampler position alone resumes exactly (the optimizer has stepped; gradients are
zero). Mid-update, the gradients accumulated so far belong to the checkpoint too: `checkpoint_state(sampler,
model=model)` saves them (each rank its own, before DDP's all-reduce). Without a model, a mid-update state is
recorded as invalid, and `restore_checkpoint_state` refuses it with a message instead of silently restarting the
update.

`save_checkpoint` / `load_checkpoint` put that on disk for a training loop (every rank calls both)::

    save_checkpoint(ckpt_dir, step, {"model": model.state_dict(), "optim": opt.state_dict()},
                    sampler=sampler, model=model)                     # keeps the newest 2 steps
    ...
    resumed = load_checkpoint(ckpt_dir, sampler=sampler, model=model)  # restores sampler (+ mid-update grads)
    model.load_state_dict(resumed.state["model"]); opt.load_state_dict(resumed.state["optim"])

Layout, and why a kill at any instant leaves a usable checkpoint::

    ckpt_dir/step-00000004/rank0.pt     tensors only (torch.save; loaded with weights_only=True)
    ckpt_dir/step-00000004/rank0.json   step, rank, sampler state (JSON), size and sha256 of rank0.pt
    ckpt_dir/latest                     {"step": 4, ...}: written by rank 0 once every rank's files are complete

Each JSON file carries the sha256 of the rest of its content (`checksum`), so an edit (a sampler position moved
back) or damage is found like a damaged tensor file. Loading trusts nothing in the files: every field is checked
(a malformed one is a CheckpointError naming the file and the field), `tensors.file` must be the rank's own
`rank<r>.pt` beside it, a rank's file must be that rank's (rank 3's state copied over rank 0's is refused), and
the tensors are read with `weights_only=True`, so no pickled code runs.

Every file is written to a temporary sibling, fsynced, renamed over its name and the directory fsynced, so a
name never points at a partial file; a rank's `.json` is written after its `.pt` and vouches for its bytes.
`latest` moves only after a barrier, and old steps are pruned only after `latest` has moved past them. Loading
skips (with a warning) any step whose files are missing, truncated or corrupt, and the ranks then agree in one
all_gather on the newest step every rank has complete: a mix is resumed from that step with a warning naming
each rank's newest, or refused on every rank when they share none. A second one-number all_gather after
loading turns a failure on any rank (a damaged file, a sampler refusal) into an error on every rank: no rank can
take another branch, so none is left waiting in a collective.

Tests kill a save at a named point with `PLANCC_FAULT=POINT@step=S,rank=R` (`FAULT_POINTS`, `plancc.core.faults`).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch

from plancc.core import faults
from plancc.errors import CheckpointError, PlanMismatchError
from plancc.runtime.sampler import PlanSampler, state_problem
from plancc.runtime.sealed_files import (
    Sha256Writer,
    atomic_write,
    load_tensors,
    read_sealed_json,
    write_sealed_json,
)
from plancc.store.atomic import fsync_dir

FORMAT = "plancc.checkpoint/2"  # /1 had no checksum
LATEST = "latest"
FAULT_POINTS = (
    "tensors_temp",     # this rank's .pt is complete in its temporary file, not yet renamed
    "tensors_written",  # this rank's .pt is in place, its .json not yet written
    "rank_saved",       # this rank's files are complete; the other ranks may not be (before the barrier)
    "latest_temp",      # (rank 0) every rank is saved; the new `latest` is in its temporary file
    "saved",            # `latest` points at the new step; older steps not yet pruned
)
_STEP_DIR = re.compile(r"step-(\d+)$")
_AGREE_SLOTS = 32  # newest complete steps each rank reports when the ranks agree on one


# ---------------------------------------------------------------- data side (sampler + accumulated gradients)


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)


def checkpoint_state(sampler: PlanSampler, *, model: torch.nn.Module | None = None) -> dict[str, Any]:
    """The data side of a checkpoint: sampler state, and the accumulated gradients when taken mid-update."""
    state = sampler.state_dict()
    out: dict[str, Any] = {"sampler": state, "grads": None}
    if state["valid"] and not state["at_update_boundary"]:
        if model is None:
            state["valid"] = False
            state["invalid_reason"] = (f"saved mid-update (update {state['update']}, micro-step "
                                       f"{state['micro_step']}) without the gradients accumulated so far")
        else:
            out["grads"] = {name: (None if p.grad is None else p.grad.detach().clone())
                            for name, p in _unwrap(model).named_parameters()}
    return out


def restore_checkpoint_state(ckpt: dict[str, Any], sampler: PlanSampler, *, model: torch.nn.Module | None = None,
                             allow_dataset_change: bool = False) -> None:
    """Resume `sampler` (and a mid-update model's accumulated gradients) from `checkpoint_state`'s output."""
    sampler.load_state_dict(ckpt["sampler"], allow_dataset_change=allow_dataset_change)
    grads = ckpt.get("grads")
    if grads is None:
        return
    if model is None:
        raise PlanMismatchError("this checkpoint was taken mid-update: pass model= to restore its accumulated "
                                "gradients, or resume from a checkpoint taken at an optimizer step")
    for name, p in _unwrap(model).named_parameters():
        g = grads.get(name)
        p.grad = None if g is None else g.to(p.device).clone()


# ---------------------------------------------------------------- atomic files


def crash_point(point: str, step: int, rank: int) -> None:
    """The save's crash point `point` of step `step` on rank `rank` (`plancc.core.faults`: tests only)."""
    faults.fault(point, step=step, rank=rank)


# ---------------------------------------------------------------- collectives (no-ops without a process group)


def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1 else None


def _barrier() -> None:
    dist = _dist()
    if dist is not None:
        dist.barrier()


def _all_gather_rows(row: list[int]) -> list[list[int]]:
    """Every rank's `row` (same length on all), in rank order; just ours without a process group."""
    dist = _dist()
    if dist is None:
        return [row]
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    mine = torch.tensor(row, dtype=torch.int64, device=device)
    rows = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, mine)
    return [r.tolist() for r in rows]


def together(fn: Callable[[], Any], what: str) -> Any:
    """`fn()` on every rank; if it raises on any rank, every rank raises (its own error, or one naming the ranks
    that failed), so no rank goes on to wait in a collective for a rank that left. Any exception counts: one rank
    leaving on an unforeseen one would leave the others in their next collective until the connection drops."""
    failure: Exception | None = None
    try:
        result = fn()
    except Exception as e:  # re-raised below, after the ranks agree
        failure = e
    failed = [r for r, (flag,) in enumerate(_all_gather_rows([int(failure is not None)])) if flag]
    if failure is not None:
        raise failure
    if failed:
        raise CheckpointError(f"rank(s) {failed} could not {what} (see their errors); no rank goes on")
    return result


# ---------------------------------------------------------------- save


def step_dir(directory: str | Path, step: int) -> Path:
    """The folder of checkpoint `step` (`step-00000012`): zero-padded, so names sort by step."""
    return Path(directory) / f"step-{int(step):08d}"


def _steps(directory: Path) -> list[int]:
    """Step numbers of the step directories under `directory`, newest first."""
    if not directory.is_dir():
        return []
    found = (_STEP_DIR.match(p.name) for p in directory.iterdir() if p.is_dir())
    return sorted((int(m.group(1)) for m in found if m), reverse=True)


def save_checkpoint(directory: str | Path, step: int, state: dict[str, Any], *, sampler: PlanSampler,
                    model: torch.nn.Module | None = None, keep: int = 2,
                    fault: Callable[[str, int, int], None] = crash_point) -> Path:
    """Save this rank's `state` (tensors and containers of them, e.g. model and optimizer state dicts) and the
    sampler's data state as step `step`; every rank must call it. Returns the step directory.

    Once every rank's files are complete, rank 0 points `latest`
    at the step, then each rank removes its files of steps beyond the newest `keep` (and of any step after
    this one: an abandoned run's) and waits for the others to finish that too, since the next save's folder is such a
    step until it holds a file. `fault(point, step, rank)` is called at each of `FAULT_POINTS` (tests).
    """
    if keep < 1:
        raise ValueError(f"keep must be at least 1 (got {keep})")
    directory, rank, step = Path(directory), sampler.rank, int(step)
    out = step_dir(directory, step)
    out.mkdir(parents=True, exist_ok=True)
    fsync_dir(directory)
    data = checkpoint_state(sampler, model=model)
    digest: dict[str, Any] = {}

    def write_tensors(f: IO[bytes]) -> None:
        w = Sha256Writer(f)
        torch.save({"state": state, "grads": data["grads"]}, w)
        digest.update(bytes=w.size, sha256=w.sha.hexdigest())

    atomic_write(out / f"rank{rank}.pt", write_tensors, before_rename=lambda: fault("tensors_temp", step, rank))
    fault("tensors_written", step, rank)
    meta = {"format": FORMAT, "step": step, "rank": rank, "world_size": sampler.world_size,
            "tensors": {"file": f"rank{rank}.pt", **digest}, "sampler": data["sampler"]}
    write_sealed_json(out / f"rank{rank}.json", meta)
    fault("rank_saved", step, rank)
    _barrier()  # every rank's files are complete
    if rank == 0:
        write_sealed_json(directory / LATEST, {"step": step, "dir": out.name, "world_size": sampler.world_size},
                          before_rename=lambda: fault("latest_temp", step, rank))
    fault("saved", step, rank)
    _barrier()  # `latest` has moved: older steps may go
    _prune(directory, rank, step, keep)
    _barrier()  # pruning removes steps after this one: no rank may start the next save's folder before all are done
    return out


def _prune(directory: Path, rank: int, step: int, keep: int) -> None:
    if rank == 0:
        for p in directory.glob(f".{LATEST}.tmp-*"):  # left by a killed save
            p.unlink(missing_ok=True)
    kept = [s for s in _steps(directory) if s <= step][:keep]
    for s in _steps(directory):
        d = step_dir(directory, s)
        for p in d.glob(f".rank{rank}.*.tmp-*"):  # left by a killed save
            p.unlink(missing_ok=True)
        if s in kept:
            continue
        for name in (f"rank{rank}.json", f"rank{rank}.pt"):  # the .json first: it vouches for the .pt
            (d / name).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            d.rmdir()  # the last rank to leave removes it


# ---------------------------------------------------------------- load


@dataclass
class Resumed:
    """What `load_checkpoint` found: the step, this rank's saved `state` (tensors), the step directory."""

    step: int
    state: dict[str, Any]
    path: Path


def _field(obj: dict[str, Any], path: Path, name: str, kind: type, check: Callable[[Any], bool] = lambda v: True,
           what: str = "") -> Any:
    """`obj[key]` (`name` is `key` or `parent.key`) when it is a `kind` passing `check`; else CheckpointError naming
    the file and the field."""
    key = name.rpartition(".")[2]
    if key not in obj:
        raise CheckpointError(f"{path}: {name}: missing")
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)) or not check(value):
        raise CheckpointError(f"{path}: {name}: {value!r} is not {what or kind.__name__}")
    return value


def _checked_meta(path: Path, rank: int, step: int, sampler: PlanSampler) -> dict[str, Any]:
    """The metadata of `rank{rank}.json` (`path`) of step `step`, every field checked (see module docstring), the
    sampler position against its update and micro-step on `sampler`'s plan too."""
    meta = read_sealed_json(path)
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: format: {meta.get('format')!r}, expected {FORMAT!r} (not a checkpoint of "
                              "this plancc version)")
    _field(meta, path, "step", int, lambda v: v == step, f"step {step} (its directory's)")
    _field(meta, path, "rank", int, lambda v: v == rank, f"rank {rank}: another rank's file")
    world = _field(meta, path, "world_size", int, lambda v: v > rank, f"a world size above rank {rank}")
    tensors = _field(meta, path, "tensors", dict)
    _field(tensors, path, "tensors.file", str, lambda v: v == f"rank{rank}.pt",
           f"rank{rank}.pt (the rank's own tensor file beside it)")
    _field(tensors, path, "tensors.bytes", int, lambda v: v >= 0, "a size")
    _field(tensors, path, "tensors.sha256", str, lambda v: re.fullmatch(r"[0-9a-f]{64}", v) is not None, "a sha256")
    state = _field(meta, path, "sampler", dict)
    problem = state_problem(state) or sampler.position_problem(state)
    if problem is not None:
        raise CheckpointError(f"{path}: sampler.{problem}")
    if (state["rank"], state["world_size"]) != (rank, world):
        raise CheckpointError(f"{path}: sampler.rank: rank {state['rank']} of {state['world_size']}, expected "
                              f"rank {rank} of {world} (another rank's state)")
    return meta


def _read_meta(d: Path, sampler: PlanSampler, step: int) -> dict[str, Any]:
    """This rank's metadata of step dir `d` (rank 0's when this rank has none: a run of another world size),
    after checking every field and that the tensor file it vouches for has its size. Raises CheckpointError saying
    what is wrong: the file and the field."""
    rank = sampler.rank
    own = d / f"rank{rank}.json"
    meta_path = own if own.exists() or rank == 0 else d / "rank0.json"
    if not meta_path.exists():
        raise CheckpointError(f"{own} is missing (the save of step {step} did not finish)")
    meta = _checked_meta(meta_path, 0 if meta_path != own else rank, step, sampler)
    if meta_path != own and meta["world_size"] > rank:  # that run had a rank `rank`: its files are unfinished
        raise CheckpointError(f"{own} is missing (the save of step {step} did not finish)")
    tensors = d / meta["tensors"]["file"]
    if not tensors.is_file():
        raise CheckpointError(f"{tensors} is missing")
    size = tensors.stat().st_size
    if size != meta["tensors"]["bytes"]:
        raise CheckpointError(f"{tensors} is truncated or damaged ({size} bytes, {meta['tensors']['bytes']} saved)")
    meta["_tensors_path"], meta["_meta_name"] = str(tensors), meta_path.name
    return meta


def _verify(meta: dict[str, Any]) -> None:
    """Check the tensor file's sha256 against its metadata (once)."""
    if meta.get("_verified"):
        return
    sha = hashlib.sha256()
    try:
        with open(meta["_tensors_path"], "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                sha.update(block)
    except OSError as e:
        raise CheckpointError(f"{meta['_tensors_path']}: unreadable ({e})") from None
    if sha.hexdigest() != meta["tensors"]["sha256"]:
        raise CheckpointError(f"{meta['_tensors_path']} is damaged (its sha256 differs from the one saved in "
                              f"{meta['_meta_name']})")
    meta["_verified"] = True


def _latest(directory: Path) -> int | None:
    path = directory / LATEST
    if not path.exists():
        return None
    try:
        return _field(read_sealed_json(path), path, "step", int, lambda v: v >= 0, "a step")
    except CheckpointError as e:
        warnings.warn(f"{e}; looking for the newest complete step instead", stacklevel=3)
        return None


def complete_steps(directory: str | Path, sampler: PlanSampler) -> tuple[list[tuple[int, dict]],
                                                                         list[tuple[int, str]]]:
    """Newest first: (step, metadata) of the steps `sampler`'s rank can resume from, (step, why not) of the others.

    Only steps up to `latest` count when it is readable: a newer step directory is a save that did not finish.
    Every step's files are checked for presence and size; the sha256 only of the newest good step (one file
    read in the usual case; `load_checkpoint` verifies an older one it falls back to before loading it).
    """
    directory = Path(directory)
    latest = _latest(directory)
    good, bad = [], []
    for s in _steps(directory):
        if latest is not None and s > latest:
            continue
        try:
            meta = _read_meta(step_dir(directory, s), sampler, s)
            if not good:
                _verify(meta)
            good.append((s, meta))
        except CheckpointError as e:
            bad.append((s, str(e)))
    return good, bad


def agree_on_step(newest_first: list[list[int]]) -> tuple[int | None, str | None]:
    """The step every rank resumes from, given each rank's complete steps (newest first), and why it is not
    simply everyone's newest (None when it is). The step is None when the ranks share none."""
    newest = [r[0] if r else None for r in newest_first]
    if len(newest) == 1:
        return newest[0], None
    common = set(newest_first[0]).intersection(*newest_first[1:])
    names = ", ".join(f"rank {r}: {'none' if s is None else f'step {s}'}" for r, s in enumerate(newest))
    if len(set(newest)) == 1 and newest[0] is not None:
        return newest[0], None
    if not common:
        return None, f"the ranks' newest complete checkpoints differ ({names}) and no step is complete on every rank"
    step = max(common)
    return step, f"the ranks' newest complete checkpoints differ ({names}); step {step} is the newest every rank has"


def _checked_tensors(path: str, map_location: Any) -> dict[str, Any]:
    """The saved `{"state": ..., "grads": None or {name: tensor or None}}` of a rank's tensor file."""
    saved = load_tensors(path, map_location)
    if not isinstance(saved, dict) or "state" not in saved or "grads" not in saved:
        raise CheckpointError(f"{path}: not a plancc checkpoint's tensors (no 'state' and 'grads' entries)")
    grads = saved["grads"]
    if grads is not None and not (isinstance(grads, dict) and all(
            isinstance(k, str) and (v is None or torch.is_tensor(v)) for k, v in grads.items())):
        raise CheckpointError(f"{path}: grads: not a mapping of parameter names to tensors")
    return saved


def load_checkpoint(directory: str | Path, *, sampler: PlanSampler, model: torch.nn.Module | None = None,
                    map_location: Any = "cpu", allow_dataset_change: bool = False) -> Resumed:
    """Resume from the newest step that is complete on every rank; every rank must call it.

    Restores `sampler` (and the accumulated gradients of a mid-update checkpoint into `model`) and returns the
    saved tensors for the caller to load into the model and optimizer. Damaged or unfinished steps are skipped
    with a warning; ranks whose newest steps differ resume from the newest step all of them have (a warning
    names each rank's), or all raise CheckpointError when they share none. A rank of a run with more ranks
    than the checkpoint's reads rank 0's files (exact at update boundaries; the sampler refuses otherwise).
    """
    directory, rank = Path(directory), sampler.rank
    good, bad = together(lambda: complete_steps(directory, sampler), f"read {directory}")
    row = [s for s, _ in good[:_AGREE_SLOTS]]
    rows = _all_gather_rows(row + [-1] * (_AGREE_SLOTS - len(row)))
    step, why = agree_on_step([[s for s in r if s >= 0] for r in rows])
    if step is None:
        detail = f"{why}; " if why else ""
        raise CheckpointError(f"no checkpoint in {directory} to resume from: {detail}{_found(rank, good, bad)}")
    skipped = [msg for s, msg in bad if s > step]
    if skipped:
        warnings.warn(f"skipped damaged or unfinished checkpoints: {'; '.join(skipped)}", stacklevel=2)
    if why is not None:
        warnings.warn(f"{why}: every rank resumes from step {step}", stacklevel=2)
    meta, what = dict(good)[step], f"resume from step {step} of {directory}"

    def check() -> tuple[dict[str, Any], tuple[int, int]]:
        _verify(meta)
        saved = _checked_tensors(meta["_tensors_path"], map_location)
        return saved, sampler.resume_point(meta["sampler"], allow_dataset_change=allow_dataset_change)

    saved, point = together(check, what)
    _check_in_step(sampler, point, f"step {step} of {directory}")
    together(lambda: restore_checkpoint_state({"sampler": meta["sampler"], "grads": saved["grads"]}, sampler,
                                              model=model, allow_dataset_change=allow_dataset_change), what)
    return Resumed(step=step, state=saved["state"], path=step_dir(directory, step))


def _found(rank: int, good: list[tuple[int, dict]], bad: list[tuple[int, str]]) -> str:
    """What this rank found, for a refusal every rank raises: its complete steps, and what is wrong with the rest."""
    parts = ([f"complete here: {', '.join(f'step {s}' for s, _ in good)}"] if good else []) + [m for _, m in bad]
    return f"rank {rank}: {'; '.join(parts) or 'no complete step directory'}"


def _check_in_step(sampler: PlanSampler, point: tuple[int, int], what: str) -> None:
    """Refuse, on every rank, resume points that differ between the ranks: ranks walk the same positions in
    lockstep, so states out of step were edited or come from different runs, and would train out of step."""
    points = [tuple(p) for p in _all_gather_rows(list(point))]
    if len(set(points)) == 1:
        return
    names = "; ".join(f"rank {r}: epoch {e}, position {p}, update {u}, micro-step {m}"
                      for r, (e, p) in enumerate(points) for u, m in [sampler.locate(p, e)])
    raise CheckpointError(f"{what}: the ranks' sampler states are out of step ({names}); every rank resumes at "
                          "the same position, so these files were edited or mix runs: resume from another step")
