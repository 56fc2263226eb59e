"""bendc: a compiler for small PyTorch-style training programs.

```python
import bendc
import bendc.functional as F

@bendc.jit(leaves=("w", "b"))
def step(x, y, w, b):
    loss = F.mse_loss(F.linear(x, w, b), y)
    loss.backward()
    return loss, w.grad, b.grad
```

The names below are loaded on first use (PEP 562): ``import bendc`` imports
neither networkx nor numba until a name that needs them is touched.
"""
from __future__ import annotations

import importlib
from typing import Any

from bendc.version import __version__

_EXPORTS = {
    "jit": "bendc.function", "zero_grad": "bendc.function", "JitFunction": "bendc.function", "Tensor": "bendc.trace",
    "RecompileWarning": "bendc.function", "functional_call": "bendc.torch_bridge", "params": "bendc.torch_bridge",
    "buffers": "bendc.torch_bridge",
    **{name: "bendc.errors" for name in ("BendcError", "ShapeError", "UnsupportedError", "GradientError",
                                          "SignatureError", "RuntimeCheckError", "ArtifactError", "DistributedError",
                                          "InternalError")},
}

_SUBMODULES = ("tree", "optim", "functional", "distributed")
__all__ = [*_EXPORTS, *_SUBMODULES, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:  # bendc.tree and bendc.optim without importing them first
        return importlib.import_module(f"bendc.{name}")
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bendc' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
