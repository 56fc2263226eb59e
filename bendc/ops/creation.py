"""Tensors made inside a traced function: ``iota`` (arange, full, eye's coordinates) and ``literal``
(torch.tensor([...])), constants of the graph.

Both are elementwise ops without operands whose value depends on the element's position
(``Lowering.cell_index``): they fuse into the kernels that read them, and a step that reads only
constants is hoisted (run once per signature, bendc/codegen/plan.py).
"""
from __future__ import annotations

import math

import numpy as np

from bendc.ir.types import DTYPES, TensorType
from bendc.ops.base import InferError, Lowering, define_op

# The most elements a literal may hold: its values are written into the IR and the kernel source. Larger
# constants are lifted: parameters whose values the program holds (bendc/trace.py Tracer.lifted_constant).
LITERAL_LIMIT = 4096
_NUMERIC = ("f32", "i64", "i32")


def _check_shape(shape, op: str) -> tuple[int, ...]:
    shape = tuple(shape)
    if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape):
        raise InferError(f"{op} shape {shape} needs non-negative ints")
    return shape


def _typed(value, dtype: str) -> str:
    """A typed scalar of generated source: ``np.float32(0.5)``, ``np.int64(3)``, ``True``."""
    if dtype == "bool":
        return repr(bool(value))
    if dtype == "f32":
        from bendc.ops.source import _scalar_const

        return _scalar_const(float(value))
    return f"np.{DTYPES[dtype].name}({int(value)})"


# ------------------------------------------------------------------ iota
def _infer_iota(types, attrs):
    shape = _check_shape(attrs["shape"], "iota")
    dtype, dim = attrs["dtype"], attrs["dim"]
    if dtype not in _NUMERIC:
        raise InferError(f"iota makes float32 or integer values, got dtype {dtype!r}", unsupported=True)
    if not isinstance(dim, int) or not 0 <= dim < max(len(shape), 1):
        raise InferError(f"iota dim {dim} is out of range for shape {shape}")
    for name in ("start", "step"):
        value = attrs[name]
        if dtype == "f32" and not isinstance(value, float) or dtype != "f32" and (
                isinstance(value, bool) or not isinstance(value, int)):
            raise InferError(f"iota {name} {value!r} must be {'a float' if dtype == 'f32' else 'an int'} "
                             f"for dtype {dtype}")
    return TensorType(dtype, shape)


def _coordinates(shape: tuple[int, ...], dim: int) -> np.ndarray:
    """Each element's coordinate along ``dim`` (0 for a 0-d shape)."""
    if not shape:
        return np.zeros((), np.int64)
    view = [1] * len(shape)
    view[dim] = shape[dim]
    return np.broadcast_to(np.arange(shape[dim], dtype=np.int64).reshape(view), shape)


def _reference_iota(values, attrs):
    shape, dtype = tuple(attrs["shape"]), attrs["dtype"]
    coordinate = _coordinates(shape, attrs["dim"])
    if dtype == "f32":  # PyTorch's arange: start + step * i in double, rounded once
        return np.array(np.float64(attrs["start"]) + np.float64(attrs["step"]) * coordinate, dtype=np.float32)
    return np.array(np.int64(attrs["start"]) + np.int64(attrs["step"]) * coordinate, dtype=DTYPES[dtype])


def _scalar_iota(*, index: str, shape, dim, start, step, dtype) -> str:
    shape = tuple(shape)
    if shape:
        inner = math.prod(shape[dim + 1:])
        coordinate = f"(({index}) // {inner}) % {shape[dim]}" if inner != 1 else f"({index}) % {shape[dim]}"
    else:
        coordinate = "0"
    if dtype == "f32":
        return f"np.float32(np.float64({float(start)!r}) + np.float64({float(step)!r}) * np.float64({coordinate}))"
    kind = DTYPES[dtype].name
    return f"np.{kind}(np.int64({int(start)}) + np.int64({int(step)}) * np.int64({coordinate}))"


define_op(
    name="iota",
    arity=0,
    infer=_infer_iota,
    reference=_reference_iota,
    lowering=Lowering("elementwise", scalar=_scalar_iota, cell_index=True),
    no_vjp="a constant has no gradient",
    attr_names=("dim", "dtype", "shape", "start", "step"),
    doc="`%1 = iota[dim=1, dtype=\"i64\", shape=(2,5), start=0, step=1] : i64[2,5]`: start + step * i, i the "
        "element's coordinate along dim (torch.arange; step 0 fills: torch.full); float32 in double, rounded once.",
)


# ------------------------------------------------------------------ literal
def _infer_literal(types, attrs):
    shape = _check_shape(attrs["shape"], "literal")
    dtype, values = attrs["dtype"], attrs["values"]
    if dtype not in DTYPES:
        raise InferError(f"literal dtype {dtype!r} is not one of {sorted(DTYPES)}", unsupported=True)
    if not isinstance(values, tuple) or len(values) != math.prod(shape):
        raise InferError(f"literal of shape {shape} needs {math.prod(shape)} values")
    if len(values) > LITERAL_LIMIT:
        raise InferError(f"a literal of {len(values)} values is over the {LITERAL_LIMIT} bendc writes into its "
                         "kernels; pass the array as a parameter of the jitted function", unsupported=True)
    return TensorType(dtype, shape)


def _reference_literal(values, attrs):
    return np.array(attrs["values"], dtype=DTYPES[attrs["dtype"]]).reshape(tuple(attrs["shape"]))


def _scalar_literal(*, index: str, shape, dtype, values) -> str:
    if len(values) == 1:
        return _typed(values[0], dtype)
    items = ", ".join(_typed(v, dtype) for v in values)
    return f"({items})[{index}]"


define_op(
    name="literal",
    arity=0,
    infer=_infer_literal,
    reference=_reference_literal,
    lowering=Lowering("elementwise", scalar=_scalar_literal, cell_index=True),
    no_vjp="a constant has no gradient",
    attr_names=("dtype", "shape", "values"),
    doc="`%1 = literal[dtype=\"f32\", shape=(2,), values=(0.5,2.0)] : f32[2]`: the values listed, row-major "
        "(torch.tensor([...]) inside a traced function, a small captured torch tensor; at most 4096 of them: "
        "more are a lifted constant, a `param` with a `const` attribute).",
)
