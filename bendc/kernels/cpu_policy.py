"""The CPU execution policy: the one place that decides whether a kernel runs its cells in parallel,
and whether its loops calling the math kit are interleaved (:func:`interleaves`, at the end).

A generated CPU kernel either loops over its cells in the calling thread or splits them over
the thread pool (``prange``: runtime/native runs it on bendc's pool, runtime/native/pool.py, or
numba runs it on its threading layer for the kernels it compiles itself). A parallel launch was
charged ``LAUNCH_SECONDS``: bendc's pool launches in ~1.5 us while its workers spin and its caller
never waits for a sleeping worker (a prange over 64 cells: 0.45 us a call serial, 0.60 at 2
threads), and a launch also costs the parfor's setup and the second core's cache misses, so 5 us
(the native kernels launch nothing when numba's thread count is 1).
Splitting ``cells`` cells of ``seconds_per_cell`` work over two threads saves half the work: a
kernel goes parallel when that saving exceeds the launch, that is from ``2 * LAUNCH_SECONDS /
seconds_per_cell`` cells. Every renderer asks :func:`parallel` with the kind of work its cells do;
no other file holds a threshold.

The launch was 70 us until numba's workqueue layer gave way to the pool (its workers napped
between polls: 66-75 us a launch whatever the work), which left a decoder's (1024, 128) layer-norm
and residual kernels serial. At 10 us, 2 threads, alternating processes of both constants
(bench/run.py's COLD_WORKLOADS step alone, medians of 40 calls, OPENBLAS_NUM_THREADS and OMP_NUM_THREADS as
numba's): gpt 25.1 / 24.9 -> 22.1 / 22.4 ms (1755 -> 3420 launches), cnn 2.00 / 2.05 -> 1.69 /
1.80, gpt_small 5.80 / 5.78 -> 5.39 / 5.67; transformer, mlp and mnist_cnn within noise; at one
thread every workload within noise (nothing launches). 25 and 50 us were slower again (stop 45).
At 5 us (stop 46; the same method, medians of 300 calls, three alternating rounds of each
constant at 2 threads and four at one): transformer 3.97 / 3.92 / 3.96 -> 3.79 / 3.69 / 3.80 ms,
cnn 1.54 / 1.35 / 1.36 -> 1.29 / 1.33 / 1.30 (the kernels between the two thresholds now split:
rows kernels of 4.7K-9.4K cells, elementwise ones of 18.7K-37K, sums of 75K-150K); gpt_small, gpt,
mlp and mnist_cnn within noise at 2 threads, every workload within noise at one. 2.5 us measured as
5 (gpt_small, transformer, cnn at 2 threads).

The costs per cell (2-core machine, bench/run.py and the examples):

- ``"rows"``: a kernel whose cells are rows or lines of real work (norm statistics with their
  affine, softmax rows, scans, extrema, convolutions, attention): ~2.1 ns a cell, parallel from
  ~4.7K cells;
- ``"elementwise"``: a fused elementwise kernel, ~0.2-1 ns a cell (the CNN step's kernels of
  2^16-2^17 cells went from 5.35 to 2.36 ms at one thread when they stopped launching on numba's
  workqueue), parallel from ~18.7K cells;
- ``"sums"``: a kernel that only sums (an unfused sum: ~0.13 ns a cell in lanes), parallel from
  ~75K cells. The layer norm kernels (~0.6 ns a cell forward, ~1.5 backward: a few passes over
  an L1-resident row) ask as elementwise kernels: they read the rows a parallel kernel just wrote,
  which a serial kernel at 2 threads fetched from the other core's cache (gpt_small's composed
  layer norm's norm_rstd took 0.015 ms at 1 thread, 0.031 serial at 2, 0.011 split).

Threads: numba's thread count (``NUMBA_NUM_THREADS``, or ``numba.set_num_threads`` in the
process), on bendc's pool (numba's layer where the user set ``NUMBA_THREADING_LAYER``:
runtime/cpu.py picks ``workqueue`` for numba's own parallel kernels otherwise). BLAS: one sgemm
(runtime/native/blas.py, ``BENDC_BLAS``): MKL, sequential, where installed; matmul's products run
on it at one thread and above one on the pool, one sgemm a block of the output
(runtime/native/products.py), as do the tiled attention's and the conv's products inside their
parallel work items (np.dot), so that one pool serves the step. Without MKL: numpy's OpenBLAS at
one thread, scipy's held to one thread on the pool (pool.one_blas_thread).
"""
from __future__ import annotations

LAUNCH_SECONDS = 5e-6
# the per-cell costs measured when the crossovers were set against a 70 us launch (2^16, 2^18, 2^20 cells)
SECONDS_PER_CELL = {
    "rows": 2 * 70e-6 / (1 << 16),
    "elementwise": 2 * 70e-6 / (1 << 18),
    "sums": 2 * 70e-6 / (1 << 20),
}


def parallel_from(kind: str) -> int:
    """The fewest cells of ``kind`` that run in parallel."""
    return round(2 * LAUNCH_SECONDS / SECONDS_PER_CELL[kind])


def parallel(kind: str, cells: int) -> bool:
    """Whether ``cells`` cells of ``kind`` work run in parallel (see the module docstring)."""
    return cells >= parallel_from(kind)


# Interleaving (runtime/native/translate.py NATIVE_INTERLEAVE, asked for by bendc/codegen/cpu.py):
# a loop calling the kit's math runs 2 or 4 vectors an iteration where the host has no AVX-512.
# It saves ~0.7 ns a cell (Zen 3, 1 thread: gelu over 1024 x 512 floats 1.00 -> 0.65 ms) and
# costs LLVM time at each cold compile: the loop's code two to four times over, 45 -> 90 ms a
# gelu kernel; tests/ops' parity, activation and attention files took 100 s serially against
# 74 without it. A kernel asks only where its largest tensor has INTERLEAVE_FROM cells: then a
# call saves ~10 us or more, and the compile is repaid within a few thousand steps; below, a call
# saves microseconds at most.
INTERLEAVE_FROM = 1 << 14


def interleaves(cells: int) -> bool:
    """Whether a kernel whose largest tensor has ``cells`` cells interleaves its math loops."""
    return cells >= INTERLEAVE_FROM
