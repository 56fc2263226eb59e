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
from typing import Any, Sequence

import numpy as np

from bendc.errors import ShapeError, UnsupportedError, user_location
from bendc.ops.base import f32_value

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
        bools = a.dtype == "bool", b.dtype == "bool"
        if op == "sub" and any(bools):
            raise UnsupportedError(f"subtraction with a bool tensor ({a.type}, {b.type}) is not supported (as in "
                                   "PyTorch); convert with .float() first", loc=self.tracer.builder.loc, op=op)
        if op in ("add", "mul") and (all(bools) or (any(bools) and number_is_bool)):
            raise UnsupportedError(f"{op} of two bools ({a.type}, {b.type}) is a bool result in PyTorch, which "
                                   "bendc does not compute; convert with .float() first",
                                   loc=self.tracer.builder.loc, op=op)
        return tuple(t._as_float() if t.dtype == "bool" else t for t in (a, b))

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
        if not isinstance(value, TensorOps) or value.dtype != "bool":
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
                    dtype = "float32" if arg.type.is_float else arg.dtype
                elif _is_dtype(arg):
                    dtype = arg
                elif not (_is_device(arg) or isinstance(arg, bool)):
                    raise UnsupportedError(f"to({arg!r}) is not supported (a dtype, a device or a tensor)",
                                           loc=builder.loc, op="to")
            if dtype is None:
                return self
            name = dtype_text(dtype)
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
    def long(self): self._unsupported_cast("long")
    def int(self): self._unsupported_cast("int")

    def cpu(self):
        """A no-op: the jit target places the data."""
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

    def _narrow(self, axis: int, start: int, stop: int):
        """self[..., start:stop, ...] on ``axis`` (a view: the index op)."""
        return self[(slice(None),) * axis + (slice(start, stop),)]

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
            pieces, start = [], 0
            for length in sections:
                pieces.append(self._narrow(axis, start, start + length))
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
        if not isinstance(condition, TensorOps) or condition.dtype != "bool":
            what = condition.type if isinstance(condition, TensorOps) else type(condition).__name__
            raise UnsupportedError(f"where needs a bool condition tensor (a comparison such as x > 0), got {what}",
                                   loc=builder.loc, op="where")
        a = tracer.value(input, "where")._as_float()
        b = tracer.value(other, "where")._as_float()
        return tracer.emit("where", (condition.id, a.id, b.id))


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
    """torch.nn.functional.pad, constant mode: pad = (left, right) pairs from the last dim backward;
    a negative pad cuts that many elements. The padding is ``value`` (0.0 when None)."""
    tracer = tracer_of("pad", (input,))
    with tracer.at_user_line("pad") as builder:
        if mode != "constant":
            raise UnsupportedError(f"pad mode {mode!r} is not supported (constant only)", loc=builder.loc, op="pad")
        if not isinstance(input, TensorOps):
            raise UnsupportedError("pad takes a traced tensor", loc=builder.loc, op="pad")
        amounts = _sizes((tuple(pad),), "pad", builder.loc)
        if len(amounts) % 2 or len(amounts) > 2 * input.ndim:
            raise ShapeError(f"pad {list(amounts)}: needs pairs, at most {input.ndim} of them for {input.type}",
                             loc=builder.loc, op="pad")
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
