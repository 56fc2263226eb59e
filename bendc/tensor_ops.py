"""Tensor methods of the op-coverage issue: comparisons, casts, selection, powers and shapes.

:class:`TensorOps` is mixed into :class:`bendc.trace.Tensor`; each method records ops through the
tracer with PyTorch's names and semantics. Comparisons give bool tensors; a bool operand of
arithmetic, ``where`` or a comparison is promoted to float32 (``to_float``), as PyTorch promotes it
(a bool tensor with a Python int gives float32 here, int64 in PyTorch: the same values). Only
Python control flow on a traced value (``if t > 0:``) is refused, by ``Tensor.__bool__``.

This module imports nothing of the tracer at import time (bendc.trace imports it).
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Sequence

import numpy as np

from bendc.errors import ShapeError, UnsupportedError, user_location
from bendc.ops.base import f32_value
from bendc.ir.types import DTYPES

_COMPARISONS = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_FLOAT_NAMES = ("float32", "float")


def _dim(dim: Any, ndim: int, op: str, loc) -> int:
    """A dim in [-rank, rank) as a non-negative int (rank: ndim, at least 1), or a ShapeError."""
    rank = max(ndim, 1)
    if isinstance(dim, np.integer):
        dim = int(dim)
    if isinstance(dim, bool) or not isinstance(dim, int) or not -rank <= dim < rank:
        raise ShapeError(f"dim {dim!r} is out of range for a tensor of {ndim} dimensions", loc=loc, op=op)
    return dim % rank


def _sizes(sizes: tuple, op: str, loc) -> tuple[int, ...]:
    """``f(2, 3)`` or ``f((2, 3))`` as a tuple of ints."""
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        sizes = tuple(sizes[0])
    if any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) for s in sizes):
        raise UnsupportedError(f"sizes must be ints, got {sizes!r}", loc=loc, op=op)
    return tuple(int(s) for s in sizes)


def _is_number(value: Any) -> bool:
    return isinstance(value, (bool, numbers.Real)) and not isinstance(value, np.ndarray)


def _is_torch_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "shape") and hasattr(value, "item")


def dtype_text(dtype: Any) -> str:
    """A dtype's name as the user wrote it: ``torch.float32`` -> "float32", np.float32 -> "float32"."""
    if isinstance(dtype, str):
        return dtype.removeprefix("torch.")
    if type(dtype).__module__.startswith("torch"):
        return str(dtype).removeprefix("torch.")
    try:
        return np.dtype(dtype).name
    except TypeError:
        return repr(dtype)


def _is_dtype(value: Any) -> bool:
    if type(value).__module__.startswith("torch"):
        return type(value).__name__ == "dtype"
    if isinstance(value, str):
        return value.removeprefix("torch.") in _FLOAT_NAMES or value.removeprefix("torch.") in (
            "float16", "half", "bfloat16", "float64", "double", "int64", "long", "int32", "int", "bool")
    return isinstance(value, type) and issubclass(value, np.generic) or isinstance(value, np.dtype)


def _is_device(value: Any) -> bool:
    if type(value).__module__.startswith("torch") and type(value).__name__ == "device":
        return True
    return isinstance(value, str) and value.split(":")[0] in ("cpu", "cuda", "meta", "mps")


