"""Epilogue sums of fused elementwise groups are deterministic on the GPU: rendered as a kernel of
their own per sum (a block per output element, a fixed tree, codegen/cuda.py), with no float
atomics left in the sources or in the PTX (``atom``/``red`` ``.add.f32``, whose order varies from
run to run). tests/cuda/test_sim_epilogue_sums.py runs them under the simulator."""
from __future__ import annotations

import importlib.util
import os
import re

import pytest

import bendc
from bendc.codegen.cuda import render_cuda_plan
from bendc.codegen.plan import build_plan
from epilogue_programs import LEAVES, SHAPES, fused_sums

FLOAT_ATOMIC = re.compile(r"\b(atom|red)(\.\w+)*\.add(\.\w+)*\.f32\b")


def epilogue_steps(plan):
    return [s for s in plan.steps if s.kind == "elementwise" and "epilogue" in s.source.split("\n", 1)[0]]


def rendered():
    graph = bendc.jit(fused_sums, leaves=LEAVES, target="reference").lower(SHAPES).graph
    plan = build_plan(graph)
    render_cuda_plan(plan, graph)
    return plan


def test_epilogue_sums_have_a_kernel_each_and_no_atomics() -> None:
    steps = epilogue_steps(rendered())
    assert steps
    for step in steps:
        assert "cuda.atomic" not in step.source, step.source
        kernels = [launch["kernel"] for launch in step.launches]
        assert "zero" not in kernels and any(k.startswith("sum") for k in kernels), kernels
        assert "a fixed tree: the same bits every run" in step.source


@pytest.mark.skipif(importlib.util.find_spec("numba_cuda") is None or os.environ.get("NUMBA_ENABLE_CUDASIM") == "1",
                    reason="PTX needs numba-cuda, outside the simulator")
def test_no_float_atomic_add_in_the_ptx(tmp_path) -> None:
    from bendc.codegen.ptx import compile_kernel
    from bendc.codegen.cache import kernel_path, write_kernel
    from runtime.artifact import load_module

    assert FLOAT_ATOMIC.search("red.global.add.f32 [%rd1], %f1;")  # the pattern finds numba's atomic add
    compiled = 0
    for step in epilogue_steps(rendered()):
        name = write_kernel(str(tmp_path), step.source)
        module = load_module(kernel_path(str(tmp_path), name), name)
        for launch in step.launches:
            kernel = compile_kernel(getattr(module, launch["kernel"]).py_func, module.SIGNATURE,
                                    step=step.name, kernel=launch["kernel"])
            assert not FLOAT_ATOMIC.search(kernel.ptx), f"{step.name}.{launch['kernel']}"
            compiled += 1
    assert compiled >= 3
