"""Values that enter the graph: parameters, scalar constants, gradient slots."""
from __future__ import annotations

import math

import numpy as np

from bendc.ir.types import TensorType
from bendc.ops.base import InferError, Lowering, define_op


def _infer_param(types, attrs):
    return TensorType(attrs["dtype"], tuple(attrs["shape"]))


def _reference_param(values, attrs):
    raise AssertionError("parameters are bound by the interpreter, not evaluated")


define_op(
    name="param",
    arity=0,
    infer=_infer_param,
    reference=_reference_param,
    lowering=Lowering("source"),
    no_vjp="a parameter is a leaf or a constant; autodiff stops here",
    attr_names=("dtype", "leaf", "name", "shape"),
    doc="A function parameter; printed in the header as `%x: f32[32,64] leaf`. A lifted constant (a torch "
        "tensor of more values than a `literal` holds, captured by the traced function or made by torch.tensor) "
        "is a parameter with a `const` attribute, the hash of its values, printed `%_tensor_constant0: "
        "f32[128,128] const=3f2a...`: the graph and every program hold its array and pass it after the caller's "
        "inputs (in an artifact, `constants/<name>.npy`).",
)


def _infer_const(types, attrs):
    if not isinstance(attrs.get("value"), float):
        raise InferError("const needs a float value")
    return TensorType("f32", ())


def _reference_const(values, attrs):
    return np.array(attrs["value"], dtype=np.float32)


def _scalar_const(value: float) -> str:
    """A float32 constant in generated source (math is imported there): ``np.float32(0.5)``;
    infinities and NaNs through ``math`` (a NaN keeps its sign), since ``repr`` gives a bare
    ``inf``/``nan`` that is no Python name."""
    if math.isinf(value) or math.isnan(value):
        name = "math.inf" if math.isinf(value) else "math.nan"
        return f"np.float32({'-' if math.copysign(1.0, value) < 0 else ''}{name})"
    return f"np.float32({value!r})"


def _cpu_const(attrs, ins, out):
    return f"def kernel():\n    return np.array({_scalar_const(attrs['value'])})\n"


define_op(
    name="const",
    arity=0,
    infer=_infer_const,
    reference=_reference_const,
    lowering=Lowering("source", scalar=lambda *, value: _scalar_const(value), cpu=_cpu_const),
    no_vjp="a constant has no gradient",
    attr_names=("value",),
    doc="A float32 scalar: `%3 = const[value=0.5] : f32[]`. Broadcasts like a Python scalar.",
)


def _infer_grad(types, attrs):
    if len(types) < 2:
        raise InferError("grad needs a leaf and at least one backward root")
    return types[0]


def _reference_grad(values, attrs):
    raise AssertionError("grad slots are resolved by the autodiff stage")


define_op(
    name="grad",
    arity=None,
    infer=_infer_grad,
    reference=_reference_grad,
    lowering=Lowering("placeholder"),
    no_vjp="gradients are constants (bendc has no create_graph)",
    doc=(
        "A leaf's gradient slot as read by `.grad`: `%9 = grad %w, %7, %12 : f32[10,784]` is "
        "the sum, in call order, of the contributions to %w of backward() on %7 then on %12. "
        "The autodiff stage replaces it."
    ),
)
