"""Cross entropy from the hidden states and the output head, a chunk of tokens at a time.

`token_loss_sum(logits, ...)` needs every token's logits in fp32: for a 128k vocabulary and 4096 tokens that is
2.1 GB, and softmax and its gradient hold two more copies. Here the logits of only `chunk` supervised tokens
exist at once (about 64 MB by default, whatever the vocabulary):

    hidden (n, H) ── rows with a target only ──▶ for each chunk of rows:
        z = hidden[c] @ W.T (+ b), in the head's dtype, upcast to fp32 (what `token_loss_sum` sees)
        loss -= log_softmax(z)[target]
        dz = softmax(z) - onehot(target)     (fp32, while z is at hand: exp of the log_softmax, in place)
        d hidden[c] = dz @ W ; dW += dz.T @ hidden[c] ; db += dz.sum(0)

The gradients are computed in the forward (so backward neither recomputes nor needs the head's weight, which a
sharded model may have freed by then) and scaled by the incoming gradient in backward: the loss is a sum, so its
gradient is linear in that one scalar. Memory: one fp32 copy of the head's weight for its gradient and the
hidden rows' gradient, both the sizes autograd would hold anyway. Under `no_grad` only the sum is computed.

`scale` and `softcap` reproduce the models whose logits are `softcap * tanh(scale * z / softcap)` (Gemma's
final-logit soft-capping, Cohere's and Granite's logit scales; see `head_transform`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from plancc.core.plan_arrays import IGNORE_INDEX

# logits held at once: chunk rows x vocabulary fp32 values (16M: 64 MB, so ~130 tokens of a 128k vocabulary)
CHUNK_ELEMENTS = 1 << 24


def chunk_rows(vocab: int, chunk_elements: int = CHUNK_ELEMENTS) -> int:
    """Tokens per chunk so that a chunk's fp32 logits hold about `chunk_elements` values (at least 16 tokens)."""
    return max(16, chunk_elements // max(vocab, 1))


def _chunks(hidden, weight, bias, targets, chunk, scale, softcap, grads):
    """The CE sum over `hidden`'s rows and, where `grads` = (hidden, weight, bias) asks, its gradients."""
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    gh = torch.empty_like(hidden) if grads[0] else None
    gw = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if grads[1] else None
    gb = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if grads[2] else None
    for a in range(0, hidden.shape[0], chunk):
        h, y = hidden[a:a + chunk], targets[a:a + chunk]
        z = F.linear(h, weight, bias).float()
        if scale != 1.0:
            z = z * scale
        t = None
        if softcap:
            t = torch.tanh(z / softcap)
            z = t * softcap
        logp = torch.log_softmax(z, dim=-1)
        total -= logp.gather(1, y[:, None]).sum()
        if not any(grads):
            continue
        dz = logp.exp_()  # softmax, in place
        dz[torch.arange(y.shape[0], device=y.device), y] -= 1.0
        if t is not None:
            dz *= 1.0 - t * t
        if scale != 1.0:
            dz *= scale
        if gh is not None:
            gh[a:a + chunk] = dz.to(weight.dtype) @ weight
        if gw is not None:
            gw.addmm_(dz.t(), h.float())
        if gb is not None:
            gb += dz.sum(0)
    return total, gh, gw, gb


class _ChunkedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk, scale, softcap):
        need = ctx.needs_input_grad
        total, gh, gw, gb = _chunks(hidden, weight, bias, targets, chunk, scale, softcap,
                                    (need[0], need[1], bias is not None and need[2]))
        ctx.save_for_backward(gh, gw, gb)
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        return total

    @staticmethod
    def backward(ctx, grad):
        gh, gw, gb = ctx.saved_tensors
        wt, bt = ctx.dtypes
        return (None if gh is None else gh * grad.to(gh.dtype), None if gw is None else (gw * grad).to(wt),
                None if gb is None else (gb * grad).to(bt), None, None, None, None)


def chunked_loss_sum(hidden: torch.Tensor, weight: torch.Tensor, shift_labels: torch.Tensor, *,
                     bias: torch.Tensor | None = None, scale: float = 1.0, softcap: float | None = None,
                     chunk: int | None = None) -> torch.Tensor:
    """Sum of per-target cross entropy in fp32 of the logits `hidden @ weight.T + bias` (`shift_labels[t]` is the
    target of `hidden[..., t, :]`), equal to `token_loss_sum` of those logits, without holding them all."""
    labels = shift_labels.reshape(-1).to(hidden.device)
    keep = labels != IGNORE_INDEX
    rows = hidden.reshape(-1, hidden.shape[-1])[keep]
    chunk = chunk or chunk_rows(weight.shape[0])
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in (rows, weight, bias)):
        return _ChunkedCrossEntropy.apply(rows, weight, bias, labels[keep], chunk, float(scale), softcap)
    with torch.no_grad():
        return _chunks(rows, weight, bias, labels[keep], chunk, float(scale), softcap, (False, False, False))[0]


def head_transform(config) -> tuple[float, float | None]:
    """(scale, softcap) that a Hugging Face config applies to the head's output before the loss: Gemma's
    `final_logit_softcapping`, Cohere's `logit_scale` (a factor), Granite's `logits_scaling` (a divisor)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    scale = getattr(text, "logit_scale", None)
    if scale is None and getattr(text, "logits_scaling", None):
        scale = 1.0 / text.logits_scaling
    return float(1.0 if scale is None else scale), getattr(text, "final_logit_softcapping", None) or None


__all__ = ["CHUNK_ELEMENTS", "chunk_rows", "chunked_loss_sum", "head_transform"]
