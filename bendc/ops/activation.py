"""Activations with torch's formulas and torch's gradients at the boundaries (derivatives.yaml).

```
%1 = silu %x                                  %2 = silu_vjp %g, %x
%1 = softplus[beta=1.0, threshold=20.0] %x    %2 = softplus_vjp[beta=1.0, threshold=20.0] %g, %x
%1 = leaky_relu[negative_slope=0.01] %x       %2 = leaky_relu_vjp[negative_slope=0.01] %g, %x
%1 = elu[alpha=1.0] %x                        %2 = elu_vjp[alpha=1.0] %g, %x
%1 = hardtanh[max_val=1.0, min_val=-1.0] %x   %2 = hardtanh_vjp[max_val=1.0, min_val=-1.0] %g, %x
```

Each forward is torch's CPU kernel formula (silu: x / (1 + exp(-x)); softplus: x where x*beta >
threshold, else log1p(exp(x*beta)) / beta; leaky_relu: x where x > 0, else x * slope; elu: x where
x > 0, else expm1(x) * alpha; hardtanh: clamp). Each VJP is one elementwise op with torch's
backward formula: silu_backward g * s * (1 + x * (1 - s)); softplus_backward g * z / (z + 1),
z = exp(x*beta), or g past the threshold; leaky_relu_backward g where x > 0, else g * slope (so
g * slope at 0); elu_backward (from the input, torch's is_result=false) g * alpha * exp(x) where
x <= 0, else g; hardtanh_backward g where min < x < max strictly, else 0.
"""
from __future__ import annotations

import numpy as np

from bendc.ir.types import TensorType
from bendc.ops.base import InferError, Lowering, define_op, f32_value, require_float

F32 = np.float32


def _c(value: float) -> str:
    return f"np.float32({value!r})"


def _f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def _infer_unary(name, check=None):
    def infer(types, attrs):
        require_float(types, name)
        if check is not None:
            check(attrs)
        return types[0]

    return infer


def _infer_vjp(name, check=None):
    def infer(types, attrs):
        require_float(types, name)
        if check is not None:
            check(attrs)
        if types[0].shape != types[1].shape:
            raise InferError(f"{name} needs the gradient and input of one shape")
        return types[0]

    return infer


def _float_attrs(*names):
    def check(attrs):
        for name in names:
            value = attrs.get(name)
            if isinstance(value, bool) or not isinstance(value, float):
                raise InferError(f"{name} must be a float, got {value!r}", unsupported=True)

    return check


def _activation(name, reference, scalar, vjp_reference, vjp_scalar, vjp_doc, doc, attrs=()):
    """An activation op and its VJP op (one elementwise op each, torch's formulas)."""
    check = _float_attrs(*attrs) if attrs else None

    def vjp(b, node, grad, needs):
        return (b.emit(f"{name}_vjp", (grad, node.inputs[0]), **node.attr),)

    vjp.__name__ = f"vjp_{name}"
    vjp.__doc__ = vjp_doc
    define_op(name=name, arity=1, infer=_infer_unary(name, check), reference=reference,
              lowering=Lowering("elementwise", scalar=scalar), vjp=vjp, attr_names=tuple(sorted(attrs)), doc=doc)
    define_op(name=f"{name}_vjp", arity=2, infer=_infer_vjp(f"{name}_vjp", check), reference=vjp_reference,
              lowering=Lowering("elementwise", scalar=vjp_scalar),
              no_vjp=f"second derivatives of {name} are not supported (bendc has no create_graph)",
              attr_names=tuple(sorted(attrs)), doc=f"`%2 = {name}_vjp %g, %x`: torch's {name}_backward.")


# ------------------------------------------------------------------ silu
def _reference_silu(values, attrs):
    x = values[0]
    with np.errstate(over="ignore"):
        return _f32(x / (F32(1.0) + np.exp(-x)))


def _reference_silu_vjp(values, attrs):
    g, x = values
    with np.errstate(over="ignore"):
        s = F32(1.0) / (F32(1.0) + np.exp(-x))
    return _f32(g * s * (F32(1.0) + x * (F32(1.0) - s)))


def _scalar_silu_vjp(g, x):
    s = f"({_c(1.0)} / ({_c(1.0)} + math.exp(-{x})))"
    return f"({g} * {s} * ({_c(1.0)} + {x} * ({_c(1.0)} - {s})))"


_activation("silu", _reference_silu, lambda x: f"({x} / ({_c(1.0)} + math.exp(-{x})))",
            _reference_silu_vjp, _scalar_silu_vjp,
            "d silu(x) = silu_vjp(g, x) = g * s * (1 + x * (1 - s)), s = sigmoid(x): torch's silu_backward.",
            "`%1 = silu %0`: x / (1 + exp(-x)) (torch's silu, x * sigmoid(x)).")


