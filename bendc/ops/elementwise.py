"""Elementwise ops with PyTorch broadcasting.

Reference semantics are numpy float32 arithmetic, which for + - * / and sqrt
is IEEE round-to-nearest, as PyTorch's CPU kernels are: bit for bit. The VJP
rules follow PyTorch's derivatives.yaml formulas operand for operand, so that
gradients of + - * / chains are bit-identical too.
"""
from __future__ import annotations

import math

import numpy as np

from bendc.ir.types import TensorType
from bendc.ops.base import InferError, Lowering, broadcast_shapes, define_op, require_float

F32 = np.float32


def _infer_float_broadcast(name):
    def infer(types, attrs):
        require_float(types, name)
        return TensorType("f32", broadcast_shapes(*(t.shape for t in types)))

    return infer


def _f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def _binary(name, arity, reference, scalar, vjp, doc):
    define_op(
        name=name,
        arity=arity,
        infer=_infer_float_broadcast(name),
        reference=reference,
        lowering=Lowering("elementwise", scalar=scalar),
        vjp=vjp,
        doc=doc,
    )


# ------------------------------------------------------------------ + - * /
def vjp_add(b, node, grad, needs):
    """d(a+b) = (g, g)."""
    return (grad if needs[0] else None, grad if needs[1] else None)


def vjp_sub(b, node, grad, needs):
    """d(a-b) = (g, -g)."""
    return (grad if needs[0] else None, b.neg(grad) if needs[1] else None)


def vjp_mul(b, node, grad, needs):
    """d(a*b) = (g*b, g*a): PyTorch's mul_tensor_backward."""
    x, y = node.inputs
    return (b.mul(grad, y) if needs[0] else None, b.mul(grad, x) if needs[1] else None)


def vjp_div(b, node, grad, needs):
    """d(a/b) = (g/b, -g*((a/b)/b)): PyTorch's div_tensor_self/other_backward."""
    x, y = node.inputs
    grad_x = b.div(grad, y) if needs[0] else None
    grad_y = b.mul(b.neg(grad), b.div(b.div(x, y), y)) if needs[1] else None
    return (grad_x, grad_y)


_binary("add", 2, lambda v, a: _f32(np.add(v[0], v[1])), lambda a, b: f"({a} + {b})", vjp_add,
        "`%2 = add %0, %1 : f32[..]`, broadcasting.")
_binary("sub", 2, lambda v, a: _f32(np.subtract(v[0], v[1])), lambda a, b: f"({a} - {b})", vjp_sub,
        "`%2 = sub %0, %1 : f32[..]`, broadcasting.")
_binary("mul", 2, lambda v, a: _f32(np.multiply(v[0], v[1])), lambda a, b: f"({a} * {b})", vjp_mul,
        "`%2 = mul %0, %1 : f32[..]`, broadcasting.")
_binary("div", 2, lambda v, a: _f32(np.divide(v[0], v[1])), lambda a, b: f"({a} / {b})", vjp_div,
        "`%2 = div %0, %1 : f32[..]`, true division, broadcasting.")


# ------------------------------------------------------------------ unary
def _unary(name, reference, scalar, vjp, doc, method=None):
    define_op(
        name=name,
        arity=1,
        infer=_infer_float_broadcast(name),
        reference=reference,
        lowering=Lowering("elementwise", scalar=scalar),
        vjp=vjp,
        doc=doc,
        method=method,
    )


def vjp_neg(b, node, grad, needs):
    """d(-a) = -g."""
    return (b.neg(grad),)


def vjp_exp(b, node, grad, needs):
    """d exp(a) = g * exp(a), reusing the forward result."""
    return (b.mul(grad, node.id),)


def vjp_log(b, node, grad, needs):
    """d log(a) = g / a."""
    return (b.div(grad, node.inputs[0]),)


def vjp_tanh(b, node, grad, needs):
    """d tanh(a) = g * (1 - y*y): PyTorch's tanh_backward."""
    y = node.id
    return (b.mul(grad, b.sub(b.const(1.0), b.mul(y, y))),)


