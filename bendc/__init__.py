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
"""
from __future__ import annotations

from bendc.errors import (ArtifactError, BendcError, GradientError, InternalError, RuntimeCheckError,
                          ShapeError, SignatureError, UnsupportedError)
from bendc.jit import JitFunction, jit, zero_grad
from bendc.trace import Tensor

__version__ = "0.1.0"

__all__ = [
    "jit", "zero_grad", "JitFunction", "Tensor", "BendcError", "ShapeError", "UnsupportedError",
    "GradientError", "SignatureError", "RuntimeCheckError", "ArtifactError", "InternalError", "__version__",
]
