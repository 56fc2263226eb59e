"""``scatter_reduce``: torch's scatter, scatter_add and scatter_reduce as one op over (self, src, index).

``%3 = scatter_reduce[dim=1, reduce="sum", include_self=True] %self, %src, %index`` is
``self.clone().scatter_reduce_(dim, index, src, reduce, include_self=include_self)`` for reduce in
sum, prod, mean, amax, amin, and ``assign`` for ``self.clone().scatter_(dim, index, src)``. src has
the index's shape (the front-end, bendc/sort_scatter.py, slices a larger src as torch reads it).

Order: each output element combines its contributors in index order, starting from self (from the
reduce's identity where include_self is False: 0, 1, -inf, +inf), as torch's CPU loops do: sums and
products are torch's bit for bit, on every target and every run (cuda: one thread per output
element walks its line of the index, no atomics). ``mean`` divides the sum by the count (self
counted where included); an element no index names keeps self. ``assign``: the last contributor in
index order wins (torch leaves repeated indices unspecified). amax / amin propagate NaN.

Gradients: torch's scatter_reduce_backward (FunctionsManual.cpp) written with ops, operand for
operand: sum: g and gather(g); mean: g / N and gather(g / N), N the count (1 where no element
contributes); amax / amin: the gradient shared evenly among self (where self == result) and the
src elements equal to their result; prod: g * result / self, with torch's rule for zeros (a single
zero among an element's src gets the product of the others); assign: g where no src lands, and
gather(g). With include_self False self gets 0 where an index lands.
"""
from __future__ import annotations

import inspect

import numpy as np

from bendc.ir.types import TensorType, numel
from bendc.kernels import cuda_kit as kit
from bendc.kernels.access import dense
from bendc.ops.base import InferError, Lowering, define_op, require_float
from bendc.ops.gather import INDEX_RANGE, IndexRangeError, index_line_walk

REDUCES = ("sum", "prod", "mean", "amax", "amin", "assign")
_IDENTITY = {"sum": "0.0", "mean": "0.0", "prod": "1.0", "amax": "-math.inf", "amin": "math.inf", "assign": "0.0"}


def scatter_reduce_numpy(self, src, index, dim, reduce, include_self):
    """torch's self.clone().scatter_reduce_(dim, index, src, reduce, include_self) (reduce "assign":
    scatter_, the last in index order winning) in numpy: the reference and the cpu kernel."""
    out = np.array(self, dtype=np.float32, copy=True)
    if index.size == 0:
        return out
    size = out.shape[dim]
    if index.min() < 0 or index.max() >= size:
        bad = int(index[(index < 0) | (index >= size)].flat[0])
        raise IndexError(f"index {bad} is out of range for a dimension of size {size}")
    grids = list(np.indices(index.shape, sparse=True))
    grids[dim] = index
    where = tuple(grids)
    values = np.asarray(src, dtype=np.float32)
    if reduce == "assign":
        flat = np.ravel_multi_index(np.broadcast_arrays(*where), out.shape).reshape(-1)
        last = flat.size - 1 - np.unique(flat[::-1], return_index=True)[1]
        out.reshape(-1)[flat[last]] = values.reshape(-1)[last]
        return out
    touched = np.zeros(out.shape, dtype=np.bool_)
    touched[where] = True
    if not include_self:
        identity = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "amax": -np.inf, "amin": np.inf}[reduce]
        out[touched] = np.float32(identity)
    ufunc = {"sum": np.add, "mean": np.add, "prod": np.multiply, "amax": np.maximum, "amin": np.minimum}[reduce]
    with np.errstate(all="ignore"):
        ufunc.at(out, where, values)
        if reduce in ("amax", "amin"):
            # torch replaces only on a strict win (or a NaN): a zero result has the sign of the first
            # zero in order, self's where included, where numpy's maximum may pick either
            ranks = np.arange(values.size).reshape(values.shape)
            first = np.full(out.shape, values.size, dtype=np.int64)
            np.minimum.at(first, where, np.where(values == 0, ranks, values.size))
            zero_sign = np.where(first < values.size, values.reshape(-1)[np.minimum(first, values.size - 1)], out)
            if include_self:
                zero_sign = np.where(self == 0, self, zero_sign)
            out = np.where(out == 0, np.copysign(np.float32(0.0), zero_sign), out).astype(np.float32)
        if reduce == "mean":
            count = np.zeros(out.shape, dtype=np.float32)
            np.add.at(count, where, np.float32(1.0))
            if include_self:
                count += np.float32(1.0)
            out = np.where(count > 0, out / np.where(count > 0, count, np.float32(1.0)), out).astype(np.float32)
    return out


def _infer(types, attrs):
    x, src, index = types
    dim = attrs["dim"]
    require_float((x, src), "scatter_reduce")
    if not index.is_index:
        raise InferError(f"scatter_reduce needs an int64 or int32 index, got {index}", unsupported=True)
    if attrs["reduce"] not in REDUCES or not isinstance(attrs["include_self"], bool):
        raise InferError(f"scatter_reduce reduce {attrs['reduce']!r} must be one of {REDUCES}, include_self a bool")
    if x.ndim == 0 or not isinstance(dim, int) or not 0 <= dim < x.ndim:
        raise InferError(f"scatter_reduce dim {dim} is out of range for {x}")
    if src.shape != index.shape or index.ndim != x.ndim:
        raise InferError(f"scatter_reduce needs src and index of one shape and self's rank, got {x}, {src}, {index}")
    for axis, (size, limit) in enumerate(zip(index.shape, x.shape)):
        if axis != dim and size > limit:
            raise InferError(f"scatter_reduce index size {size} exceeds self's {limit} in dimension {axis}")
    return x


