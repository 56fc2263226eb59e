"""Programs for conv2d's two VJP products on cuda (the implicit-GEMM kernels of
bendc/ops/conv_cuda.py): each a conv (conv2d or conv1d) whose input and weight gradients are
taken, at tiny shapes for the simulator (tests/cuda/test_sim_conv.py) and at GPU shapes for the
PTX/cubin build (tests/cuda/test_ptx_conv.py).

The cases cover stride 1 and 2 (and 3, wider than the kernel: input rows no tap reaches), padding
(symmetric, asymmetric "same"), dilation 2 (with stride 2: a stride phase no tap reaches), groups
2, odd sizes and conv1d.
"""
from __future__ import annotations

import warnings

import numpy as np
import torch

import bendc.functional as F
from cuda_programs import Program, normal

# name: (x shape, weight shape, keyword arguments, bias); a 3-D x is conv1d
CONV_GRAD_CASES: dict[str, tuple[tuple[int, ...], tuple[int, ...], dict, bool]] = {
    "stride1_pad1_bias": ((2, 2, 5, 4), (3, 2, 3, 3), {"padding": 1}, True),
    "stride2_pad1_odd": ((1, 2, 7, 5), (3, 2, 3, 3), {"stride": 2, "padding": 1}, False),
    "dilation2_pad2": ((1, 2, 7, 6), (2, 2, 3, 3), {"dilation": 2, "padding": 2}, False),
    "stride2_dilation2": ((1, 2, 7, 6), (2, 2, 3, 2), {"stride": 2, "dilation": 2}, False),
    "groups2_stride2x1": ((2, 4, 5, 5), (4, 2, 3, 3), {"groups": 2, "padding": 1, "stride": (2, 1)}, True),
    "stride3_kernel2": ((1, 1, 7, 7), (2, 1, 2, 2), {"stride": 3}, False),
    "same_even_kernel": ((1, 2, 5, 6), (2, 2, 4, 2), {"padding": "same"}, False),
    "conv1d_stride2_groups2": ((2, 4, 9), (4, 2, 3), {"stride": 2, "padding": 1, "groups": 2}, True),
    "conv1d_dilation2": ((2, 3, 10), (2, 3, 3), {"dilation": 2, "padding": 2}, False),
}

# the same kinds of conv at the sizes a GPU runs (compiled, never run here)
CONV_GRAD_GPU_CASES: dict[str, tuple[tuple[int, ...], tuple[int, ...], dict, bool]] = {
    "gpu_stride1": ((32, 32, 32, 32), (64, 32, 3, 3), {"padding": 1}, True),
    "gpu_stride2_groups2": ((16, 32, 33, 31), (64, 16, 3, 3), {"stride": 2, "padding": 1, "groups": 2}, False),
    "gpu_dilation2": ((16, 16, 24, 24), (32, 16, 3, 3), {"dilation": 2, "padding": 2}, False),
    "gpu_first_layer": ((64, 3, 64, 64), (32, 3, 7, 7), {"stride": 2, "padding": 3}, False),
    "gpu_conv1d": ((16, 64, 255), (64, 64, 5), {"padding": 2}, True),
    "gpu_depthwise": ((16, 64, 32, 32), (64, 1, 3, 3), {"groups": 64, "padding": 1, "stride": 2}, False),
}


def conv_of(case) -> callable:
    """The conv of ``case`` on bendc's functional or torch's: f(x, w, b=None)."""
    x_shape, _, kwargs, _ = case
    conv1d = len(x_shape) == 3

    def conv(module, x, w, b=None):
        return (module.conv1d if conv1d else module.conv2d)(x, w, b, **kwargs)

    return conv


def conv_grad_program(name: str, case) -> Program:
    """y = conv(x, w[, b]); (y * g).sum().backward(): y, x.grad, w.grad (and b.grad)."""
    x_shape, w_shape, _, bias = case
    conv = conv_of(case)

    def inputs(rng: np.random.Generator) -> tuple:
        x, w = normal(rng, *x_shape), normal(rng, *w_shape) * 0.5
        g = normal(rng, *_torch_conv(case, (torch.from_numpy(x), torch.from_numpy(w))).shape)
        return (x, w, normal(rng, w_shape[0]), g) if bias else (x, w, g)

    if bias:
        def fn(x, w, b, g):
            y = conv(F, x, w, b)
            (y * g).sum().backward()
            return y, x.grad, w.grad, b.grad
        leaves = ("x", "w", "b")
    else:
        def fn(x, w, g):
            y = conv(F, x, w)
            (y * g).sum().backward()
            return y, x.grad, w.grad
        leaves = ("x", "w")
    fn.__name__ = f"conv_grad_{name}"
    return Program(name, fn, leaves, inputs, frozenset({"matmul"}))


def _torch_conv(case, tensors):
    with warnings.catch_warnings():  # padding="same" with an even kernel: torch warns that it copies
        warnings.simplefilter("ignore", UserWarning)
        return conv_of(case)(torch.nn.functional, *tensors)


def torch_outputs(case, inputs: tuple) -> tuple[np.ndarray, ...]:
    """PyTorch eager's y, x.grad, w.grad (and b.grad) for ``inputs`` (as conv_grad_program's)."""
    tensors = [torch.tensor(value, requires_grad=True) for value in inputs[:-1]]
    y = _torch_conv(case, tensors)
    (y * torch.from_numpy(inputs[-1])).sum().backward()
    return (y.detach().numpy(), *(t.grad.numpy() for t in tensors))


CONV_GRAD_PROGRAMS = [conv_grad_program(name, case) for name, case in CONV_GRAD_CASES.items()]
CONV_GRAD_GPU_PROGRAMS = [conv_grad_program(name, case) for name, case in CONV_GRAD_GPU_CASES.items()]
