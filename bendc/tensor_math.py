"""Tensor methods of issue 22 that take attributes or are composites of other ops:
``nan_to_num`` and ``round`` (with ``decimals``) emit their ops; ``any``/``all``, ``roll`` and
``repeat_interleave`` are written with existing ops (comparisons and a sum, slices and a concat,
an expand and a reshape), and :func:`einsum` rewrites an equation into permutes, reshapes, sums
and batched matmuls, so each is differentiable wherever its pieces are. ``sum(dtype=)`` and
``mean(dtype=)`` take their dtype through :func:`as_dtype`. The ops that trace straight from their
operands (``x.sin()``, ``x.maximum(y)``, ``x.lerp(end, weight)``, ...) declare their method in
bendc/ops/math_ops.py.

:class:`MathMethods` is mixed into :class:`bendc.trace.Tensor`; ``FUNCTIONS`` gives
``bendc.functional.<name>`` and the torch bridge ``torch.<name>`` (and ``torch.Tensor.<name>`` for
the methods, ``TENSOR_METHODS``).
This module imports nothing of the tracer at import time (bendc.trace imports it).
"""
from __future__ import annotations

import numbers
from typing import Any, Callable

import numpy as np

from bendc.errors import ShapeError, UnsupportedError, user_location

_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _number(value: Any, name: str, op: str, loc, default: float) -> float:
    """A Python number argument (None: ``default``) as a float rounded to float32."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise UnsupportedError(f"{op}: {name} must be a Python number or None, got {type(value).__name__}",
                               loc=loc, op=op)
    return float(np.float32(value))



def normalize_dim(dim: int, ndim: int, op: str, loc) -> int:
    """``dim`` counted from 0 (negative dims from the end; a 0-d tensor takes dims 0 and -1), or a
    ShapeError naming the op."""
    rank = max(ndim, 1)
    if not isinstance(dim, int) or not -rank <= dim < rank:
        raise ShapeError(f"dim {dim} is out of range for a tensor of {ndim} dimensions", loc=loc, op=op)
    return dim % rank

def _dims_of(x: Any, dim: Any, op: str, loc) -> tuple[int, ...]:
    """dim None: every dim; an int or a tuple of ints, normalized (torch's rules for 0-d tensors)."""
    if dim is None:
        return tuple(range(x.ndim))
    dims = (dim,) if isinstance(dim, (int, np.integer)) and not isinstance(dim, bool) else dim
    if not isinstance(dims, (tuple, list)) or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool)
                                                      for d in dims):
        raise UnsupportedError(f"{op}: dim must be an int, a tuple of ints or None, got {dim!r}", loc=loc, op=op)
    if x.ndim == 0:
        return ()
    normalized = tuple(sorted({normalize_dim(int(d), x.ndim, op, loc) for d in dims}))
    if len(normalized) != len(dims):
        raise ShapeError(f"{op}: dim {dim!r} repeats a dimension of {x.type}", loc=loc, op=op)
    return normalized


def as_dtype(x: Any, dtype: Any, op: str) -> Any:
    """``x`` converted for ``op(..., dtype=dtype)`` (sum, mean): None keeps x; float32 (torch.float32,
    np.float32, "float32") makes x float32 first, as torch casts the input before reducing; any other
    dtype is refused (bendc computes in float32)."""
    from bendc.tensor_ops import _FLOAT_NAMES, dtype_text

    if dtype is None:
        return x
    name = dtype_text(dtype)
    if name not in _FLOAT_NAMES:
        raise UnsupportedError(f"{op}(dtype={name}) of {x.type}: bendc computes in float32 only "
                               "(dtype=torch.float32 is supported)", loc=user_location(), op=op)
    return x.float()


