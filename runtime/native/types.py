"""The types of the native translator (runtime/native/translate.py), and numba's typing rules for them.

Generated kernels are numba code: their numbers are whatever numba's typing and lowering make of
them. The translator compiles the same source without numba, so it types every operation as numba
does (tests/native/test_native_types.py checks each rule below against numba's own typing context,
for every pair of these scalar types):

- arithmetic on integers widens to 64 bits: signed (or bool) with signed gives int64, unsigned with
  unsigned uint64, and a mix int64 (numba's ``(uint64, int64) -> int64`` signatures);
- arithmetic with a float, comparisons, ``min``/``max`` and the unification of a variable's
  assignments follow numpy's ``promote_types`` (float32 with int32 or int64 is float64; int64 with
  uint64 is float64; float32 with a bool or an 8-bit integer stays float32);
- ``/`` of integers is float64; ``**`` of a float by an integer keeps the float type (repeated
  multiplication), otherwise promotes;
- shifts keep the left operand's signedness at 64 bits; ``-x`` and ``~x`` of an integer widen it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class Unsupported(Exception):
    """Source the translator does not compile: the kernel stays numba's (a message says why)."""


@dataclass(frozen=True)
class Scalar:
    name: str   # numpy's name: bool, int8, ..., float64
    kind: str   # "b", "i", "u" or "f"
    bits: int

    @property
    def llvm(self) -> str:
        """The LLVM type of a value in a register."""
        if self.kind == "f":
            return "float" if self.bits == 32 else "double"
        return "i1" if self.kind == "b" else f"i{self.bits}"

    @property
    def memory(self) -> str:
        """The LLVM type of an element in an array (a bool is a byte)."""
        return "i8" if self.kind == "b" else self.llvm

    @property
    def size(self) -> int:
        return 1 if self.kind == "b" else self.bits // 8

    @property
    def signed(self) -> bool:
        return self.kind in "ib"

    @property
    def is_int(self) -> bool:
        return self.kind in "iub"

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.name)

    def __str__(self) -> str:
        return self.name


BOOL = Scalar("bool", "b", 1)
INT8, INT16, INT32, INT64 = (Scalar(f"int{b}", "i", b) for b in (8, 16, 32, 64))
UINT8, UINT16, UINT32, UINT64 = (Scalar(f"uint{b}", "u", b) for b in (8, 16, 32, 64))
FLOAT32, FLOAT64 = Scalar("float32", "f", 32), Scalar("float64", "f", 64)
SCALARS = {s.name: s for s in (BOOL, INT8, INT16, INT32, INT64, UINT8, UINT16, UINT32, UINT64, FLOAT32, FLOAT64)}
INTP = INT64


@dataclass(frozen=True)
class Array:
    dtype: Scalar
    ndim: int

    def __str__(self) -> str:
        return f"{self.dtype}[{self.ndim}d]"


@dataclass(frozen=True)
class Tuple:
    items: tuple

    def __str__(self) -> str:
        return "(" + ", ".join(map(str, self.items)) + ")"

    @property
    def llvm(self) -> str:
        """A tuple of numbers as an LLVM struct (what a helper returning one returns)."""
        return "{" + ", ".join(item.llvm for item in self.items) + "}"


@dataclass(frozen=True)
class DType:
    """A dtype object used as a value (``np.float64`` passed to np.zeros, ``.view(np.int32)``)."""

    scalar: Scalar


@dataclass(frozen=True)
class Function:
    """A callable named in the source: ``math.exp``, ``np.float32``, a helper of the module."""

    name: str


NONE = "none"  # a function that returns nothing


def scalar_of(dtype) -> Scalar:
    name = np.dtype(dtype).name
    if name not in SCALARS:
        raise Unsupported(f"dtype {name}")
    return SCALARS[name]


def promote(a: Scalar, b: Scalar) -> Scalar:
    """numpy's promote_types, which numba's unification of two number types follows."""
    if a == b:
        return a
    return scalar_of(np.promote_types(a.dtype, b.dtype))


