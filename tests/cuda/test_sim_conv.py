"""conv2d, its VJP products and the pools on the cuda target under numba's CUDA simulator, against
the reference interpreter (tests/cuda/run_simulator.sh runs this file in its own process; in any
other process it is skipped). Shapes are tiny: a simulated thread costs ~170 us.

The forward conv and its two gradients are implicit-GEMM tiled kernels (shared-memory tiles, so
they also run with tiles larger than the problem; bendc/ops/conv_cuda.py for the gradients), the
pools one element per thread; the pools sum and route gradients in the CPU kernels' order, so
their outputs match the reference bit for bit. The gradients are also compared with the cpu build
and with PyTorch eager (CONV_RTOL, CONV_ATOL: sums of products in different orders, as
tests/ops/test_conv.py).
"""
from __future__ import annotations

import importlib.util
import os
import re

import numpy as np
import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1" or importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("CUDA simulator tests run in their own process: tests/cuda/run_simulator.sh "
                "(needs numba-cuda and NUMBA_ENABLE_CUDASIM=1)", allow_module_level=True)

import torch  # noqa: E402

import bendc  # noqa: E402
import bendc.functional as F  # noqa: E402
import bendc.kernels.cuda_kit as cuda_kit  # noqa: E402
import bendc.ops.conv as conv  # noqa: E402
import bendc.ops.conv_cuda as conv_cuda  # noqa: E402
from conftest import assert_close  # noqa: E402
from conv_programs import CONV_GRAD_CASES, CONV_GRAD_PROGRAMS, torch_outputs  # noqa: E402
from cuda_programs import CONV_PROGRAMS, Program, jitted, report_kinds  # noqa: E402
from test_simulator import as_tuple, check_program, host  # noqa: E402  (also makes the simulator's shared arrays thread safe)

CONV_RTOL, CONV_ATOL = 2e-5, 2e-5


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cuda-conv-kernels"))


@pytest.mark.parametrize("program", CONV_PROGRAMS, ids=lambda p: p.name)
def test_conv_program_matches_reference(program: Program, cache_dir: str) -> None:
    step = check_program(program, cache_dir)
    assert program.kinds <= report_kinds(step.report()), step.report()
    if program.name == "conv_block":
        kernels = "\n".join(step.kernels().values())
        assert "Implicit GEMM" in kernels and "cuda.shared.array((TILE, PADDED)" in kernels


def test_conv_tiles_smaller_than_the_problem_and_one_block_loops(cache_dir: str, monkeypatch) -> None:
    """Tiles of 2x2 over a 4 x 40 product (several tiles on both axes and along k), and the
    per-element kernels with one block of two threads: every cell is still covered."""
    monkeypatch.setattr(conv, "CONV_TILE", 2)
    monkeypatch.setattr(cuda_kit, "MAX_GRID", 1)
    monkeypatch.setattr(cuda_kit, "MAX_BLOCK", 2)
    (program,) = [p for p in CONV_PROGRAMS if p.name == "conv_block"]
    step = check_program(program, cache_dir)
    assert re.search(r"launch: conv2d\d+: kernel\[grid=\(20, 2, 1\), block=\(2, 2, 1\)\]", step.report()), step.report()
    launches = re.findall(r"grid=\((\d+), (\d+), (\d+)\), block=\((\d+), (\d+), (\d+)\)", step.report())
    assert launches and any(launch[:3] != ("1", "1", "1") for launch in launches), step.report()


# ------------------------------------------------------------------ the gradients' implicit GEMMs
def _grad_steps(step) -> dict[str, str]:
    """The sources of the step's conv2d_grad_input and conv2d_grad_weight kernels, by step name."""
    return {name: source for name, source in step.kernels().items() if name.startswith("conv2d_grad")}


@pytest.mark.parametrize("program", CONV_GRAD_PROGRAMS, ids=lambda p: p.name)
def test_conv_gradients_match_reference_cpu_and_torch(program: Program, cache_dir: str) -> None:
    inputs = program.make_inputs(np.random.default_rng(0))
    step = jitted(program, "cuda", cache_dir)
    got = [host(value) for value in as_tuple(step(*inputs))]
    reference = as_tuple(jitted(program, "reference")(*inputs))
    cpu = as_tuple(jitted(program, "cpu", cache_dir)(*inputs))
    want = torch_outputs(CONV_GRAD_CASES[program.name], inputs)
    assert len(got) == len(reference) == len(cpu) == len(want)
    for index, mine in enumerate(got):
        what = f"{program.name} output {index}"
        assert_close(mine, reference[index], f"{what} vs reference")
        assert_close(mine, cpu[index], f"{what} vs cpu", CONV_RTOL, CONV_ATOL)
        assert_close(mine, want[index], f"{what} vs torch", CONV_RTOL, CONV_ATOL)
    sources = _grad_steps(step)
    assert len(sources) == 2 and all("Implicit GEMM" in source for source in sources.values()), sources
    assert not any("cuda.atomic" in source for source in sources.values())  # a fixed summation order
    x_shape, _, kwargs, _ = CONV_GRAD_CASES[program.name]
    stride = kwargs.get("stride", 1)
    stride = (stride, stride) if isinstance(stride, int) else stride
    phases = stride[0] * stride[1] if len(x_shape) == 4 else stride[0]  # one kernel per stride phase
    (grad_input,) = [line for line in step.report().splitlines() if "launch: conv2d_grad_input" in line]
    assert grad_input.count("[grid=") == phases, grad_input
    tiles = [line for line in step.report().splitlines() if "] tiles: conv2d" in line]
    assert len(tiles) == 3 and all("implicit GEMM" in line for line in tiles), step.report()


