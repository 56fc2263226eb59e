"""A row's float64 lane sums over an array (the CPU kernels' SUM_LANES = 8 lanes, bendc/kernels/cpu_kit.py).

``bendc_lanes8(values, start, stop, s0, ..., s7)`` adds ``np.float64(values[c])`` for c in
[start, stop) into eight running sums and returns them: cell ``start + 8 * b + l`` into lane l for
every whole block b, the rest of the range (fewer than 8 cells) into lane 0, in cell order. That is
the order of cpu_kit's unrolled lanes (``lane_sum``, ``sum_lines``), so a kernel may sum a row's
cells through it and keep its bits, and a sum carried across rows passes its lanes back in.

Why a function: numba's pipeline and the native translator (runtime/native/translate.py) run LLVM
without the SLP vectorizer, so eight scalar lanes stay eight scalar adds a block. The translator
emits this function, for a contiguous float32 or float64 row, as one ``<8 x double>`` add a block:
lane l of the vector is lane l here, the same IEEE adds in the same order (strict floating point
forbids LLVM only to reassociate, not to add eight independent sums at once). numba compiles the
body below, which gives the same bits (BENDC_NATIVE_CHECK compares the two).
"""
import numpy as np
from numba import njit

# ---------------------------------------------------------------- TEMPLATE
@njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
def bendc_lanes8(values, start, stop, s0, s1, s2, s3, s4, s5, s6, s7):
    """The lanes s0..s7 plus values[start:stop] in the kernels' lane order (callers keep 0 <= start <= stop)."""
    blocks = (stop - start) // 8
    for block in range(blocks):
        c = start + 8 * block
        s0 += np.float64(values[c])
        s1 += np.float64(values[c + 1])
        s2 += np.float64(values[c + 2])
        s3 += np.float64(values[c + 3])
        s4 += np.float64(values[c + 4])
        s5 += np.float64(values[c + 5])
        s6 += np.float64(values[c + 6])
        s7 += np.float64(values[c + 7])
    for c in range(start + 8 * blocks, stop):  # the rest: lane 0
        s0 += np.float64(values[c])
    return s0, s1, s2, s3, s4, s5, s6, s7
