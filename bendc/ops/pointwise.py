"""Comparisons, casts, abs/sign/clamp, powers and the triangular masks (the op-coverage issue).

Comparisons give ``bool`` values (``x > y``); the front end promotes a bool operand of arithmetic
to float32 with ``to_float``, as PyTorch does. The VJP rules follow PyTorch's derivatives.yaml
(``clamp_backward``, ``clamp_backward_min_max``, ``pow_backward``, ``pow_backward_self``,
``pow_backward_exponent``, rsqrt's ``-0.5 * grad * result.pow(3)``) operand for operand.
"""
from __future__ import annotations

import numpy as np

from bendc.ir.types import TensorType
from bendc.kernels import cuda_kit as kit
from bendc.ops.base import InferError, Lowering, broadcast_shapes, define_op, require_float
from bendc.ops.elementwise import _infer_float_broadcast as _infer_float

F32 = np.float32


def _f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def _c(value: float) -> str:
    """A float32 literal of generated source."""
    return f"np.float32({float(value)!r})"


def _zeros_like(b, value: int) -> int:
    """+0.0 of ``value``'s shape (a constant broadcast): the gradient PyTorch's zeros_like gives."""
    return b.expand(b.const(0.0), b.shape(value))


# ------------------------------------------------------------------ comparisons
def _infer_compare(name):
    def infer(types, attrs):
        if not (all(t.is_float for t in types) or all(t.is_index for t in types)):
            raise InferError(f"{name} compares float32 with float32 or integer with integer operands, got "
                             f"{', '.join(map(str, types))}", unsupported=True)
        return TensorType("bool", broadcast_shapes(*(t.shape for t in types)))

    return infer


def _compare(name, numpy_fn, symbol):
    define_op(
        name=name,
        arity=2,
        infer=_infer_compare(name),
        reference=lambda v, a: np.asarray(numpy_fn(v[0], v[1])),
        lowering=Lowering("elementwise", scalar=lambda a, b: f"({a} {symbol} {b})"),
        no_vjp="a comparison has a boolean result",
        doc=f"`%2 = {name} %0, %1 : bool[..]`: a {symbol} b, broadcasting (NaN compares false, != true).",
    )


_compare("lt", np.less, "<")
_compare("gt", np.greater, ">")
_compare("ge", np.greater_equal, ">=")
_compare("eq", np.equal, "==")
_compare("ne", np.not_equal, "!=")


# ------------------------------------------------------------------ casts and detach
def _infer_to_float(types, attrs):
    (x,) = types
    if x.dtype not in ("bool", "i64", "i32"):
        raise InferError(f"to_float casts a bool or integer tensor, got {x}", unsupported=True)
    return TensorType("f32", x.shape)


define_op(
    name="to_float",
    arity=1,
    infer=_infer_to_float,
    reference=lambda v, a: _f32(v[0]),
    lowering=Lowering("elementwise", scalar=lambda a: f"np.float32({a})"),
    no_vjp="a bool or integer operand has no gradient",
    doc="`%1 = to_float %0 : f32[..]`: a bool (1.0 / 0.0) or integer tensor as float32 (x.float(), and "
        "a bool operand of arithmetic, as PyTorch promotes it).",
)


define_op(
    name="detach",
    arity=1,
    infer=_infer_float("detach"),
    reference=lambda v, a: _f32(v[0]).copy(),
    lowering=Lowering("elementwise", scalar=lambda a: a),
    no_vjp="detach stops gradients (x.detach() requires no grad)",
    doc="`%1 = detach %0`: the same values, requiring no gradient (x.detach()).",
)


# ------------------------------------------------------------------ abs, sign
def _reference_sign(values, attrs):
    x = values[0]
    # PyTorch's (0 < x) - (x < 0): +0.0 for -0.0 and NaN.
    return _f32((x > 0).astype(np.float32) - (x < 0).astype(np.float32))


def _scalar_sign(a):
    return f"({_c(1.0)} if {a} > {_c(0.0)} else ({_c(-1.0)} if {a} < {_c(0.0)} else {_c(0.0)}))"


def vjp_abs(b, node, grad, needs):
    """d |a| = g * sgn(a): PyTorch's abs backward (0 at a = 0 and at NaN)."""
    return (b.mul(grad, b.emit("sign", (node.inputs[0],))),)


