"""The front-end of the reductions beyond sum/mean: Tensor methods and bendc.functional functions
with PyTorch's names, signatures and semantics.

- ``max`` / ``min``: without ``dim`` a 0-d value (op ``max`` / ``min``); with ``dim`` (and
  ``keepdim``) a named tuple ``(values, indices)``, indices int64: ``argmax`` / ``argmin`` and a
  ``gather`` of x at them, so the gradient goes to the chosen element as in torch.
- ``amax`` / ``amin`` (dim an int or a tuple, () meaning all), ``argmax`` / ``argmin`` (dim None:
  the index into the flattened tensor).
- ``var`` / ``std`` (dim, ``correction`` or the legacy ``unbiased``, keepdim): composed, as the
  two-pass formula sum((x - mean)^2) / max(0, n - correction); torch's Welford moments agree
  within float32 rounding.
- ``logsumexp(dim, keepdim)``: the op (bendc/ops/extrema.py), torch's stable formula and gradient.
- ``cumsum(dim)``: the scan op (bendc/ops/scan.py).

:class:`ReductionMethods` is a base class of :class:`bendc.trace.Tensor`; this module imports no
tracer code, so trace.py can import it.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from bendc.errors import ShapeError, UnsupportedError, user_location
from bendc.tensor_ops import where_nonzero


class ValuesIndices(NamedTuple):
    """What ``x.max(dim)`` / ``x.min(dim)`` return, as torch.return_types.max: values and int64 indices."""

    values: Any
    indices: Any


def _dim(dim: Any, ndim: int, op: str, loc) -> int:
    if isinstance(dim, np.integer):
        dim = int(dim)
    rank = max(ndim, 1)
    if isinstance(dim, bool) or not isinstance(dim, int) or not -rank <= dim < rank:
        raise ShapeError(f"dim {dim!r} is out of range for a tensor of {ndim} dimensions", loc=loc, op=op)
    return dim % rank


def _static_bool(value: Any, name: str, op: str, loc) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise UnsupportedError(f"{name} must be a Python bool, got {type(value).__name__}", loc=loc, op=op)
    return bool(value)


def _not_a_tensor(dim: Any, op: str, loc) -> None:
    if hasattr(dim, "tracer"):
        raise UnsupportedError(f"{op}(x, other) (torch.{'maximum' if op == 'max' else 'minimum'}, elementwise) is "
                               "not supported; pass a dim", loc=loc, op=op)


class ReductionMethods:
    """Tensor methods: max, min, amax, amin, argmax, argmin, var, std, logsumexp, cumsum."""

    # ------------------------------------------------------------- extrema
    def _extremum(self, op: str, dim: Any, keepdim: Any):
        largest = op == "max"
        with self.tracer.at_user_line(op) as builder:
            _not_a_tensor(dim, op, builder.loc)
            keepdim = _static_bool(keepdim, "keepdim", op, builder.loc)
            if dim is None:
                if keepdim:
                    raise UnsupportedError(f"{op}() without dim takes no keepdim (as in torch)",
                                           loc=builder.loc, op=op)
                return self.tracer.emit(op, (self.id,))
            axis = _dim(dim, self.ndim, op, builder.loc)
            x = self.reshape(1) if self.ndim == 0 else self
            index = x.tracer.emit("argmax" if largest else "argmin", (x.id,), dim=axis, keepdim=True)
            values = x.tracer.emit("gather", (x.id, index.id), dim=axis)
            if self.ndim == 0:
                shape = ()
            elif keepdim:
                shape = self.shape[:axis] + (1,) + self.shape[axis + 1:]
            else:
                shape = self.shape[:axis] + self.shape[axis + 1:]
            return ValuesIndices(values.reshape(shape), index.reshape(shape))

    def max(self, dim: Any = None, keepdim: Any = False):
        """torch.max: the largest element (0-d), or (values, indices) along ``dim``."""
        return self._extremum("max", dim, keepdim)

    def min(self, dim: Any = None, keepdim: Any = False):
        """torch.min: the smallest element (0-d), or (values, indices) along ``dim``."""
        return self._extremum("min", dim, keepdim)

    def _amax(self, op: str, dim: Any, keepdim: Any):
        with self.tracer.at_user_line(op) as builder:
            keepdim = _static_bool(keepdim, "keepdim", op, builder.loc)
            dims = self._dims(dim, op, builder.loc)
            return self.tracer.emit(op, (self.id,), dims=dims, keepdim=keepdim)

    def amax(self, dim: Any = (), keepdim: Any = False):
        """torch.amax: the largest elements over ``dim`` (an int or a tuple; () reduces all)."""
        return self._amax("amax", dim, keepdim)

    def amin(self, dim: Any = (), keepdim: Any = False):
        """torch.amin: the smallest elements over ``dim``."""
        return self._amax("amin", dim, keepdim)

    def _arg(self, op: str, dim: Any, keepdim: Any):
        with self.tracer.at_user_line(op) as builder:
            keepdim = _static_bool(keepdim, "keepdim", op, builder.loc)
            if dim is None:  # the index into the flattened tensor
                flat = self.tracer.emit(op, (self.reshape(self.numel()).id,), dim=0, keepdim=False)
                return flat.reshape((1,) * self.ndim) if keepdim else flat
            axis = _dim(dim, self.ndim, op, builder.loc)
            if self.ndim == 0:
                return self.tracer.emit(op, (self.reshape(1).id,), dim=0, keepdim=False)
            return self.tracer.emit(op, (self.id,), dim=axis, keepdim=keepdim)

    def argmax(self, dim: Any = None, keepdim: Any = False):
        """torch.argmax: the first index of the largest element along ``dim`` (None: flattened), int64."""
        return self._arg("argmax", dim, keepdim)

    def argmin(self, dim: Any = None, keepdim: Any = False):
        """torch.argmin: the first index of the smallest element along ``dim`` (None: flattened), int64."""
        return self._arg("argmin", dim, keepdim)

    # ------------------------------------------------------------- moments
    def _moment(self, op: str, dim: Any, unbiased: Any, keepdim: Any, correction: Any):
        with self.tracer.at_user_line(op) as builder:
            if isinstance(dim, (bool, np.bool_)):  # x.var(True): the legacy unbiased flag, positionally
                if unbiased is not None:
                    raise UnsupportedError(f"{op}: unbiased given twice", loc=builder.loc, op=op)
                dim, unbiased = None, bool(dim)
            if unbiased is not None and correction is not None:
                raise UnsupportedError(f"{op}: pass correction or unbiased, not both", loc=builder.loc, op=op)
            if correction is None:
                correction = 1.0 if unbiased is None or _static_bool(unbiased, "unbiased", op, builder.loc) else 0.0
            if isinstance(correction, bool) or not isinstance(correction, (int, float, np.integer, np.floating)):
                raise UnsupportedError(f"{op}: correction must be a Python number, got {type(correction).__name__}",
                                       loc=builder.loc, op=op)
            keepdim = _static_bool(keepdim, "keepdim", op, builder.loc)
            dims = self._dims(dim, op, builder.loc)
            count = math.prod(self.shape[d] for d in dims)
            mean = self.sum(dims, keepdim=True) / float(count)
            deviation = self - mean
            squares = (deviation * deviation).sum(dims, keepdim=keepdim)
            # torch's divisor: max(0, n - correction) (a warning and inf/NaN where it is 0)
            variance = squares / max(0.0, count - float(correction))
            if op == "var":
                return variance
            # torch's std_backward masks its gradient to 0 where the std is 0 (a constant line): a bare
            # sqrt's would be g / 0 there (NaN after the deviations' zeros)
            return where_nonzero(variance, lambda v: v.sqrt())

    def var(self, dim: Any = None, unbiased: Any = None, keepdim: Any = False, *, correction: Any = None):
        """torch.var: sum((x - mean)^2) / max(0, n - correction) over ``dim``; correction 1 by default
        (``unbiased=False`` is correction 0)."""
        return self._moment("var", dim, unbiased, keepdim, correction)

    def std(self, dim: Any = None, unbiased: Any = None, keepdim: Any = False, *, correction: Any = None):
        """torch.std: the square root of var."""
        return self._moment("std", dim, unbiased, keepdim, correction)

    # ------------------------------------------------------------- logsumexp, cumsum
    def logsumexp(self, dim: Any = (), keepdim: Any = False):
        """torch.logsumexp: log(sum(exp(x - m))) + m over ``dim``, m the maximum with infinite
        maxima replaced by 0 (a line of -inf gives -inf, a line holding +inf gives inf)."""
        with self.tracer.at_user_line("logsumexp") as builder:
            keepdim = _static_bool(keepdim, "keepdim", "logsumexp", builder.loc)
            dims = self._dims(dim, "logsumexp", builder.loc)
            return self.tracer.emit("logsumexp", (self.id,), dims=dims, keepdim=keepdim)

    def cumsum(self, dim: Any, *, dtype: Any = None):
        """torch.cumsum: prefix sums along ``dim`` (accumulated in float64, as torch's CPU kernel)."""
        with self.tracer.at_user_line("cumsum") as builder:
            if dtype is not None:
                raise UnsupportedError(f"cumsum: dtype={dtype!r} is not supported (float32 only)",
                                       loc=builder.loc, op="cumsum")
            axis = _dim(dim, self.ndim, "cumsum", builder.loc)
            if self.ndim == 0:
                return self.tracer.emit("cumsum", (self.reshape(1).id,), dim=0, reverse=False).reshape(())
            return self.tracer.emit("cumsum", (self.id,), dim=axis, reverse=False)


def _function(name: str):
    def function(input: Any, *args: Any, **kwargs: Any):
        if not isinstance(input, ReductionMethods):
            raise UnsupportedError(f"{name} expects a traced tensor, got {type(input).__name__}",
                                   loc=user_location(), op=name)
        return getattr(input, name)(*args, **kwargs)

    function.__name__ = function.__qualname__ = name
    function.__doc__ = f"torch.{name}(input, ...): ``input.{name}(...)``."
    return function


# bendc.functional.<name>(x, ...) for each method (functional.py's __getattr__ reads this table, so that
# ``max`` and ``min`` do not shadow the builtins inside functional.py).
FUNCTIONS = {name: _function(name) for name in (
    "max", "min", "amax", "amin", "argmax", "argmin", "var", "std", "logsumexp", "cumsum")}
