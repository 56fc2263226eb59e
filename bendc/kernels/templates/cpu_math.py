"""float32 transcendentals for generated CPU kernels: branch-free, so LLVM vectorizes the loops
that call them (libm's expf/tanhf/erff are opaque calls, one element at a time).

Each function is plain float32 arithmetic, integer bit operations on the float's bits and
selects (``a if c else b`` on floats compiles to a select); no fastmath, no FMA contraction. The
polynomials' Horner steps are written as ``bendc_fma(p, r, c)``: a * b + c rounded once, always
(llvm.fma: the FMA instruction where the CPU has one, libm's correctly rounded fmaf where not), so
the bits do not depend on the machine; numba's compile and the native translator
(runtime/native/translate.py) emit the same intrinsic. Half the instructions of a multiply and an
add: gelu's forward on 1024 x 512 floats 0.88 -> 0.53 ms at 1 thread.
Range reduction follows Cephes (x = n ln2 + r with ln2 split in two; log's mantissa in
[sqrt(1/2), sqrt(2))); 2^n is built from the exponent bits in two factors so that denormal
results round once. Measured against torch's CPU results and float64 in
tests/kernels/test_cpu_math.py.

The CPU renderer copies the functions a kernel calls (and the ones they call) into the
generated module after its imports (bendc/kernels/cpu_kit.py, ``math_prelude``): a generated
module imports numpy and numba only, so artifacts run without bendc.
"""
import numpy as np
from numba import njit

# ---------------------------------------------------------------- TEMPLATE
from numba.core import types as bendc_types
from numba.extending import intrinsic as bendc_intrinsic


@bendc_intrinsic
def bendc_fma(typingctx, a, b, c):
    """a * b + c for float32 a, b, c, rounded once (llvm.fma.f32)."""
    single = bendc_types.float32
    if (a, b, c) != (single, single, single):
        return None

    def codegen(context, builder, signature, args):
        return builder.fma(*args)
    return single(single, single, single), codegen


@njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
def bendc_exp(x):
    """e^x for float32 x: Cephes expf's polynomial on |r| <= ln2/2, 2^n in two factors. x is clamped
    at -176, not at -104 where e^x starts to round to 0: from -175.5 down one of the two factors is
    +0 (its exponent field is 0), so the result is 0 without a product that underflows. An Intel
    core takes a microcode assist (~100+ cycles) for each float32 result that underflows, and a
    causal attention's masked scores are -inf (a loop over x half -inf: 6.3 ns an element clamped at
    -104, 0.40 at -176, as for ordinary x; an online-softmax tile of 64 x 64 with its upper half
    masked 16.8 -> 3.4 us). From -176 to -104 the product underflows to 0, as e^-104 did: the same
    bits for every x."""
    x = np.float32(89.0) if x > np.float32(89.0) else x  # e^89 overflows; NaN passes through
    x = np.float32(-176.0) if x < np.float32(-176.0) else x  # k = -254: both factors +0
    shifted = x * np.float32(1.44269504088896341) + np.float32(12582912.0)  # 1.5 * 2^23: round to nearest
    n = shifted - np.float32(12582912.0)
    r = x - n * np.float32(0.693359375)
    r = r - n * np.float32(-2.12194440e-4)
    z = r * r
    p = bendc_fma(np.float32(1.9875691500e-4), r, np.float32(1.3981999507e-3))
    p = bendc_fma(p, r, np.float32(8.3334519073e-3))
    p = bendc_fma(p, r, np.float32(4.1665795894e-2))
    p = bendc_fma(p, r, np.float32(1.6666665459e-1))
    p = bendc_fma(p, r, np.float32(5.0000001201e-1))
    p = bendc_fma(p, z, r) + np.float32(1.0)
    # n as an integer from the shifted float's bits (numba widens int32 arithmetic: narrow back)
    k = np.int32(np.float32(shifted).view(np.int32) - np.int32(0x4B400000))
    half = np.int32(k >> np.int32(1))
    low = np.int32((half + np.int32(127)) << np.int32(23)).view(np.float32)
    high = np.int32((k - half + np.int32(127)) << np.int32(23)).view(np.float32)
    return p * low * high


@njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
def bendc_log(x):
    """log(x) for float32 x: Cephes logf (mantissa in [sqrt(1/2), sqrt(2)), degree-8 polynomial)."""
    tiny = x < np.float32(1.17549435e-38)  # denormals (and 0, negatives): scale by 2^23 first
    scaled = x * np.float32(8388608.0) if tiny else x
    bits = np.float32(scaled).view(np.int32)
    e = np.int32(((bits >> np.int32(23)) & np.int32(0xFF)) - np.int32(126))
    e = np.int32(e - np.int32(23)) if tiny else e
    m = np.int32((bits & np.int32(0x007FFFFF)) | np.int32(0x3F000000)).view(np.float32)  # [0.5, 1)
    low = m < np.float32(0.707106781186547524)
    e = np.int32(e - np.int32(1)) if low else e
    m = (m + m - np.float32(1.0)) if low else (m - np.float32(1.0))
    fe = np.float32(e)
    z = m * m
    y = bendc_fma(np.float32(7.0376836292e-2), m, np.float32(-1.1514610310e-1))
    y = bendc_fma(y, m, np.float32(1.1676998740e-1))
    y = bendc_fma(y, m, np.float32(-1.2420140846e-1))
    y = bendc_fma(y, m, np.float32(1.4249322787e-1))
    y = bendc_fma(y, m, np.float32(-1.6668057665e-1))
    y = bendc_fma(y, m, np.float32(2.0000714765e-1))
    y = bendc_fma(y, m, np.float32(-2.4999993993e-1))
    y = bendc_fma(y, m, np.float32(3.3333331174e-1))
    y = y * m * z
    y = y + fe * np.float32(-2.12194440e-4)
    y = y - np.float32(0.5) * z
    result = m + y
    result = result + fe * np.float32(0.693359375)
    result = np.float32(-np.inf) if x == np.float32(0.0) else result
    result = np.float32(np.nan) if x < np.float32(0.0) else result
    return x if x == np.float32(np.inf) or x != x else result


@njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
def bendc_tanh(x):
    """tanh(x) for float32 x: Cephes tanhf (an odd polynomial below 0.625, else 1 - 2/(e^2|x| + 1))."""
    a = np.abs(x)
    z = x * x
    small = bendc_fma(np.float32(-5.70498872745e-3), z, np.float32(2.06390887954e-2))
    small = bendc_fma(small, z, np.float32(-5.37397155531e-2))
    small = bendc_fma(small, z, np.float32(1.33314422036e-1))
    small = bendc_fma(small, z, np.float32(-3.33332819422e-1))
    small = small * z * x + x
    small = x if x == np.float32(0.0) else small  # tanh(-0) is -0 (the sum above gives +0)
    large = np.float32(1.0) - np.float32(2.0) / (bendc_exp(a + a) + np.float32(1.0))
    large = -large if x < np.float32(0.0) else large
    return small if a < np.float32(0.625) else large


@njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
def bendc_sigmoid(x):
    """1 / (1 + e^-x), as PyTorch computes it."""
    return np.float32(1.0) / (np.float32(1.0) + bendc_exp(-x))


@njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
def bendc_erf(x):
    """erf(x) for float32 x: x P(x^2) below 0.9, else 1 - e^Q(|x|) with Q a fit of log erfc
    (least-squares fits, refined towards minimax, of degree 6 in x^2 and 9 in |x|)."""
    a = np.abs(x)
    s = x * x
    small = bendc_fma(np.float32(8.159370190696791e-05), s, np.float32(-0.000808154814876616))
    small = bendc_fma(small, s, np.float32(0.005194210913032293))
    small = bendc_fma(small, s, np.float32(-0.026855744421482086))
    small = bendc_fma(small, s, np.float32(0.11283600330352783))
    small = bendc_fma(small, s, np.float32(-0.376126229763031))
    small = bendc_fma(small, s, np.float32(1.1283791065216064))
    small = small * x
    t = np.float32(4.0) if a > np.float32(4.0) else a  # erf(4) rounds to 1; NaN passes through
    q = bendc_fma(np.float32(1.2099523019060143e-06), t, np.float32(-1.9398114091018215e-05))
    q = bendc_fma(q, t, np.float32(0.0001137419167207554))
    q = bendc_fma(q, t, np.float32(-9.921417949954048e-05))
    q = bendc_fma(q, t, np.float32(-0.0028447480872273445))
    q = bendc_fma(q, t, np.float32(0.022971538826823235))
    q = bendc_fma(q, t, np.float32(-0.10601179301738739))
    q = bendc_fma(q, t, np.float32(-0.6348544359207153))
    q = bendc_fma(q, t, np.float32(-1.1289423704147339))
    q = bendc_fma(q, t, np.float32(7.98897526692599e-05))
    large = np.float32(1.0) - bendc_exp(q)
    large = -large if x < np.float32(0.0) else large
    return small if a < np.float32(0.9) else large


@njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
def bendc_gelu_parts(x):
    """(Phi(x), e^(-x^2 / 2)) for gelu and its gradient, through one exp: Phi(x) = 1 - erfc(t) / 2
    for x > 0, erfc(t) / 2 otherwise, t = |x| / sqrt(2), with erfc(t) = e^(-t^2) erfcx(t) and
    erfcx(t) a polynomial of degree 9 in s = 1 / (1 + 0.36 t) (a relative least-squares fit refined
    towards minimax: within 1.5e-8 of erfcx on [0, 10] with float32 coefficients). x^2 is split
    exactly (x * x plus its fma remainder) so e^(-x^2 / 2) keeps its relative accuracy in the
    tail. Phi(x) is then within a few ulp everywhere, the negative tail included (1 + erf there
    cancels to an absolute error of ~6e-8). |x| beyond 16 gives Phi 0 or 1 and e 0."""
    c = np.float32(16.0) if x > np.float32(16.0) else x
    c = np.float32(-16.0) if c < np.float32(-16.0) else c
    t = np.abs(c) * np.float32(0.7071067811865476)
    s = np.float32(1.0) / (np.float32(0.36) * t + np.float32(1.0))
    r = bendc_fma(np.float32(0.06945326924324036), s, np.float32(-0.37568241357803345))
    r = bendc_fma(r, s, np.float32(0.704346239566803))
    r = bendc_fma(r, s, np.float32(-0.5517320036888123))
    r = bendc_fma(r, s, np.float32(0.5153765082359314))
    r = bendc_fma(r, s, np.float32(0.006681130267679691))
    r = bendc_fma(r, s, np.float32(0.2317476123571396))
    r = bendc_fma(r, s, np.float32(0.19604496657848358))
    r = bendc_fma(r, s, np.float32(0.2037937343120575))
    r = bendc_fma(r, s, np.float32(-2.9057011488475837e-05))
    square = c * c
    remainder = bendc_fma(c, c, -square)  # exact: c * c = square + remainder
    e = bendc_exp(np.float32(-0.5) * square)
    e = bendc_fma(e, np.float32(-0.5) * remainder, e)  # e^(-r/2) ~ 1 - r/2 for |r| <= ulp(square) / 2
    half = np.float32(0.5) * e * r
    return (np.float32(1.0) - half if c > np.float32(0.0) else half), e


@njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
def bendc_gelu(x):
    """gelu(x) = x Phi(x) (approximate="none")."""
    phi, e = bendc_gelu_parts(x)
    return x * phi


@njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
def bendc_gelu_vjp(grad, x):
    """grad * (Phi(x) + x phi(x)), phi(x) = e^(-x^2 / 2) / sqrt(2 pi): gelu's backward, one exp."""
    phi, e = bendc_gelu_parts(x)
    return grad * (phi + x * (e * np.float32(0.3989422804014327)))