def vjp_sigmoid(b, node, grad, needs):
    """d sigmoid(a) = (g * (1 - y)) * y: PyTorch's sigmoid_backward."""
    y = node.id
    return (b.mul(b.mul(grad, b.sub(b.const(1.0), y)), y),)


def vjp_sqrt(b, node, grad, needs):
    """d sqrt(a) = g / (2 * y)."""
    return (b.div(grad, b.mul(b.const(2.0), node.id)),)


def vjp_relu(b, node, grad, needs):
    """d relu(a) = 0 where y <= 0, else g: PyTorch's threshold_backward."""
    zero = b.const(0.0)
    return (b.where(b.le(node.id, zero), zero, grad),)


def vjp_square(b, node, grad, needs):
    """d square(a) = g * (2 * a): PyTorch's pow_backward for the exponent 2."""
    return (b.mul(grad, b.mul(node.inputs[0], b.const(2.0))),)


def vjp_reciprocal(b, node, grad, needs):
    """d (1/a) = -g * (y * y): PyTorch's reciprocal backward."""
    y = node.id
    return (b.mul(b.neg(grad), b.mul(y, y)),)


def _reference_reciprocal(values, attrs):
    with np.errstate(divide="ignore"):
        return _f32(np.divide(F32(1.0), values[0]))


def _reference_relu(values, attrs):
    x = values[0]
    # PyTorch keeps -0.0 and NaN: relu(x) = 0 only where x < 0.
    return _f32(np.where(x < 0, F32(0.0), x))


def _reference_sigmoid(values, attrs):
    x = values[0]
    with np.errstate(over="ignore"):
        return _f32(F32(1.0) / (F32(1.0) + np.exp(-x)))


def _reference_sqrt(values, attrs):
    with np.errstate(invalid="ignore"):
        return _f32(np.sqrt(values[0]))


def _reference_log(values, attrs):
    with np.errstate(divide="ignore", invalid="ignore"):
        return _f32(np.log(values[0]))


def _reference_exp(values, attrs):
    with np.errstate(over="ignore"):
        return _f32(np.exp(values[0]))


_unary("neg", lambda v, a: _f32(np.negative(v[0])), lambda a: f"(-{a})", vjp_neg, "`%1 = neg %0`.")
_unary("exp", _reference_exp, lambda a: f"math.exp({a})", vjp_exp, "`%1 = exp %0`.")
_unary("log", _reference_log, lambda a: f"math.log({a})", vjp_log, "`%1 = log %0`.")
_unary("tanh", lambda v, a: _f32(np.tanh(v[0])), lambda a: f"math.tanh({a})", vjp_tanh, "`%1 = tanh %0`.")
_unary("sigmoid", _reference_sigmoid,
       lambda a: f"(np.float32(1.0) / (np.float32(1.0) + math.exp(-{a})))", vjp_sigmoid,
       "`%1 = sigmoid %0`: 1 / (1 + exp(-x)).")
_unary("reciprocal", _reference_reciprocal, lambda a: f"(np.float32(1.0) / {a})", vjp_reciprocal,
       "`%1 = reciprocal %0`: 1 / x; `s / x` traces as reciprocal(x) * s, as PyTorch computes it.",
       method="reciprocal")
_unary("square", lambda v, a: _f32(np.multiply(v[0], v[0])), lambda a: f"({a} * {a})", vjp_square,
       "`%1 = square %0`: x * x (torch.square).", method="square")
_unary("sqrt", _reference_sqrt, lambda a: f"math.sqrt({a})", vjp_sqrt, "`%1 = sqrt %0`.")
_unary("relu", _reference_relu, lambda a: f"(np.float32(0.0) if {a} < np.float32(0.0) else {a})",
       vjp_relu, "`%1 = relu %0`: 0 where x < 0, else x (keeps -0.0 and NaN as PyTorch does).")


