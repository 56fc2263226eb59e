"""The one dtype table: bendc's dtype names, their numpy dtypes and numba type names.

The runtime reads plans and manifests that name dtypes (``f32``, ``i64``, ...);
the compiler's types (bendc/ir/types.py) use the same table.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

DTYPES: dict[str, np.dtype] = {
    "f32": np.dtype(np.float32),
    "i64": np.dtype(np.int64),
    "i32": np.dtype(np.int32),
    "bool": np.dtype(np.bool_),
}

# numba's names for the same types (kernel signatures of generated cuda modules).
NUMBA_NAMES: dict[str, str] = {"f32": "float32", "i64": "int64", "i32": "int32", "bool": "boolean"}


def numel(shape: Iterable[int]) -> int:
    """Elements of an array of ``shape`` (1 for a 0-d array)."""
    count = 1
    for size in shape:
        count *= size
    return count


def nbytes(dtype: str, shape: Iterable[int]) -> int:
    return numel(shape) * DTYPES[dtype].itemsize