def vjp_sign(b, node, grad, needs):
    """d sign(a) = zeros: PyTorch's sign backward."""
    return (_zeros_like(b, node.inputs[0]),)


define_op(
    name="abs",
    arity=1,
    infer=_infer_float("abs"),
    reference=lambda v, a: _f32(np.abs(v[0])),
    lowering=Lowering("elementwise", scalar=lambda a: f"abs({a})"),
    vjp=vjp_abs,
    method="abs",
    doc="`%1 = abs %0`: |x| (torch.abs); the gradient is g * sign(x), 0 at x = 0.",
)

define_op(
    name="sign",
    arity=1,
    infer=_infer_float("sign"),
    reference=_reference_sign,
    lowering=Lowering("elementwise", scalar=_scalar_sign),
    vjp=vjp_sign,
    method="sign",
    doc="`%1 = sign %0`: 1, -1 or 0 (torch.sign: 0 for -0.0 and NaN); its gradient is zeros.",
)


# ------------------------------------------------------------------ clamp
def _reference_clamp(values, attrs):
    x, low, high = values
    with np.errstate(invalid="ignore"):
        lifted = np.where(x < low, low, x)
        clamped = np.where(high < lifted, high, lifted)
        nan_bound = np.isnan(low) | np.isnan(high)
        return _f32(np.where(nan_bound, np.float32(np.nan), clamped))


def _scalar_clamp(a, low, high, *, lower, upper):
    lifted = f"({low} if {a} < {low} else {a})"
    clamped = f"({high} if {high} < {lifted} else {lifted})"
    return f"({a} + {low} + {high} if ({low} != {low} or {high} != {high}) else {clamped})"


def vjp_clamp(b, node, grad, needs):
    """PyTorch's clamp_backward / clamp_backward_min_max: the gradient passes to x where
    min <= x <= max (both ends included), to a tensor min where x < min (and min < max), to a
    tensor max where x > max (or max < min); bounds not given are +-inf and get nothing."""
    x, low, high = node.inputs
    lower, upper = node.attr["lower"], node.attr["upper"]
    zero = b.const(0.0)
    grad_x = grad_low = grad_high = None
    if needs[0]:
        grad_x = grad
        if upper:
            grad_x = b.where(b.le(x, high), grad_x, zero)
        if lower:
            grad_x = b.where(b.emit("ge", (x, low)), grad_x, zero)
    if needs[1] and lower:
        grad_low = b.where(b.emit("lt", (x, low)), grad, zero)
        if upper:
            grad_low = b.where(b.emit("lt", (low, high)), grad_low, zero)
    if needs[2] and upper:
        beyond = b.where(b.emit("gt", (x, high)), grad, zero)
        grad_high = b.where(b.emit("lt", (high, low)), grad, beyond) if lower else beyond
    return (grad_x, grad_low, grad_high)


define_op(
    name="clamp",
    arity=3,
    infer=_infer_float("clamp"),
    reference=_reference_clamp,
    lowering=Lowering("elementwise", scalar=_scalar_clamp),
    vjp=vjp_clamp,
    attr_names=("lower", "upper"),
    doc="`%3 = clamp[lower=True, upper=True] %x, %min, %max`: min(max(x, min), max), NaN kept "
        "(torch.clamp); a bound not given is -inf / +inf (lower/upper False).",
)


# ------------------------------------------------------------------ rsqrt
def _reference_rsqrt(values, attrs):
    with np.errstate(divide="ignore", invalid="ignore"):
        root = np.sqrt(values[0].astype(np.float64)).astype(np.float32)
        return _f32(np.divide(F32(1.0), root))


def vjp_rsqrt(b, node, grad, needs):
    """d rsqrt(a) = (-0.5 * g) * (y * y * y): PyTorch's -0.5 * grad * result.pow(3)."""
    y = node.id
    return (b.mul(b.mul(b.const(-0.5), grad), b.mul(b.mul(y, y), y)),)


define_op(
    name="rsqrt",
    arity=1,
    infer=_infer_float("rsqrt"),
    reference=_reference_rsqrt,
    lowering=Lowering("elementwise", scalar=lambda a: f"({_c(1.0)} / math.sqrt({a}))"),
    vjp=vjp_rsqrt,
    method="rsqrt",
    doc="`%1 = rsqrt %0`: 1 / sqrt(x) (torch.rsqrt), sqrt correctly rounded.",
)