def test_conv_gradient_tiles_smaller_than_the_problem(cache_dir: str, monkeypatch) -> None:
    """2x2 tiles (several along every axis of both products and along their reductions) and weight
    gradient blocks of 2x2x4 threads (each slice looping over several reduction tiles, the last
    ones past the end): every cell is still covered and summed once."""
    monkeypatch.setattr(conv, "CONV_TILE", 2)
    monkeypatch.setattr(conv_cuda, "THREADS", 16)
    (program,) = [p for p in CONV_GRAD_PROGRAMS if p.name == "groups2_stride2x1"]
    inputs = program.make_inputs(np.random.default_rng(1))
    step = check_program(program, cache_dir, inputs)
    want = torch_outputs(CONV_GRAD_CASES[program.name], inputs)
    for index, mine in enumerate(as_tuple(step(*inputs))):
        assert_close(host(mine), want[index], f"output {index} vs torch", CONV_RTOL, CONV_ATOL)
    report = step.report()
    assert re.search(r"launch: conv2d_grad_weight\d+: kernel\[grid=\(9, 1, 2\), block=\(2, 2, 4\)\]", report), report
    assert re.search(r"launch: conv2d_grad_input\d+: phase0_0\[grid=\(\d+, 1, 2\), block=\(2, 2, 1\)\]", report), report


def _random_geometries(rng: np.random.Generator, count: int):
    """(x shape, w shape, conv2d keyword arguments): strides, dilations and kernels 1-3 / 1-3 / 1-4
    per axis, padding 0-2, groups 1-2, sizes 1-7 (every conv torch accepts)."""
    while count:
        groups, cg, og, n = (int(v) for v in rng.integers(1, 3, size=4))
        h, w = (int(v) for v in rng.integers(1, 8, size=2))
        kh, kw = (int(v) for v in rng.integers(1, 5, size=2))
        stride, dilation = tuple(int(v) for v in rng.integers(1, 4, size=2)), tuple(int(v) for v in rng.integers(1, 4, size=2))
        padding = tuple(int(v) for v in rng.integers(0, 3, size=2))
        if min(conv.conv_output_size(size, k, s, p, p, d) for size, k, s, p, d in
               zip((h, w), (kh, kw), stride, padding, dilation)) < 1:
            continue
        count -= 1
        yield (n, cg * groups, h, w), (og * groups, cg, kh, kw), dict(stride=stride, dilation=dilation,
                                                                     padding=padding, groups=groups)


def test_conv_gradients_of_random_geometries_match_torch(cache_dir: str) -> None:
    """24 random convs (fixed seed): their stride phases, holes and edges, against PyTorch."""
    rng = np.random.default_rng(14)
    for x_shape, w_shape, kwargs in _random_geometries(rng, 24):
        def step(x, w, g):
            (F.conv2d(x, w, **kwargs) * g).sum().backward()
            return x.grad, w.grad

        x, w = rng.standard_normal(x_shape).astype(np.float32), rng.standard_normal(w_shape).astype(np.float32)
        tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
        y = torch.nn.functional.conv2d(tx, tw, **kwargs)
        g = rng.standard_normal(tuple(y.shape)).astype(np.float32)
        (y * torch.from_numpy(g)).sum().backward()
        dx, dw = bendc.jit(step, leaves=("x", "w"), target="cuda", cache_dir=cache_dir)(x, w, g)
        what = f"x {x_shape} w {w_shape} {kwargs}"
        assert_close(host(dx), tx.grad.numpy(), f"dx of {what}", CONV_RTOL, CONV_ATOL)
        assert_close(host(dw), tw.grad.numpy(), f"dw of {what}", CONV_RTOL, CONV_ATOL)


def test_conv_gradients_read_permuted_operands_in_place(cache_dir: str) -> None:
    """x a transposed view and w a permuted one: both gradient kernels read them through their
    strides (no copies), and the results still match PyTorch."""
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((2, 2, 4, 5)).astype(np.float32), rng.standard_normal((2, 3, 3, 2)).astype(np.float32)

    def step(x, w):
        y = F.conv2d(x.transpose(2, 3), w.permute(1, 0, 2, 3), stride=(2, 1), padding=1)
        (y * y).sum().backward()
        return y, x.grad, w.grad

    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    y = torch.nn.functional.conv2d(tx.transpose(2, 3), tw.permute(1, 0, 2, 3), stride=(2, 1), padding=1)
    (y * y).sum().backward()
    jitted_step = bendc.jit(step, leaves=("x", "w"), target="cuda", cache_dir=cache_dir)
    for index, (mine, theirs) in enumerate(zip(jitted_step(x, w), (y.detach(), tx.grad, tw.grad))):
        assert_close(host(mine), theirs.numpy(), f"output {index}", CONV_RTOL, CONV_ATOL)
    sources = _grad_steps(jitted_step)
    assert "ih + iw * 5]" in sources[next(n for n in sources if "weight" in n)]  # x read transposed
    assert "row * 18 +" in sources[next(n for n in sources if "input" in n)]  # w read permuted
