"""The synthetic SFT mix of issue 3, as plan inputs (no tokenizer, no files).

prompt ~ lognormal(5.5, 0.9) clipped to [8, 3000], completion ~ lognormal(4.8, 1.2) clipped to [1, 3000],
length = min(prompt + completion, 4096), supervised labels = min(completion, length - 1).
"""

from __future__ import annotations

import numpy as np

from plancc.plan import SampleArrays


def sft_mix(n: int, seed: int = 0, sequence_len: int = 4096) -> SampleArrays:
    rng = np.random.default_rng(seed)
    prompt = np.clip(np.rint(rng.lognormal(5.5, 0.9, n)), 8, 3000).astype(np.int64)
    completion = np.clip(np.rint(rng.lognormal(4.8, 1.2, n)), 1, 3000).astype(np.int64)
    length = np.minimum(prompt + completion, sequence_len)
    labels = np.minimum(completion, length - 1)
    return SampleArrays(
        sample_id=np.arange(n, dtype=np.int64),
        length=length,
        label_count=labels,
        first_label_supervised=np.zeros(n, dtype=bool),
    )
