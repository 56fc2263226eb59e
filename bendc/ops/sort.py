"""Sorting: ``argsort`` along a dim, the one op under torch.sort, argsort and topk (the front-end,
bendc/sort_scatter.py, gathers the values at the indices, so gradients flow through gather's VJP:
the upstream gradient scattered to the indices, as torch's sort and topk backward do).

Order (torch's ``stable=True``): ascending puts NaN last, descending puts NaN first (a NaN is larger
than every number); -0.0 and +0.0 are equal; equal elements (NaNs among themselves included) keep
their order of position in both directions, so ``descending=True`` is not the reverse of the
ascending order where values tie. Integer tensors (int64, int32) sort by the same rule: their ties,
the usual case, keep their order of position (torch's stable=False and topk leave that order open).

Lowering: a row op. CPU: numpy's stable argsort (a merge sort) of each line; descending sorts the
reversed line ascending and reverses the result (ties keep their order of position). cuda: one
thread per element counts the elements of its line that come before it (its rank) and writes its
position at that rank: deterministic, no atomics, O(n) work per thread (O(n^2) per line: fine for
the lines of top-k over a vocabulary row on a GPU, slow for lines of millions).
"""
from __future__ import annotations

import numpy as np

from bendc.ir.types import TensorType, numel
from bendc.kernels import cuda_kit as kit
from bendc.kernels.access import dense
from bendc.ops.base import InferError, Lowering, define_op


def _infer_argsort(types, attrs):
    (x,) = types
    if not (x.is_float or x.is_index):
        raise InferError(f"argsort sorts float32, int64 or int32 values, got {x}", unsupported=True)
    dim = attrs["dim"]
    if x.ndim == 0 or not isinstance(dim, int) or not 0 <= dim < x.ndim:
        raise InferError(f"argsort dim {dim} is out of range for {x}")
    if not isinstance(attrs["descending"], bool):
        raise InferError(f"argsort descending must be a bool, got {attrs['descending']!r}")
    return TensorType("i64", x.shape)


def stable_argsort(x: np.ndarray, dim: int, descending: bool) -> np.ndarray:
    """torch.argsort(x, dim, descending, stable=True) in numpy (the reference and the cpu kernel)."""
    if not descending:
        return np.argsort(x, axis=dim, kind="stable").astype(np.int64)
    size = x.shape[dim]
    order = np.argsort(np.flip(x, dim), axis=dim, kind="stable")
    return np.ascontiguousarray(np.flip(size - 1 - order, dim)).astype(np.int64)


def _reference_argsort(values, attrs):
    return stable_argsort(np.asarray(values[0]), attrs["dim"], attrs["descending"])


def _cpu_argsort(attrs, ins, out):
    dim = attrs["dim"]
    if not attrs["descending"]:
        return f"def kernel(in0, out0):\n    out0[...] = np.argsort(in0, axis={dim}, kind='stable')\n"
    return ("def kernel(in0, out0):\n"
            f"    order = np.argsort(np.flip(in0, {dim}), axis={dim}, kind='stable')\n"
            f"    out0[...] = np.flip({ins[0].shape[dim] - 1} - order, {dim})\n")


def _cuda_argsort(op):
    """One thread per element: its rank in its line (the elements that sort before it, and the equal
    ones at earlier positions), where its position is written."""
    node = op.node
    shape = op.shapes[0]
    dim = op.attrs["dim"]
    size = shape[dim]
    split, names = kit.unflatten("cell", shape, "s")
    other = list(names)
    other[dim] = "k"
    at_rank = list(names)
    at_rank[dim] = "rank"
    if op.attrs["descending"]:
        first = "(w > v) or (w != w and v == v)"
    else:
        first = "(w < v) or (v != v and w == w)"
    body = [f"v = {op.read(0, names)}", "rank = 0", f"for k in range({size}):",
            f"    w = {op.read(0, other)}",
            f"    if {first} or (k < {names[dim]} and (w == v or (w != w and v != v))):",
            "        rank += 1",
            f"out0[{dense(node.id, shape).flat(at_rank)}] = {names[dim]}"]
    body = kit.used(split, body) + body
    cells = numel(shape)
    direction = "descending" if op.attrs["descending"] else "ascending"
    source = kit.kernel_source("kernel", op.arguments, kit.grid_stride_loop(cells, body),
                               f"A stable {direction} argsort along dim {dim}: one thread per element, by rank.")
    return kit.Kernels(f"argsort ({direction}) over dim {dim}: lines of {size}", source,
                       [kit.grid_stride_launch("kernel", cells)])


define_op(
    name="argsort",
    arity=1,
    infer=_infer_argsort,
    reference=_reference_argsort,
    lowering=Lowering("row", cpu=_cpu_argsort, cuda=_cuda_argsort),
    no_vjp="an index result has no gradient (sort's values are a gather at these indices)",
    attr_names=("dim", "descending"),
    doc="`%1 = argsort[dim=1, descending=False] %0 : i64[4,8]`: torch.argsort(x, dim, descending, "
        "stable=True) of float32, int64 or int32 values (NaN largest; ties keep their order of position).",
)
