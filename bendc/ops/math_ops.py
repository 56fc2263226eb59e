"""Everyday elementwise math (issue 22): maximum/minimum/fmax/fmin, isnan/isinf/isfinite/nan_to_num,
floor/ceil/round/trunc/frac, the trigonometric and hyperbolic functions, erf/erfc, exp2/log2/log10/
log1p/expm1, atan2 and lerp, each with torch's semantics and derivatives.yaml's VJP operand for
operand.

Reference semantics: transcendentals are computed in float64 and rounded once (correctly rounded
nearly always); torch's CPU kernels (SLEEF, 1 ulp) and the generated kernels (libm's float32
functions on cpu, libdevice on cuda) are within a few ulp of it, not bit for bit. Rounding, the
selections and the classifications are exact everywhere.

Lowering: each op is ``elementwise``; its ``scalar`` renders one cell's float32 expression for both
targets (``math.*`` calls, which numba types as float32 for float32 operands). The roundings avoid
``math.floor``/``math.ceil`` (numba returns an int64 from them): ``(|x| + 2**23) - 2**23`` rounds
|x| < 2**23 to the nearest integer, ties to even (float32 has no fraction bits from 2**23 on), and
the other roundings adjust that by one and take x's sign (each result has the sign of x, -0.0
included, as torch gives it); |x| >= 2**23, infinities and NaN are their own rounding.
"""
from __future__ import annotations

import math

import numpy as np

from bendc.ir.types import TensorType
from bendc.ops.base import InferError, Lowering, define_op, require_float
from bendc.ops.elementwise import _infer_float_broadcast as _infer_float

F32 = np.float32


def _f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def _c(value: float) -> str:
    """A float32 literal of generated source."""
    return f"np.float32({float(value)!r})"


def _wide(function):
    """A reference computed in float64 and rounded once to float32."""
    def reference(values, attrs):
        with np.errstate(all="ignore"):
            return _f32(function(*(np.asarray(v, dtype=np.float64) for v in values)))

    return reference


def _zeros_like(b, value: int) -> int:
    """+0.0 of ``value``'s shape: the gradient torch's zeros_like gives."""
    return b.expand(b.const(0.0), b.shape(value))


# ------------------------------------------------------------------ maximum, minimum, fmax, fmin
def vjp_maximum(b, node, grad, needs):
    """derivatives.yaml: self gets where(a == b, g / 2, g) masked to 0 where a < b; other the same
    masked where a > b (a tie splits g evenly; a NaN passes g to both)."""
    x, y = node.inputs
    zero = b.const(0.0)
    shared = b.where(b.emit("eq", (x, y)), b.div(grad, b.const(2.0)), grad)
    lower, upper = ("lt", "gt") if node.op == "maximum" else ("gt", "lt")
    grad_x = b.where(b.emit(lower, (x, y)), zero, shared) if needs[0] else None
    grad_y = b.where(b.emit(upper, (x, y)), zero, shared) if needs[1] else None
    return (grad_x, grad_y)


def vjp_fmax(b, node, grad, needs):
    """derivatives.yaml: self gets g where a >= b (a <= b for fmin) or b is NaN, other the rest."""
    x, y = node.inputs
    zero = b.const(0.0)
    kept = b.emit("ge" if node.op == "fmax" else "le", (x, y))
    other_nan = b.emit("isnan", (y,))
    grad_x = b.where(kept, grad, b.where(other_nan, grad, zero)) if needs[0] else None
    grad_y = b.where(kept, zero, b.where(other_nan, zero, grad)) if needs[1] else None
    return (grad_x, grad_y)


def _binary(name, reference, scalar, vjp, doc):
    define_op(name=name, arity=2, infer=_infer_float(name), reference=reference,
              lowering=Lowering("elementwise", scalar=scalar), vjp=vjp, doc=doc, method=name)


def _reference_select(keep_first):
    """a where ``keep_first(a, b)``, else b: the scalar renderers' rule exactly (numpy's maximum picks
    either zero of a -0.0/+0.0 tie depending on its SIMD path; torch's CPU kernels do too)."""
    def reference(values, attrs):
        a, b = np.broadcast_arrays(_f32(values[0]), _f32(values[1]))
        with np.errstate(invalid="ignore"):
            return _f32(np.where(keep_first(a, b), a, b))

    return reference


