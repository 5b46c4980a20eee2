"""Microbatch balance for the fixed-count layouts `padded` and `flattened` (SPEC 4/5, stage 2).

Every microbatch keeps exactly `micro_batch_size` samples. Samples of equal length are first re-dealt over their
positions to even out label totals (`_redeal`: no microbatch's tokens or cost change; label CV 0.76 -> 0.43 at 1M
samples), and under `flattened` samples of equal targets then even out token totals (cost CV 0.43 -> 0.19). Then
trades, one-for-one or two-for-two (`_exchange`, exact mode), between the heaviest and lightest microbatches of
stratified windows (see `microbatch`).

Microbatches of more than 62 samples (bit-mask width) are left as they are.

- `padded`: cost = samples x longest sample, rounded up to `--pad-multiple`. A trade must narrow the label gap
  without raising the pair's total cost or any microbatch above the plan's peak, so padding never grows.
- `flattened`: cost = tokens. A trade must narrow the label gap or the token gap and widen neither, within the
  plan's peak, so label variance and length variance both never grow; the score weighs the two gaps by their
  means.
"""

from __future__ import annotations

from plancc.balance import _common as c
from plancc.balance._exchange import LOCAL
from plancc.balance._redeal import deal_equal_labels, deal_equal_lengths
from plancc.config import PlanSettings
from plancc.plan import Batches, SampleArrays, batch_targets, batch_tokens

ROUNDS = 32  # pairing rounds per window and pass (stops early after IDLE idle rounds)
QUANTA = (256, 64, 16, 4, 1)  # flattened: class widths of the alternating deals, coarse to fine


def balance_fixed_count(b: Batches, s: SampleArrays, settings: PlanSettings) -> Batches:
    """Stage 2 for `padded` and `flattened`: the deals, then pair trades in stratified windows (module docstring)."""
    if not 2 <= settings.micro_batch_size <= LOCAL:
        return b
    window = settings.balance_window
    start = deal_equal_lengths(b, s, settings)
    if settings.mode == "flattened":
        start = _alternate_deals(b, start, s, settings)
    return c.exchange(start, s, settings, windows=lambda p, v: c.stratified_windows(v, window),
                      passes=settings.balance_passes, rounds=ROUNDS)


def _alternate_deals(b: Batches, start: Batches, s: SampleArrays, settings: PlanSettings) -> Batches:
    """Flattened: deals of near-equal target counts (evening tokens) and near-equal lengths (evening labels) in
    turn, classes `QUANTA` wide, coarse to fine. Each is kept only if it lowers the sum of the two squared CVs;
    the result only if neither variance ends above the stage input `b`'s, else `start` (the exact length deal of
    `b`) with the exact label deal, which is always safe."""
    def objective(x: Batches) -> tuple[float, float]:
        return (c.label_sse(batch_targets(x, s, settings.shift)), c.label_sse(batch_tokens(x, s)))

    labels0, tokens0 = objective(b)
    scale = (float(batch_targets(b, s, settings.shift).mean()) ** 2 or 1.0, float(batch_tokens(b, s).mean()) ** 2)
    best = start
    best_j = sum(x / y for x, y in zip(objective(start), scale, strict=True))
    for q in QUANTA:
        for deal in (deal_equal_labels, deal_equal_lengths):
            new = deal(best, s, settings, quantum=q)
            if new is best:
                continue
            lab, tok = objective(new)
            j = lab / scale[0] + tok / scale[1]
            if j < best_j:
                best, best_j = new, j
    lab, tok = objective(best)
    return best if lab <= labels0 and tok <= tokens0 else deal_equal_labels(start, s, settings)