class MathMethods:
    """nan_to_num, round(decimals=), any/all, roll and repeat_interleave of a traced tensor (PyTorch's)."""

    __slots__ = ()

    def nan_to_num(self, nan: Any = 0.0, posinf: Any = None, neginf: Any = None):
        """torch.nan_to_num: NaN -> nan, +inf -> posinf, -inf -> neginf (default: the float32 extremes)."""
        with self.tracer.at_user_line("nan_to_num") as builder:
            attrs = dict(nan=_number(nan, "nan", "nan_to_num", builder.loc, 0.0),
                         posinf=_number(posinf, "posinf", "nan_to_num", builder.loc, _FLOAT32_MAX),
                         neginf=_number(neginf, "neginf", "nan_to_num", builder.loc, -_FLOAT32_MAX))
            return self.tracer.emit("nan_to_num", (self.id,), **attrs)

    def round(self, decimals: Any = 0):
        """torch.round: to the nearest integer, ties to even; with ``decimals`` d > 0 round(x * 10**d) / 10**d,
        d < 0 round(x / 10**-d) * 10**-d (torch's formula, 10**|d| rounded to float32)."""
        with self.tracer.at_user_line("round") as builder:
            if isinstance(decimals, bool) or not isinstance(decimals, (int, np.integer)):
                raise UnsupportedError(f"round: decimals must be an int, got {decimals!r}", loc=builder.loc, op="round")
            decimals = int(decimals)
            if decimals == 0:
                return self.tracer.emit("round", (self.id,))
            scale = float(np.float32(10.0 ** abs(decimals)))
            if decimals > 0:
                return self.tracer.emit("round", ((self * scale).id,)) / scale
            return self.tracer.emit("round", ((self / scale).id,)) * scale


    # ------------------------------------------------------------- any, all
    def _any(self, dim: Any, keepdim: Any, op: str):
        """The count of nonzero (op "any") or of zero (op "all") elements over ``dim``, compared with 0:
        exact for counts below 2**24. A NaN is nonzero, as in torch; over no elements any is False and
        all is True."""
        with self.tracer.at_user_line(op) as builder:
            dims = _dims_of(self, dim, op, builder.loc)
            if self.type.dtype == "bool":
                hits = self.float() if op == "any" else (~self).float()
            else:
                hits = (self != 0) if op == "any" else (self == 0)
                hits = hits.float()
            count = hits.sum(dim=dims, keepdim=bool(keepdim)) if dims else hits
            return count > 0.0 if op == "any" else count == 0.0

    def any(self, dim: Any = None, keepdim: Any = False):
        """torch.any: True where some element over ``dim`` (None: all) is nonzero; a bool tensor."""
        return self._any(dim, keepdim, "any")

    def all(self, dim: Any = None, keepdim: Any = False):
        """torch.all: True where every element over ``dim`` (None: all) is nonzero; a bool tensor."""
        return self._any(dim, keepdim, "all")

    # ------------------------------------------------------------- roll, repeat_interleave
    def roll(self, shifts: Any, dims: Any = None):
        """torch.roll: elements shifted by ``shifts`` along ``dims`` (wrapping around), as the concat of
        two slices per dim; dims None rolls the flattened tensor and restores the shape."""
        from bendc.tensor_ops import cat
        with self.tracer.at_user_line("roll") as builder:
            if dims is None:
                if not isinstance(shifts, (int, np.integer)) or isinstance(shifts, bool):
                    raise UnsupportedError(f"roll: without dims, shifts must be one int, got {shifts!r}",
                                           loc=builder.loc, op="roll")
                return self.reshape(-1).roll(int(shifts), 0).reshape(self.shape)
            shifts = (shifts,) if isinstance(shifts, (int, np.integer)) else tuple(shifts)
            dims = (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
            if len(shifts) != len(dims) or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                                                   for v in shifts + dims):
                raise UnsupportedError(f"roll: shifts {shifts!r} and dims {dims!r} must be ints, one shift a dim",
                                       loc=builder.loc, op="roll")
            if self.ndim == 0:
                raise ShapeError("roll of a 0-d tensor", loc=builder.loc, op="roll")
            result = self
            for shift, dim in zip(shifts, dims):
                axis = normalize_dim(int(dim), self.ndim, "roll", builder.loc)
                size = self.shape[axis]
                shift = int(shift) % size if size else 0
                if shift == 0:
                    continue
                lead = (slice(None),) * axis
                result = cat([result[lead + (slice(size - shift, None),)], result[lead + (slice(0, size - shift),)]],
                             axis)
            return result

    def repeat_interleave(self, repeats: Any, dim: Any = None, *, output_size: Any = None):
        """torch.repeat_interleave with an int ``repeats``: each element repeated along ``dim`` (None:
        the flattened tensor), as an expand of a new axis after ``dim`` and a reshape. A tensor of
        repeats (a data-dependent shape) is refused."""
        with self.tracer.at_user_line("repeat_interleave") as builder:
            if isinstance(repeats, MathMethods) or isinstance(repeats, bool) or not isinstance(
                    repeats, (int, np.integer)):
                raise UnsupportedError("repeat_interleave: repeats must be a Python int (a tensor of repeats gives "
                                       "a data-dependent shape)", loc=builder.loc, op="repeat_interleave")
            repeats = int(repeats)
            if repeats < 0:
                raise ShapeError(f"repeat_interleave: repeats must be >= 0, got {repeats}", loc=builder.loc,
                                 op="repeat_interleave")
            x = self.reshape(-1) if dim is None or self.ndim == 0 else self
            axis = 0 if dim is None or self.ndim == 0 else normalize_dim(dim, self.ndim, "repeat_interleave",
                                                                           builder.loc)
            shape = x.shape[:axis + 1] + (repeats,) + x.shape[axis + 1:]
            result_shape = x.shape[:axis] + (x.shape[axis] * repeats,) + x.shape[axis + 1:]
            if output_size is not None and output_size != result_shape[axis]:
                raise ShapeError(f"repeat_interleave: output_size {output_size} but the result has "
                                 f"{result_shape[axis]}", loc=builder.loc, op="repeat_interleave")
            return x.unsqueeze(axis + 1).expand(*shape).reshape(result_shape)

    # ------------------------------------------------------------- conveniences of public model code
    def type_as(self, other: Any):
        """x.type_as(y): x.to(y.dtype)."""
        return self.to(other.dtype)

    def view_as(self, other: Any):
        return self.reshape(other.shape)

    def reshape_as(self, other: Any):
        return self.reshape(other.shape)

    @property
    def mT(self):
        """The last two dims swapped (a batch of matrices transposed)."""
        return self.transpose(-2, -1)

    def swapaxes(self, axis0: int, axis1: int):
        return self.transpose(axis0, axis1)

    swapdims = swapaxes

    def movedim(self, source: Any, destination: Any):
        """torch.movedim: the dims ``source`` (an int or a sequence) moved to ``destination``, the others
        keeping their order."""
        with self.tracer.at_user_line("movedim") as builder:
            sources = [source] if isinstance(source, (int, np.integer)) else list(source)
            targets = [destination] if isinstance(destination, (int, np.integer)) else list(destination)
            if len(sources) != len(targets):
                raise ShapeError(f"movedim: {len(sources)} source dims but {len(targets)} destinations",
                                 loc=builder.loc, op="movedim")
            sources = [normalize_dim(d, self.ndim, "movedim", builder.loc) for d in sources]
            targets = [normalize_dim(d, self.ndim, "movedim", builder.loc) for d in targets]
            if len(set(sources)) != len(sources) or len(set(targets)) != len(targets):
                raise ShapeError("movedim: repeated dims", loc=builder.loc, op="movedim")
            order = [None] * self.ndim
            for s, t in zip(sources, targets):
                order[t] = s
            rest = iter(d for d in range(self.ndim) if d not in sources)
            return self.permute(*[next(rest) if d is None else d for d in order])

    moveaxis = movedim

    def new_zeros(self, *size: Any, **kwargs: Any):
        """x.new_zeros(size): torch.zeros in x's dtype (``dtype=`` overrides), as the other new_* below."""
        from bendc.tensor_ops import zeros
        return zeros(*size, **{"dtype": self.dtype, **kwargs})

    def new_ones(self, *size: Any, **kwargs: Any):
        from bendc.tensor_ops import ones
        return ones(*size, **{"dtype": self.dtype, **kwargs})

    def new_empty(self, *size: Any, **kwargs: Any):
        from bendc.tensor_ops import empty
        return empty(*size, **{"dtype": self.dtype, **kwargs})

    def new_full(self, size: Any, fill_value: Any, **kwargs: Any):
        from bendc.tensor_ops import full
        return full(size, fill_value, **{"dtype": self.dtype, **kwargs})

    def new_tensor(self, data: Any, **kwargs: Any):
        from bendc.tensor_ops import tensor
        return tensor(data, **{"dtype": self.dtype, **kwargs})

    def count_nonzero(self, dim: Any = None):
        """torch.count_nonzero: the int64 count of nonzero elements over ``dim`` (an int, a tuple, None: all)."""
        with self.tracer.at_user_line("count_nonzero") as builder:
            return (self != 0).sum(_dims_of(self, dim, "count_nonzero", builder.loc))

    def outer(self, other: Any):
        """torch.outer of two 1-D tensors: x[:, None] * y[None, :]."""
        with self.tracer.at_user_line("outer") as builder:
            if self.ndim != 1 or getattr(other, "ndim", None) != 1:
                raise ShapeError(f"outer needs two 1-D tensors, got {self.type} and {getattr(other, 'type', other)}",
                                 loc=builder.loc, op="outer")
            return self.reshape(-1, 1) * other.reshape(1, -1)

    ger = outer

    def norm(self, p: Any = "fro", dim: Any = None, keepdim: bool = False, dtype: Any = None):
        """torch.norm / Tensor.norm as a vector norm over ``dim`` (all dims by default): p "fro" or 2,
        1, inf, -inf or any positive number (vector_norm)."""
        if p == "fro" and isinstance(dim, (tuple, list)) and len(dim) > 2:
            raise ShapeError(f"norm: the Frobenius norm (p='fro', the default) takes at most 2 dims, got dim={dim!r} "
                             "(as torch's); give p=2 for a vector norm over more", loc=user_location(), op="norm")
        return vector_norm(as_dtype(self, dtype, "norm"), 2.0 if p == "fro" else p, dim, keepdim)