_binary("maximum", _reference_select(lambda a, b: (a >= b) | np.isnan(a)), lambda a, b: f"({a} if ({a} >= {b} or {a} != {a}) else {b})",
        vjp_maximum, "`%2 = maximum %0, %1`: the larger of a and b, NaN if either is NaN (torch.maximum); "
        "a tie of -0.0 and +0.0 gives a.")
_binary("minimum", _reference_select(lambda a, b: (a <= b) | np.isnan(a)), lambda a, b: f"({a} if ({a} <= {b} or {a} != {a}) else {b})",
        vjp_maximum, "`%2 = minimum %0, %1`: the smaller of a and b, NaN if either is NaN (torch.minimum); "
        "a tie of -0.0 and +0.0 gives a.")
_binary("fmax", _reference_select(lambda a, b: (a >= b) | np.isnan(b)), lambda a, b: f"({a} if ({a} >= {b} or {b} != {b}) else {b})",
        vjp_fmax, "`%2 = fmax %0, %1`: the larger of a and b, a NaN ignored (NaN only if both are; torch.fmax); "
        "a tie of -0.0 and +0.0 gives a.")
_binary("fmin", _reference_select(lambda a, b: (a <= b) | np.isnan(b)), lambda a, b: f"({a} if ({a} <= {b} or {b} != {b}) else {b})",
        vjp_fmax, "`%2 = fmin %0, %1`: the smaller of a and b, a NaN ignored (NaN only if both are; torch.fmin); "
        "a tie of -0.0 and +0.0 gives a.")


# ------------------------------------------------------------------ isnan, isinf, isfinite, nan_to_num
def _infer_classify(name):
    def infer(types, attrs):
        require_float(types, name)
        return TensorType("bool", types[0].shape)

    return infer


def _classify(name, reference, scalar, doc):
    define_op(name=name, arity=1, infer=_infer_classify(name), reference=lambda v, a: np.asarray(reference(v[0])),
              lowering=Lowering("elementwise", scalar=scalar), no_vjp="a classification has a boolean result",
              doc=doc, method=name)


_classify("isnan", np.isnan, lambda a: f"({a} != {a})", "`%1 = isnan %0 : bool[..]`: x is NaN (torch.isnan).")
_classify("isinf", np.isinf, lambda a: f"math.isinf({a})", "`%1 = isinf %0 : bool[..]`: x is +-inf (torch.isinf).")
_classify("isfinite", np.isfinite, lambda a: f"math.isfinite({a})",
          "`%1 = isfinite %0 : bool[..]`: x is neither NaN nor +-inf (torch.isfinite).")


def _infer_nan_to_num(types, attrs):
    for key in ("nan", "posinf", "neginf"):
        value = attrs.get(key)
        if isinstance(value, bool) or not isinstance(value, float):
            raise InferError(f"nan_to_num needs a float {key}, got {value!r}")
    require_float(types, "nan_to_num")
    return types[0]


def _reference_nan_to_num(values, attrs):
    x = _f32(values[0])
    replaced = np.where(np.isnan(x), F32(attrs["nan"]), x)
    replaced = np.where(x == np.inf, F32(attrs["posinf"]), replaced)
    return _f32(np.where(x == -np.inf, F32(attrs["neginf"]), replaced))


def _scalar_nan_to_num(a, *, nan, posinf, neginf):
    infinite = f"({_c(posinf)} if {a} > {_c(0.0)} else {_c(neginf)})"
    return f"({_c(nan)} if {a} != {a} else ({infinite} if math.isinf({a}) else {a}))"


def vjp_nan_to_num(b, node, grad, needs):
    """derivatives.yaml: g * isfinite(x) (0 where x was replaced)."""
    finite = b.emit("to_float", (b.emit("isfinite", (node.inputs[0],)),))
    return (b.mul(grad, finite),)


