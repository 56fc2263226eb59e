"""Convolutions followed by elementwise work: on the cpu target the fusion pass folds the group
reading a conv's result into the conv's kernel, which applies it to each sample's block right
after the sample's BLAS product (bendc/passes/fusion.py ``absorb_producers``, bendc/kernels/
epilogue.py). Values and gradients against PyTorch on every target, within the conv tests'
tolerances (test_conv.py: the conv sums are BLAS's, PyTorch's oneDNN's); and the plan: one kernel
fewer than the same graph fused for cuda, whose kernels take no epilogue.
"""
from __future__ import annotations

import numpy as np
import pytest

import bendc
import bendc.functional as BF
from bendc.codegen.plan import build_plan
from bendc.ir.parser import parse_graph
from bendc.passes import PassContext, Pipeline, default_passes
from parity_harness import _named_function, normal, parity, target  # noqa: F401  (target: the autouse fixture)

CONV_RTOL, CONV_ATOL = 2e-5, 2e-5


def conv_parity(body, inputs, leaves):
    return parity(body, inputs, leaves, rtol=CONV_RTOL, atol=CONV_ATOL)


def conv_inputs(x_shape, w_shape, seed: int) -> dict[str, np.ndarray]:
    return {"x": normal(x_shape, seed), "w": normal(w_shape, seed + 1, 0.5), "b": normal((w_shape[0],), seed + 2)}


# ------------------------------------------------------------------ values and gradients
def relu_chain(F, x, w, b):
    return F.relu(F.conv2d(x, w, b, padding=1))


def affine_chain(F, x, w, b, s, t):
    """conv * s + t with per-channel s and t (leaves too: their gradients are sums in the group)."""
    return F.relu(F.conv2d(x, w, b, padding=1) * s + t)


def residual_chain(F, x, w, b):
    return F.relu(F.conv2d(x, w, b, padding=1) + x)


def both_needed(F, x, w, b):
    """silu's VJP reads the conv's result, the product reads silu's: both are needed by backward."""
    y = F.conv2d(x, w, b, padding=1)
    h = F.silu(y)
    return h * h + y


def conv1d_chain(F, x, w, b):
    return F.gelu(F.conv1d(x, w, b, padding=1)) * 0.5


def grouped_strided(F, x, w, b):
    return F.leaky_relu(F.conv2d(x, w, b, stride=2, padding=1, groups=2), 0.1)


def also_pooled(F, x, w, b):
    """The conv's result is read by the epilogue and by a pool: it is still written."""
    y = F.conv2d(x, w, b, padding=1)
    return (F.tanh(y) * 2.0).sum() + F.max_pool2d(y, 2).sum()


def squared_mean(F, x, w, b):
    """The loss is a sum inside the fused group: per-block partial sums in the conv's kernel."""
    return (F.relu(F.conv2d(x, w, b, padding=1)) ** 2).mean()


def no_bias(F, x, w):
    return F.sigmoid(F.conv2d(x, w, padding=1)) - 0.5


def unbatched(F, x, w, b):
    """(C, H, W): the group runs over (O, H, W), not led by the conv's batch axis: not absorbed."""
    return F.relu(F.conv2d(x, w, b, padding=1))