# ------------------------------------------------------------------ gelu
_SQRT1_2 = 1.0 / math.sqrt(2.0)
_GELU_TANH_BETA = math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5
_GELU_TANH_KAPPA = 0.044715
_GELU_PDF_BETA = (2.0 / math.sqrt(math.pi)) * _SQRT1_2 * 0.5
_erf = np.vectorize(math.erf, otypes=[np.float64])


def _check_approximate(attrs):
    if attrs.get("approximate") not in ("none", "tanh"):
        raise InferError(f"approximate must be 'none' or 'tanh', got {attrs.get('approximate')!r}",
                         unsupported=True)


def _infer_gelu(types, attrs):
    _check_approximate(attrs)
    return _infer_float_broadcast("gelu")(types, attrs)


def _reference_gelu(values, attrs):
    x = values[0].astype(np.float64)
    if attrs["approximate"] == "tanh":
        inner = _GELU_TANH_BETA * (x + _GELU_TANH_KAPPA * x * x * x)
        return _f32(0.5 * x * (1.0 + np.tanh(inner)))
    return _f32(x * 0.5 * (1.0 + _erf(x * _SQRT1_2)))


def _reference_gelu_vjp(values, attrs):
    grad, x = (v.astype(np.float64) for v in values)
    if attrs["approximate"] == "tanh":
        x_sq = x * x
        inner = _GELU_TANH_BETA * (x + _GELU_TANH_KAPPA * x_sq * x)
        tanh_inner = np.tanh(inner)
        left_derivative = 0.5 * (1.0 + tanh_inner)
        right_derivative = 0.5 * x * (1.0 - tanh_inner * tanh_inner) * _GELU_TANH_BETA * (
            1.0 + 3.0 * _GELU_TANH_KAPPA * x_sq)
        return _f32(grad * (left_derivative + right_derivative))
    cdf = 0.5 * (1.0 + _erf(x * _SQRT1_2))
    pdf = np.exp(-0.5 * x * x) * _GELU_PDF_BETA
    return _f32(grad * (cdf + x * pdf))


def vjp_gelu(b, node, grad, needs):
    """d gelu(a) = gelu_vjp(g, a): PyTorch's gelu_backward as one elementwise op."""
    return (b.emit("gelu_vjp", (grad, node.inputs[0]), approximate=node.attr["approximate"]),)


def _scalar_gelu(a, *, approximate):
    if approximate == "tanh":
        inner = f"np.float32({_GELU_TANH_BETA!r}) * ({a} + np.float32({_GELU_TANH_KAPPA!r}) * {a} * {a} * {a})"
        return f"(np.float32(0.5) * {a} * (np.float32(1.0) + math.tanh({inner})))"
    return f"({a} * np.float32(0.5) * (np.float32(1.0) + math.erf({a} * np.float32({_SQRT1_2!r}))))"


def _scalar_gelu_vjp(grad, a, *, approximate):
    """PyTorch's gelu_backward in float32; operands are plain names (codegen assigns each value once)."""
    def c(value: float) -> str:
        return f"np.float32({value!r})"

    if approximate == "tanh":
        inner = f"{c(_GELU_TANH_BETA)} * ({a} + {c(_GELU_TANH_KAPPA)} * {a} * {a} * {a})"
        tanh_inner = f"math.tanh({inner})"
        left = f"{c(0.5)} * ({c(1.0)} + {tanh_inner})"
        right = (f"{c(0.5)} * {a} * ({c(1.0)} - {tanh_inner} * {tanh_inner}) * {c(_GELU_TANH_BETA)}"
                 f" * ({c(1.0)} + {c(3.0 * _GELU_TANH_KAPPA)} * {a} * {a})")
        return f"({grad} * ({left} + {right}))"
    cdf = f"{c(0.5)} * ({c(1.0)} + math.erf({a} * {c(_SQRT1_2)}))"
    pdf = f"math.exp({c(-0.5)} * {a} * {a}) * {c(_GELU_PDF_BETA)}"
    return f"({grad} * ({cdf} + {a} * {pdf}))"


