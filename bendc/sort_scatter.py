"""The front-end of issue 22's products, flips, sorts and scatters: Tensor methods, bendc.functional
and torch names with PyTorch's signatures and semantics.

- ``cumprod(dim)``: the scan op (bendc/ops/scan.py), torch's values and cumprod_backward (zeros included).
- ``prod()`` / ``prod(dim, keepdim)``: the last element of a cumprod along dim (of the flattened
  tensor without dim), so its gradient is cumprod's: g * result / x without zeros, the product of
  the others at a single zero, 0 everywhere with several zeros (torch's prod_backward). The value is
  the float64 product rounded once; torch's float32 reduction rounds as it goes (within a few ulp).
- ``flip(dims)``: an index_select with a descending iota per flipped dim; its gradient is the flip.
- ``sort(dim, descending, stable)``, ``argsort``, ``topk(k, dim, largest, sorted)``: the argsort op
  (bendc/ops/sort.py; always stable: ties keep their order of position, NaN is the largest) and a
  gather of x at its indices, so gradients scatter to the indices. topk takes the first k of that
  order (sorted=False gives them sorted too, which torch allows). Float32, int64 and int32 tensors
  (an integer sort has no gradient; its values keep the dtype).
- ``scatter(dim, index, src | value, reduce=)``, ``scatter_add``, ``scatter_reduce(dim, index, src, reduce,
  include_self=)``: the scatter_reduce op (bendc/ops/scatter.py), src sliced to the index's shape as
  torch reads it.

:class:`SortScatterMethods` is a base class of :class:`bendc.trace.Tensor`; this module imports no
tracer code at import time.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from bendc.errors import ShapeError, UnsupportedError
from bendc.reductions import ValuesIndices, _dim, _static_bool
from bendc.tensor_math import _function, as_dtype  # _function: torch.<name>(input, ...) as input.<name>(...)

_SCATTER_REDUCES = ("sum", "prod", "mean", "amax", "amin")
_LEGACY_REDUCES = {"add": "sum", "multiply": "prod"}  # Tensor.scatter(..., reduce=)


def _require_float(x: Any, op: str, loc) -> None:
    if not x.type.is_float:
        raise UnsupportedError(f"{op} of {x.type}: bendc computes {op} of float32 tensors (call .float() first)",
                               loc=loc, op=op)


class SortScatterMethods:
    """Tensor methods: prod, cumprod, flip, sort, argsort, topk, floor_divide, remainder, scatter, scatter_add,
    scatter_reduce."""

    __slots__ = ()

    # ------------------------------------------------------------- cumprod, prod
    def cumprod(self, dim: Any, *, dtype: Any = None):
        """torch.cumprod: prefix products along ``dim`` (accumulated in float64, as torch's CPU kernel)."""
        with self.tracer.at_user_line("cumprod") as builder:
            x = as_dtype(self, dtype, "cumprod")
            _require_float(x, "cumprod", builder.loc)
            axis = _dim(dim, x.ndim, "cumprod", builder.loc)
            if x.ndim == 0:
                return x.tracer.emit("cumprod", (x.reshape(1).id,), dim=0, reverse=False).reshape(())
            return x.tracer.emit("cumprod", (x.id,), dim=axis, reverse=False)

    def prod(self, dim: Any = None, keepdim: Any = False, *, dtype: Any = None):
        """torch.prod: the product of all elements (dim None) or along ``dim``."""
        with self.tracer.at_user_line("prod") as builder:
            x = as_dtype(self, dtype, "prod")
            _require_float(x, "prod", builder.loc)
            keepdim = _static_bool(keepdim, "keepdim", "prod", builder.loc)
            if dim is None:
                if x.type.numel == 0:
                    return x.tracer.const(1.0)
                flat = x.reshape(-1)
                return x.tracer.emit("cumprod", (flat.id,), dim=0, reverse=False)[flat.shape[0] - 1]
            axis = _dim(dim, x.ndim, "prod", builder.loc)
            if x.ndim == 0:
                return x
            size = x.shape[axis]
            kept = x.shape[:axis] + (1,) + x.shape[axis + 1:]
            if size == 0:
                result = x.tracer.const(1.0).expand(*kept)
            else:
                scan = x.tracer.emit("cumprod", (x.id,), dim=axis, reverse=False)
                result = scan[(slice(None),) * axis + (slice(size - 1, size),)]
            return result if keepdim else result.reshape(x.shape[:axis] + x.shape[axis + 1:])

    # ------------------------------------------------------------- flip
    def flip(self, *dims: Any):
        """torch.flip: the elements in reverse order along each of ``dims``."""
        with self.tracer.at_user_line("flip") as builder:
            if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
                dims = tuple(dims[0])
            axes = [_dim(d, self.ndim, "flip", builder.loc) for d in dims]
            if len(set(axes)) != len(axes):
                raise ShapeError(f"flip: dims {dims!r} repeat a dimension of {self.type}", loc=builder.loc, op="flip")
            result = self
            for axis in axes if self.ndim else ():
                size = self.shape[axis]
                if size > 1:
                    backward = self.tracer.emit("iota", (), shape=(size,), dim=0, start=size - 1, step=-1, dtype="i64")
                    result = self.tracer.emit("index_select", (result.id, backward.id), dim=axis)
            return result

    # ------------------------------------------------------------- sort, argsort, topk
    def _argsort(self, dim: Any, descending: Any, op: str, loc):
        if not (self.type.is_float or self.type.is_index):
            raise UnsupportedError(f"{op} of {self.type}: bendc sorts float32, int64 and int32 tensors (call "
                                   ".long() or .float() first)", loc=loc, op=op)
        descending = _static_bool(descending, "descending", op, loc)
        axis = _dim(dim, self.ndim, op, loc)
        x = self.reshape(1) if self.ndim == 0 else self
        return x, axis, x.tracer.emit("argsort", (x.id,), dim=axis, descending=descending)

    def argsort(self, dim: Any = -1, descending: Any = False, *, stable: Any = False):
        """torch.argsort: int64 indices that sort x along ``dim`` (stable: ties keep their order)."""
        with self.tracer.at_user_line("argsort") as builder:
            _static_bool(stable, "stable", "argsort", builder.loc)
            _, _, order = self._argsort(dim, descending, "argsort", builder.loc)
            return order.reshape(self.shape)

    def sort(self, dim: Any = -1, descending: Any = False, *, stable: Any = False):
        """torch.sort: ``(values, indices)`` along ``dim``; always stable (ties keep their order of
        position, NaN sorts as the largest), which is torch's stable=True and a valid stable=False."""
        with self.tracer.at_user_line("sort") as builder:
            _static_bool(stable, "stable", "sort", builder.loc)
            x, axis, order = self._argsort(dim, descending, "sort", builder.loc)
            values = x.tracer.emit("gather", (x.id, order.id), dim=axis)
            return ValuesIndices(values.reshape(self.shape), order.reshape(self.shape))

    def topk(self, k: Any, dim: Any = -1, largest: Any = True, sorted: Any = True):
        """torch.topk: the k largest (smallest) elements along ``dim`` and their int64 indices, in sorted
        order (also for sorted=False, whose order torch leaves open); ties go to the earlier position."""
        with self.tracer.at_user_line("topk") as builder:
            _static_bool(sorted, "sorted", "topk", builder.loc)
            if isinstance(k, np.integer):
                k = int(k)
            size = self.shape[_dim(dim, self.ndim, "topk", builder.loc)] if self.ndim else 1
            if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= size:
                raise ShapeError(f"topk: k={k!r} is out of range for {size} elements along dim {dim} of {self.type}",
                                 loc=builder.loc, op="topk")
            largest = _static_bool(largest, "largest", "topk", builder.loc)
            x, axis, order = self._argsort(dim, largest, "topk", builder.loc)
            if k < x.shape[axis]:
                order = order[(slice(None),) * axis + (slice(0, k),)]
            values = x.tracer.emit("gather", (x.id, order.id), dim=axis)
            if self.ndim == 0:
                return ValuesIndices(values.reshape(()), order.reshape(()))
            return ValuesIndices(values, order)

    # ------------------------------------------------------------- floor_divide, remainder
    def floor_divide(self, other: Any):
        """torch.floor_divide: ``self // other`` (float operands: rounded down, torch's algorithm)."""
        return self // other

    def remainder(self, other: Any):
        """torch.remainder: ``self % other`` (float operands: the sign of other)."""
        return self % other

    # ------------------------------------------------------------- scatter, scatter_add, scatter_reduce
    def _scatter(self, op: str, dim: Any, index: Any, src: Any, reduce: str, include_self: bool, loc):
        tracer = self.tracer
        _require_float(self, op, loc)
        if not isinstance(index, SortScatterMethods) or not index.type.is_index:
            raise UnsupportedError(f"{op}: index must be a traced int64 or int32 tensor, got "
                                   f"{getattr(index, 'type', type(index).__name__)}", loc=loc, op=op)
        axis = _dim(dim, self.ndim, op, loc)
        x = self.reshape(1) if self.ndim == 0 else self
        index = index.reshape(1) if index.ndim == 0 else index
        if isinstance(src, SortScatterMethods):
            src = src.reshape(1) if src.ndim == 0 and x.ndim == 1 else src
            if src.type.is_index:
                src = src.float()
        elif isinstance(src, (int, float, np.number)) and not isinstance(src, bool):
            src = tracer.const(float(src)).expand(*index.shape)
        else:
            raise UnsupportedError(f"{op}: src must be a traced tensor or a Python number, got {type(src).__name__}",
                                   loc=loc, op=op)
        shapes = f"self {self.type}, index {index.type}, src {src.type}"
        if index.ndim != x.ndim or src.ndim != x.ndim:
            raise ShapeError(f"{op}: index and src must have self's number of dimensions ({shapes})", loc=loc, op=op)
        for axis_k, size in enumerate(index.shape):
            if size > src.shape[axis_k] or (axis_k != axis and size > x.shape[axis_k]):
                raise ShapeError(f"{op}: index is larger than src, or than self outside dim {axis}, in dimension "
                                 f"{axis_k} ({shapes})", loc=loc, op=op)
        if src.shape != index.shape:
            src = src[tuple(slice(0, size) for size in index.shape)]
        result = tracer.emit("scatter_reduce", (x.id, src.id, index.id), dim=axis, reduce=reduce,
                             include_self=include_self)
        return result.reshape(self.shape)

    def scatter(self, dim: Any, index: Any, src: Any = None, *, value: Any = None, reduce: Any = None):
        """torch.scatter: self with src (or the number ``value``) written at ``index`` along ``dim``; a
        repeated index takes the last src in index order. ``reduce="add"`` / ``"multiply"`` (torch's
        legacy form) are scatter_reduce's sum and prod with self included."""
        with self.tracer.at_user_line("scatter") as builder:
            if (src is None) == (value is None):
                raise UnsupportedError("scatter takes one of src and value", loc=builder.loc, op="scatter")
            if reduce is not None and reduce not in _LEGACY_REDUCES:
                raise UnsupportedError(f"scatter: reduce={reduce!r} must be 'add' or 'multiply'", loc=builder.loc,
                                       op="scatter")
            kind = "assign" if reduce is None else _LEGACY_REDUCES[reduce]
            return self._scatter("scatter", dim, index, value if src is None else src, kind, True, builder.loc)

    def scatter_add(self, dim: Any, index: Any, src: Any):
        """torch.scatter_add: self with src added at ``index`` along ``dim``, in index order."""
        with self.tracer.at_user_line("scatter_add") as builder:
            return self._scatter("scatter_add", dim, index, src, "sum", True, builder.loc)

    def scatter_reduce(self, dim: Any, index: Any, src: Any, reduce: Any, *, include_self: Any = True):
        """torch.scatter_reduce: src combined into self at ``index`` along ``dim`` (reduce sum, prod, mean,
        amax, amin), in index order, self included or not."""
        with self.tracer.at_user_line("scatter_reduce") as builder:
            if reduce not in _SCATTER_REDUCES:
                raise UnsupportedError(f"scatter_reduce: reduce={reduce!r} must be one of {_SCATTER_REDUCES}",
                                       loc=builder.loc, op="scatter_reduce")
            include_self = _static_bool(include_self, "include_self", "scatter_reduce", builder.loc)
            return self._scatter("scatter_reduce", dim, index, src, reduce, include_self, builder.loc)


# bendc.functional.<name>, torch.<name> and torch.Tensor.<name> for each method.
TENSOR_METHODS = ("prod", "cumprod", "flip", "sort", "argsort", "topk", "scatter", "scatter_add", "scatter_reduce",
                  "floor_divide", "remainder")
FUNCTIONS = {name: _function(name) for name in TENSOR_METHODS}
for _name in ("sort", "argsort", "topk"):  # docs/ops.md says what they sort and in which order
    FUNCTIONS[_name].bendc = (f"`Tensor.{_name}` (float32, int64, int32; always stable: ties keep their order of "
                              "position, NaN largest)")
