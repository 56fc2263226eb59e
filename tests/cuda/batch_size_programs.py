"""A training step whose every cuda kernel kind depends on the batch size (issue 25, item 7): a
linear layer with bias, relu and layer_norm (row statistics, epilogue sums of the bias and norm
gradients), a second linear layer, cross-entropy (log_softmax rows, the targets' gather and its
scatter in the backward) and a softmax summed over the batch (a sum over the batch axis). Used by
tests/cuda/test_sim_batch_sizes.py (values); test_ptx_batch_sizes.py builds the cubins of the smaller
small_step."""
from __future__ import annotations

import numpy as np

import bendc.functional as F

FEATURES, HIDDEN, CLASSES = 8, 16, 5
LEAVES = ("w1", "b1", "w2", "g", "be")


def batch_step(x, t, w1, b1, w2, g, be):
    h = F.layer_norm(F.relu(F.linear(x, w1, b1)), (HIDDEN,), g, be)
    logits = F.linear(h, w2)
    loss = F.cross_entropy(logits, t) + F.softmax(logits, 1).sum(0).max()
    loss.backward()
    return loss, w1.grad, b1.grad, w2.grad, g.grad, be.grad


def small_step(x, w1, b1):
    """A linear layer, relu and a sum: six kernels (products, a fused group with its epilogue sum)."""
    loss = F.relu(F.linear(x, w1, b1)).sum()
    loss.backward()
    return loss, w1.grad, b1.grad


def inputs(batch: int, seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)

    def normal(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    return (normal(batch, FEATURES), rng.integers(0, CLASSES, size=batch), 0.3 * normal(HIDDEN, FEATURES),
            normal(HIDDEN), 0.3 * normal(CLASSES, HIDDEN), 1.0 + 0.1 * normal(HIDDEN), 0.1 * normal(HIDDEN))


def small_spec(batch: int) -> str:
    return f"x=f32[{batch},{FEATURES}] w1=f32[{HIDDEN},{FEATURES}]:leaf b1=f32[{HIDDEN}]:leaf"


def spec(batch: int) -> str:
    return (f"x=f32[{batch},{FEATURES}] t=i64[{batch}] w1=f32[{HIDDEN},{FEATURES}]:leaf b1=f32[{HIDDEN}]:leaf "
            f"w2=f32[{CLASSES},{HIDDEN}]:leaf g=f32[{HIDDEN}]:leaf be=f32[{HIDDEN}]:leaf")


# ------------------------------------------------------------------ the row and image ops (item 7's rest)
ROW_LEAVES, IMAGE_LEAVES, CONV_LEAVES = ("x",), ("img", "w", "b"), ("img", "w")


def row_ops(x, cos, sin, g):
    """rope, both scans, the extrema (values, indices), logsumexp, all over the last axis, and their VJPs."""
    y = F.rope(x, cos, sin) * g + x.cumsum(3) + x.cumprod(3) * 0.5
    m = x.amax(3) + x.amin(3) + x.logsumexp(3) + x.argmax(3).float() + x.max(3)[0]
    loss = (y * y).sum() + (m * m).sum()
    loss.backward()
    return loss, x.grad


def image_ops(img, g, w, b):
    """group_norm, the max, average and adaptive pools, and their gradients; an SGD update of the
    norm's weight and bias, whose gradients are read at offsets of group_norm_grad's one output
    after the batch-sized dx (a kernel argument that starts there: codegen/views.py StepReads)."""
    n = F.group_norm(img, 2, w, b)
    p = (F.max_pool2d(img, 2) * F.avg_pool2d(img, 2)).sum() + (F.adaptive_avg_pool2d(img, 3) ** 2).sum()
    loss = (n * g).sum() + p
    loss.backward()
    return loss, img.grad, w - 0.1 * w.grad, b - 0.1 * b.grad


def conv_ops(img, w):
    """A grouped conv2d of stride 2 (dx in two phases per axis) and its gradients."""
    y = F.conv2d(img, w, stride=2, padding=1, groups=2)
    (y * y).sum().backward()
    return y, img.grad, w.grad


def row_spec(batch: int) -> str:
    return f"x=f32[{batch},2,4,6]:leaf cos=f32[4,3] sin=f32[4,3] g=f32[{batch},2,4,6]"


def image_spec(batch: int) -> str:
    return f"img=f32[{batch},4,6,6]:leaf g=f32[{batch},4,6,6] w=f32[4]:leaf b=f32[4]:leaf"


def conv_spec(batch: int) -> str:
    """16 x 16 images: from batch 4 on the weight gradient's reduction (batch x 64 positions) has the
    16 tiles of 16 that give its block all its slices (conv_cuda.grad_weight_kernels), as training
    batches do; below that the slice count, a constant of the source, follows the batch."""
    return f"img=f32[{batch},4,16,16]:leaf w=f32[4,2,3,3]:leaf"


def row_inputs(batch: int, seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape).astype(np.float32) * scale
                 for shape, scale in (((batch, 2, 4, 6), 0.5), ((4, 3), 1.0), ((4, 3), 1.0), ((batch, 2, 4, 6), 1.0)))


def image_inputs(batch: int, seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    return (*(rng.standard_normal((batch, 4, 6, 6)).astype(np.float32) for _ in range(2)),
            *(rng.standard_normal(4).astype(np.float32) for _ in range(2)))