define_op(
    name="nan_to_num",
    arity=1,
    infer=_infer_nan_to_num,
    reference=_reference_nan_to_num,
    lowering=Lowering("elementwise", scalar=_scalar_nan_to_num),
    vjp=vjp_nan_to_num,
    attr_names=("nan", "posinf", "neginf"),
    doc="`%1 = nan_to_num[nan=0.0, posinf=3.4028234663852886e+38, neginf=-3.4028234663852886e+38] %0`: NaN, "
        "+inf and -inf replaced (torch.nan_to_num; posinf/neginf default to the float32 extremes).",
)


# ------------------------------------------------------------------ floor, ceil, round, trunc, frac
_TWO_23 = _c(8388608.0)


def _rounded_magnitude(a: str) -> str:
    """|a| rounded to the nearest integer, ties to even (for |a| < 2**23)."""
    return f"((abs({a}) + {_TWO_23}) - {_TWO_23})"


def _scalar_round(a: str) -> str:
    return f"(math.copysign({_rounded_magnitude(a)}, {a}) if abs({a}) < {_TWO_23} else {a})"


def _scalar_trunc(a: str) -> str:
    r = _rounded_magnitude(a)
    down = f"({r} - {_c(1.0)} if {r} > abs({a}) else {r})"
    return f"(math.copysign({down}, {a}) if abs({a}) < {_TWO_23} else {a})"


def _scalar_floor(a: str) -> str:
    r = f"math.copysign({_rounded_magnitude(a)}, {a})"
    down = f"({r} - {_c(1.0)} if {r} > {a} else {r})"
    return f"(math.copysign({down}, {a}) if abs({a}) < {_TWO_23} else {a})"


def _scalar_ceil(a: str) -> str:
    r = f"math.copysign({_rounded_magnitude(a)}, {a})"
    up = f"({r} + {_c(1.0)} if {r} < {a} else {r})"
    return f"(math.copysign({up}, {a}) if abs({a}) < {_TWO_23} else {a})"


def vjp_rounding(b, node, grad, needs):
    """derivatives.yaml: floor, ceil, round and trunc have a zero gradient (zeros_like(grad))."""
    return (_zeros_like(b, node.inputs[0]),)


def vjp_identity(b, node, grad, needs):
    """derivatives.yaml: frac's gradient is g."""
    return (grad,)


def _unary(name, reference, scalar, vjp, doc):
    define_op(name=name, arity=1, infer=_infer_float(name), reference=reference,
              lowering=Lowering("elementwise", scalar=scalar), vjp=vjp, doc=doc, method=name)


def _reference_exact(numpy_fn):
    return lambda values, attrs: _f32(numpy_fn(_f32(values[0])))


_unary("floor", _reference_exact(np.floor), _scalar_floor, vjp_rounding,
       "`%1 = floor %0`: the largest integer <= x (torch.floor); its gradient is zeros.")
_unary("ceil", _reference_exact(np.ceil), _scalar_ceil, vjp_rounding,
       "`%1 = ceil %0`: the smallest integer >= x (torch.ceil); its gradient is zeros.")
_unary("round", _reference_exact(np.rint), _scalar_round, vjp_rounding,
       "`%1 = round %0`: x rounded to the nearest integer, ties to even (torch.round); its gradient is zeros. "
       "`x.round(decimals=d)` traces as round(x * 10**d) / 10**d.")
_unary("trunc", _reference_exact(np.trunc), _scalar_trunc, vjp_rounding,
       "`%1 = trunc %0`: x rounded towards zero (torch.trunc, torch.fix); its gradient is zeros.")


def _reference_frac(values, attrs):
    x = _f32(values[0])
    with np.errstate(invalid="ignore"):
        return _f32(x - np.trunc(x))


_unary("frac", _reference_frac, lambda a: f"({a} - {_scalar_trunc(a)})", vjp_identity,
       "`%1 = frac %0`: x - trunc(x) (torch.frac: NaN for +-inf); its gradient is g.")


# ------------------------------------------------------------------ trigonometric and hyperbolic
def vjp_sin(b, node, grad, needs):
    """derivatives.yaml: g * cos(x)."""
    return (b.mul(grad, b.emit("cos", (node.inputs[0],))),)


def vjp_cos(b, node, grad, needs):
    """derivatives.yaml: g * -sin(x)."""
    return (b.mul(grad, b.neg(b.emit("sin", (node.inputs[0],)))),)


