"""Philox-4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3", SC 2011;
the constants of Random123), in uint64 arithmetic that numba types the same on the CPU and on CUDA.

A 32-bit word is held in a uint64 (masked after each add); a 32 x 32-bit product fits a uint64, its
high and low words are a shift and a mask. Every constant is a ``np.uint64``: numba types a uint64
mixed with a plain int as float64. The CPU renderer copies the function into generated modules as
an njit function (LLVM inlines it); the CUDA renderer as an inlined device function (the same text with the
decorator swapped, bendc/kernels/templates/__init__.py). The numpy reference of the ops that call it
(bendc/ops/random.py) computes the same words over whole arrays; tests/ops/test_ops_random.py checks
both against Random123's known-answer vectors.
"""
import numpy as np
from numba import njit

# ---------------------------------------------------------------- TEMPLATE
@njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
def bendc_philox(seed, index, offset):
    """Word 0 of Philox-4x32-10 at the counter (index low, index high, offset, 0) under the key
    (seed low, seed high): a uniform 32-bit word per (seed, offset, index)."""
    low = np.uint64(0xFFFFFFFF)
    shift = np.uint64(32)
    counter = np.uint64(index)
    key = np.uint64(seed)
    c0 = counter & low
    c1 = counter >> shift
    c2 = np.uint64(offset) & low
    c3 = np.uint64(0)
    k0 = key & low
    k1 = key >> shift
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c0
        p1 = np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = (p1 >> shift) ^ c1 ^ k0, p1 & low, (p0 >> shift) ^ c3 ^ k1, p0 & low
        k0 = (k0 + np.uint64(0x9E3779B9)) & low
        k1 = (k1 + np.uint64(0xBB67AE85)) & low
    return c0