CASES = {
    # name: (body, inputs, leaves)
    "relu": (relu_chain, conv_inputs((2, 3, 7, 6), (4, 3, 3, 3), 500), ("x", "w", "b")),
    "affine": (affine_chain, {**conv_inputs((3, 2, 6, 6), (5, 2, 3, 3), 510), "s": normal((5, 1, 1), 513),
                              "t": normal((5, 1, 1), 514)}, ("x", "w", "b", "s", "t")),
    "residual": (residual_chain, conv_inputs((2, 4, 5, 5), (4, 4, 3, 3), 520), ("x", "w", "b")),
    "both_needed": (both_needed, conv_inputs((2, 3, 6, 5), (4, 3, 3, 3), 530), ("x", "w", "b")),
    "conv1d": (conv1d_chain, conv_inputs((3, 2, 11), (4, 2, 3), 540), ("x", "w", "b")),
    "grouped_strided": (grouped_strided, conv_inputs((2, 4, 9, 8), (6, 2, 3, 3), 550), ("x", "w", "b")),
    "also_pooled": (also_pooled, conv_inputs((2, 3, 6, 6), (4, 3, 3, 3), 560), ("x", "w", "b")),
    "squared_mean": (squared_mean, conv_inputs((2, 3, 6, 6), (4, 3, 3, 3), 570), ("x", "w", "b")),
    # 20 x 16 x 16 x 16 outputs: the parallel kernel, 16 blocks of samples, the sums' partials per block
    "parallel_blocks": (squared_mean, conv_inputs((20, 4, 16, 16), (16, 4, 3, 3), 580), ("x", "w", "b")),
    "no_bias": (no_bias, {"x": normal((2, 3, 6, 6), 590), "w": normal((4, 3, 3, 3), 591, 0.5)}, ("x", "w")),
    "unbatched": (unbatched, conv_inputs((3, 6, 5), (2, 3, 3, 3), 600), ("x", "w", "b")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_conv_then_elementwise(case):
    body, inputs, leaves = CASES[case]
    conv_parity(body, inputs, leaves)


# ------------------------------------------------------------------ the plan
def _step_of(body, inputs, leaves):
    """A bendc step computing ``body``'s value and the leaves' gradients (of its sum)."""
    names = list(inputs)

    def run(args: tuple):
        bound = dict(zip(names, args))
        out = body(BF, **bound)
        out.sum().backward()
        return out, tuple(bound[name].grad for name in leaves)

    return bendc.jit(_named_function(names, run), leaves=tuple(leaves), target="cpu")


def _plans(body, inputs, leaves):
    """The cpu executable, its plan, and the plan of the same graph fused for cuda."""
    step = _step_of(body, inputs, leaves)
    step(*inputs.values())
    executable = step._executable()
    autodiff = parse_graph(executable.stages["autodiff"])
    for_cuda = Pipeline(default_passes()).run(autodiff, PassContext(target="cuda"), lambda name, graph: None)
    return executable, build_plan(executable.graph), build_plan(for_cuda)


def test_the_conv_kernel_absorbs_its_elementwise_consumers():
    body, inputs, leaves = CASES["affine"]
    executable, cpu_plan, cuda_plan = _plans(body, inputs, leaves)
    conv = next(n for n in executable.graph.nodes() if n.op == "conv2d")
    assert conv.kernel is not None, "the conv belongs to a fused group"
    # the printed IR (the pass report) shows the conv in its group
    conv_line = next(line for line in executable.stages["fuse"].splitlines() if " conv2d[" in line)
    assert f"[k{conv.kernel}]" in conv_line
    steps = [s for s in cpu_plan.steps if conv.id in s.nodes]
    assert len(steps) == 1 and len(steps[0].nodes) > 1 and steps[0].kind == "matmul"
    assert len(cpu_plan.steps) == len(cuda_plan.steps) - 1, "one kernel fewer than unfused"
    source = executable.kernels[steps[0].name]
    assert "def _epilogue(" in source and "_epilogue(n, 1, result" in source
    # the conv's result is read only by the epilogue: the step does not write it
    assert conv.id not in steps[0].outputs
    assert "as its epilogue" in executable.report


def test_a_conv_result_read_elsewhere_is_still_written():
    """The step returns the conv's result and a chain over it: the fused kernel writes both."""
    @bendc.jit(target="cpu")
    def step(x, w, b):
        y = BF.conv2d(x, w, b, padding=1)
        return y, BF.relu(y) * 2.0

    inputs = conv_inputs((3, 2, 6, 5), (4, 2, 3, 3), 610)
    y, chain = step(*inputs.values())
    import torch

    expected = torch.nn.functional.conv2d(*(torch.from_numpy(a) for a in inputs.values()), padding=1)
    np.testing.assert_allclose(y, expected.numpy(), rtol=CONV_RTOL, atol=CONV_ATOL)
    np.testing.assert_array_equal(chain, np.maximum(y, 0.0) * np.float32(2.0))
    executable = step._executable()
    conv = next(n for n in executable.graph.nodes() if n.op == "conv2d")
    fused = next(s for s in build_plan(executable.graph).steps if conv.id in s.nodes)
    assert len(fused.nodes) == 3 and fused.outputs[0] == conv.id and len(fused.outputs) == 2


def test_a_group_needing_a_later_value_stays_apart():
    """max_pool2d_grad reads the conv's result and feeds the fused group's backward: a cycle."""
    body, inputs, leaves = CASES["also_pooled"]
    executable, cpu_plan, cuda_plan = _plans(body, inputs, leaves)
    conv = next(n for n in executable.graph.nodes() if n.op == "conv2d")
    assert conv.kernel is None and len(cpu_plan.steps) == len(cuda_plan.steps)
    assert "the group needs a value computed after it" in executable.report


def test_a_group_not_led_by_the_batch_axis_stays_apart():
    body, inputs, leaves = CASES["unbatched"]
    executable, cpu_plan, cuda_plan = _plans(body, inputs, leaves)
    conv = next(n for n in executable.graph.nodes() if n.op == "conv2d")
    assert conv.kernel is None
    assert len(cpu_plan.steps) == len(cuda_plan.steps)
    assert "is not the leading axis of its result" in executable.report
