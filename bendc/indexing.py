"""Indexing a traced tensor as PyTorch does: ``x[key]`` and ``x[key] = value``.

A key is a tuple of entries (one entry alone is a 1-tuple):

- an int picks one position and drops the dim (negative counts from the end);
- a slice keeps the dim; a negative step walks backward as numpy's ``x[::-1]`` (PyTorch raises
  ValueError there; bendc gives the reversal, ``torch.flip``'s values);
- ``None`` inserts a dim of size 1; ``...`` stands for the dims the other entries leave;
- a list, numpy array or integer tensor is an advanced index (PyTorch's and numpy's rules: the
  advanced indices broadcast together; their dims replace the indexed ones in place when they are
  adjacent, else lead the result); negative values count from the end, values still out of range
  are a BendcError (at trace time for lists, when the step runs for tensors);
- a bool list is the positions where it is true; a traced bool tensor (``x[mask]``) has a shape that
  depends on the data: it is a :class:`MaskedSelection`, which traces into ``.sum()`` and
  ``.mean()`` and refuses anything else with a BendcError.

``x[key] = value`` is an out-of-place index_put: x names a new tensor that is value where key
writes (value broadcast to ``x[key]``'s shape) and x elsewhere, with gradients to both. A bool mask
key writes where the mask holds (``torch.where``). Keys with integer tensors, keys that write one
element twice and a leaf are refused (PyTorch's result is unspecified there, or autograd refuses it).
The tensors that share x's storage in PyTorch (the tensor x views, and the views taken of either)
would show the write; bendc's out-of-place value cannot, so using one of them after the write is
refused with a BendcError naming the write.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from bendc.errors import GradientError, ShapeError, UnsupportedError
from bendc.tensor_ops import TensorOps, filled, where

_VIEWS = ("index", "reshape", "permute", "expand")
_CONSTANTS = ("const", "iota", "literal")


def _static_array(entry: Any):
    """A list, tuple, numpy array or torch tensor used as an index, as a numpy array; else None."""
    if isinstance(entry, (list, tuple)):
        array = np.array(entry)
        if array.dtype == object or (array.size and array.dtype.kind not in "biu"):
            return "bad"
        return array.astype(np.int64) if array.dtype.kind != "b" and array.size else (
            array if array.size else np.zeros((0,), np.int64))
    if isinstance(entry, np.ndarray):
        return entry
    if type(entry).__module__.startswith("torch") and hasattr(entry, "numpy") and hasattr(entry, "shape"):
        return entry.detach().cpu().numpy()
    return None


def _entries(x, key, loc) -> list:
    """The key as a list of entries: ints, slices, None, numpy integer arrays (static advanced
    indices, bool ones expanded to their true positions) and traced integer tensors; ellipses
    expanded."""
    raw = list(key) if isinstance(key, tuple) else [key]
    entries: list = []
    for entry in raw:
        if isinstance(entry, TensorOps):
            if entry.type.dtype == "bool":
                raise UnsupportedError("a bool tensor index must be the whole key (x[mask]); combined with other "
                                       "entries it is not supported", loc=loc, op="index")
            if not entry.type.is_index:
                raise UnsupportedError(f"tensors used as indices must be integer or bool tensors, got {entry.type}",
                                       loc=loc, op="index")
            entries.append(entry)
            continue
        if isinstance(entry, (bool, np.bool_)):
            raise UnsupportedError(f"index {entry!r} into {x.type} is not supported (a Python bool)", loc=loc,
                                   op="index")
        if isinstance(entry, (int, np.integer)):
            entries.append(int(entry))
            continue
        if entry is None or entry is Ellipsis or isinstance(entry, slice):
            if isinstance(entry, slice) and any(
                    part is not None and not isinstance(part, (int, np.integer)) for part in
                    (entry.start, entry.stop, entry.step)):
                raise UnsupportedError(f"slice {entry} into {x.type} needs int bounds", loc=loc, op="index")
            entries.append(entry)
            continue
        array = _static_array(entry)
        if array is None or isinstance(array, str):
            raise UnsupportedError(f"index of type {type(entry).__name__} into {x.type} is not supported (ints, "
                                   "slices, None, ..., lists and integer or bool tensors)", loc=loc, op="index")
        if array.dtype == np.bool_:
            entries.extend(np.nonzero(array))  # a static mask: the positions where it holds
        else:
            entries.append(array.astype(np.int64))
    consumed = sum(1 for e in entries if e is not None and e is not Ellipsis)
    if consumed > x.ndim:
        raise ShapeError(f"too many indices for {x.type}: {consumed} dimensions indexed", loc=loc, op="index")
    if not any(e is Ellipsis for e in entries):
        return entries
    # PyTorch's rule, which takes several ellipses: each one stands for the dimensions the other
    # entries leave (x[..., 0, ...] is x[..., 0]); an entry past the last dimension is an error
    # (x[..., ..., 1:] of a 3-d x); full slices past it are dropped. `is`, not `==` (Tensor.__eq__).
    skip = x.ndim - consumed
    expanded: list = []
    used = 0
    for entry in entries:
        if entry is Ellipsis:
            count = min(skip, x.ndim - used)
            expanded += [slice(None)] * count
            used += count
        elif entry is None:
            expanded.append(None)
        elif used >= x.ndim:
            raise ShapeError(f"too many indices for {x.type}: {used + 1} dimensions indexed after expanding "
                             "the ellipses", loc=loc, op="index")
        else:
            expanded.append(entry)
            used += 1
    return expanded


def getitem(x, key, loc, **attrs):
    """``x[key]`` (the module docstring states the rules); ``attrs`` go on its index node (a split's
    piece number, tensor_ops.split)."""
    tracer = x.tracer
    if isinstance(key, TensorOps) and key.type.dtype == "bool":
        return MaskedSelection(x, key, loc)
    entries = _entries(x, key, loc)
    spec: list = []
    nones: list[int] = []
    flips: list[int] = []
    advanced: list[tuple[int, Any, int]] = []
    axis = out = 0
    for entry in entries:
        if entry is None:
            nones.append(out)
            out += 1
            continue
        size = x.shape[axis]
        if isinstance(entry, int):
            if not -size <= entry < size:
                raise ShapeError(f"index {entry} is out of range for dimension {axis} of {x.type}", loc=loc, op="index")
            spec.append(entry % size)
        elif isinstance(entry, slice):
            picked = range(*entry.indices(size))
            if picked.step > 0:
                spec.append((picked.start, picked.stop, picked.step) if len(picked) else (0, 0, 1))
            elif not len(picked):
                spec.append((0, 0, 1))
            else:  # walk backward: the same elements in increasing order, reversed afterwards
                spec.append((picked[-1], picked[0] + 1, -picked.step))
                flips.append(out)
            out += 1
        else:
            spec.append((0, size, 1))
            advanced.append((out, entry, size))
            out += 1
        axis += 1
    while spec and not isinstance(spec[-1], int) and spec[-1] == (0, x.shape[len(spec) - 1], 1):
        spec.pop()
    y = tracer.emit("index", (x.id,), spec=tuple(spec), **attrs) if spec else x
    if nones:
        shape = list(y.shape)
        for position in nones:
            shape.insert(position, 1)
        y = y.reshape(tuple(shape))
    for dim in flips:
        size = y.shape[dim]
        if size > 1:
            backward = tracer.emit("iota", (), shape=(size,), dim=0, start=size - 1, step=-1, dtype="i64")
            y = tracer.emit("index_select", (y.id, backward.id), dim=dim)
    if advanced:
        y = _advanced(y, advanced, loc)
    return y


def _index_tensor(tracer, entry: Any, size: int, dim: int, checked: bool, loc):
    """An advanced index as an integer tensor with values in [0, size): a list checked now; a traced
    tensor with negative values wrapped (and, where the index op reading it cannot check the range
    itself, read through an index_select of 0..size-1, which refuses values out of range)."""
    if isinstance(entry, np.ndarray):
        if entry.size and (entry.min() < -size or entry.max() >= size):
            bad = entry[(entry < -size) | (entry >= size)].flat[0]
            raise ShapeError(f"index {int(bad)} is out of range for dimension {dim} of size {size}", loc=loc,
                             op="index")
        wrapped = np.mod(entry.astype(np.int64), size) if size else entry.astype(np.int64)
        return tracer.array_constant(wrapped, "i64")
    wrapped = tracer.emit("wrap_index", (entry.id,), size=size)
    if not checked:
        return wrapped
    positions = tracer.emit("iota", (), shape=(size,), dim=0, start=0, step=1, dtype=wrapped.type.dtype)
    flat = wrapped.reshape(-1) if wrapped.ndim != 1 else wrapped
    picked = tracer.emit("index_select", (positions.id, flat.id), dim=0)
    return picked.reshape(wrapped.shape) if picked.shape != wrapped.shape else picked


def _advanced(y, advanced: list[tuple[int, Any, int]], loc):
    """y indexed by the advanced indices at its dims (numpy's placement rule)."""
    tracer = y.tracer
    several = len(advanced) > 1
    indices = [_index_tensor(tracer, entry, size, dim, several, loc) for dim, entry, size in advanced]
    try:
        broadcast = tuple(np.broadcast_shapes(*(index.shape for index in indices)))
    except ValueError:
        raise ShapeError(f"shape mismatch: indexing tensors of shapes {[list(i.shape) for i in indices]} cannot be "
                         "broadcast together", loc=loc, op="index") from None
    dims = [dim for dim, _, _ in advanced]
    if not several:
        dim, index = dims[0], indices[0]
        flat = index.reshape(-1) if index.ndim != 1 else index
        picked = tracer.emit("index_select", (y.id, flat.id), dim=dim)
        shape = y.shape[:dim] + broadcast + y.shape[dim + 1:]
        return picked.reshape(shape) if shape != picked.shape else picked
    rest = [d for d in range(y.ndim) if d not in dims]
    moved = y.permute(*dims, *rest)
    sizes = [size for _, _, size in advanced]
    rows = moved.reshape((math.prod(sizes),) + tuple(y.shape[d] for d in rest))
    linear, stride = None, 1
    for index, size in zip(reversed(indices), reversed(sizes)):
        term = index if stride == 1 else index * stride
        linear = term if linear is None else term + linear
        stride *= size
    if linear.shape != broadcast:
        linear = linear.expand(*broadcast)
    flat = linear.reshape(-1) if linear.ndim != 1 else linear
    picked = tracer.emit("index_select", (rows.id, flat.id), dim=0)
    result = picked.reshape(broadcast + rows.shape[1:])
    adjacent = dims == list(range(dims[0], dims[0] + len(dims)))
    if adjacent and dims[0] > 0:  # the advanced dims replace the indexed ones in place
        lead, width = dims[0], len(broadcast)
        order = list(range(width, width + lead)) + list(range(width)) + list(range(width + lead, result.ndim))
        result = result.permute(*order)
    return result


# ------------------------------------------------------------------ x[mask]
class MaskedSelection:
    """``x[mask]`` for a traced bool ``mask`` of x's leading shape: a 1-D selection of the rows where
    the mask holds, whose length depends on the data. It traces into ``.sum()`` and ``.mean()``
    (over everything, or over dim 0, the selected rows) as ``torch.where(mask, x, 0)``'s sums; any
    other use is refused with a BendcError."""

    def __init__(self, x, mask, loc) -> None:
        if mask.shape != x.shape[:mask.ndim]:
            raise ShapeError(f"the mask {mask.type} must have the leading shape of the indexed tensor {x.type}",
                             loc=loc, op="index")
        self.x, self.mask = x, mask
        self.loc = loc

    def _message(self, op: str) -> str:
        return (f"x[mask] ({self.x.type} selected by {self.mask.type}) has a shape that depends on the mask's "
                f"values, which bendc does not know while tracing: {op} of it is not supported. Reduce it "
                "(x[mask].sum(), x[mask].mean()) or write torch.where(mask, x, 0)")

    def refuse(self, op: str):
        from bendc.errors import user_location

        raise UnsupportedError(self._message(op), loc=user_location(), op=op)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        self.refuse(name)

    def __len__(self):
        self.refuse("len")

    def __bool__(self):
        self.refuse("bool")

    def __iter__(self):
        self.refuse("iter")

    def __getitem__(self, key):
        self.refuse("index")

    def _refused_operator(op: str):
        def refuse(self, *others):
            self.refuse(op)

        refuse.__name__ = op
        return refuse

    for _dunder, _op in (("add", "add"), ("radd", "add"), ("sub", "sub"), ("rsub", "sub"), ("mul", "mul"),
                         ("rmul", "mul"), ("truediv", "div"), ("rtruediv", "div"), ("pow", "pow"), ("rpow", "pow"),
                         ("matmul", "matmul"), ("rmatmul", "matmul"), ("neg", "neg"), ("lt", "lt"), ("le", "le"),
                         ("gt", "gt"), ("ge", "ge"), ("abs", "abs")):
        locals()[f"__{_dunder}__"] = _refused_operator(_op)
    del _dunder, _op, _refused_operator

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "torch")
        if name in ("sum", "mean") and args and isinstance(args[0], MaskedSelection):
            return getattr(args[0], name)(*args[1:], **(kwargs or {}))
        selection = next(a for a in args if isinstance(a, MaskedSelection))
        selection.refuse(name)

    def _kept(self, op: str, dim: Any, keepdim: bool, dtype: Any):
        """The dims of x a reduction over the selection sums: all (dim None) or the mask's (dim 0)."""
        if keepdim or dtype is not None:
            self.refuse(f"{op}(keepdim=True or dtype=...)")
        result_ndim = 1 + self.x.ndim - self.mask.ndim
        if dim is None:
            return tuple(range(self.x.ndim))
        if isinstance(dim, (tuple, list)) and len(dim) == 1:
            dim = dim[0]
        if isinstance(dim, int) and dim % result_ndim == 0:
            return tuple(range(self.mask.ndim))
        self.refuse(f"{op}(dim={dim!r})")

    def _selected(self):
        mask = self.mask
        if self.x.ndim > mask.ndim:
            mask = mask.reshape(mask.shape + (1,) * (self.x.ndim - mask.ndim))
        return where(mask, self.x, 0.0)

    def sum(self, dim: Any = None, keepdim: bool = False, dtype: Any = None):
        """The sum of the selected elements (dim 0: of the selected rows)."""
        with self.x.tracer.at_user_line("sum"):
            dims = self._kept("sum", dim, keepdim, dtype)
            return self._selected().sum(dims)

    def mean(self, dim: Any = None, keepdim: bool = False, dtype: Any = None):
        """The mean of the selected elements (dim 0: of the selected rows); NaN when none is selected."""
        with self.x.tracer.at_user_line("mean"):
            dims = self._kept("mean", dim, keepdim, dtype)
            total = self._selected().sum(dims)
            count = self.mask.float().sum()
            if len(dims) > self.mask.ndim:
                count = count * float(math.prod(self.x.shape[self.mask.ndim:]))
            return total / count


