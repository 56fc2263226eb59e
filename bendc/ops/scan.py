"""Scans: cumsum and cumprod along a dim (and their reverses, for the VJPs).

PyTorch's CPU cumsum accumulates each line in float64 in order and rounds every prefix to
float32 (``at::acc_type<float, false>`` is double); bendc's kernels do the same, so the values are
torch's bit for bit. The VJP is the reversed cumsum of the gradient (derivatives.yaml's
cumsum_backward: ``grad.flip(dim).cumsum(dim).flip(dim)``), the same op with ``reverse=True``.

cumprod is the same scan with a float64 running product (torch's CPU cumprod accumulates in
``acc_type<float>`` = double too, so its values are torch's bit for bit); its VJP is torch's
cumprod_backward written with ops: ``reversed_cumsum(g * out) / x`` before a line's first zero, at
the first zero ``reversed_cumsum(g * cumprod(x with that zero replaced by 1))``, after it 0 (so one
zero or several give torch's gradients). ``prod`` is no op of its own: the front-end takes the last
element of a cumprod (bendc/sort_scatter.py), so its gradient is this one.

Lowering: a row kernel, one cell per line along dim. CPU: a numba loop over lines (``prange``
when large), sequential along each line; cuda: a thread per line in a grid-stride loop, a float64
running sum (tests/cuda/test_ptx_ops_reduce.py allows ``.f64`` for this op).
"""
from __future__ import annotations

import numpy as np

from bendc.ir.types import numel
from bendc.kernels import cuda_kit as kit
from bendc.kernels.access import dense
from bendc.kernels import cpu_policy as policy
from bendc.kernels.cpu_kit import njit_decorator
from bendc.ops.base import InferError, Lowering, define_op, require_float


# Per scan op: the running value's start, its update statement, and numpy's scan.
_SCANS = {"cumsum": ("0.0", "total += np.float64({value})", np.cumsum),
          "cumprod": ("1.0", "total *= np.float64({value})", np.cumprod)}


def _infer_scan(name):
    def infer(types, attrs):
        (x,) = types
        require_float(types, name)
        dim = attrs["dim"]
        if not isinstance(dim, int) or not 0 <= dim < max(x.ndim, 1) or x.ndim == 0:
            raise InferError(f"{name} dim {dim} is out of range for {x}")
        if not isinstance(attrs["reverse"], bool):
            raise InferError(f"{name} reverse must be a bool, got {attrs['reverse']!r}")
        return x

    return infer


def _reference_scan(name):
    scan = _SCANS[name][2]

    def reference(values, attrs):
        (x,) = values
        dim = attrs["dim"]
        wide = np.asarray(x, dtype=np.float64)
        with np.errstate(all="ignore"):
            if attrs["reverse"]:
                result = np.flip(scan(np.flip(wide, dim), axis=dim), dim)
            else:
                result = scan(wide, axis=dim)
            return np.ascontiguousarray(result.astype(np.float32))

    return reference


def vjp_cumsum(b, node, grad, needs):
    """d cumsum(a, dim) = the reversed cumsum of g along dim: PyTorch's cumsum_backward."""
    return (b.emit("cumsum", (grad,), dim=node.attr["dim"], reverse=not node.attr["reverse"]),)


def vjp_cumprod(b, node, grad, needs):
    """torch's cumprod_backward: before a line's first zero reversed_cumsum(g * out) / x; at the first
    zero reversed_cumsum(g * cumprod(x with that zero set to 1)); after it 0. A line of one element
    passes g through."""
    (x,) = node.inputs
    dim, reverse = node.attr["dim"], node.attr["reverse"]
    if b.shape(x)[dim] == 1:
        return (grad,)
    zero, one = b.const(0.0), b.const(1.0)
    is_zero = b.where(b.emit("eq", (x, zero)), one, zero)
    zeros_so_far = b.emit("cumsum", (is_zero,), dim=dim, reverse=reverse)
    before = b.emit("eq", (zeros_so_far, zero))
    first = b.emit("eq", (b.mul(is_zero, zeros_so_far), one))
    later = b.emit("cumsum", (b.mul(grad, node.id),), dim=dim, reverse=not reverse)
    without_first = b.emit("cumprod", (b.where(first, one, x),), dim=dim, reverse=reverse)
    at_first = b.emit("cumsum", (b.mul(grad, without_first),), dim=dim, reverse=not reverse)
    return (b.where(before, b.div(later, b.where(before, x, one)), b.where(first, at_first, zero)),)


def _cpu_scan(name):
    start, update, _ = _SCANS[name]

    def render(attrs, ins, out):
        return _cpu_source(attrs, ins, start, update.format(value="x[r, c]"))

    return render


def _cpu_source(attrs, ins, start, update):
    shape = ins[0].shape
    dim = attrs["dim"]
    size = shape[dim]
    # The line count from the other dims (not numel // size: a zero-size dim has lines of no elements).
    lines = numel(shape[:dim] + shape[dim + 1:])
    parallel = policy.parallel("rows", ins[0].numel) and lines > 1
    loop = "prange" if parallel else "range"
    order = "range(x.shape[1] - 1, -1, -1)" if attrs["reverse"] else "range(x.shape[1])"
    source = (f"{njit_decorator(parallel)}\n"
              "def _lines(x, out):\n"
              f"    for r in {loop}(x.shape[0]):\n"
              f"        total = np.float64({start})\n"
              f"        for c in {order}:\n"
              f"            {update}\n"
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


def _cuda_scan(name):
    start, update, _ = _SCANS[name]

    def render(op):
        return _cuda_source(op, name, start, update)

    return render


def _cuda_source(op, name, start, update):
    """A thread per line along dim: a float64 running sum (product), each prefix rounded to float32."""
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
    loop = [f"total = np.float64({start})", f"for c in {order}:", "    " + update.format(value=op.read(0, index)),
            f"    out0[{dense(node.id, shape).flat(index)}] = np.float32(total)"]
    body = kit.used(split, loop) + loop
    source = kit.kernel_source("kernel", op.arguments, kit.grid_stride_loop(op.count(lines, size), body, "line"),
                               f"One thread per line: a float64 running {name} along dim.")
    direction = "reversed " if op.attrs["reverse"] else ""
    return kit.Kernels(f"{direction}{name} over dim {dim}: {lines} lines of {size}", source,
                       [kit.grid_stride_launch("kernel", lines)])


define_op(
    name="cumsum",
    arity=1,
    infer=_infer_scan("cumsum"),
    reference=_reference_scan("cumsum"),
    lowering=Lowering("row", cpu=_cpu_scan("cumsum"), cuda=_cuda_scan("cumsum")),
    vjp=vjp_cumsum,
    attr_names=("dim", "reverse"),
    doc="`%1 = cumsum[dim=1, reverse=False] %0`: prefix sums along dim in float64, each rounded to "
        "float32 (torch.cumsum); reverse=True sums from the end (its VJP).",
)

define_op(
    name="cumprod",
    arity=1,
    infer=_infer_scan("cumprod"),
    reference=_reference_scan("cumprod"),
    lowering=Lowering("row", cpu=_cpu_scan("cumprod"), cuda=_cuda_scan("cumprod")),
    vjp=vjp_cumprod,
    attr_names=("dim", "reverse"),
    doc="`%1 = cumprod[dim=1, reverse=False] %0`: prefix products along dim in float64, each rounded to "
        "float32 (torch.cumprod); reverse=True multiplies from the end.",
)
