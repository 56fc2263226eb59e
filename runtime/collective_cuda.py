"""The rank-ordered reduction of a gathered bucket on the device (runtime/collective.py's CUDA-aware
path): one thread per element sums the ranks in rank order in float64 and rounds once, as
``ordered_reduce`` does on the host, so every rank gets the same bits."""
from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda

THREADS = 128


@cuda.jit
def sum_ranks(gathered, out, size):
    i = cuda.grid(1)
    if i < out.shape[0]:
        total = np.float64(gathered[0, i])
        for rank in range(1, size):
            total += np.float64(gathered[rank, i])
        out[i] = np.float32(total)


@cuda.jit
def mean_ranks(gathered, out, size):
    i = cuda.grid(1)
    if i < out.shape[0]:
        total = np.float64(gathered[0, i])
        for rank in range(1, size):
            total += np.float64(gathered[rank, i])
        out[i] = np.float32(total / np.float64(size))


def device_ordered_reduce(gathered: Any, op: str, size: int, out: Any) -> None:
    """Reduce ``gathered`` ([size, n] device array) into ``out`` (n, device) in rank order."""
    kernel = mean_ranks if op == "mean" else sum_ranks
    count = out.shape[0]
    kernel[max(1, (count + THREADS - 1) // THREADS), THREADS](gathered, out, size)
