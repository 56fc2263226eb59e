"""numba template: the row helpers shared by the attention kernels (dot products, weighted sums, softmax of a row).

bendc/ops/attention/cpu.py reads this file as text and uses what follows the TEMPLATE line,
with PARALLEL, SCALE and CAUSAL replaced by the call site's values (``parallel``, the
softmax scale and ``causal``). The lines above it make the file importable and lintable.
"""
import math

import numpy as np
from numba import njit

# ---------------------------------------------------------------- TEMPLATE

@njit(cache=True, no_cfunc_wrapper=True)
def _dots(x, rows_t, out):
    """out[j] = x . rows_t[:, j], summed in order of x's index (vectorized over j, four terms a pass)."""
    length = out.shape[0]
    depth = x.shape[0]
    for j in range(length):
        out[j] = np.float32(0.0)
    d = 0
    while d + 4 <= depth:
        x0 = x[d]
        x1 = x[d + 1]
        x2 = x[d + 2]
        x3 = x[d + 3]
        r0 = rows_t[d]
        r1 = rows_t[d + 1]
        r2 = rows_t[d + 2]
        r3 = rows_t[d + 3]
        for j in range(length):
            out[j] = (((out[j] + x0 * r0[j]) + x1 * r1[j]) + x2 * r2[j]) + x3 * r3[j]
        d += 4
    while d < depth:
        xd = x[d]
        rd = rows_t[d]
        for j in range(length):
            out[j] = out[j] + xd * rd[j]
        d += 1


@njit(cache=True, no_cfunc_wrapper=True)
def _accumulate(weights, rows, out):
    """out += sum over j of weights[j] * rows[j], in order of j (vectorized over out, four terms a pass)."""
    width = out.shape[0]
    count = weights.shape[0]
    j = 0
    while j + 4 <= count:
        w0 = weights[j]
        w1 = weights[j + 1]
        w2 = weights[j + 2]
        w3 = weights[j + 3]
        r0 = rows[j]
        r1 = rows[j + 1]
        r2 = rows[j + 2]
        r3 = rows[j + 3]
        for c in range(width):
            out[c] = (((out[c] + w0 * r0[c]) + w1 * r1[c]) + w2 * r2[c]) + w3 * r3[c]
        j += 4
    while j < count:
        w = weights[j]
        r = rows[j]
        for c in range(width):
            out[c] = out[c] + w * r[c]
        j += 1


@njit(cache=True, no_cfunc_wrapper=True)
def _weighted_rows(weights, rows, out):
    """out = sum over j of weights[j] * rows[j], in order of j."""
    for c in range(out.shape[0]):
        out[c] = np.float32(0.0)
    _accumulate(weights, rows, out)


@njit(cache=True, no_cfunc_wrapper=True)
def _softmax_scores(query, keys_t, row, i, scale, causal):
    """row = softmax(scale * (query . key j)) over the row's positions, j > i masked when causal."""
    _dots(query, keys_t, row)
    length = row.shape[0]
    for j in range(length):
        row[j] = row[j] * scale
    if causal:
        for j in range(i + 1, length):
            row[j] = np.float32(-np.inf)
    top = row[0]
    for j in range(1, length):
        if row[j] > top:
            top = row[j]
    total = np.float32(0.0)
    for j in range(length):
        e = math.exp(row[j] - top)
        row[j] = e
        total += e
    for j in range(length):
        row[j] = row[j] / total