# ------------------------------------------------------------------ x[key] = value
def _refuse_leaf(x, loc, what: str, op: str) -> None:
    if x.id in x.tracer.leaves:
        raise GradientError(f"{what} on a leaf {x.type}: PyTorch refuses an in-place write to a leaf that "
                            "requires grad; write into a copy (x.clone())", loc=loc, op=op)


def _aliases(x) -> set[int]:
    """The values that share x's storage in PyTorch: the tensor x views (through index, reshape,
    permute, expand), and every view of it, transitively; x itself included."""
    graph = x.tracer.graph
    root = x.id
    while graph.node(root).op in _VIEWS and graph.node(graph.node(root).inputs[0]).op not in _CONSTANTS:
        root = graph.node(root).inputs[0]
    seen, stack = {root}, [root]
    while stack:
        for user in graph.users(stack.pop()):
            if graph.node(user).op in _VIEWS and user not in seen:
                seen.add(user)
                stack.append(user)
    return seen


def _broadcasts(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether a value of ``shape`` broadcasts to ``target`` (PyTorch's rule for written values)."""
    if len(shape) > len(target):
        return False
    return all(size in (1, wanted) for size, wanted in zip(reversed(shape), reversed(target)))


def _numpy_key(x, key, loc):
    """The key for numpy (static entries only), to find the positions it writes."""
    entries = list(key) if isinstance(key, tuple) else [key]
    converted = []
    for entry in entries:
        if isinstance(entry, TensorOps):
            raise UnsupportedError(f"x[index] = value with an integer tensor index ({entry.type}): PyTorch's write "
                                   "order for repeated indices is unspecified; use a list or slices, or "
                                   "index_add / scatter", loc=loc, op="index_put")
        array = _static_array(entry)
        converted.append(entry if array is None or isinstance(array, str) else array)
    return tuple(converted)


def setitem(x, key, value, loc):
    """The tensor ``x`` names after ``x[key] = value`` (the module docstring states the rules)."""
    _refuse_leaf(x, loc, "x[...] = value", "index_put")
    aliases = _aliases(x)
    result = _written(x, key, value, loc)
    _mark_stale(x.tracer, aliases - {result.id}, loc, "x[...] = value")
    return result


def in_place(x, result, loc, what: str):
    """x after an in-place op (``x += y``, ``x.add_(y)``, ``x.fill_(v)``, ``x.copy_(src)``) whose
    out-of-place value is ``result``: the Python object x (every name bound to it, as in PyTorch)
    names ``result``, cast to x's dtype where PyTorch's in-place rules cast; the tensors that share
    x's storage in PyTorch are stale, as after ``x[key] = value``. A leaf is refused (PyTorch's
    autograd refuses it), and so are a result of another shape or of a dtype PyTorch cannot cast to
    x's in place (an integer x += a float)."""
    _refuse_leaf(x, loc, what, what)
    if tuple(result.shape) != tuple(x.shape):
        raise ShapeError(f"{what}: output with shape {list(x.shape)} doesn't match the broadcast shape "
                         f"{list(result.shape)} (an in-place op keeps its tensor's shape)", loc=loc, op=what)
    if result.type.dtype != x.type.dtype:
        if not (x.type.is_index and result.type.is_index):
            raise UnsupportedError(f"{what}: result type {result.type.dtype} can't be cast to {x.type} in place "
                                   "(PyTorch refuses it too)", loc=loc, op=what)
        result = x.tracer.emit("to_int", (result.id,), dtype=x.type.dtype)
    _mark_stale(x.tracer, _aliases(x) - {result.id}, loc, what)
    x.id = result.id
    return x


def _mark_stale(tracer, aliases: set[int], loc, what: str) -> None:
    where_from = str(loc) if loc is not None else "an earlier line"
    for alias in aliases:
        tracer.stale[alias] = (f"this tensor shares storage with the tensor written by {what} at {where_from}: "
                               "PyTorch would show the written values here, bendc's out-of-place write cannot. "
                               "Take views after the write, or write into x.clone()")


def _written(x, key, value, loc):
    """The new value of x after x[key] = value."""
    tracer = x.tracer
    if not x.type.is_float:
        raise UnsupportedError(f"x[...] = value on {x.type}: bendc writes into float32 tensors only", loc=loc,
                               op="index_put")
    if isinstance(value, MaskedSelection):
        value.refuse("index_put")
    if isinstance(key, TensorOps) and key.type.dtype == "bool":
        if key.shape != x.shape[:key.ndim]:
            raise ShapeError(f"the mask {key.type} must have the leading shape of {x.type}", loc=loc, op="index_put")
        value = tracer.value(value, "index_put")
        if not _broadcasts(value.shape, x.shape[key.ndim:]):
            raise ShapeError(f"x[mask] = value: value {value.type} must broadcast to the selected rows' shape "
                             f"{list(x.shape[key.ndim:])} (a selection of data-dependent length is not supported)",
                             loc=loc, op="index_put")
        mask = key.reshape(key.shape + (1,) * (x.ndim - key.ndim)) if x.ndim > key.ndim else key
        return where(mask, value, x)
    positions = np.arange(x.type.numel, dtype=np.int64).reshape(x.shape)
    try:
        written = positions[_numpy_key(x, key, loc)]
    except IndexError as error:
        raise ShapeError(f"x[key] = value: {error} (indexing {x.type})", loc=loc, op="index_put") from None
    if np.unique(written).size != written.size:
        raise UnsupportedError(f"x[key] = value writes some elements of {x.type} more than once; PyTorch's result "
                               "there is unspecified", loc=loc, op="index_put")
    target = getitem(x, key, loc)  # the shape the value broadcasts to, by bendc's own rules
    value = tracer.value(value, "index_put")._as_float()
    shape = target.shape
    if not _broadcasts(value.shape, shape):
        raise ShapeError(f"x[key] = value: value {value.type} does not broadcast to x[key]'s shape {list(shape)}",
                         loc=loc, op="index_put")
    if written.size == 0:
        return x
    size = x.type.numel
    flat_positions = tracer.emit("iota", (), shape=(size,), dim=0, start=0, step=1, dtype="i64")
    where_written = getitem(flat_positions.reshape(x.shape), key, loc).reshape(-1)
    spread = value.expand(*shape) if value.shape != shape else value
    values = tracer.emit("index_add", (spread.reshape(-1).id, where_written.id), dim=0, shape=(size,),
                         unique=True)  # into -0.0 words: a written -0.0 stays -0.0, as torch's copy
    ones = filled(tracer, (int(written.size),), 1.0, "f32")
    covered = tracer.emit("index_add", (ones.id, where_written.id), dim=0, shape=(size,))
    return where(covered.reshape(x.shape) > 0.5, values.reshape(x.shape), x)