def vjp_tan(b, node, grad, needs):
    """derivatives.yaml: g * (1 + y**2)."""
    y = node.id
    return (b.mul(grad, b.add(b.const(1.0), b.mul(y, y))),)


def _one_minus_square(b, x: int) -> int:
    """-x * x + 1, as derivatives.yaml writes it for asin and acos."""
    return b.add(b.mul(b.neg(x), x), b.const(1.0))


def vjp_asin(b, node, grad, needs):
    """derivatives.yaml: g * rsqrt(-x * x + 1)."""
    return (b.mul(grad, b.emit("rsqrt", (_one_minus_square(b, node.inputs[0]),))),)


def vjp_acos(b, node, grad, needs):
    """derivatives.yaml: g * -rsqrt(-x * x + 1)."""
    return (b.mul(grad, b.neg(b.emit("rsqrt", (_one_minus_square(b, node.inputs[0]),)))),)


def vjp_atan(b, node, grad, needs):
    """derivatives.yaml: g / (x * x + 1)."""
    x = node.inputs[0]
    return (b.div(grad, b.add(b.mul(x, x), b.const(1.0))),)


def vjp_sinh(b, node, grad, needs):
    """derivatives.yaml: g * cosh(x)."""
    return (b.mul(grad, b.emit("cosh", (node.inputs[0],))),)


def vjp_cosh(b, node, grad, needs):
    """derivatives.yaml: g * sinh(x)."""
    return (b.mul(grad, b.emit("sinh", (node.inputs[0],))),)


for _name, _numpy, _vjp, _text in (
        ("sin", np.sin, vjp_sin, "sine"), ("cos", np.cos, vjp_cos, "cosine"), ("tan", np.tan, vjp_tan, "tangent"),
        ("asin", np.arcsin, vjp_asin, "arcsine, NaN outside [-1, 1]"),
        ("acos", np.arccos, vjp_acos, "arccosine, NaN outside [-1, 1]"), ("atan", np.arctan, vjp_atan, "arctangent"),
        ("sinh", np.sinh, vjp_sinh, "hyperbolic sine"), ("cosh", np.cosh, vjp_cosh, "hyperbolic cosine")):
    _unary(_name, _wide(_numpy), (lambda function: lambda a: f"math.{function}({a})")(_name), _vjp,
           f"`%1 = {_name} %0`: the {_text} (torch.{_name}).")


def vjp_atan2(b, node, grad, needs):
    """derivatives.yaml's atan2_backward: r = 1 / (a * a + b * b); (g * b * r, g * -a * r)."""
    x, y = node.inputs
    recip = b.emit("reciprocal", (b.add(b.mul(x, x), b.mul(y, y)),))
    grad_x = b.mul(b.mul(grad, y), recip) if needs[0] else None
    grad_y = b.mul(b.mul(grad, b.neg(x)), recip) if needs[1] else None
    return (grad_x, grad_y)


_binary("atan2", _wide(np.arctan2), lambda a, b: f"math.atan2({a}, {b})", vjp_atan2,
        "`%2 = atan2 %0, %1`: the angle of (b, a) in (-pi, pi] (torch.atan2), broadcasting.")


# ------------------------------------------------------------------ erf, erfc, exp2, logs, expm1
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_erf = np.vectorize(math.erf, otypes=[np.float64])
_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _vjp_erf(sign: float):
    def vjp(b, node, grad, needs):
        x = node.inputs[0]
        gaussian = b.mul(b.const(sign * _TWO_OVER_SQRT_PI), b.emit("exp", (b.neg(b.mul(x, x)),)))
        return (b.mul(gaussian, grad),)

    return vjp


vjp_erf = _vjp_erf(1.0)
vjp_erf.__doc__ = "derivatives.yaml: 2 / sqrt(pi) * exp(-(x * x)) * g."
vjp_erfc = _vjp_erf(-1.0)
vjp_erfc.__doc__ = "derivatives.yaml: -2 / sqrt(pi) * exp(-(x * x)) * g."


def vjp_exp2(b, node, grad, needs):
    """derivatives.yaml: g * y * ln 2."""
    return (b.mul(b.mul(grad, node.id), b.const(math.log(2.0))),)