def integer_arithmetic(a: Scalar, b: Scalar) -> Scalar:
    """The type numba gives + - * // % & | ^ of two integers (bools count as signed)."""
    if a.signed or b.signed:
        return INT64
    return UINT64


def arithmetic(a: Scalar, b: Scalar) -> Scalar:
    """+ - * // %: the operands are cast to this type and it is the result's."""
    if a.kind == "f" or b.kind == "f":
        return promote(a, b)
    return integer_arithmetic(a, b)


def true_division(a: Scalar, b: Scalar) -> Scalar:
    if a.kind == "f" or b.kind == "f":
        return promote(a, b)
    return FLOAT64


def bitwise(a: Scalar, b: Scalar) -> Scalar:
    """& | ^: bool with bool stays bool; floats are refused, as numba refuses them."""
    if a.kind == "f" or b.kind == "f":
        raise Unsupported("a bitwise operation on a float")
    if a == BOOL and b == BOOL:
        return BOOL
    return integer_arithmetic(a, b)


def shift(a: Scalar, b: Scalar) -> Scalar:
    if a.kind == "f" or b.kind == "f":
        raise Unsupported("a shift of a float")
    return INT64 if a.signed else UINT64


def power(a: Scalar, b: Scalar) -> Scalar:
    """``a ** b``: a float base with an integer exponent keeps its type (numba's int_power)."""
    if a.kind == "f" and b.kind != "f":
        return a
    return arithmetic(a, b)


def negation(a: Scalar) -> Scalar:
    if a.kind == "f":
        return a
    return INT64 if a.signed else UINT64


def inversion(a: Scalar) -> Scalar:
    if a.kind == "f":
        raise Unsupported("~ of a float")
    if a == BOOL:
        return BOOL
    return INT64 if a.signed else UINT64


def unify(a, b):
    """The type of a variable assigned values of types ``a`` and ``b`` (numba's unify_pairs)."""
    if a is None:
        return b
    if b is None or a == b:
        return a
    if isinstance(a, Scalar) and isinstance(b, Scalar):
        return promote(a, b)
    if isinstance(a, Tuple) and isinstance(b, Tuple) and len(a.items) == len(b.items):
        return Tuple(tuple(unify(x, y) for x, y in zip(a.items, b.items)))
    raise Unsupported(f"a variable holds both {a} and {b}")


# numba's lowering of math.* for a float argument: an LLVM intrinsic or an external C function
# (numba/cpython/mathimpl.py). An integer argument is converted to float64 first. ``int`` marks the
# functions whose result numba converts to int64 (floor, ceil, trunc: Python's int results).
MATH_UNARY: dict[str, tuple[str, str, bool]] = {
    # name: (how, base name, int result); how "intrinsic" -> llvm.<name>.f32, "extern" -> <name>f / <name>
    "fabs": ("intrinsic", "fabs", False),
    "exp": ("intrinsic", "exp", False),
    "exp2": ("intrinsic", "exp2", False),
    "log": ("intrinsic", "log", False),
    "log10": ("intrinsic", "log10", False),
    "sin": ("intrinsic", "sin", False),
    "cos": ("intrinsic", "cos", False),
    "log1p": ("extern", "log1p", False),
    "expm1": ("extern", "expm1", False),
    "erf": ("extern", "erf", False),
    "erfc": ("extern", "erfc", False),
    "tan": ("extern", "tan", False),
    "asin": ("extern", "asin", False),
    "acos": ("extern", "acos", False),
    "atan": ("extern", "atan", False),
    "asinh": ("extern", "asinh", False),
    "acosh": ("extern", "acosh", False),
    "atanh": ("extern", "atanh", False),
    "sinh": ("extern", "sinh", False),
    "cosh": ("extern", "cosh", False),
    "tanh": ("extern", "tanh", False),
    "log2": ("extern", "log2", False),
    "ceil": ("extern", "ceil", True),
    "floor": ("extern", "floor", True),
    "sqrt": ("extern", "sqrt", False),
    "trunc": ("extern", "trunc", True),
}