class TensorOps:
    """Comparisons, casts, selection, powers and shape methods of a traced tensor (PyTorch's)."""

    __slots__ = ()
    __hash__ = object.__hash__  # tensors are hashed by identity

    # ------------------------------------------------------------- promotion
    def _as_float(self):
        """self as float32: a bool or integer tensor through ``to_float``, a float one as it is."""
        if self.type.is_float:
            return self
        return self.tracer.emit("to_float", (self.id,))

    def _operand(self, other: Any, op: str):
        return self.tracer.value(other, op)

    def _promoted(self, a, b, op: str, number_is_bool: bool = False):
        """PyTorch's promotion of two arithmetic operands: a bool one becomes float32 (integer ones stay,
        and the op refuses them). PyTorch refuses a bool operand of - ; two bool operands of + or *
        (a Python bool counts) give a bool result, which bendc does not compute: refused too."""
        bools = a.type.dtype == "bool", b.type.dtype == "bool"
        if op == "sub" and any(bools):
            raise UnsupportedError(f"subtraction with a bool tensor ({a.type}, {b.type}) is not supported (as in "
                                   "PyTorch); convert with .float() first", loc=self.tracer.builder.loc, op=op)
        if op in ("add", "mul") and (all(bools) or (any(bools) and number_is_bool)):
            raise UnsupportedError(f"{op} of two bools ({a.type}, {b.type}) is a bool result in PyTorch, which "
                                   "bendc does not compute; convert with .float() first",
                                   loc=self.tracer.builder.loc, op=op)
        return tuple(t._as_float() if t.type.dtype == "bool" else t for t in (a, b))

    # ------------------------------------------------------------- comparisons
    def _compare(self, other: Any, op: str):
        if not (isinstance(other, TensorOps) or _is_number(other) or (
                type(other).__module__.startswith("torch") and getattr(other, "shape", None) == ())):
            if op in ("eq", "ne"):
                return NotImplemented  # Python then compares identities (x == None is False)
            raise UnsupportedError(f"comparing traced tensor {self.type} {_COMPARISONS[op]} "
                                   f"{type(other).__name__} is not supported (tensors and numbers)",
                                   loc=user_location(), op=op)
        with self.tracer.at_user_line(op):
            if self.type.is_index and isinstance(other, (int, np.integer)) and not isinstance(other, (bool, np.bool_)):
                other = self.tracer.int_const(int(other), self.type.dtype)  # exact for every int (float32 is not)
            other = self._operand(other, op)
            a, b = self, other
            if not (a.type.is_index and b.type.is_index):
                a, b = a._as_float(), b._as_float()
            return self.tracer.emit(op, (a.id, b.id))

    def __lt__(self, other): return self._compare(other, "lt")
    def __le__(self, other): return self._compare(other, "le")
    def __gt__(self, other): return self._compare(other, "gt")
    def __ge__(self, other): return self._compare(other, "ge")
    def __eq__(self, other): return self._compare(other, "eq")
    def __ne__(self, other): return self._compare(other, "ne")

    lt, le, gt, ge, eq, ne = __lt__, __le__, __gt__, __ge__, __eq__, __ne__

    # ------------------------------------------------------------- logic on bool masks
    def _bool_operand(self, value: Any, op: str):
        if isinstance(value, (bool, np.bool_)):
            return self.tracer.const(float(value))
        if not isinstance(value, TensorOps) or value.type.dtype != "bool":
            what = value.type if isinstance(value, TensorOps) else type(value).__name__
            raise UnsupportedError(f"{op} takes bool tensors (masks such as x > 0) or Python bools, got {what}",
                                   loc=self.tracer.builder.loc, op=op)
        return value._as_float()

    def _logic(self, other: Any, op: str):
        """and/or/xor of bool masks, composed as float32 0/1 compares (one fused kernel, exact)."""
        with self.tracer.at_user_line(op):
            a, b = self._bool_operand(self, op), self._bool_operand(other, op)
            tracer = self.tracer
            if op == "logical_xor":
                return tracer.emit("ne", (a.id, b.id))
            half = tracer.const(0.5)
            if op == "logical_and":
                picked = tracer.emit("where", (self.id, b.id, tracer.const(0.0).id))
            else:
                picked = tracer.emit("where", (self.id, tracer.const(1.0).id, b.id))
            return tracer.emit("gt", (picked.id, half.id))

    def logical_and(self, other): return self._logic(other, "logical_and")
    def logical_or(self, other): return self._logic(other, "logical_or")
    def logical_xor(self, other): return self._logic(other, "logical_xor")
    __and__ = __rand__ = logical_and
    __or__ = __ror__ = logical_or
    __xor__ = __rxor__ = logical_xor

    def logical_not(self):
        with self.tracer.at_user_line("logical_not"):
            a = self._bool_operand(self, "logical_not")
            return self.tracer.emit("eq", (a.id, self.tracer.const(0.0).id))

    __invert__ = logical_not

    # ------------------------------------------------------------- casts
    def float(self):
        """float32: a bool tensor gives 1.0 / 0.0, an integer one its values; a float one is itself."""
        with self.tracer.at_user_line("float"):
            return self._as_float()

    def to(self, *args: Any, **kwargs: Any):
        """``to(torch.float32)``, ``to("cpu")``, ``to(device, dtype)``, ``to(other)``: float32 is the only
        dtype (bool and integer tensors convert to it); a device is a no-op (the target places data)."""
        with self.tracer.at_user_line("to") as builder:
            dtype = kwargs.pop("dtype", None)
            kwargs.pop("device", None)
            for key in ("non_blocking", "copy", "memory_format"):
                kwargs.pop(key, None)
            if kwargs:
                raise UnsupportedError(f"to(): arguments {sorted(kwargs)} are not supported", loc=builder.loc,
                                       op="to")
            for arg in args:
                if isinstance(arg, TensorOps):
                    dtype = "float32" if arg.type.is_float else arg.type.dtype
                elif _is_dtype(arg):
                    dtype = arg
                elif not (_is_device(arg) or isinstance(arg, bool)):
                    raise UnsupportedError(f"to({arg!r}) is not supported (a dtype, a device or a tensor)",
                                           loc=builder.loc, op="to")
            if dtype is None:
                return self
            name = dtype_text(dtype)
            if _DTYPE_NAMES.get(name) in ("i64", "i32"):
                return self._to_int(_DTYPE_NAMES[name], "to")
            if name not in _FLOAT_NAMES:
                raise UnsupportedError(f"to({name}) of {self.type}: bendc computes in float32 only "
                                       "(bfloat16, float16, float64 and integer results are not supported)",
                                       loc=builder.loc, op="to")
            return self._as_float()

    def _unsupported_cast(self, name: str):
        raise UnsupportedError(f"{name}() of {self.type}: bendc computes in float32 only (use .float())",
                               loc=user_location(), op=name)

    def double(self): self._unsupported_cast("double")
    def half(self): self._unsupported_cast("half")
    def bfloat16(self): self._unsupported_cast("bfloat16")

    def _to_int(self, dtype: str, op: str):
        with self.tracer.at_user_line(op):
            if self.type.dtype == dtype:
                return self
            return self.tracer.emit("to_int", (self.id,), dtype=dtype)

    def long(self):
        """int64: bools as 1 / 0, floats truncated toward zero (no gradient)."""
        return self._to_int("i64", "long")

    def int(self):
        """int32: bools as 1 / 0, floats truncated toward zero (no gradient)."""
        return self._to_int("i32", "int")

    def cpu(self):
        """A no-op: the jit target places the data."""
        return self

    def cuda(self, device: Any = None, non_blocking: bool = False, memory_format: Any = None):
        """A no-op, as cpu(): the jit target places the data."""
        return self

    def detach(self):
        """The same values, requiring no gradient."""
        with self.tracer.at_user_line("detach"):
            if not self.requires_grad:
                return self
            return self.tracer.emit("detach", (self.id,))

    def contiguous(self, memory_format: Any = None):
        """Itself: bendc's values have no user-visible strides."""
        return self

    # ------------------------------------------------------------- selection
    def where(self, condition, other):
        """torch.Tensor.where: ``torch.where(condition, self, other)``."""
        return where(condition, self, other)

    def masked_fill(self, mask, value):
        """``value`` (a number or a 0-d tensor) where the bool ``mask`` is true, else self."""
        with self.tracer.at_user_line("masked_fill") as builder:
            if isinstance(value, TensorOps) and value.ndim != 0:
                raise ShapeError(f"masked_fill takes a number or a 0-d tensor value, got {value.type}",
                                 loc=builder.loc, op="masked_fill")
            return where(mask, value, self)

    def clamp(self, min: Any = None, max: Any = None):
        """min(max(self, min), max), NaN kept; min and max are numbers or tensors, either None.
        The gradient passes to self where min <= self <= max (both ends included), as PyTorch's."""
        with self.tracer.at_user_line("clamp") as builder:
            if min is None and max is None:
                raise UnsupportedError("clamp needs min or max (at least one not None)", loc=builder.loc,
                                       op="clamp")
            bounds = [bound for bound in (min, max) if bound is not None]
            integer = _integer_operands(self.tracer, (self, *bounds))
            if integer is not None:  # an integer tensor between ints: an integer result, as torch's
                result, given = integer[0], iter(integer[1:])
                if min is not None:
                    low = next(given)
                    result = where(result < low, low, result)
                if max is not None:
                    high = next(given)
                    result = where(result > high, high, result)
                return result
            low = self.tracer.const(-math.inf) if min is None else self._operand(min, "clamp")._as_float()
            high = self.tracer.const(math.inf) if max is None else self._operand(max, "clamp")._as_float()
            return self.tracer.emit("clamp", (self._as_float().id, low.id, high.id), lower=min is not None,
                                    upper=max is not None)

    def clip(self, min: Any = None, max: Any = None):
        return self.clamp(min, max)

    def clamp_min(self, min: Any):
        return self.clamp(min=min)

    def clamp_max(self, max: Any):
        return self.clamp(max=max)

    def __abs__(self):
        return self.abs()

    # ------------------------------------------------------------- powers
    def pow(self, exponent: Any):
        return self.__pow__(exponent)

    def __pow__(self, exponent: Any):
        """self ** e: a number e (any float; 2 and 1 as before: x * x and x itself), or a tensor."""
        with self.tracer.at_user_line("pow") as builder:
            if isinstance(exponent, TensorOps):
                a, b = self._promoted(self, self._operand(exponent, "pow"), "pow")
                return self.tracer.emit("pow", (a.id, b.id))
            if isinstance(exponent, bool) or not _is_number(exponent) and not (
                    type(exponent).__module__.startswith("torch") and getattr(exponent, "shape", None) == ()):
                raise UnsupportedError(f"exponent of type {type(exponent).__name__} is not supported (a Python "
                                       f"number or a tensor) for {self.type}", loc=builder.loc, op="pow")
            e = float(exponent.item()) if hasattr(exponent, "item") else float(exponent)
            x = self._as_float()
            if e == 1.0:
                return x
            if e == 2.0:  # bit for bit PyTorch's x * x and its gradient g * (2 * x)
                return x * x
            return self.tracer.emit("pow_scalar", (x.id,), exponent=e)

    def __rpow__(self, base: Any):
        """number ** self: torch.pow(number, tensor), the number a constant base."""
        with self.tracer.at_user_line("pow") as builder:
            if isinstance(base, bool) or not _is_number(base):
                raise UnsupportedError(f"base of type {type(base).__name__} is not supported (a Python number)",
                                       loc=builder.loc, op="pow")
            return self.tracer.emit("pow", (self.tracer.const(base).id, self._as_float().id))

    # ------------------------------------------------------------- shapes
    def flatten(self, start_dim: int = 0, end_dim: int = -1):
        """Dims start_dim..end_dim merged into one (a 0-d tensor becomes 1-D)."""
        with self.tracer.at_user_line("flatten") as builder:
            start = _dim(start_dim, self.ndim, "flatten", builder.loc)
            end = _dim(end_dim, self.ndim, "flatten", builder.loc)
            if self.ndim == 0:
                return self.reshape(1)
            if start > end:
                raise ShapeError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} for {self.type}",
                                 loc=builder.loc, op="flatten")
            merged = int(math.prod(self.shape[start:end + 1]))
            return self.reshape(self.shape[:start] + (merged,) + self.shape[end + 1:])

    def unflatten(self, dim: int, sizes: Any):
        """torch's unflatten (nn.Unflatten's forward): dim ``dim`` split into ``sizes``, a non-empty tuple
        or list of ints whose product is its size (one -1 is inferred)."""
        with self.tracer.at_user_line("unflatten") as builder:
            if self.ndim == 0:
                raise ShapeError("unflatten of a 0-d tensor", loc=builder.loc, op="unflatten")
            axis = _dim(dim, self.ndim, "unflatten", builder.loc)
            if not isinstance(sizes, (tuple, list)) or not sizes or any(
                    isinstance(s, bool) or not isinstance(s, (int, np.integer)) for s in sizes):
                raise ShapeError(f"unflatten: sizes {sizes!r} must be a non-empty tuple or list of ints (named "
                                 "dimensions are not supported)", loc=builder.loc, op="unflatten")
            sizes = tuple(int(s) for s in sizes)
            size = self.shape[axis]
            known = int(math.prod(s for s in sizes if s != -1))
            if sizes.count(-1) > 1 or any(s < -1 for s in sizes) or (
                    -1 in sizes and (known == 0 or size % known)) or (-1 not in sizes and known != size):
                raise ShapeError(f"unflatten: sizes {sizes} do not split dim {dim} of size {size} of {self.type}",
                                 loc=builder.loc, op="unflatten")
            sizes = tuple(size // known if s == -1 else s for s in sizes)
            return self.reshape(self.shape[:axis] + sizes + self.shape[axis + 1:])

    def squeeze(self, dim: Any = None):
        """Size-1 dims removed: all of them, or those of ``dim`` (an int or a tuple) that are size 1."""
        with self.tracer.at_user_line("squeeze") as builder:
            if dim is None:
                dims = set(range(self.ndim))
            else:
                dims = {_dim(d, self.ndim, "squeeze", builder.loc)
                        for d in (dim if isinstance(dim, (tuple, list)) else (dim,))}
            shape = tuple(size for axis, size in enumerate(self.shape) if not (axis in dims and size == 1))
            return self.reshape(shape) if shape != self.shape else self

    def expand(self, *sizes: Any):
        """A broadcast view of the sizes given (-1 keeps a dim's size; new dims lead)."""
        with self.tracer.at_user_line("expand") as builder:
            sizes = _sizes(sizes, "expand", builder.loc)
            lead = len(sizes) - self.ndim
            if lead < 0:
                raise ShapeError(f"expand to {list(sizes)}: fewer sizes than the {self.ndim} dims of {self.type}",
                                 loc=builder.loc, op="expand")
            shape = []
            for axis, size in enumerate(sizes):
                if size == -1:
                    if axis < lead:
                        raise ShapeError(f"expand to {list(sizes)}: -1 is not allowed for a new leading dim",
                                         loc=builder.loc, op="expand")
                    size = self.shape[axis - lead]
                if size < 0 or (axis >= lead and self.shape[axis - lead] not in (1, size)):
                    raise ShapeError(f"cannot expand {self.type} to {list(sizes)} (dimension {axis})",
                                     loc=builder.loc, op="expand")
                shape.append(size)
            if tuple(shape) == self.shape:
                return self
            return self.tracer.emit("expand", (self.id,), shape=tuple(shape))

    def expand_as(self, other):
        return self.expand(*other.shape)

    def repeat(self, *sizes: Any):
        """torch.Tensor.repeat: the tensor tiled sizes[i] times along dim i (leading new dims)."""
        with self.tracer.at_user_line("repeat") as builder:
            sizes = _sizes(sizes, "repeat", builder.loc)
            if len(sizes) < self.ndim or any(s < 0 for s in sizes):
                raise ShapeError(f"repeat{sizes}: needs at least {self.ndim} non-negative sizes for {self.type}",
                                 loc=builder.loc, op="repeat")
            shape = (1,) * (len(sizes) - self.ndim) + self.shape
            if all(s == 1 for s in sizes):
                return self.reshape(shape) if shape != self.shape else self
            paired = tuple(d for size in shape for d in (1, size))
            tiled = tuple(d for repeat, size in zip(sizes, shape) for d in (repeat, size))
            spread = self.reshape(paired)
            expanded = self.tracer.emit("expand", (spread.id,), shape=tiled)
            return expanded.reshape(tuple(r * s for r, s in zip(sizes, shape)))

    def _narrow(self, axis: int, start: int, stop: int, **attrs: Any):
        """self[..., start:stop, ...] on ``axis`` (a view: the index op, with ``attrs`` on its node)."""
        return self._index((slice(None),) * axis + (slice(start, stop),), **attrs)

    def split(self, split_size_or_sections: Any, dim: int = 0):
        """Pieces along ``dim``: of split_size each (the last smaller), or of the sizes listed."""
        with self.tracer.at_user_line("split") as builder:
            axis = _dim(dim, self.ndim, "split", builder.loc)
            if self.ndim == 0:
                raise ShapeError("split of a 0-d tensor", loc=builder.loc, op="split")
            size = self.shape[axis]
            if isinstance(split_size_or_sections, (int, np.integer)) and not isinstance(split_size_or_sections, bool):
                step = int(split_size_or_sections)
                if step < 0 or (step == 0 and size != 0):
                    raise ShapeError(f"split_size {step} must be positive (dimension {axis} of {self.type})",
                                     loc=builder.loc, op="split")
                sections = [min(step, size - start) for start in range(0, size, step)] if size else [0]
            else:
                sections = list(_sizes((tuple(split_size_or_sections),), "split", builder.loc))
                if any(s < 0 for s in sections) or sum(sections) != size:
                    raise ShapeError(f"split sizes {sections} must be non-negative and sum to {size} (dimension "
                                     f"{axis} of {self.type})", loc=builder.loc, op="split")
            # each piece an index view numbered by its split call: the VJP of a whole split is then
            # torch's split_backward, the pieces' gradients concatenated (passes/canonicalize.py)
            self.tracer.splits += 1
            pieces, start = [], 0
            for length in sections:
                pieces.append(self._narrow(axis, start, start + length, split=self.tracer.splits))
                start += length
            return tuple(pieces)

    def chunk(self, chunks: int, dim: int = 0):
        """torch.chunk: split into pieces of ceil(size / chunks) (possibly fewer than chunks)."""
        with self.tracer.at_user_line("chunk") as builder:
            if isinstance(chunks, bool) or not isinstance(chunks, (int, np.integer)) or chunks <= 0:
                raise ShapeError(f"chunk expects a positive number of chunks, got {chunks!r}", loc=builder.loc,
                                 op="chunk")
            axis = _dim(dim, self.ndim, "chunk", builder.loc)
            size = self.shape[axis] if self.ndim else 1
            if size == 0:
                return self.split([0] * int(chunks), axis)
            return self.split(-(-size // int(chunks)), axis)

    def unbind(self, dim: int = 0):
        """The slices along ``dim``, that dim removed."""
        with self.tracer.at_user_line("unbind") as builder:
            axis = _dim(dim, self.ndim, "unbind", builder.loc)
            return tuple(self[(slice(None),) * axis + (i,)] for i in range(self.shape[axis]))

    def _triangle(self, diagonal: int, upper: bool):
        op = "triu" if upper else "tril"
        with self.tracer.at_user_line(op) as builder:
            if isinstance(diagonal, bool) or not isinstance(diagonal, (int, np.integer)):
                raise UnsupportedError(f"{op}: diagonal must be an int, got {diagonal!r}", loc=builder.loc, op=op)
            return self.tracer.emit("triangle", (self.id,), diagonal=int(diagonal), upper=upper)

    def tril(self, diagonal: int = 0):
        """Elements with column - row <= diagonal over the last two dims, +0.0 elsewhere."""
        return self._triangle(diagonal, False)

    def triu(self, diagonal: int = 0):
        """Elements with column - row >= diagonal over the last two dims, +0.0 elsewhere."""
        return self._triangle(diagonal, True)


# ------------------------------------------------------------------ functions (bendc.functional's)
def tracer_of(op: str, values: Sequence[Any]):
    """The tracer of the first traced tensor among values; without one, a clear error (these functions
    take traced tensors)."""
    for value in values:
        if isinstance(value, TensorOps):
            return value.tracer
    raise UnsupportedError("expected traced tensors (parameters of a bendc.jit function, or values computed "
                           "from them)", loc=user_location(), op=op)


def where(condition: Any, input: Any, other: Any):
    """torch.where(condition, input, other): input where the bool condition holds, else other;
    input and other are tensors or numbers, broadcast together."""
    tracer = tracer_of("where", (condition, input, other))
    with tracer.at_user_line("where") as builder:
        if _is_torch_tensor(condition):  # a captured mask: a constant of the graph
            condition = tracer.value(condition, "where")
        if not isinstance(condition, TensorOps) or condition.type.dtype != "bool":
            what = condition.type if isinstance(condition, TensorOps) else type(condition).__name__
            raise UnsupportedError(f"where needs a bool condition tensor (a comparison such as x > 0), got {what}",
                                   loc=builder.loc, op="where")
        integer = _integer_operands(tracer, (input, other))
        if integer is not None:  # torch's promotion: integer tensors and ints give an integer result
            return tracer.emit("where", (condition.id, integer[0].id, integer[1].id))
        a = tracer.value(input, "where")._as_float()
        b = tracer.value(other, "where")._as_float()
        return tracer.emit("where", (condition.id, a.id, b.id))


def where_nonzero(x: Any, f: Callable) -> Any:
    """f(x) where x != 0, else 0. f is given 1 at x's zeros, so a sqrt, power or log taken there puts no
    inf or NaN into a gradient: torch's backwards mask theirs to 0 at a zero std, norm or xlogy."""
    zero = x == 0.0
    return where(zero, 0.0, f(where(zero, 1.0, x)))


def _integer_operands(tracer, operands: Sequence[Any]) -> tuple | None:
    """Integer tensors and Python ints (at least one tensor) as tensors of their promoted dtype (int64
    where one is int64, else int32: PyTorch's), or None where any operand is another kind (floats and
    bools: the float32 path)."""
    tensors = [v for v in operands if isinstance(v, TensorOps)]
    if not tensors or not all(t.type.is_index for t in tensors) or not all(
            isinstance(v, TensorOps) or (isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)))
            for v in operands):
        return None
    dtype = "i64" if any(t.type.dtype == "i64" for t in tensors) else "i32"
    return tuple(tracer.int_const(int(v), dtype) if not isinstance(v, TensorOps) else
                 v if v.type.dtype == dtype else tracer.emit("to_int", (v.id,), dtype=dtype) for v in operands)


def cat(tensors: Sequence[Any], dim: int = 0):
    """torch.cat: the tensors joined along dim (equal elsewhere); bool ones among float ones promoted."""
    tensors = list(tensors) if isinstance(tensors, (tuple, list)) else tensors
    tracer = tracer_of("cat", tensors if isinstance(tensors, list) else ())
    with tracer.at_user_line("cat") as builder:
        if not isinstance(tensors, list) or not tensors or not all(isinstance(t, TensorOps) for t in tensors):
            raise UnsupportedError("cat takes a non-empty list or tuple of traced tensors", loc=builder.loc, op="cat")
        if not any(t.type.is_float for t in tensors):
            raise UnsupportedError(f"cat of {', '.join(str(t.type) for t in tensors)}: float32 tensors only "
                                   "(convert with .float())", loc=builder.loc, op="cat")
        tensors = [t._as_float() for t in tensors]
        axis = _dim(dim, tensors[0].ndim, "cat", builder.loc)
        if tensors[0].ndim == 0:
            raise ShapeError("zero-dimensional tensors cannot be concatenated", loc=builder.loc, op="cat")
        if len(tensors) == 1:
            return tensors[0]
        return tracer.emit("concat", tuple(t.id for t in tensors), axis=axis)


def stack(tensors: Sequence[Any], dim: int = 0):
    """torch.stack: tensors of one shape joined along a new dim."""
    tensors = list(tensors) if isinstance(tensors, (tuple, list)) else tensors
    tracer = tracer_of("stack", tensors if isinstance(tensors, list) else ())
    with tracer.at_user_line("stack") as builder:
        if not isinstance(tensors, list) or not tensors or not all(isinstance(t, TensorOps) for t in tensors):
            raise UnsupportedError("stack takes a non-empty list or tuple of traced tensors", loc=builder.loc,
                                   op="stack")
        shape = tensors[0].shape
        if any(t.shape != shape for t in tensors):
            raise ShapeError(f"stack expects tensors of one shape, got {', '.join(str(t.type) for t in tensors)}",
                             loc=builder.loc, op="stack")
        axis = _dim(dim, len(shape) + 1, "stack", builder.loc)
        widened = [t.reshape(shape[:axis] + (1,) + shape[axis:]) for t in tensors]
        return cat(widened, axis)


def pad(input: Any, pad: Sequence[int], mode: str = "constant", value: Any = None):
    """torch.nn.functional.pad: pad = (left, right) pairs from the last dim backward. Constant mode pads
    with ``value`` (0.0 when None; a negative pad cuts that many elements); reflect, replicate and circular
    pad the last 1-3 dims of a (pads+1)- or (pads+2)-dim input, as torch, from slices of the input (so
    their gradients are the slices' gradients, summed)."""
    tracer = tracer_of("pad", (input,))
    with tracer.at_user_line("pad") as builder:
        if mode not in ("constant",) + PAD_MODES:
            raise UnsupportedError(f"pad mode {mode!r} is not supported (constant, {', '.join(PAD_MODES)})",
                                   loc=builder.loc, op="pad")
        if not isinstance(input, TensorOps):
            raise UnsupportedError("pad takes a traced tensor", loc=builder.loc, op="pad")
        amounts = _sizes((tuple(pad),), "pad", builder.loc)
        if len(amounts) % 2 or len(amounts) > 2 * input.ndim:
            raise ShapeError(f"pad {list(amounts)}: needs pairs, at most {input.ndim} of them for {input.type}",
                             loc=builder.loc, op="pad")
        if mode != "constant":
            return _pad_from_input(input._as_float(), amounts, mode, builder.loc)
        fill = 0.0 if value is None else value
        if isinstance(fill, TensorOps) or not _is_number(fill):
            raise UnsupportedError(f"pad value must be a Python number, got {type(fill).__name__}",
                                   loc=builder.loc, op="pad")
        out = input._as_float()
        for pair in range(len(amounts) // 2):
            axis = out.ndim - 1 - pair
            left, right = amounts[2 * pair], amounts[2 * pair + 1]
            size = out.shape[axis]
            if size + left + right < 0:
                raise ShapeError(f"pad {list(amounts)} leaves dimension {axis} of {input.type} a negative size",
                                 loc=builder.loc, op="pad")
            if left < 0 or right < 0:
                start, stop = max(-left, 0), size - max(-right, 0)
                out = out._narrow(axis, start, max(stop, start))
            parts = []
            for amount in (left, None, right):
                if amount is None:
                    parts.append(out)
                elif amount > 0:
                    shape = out.shape[:axis] + (amount,) + out.shape[axis + 1:]
                    parts.append(tracer.emit("expand", (tracer.const(f32_value(float(fill))).id,), shape=shape))
            if len(parts) > 1:
                out = tracer.emit("concat", tuple(p.id for p in parts), axis=axis)
        return out


PAD_MODES = ("reflect", "replicate", "circular")


def _flipped(x: Any, axis: int):
    return x[(slice(None),) * axis + (slice(None, None, -1),)]


def _pad_from_input(x: Any, amounts: tuple[int, ...], mode: str, loc):
    """reflect / replicate / circular padding: each side is a slice of x (reversed for reflect, one
    element repeated for replicate, the other end for circular), concatenated to it, dim by dim."""
    dims = len(amounts) // 2
    if not 1 <= dims <= 3 or x.ndim not in (dims + 1, dims + 2):
        raise ShapeError(f"pad mode {mode!r} with {dims} pad pairs needs a {dims + 1}-D or {dims + 2}-D input "
                         f"(torch pads the last 1, 2 or 3 dims of an unbatched or batched input), got {x.type}",
                         loc=loc, op="pad")
    out = x
    for pair in range(dims):
        axis = out.ndim - 1 - pair
        left, right = amounts[2 * pair], amounts[2 * pair + 1]
        size = out.shape[axis]
        if left < 0 or right < 0:
            raise ShapeError(f"pad mode {mode!r}: negative pad {list(amounts)} is not supported (constant mode "
                             "cuts)", loc=loc, op="pad")
        if mode == "reflect" and max(left, right) >= size:
            raise ShapeError(f"pad mode 'reflect': pad {list(amounts)} must be smaller than dimension {axis} "
                             f"({size}) of {x.type}", loc=loc, op="pad")
        if mode == "circular" and max(left, right) > size:
            raise ShapeError(f"pad mode 'circular': pad {list(amounts)} must be at most dimension {axis} "
                             f"({size}) of {x.type}", loc=loc, op="pad")
        if mode == "replicate" and size == 0 and left + right > 0:
            raise ShapeError(f"pad mode 'replicate' of an empty dimension {axis} of {x.type}", loc=loc, op="pad")
        parts = []
        if left:
            if mode == "reflect":
                parts.append(_flipped(out._narrow(axis, 1, left + 1), axis))
            elif mode == "replicate":
                parts.append(out._narrow(axis, 0, 1).expand(*(out.shape[:axis] + (left,) + out.shape[axis + 1:])))
            else:
                parts.append(out._narrow(axis, size - left, size))
        parts.append(out)
        if right:
            if mode == "reflect":
                parts.append(_flipped(out._narrow(axis, size - 1 - right, size - 1), axis))
            elif mode == "replicate":
                parts.append(out._narrow(axis, size - 1, size).expand(
                    *(out.shape[:axis] + (right,) + out.shape[axis + 1:])))
            else:
                parts.append(out._narrow(axis, 0, right))
        if len(parts) > 1:
            out = out.tracer.emit("concat", tuple(p.id for p in parts), axis=axis)
    return out


# ------------------------------------------------------------------ creation (issue 22): constants of the graph
# torch's creation functions inside a traced function: the values are constants of the graph (iota,
# literal and const ops, folded into the kernels that read them); ``device=`` is accepted and ignored
# (the jit target places data), ``dtype=`` is float32, int64, int32 or bool.
_DTYPE_NAMES = {"float32": "f32", "float": "f32", "int64": "i64", "long": "i64", "int32": "i32", "int": "i32",
                "bool": "bool"}
_TORCH_DTYPE = {"f32": "float32", "i64": "int64", "i32": "int32", "bool": "bool"}
_IGNORED = ("device", "layout", "pin_memory", "memory_format", "names", "generator")


# The tracer of the function being traced: bendc.trace registers its lookup here when it is
# imported (this module imports nothing of the tracer: bendc.trace imports it).
ACTIVE_TRACER: list[Callable[[str], Any]] = []


def _creation_tracer(op: str, values: Sequence[Any] = ()):
    for value in values:
        if isinstance(value, TensorOps):
            return value.tracer
    return ACTIVE_TRACER[0](op)


def ir_dtype(dtype: Any, default: str, op: str, loc) -> str:
    """bendc's dtype name for a torch or numpy dtype (None: ``default``), or an UnsupportedError."""
    if dtype is None:
        return default
    name = _DTYPE_NAMES.get(dtype_text(dtype))
    if name is None:
        raise UnsupportedError(f"{op}(dtype={dtype_text(dtype)}): bendc computes in float32 with int64, int32 and "
                               "bool tensors (bfloat16, float16 and float64 are not supported)", loc=loc, op=op)
    return name


def torch_dtype_name(dtype: str) -> str:
    """The torch name of a bendc dtype: "f32" -> "float32"."""
    return _TORCH_DTYPE[dtype]


def _creation_options(op: str, kwargs: dict, loc) -> Any:
    """The dtype of a creation call's keyword arguments; device and layout options are accepted."""
    dtype = kwargs.pop("dtype", None)
    for key in _IGNORED:
        kwargs.pop(key, None)
    if kwargs.pop("requires_grad", False):
        raise UnsupportedError(f"{op}(requires_grad=True): a tensor made inside a traced function is a constant; "
                               "name a parameter of the jitted function in jit(leaves=...) instead", loc=loc, op=op)
    if kwargs.pop("out", None) is not None:
        raise UnsupportedError(f"{op}(out=...) is not supported", loc=loc, op=op)
    if kwargs:
        raise UnsupportedError(f"{op}: arguments {sorted(kwargs)} are not supported", loc=loc, op=op)
    return dtype


def _static_number(value: Any, name: str, op: str, loc) -> Any:
    if isinstance(value, TensorOps):
        raise UnsupportedError(f"{op}: {name} must be a Python number, not a traced tensor {value.type} (the shape "
                               "of a made tensor is known while tracing)", loc=loc, op=op)
    if type(value).__module__.startswith("torch") and getattr(value, "shape", None) == ():
        value = value.item()
    if isinstance(value, np.generic):
        value = value.item()
    if not _is_number(value):
        raise UnsupportedError(f"{op}: {name} must be a number, got {type(value).__name__}", loc=loc, op=op)
    return value


def filled(tracer, shape: tuple[int, ...], value: Any, dtype: str):
    """A constant tensor of ``shape`` holding ``value`` (of bendc dtype ``dtype``)."""
    if dtype == "f32":
        scalar = tracer.const(float(value))
        return scalar if not shape else tracer.emit("expand", (scalar.id,), shape=shape)
    if dtype == "bool":
        zeros = tracer.emit("iota", (), shape=shape, dim=0, start=0, step=0, dtype="i64")
        return tracer.emit("eq" if value else "ne", (zeros.id, zeros.id))
    return tracer.emit("iota", (), shape=shape, dim=0, start=int(value), step=0, dtype=dtype)


def full(size: Any, fill_value: Any, **kwargs: Any):
    """torch.full: ``size`` filled with ``fill_value``; dtype from the value (float32, int64, bool) unless given."""
    tracer = _creation_tracer("full")
    with tracer.at_user_line("full") as builder:
        dtype = _creation_options("full", kwargs, builder.loc)
        shape = _sizes((size,) if not isinstance(size, (tuple, list)) else (tuple(size),), "full", builder.loc)
        value = _static_number(fill_value, "fill_value", "full", builder.loc)
        default = "bool" if isinstance(value, bool) else ("i64" if isinstance(value, int) else "f32")
        return filled(tracer, shape, value, ir_dtype(dtype, default, "full", builder.loc))


def _filled_function(op: str, value: int):
    def make(*size: Any, **kwargs: Any):
        tracer = _creation_tracer(op)
        with tracer.at_user_line(op) as builder:
            dtype = ir_dtype(_creation_options(op, kwargs, builder.loc), "f32", op, builder.loc)
            return filled(tracer, _sizes(size, op, builder.loc), value, dtype)

    make.__name__ = op
    make.__doc__ = (f"torch.{op}: a constant of the sizes given, {value} everywhere (float32 unless dtype= says)"
                    + ("; torch leaves the values unset, bendc gives zeros" if op == "empty" else "") + ".")
    return make


zeros = _filled_function("zeros", 0)
ones = _filled_function("ones", 1)
empty = _filled_function("empty", 0)


def _like_function(op: str, value: int | None):
    def make(input: Any, *args: Any, **kwargs: Any):
        tracer = _creation_tracer(op, (input,))
        with tracer.at_user_line(op) as builder:
            if not isinstance(input, TensorOps):
                raise UnsupportedError(f"{op} takes a traced tensor, got {type(input).__name__}", loc=builder.loc,
                                       op=op)
            fill = value
            if value is None:  # full_like(input, fill_value)
                if not args and "fill_value" not in kwargs:
                    raise UnsupportedError("full_like needs a fill_value", loc=builder.loc, op=op)
                fill = _static_number(args[0] if args else kwargs.pop("fill_value"), "fill_value", op, builder.loc)
            elif args:
                raise UnsupportedError(f"{op}: unexpected arguments {args!r}", loc=builder.loc, op=op)
            dtype = ir_dtype(_creation_options(op, kwargs, builder.loc), input.type.dtype, op, builder.loc)
            return filled(tracer, input.shape, fill, dtype)

    make.__name__ = op
    make.__doc__ = f"torch.{op}: a constant of input's shape and dtype (unless dtype= says)."
    return make


zeros_like = _like_function("zeros_like", 0)
ones_like = _like_function("ones_like", 1)
empty_like = _like_function("empty_like", 0)
full_like = _like_function("full_like", None)


def arange(start: Any, end: Any = None, step: Any = 1, **kwargs: Any):
    """torch.arange: start, start + step, ... up to end (excluded); int64 when every bound is an int,
    else float32 (start + step * i computed in double, rounded once, as PyTorch's scalar loop)."""
    tracer = _creation_tracer("arange")
    with tracer.at_user_line("arange") as builder:
        dtype = _creation_options("arange", kwargs, builder.loc)
        if end is None:
            start, end = 0, start
        start, end, step = (_static_number(v, name, "arange", builder.loc)
                            for v, name in ((start, "start"), (end, "end"), (step, "step")))
        if step == 0 or (end - start) * step < 0 and end != start:
            raise ShapeError(f"arange({start}, {end}, {step}): the step must be non-zero and point from start to "
                             "end", loc=builder.loc, op="arange")
        integral = all(isinstance(v, int) for v in (start, end, step))
        dtype = ir_dtype(dtype, "i64" if integral else "f32", "arange", builder.loc)
        count = max(int(math.ceil((end - start) / step)), 0)
        if dtype == "bool":
            raise UnsupportedError("arange(dtype=bool) is not supported", loc=builder.loc, op="arange")
        if dtype == "f32":
            return tracer.emit("iota", (), shape=(count,), dim=0, start=f32_value(start), step=f32_value(step),
                               dtype="f32")
        if not (float(start).is_integer() and float(step).is_integer()):
            raise UnsupportedError(f"arange({start}, {end}, {step}, dtype={torch_dtype_name(dtype)}) with fractional "
                                   "bounds is not supported", loc=builder.loc, op="arange")
        return tracer.emit("iota", (), shape=(count,), dim=0, start=int(start), step=int(step), dtype=dtype)


def linspace(start: Any, end: Any, steps: int, **kwargs: Any):
    """torch.linspace: ``steps`` float32 values from start to end, PyTorch's scalar formula: step =
    (end - start) / (steps - 1) in float32; start + step * i for i < steps // 2, else end - step *
    (steps - 1 - i). (PyTorch's vectorized loop rounds some interior values differently, within 1 ulp.)"""
    tracer = _creation_tracer("linspace")
    with tracer.at_user_line("linspace") as builder:
        dtype = ir_dtype(_creation_options("linspace", kwargs, builder.loc), "f32", "linspace", builder.loc)
        if dtype != "f32":
            raise UnsupportedError("linspace makes float32 values only", loc=builder.loc, op="linspace")
        start = f32_value(_static_number(start, "start", "linspace", builder.loc))
        end = f32_value(_static_number(end, "end", "linspace", builder.loc))
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
            raise ShapeError(f"linspace steps must be a non-negative int, got {steps!r}", loc=builder.loc,
                             op="linspace")
        steps = int(steps)
        if steps <= 1:
            return tracer.emit("literal", (), shape=(steps,), dtype="f32", values=(start,) * steps)
        step = float(np.float32(np.float32(end) - np.float32(start)) / np.float32(steps - 1))
        index = tracer.emit("iota", (), shape=(steps,), dim=0, start=0.0, step=1.0, dtype="f32")
        rising = tracer.const(start) + tracer.const(step) * index
        falling = tracer.const(end) - tracer.const(step) * (tracer.const(float(steps - 1)) - index)
        return where(index < float(steps // 2), rising, falling)


def eye(n: int, m: int | None = None, **kwargs: Any):
    """torch.eye: an n x m (m = n by default) matrix, 1 on the diagonal, 0 elsewhere."""
    tracer = _creation_tracer("eye")
    with tracer.at_user_line("eye") as builder:
        dtype = ir_dtype(_creation_options("eye", kwargs, builder.loc), "f32", "eye", builder.loc)
        n = _sizes((n,), "eye", builder.loc)[0]
        m = n if m is None else _sizes((m,), "eye", builder.loc)[0]
        rows = tracer.emit("iota", (), shape=(n, m), dim=0, start=0, step=1, dtype="i64")
        columns = tracer.emit("iota", (), shape=(n, m), dim=1, start=0, step=1, dtype="i64")
        diagonal = tracer.emit("eq", (rows.id, columns.id))
        if dtype == "bool":
            return diagonal
        if dtype == "f32":
            return diagonal._as_float()
        return tracer.emit("to_int", (diagonal.id,), dtype=dtype)


def _flatten_data(data: Any, op: str, loc) -> tuple[tuple[int, ...], list]:
    """The shape and row-major values of nested lists / tuples of numbers (or a numpy array)."""
    if isinstance(data, TensorOps):
        raise UnsupportedError(f"{op} of a traced tensor: use it directly (or .detach())", loc=loc, op=op)
    if isinstance(data, np.ndarray):
        return tuple(int(d) for d in data.shape), data.reshape(-1).tolist()
    if type(data).__module__.startswith("torch") and hasattr(data, "shape"):
        return tuple(int(d) for d in data.shape), data.reshape(-1).tolist()
    if isinstance(data, (list, tuple)):
        parts = [_flatten_data(item, op, loc) for item in data]
        shapes = {shape for shape, _ in parts}
        if len(shapes) > 1:
            raise ShapeError(f"{op}: the nested sequences have unequal lengths ({sorted(shapes)})", loc=loc, op=op)
        inner = shapes.pop() if shapes else ()
        return (len(data),) + inner, [value for _, values in parts for value in values]
    return (), [_static_number(data, "data", op, loc)]


def tensor(data: Any, **kwargs: Any):
    """torch.tensor / torch.as_tensor of numbers or nested lists: a constant (a ``literal`` of up to 4096
    values, else a lifted constant; one float is a ``const``); dtype from the values (bool, int64, float32)
    unless given."""
    tracer = _creation_tracer("tensor")
    with tracer.at_user_line("tensor") as builder:
        dtype = _creation_options("tensor", kwargs, builder.loc)
        shape, values = _flatten_data(data, "tensor", builder.loc)
        values = [_static_number(v, "data", "tensor", builder.loc) for v in values]
        if all(isinstance(v, bool) for v in values) and values:
            default = "bool"
        elif all(isinstance(v, int) for v in values) and values:
            default = "i64"
        else:
            default = "f32"
        dtype = ir_dtype(dtype, default, "tensor", builder.loc)
        if dtype == "f32":
            if not shape:
                return tracer.const(float(values[0]))
            converted = [f32_value(float(v)) for v in values]
        elif dtype == "bool":
            converted = [bool(v) for v in values]
        else:
            converted = [int(v) for v in values]  # a float value truncated toward zero, as PyTorch's
        # a literal, or past LITERAL_LIMIT values a lifted constant (bendc/trace.py)
        return tracer.array_constant(np.array(converted, dtype=DTYPES[dtype]).reshape(shape), dtype)


def one_hot(input: Any, num_classes: int = -1):
    """torch.nn.functional.one_hot: int64 (..., num_classes), 1 where the class is input's value.
    num_classes must be given (PyTorch's default, the largest value + 1, depends on the data)."""
    tracer = _creation_tracer("one_hot", (input,))
    with tracer.at_user_line("one_hot") as builder:
        if not isinstance(input, TensorOps) or not input.type.is_index:
            what = input.type if isinstance(input, TensorOps) else type(input).__name__
            raise UnsupportedError(f"one_hot takes an int64 or int32 tensor, got {what}", loc=builder.loc,
                                   op="one_hot")
        if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
            raise UnsupportedError(f"one_hot(num_classes={num_classes!r}): give the number of classes (the default, "
                                   "the largest value + 1, depends on the data)", loc=builder.loc, op="one_hot")
        shape = input.shape + (int(num_classes),)
        classes = tracer.emit("iota", (), shape=shape, dim=len(shape) - 1, start=0, step=1, dtype=input.type.dtype)
        widened = input.reshape(input.shape + (1,))
        return tracer.emit("to_int", (tracer.emit("eq", (widened.id, classes.id)).id,), dtype="i64")