def vector_norm(x: Any, ord: Any = 2.0, dim: Any = None, keepdim: bool = False, *, dtype: Any = None,
                out: Any = None) -> Any:
    """torch.linalg.vector_norm over ``dim`` (all dims by default): ord 2 sqrt(sum x*x), 1 sum |x|,
    inf max |x|, -inf min |x|, another positive p (sum |x|**p)**(1/p); torch's gradients, 0 where
    the norm is 0 (its norm_backward masks them: a bare sqrt or power would give NaN there)."""
    with x.tracer.at_user_line("vector_norm") as builder:
        if out is not None:
            raise UnsupportedError("vector_norm: out= is not supported", loc=builder.loc, op="vector_norm")
        x = as_dtype(x, dtype, "vector_norm")
        if isinstance(ord, bool) or not isinstance(ord, numbers.Real) or not (ord > 0 or ord == -np.inf):
            raise UnsupportedError(f"vector_norm: ord {ord!r} is not supported (2, 1, inf, -inf or a positive "
                                   "number)", loc=builder.loc, op="vector_norm")
        dims = _dims_of(x, dim, "vector_norm", builder.loc)
        ord = float(ord)
        if ord == np.inf:
            return x.abs().amax(dims, keepdim)
        if ord == -np.inf:
            return x.abs().amin(dims, keepdim)
        if ord == 1.0:
            return x.abs().sum(dims, keepdim)
        total = (x * x if ord == 2.0 else x.abs() ** ord).sum(dims, keepdim)
        from bendc.tensor_ops import where_nonzero
        return where_nonzero(total, lambda t: t.sqrt() if ord == 2.0 else t ** (1.0 / ord))


