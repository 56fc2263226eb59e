"""Tensor types: a dtype and a static shape, printed ``f32[32,16]``."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from runtime.dtypes import DTYPES, numel

__all__ = ["DTYPES", "TensorType", "dtype_name", "f32", "numel"]
_NAME_OF = {dtype: name for name, dtype in DTYPES.items()}


@dataclass(frozen=True)
class TensorType:
    """A dtype name (``f32``, ``i64``, ``i32``, ``bool``) and a shape."""

    dtype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        assert self.dtype in DTYPES, self.dtype
        assert all(isinstance(d, int) and d >= 0 for d in self.shape), self.shape

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return numel(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPES[self.dtype].itemsize

    @property
    def np_dtype(self) -> np.dtype:
        return DTYPES[self.dtype]

    @property
    def is_float(self) -> bool:
        return self.dtype == "f32"

    @property
    def is_index(self) -> bool:
        return self.dtype in ("i64", "i32")

    def with_shape(self, shape: tuple[int, ...]) -> TensorType:
        return TensorType(self.dtype, tuple(shape))

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(str(d) for d in self.shape)}]"

    @staticmethod
    def parse(text: str) -> TensorType:
        """Inverse of ``str``: ``f32[32,16]`` -> TensorType('f32', (32, 16))."""
        text = text.strip()
        name, _, rest = text.partition("[")
        if name not in DTYPES or not rest.endswith("]"):
            raise ValueError(f"not a tensor type: {text!r}")
        body = rest[:-1].strip()
        shape = tuple(int(d) for d in body.split(",")) if body else ()
        return TensorType(name, shape)


def dtype_name(dtype: np.dtype) -> str | None:
    """bendc's name for a numpy dtype, or None where bendc has none."""
    return _NAME_OF.get(np.dtype(dtype))


def f32(*shape: int) -> TensorType:
    return TensorType("f32", tuple(shape))