def _vjp_log_base(base: float):
    def vjp(b, node, grad, needs):
        return (b.div(grad, b.mul(node.inputs[0], b.const(math.log(base)))),)

    return vjp


vjp_log2 = _vjp_log_base(2.0)
vjp_log2.__doc__ = "derivatives.yaml: g / (x * ln 2)."
vjp_log10 = _vjp_log_base(10.0)
vjp_log10.__doc__ = "derivatives.yaml: g / (x * ln 10)."


def vjp_log1p(b, node, grad, needs):
    """derivatives.yaml's log1p_backward: g / (x + 1)."""
    return (b.div(grad, b.add(node.inputs[0], b.const(1.0))),)


def vjp_expm1(b, node, grad, needs):
    """derivatives.yaml: g * (y + 1)."""
    return (b.mul(grad, b.add(node.id, b.const(1.0))),)


_unary("erf", _wide(_erf), lambda a: f"math.erf({a})", vjp_erf, "`%1 = erf %0`: the error function (torch.erf).")
_unary("erfc", _wide(_erfc), lambda a: f"math.erfc({a})", vjp_erfc,
       "`%1 = erfc %0`: 1 - erf(x), accurate where erf(x) is near 1 (torch.erfc).")
_unary("exp2", _wide(np.exp2), lambda a: f"math.pow({_c(2.0)}, {a})", vjp_exp2, "`%1 = exp2 %0`: 2 ** x (torch.exp2).")
_unary("log2", _wide(np.log2), lambda a: f"math.log2({a})", vjp_log2, "`%1 = log2 %0`: the base-2 logarithm (torch.log2).")
_unary("log10", _wide(np.log10), lambda a: f"math.log10({a})", vjp_log10,
       "`%1 = log10 %0`: the base-10 logarithm (torch.log10).")
_unary("log1p", _wide(np.log1p), lambda a: f"math.log1p({a})", vjp_log1p,
       "`%1 = log1p %0`: log(1 + x), accurate for small x (torch.log1p).")
_unary("expm1", _wide(np.expm1), lambda a: f"math.expm1({a})", vjp_expm1,
       "`%1 = expm1 %0`: exp(x) - 1, accurate for small x (torch.expm1).")


# ------------------------------------------------------------------ lerp
def _reference_lerp(values, attrs):
    start, end, weight = (_f32(v) for v in values)
    with np.errstate(all="ignore"):
        small = start + weight * (end - start)
        large = end - (end - start) * (F32(1.0) - weight)
        return _f32(np.where(np.abs(weight) < F32(0.5), small, large))


def _scalar_lerp(start, end, weight):
    small = f"{start} + {weight} * ({end} - {start})"
    large = f"{end} - ({end} - {start}) * ({_c(1.0)} - {weight})"
    return f"({small} if abs({weight}) < {_c(0.5)} else {large})"


def vjp_lerp(b, node, grad, needs):
    """derivatives.yaml: (g * (1 - w), g * w, g * (end - start)); a number weight's 1 - w in float64."""
    start, end, weight = node.inputs
    grad_start = grad_end = grad_weight = None
    weight_node = b.graph.node(weight)
    if needs[0]:
        if weight_node.op == "const":
            grad_start = b.mul(grad, b.const(1.0 - weight_node.attr["value"]))
        else:
            grad_start = b.mul(grad, b.sub(b.const(1.0), weight))
    if needs[1]:
        grad_end = b.mul(grad, weight)
    if needs[2]:
        grad_weight = b.mul(grad, b.sub(end, start))
    return (grad_start, grad_end, grad_weight)


define_op(
    name="lerp",
    arity=3,
    infer=_infer_float("lerp"),
    reference=_reference_lerp,
    lowering=Lowering("elementwise", scalar=_scalar_lerp),
    vjp=vjp_lerp,
    method="lerp",
    doc="`%3 = lerp %start, %end, %weight`: start + w * (end - start) where |w| < 0.5, else "
        "end - (end - start) * (1 - w) (torch.lerp; a number weight is a constant), broadcasting.",
)


