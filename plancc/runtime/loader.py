"""DataLoader glue: a map-style dataset that collates plan microbatches, and a loader that tracks consumption.

    sampler = PlanSampler(plan_dir, rank=rank, world_size=world)
    loader = PlanDataLoader(PlanDataset(load_tokens(plan_dir), PlanCollator.from_plan(plan_dir)), sampler)
    for batch in loader: ...              # batch dicts (see collator); loader.state_dict() is exact

`PlanSampler` is the DataLoader's `batch_sampler`; the dataset's `__getitems__` receives the whole `Microbatch`
(with its row structure) and returns the collated batch, so collation runs in the workers when `num_workers > 0`.
The loader reports each batch it hands to the training loop back to the sampler (`mark_consumed`), so
`state_dict()` is the training loop's position, not the prefetching workers'.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, Dataset

from plancc.runtime.collator import PlanCollator
from plancc.runtime.data import TokenStore
from plancc.runtime.sampler import Microbatch, PlanEvalSampler, PlanSampler


class PlanDataset(Dataset):
    """Map-style dataset keyed by `Microbatch`: `dataset[mb]` is the collated batch dict."""

    def __init__(self, tokens: TokenStore, collator: PlanCollator):
        self.tokens, self.collator = tokens, collator

    def __getitem__(self, mb: Microbatch) -> dict[str, Any]:
        return self.collator(mb, self.tokens)

    def __getitems__(self, mb: Microbatch) -> dict[str, Any]:
        return self.collator(mb, self.tokens)

    def __len__(self) -> int:
        return len(self.tokens)


def _identity(batch: Any) -> Any:
    return batch


class PlanDataLoader(DataLoader):
    """A DataLoader over a plan: `batch_sampler` is the `PlanSampler`; exact `state_dict()` and `set_epoch()`."""

    def __init__(self, dataset: PlanDataset, sampler: PlanSampler, **kwargs: Any):
        kwargs.setdefault("collate_fn", _identity)
        super().__init__(dataset, batch_sampler=sampler, **kwargs)
        self.plan_sampler = sampler

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in super().__iter__():
            self.plan_sampler.mark_consumed(batch)
            yield batch

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` (the sampler's `set_epoch`)."""
        self.plan_sampler.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The sampler's state at the last batch the training loop consumed."""
        return self.plan_sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any], **kwargs: Any) -> None:
        """Resume the sampler from `state` (see `PlanSampler.load_state_dict`)."""
        self.plan_sampler.load_state_dict(state, **kwargs)


def eval_loader(dataset: PlanDataset, sampler: PlanEvalSampler, **kwargs: Any) -> DataLoader:
    """A DataLoader over this rank's eval microbatches (`PlanEvalSampler`), collated like training's."""
    kwargs.setdefault("collate_fn", _identity)
    return DataLoader(dataset, batch_sampler=sampler, **kwargs)
