"""Turn a plan microbatch into tensors, with labels exactly as the plan counted them (docs/spec.md §3).

Layout of one packed row holding samples A (3 tokens) and B (2 tokens), capacity rounded to 8, shift "sample"::

    input_ids     a0  a1  a2  b0  b1  pad pad pad
    position_ids   0   1   2   0   1   0   1   2     restart per sample (pad is its own segment)
    shift_labels  A1  A2   x  B1   x   x   x   x     target of each position; x = -100
    labels         x  A1  A2   x  B1   x   x   x     HF convention: the model shifts labels[1:] itself
    cu_seqlens    [0, 3, 5, 8]                       segment bounds over the flattened (rows x T) tokens

Shift "row" differs only at sample boundaries: a2's target is b0's label (`shift_labels[2] = B0`). Shift "none"
copies each sample's stored `shift_labels`. `shift_labels` is the tensor the loss reads; `labels` is
`shift_labels` moved right by one so that a Hugging Face model that shifts internally sees the same targets
(it is exact for shifts sample/row; with shift "none" pass `shift_labels` to the model's loss as well).

One rule for padding in every layout: a row's pad tail is a segment of its own whose position ids restart at 0,
so `position_ids` restart exactly at the bounds of `cu_seqlens`. Padded mode (one sample per row) also has an
`attention_mask`; packed and flattened rows have none, so that Hugging Face models detect the packed samples from
`position_ids` and keep them from attending to each other. `model_inputs` turns a batch into the forward's
keyword arguments for the model's attention implementation (see there).
Every row is right-padded to the batch's longest row rounded up to `pad_multiple` (pad id `pad_token_id`, label
-100). The collated target count is checked against the plan's `label_count`: a mismatch means the data changed.
A placeholder microbatch (see `sampler`) becomes one pad token with no target.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from plancc.core.choices import Mode, Shift
from plancc.core.plan_arrays import IGNORE_INDEX
from plancc.errors import PlanMismatchError
from plancc.runtime.data import TokenStore
from plancc.runtime.sampler import Microbatch
from plancc.store.plan import Plan, verified_plan


class PlanCollator:
    """`collator(microbatch, tokens) -> batch dict` for one plan's layout and shift semantics."""

    def __init__(self, *, mode: str, shift: str, pad_multiple: int = 1, pad_token_id: int = 0,
                 check_counts: bool = True, loop_threshold: int = 48, fields: Any = None):
        if mode not in tuple(Mode):
            raise ValueError(f"unknown mode {mode!r}")
        if shift not in tuple(Shift):
            raise ValueError(f"unknown shift {shift!r}")
        self.mode, self.shift, self.pad_multiple = Mode(mode), Shift(shift), int(pad_multiple)
        self.pad_token_id, self.check_counts = int(pad_token_id), check_counts
        self.loop_threshold = int(loop_threshold)  # up to this many samples: per-sample slice copies
        self.fields = fields  # `fields(collator, mb, tokens, batch)`: more of a batch (a preference plan's pairs)
        self._ar = np.arange(4096, dtype=np.int64)

    @classmethod
    def from_plan(cls, plan: str | Plan, **kwargs: Any) -> PlanCollator:
        """A collator for the plan's layout, shift and padding multiple (`kwargs`: pad token, ...); a preference
        plan's batches also say which sequence is whose (`fields`: `plancc.runtime.pairs.PreferenceFields`)."""
        plan = verified_plan(plan)
        if plan.manifest.data_kind != "sft" and "fields" not in kwargs:
            from plancc.runtime.pairs import PreferenceFields

            kwargs["fields"] = PreferenceFields.of_plan(plan)
        return cls(mode=plan.settings.mode, shift=plan.settings.shift, pad_multiple=plan.settings.pad_multiple, **kwargs)

    def arrays(self, mb: Microbatch, tokens: TokenStore) -> dict[str, Any]:
        """The batch as numpy arrays (the work without the tensor wrapping)."""
        if len(mb) == 0:  # placeholder: one pad token, no target
            ids = np.zeros(0, dtype=np.int64)
            rows, row_len, ids_len = np.array([0, 0], dtype=np.int64), np.array([0], dtype=np.int64), ids
        else:
            ids = np.asarray(mb, dtype=np.int64)
            tokens.check(ids)  # a mapped store verifies the chunks holding them before any token is read
            rows = np.asarray(mb.rows, dtype=np.int64)
            starts = tokens.offsets[ids]
            ids_len = tokens.offsets[ids + 1] - starts
            csum = np.zeros(ids.size + 1, dtype=np.int64)
            np.cumsum(ids_len, out=csum[1:])
            row_len = csum[rows[1:]] - csum[rows[:-1]]
        n_rows = rows.shape[0] - 1
        width = max(int(row_len.max()), 1)
        width = -(-width // self.pad_multiple) * self.pad_multiple

        input_ids = np.full((n_rows, width), self.pad_token_id, dtype=np.int64)
        shift_labels = np.full((n_rows, width), IGNORE_INDEX, dtype=np.int64)
        position_ids = np.empty((n_rows, width), dtype=np.int64)
        segments = None
        if ids.size and ids.size <= self.loop_threshold:
            segments = self._fill_by_sample(rows, starts.tolist(), ids_len.tolist(), tokens, input_ids,
                                            shift_labels, position_ids)
        else:
            self._fill_vectorized(ids, rows, starts if ids.size else ids, ids_len, row_len, csum if ids.size else
                                  None, tokens, input_ids, shift_labels, position_ids)
        count = int(np.count_nonzero(shift_labels != IGNORE_INDEX))
        if self.check_counts and count != mb.label_count:
            raise PlanMismatchError(
                f"microbatch {mb.index} (epoch {mb.epoch}, update {mb.update}) collates to {count} supervised "
                f"targets but the plan counted {mb.label_count}: the tokenized data or the shift semantics differ "
                f"from the ones the plan was compiled with (shift {self.shift!r}); recompile the plan"
            )
        labels = np.empty_like(shift_labels)
        labels[:, 0] = IGNORE_INDEX
        labels[:, 1:] = shift_labels[:, :-1]
        out: dict[str, Any] = {"input_ids": input_ids, "position_ids": position_ids, "labels": labels,
                               "shift_labels": shift_labels, "label_count": count}
        if self.mode == Mode.PADDED:
            col = self._arange(width)
            out["attention_mask"] = (col[None, :] < np.maximum(row_len, 1)[:, None]).astype(np.int64)
        if segments is not None:
            seg = np.array(segments, dtype=np.int64)
        elif n_rows == 1:
            seg = np.append(ids_len, width - row_len[0])
        else:
            row_of_sample = np.repeat(np.arange(n_rows, dtype=np.int64), np.diff(rows))
            key = np.concatenate([row_of_sample * 2, np.arange(n_rows, dtype=np.int64) * 2 + 1])
            seg = np.concatenate([ids_len, width - row_len])[np.argsort(key, kind="stable")]
        seg = seg[seg > 0]
        cu = np.zeros(seg.shape[0] + 1, dtype=np.int32)
        np.cumsum(seg, out=cu[1:])
        out["cu_seqlens"] = cu
        out["max_seqlen"] = int(seg.max())
        return out

    def _arange(self, n: int) -> np.ndarray:
        if self._ar.shape[0] < n:
            self._ar = np.arange(max(n, 2 * self._ar.shape[0]), dtype=np.int64)
        return self._ar[:n]

    def _fill_by_sample(self, rows, starts, lens, tokens, input_ids, shift_labels, position_ids) -> list[int]:
        """Slice copies, one sample at a time: fastest when a microbatch holds few samples. Returns the
        segment lengths (samples, then each row's pad tail) for `cu_seqlens`."""
        x, y = tokens.input_ids, tokens.targets
        ar = self._arange(input_ids.shape[1])
        shift = self.shift
        bounds = rows.tolist()
        width = position_ids.shape[1]
        segments: list[int] = []
        for r in range(len(bounds) - 1):
            w = 0
            last = bounds[r + 1] - 1
            for k in range(bounds[r], bounds[r + 1]):
                a, n = starts[k], lens[k]
                input_ids[r, w:w + n] = x[a:a + n]
                position_ids[r, w:w + n] = ar[:n]
                if shift == Shift.NONE:
                    shift_labels[r, w:w + n] = y[a:a + n]
                else:
                    shift_labels[r, w:w + n - 1] = y[a + 1:a + n]
                    if shift == Shift.ROW and k < last:
                        shift_labels[r, w + n - 1] = y[starts[k + 1]]
                w += n
            segments += lens[bounds[r]:bounds[r + 1]]
            segments.append(width - w)
            position_ids[r, w:] = ar[:width - w]  # the pad tail is its own segment
        return segments

    def _fill_vectorized(self, ids, rows, starts, ids_len, row_len, csum, tokens, input_ids, shift_labels,
                         position_ids):
        """One gather for all samples: fastest when a microbatch holds many (short) samples."""
        n_rows, width = input_ids.shape
        col = self._arange(width)
        position_ids[:] = np.where(col[None, :] >= row_len[:, None], col[None, :] - row_len[:, None], col[None, :])
        if csum is None:
            return
        total = int(csum[-1])
        excl = csum[:-1]
        row_of = np.repeat(np.arange(n_rows, dtype=np.int64), np.diff(rows))
        within = excl - csum[rows[:-1]][row_of]  # start of each sample inside its row
        rel = self._arange(total) - np.repeat(excl, ids_len)  # position inside its sample
        src = np.repeat(starts, ids_len) + rel
        dst = np.repeat(row_of * width + within, ids_len) + rel
        targets = tokens.targets[src]
        if self.shift == Shift.NONE:
            st = targets
        else:
            st = np.empty(total, dtype=np.int64)
            st[:-1] = targets[1:]
            ends = csum[1:] - 1 if self.shift == Shift.SAMPLE else csum[rows[1:]] - 1
            st[ends] = IGNORE_INDEX
        input_ids.reshape(-1)[dst] = tokens.input_ids[src]
        shift_labels.reshape(-1)[dst] = st
        position_ids.reshape(-1)[dst] = rel

    def __call__(self, mb: Microbatch, tokens: TokenStore) -> dict[str, Any]:
        a = self.arrays(mb, tokens)
        batch: dict[str, Any] = {k: torch.from_numpy(v) if type(v) is np.ndarray else v for k, v in a.items()}
        batch["num_items_in_batch"] = torch.from_numpy(np.array(mb.num_items, dtype=np.int64))
        batch["plan"] = {"epoch": mb.epoch, "index": mb.index, "update": mb.update, "micro_step": mb.micro_step,
                         "position": mb.position, "last_in_update": mb.last_in_update,
                         "placeholder": mb.index < 0}
        if self.fields is not None:
            batch.update(self.fields(self, mb, tokens, batch))
        return batch


def model_inputs(batch: dict[str, Any], attn_implementation: str | None = None, *, explicit_mask: bool = False,
                 dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """Keyword arguments for a Hugging Face causal LM's forward, for its attention implementation
    (`model.config._attn_implementation`), always with `use_cache=False` (transformers detects packed samples from
    `position_ids` only without a KV cache):

    - flash attention (`flash_attention_2`, `flash_attention_3`, any name containing "flash"): `input_ids`,
      `position_ids` and the varlen kwargs `cu_seq_lens_q/k` (int32) and `max_length_q/k` (int), taken from the
      collator's `cu_seqlens`/`max_seqlen`: computed on the CPU from the plan, so the forward needs no host sync
      and nothing graph-breaks under `torch.compile`. No `attention_mask`: in padded mode the pad tails are
      segments of their own, which is what the mask would have said;
    - otherwise (`sdpa`, `eager`, `flex_attention`, or None): `input_ids`, `position_ids` and, in padded mode,
      the 2D `attention_mask`; with `explicit_mask=True` a 4D block-diagonal causal mask instead
      (`block_causal_mask`, additive, of `dtype`: the model's dtype), for models or versions that do not infer
      packed samples from `position_ids`.
    """
    out: dict[str, Any] = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"],
                           "use_cache": False}
    if attn_implementation is not None and "flash" in attn_implementation:
        if explicit_mask:
            raise ValueError(f"{attn_implementation} takes the varlen kwargs, not a mask: drop explicit_mask=True")
        cu = batch["cu_seqlens"].to(batch["input_ids"].device, non_blocking=True)
        out.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=batch["max_seqlen"],
                   max_length_k=batch["max_seqlen"])
    elif explicit_mask:
        out["attention_mask"] = block_causal_mask(batch["position_ids"], dtype=dtype)
    elif "attention_mask" in batch:
        out["attention_mask"] = batch["attention_mask"]
    return out


def block_causal_mask(position_ids: torch.Tensor, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The (rows, 1, T, T) mask letting each token attend to the earlier tokens of its own segment: 0 where allowed,
    the dtype's minimum elsewhere. Additive because eager and flex attention add the mask to the scores (a bool
    mask is right for sdpa only). Segments start where a position id is 0 (the collator's rule, pads included)."""
    seg = (position_ids == 0).cumsum(-1)
    width = position_ids.shape[-1]
    causal = torch.ones(width, width, dtype=torch.bool, device=position_ids.device).tril()
    allowed = (seg[:, :, None] == seg[:, None, :]) & causal
    mask = torch.zeros(allowed.shape, dtype=dtype, device=position_ids.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


__all__ = ["IGNORE_INDEX", "PlanCollator", "block_causal_mask", "model_inputs"]
