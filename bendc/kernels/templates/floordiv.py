"""torch's float32 floor division, step by step in float32 (c10's div_floor_floating and its vectorized
form ``div_floor_floating_vec``, which torch's CPU kernel runs over float32 tensors): the quotient of
``a - fmod(a, b)`` by ``b``, one less where fmod's sign differs from b's, its floor, plus one where the
floor lost more than a half; a zero quotient takes the sign of ``a / b``; a zero divisor gives ``a / b``.

Every step rounds to float32 as torch's does (``np.float32`` of a float64 + - / of float32 operands is
the float32 rounding): so where ``|a / b| >= 2**24`` the float32 ``a - fmod(a, b)`` rounds as torch's
does, which a float64 evaluation (CPython's algorithm) does not. ``fmod`` is exact. The floor of a
float32 of magnitude 2**23 or more is itself (no int conversion of huge values or NaN). The CPU
renderer copies the function into generated modules as an njit function; the CUDA renderer as an
inlined device function (bendc/kernels/templates/__init__.py), with ``math.fmod`` for ``np.fmod`` (numba's
CPU target has only the latter, numba.cuda only the former). bendc/ops/math_ops.py's numpy reference
takes the same steps over whole arrays.
"""
import math

import numpy as np
from numba import njit

# ---------------------------------------------------------------- TEMPLATE
@njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
def bendc_floor_divide(a, b):
    """torch.floor_divide(a, b) of two float32 values."""
    quotient = np.float32(a / b)
    if b == np.float32(0.0):
        return quotient
    if math.isinf(a):
        mod = np.float32(a - a)  # fmod's NaN (Python's math.fmod, under numba's CUDA simulator, raises)
    else:
        mod = np.float32(np.fmod(a, b))  # math.fmod on cuda (CUDA_SPELLINGS)
    if math.isinf(quotient) and not math.isinf(a):
        floor = np.float32(a)  # torch's fixup where a / b overflows
    else:
        floor = np.float32(a - mod)
    div = np.float32(floor / b)
    if mod != np.float32(0.0) and (b < np.float32(0.0)) != (mod < np.float32(0.0)):
        div = np.float32(div - np.float32(1.0))
    if div == np.float32(0.0):
        return np.float32(math.copysign(0.0, quotient))
    if abs(div) < np.float32(8388608.0):
        floored = np.float32(math.floor(div))
    else:
        floored = div  # 2**23 and beyond (and inf, NaN): already whole
    if np.float32(div - floored) > np.float32(0.5):
        floored = np.float32(floored + np.float32(1.0))
    return floored
