"""The op registry. Importing this package defines every op."""
from __future__ import annotations

from bendc.ops.base import OPS, InferError, Lowering, OpDef, define_op

from bendc.ops import (source, elementwise, reduce, layout, gather, matmul, optim, norm,  # noqa: E402,F401
                       attention)
from bendc.ops import conv  # noqa: E402,F401  (convolution and pooling)

__all__ = ["OPS", "InferError", "Lowering", "OpDef", "define_op"]
