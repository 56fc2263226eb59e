"""torch's F.dropout drawing bendc's masks, so that train-mode dropout compares with torch eager.

bendc's mask is Philox words keyed by the step's seed at the call's offset in the trace (one offset
per dropout call that draws a mask, bendc/ops/random.py); inside ``with bendc_masks(seed):`` torch's
``F.dropout`` (and so ``nn.Dropout``) draws the same ones, counting its calls the same way
(tests/fuzz/fuzz_gen.py's TorchF.dropout does it for the generated programs).
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np


@contextlib.contextmanager
def bendc_masks(seed: int) -> Iterator[None]:
    import torch
    import torch.nn.functional as TF

    from bendc.ops.random import dropout_scale, dropout_words, keep_threshold

    original, calls = TF.dropout, [0]

    def dropout(x, p=0.5, training=True, inplace=False):
        if not training or p == 0.0:
            return x
        keep = dropout_words(seed, calls[0], tuple(x.shape)) < np.uint64(keep_threshold(p))
        calls[0] += 1
        return x * torch.from_numpy(np.where(keep, np.float32(dropout_scale(p)), np.float32(0.0)))

    TF.dropout = dropout
    try:
        yield
    finally:
        TF.dropout = original
