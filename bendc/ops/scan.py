"""Scans: cumsum along a dim (and its reverse, the VJP).

PyTorch's CPU cumsum accumulates each line in float64 in order and rounds every prefix to
float32 (``at::acc_type<float, false>`` is double); bendc's kernels do the same, so the values are
torch's bit for bit. The VJP is the reversed cumsum of the gradient (derivatives.yaml's
cumsum_backward: ``grad.flip(dim).cumsum(dim).flip(dim)``), the same op with ``reverse=True``.

Lowering: a row kernel, one cell per line along dim. CPU: a numba loop over lines (``prange``
when large), sequential along each line; cuda: a thread per line in a grid-stride loop, a float64
running sum (tests/cuda/test_ptx_ops_reduce.py allows ``.f64`` for this op).
"""
from __future__ import annotations

import numpy as np

from bendc.ir.types import numel
from bendc.kernels import cuda_kit as kit
from bendc.kernels.access import dense
from bendc.kernels.cpu_kit import PARALLEL_CELLS, njit_decorator
from bendc.ops.base import InferError, Lowering, define_op, require_float


def _infer_cumsum(types, attrs):
    (x,) = types
    require_float(types, "cumsum")
    dim = attrs["dim"]
    if not isinstance(dim, int) or not 0 <= dim < max(x.ndim, 1) or x.ndim == 0:
        raise InferError(f"cumsum dim {dim} is out of range for {x}")
    if not isinstance(attrs["reverse"], bool):
        raise InferError(f"cumsum reverse must be a bool, got {attrs['reverse']!r}")
    return x


def _reference_cumsum(values, attrs):
    (x,) = values
    dim = attrs["dim"]
    wide = np.asarray(x, dtype=np.float64)
    if attrs["reverse"]:
        return np.ascontiguousarray(np.flip(np.cumsum(np.flip(wide, dim), axis=dim), dim).astype(np.float32))
    return np.ascontiguousarray(np.cumsum(wide, axis=dim).astype(np.float32))


def vjp_cumsum(b, node, grad, needs):
    """d cumsum(a, dim) = the reversed cumsum of g along dim: PyTorch's cumsum_backward."""
    return (b.emit("cumsum", (grad,), dim=node.attr["dim"], reverse=not node.attr["reverse"]),)


def _cpu_cumsum(attrs, ins, out):
    shape = ins[0].shape
    dim = attrs["dim"]
    size = shape[dim]
    # The line count from the other dims (not numel // size: a zero-size dim has lines of no elements).
    lines = numel(shape[:dim] + shape[dim + 1:])
    parallel = ins[0].numel >= PARALLEL_CELLS and lines > 1
    loop = "prange" if parallel else "range"
    order = "range(x.shape[1] - 1, -1, -1)" if attrs["reverse"] else "range(x.shape[1])"
    source = (f"{njit_decorator(parallel)}\n"
              "def _lines(x, out):\n"
              f"    for r in {loop}(x.shape[0]):\n"
              "        total = np.float64(0.0)\n"
              f"        for c in {order}:\n"
              "            total += np.float64(x[r, c])\n"
              "            out[r, c] = np.float32(total)\n\n\n")
    if dim == len(shape) - 1:
        return source + ("def kernel(in0, out0):\n"
                         f"    _lines(np.ascontiguousarray(in0).reshape(({lines}, {size})), "
                         f"out0.reshape(({lines}, {size})))\n")
    return source + (
        "def kernel(in0, out0):\n"
        f"    moved = np.ascontiguousarray(np.moveaxis(in0, {dim}, -1))\n"
        "    result = np.empty_like(moved)\n"
        f"    _lines(moved.reshape(({lines}, {size})), result.reshape(({lines}, {size})))\n"
        f"    out0[...] = np.moveaxis(result, -1, {dim})\n")


def _cuda_cumsum(op):
    """A thread per line along dim: a float64 running sum, each prefix rounded to float32."""
    node = op.node
    shape = op.shapes[0]
    dim = op.attrs["dim"]
    size = shape[dim]
    lines = numel(shape) // max(size, 1)
    line_shape = tuple(1 if axis == dim else extent for axis, extent in enumerate(shape))
    split, names = kit.unflatten("line", line_shape, "r")
    index = list(names)
    index[dim] = "c"
    order = f"range({size} - 1, -1, -1)" if op.attrs["reverse"] else f"range({size})"
    loop = ["total = np.float64(0.0)", f"for c in {order}:", f"    total += np.float64({op.read(0, index)})",
            f"    out0[{dense(node.id, shape).flat(index)}] = np.float32(total)"]
    body = kit.used(split, loop) + loop
    source = kit.kernel_source("kernel", op.arguments, kit.grid_stride_loop(lines, body, "line"),
                               "One thread per line: a float64 running sum along dim.")
    direction = "reversed " if op.attrs["reverse"] else ""
    return kit.Kernels(f"{direction}cumsum over dim {dim}: {lines} lines of {size}", source,
                       [kit.grid_stride_launch("kernel", lines)])


define_op(
    name="cumsum",
    arity=1,
    infer=_infer_cumsum,
    reference=_reference_cumsum,
    lowering=Lowering("row", cpu=_cpu_cumsum, cuda=_cuda_cumsum),
    vjp=vjp_cumsum,
    attr_names=("dim", "reverse"),
    doc="`%1 = cumsum[dim=1, reverse=False] %0`: prefix sums along dim in float64, each rounded to "
        "float32 (torch.cumsum); reverse=True sums from the end (its VJP).",
)