def _cpu_gelu(a, *, approximate):
    """The CPU's gelu: templates/cpu_math.py bendc_gelu (Phi through erfc's scaled form, one exp)."""
    return f"bendc_gelu({a})" if approximate == "none" else None


def _cpu_gelu_vjp(grad, a, *, approximate):
    """The CPU's gelu backward: bendc_gelu_vjp, whose cdf and pdf share one exp."""
    return f"bendc_gelu_vjp({grad}, {a})" if approximate == "none" else None


define_op(
    name="gelu",
    arity=1,
    infer=_infer_gelu,
    reference=_reference_gelu,
    lowering=Lowering("elementwise", scalar=_scalar_gelu, cpu_scalar=_cpu_gelu),
    vjp=vjp_gelu,
    attr_names=("approximate",),
    doc="`%1 = gelu[approximate=\"none\"] %0`: x * Phi(x), or the tanh approximation.",
)


def _infer_gelu_vjp(types, attrs):
    _check_approximate(attrs)
    require_float(types, "gelu_vjp")
    if types[0].shape != types[1].shape:
        raise InferError("gelu_vjp needs the gradient and input of one shape")
    return types[0]


define_op(
    name="gelu_vjp",
    arity=2,
    infer=_infer_gelu_vjp,
    reference=_reference_gelu_vjp,
    lowering=Lowering("elementwise", scalar=_scalar_gelu_vjp, cpu_scalar=_cpu_gelu_vjp),
    no_vjp="second derivatives of gelu are not supported (bendc has no create_graph)",
    attr_names=("approximate",),
    doc="`%2 = gelu_vjp[approximate=\"none\"] %g, %x`: PyTorch's gelu_backward.",
)


# ------------------------------------------------------------------ compare and select
def _infer_le(types, attrs):
    """Float32 with float32 or integer with integer operands, as lt/gt/ge/eq/ne (bendc/ops/pointwise.py)."""
    if not (all(t.is_float for t in types) or all(t.is_index for t in types)):
        raise InferError(f"le compares float32 with float32 or integer with integer operands, got "
                         f"{', '.join(map(str, types))}", unsupported=True)
    return TensorType("bool", broadcast_shapes(*(t.shape for t in types)))


define_op(
    name="le",
    arity=2,
    infer=_infer_le,
    reference=lambda v, a: np.asarray(np.less_equal(v[0], v[1])),
    lowering=Lowering("elementwise", scalar=lambda a, b: f"({a} <= {b})"),
    no_vjp="a comparison has a boolean result",
    doc="`%2 = le %0, %1 : bool[..]`: a <= b, broadcasting (NaN compares false).",
)


def _infer_where(types, attrs):
    cond, a, b = types
    if cond.dtype != "bool":
        raise InferError(f"where needs a bool condition, got {cond}", unsupported=True)
    if not (a.is_index and a.dtype == b.dtype):  # two integer operands of one dtype: an integer result
        require_float((a, b), "where")
    return TensorType(a.dtype, broadcast_shapes(cond.shape, a.shape, b.shape))


def vjp_where(b, node, grad, needs):
    """d where(c, a, b) = (where(c, g, 0), where(c, 0, g))."""
    cond = node.inputs[0]
    zero = b.const(0.0)
    grad_a = b.where(cond, grad, zero) if needs[1] else None
    grad_b = b.where(cond, zero, grad) if needs[2] else None
    return (None, grad_a, grad_b)


define_op(
    name="where",
    arity=3,
    infer=_infer_where,
    reference=lambda v, a: np.asarray(np.where(v[0], v[1], v[2]), dtype=v[1].dtype),
    lowering=Lowering("elementwise", scalar=lambda c, a, b: f"({a} if {c} else {b})"),
    vjp=vjp_where,
    doc="`%3 = where %c, %a, %b : f32[..]`: a where c, else b (float32, or two integer operands of one dtype).",
)