# ------------------------------------------------------------------ softplus
def _reference_softplus(values, attrs):
    x = values[0]
    beta, threshold = F32(attrs["beta"]), F32(attrs["threshold"])
    scaled = x * beta
    with np.errstate(over="ignore"):
        soft = np.log1p(np.exp(scaled)) / beta
    return _f32(np.where(scaled > threshold, x, soft))


def _reference_softplus_vjp(values, attrs):
    g, x = values
    beta, threshold = F32(attrs["beta"]), F32(attrs["threshold"])
    with np.errstate(over="ignore", invalid="ignore"):
        z = np.exp(x * beta)
        soft = g * z / (z + F32(1.0))
    return _f32(np.where(x * beta > threshold, g, soft))


def _scalar_softplus(x, *, beta, threshold):
    scaled = f"({x} * {_c(beta)})"
    return f"({x} if {scaled} > {_c(threshold)} else math.log1p(math.exp({scaled})) / {_c(beta)})"


def _scalar_softplus_vjp(g, x, *, beta, threshold):
    scaled = f"({x} * {_c(beta)})"
    z = f"math.exp({scaled})"
    return f"({g} if {scaled} > {_c(threshold)} else {g} * {z} / ({z} + {_c(1.0)}))"


_activation("softplus", _reference_softplus, _scalar_softplus, _reference_softplus_vjp, _scalar_softplus_vjp,
            "d softplus(x) = g where x*beta > threshold, else g * z / (z + 1) with z = exp(x*beta): "
            "torch's softplus_backward.",
            "`%1 = softplus[beta=1.0, threshold=20.0] %0`: x where x*beta > threshold, else "
            "log1p(exp(x*beta)) / beta.", attrs=("beta", "threshold"))


# ------------------------------------------------------------------ leaky_relu
def _reference_leaky_relu(values, attrs):
    x = values[0]
    return _f32(np.where(x > F32(0.0), x, x * F32(attrs["negative_slope"])))


def _reference_leaky_relu_vjp(values, attrs):
    g, x = values
    return _f32(np.where(x > F32(0.0), g, g * F32(attrs["negative_slope"])))


_activation("leaky_relu", _reference_leaky_relu,
            lambda x, *, negative_slope: f"({x} if {x} > {_c(0.0)} else {x} * {_c(negative_slope)})",
            _reference_leaky_relu_vjp,
            lambda g, x, *, negative_slope: f"({g} if {x} > {_c(0.0)} else {g} * {_c(negative_slope)})",
            "d leaky_relu(x) = g where x > 0, else g * negative_slope (at 0 too): torch's leaky_relu_backward.",
            "`%1 = leaky_relu[negative_slope=0.01] %0`: x where x > 0, else x * negative_slope.",
            attrs=("negative_slope",))


# ------------------------------------------------------------------ elu
def _reference_elu(values, attrs):
    x = values[0]
    return _f32(np.where(x > F32(0.0), x, np.expm1(x) * F32(attrs["alpha"])))


def _reference_elu_vjp(values, attrs):
    g, x = values
    with np.errstate(over="ignore"):
        return _f32(np.where(x <= F32(0.0), g * F32(attrs["alpha"]) * np.exp(x), g))


_activation("elu", _reference_elu,
            lambda x, *, alpha: f"({x} if {x} > {_c(0.0)} else math.expm1({x}) * {_c(alpha)})",
            _reference_elu_vjp,
            lambda g, x, *, alpha: f"({g} * {_c(alpha)} * math.exp({x}) if {x} <= {_c(0.0)} else {g})",
            "d elu(x) = g * alpha * exp(x) where x <= 0, else g: torch's elu_backward from the input.",
            "`%1 = elu[alpha=1.0] %0`: x where x > 0, else expm1(x) * alpha.", attrs=("alpha",))


# ------------------------------------------------------------------ hardtanh
def _reference_hardtanh(values, attrs):
    x = values[0]
    low, high = F32(attrs["min_val"]), F32(attrs["max_val"])
    return _f32(np.where(x < low, low, np.where(x > high, high, x)))


def _reference_hardtanh_vjp(values, attrs):
    g, x = values
    low, high = F32(attrs["min_val"]), F32(attrs["max_val"])
    return _f32(np.where((x <= low) | (x >= high), F32(0.0), g))


def _scalar_hardtanh(x, *, min_val, max_val):
    return f"({_c(min_val)} if {x} < {_c(min_val)} else ({_c(max_val)} if {x} > {_c(max_val)} else {x}))"


def _scalar_hardtanh_vjp(g, x, *, min_val, max_val):
    return f"({_c(0.0)} if {x} <= {_c(min_val)} or {x} >= {_c(max_val)} else {g})"


_activation("hardtanh", _reference_hardtanh, _scalar_hardtanh, _reference_hardtanh_vjp, _scalar_hardtanh_vjp,
            "d hardtanh(x) = g where min_val < x < max_val strictly, else 0: torch's hardtanh_backward.",
            "`%1 = hardtanh[max_val=1.0, min_val=-1.0] %0`: x clamped to [min_val, max_val] (NaN kept).",
            attrs=("max_val", "min_val"))
