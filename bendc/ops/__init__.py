"""The op registry. Importing this package defines every op."""
from __future__ import annotations

from bendc.ops.base import OPS, InferError, Lowering, OpDef, define_op

from bendc.ops import (source, elementwise, reduce, layout, gather, matmul, optim, norm,  # noqa: E402,F401
                       attention, collective)
from bendc.ops import random, activation, loss  # noqa: E402,F401  (dropout, activations, losses)
from bendc.ops import extrema, scan  # noqa: E402,F401  (reductions beyond sum: max/min/arg*, cumsum)
from bendc.ops import pointwise  # noqa: E402,F401  (comparisons, casts, clamp, powers, tril/triu: issue 14)
from bendc.ops import conv  # noqa: E402,F401  (convolution and pooling)
from bendc.ops import group_norm  # noqa: E402,F401  (group norm: fused forward and backward)
from bendc.ops import layer_norm  # noqa: E402,F401  (layer norm: fused forward and backward)
from bendc.ops import batch_norm  # noqa: E402,F401  (training batch norm: fused forward and backward)
from bendc.ops import creation, integer  # noqa: E402,F401  (arange/full/tensor constants; index arithmetic)
from bendc.ops import math_ops  # noqa: E402,F401  (maximum, rounding, trig, erf, logs, lerp: issue 22)
from bendc.ops import sort, scatter  # noqa: E402,F401  (argsort; scatter_reduce: issue 22)

__all__ = ["OPS", "InferError", "Lowering", "OpDef", "define_op"]