# ------------------------------------------------------------------ einsum
def _einsum_terms(equation: str, operands: tuple, loc) -> tuple[list[str], str]:
    """The letters of each operand and of the output (implicit output: the letters used once, in
    alphabetical order), checked against the operands' ranks."""
    if not isinstance(equation, str):
        raise UnsupportedError(f"einsum: the equation must be a string, got {equation!r}", loc=loc, op="einsum")
    text = equation.replace(" ", "")
    if "." in text:
        raise UnsupportedError(f"einsum {equation!r}: ellipsis ('...') is not supported; name every dim",
                               loc=loc, op="einsum")
    inputs, arrow, output = text.partition("->")
    terms = inputs.split(",")
    if not all(term.isalpha() or term == "" for term in terms + [output]):
        raise UnsupportedError(f"einsum {equation!r}: subscripts must be letters", loc=loc, op="einsum")
    if len(terms) != len(operands):
        raise ShapeError(f"einsum {equation!r} names {len(terms)} operands, got {len(operands)}", loc=loc, op="einsum")
    if not arrow:
        output = "".join(sorted(c for c in set(inputs) - {","} if inputs.count(c) == 1))
    for term, x in zip(terms, operands):
        if len(term) != x.ndim:
            raise ShapeError(f"einsum {equation!r}: {term!r} has {len(term)} subscripts for {x.type}",
                             loc=loc, op="einsum")
        if len(set(term)) != len(term):
            raise UnsupportedError(f"einsum {equation!r}: a subscript repeated within {term!r} (a diagonal) is "
                                   "not supported", loc=loc, op="einsum")
    if len(set(output)) != len(output) or set(output) - set(inputs):
        raise ShapeError(f"einsum {equation!r}: output subscripts {output!r} repeat or name no input dim",
                         loc=loc, op="einsum")
    sizes: dict[str, int] = {}
    for term, x in zip(terms, operands):
        for letter, size in zip(term, x.shape):
            if sizes.setdefault(letter, size) != size:
                raise ShapeError(f"einsum {equation!r}: {letter!r} is {sizes[letter]} and {size} "
                                 f"({', '.join(str(o.type) for o in operands)})", loc=loc, op="einsum")
    return terms, output