# ------------------------------------------------------------------ powers
# PyTorch's CPU pow with a scalar exponent computes these exponents without pow() (PowKernel.cpp):
# exponent -> (numpy reference, generated source) of x ** exponent.
_SPECIAL_POWERS = {
    0.0: (lambda x: np.ones_like(x, dtype=np.float32), lambda a: _c(1.0)),
    1.0: (lambda x: _f32(x).copy(), lambda a: a),
    2.0: (lambda x: x * x, lambda a: f"({a} * {a})"),
    3.0: (lambda x: x * x * x, lambda a: f"({a} * {a} * {a})"),
    0.5: (lambda x: np.sqrt(x.astype(np.float64)).astype(np.float32), lambda a: f"math.sqrt({a})"),
    -0.5: (lambda x: _reference_rsqrt([x], {}), lambda a: f"({_c(1.0)} / math.sqrt({a}))"),
    -1.0: (lambda x: np.divide(F32(1.0), x), lambda a: f"({_c(1.0)} / {a})"),
    -2.0: (lambda x: np.divide(F32(1.0), x * x), lambda a: f"({_c(1.0)} / ({a} * {a}))"),
}


def _reference_pow_scalar(values, attrs):
    x = values[0]
    e = float(attrs["exponent"])
    with np.errstate(all="ignore"):
        if e in _SPECIAL_POWERS:
            return _f32(_SPECIAL_POWERS[e][0](x))
        return _f32(np.power(x, F32(e)))


def _scalar_pow_scalar(a, *, exponent):
    e = float(exponent)
    if e in _SPECIAL_POWERS:
        return _SPECIAL_POWERS[e][1](a)
    return f"math.pow({a}, {_c(e)})"


def vjp_pow_scalar(b, node, grad, needs):
    """d a**e = g * (e * a.pow(e - 1)) (e - 1 in double), zeros for e = 0: PyTorch's pow_backward."""
    e = float(node.attr["exponent"])
    x = node.inputs[0]
    if e == 0.0:
        return (_zeros_like(b, x),)
    lower = x if e - 1.0 == 1.0 else b.emit("pow_scalar", (x,), exponent=e - 1.0)
    return (b.mul(grad, b.mul(b.const(e), lower)),)


def _infer_pow_scalar(types, attrs):
    exponent = attrs.get("exponent")
    if isinstance(exponent, bool) or not isinstance(exponent, float):
        raise InferError(f"pow_scalar needs a float exponent, got {exponent!r}")
    require_float(types, "pow")
    return types[0]


define_op(
    name="pow_scalar",
    arity=1,
    infer=_infer_pow_scalar,
    reference=_reference_pow_scalar,
    lowering=Lowering("elementwise", scalar=_scalar_pow_scalar),
    vjp=vjp_pow_scalar,
    attr_names=("exponent",),
    doc="`%1 = pow_scalar[exponent=1.5] %0`: x ** e for a Python number e (the exponent rounded to "
        "float32 in the kernel; 0, 1, 2, 3, 0.5, -0.5, -1 and -2 as PyTorch computes them without pow).",
)


def _reference_pow(values, attrs):
    with np.errstate(all="ignore"):
        return _f32(np.power(_f32(values[0]), _f32(values[1])))


def vjp_pow(b, node, grad, needs):
    """PyTorch's pow_backward_self: where(e == 0, 0, g * (e * a.pow(e - 1))); pow_backward_exponent:
    g * where(a == 0 and e >= 0, 0, y * log(a)), log(a) computed in double for a scalar base."""
    x, e = node.inputs
    zero = b.const(0.0)
    grad_x = grad_e = None
    if needs[0]:
        lowered = b.emit("pow", (x, b.sub(e, b.const(1.0))))
        grad_x = b.where(b.emit("eq", (e, zero)), zero, b.mul(grad, b.mul(e, lowered)))
    if needs[1]:
        base = b.graph.node(x)
        if base.op == "const":  # torch.pow(number, tensor): the number's log as a double, rounded
            with np.errstate(all="ignore"):
                log_base = float(np.log(np.float64(base.attr["value"])))
            scaled = b.mul(node.id, b.const(log_base))
            if base.attr["value"] == 0.0:
                scaled = b.where(b.emit("ge", (e, zero)), zero, scaled)
        else:
            scaled = b.mul(node.id, b.emit("log", (x,)))
            scaled = b.where(b.emit("eq", (x, zero)), b.where(b.emit("ge", (e, zero)), zero, scaled), scaled)
        grad_e = b.mul(grad, scaled)
    return (grad_x, grad_e)


