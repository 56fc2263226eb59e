"""Optimizer scalars that PyTorch computes on the host in float64.

torch.optim.AdamW computes its bias corrections in Python floats from the
step count; the tensor ops then use them as float32 scalars. With the step
count as a traced value (so a training loop does not retrace every step),
these ops compute the same float64 expressions per call and round once.
"""
from __future__ import annotations

import math

import numpy as np

from bendc.ir.types import TensorType
from bendc.ops.base import InferError, Lowering, define_op


def _infer_step_scalar(types, attrs):
    (step,) = types
    if step.shape != () or step.dtype == "bool":
        raise InferError(f"the step count must be a scalar number, got {step}", unsupported=True)
    return TensorType("f32", ())


def _reference_step_size(values, attrs):
    with np.errstate(divide="ignore"):
        size = np.float64(attrs["lr"]) / (1.0 - np.float64(attrs["beta1"]) ** np.float64(values[0]))
    return np.array(size, dtype=np.float32)


def _reference_bias_root(values, attrs):
    return np.array(np.float32(math.sqrt(1.0 - attrs["beta2"] ** float(values[0]))), dtype=np.float32)


define_op(
    name="adam_step_size",
    arity=1,
    infer=_infer_step_scalar,
    reference=_reference_step_size,
    lowering=Lowering("elementwise", scalar=lambda step, *, lr, beta1: (
        f"np.float32({lr!r} / (1.0 - {beta1!r} ** float({step})))")),
    no_vjp="the step count is a constant",
    attr_names=("beta1", "lr"),
    doc="`%1 = adam_step_size[beta1=0.9, lr=0.001] %step : f32[]`: lr / (1 - beta1**step), in float64.",
)

define_op(
    name="adam_bias_root",
    arity=1,
    infer=_infer_step_scalar,
    reference=_reference_bias_root,
    lowering=Lowering("elementwise", scalar=lambda step, *, beta2: (
        f"np.float32(math.sqrt(1.0 - {beta2!r} ** float({step})))")),
    no_vjp="the step count is a constant",
    attr_names=("beta2",),
    doc="`%1 = adam_bias_root[beta2=0.999] %step : f32[]`: sqrt(1 - beta2**step), in float64.",
)


def _reference_lr_step_size(values, attrs):
    step, lr = (np.float64(v) for v in values)
    with np.errstate(divide="ignore"):
        return np.array(lr / (1.0 - np.float64(attrs["beta1"]) ** step), dtype=np.float32)


define_op(
    name="adam_lr_step_size",
    arity=2,
    infer=lambda types, attrs: _infer_bias_correction(types, attrs),
    reference=_reference_lr_step_size,
    lowering=Lowering("elementwise", scalar=lambda step, lr, *, beta1: (
        f"np.float32(float({lr}) / (1.0 - {beta1!r} ** float({step})))")),
    no_vjp="the step count and the learning rate are constants",
    attr_names=("beta1",),
    doc="`%2 = adam_lr_step_size[beta1=0.9] %step, %lr : f32[]`: lr / (1 - beta1**step), in float64 "
        "(a traced learning rate).",
)


def _infer_bias_correction(types, attrs):
    for t in types:
        _infer_step_scalar([t], attrs)
    return TensorType("f32", ())


def _reference_bias_correction(values, attrs):
    beta, step = (np.float64(v) for v in values)
    return np.array(1.0 - beta ** step, dtype=np.float32)


define_op(
    name="bias_correction",
    arity=2,
    infer=_infer_bias_correction,
    reference=_reference_bias_correction,
    lowering=Lowering("elementwise", scalar=lambda beta, step: (
        f"np.float32(1.0 - float({beta}) ** float({step}))")),
    no_vjp="the betas and the step count are constants",
    doc="`%2 = bias_correction %beta, %step : f32[]`: 1 - beta**step, in float64 (traced betas).",
)


def _reference_adagrad_lr(values, attrs):
    step = np.float64(values[0])
    return np.array(np.float64(attrs["lr"]) / (1.0 + (step - 1.0) * np.float64(attrs["lr_decay"])),
                    dtype=np.float32)


define_op(
    name="adagrad_lr",
    arity=1,
    infer=_infer_step_scalar,
    reference=_reference_adagrad_lr,
    lowering=Lowering("elementwise", scalar=lambda step, *, lr, lr_decay: (
        f"np.float32({lr!r} / (1.0 + (float({step}) - 1.0) * {lr_decay!r}))")),
    no_vjp="the step count is a constant",
    attr_names=("lr", "lr_decay"),
    doc="`%1 = adagrad_lr[lr=0.01, lr_decay=0.001] %step : f32[]`: torch.optim.Adagrad's "
        "lr / (1 + (step - 1) * lr_decay), in float64.",
)
