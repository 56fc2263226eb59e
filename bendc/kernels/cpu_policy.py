"""The CPU execution policy: the one place that decides whether a kernel runs its cells in parallel.

A generated CPU kernel either loops over its cells in the calling thread or splits them over
the thread pool (``prange``: runtime/native runs it on bendc's pool, runtime/native/pool.py, or
numba runs it on its threading layer for the kernels it compiles itself). A parallel launch was
measured at ``LAUNCH_SECONDS`` on numba's workqueue layer (its workers nap between polls, so a
launch took 66-75 us whatever the work; the native kernels launch nothing when numba's thread
count is 1). bendc's pool launches in ~1.5 us while its workers spin, and its caller never waits
for a sleeping worker; the crossovers were kept (lowering them to a 10 or 3 us launch ran 2-4x the
launches with step times within the machine's noise: transformer 4.65 / 4.75 / 4.79 ms, cnn 2.23 /
2.11 / 2.04, gpt_small 6.61 / 6.49 / 6.79 at 2 threads). Splitting ``cells`` cells of
``seconds_per_cell`` work over two threads saves half the work: a kernel goes parallel when that
saving exceeds the launch, that is from ``2 * LAUNCH_SECONDS / seconds_per_cell`` cells. Every
renderer asks :func:`parallel` with the kind of work its cells do; no other file holds a threshold.

The costs per cell are the ones measured when each kind's crossover was set (2-core machine,
bench/run.py and the examples), which these constants reproduce exactly:

- ``"rows"``: a kernel whose cells are rows or lines of real work (norm statistics with their
  affine, softmax rows, scans, extrema, convolutions, attention): ~2.1 ns a cell, parallel from
  2^16 cells;
- ``"elementwise"``: a fused elementwise kernel, ~0.2-1 ns a cell (the CNN step's kernels of
  2^16-2^17 cells went from 5.35 to 2.36 ms at one thread when they stopped launching), parallel
  from 2^18 cells;
- ``"sums"``: a kernel that only sums (an unfused sum, the norm statistics: ~0.3 ns a cell in
  lanes, the CNN step's bias-gradient sums 0.04 ms serial against 0.11 ms parallel at one thread),
  parallel from 2^20 cells.

Threads: numba's thread count (``NUMBA_NUM_THREADS``, or ``numba.set_num_threads`` in the
process), on bendc's pool (numba's layer where the user set ``NUMBA_THREADING_LAYER``:
runtime/cpu.py picks ``workqueue`` for numba's own parallel kernels otherwise). BLAS: at one
thread matmul's products run on numpy's OpenBLAS; above one they run on the pool, one sgemm a
block of the output on scipy's OpenBLAS held to one thread (runtime/native/products.py,
pool.one_blas_thread), as do the tiled attention's and the conv's products inside their parallel
work items (numba's np.dot), so that one pool serves the step.
"""
from __future__ import annotations

LAUNCH_SECONDS = 70e-6
SECONDS_PER_CELL = {
    "rows": 2 * LAUNCH_SECONDS / (1 << 16),
    "elementwise": 2 * LAUNCH_SECONDS / (1 << 18),
    "sums": 2 * LAUNCH_SECONDS / (1 << 20),
}


def parallel_from(kind: str) -> int:
    """The fewest cells of ``kind`` that run in parallel."""
    return round(2 * LAUNCH_SECONDS / SECONDS_PER_CELL[kind])


def parallel(kind: str, cells: int) -> bool:
    """Whether ``cells`` cells of ``kind`` work run in parallel (see the module docstring)."""
    return cells >= parallel_from(kind)
