"""The reference sampler (Axolotl's `balance_labels`), run from a user's checkout on plancc's arrays.

Nothing of the reference is part of plancc: `load(PATH)` imports its sampler modules from the checkout at PATH
(`PATH/src/axolotl/utils/samplers/...`) without running the package `__init__`s, which import its whole trainer
stack. The reference's plan is returned as plancc `Batches`, so one set of metric functions measures both sides.

Packed microbatches (`microbatch_sampler`, `microbatches`): `MultipackBatchSampler`'s packing, then
`balance_labels` where the checkout has it. Fixed-count layouts (`fixed_count`): `LabelBalancedRandomSampler` (padded / flattened, its windows, accumulation
ordering and within-update refinement), then its rank ordering (`order_batches_by_rank` over the complete updates,
cost = the sampler's batch cost), as its trainer applies it when there is more than one rank.
"""

from __future__ import annotations

import importlib
import itertools
import sys
import time
import types
from pathlib import Path

import numpy as np

from plancc.config.settings import PlanSettings
from plancc.core.plan_arrays import Batches

PACKAGES = ("axolotl", "axolotl.utils", "axolotl.utils.samplers")


def import_sampler(path: str | Path, name: str) -> types.ModuleType:
    """The reference's module `axolotl.utils.samplers.<name>` from the checkout at `path` (its root or `src/`),
    imported without running the package `__init__`s above it."""
    root = Path(path).expanduser()
    src = root / "src" if (root / "src" / "axolotl").is_dir() else root
    if not (src / "axolotl" / "utils" / "samplers" / f"{name}.py").is_file():
        raise SystemExit(f"--reference {path}: no axolotl/utils/samplers/{name}.py in that checkout")
    for package in PACKAGES:  # bare packages: their __init__ would import the trainer stack
        if package not in sys.modules:
            module = types.ModuleType(package)
            module.__path__ = [str(src.joinpath(*package.split(".")))]
            sys.modules[package] = module
    if "axolotl.utils.logging" not in sys.modules:
        try:
            importlib.import_module("axolotl.utils.logging")
        except ImportError:  # it pulls in accelerate/transformers; a plain logger does the same job here
            import logging

            stub = types.ModuleType("axolotl.utils.logging")
            stub.get_logger = logging.getLogger
            sys.modules["axolotl.utils.logging"] = stub
    return importlib.import_module(f"axolotl.utils.samplers.{name}")


def load(path: str | Path) -> types.SimpleNamespace:
    """The reference's fixed-count sampler and rank ordering, imported from the checkout at `path`."""
    return types.SimpleNamespace(
        LabelBalancedRandomSampler=import_sampler(path, "label_balanced").LabelBalancedRandomSampler,
        order_batches_by_rank=import_sampler(path, "rank_balance").order_batches_by_rank)


def microbatch_sampler(path: str | Path):
    """The reference's `MultipackBatchSampler` class and its `balance_labels` function
    (`axolotl.utils.samplers.label_balance`, None where the checkout at `path` has none)."""
    sampler = import_sampler(path, "multipack").MultipackBatchSampler
    root = Path(path).expanduser()
    src = root / "src" if (root / "src" / "axolotl").is_dir() else root
    if not (src / "axolotl" / "utils" / "samplers" / "label_balance.py").is_file():
        return sampler, None
    return sampler, import_sampler(path, "label_balance").balance_labels


def microbatches(sampler_cls, balance_labels, s, settings: PlanSettings, seed: int):
    """The reference's microbatches for samples `s` (rows of 4096 * mbs tokens, one a microbatch, as the
    reference lays out packed microbatches by default): its packing, then its `balance_labels` where there is
    one, as plancc `Batches`, and the seconds both took."""
    order = np.random.default_rng(seed).permutation(len(s)).tolist()
    start = time.perf_counter()
    sampler = sampler_cls(order, batch_size=1, batch_max_len=settings.row_capacity, lengths=s.length,
                          bin_size=settings.row_capacity, drop_last=False, num_processes=1)
    batches = sampler.generate_batches()
    if balance_labels is not None:
        batches = balance_labels(batches, s.length, s.label_count, s.first_label_supervised.astype(np.int64),
                                 settings.row_capacity, settings.row_capacity, seed,
                                 window_size=settings.balance_window,
                                 batches_per_optimizer_step=settings.batches_per_update)
    seconds = time.perf_counter() - start
    rows = [row for batch in batches for row in batch]
    samples = np.fromiter((i for row in rows for i in row), dtype=np.int64)
    row_bounds = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(row) for row in rows], out=row_bounds[1:])
    batch_bounds = np.zeros(len(batches) + 1, dtype=np.int64)
    np.cumsum([len(batch) for batch in batches], out=batch_bounds[1:])
    return Batches(samples, row_bounds, batch_bounds), seconds


def fixed_count(ref: types.SimpleNamespace, length: np.ndarray, targets: np.ndarray, mode: str, mbs: int,
                world_size: int, grad_accum: int, seed: int = 0, pad_multiple: int = 1) -> Batches:
    """The reference's epoch-0 plan for `padded` or `flattened`, as Batches (padded: a row per sample)."""
    per_update = world_size * grad_accum
    sampler = ref.LabelBalancedRandomSampler(length, targets, mbs, seed=seed, batches_per_optimizer_step=per_update,
                                             length_mode=mode, padding_multiple=pad_multiple)
    order = np.fromiter(iter(sampler), dtype=np.int64, count=len(length))
    bounds = np.append(np.arange(0, len(order), mbs), len(order)).astype(np.int64)
    batches = [order[a:b] for a, b in itertools.pairwise(bounds)]
    limit = (len(order) // mbs) // per_update * per_update
    if world_size > 1 and limit:
        costs = [sampler._batch_cost(batch) for batch in batches[:limit]]
        perm = ref.order_batches_by_rank(costs, dp=world_size, gas=grad_accum)
        batches[:limit] = [batches[i] for i in perm]
    samples = np.concatenate(batches)
    sizes = np.array([len(x) for x in batches], dtype=np.int64)
    batch_bounds = np.zeros(len(batches) + 1, dtype=np.int64)
    np.cumsum(sizes if mode == "padded" else np.ones_like(sizes), out=batch_bounds[1:])
    if mode == "padded":
        row_bounds = np.arange(len(samples) + 1, dtype=np.int64)
    else:
        row_bounds = np.zeros(len(batches) + 1, dtype=np.int64)
        np.cumsum(sizes, out=row_bounds[1:])
    return Batches(samples, row_bounds, batch_bounds)