def _sum_letters(x: Any, term: str, keep: set[str]) -> tuple[Any, str]:
    """x with the dims whose letters are not in ``keep`` summed out."""
    dims = tuple(k for k, letter in enumerate(term) if letter not in keep)
    if not dims:
        return x, term
    return x.sum(dim=dims), "".join(letter for letter in term if letter in keep)


def _arrange(x: Any, term: str, order: str) -> Any:
    """x permuted so its letters read ``order``."""
    return x.permute(*[term.index(letter) for letter in order]) if term != order else x


def _contract(a: Any, a_term: str, b: Any, b_term: str, keep: set[str]) -> tuple[Any, str]:
    """a and b multiplied and summed over their shared letters not in ``keep``, as one batched matmul:
    a (batch, m, k) @ b (batch, k, n), batch their shared kept letters, k the shared summed ones,
    m and n the letters of one operand alone."""
    a, a_term = _sum_letters(a, a_term, keep | set(b_term))
    b, b_term = _sum_letters(b, b_term, keep | set(a_term))
    batch = "".join(c for c in a_term if c in b_term and c in keep)
    shared = "".join(c for c in a_term if c in b_term and c not in keep)
    left = "".join(c for c in a_term if c not in b_term)
    right = "".join(c for c in b_term if c not in a_term)
    size = dict(zip(a_term, a.shape)) | dict(zip(b_term, b.shape))

    def count(letters: str) -> int:
        total = 1
        for letter in letters:
            total *= size[letter]
        return total

    batch_shape = tuple(size[c] for c in batch)
    a3 = _arrange(a, a_term, batch + left + shared).reshape(batch_shape + (count(left), count(shared)))
    b3 = _arrange(b, b_term, batch + shared + right).reshape(batch_shape + (count(shared), count(right)))
    product = a3 @ b3
    result_term = batch + left + right
    return product.reshape(tuple(size[c] for c in result_term)), result_term


def einsum(equation: str, *operands: Any) -> Any:
    """torch.einsum (letters, an explicit or implicit output; no ellipsis, no repeated subscript within
    an operand), rewritten into existing ops: each operand's letters used nowhere else summed out,
    operands contracted left to right by batched matmuls (:func:`_contract`), the result permuted to
    the output's order. torch contracts in an order of its own (opt_einsum's where installed): the
    values agree within float32 rounding, not bit for bit."""
    loc = user_location()
    if len(operands) == 1 and isinstance(operands[0], (tuple, list)):
        operands = tuple(operands[0])
    if not operands or not all(isinstance(x, MathMethods) for x in operands):
        raise UnsupportedError("einsum takes traced tensors as its operands", loc=loc, op="einsum")
    tracer = operands[0].tracer
    with tracer.at_user_line("einsum"):
        operands = tuple(x.float() for x in operands)
        terms, output = _einsum_terms(equation, operands, loc)
        result, term = operands[0], terms[0]
        for position in range(1, len(operands)):
            later = set(output).union(*terms[position + 1:])
            result, term = _contract(result, term, operands[position], terms[position], later)
        result, term = _sum_letters(result, term, set(output))
        return _arrange(result, term, output)


einsum.bendc = "`bendc.functional.einsum` (permutes, reshapes, sums and batched matmuls)"


def _function(name: str) -> Callable:
    def function(input: Any, *args: Any, out: Any = None, **kwargs: Any) -> Any:
        if out is not None:
            raise UnsupportedError(f"{name}: out= is not supported", loc=user_location(), op=name)
        if not isinstance(input, MathMethods):
            raise UnsupportedError(f"{name} expects a traced tensor, got {type(input).__name__}",
                                   loc=user_location(), op=name)
        return getattr(input, name)(*args, **kwargs)

    function.__name__ = function.__qualname__ = name
    function.__doc__ = f"torch.{name}(input, ...): ``input.{name}(...)``."
    function.bendc = f"`Tensor.{name}`"
    return function


# bendc.functional.<name>, torch.<name> and torch.Tensor.<name> for each method above.
TENSOR_METHODS = ("nan_to_num", "round", "any", "all", "roll", "repeat_interleave", "outer", "ger", "norm",
                  "movedim", "moveaxis", "swapaxes", "swapdims", "count_nonzero")
# bendc.functional.<name> and torch.<name> for each name; torch.Tensor.<name> too for TENSOR_METHODS.
FUNCTIONS = {name: _function(name) for name in TENSOR_METHODS} | {"einsum": einsum}