define_op(
    name="pow",
    arity=2,
    infer=_infer_float("pow"),
    reference=_reference_pow,
    lowering=Lowering("elementwise", scalar=lambda a, b: f"math.pow({a}, {b})"),
    vjp=vjp_pow,
    doc="`%2 = pow %0, %1`: a ** b elementwise, broadcasting (torch.pow with a tensor exponent, and "
        "number ** tensor with the number a constant).",
)


# ------------------------------------------------------------------ tril / triu
def _infer_triangle(types, attrs):
    (x,) = types
    require_float(types, "tril" if not attrs.get("upper") else "triu")
    if x.ndim < 2:
        raise InferError(f"{'triu' if attrs.get('upper') else 'tril'} needs a tensor of at least 2 "
                         f"dimensions, got {x}")
    if not isinstance(attrs.get("diagonal"), int) or isinstance(attrs.get("diagonal"), bool):
        raise InferError(f"diagonal must be an int, got {attrs.get('diagonal')!r}")
    return x


def _reference_triangle(values, attrs):
    x = values[0]
    keep = _keep_mask(x.shape[-2], x.shape[-1], attrs["diagonal"], attrs["upper"])
    return _f32(np.where(keep, x, F32(0.0)))


def _keep_mask(rows: int, cols: int, diagonal: int, upper: bool) -> np.ndarray:
    offset = np.arange(cols)[None, :] - np.arange(rows)[:, None]
    return offset >= diagonal if upper else offset <= diagonal


def vjp_triangle(b, node, grad, needs):
    """d tril(a, k) = tril(g, k) (and triu likewise)."""
    return (b.emit("triangle", (grad,), diagonal=node.attr["diagonal"], upper=node.attr["upper"]),)


def _cpu_triangle(attrs, ins, out):
    test = ">=" if attrs["upper"] else "<="
    return ("def kernel(in0, out0):\n"
            "    rows, cols = in0.shape[-2], in0.shape[-1]\n"
            "    offset = np.arange(cols)[None, :] - np.arange(rows)[:, None]\n"
            f"    out0[...] = np.where(offset {test} {int(attrs['diagonal'])}, in0, np.float32(0.0))\n")


def _cuda_triangle(op):
    """tril/triu on cuda: one output element per thread, kept or +0.0 by its row and column."""
    split, names = kit.unflatten("cell", op.shape, "o")
    row, col = names[-2], names[-1]
    test = ">=" if op.attrs["upper"] else "<="
    body = [f"if {col} - {row} {test} {int(op.attrs['diagonal'])}:", f"    out0[cell] = {op.read(0, names)}",
            "else:", f"    out0[cell] = {_c(0.0)}"]
    body = kit.used(split, body) + body
    cells = int(np.prod(op.shape))
    what = "triu" if op.attrs["upper"] else "tril"
    source = kit.kernel_source("kernel", op.arguments, kit.grid_stride_loop(op.count(cells), body),
                               f"{what}: one output element per thread, kept or zeroed by its row and column.")
    return kit.Kernels(f"{what}[diagonal={op.attrs['diagonal']}] of [{','.join(map(str, op.shape))}]", source,
                       [kit.grid_stride_launch("kernel", cells)])


define_op(
    name="triangle",
    arity=1,
    infer=_infer_triangle,
    reference=_reference_triangle,
    lowering=Lowering("gather", cpu=_cpu_triangle, cuda=_cuda_triangle),
    vjp=vjp_triangle,
    attr_names=("diagonal", "upper"),
    doc="`%1 = triangle[diagonal=0, upper=False] %0`: torch.tril (upper=False: column - row <= diagonal "
        "kept) or torch.triu (upper=True: column - row >= diagonal kept) over the last two dims, +0.0 "
        "elsewhere.",
)
