"""The tiled attention schedule's cuda kernels at realistic shapes (t=512, D=64 and D=128, GQA, Dv != D),
compiled for sm_90 without a GPU (NVVM to PTX, nvJitLink to cubin) with tests/cuda/test_ptx.py's
check_cubins: no spills, registers within bounds, float32 only. Each kernel's registers, spills,
shared memory, occupancy on sm_90 and compile seconds are printed (``pytest -s``); the launches
declare the shared memory the tile choice (bendc/ops/attention/cuda_tiled.py) computed; the PTX
keeps a rounded multiply (mul.rn.f32) for each multiply-accumulate of the generated tile products
(NVVM did not contract them), and the SASS keeps each as an FMUL (nor did nvJitLink: the FFMAs
there come from libdevice's exp and log and the division's refinement).

The register tiles are local arrays walked by loops of constant trip count (compile time: numba's
passes grow with the statements, and unrolled tiles were 8-15 s a kernel): NVVM unrolls the loops
and keeps the arrays in registers, so the PTX has no local-memory load or store, and each kernel's
source stays short. Nothing here runs a kernel: no GPU timing or GPU results are claimed.
"""
from __future__ import annotations

import importlib.util
import os
import re

import pytest

if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("numba-cuda is not installed (pip install 'bendc[cuda]')", allow_module_level=True)
if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    pytest.skip("PTX needs the real numba.cuda: run without NUMBA_ENABLE_CUDASIM", allow_module_level=True)

from bendc.codegen.ptx import occupancy  # noqa: E402
from bendc.ops.attention.cuda_tiled import RESIDENT, THREADS, backward_tiles, forward_tiles  # noqa: E402
from cuda_programs import Program, tiled_attention_program  # noqa: E402
from test_ptx import check_cubins  # noqa: E402
from test_sass import sass_ops  # noqa: E402

# causal, (batch, heads, kv heads, t, D, Dv) per program
SHAPES = {"tiled_causal_d64": (True, (1, 4, 2, 512, 64, 64)),
          "tiled_full_d128": (False, (1, 4, 2, 512, 128, 128)),
          "tiled_causal_d128_v64": (True, (1, 4, 1, 512, 128, 64))}
PROGRAMS = [tiled_attention_program(name, causal, *shape) for name, (causal, shape) in SHAPES.items()]
# make test builds the smallest (causal, D=64: the triangle's skipped tiles, ~30 s); the D=128 builds
# (non-causal, and Dv != D with one kv head) take about as long each and run in make test-long.
IN_MAKE_TEST = ("tiled_causal_d64",)
PARAMS = [pytest.param(p, marks=() if p.name in IN_MAKE_TEST else pytest.mark.long) for p in PROGRAMS]


# a tile product's multiply-accumulates: a loop over the thread's RM x CM cells
PRODUCT = re.compile(r"^\s+for m in range\((\d+)\):\n\s+for k in range\((\d+)\):\n"
                     r"\s+(\w+)\[m, k\] = \3\[m, k\] \+ lhs\[m\] \* rhs\[k\]$", re.M)
MAX_KERNEL_LINES = 200  # a kernel's source here (the unrolled tiles: 417, 355 and 258 lines)


def kernel_source(module: str, kernel: str) -> str:
    """One kernel function's lines of a generated module."""
    start = module.index(f"\ndef {kernel}(")
    end = module.find("\n@", start)
    return module[start:end if end >= 0 else len(module)]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cuda-kernels"))


@pytest.mark.parametrize("program", PARAMS, ids=lambda p: p.name)
def test_tiled_kernels_compile_without_spills(program: Program, cache_dir: str, tmp_path) -> None:
    compiled = [entry for entry in check_cubins(program, cache_dir, float64_ops=frozenset())
                if entry[0].op.startswith("attention_tiled")]
    # batch 1 x 2 kv heads x 16 key tiles is under MIN_BLOCKS: key_grads splits its walk, key_grads_sum adds
    assert sorted(launch["kernel"] for _, launch, _ in compiled) == ["kernel", "key_grads", "key_grads_sum",
                                                                     "query_grads"]
    _, (_, _, _, _, depth, width) = SHAPES[program.name]
    forward, backward = forward_tiles(depth, width), backward_tiles(depth, width)
    declared = {"kernel": forward.shared_bytes[0], "key_grads": backward.shared_bytes[0],
                "query_grads": backward.shared_bytes[1], "key_grads_sum": 0}
    for step, launch, kernel in compiled:
        name = f"{program.name} {step.name}.{launch['kernel']}"
        source = kernel_source(step.source, launch["kernel"])
        assert launch["shared_bytes"] == declared[launch["kernel"]], (name, launch)
        assert kernel.shared_bytes >= launch["shared_bytes"], (name, kernel.info_log)
        assert len(source.splitlines()) <= MAX_KERNEL_LINES, f"{name}: {len(source.splitlines())} lines"
        local = re.findall(r"\b(ld|st)\.local\b", kernel.ptx)
        assert local == [], f"{name}: {len(local)} local-memory loads and stores (a tile left in local memory)"
        sass = sass_ops(kernel.cubin, tmp_path)
        if launch["kernel"] != "key_grads_sum":
            assert tuple(launch["block"]) == (THREADS, 1, 1), (name, launch)
            # launch bounds (THREADS, RESIDENT): at most 128 registers, RESIDENT blocks per SM, and no spills
            decorator = step.source[:step.source.index(f"\ndef {launch['kernel']}(")].rsplit("\n", 1)[-1]
            assert f"launch_bounds=({THREADS}, {RESIDENT})" in decorator, (name, decorator)
            assert occupancy(kernel.registers, kernel.shared_bytes, THREADS)["blocks"] >= RESIDENT, name
            products = sum(int(rows) * int(cols) for rows, cols, _ in PRODUCT.findall(source))
            multiplies = len(re.findall(r"\bmul\.rn\.f32\b", kernel.ptx))
            assert products > 0 and multiplies >= products, f"{name}: {products} multiply-adds, {multiplies} mul.rn.f32"
            assert sass["FMUL"] >= multiplies, f"{name}: {multiplies} mul.rn.f32 in PTX, SASS {sass}"
        else:
            assert "cuda.atomic" not in source and "atom." not in kernel.ptx, name
        block = launch["block"][0] * launch["block"][1] * launch["block"][2]
        resident = occupancy(kernel.registers, kernel.shared_bytes, block)
        print(f"\n  {name}: {kernel.registers} registers, {kernel.spill_stores + kernel.spill_loads} spill bytes, "
              f"{launch['shared_bytes']} bytes static shared ({kernel.shared_bytes} in the cubin), grid "
              f"{tuple(launch['grid'])}, block {tuple(launch['block'])}, {resident['blocks']} blocks per SM "
              f"({resident['percent']}%); {len(source.splitlines())} lines, {kernel.seconds:.1f} s to compile; "
              f"SASS {dict(sass)}")