def _reference(values, attrs):
    x, src, index = values
    try:
        return scatter_reduce_numpy(x, src, index, attrs["dim"], attrs["reduce"], attrs["include_self"])
    except IndexError as error:
        raise IndexRangeError(str(error)) from None


def _cpu(attrs, ins, out):
    return (inspect.getsource(scatter_reduce_numpy) + "\n\n"
            "def kernel(in0, in1, in2, out0):\n"
            f"    out0[...] = scatter_reduce_numpy(in0, in1, in2, {attrs['dim']}, {attrs['reduce']!r}, "
            f"{attrs['include_self']})\n")


def _combine(reduce: str) -> str:
    """The statement folding a contributor ``s`` into ``acc`` (torch's ReduceAdd/Multiply/Maximum/...)."""
    return {"sum": "acc = acc + s", "mean": "acc = acc + s", "prod": "acc = acc * s",
            "amax": "acc = s if (s != s or acc < s) else acc", "amin": "acc = s if (s != s or s < acc) else acc",
            "assign": "acc = s"}[reduce]


def _cuda(op):
    """One thread per output element: its line of the index walked in order, its contributors folded
    into self (or the identity); a bad index sets ``err``."""
    node = op.node
    shape = op.shape
    dim = op.attrs["dim"]
    reduce, include_self = op.attrs["reduce"], op.attrs["include_self"]
    split, names = kit.unflatten("cell", shape, "o")
    start = "v" if include_self else f"np.float32({_IDENTITY[reduce]})"
    walk = index_line_walk(op, names, 2, 1, [_combine(reduce)])
    body = [f"v = {op.read(0, names)}", f"acc = {start}", "n = 0"] + walk
    if reduce == "mean":
        count = "n + 1" if include_self else "n"
        body += ["if n > 0:", f"    acc = acc / np.float32({count})"]
    if not include_self or reduce == "assign":
        body += ["if n == 0:", "    acc = v"]
    body += [f"out0[{dense(node.id, shape).flat(names)}] = acc"]
    body = kit.used(split, body) + body
    cells = numel(shape)
    source = kit.kernel_source("kernel", op.checked_arguments, kit.grid_stride_loop(cells, body),
                               f"scatter_reduce ({reduce}) along dim {dim}: one output element per thread, "
                               "its contributors in index order.")
    return kit.Kernels(f"scatter_reduce ({reduce}, include_self={include_self}) along dim {dim}", source,
                       [kit.grid_stride_launch("kernel", cells)], check=INDEX_RANGE.format(index="{index}",
                                                                                         size=shape[dim]))


def vjp_scatter_reduce(b, node, grad, needs):
    """torch's scatter_reduce_backward, operand for operand (the module docstring)."""
    x, src, index = node.inputs
    dim, reduce, include_self = node.attr["dim"], node.attr["reduce"], node.attr["include_self"]
    shape = b.shape(x)
    zero, one = b.const(0.0), b.const(1.0)

    def gather(value: int) -> int:
        return b.emit("gather", (value, index), dim=dim)

    def scatter_add(value: int) -> int:
        return b.emit("scatter_add", (value, index), dim=dim, shape=shape)

    def ones_at(mask: int) -> int:
        return b.where(mask, one, zero)

    if reduce in ("sum", "assign"):
        grad_x, grad_src = grad, gather(grad)
    elif reduce == "mean":
        count = scatter_add(b.expand(one, b.shape(index)))
        if include_self:
            count = b.add(count, one)
        count = b.where(b.emit("eq", (count, zero)), one, count)
        grad_x = b.div(grad, count)
        grad_src = b.div(gather(grad), gather(count))
    elif reduce in ("amax", "amin"):
        self_is = ones_at(b.emit("eq", (x, node.id)))
        src_is = ones_at(b.emit("eq", (src, gather(node.id))))
        shared = b.div(grad, b.add(self_is, scatter_add(src_is)))
        grad_x = b.mul(self_is, shared)
        grad_src = b.mul(src_is, gather(shared))
    else:  # prod
        attrs = dict(dim=dim, reduce="prod", include_self=include_self)
        masked_self = b.where(b.emit("eq", (x, zero)), one, x)
        grad_x = b.div(b.mul(grad, b.emit("scatter_reduce", (masked_self, src, index), **attrs)), masked_self)
        src_zero = ones_at(b.emit("eq", (src, zero)))
        single_zero = b.emit("eq", (b.mul(src_zero, gather(scatter_add(src_zero))), one))
        masked_src_result = b.emit("scatter_reduce", (x, b.where(single_zero, one, src), index), **attrs)
        divided = b.div(gather(b.mul(grad, node.id)), b.where(b.emit("eq", (src, zero)), one, src))
        grad_src = b.where(single_zero, gather(b.mul(grad, masked_src_result)), divided)
    if not include_self or reduce == "assign":
        touched = b.emit("gt", (scatter_add(b.expand(one, b.shape(index))), zero))
        grad_x = b.where(touched, zero, grad_x)
    return (grad_x if needs[0] else None, grad_src if needs[1] else None, None)


define_op(
    name="scatter_reduce",
    arity=3,
    infer=_infer,
    reference=_reference,
    lowering=Lowering("scatter", cpu=_cpu, cuda=_cuda),
    index_operand=2,
    indexed_size=lambda shapes, out, attrs: out[attrs["dim"]],
    vjp=vjp_scatter_reduce,
    attr_names=("dim", "reduce", "include_self"),
    doc="`%3 = scatter_reduce[dim=1, reduce='sum', include_self=True] %self, %src, %i`: "
        "self.scatter_reduce(dim, i, src, reduce, include_self=...) in index order (reduce 'assign': "
        "self.scatter(dim, i, src), the last repeated index winning).",
)
