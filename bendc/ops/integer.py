"""Integer arithmetic on index tensors (``idx + 1``, ``idx * stride``, ``pos // 2``), casts to an
integer dtype, the wrap of negative indices, and sums of integer and bool tensors (an int64 result,
``(pred == y).sum()``), with PyTorch's rules.

Two integer operands give an integer result: int64 where either is int64, else int32 (PyTorch's
promotion; a Python int operand takes the tensor's dtype). Floor division and remainder take a
positive Python int divisor and follow Python's (and PyTorch's) floor rules. No op here has a
gradient: integer values are not differentiable.
"""
from __future__ import annotations

import numpy as np

from bendc.ir.types import DTYPES, TensorType
from bendc.kernels import cpu_policy as policy
from bendc.kernels.cpu_kit import lines_call, njit_decorator
from bendc.ops.base import InferError, Lowering, broadcast_shapes, define_op
from bendc.ops.reduce import cuda_line_sum, summed_shape


def _result_dtype(types) -> str:
    return "i64" if any(t.dtype == "i64" for t in types) else "i32"


def _infer_integer(name):
    def infer(types, attrs):
        if not all(t.is_index for t in types):
            raise InferError(f"{name} needs int64 or int32 operands, got {', '.join(map(str, types))}",
                             unsupported=True)
        return TensorType(_result_dtype(types), broadcast_shapes(*(t.shape for t in types)))

    return infer


def _integer_binary(name, numpy_fn, symbol):
    def reference(values, attrs):
        dtype = DTYPES["i64" if any(v.dtype == np.int64 for v in values) else "i32"]
        return np.asarray(numpy_fn(values[0].astype(dtype), values[1].astype(dtype)), dtype=dtype)

    define_op(
        name=name,
        arity=2,
        infer=_infer_integer(name),
        reference=reference,
        lowering=Lowering("elementwise", scalar=lambda a, b: f"({a} {symbol} {b})"),
        no_vjp="an integer result has no gradient",
        doc=f"`%2 = {name} %0, %1 : i64[..]`: a {symbol} b of integer tensors, broadcasting.",
    )


_integer_binary("int_add", np.add, "+")
_integer_binary("int_sub", np.subtract, "-")
_integer_binary("int_mul", np.multiply, "*")


# ------------------------------------------------------------------ // and % by a positive int
def _infer_by_divisor(name):
    def infer(types, attrs):
        (x,) = types
        divisor = attrs["divisor"]
        if not x.is_index:
            raise InferError(f"{name} needs an int64 or int32 operand, got {x}", unsupported=True)
        if isinstance(divisor, bool) or not isinstance(divisor, int) or divisor <= 0:
            raise InferError(f"{name} needs a positive int divisor, got {divisor!r}")
        return x

    return infer


for _name, _fn, _symbol in (("int_floordiv", np.floor_divide, "//"), ("int_remainder", np.remainder, "%")):
    define_op(
        name=_name,
        arity=1,
        infer=_infer_by_divisor(_name),
        reference=lambda v, a, fn=_fn: np.asarray(fn(v[0], v[0].dtype.type(a["divisor"])), dtype=v[0].dtype),
        lowering=Lowering("elementwise", scalar=lambda a, divisor, symbol=_symbol: f"({a} {symbol} {int(divisor)})"),
        no_vjp="an integer result has no gradient",
        attr_names=("divisor",),
        doc=f"`%1 = {_name}[divisor=2] %0`: x {_symbol} divisor, rounded toward minus infinity as Python's.",
    )


# ------------------------------------------------------------------ casts and negative indices
def _infer_to_int(types, attrs):
    (x,) = types
    if attrs["dtype"] not in ("i64", "i32"):
        raise InferError(f"to_int casts to i64 or i32, got {attrs['dtype']!r}")
    return TensorType(attrs["dtype"], x.shape)


define_op(
    name="to_int",
    arity=1,
    infer=_infer_to_int,
    reference=lambda v, a: np.asarray(np.trunc(v[0]) if v[0].dtype == np.float32 else v[0]).astype(DTYPES[a["dtype"]]),
    lowering=Lowering("elementwise", scalar=lambda a, dtype: f"np.{DTYPES[dtype].name}({a})"),
    no_vjp="an integer result has no gradient",
    attr_names=("dtype",),
    doc="`%1 = to_int[dtype=\"i64\"] %0 : i64[..]`: x.long() / x.int(): bools as 1 / 0, floats truncated "
        "toward zero (PyTorch's cast).",
)


def _infer_wrap_index(types, attrs):
    (x,) = types
    if not x.is_index:
        raise InferError(f"wrap_index needs an integer index, got {x}", unsupported=True)
    return x


define_op(
    name="wrap_index",
    arity=1,
    infer=_infer_wrap_index,
    reference=lambda v, a: np.where(v[0] < 0, v[0] + v[0].dtype.type(a["size"]), v[0]).astype(v[0].dtype),
    lowering=Lowering("elementwise", scalar=lambda a, size: f"({a} + {int(size)} if {a} < 0 else {a})"),
    no_vjp="an index has no gradient",
    attr_names=("size",),
    doc="`%1 = wrap_index[size=5] %0`: a negative index i as i + size (PyTorch's tensor indexing); the "
        "index op that reads it refuses what is still out of range.",
)


# ------------------------------------------------------------------ sums of integers and bools
def _infer_int_sum(types, attrs):
    (x,) = types
    if not (x.is_index or x.dtype == "bool"):
        raise InferError(f"int_sum needs an integer or bool operand, got {x}", unsupported=True)
    return TensorType("i64", summed_shape(x, attrs, "int_sum"))


def _reference_int_sum(values, attrs):
    (x,) = values
    return np.asarray(np.sum(x, axis=tuple(attrs["dims"]), keepdims=attrs["keepdim"], dtype=np.int64))


def _cpu_int_sum(attrs, ins, out):
    """Each output element's line (cpu_kit.lines_call: kept axes by summed ones) added up in int64,
    lines in parallel where the operand is large (integer sums are exact in any order)."""
    axes = tuple(attrs["dims"])
    if any(ins[0].shape[axis] == 0 for axis in axes):  # sums over nothing: zeros
        return "def kernel(in0, out0):\n    out0[...] = 0\n"
    parallel = policy.parallel("rows", ins[0].numel)
    return (f"{njit_decorator(parallel)}\n"
            "def _lines(x, out):\n"
            f"    for r in {'prange' if parallel else 'range'}(x.shape[0]):\n"
            "        total = np.int64(0)\n"
            "        for c in range(x.shape[1]):\n"
            "            total += np.int64(x[r, c])\n"
            "        out[r] = total\n\n\n") + lines_call(ins[0].shape, axes)


def _cuda_int_sum(op):
    """reduce.cuda_line_sum in int64: a thread per output element, or a block and its int64 tree."""
    return cuda_line_sum(op, set(op.attrs["dims"]), "int64")


define_op(
    name="int_sum",
    arity=1,
    infer=_infer_int_sum,
    reference=_reference_int_sum,
    lowering=Lowering("reduce", cpu=_cpu_int_sum, cuda=_cuda_int_sum),
    no_vjp="an integer result has no gradient",
    attr_names=("dims", "keepdim"),
    doc="`%1 = int_sum[dims=(0,), keepdim=False] %0 : i64[4]`: x.sum() of an integer or bool tensor, an "
        "int64 result as PyTorch's ((pred == y).sum() counts).",
)
