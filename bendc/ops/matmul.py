"""Matrix products: torch.matmul on operands of two or more dimensions with
broadcast batch dimensions (the tracer handles 1-D promotion)."""
from __future__ import annotations

import numpy as np

from bendc.ops.base import InferError, Lowering, broadcast_shapes, define_op, require_float


def _infer_matmul(types, attrs):
    a, b = types
    require_float(types, "matmul")
    if a.ndim < 2 or b.ndim < 2:
        raise InferError("matmul operands need two or more dimensions (1-D is promoted by the tracer)")
    if a.shape[-1] != b.shape[-2]:
        raise InferError(f"inner dimensions differ: {a.shape[-1]} vs {b.shape[-2]}")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return a.with_shape(batch + (a.shape[-2], b.shape[-1]))


def _swap_last(ndim: int) -> tuple[int, ...]:
    return tuple(range(ndim - 2)) + (ndim - 1, ndim - 2)


def vjp_matmul(b, node, grad, needs):
    """d (A @ B) = (g @ B^T, A^T @ g), each summed over broadcast batch dims.

    A frozen (constant) operand gets no product at all.
    """
    x, y = node.inputs
    grad_x = grad_y = None
    if needs[0]:
        y_t = b.permute(y, _swap_last(len(b.shape(y))))
        grad_x = b.sum_to_size(b.matmul(grad, y_t), b.shape(x))
    if needs[1]:
        x_t = b.permute(x, _swap_last(len(b.shape(x))))
        grad_y = b.sum_to_size(b.matmul(x_t, grad), b.shape(y))
    return (grad_x, grad_y)


define_op(
    name="matmul",
    arity=2,
    infer=_infer_matmul,
    reference=lambda v, a: np.ascontiguousarray(np.matmul(v[0], v[1]), dtype=np.float32),
    lowering=Lowering("matmul", cpu=lambda attrs, ins, out: (
        "def kernel(in0, in1, out0):\n    np.matmul(in0, in1, out=out0)\n")),
    vjp=vjp_matmul,
    doc="`%2 = matmul %0, %1 : f32[32,16]`: batched matrix product with broadcast batch dims.",
)