# ------------------------------------------------------------------ floor_divide, remainder (float32)
# floor_divide is torch's float32 algorithm step by step (div_floor_floating_vec), in the helper
# bendc_floor_divide (bendc/kernels/templates/floordiv.py) on both targets and _floor_divide32 below in
# the reference: bit for bit, also where |a / b| >= 2**24 (torch's float32 a - fmod(a, b) rounds there).
# remainder is torch's too (fmod(a, b), plus b where it is nonzero and its sign differs from b's):
# numba's float ``%`` is CPython's algorithm in float64 from the float32 operands, fmod is exact and
# the one further add rounds to float64 and then to float32, which is the float32 rounding (53 >= 2 * 24
# + 2 bits). Where ``%`` gives a zero, torch keeps fmod's zero (the sign of a), CPython takes the sign
# of b; a zero divisor gives NaN. torch's vectorized remainder is NaN where a / b overflows float32
# (1e30 % 1e-30); bendc gives the exact remainder there.
def _scalar_floor_divide(a: str, b: str) -> str:
    return f"bendc_floor_divide(np.float32({a}), np.float32({b}))"


def _floor_divide32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """bendc_floor_divide over arrays (float32 a, b of one shape), each step rounded to float32."""
    with np.errstate(all="ignore"):
        quotient = _f32(a / b)
        mod = _f32(np.fmod(a, b))
        floor = np.where(np.isinf(quotient) & ~np.isinf(a), a, _f32(a - mod))
        div = _f32(floor / b)
        div = np.where((mod != 0) & ((b < 0) != (mod < 0)), _f32(div - np.float32(1.0)), div)
        floored = _f32(np.floor(div))
        floored = np.where(_f32(div - floored) > np.float32(0.5), _f32(floored + np.float32(1.0)), floored)
        floored = np.where(div == 0, np.copysign(np.float32(0.0), quotient), floored)
        return _f32(np.where(b == 0, quotient, floored))


def _scalar_remainder(a: str, b: str) -> str:
    r = f"np.float32({a} % {b})"
    return f"({r} if {r} != {_c(0.0)} else math.copysign({_c(0.0)}, {a}))"


def _reference_floor_divide(values, attrs):
    a, b = np.broadcast_arrays(_f32(values[0]), _f32(values[1]))
    return _floor_divide32(a, b)


def _reference_remainder(values, attrs):
    a, b = np.broadcast_arrays(_f32(values[0]), _f32(values[1]))
    with np.errstate(all="ignore"):
        r = _f32(np.remainder(a.astype(np.float64), b.astype(np.float64)))
        return _f32(np.where(r != 0, r, np.copysign(np.float32(0.0), a)))


def vjp_remainder(b, node, grad, needs):
    """derivatives.yaml: self gets g, other -g * floor_divide(self, other)."""
    x, y = node.inputs
    grad_y = b.mul(b.neg(grad), b.emit("floor_divide", (x, y))) if needs[1] else None
    return (grad if needs[0] else None, grad_y)


def vjp_floor_divide(b, node, grad, needs):
    """torch defines no derivative for floor_divide and refuses a backward through it: so does bendc,
    naming the line (only where a gradient reaches the op)."""
    from bendc.errors import UnsupportedError

    raise UnsupportedError("floor_divide (//) of float tensors has no derivative (torch: 'derivative for "
                           "aten::floor_divide is not implemented'); detach() its operands or its result",
                           loc=node.loc, op="floor_divide")


define_op(name="floor_divide", arity=2, infer=_infer_float("floor_divide"), reference=_reference_floor_divide,
          lowering=Lowering("elementwise", scalar=_scalar_floor_divide), vjp=vjp_floor_divide,
          doc="`%2 = floor_divide %0, %1`: float a // b, the quotient rounded down (torch.floor_divide: its "
              "float32 steps, bit for bit also where |a / b| >= 2**24; a / b where b is 0); a backward through "
              "it is refused, as torch refuses it.")
define_op(name="remainder", arity=2, infer=_infer_float("remainder"), reference=_reference_remainder,
          lowering=Lowering("elementwise", scalar=_scalar_remainder), vjp=vjp_remainder,
          doc="`%2 = remainder %0, %1`: float a % b with the sign of b (torch.remainder: fmod(a, b), plus b "
              "where their signs differ); its gradient is g and -g * (a // b).")
