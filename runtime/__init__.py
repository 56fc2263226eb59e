"""The minimal runtime: runs a kernel plan and reads artifacts. Imports numpy, numba
(the generated kernels) and, for cuda artifacts, cuda.core only: never the compiler
(no tracer, passes or networkx). Names are loaded on first use (PEP 562), so
``runtime.dtypes`` can be read without importing numba."""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"CpuProgram": "runtime.cpu", "KernelError": "runtime.cpu", "load": "runtime.api", "Program": "runtime.api"}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")
