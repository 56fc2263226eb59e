"""Size-generic cuda kernels (issue 25, item 7): a new batch size reuses the cubins of the old one.
The kernels read their cell, row and matrix extents from their arrays' lengths
(kernels/cuda_kit.py length_of), so batch 5's kernel modules (of a linear layer, relu and a sum:
batch_size_programs.small_step) are batch 3's and every cubin comes from the cubin cache
(bendc/codegen/cubins.py, keyed by the module's structural hash): none is compiled again, while
each launch's grid is sized from batch 5's shapes. Built for sm_90 without a GPU (NVVM,
nvJitLink); test_sim_batch_sizes.py checks the values under the simulator."""
from __future__ import annotations

import importlib.util
import os

import pytest

if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("numba-cuda is not installed (pip install 'bendc[cuda]')", allow_module_level=True)
if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    pytest.skip("PTX needs the real numba.cuda: run without NUMBA_ENABLE_CUDASIM", allow_module_level=True)

import bendc  # noqa: E402
from batch_size_programs import small_spec, small_step  # noqa: E402
from bendc.codegen.cubins import CubinCache  # noqa: E402
from bendc.codegen.ptx import compile_plan  # noqa: E402
from bendc.compile import render_cuda  # noqa: E402


def test_a_new_batch_size_compiles_no_cubin(tmp_path) -> None:
    cache_dir = str(tmp_path)
    cache = CubinCache(cache_dir, "sm_90")
    built = []
    for batch in (3, 5):
        graph = bendc.jit(small_step, leaves=("w1", "b1"), target="reference").lower(small_spec(batch)).graph
        kernels = render_cuda(graph, cache_dir)
        before = cache.hits
        compiled = compile_plan(kernels.plan, kernels.modules, cache=cache)
        built.append((cache.hits - before, compiled, kernels.plan))
    (hits_3, compiled_3, plan_3), (hits_5, compiled_5, plan_5) = built
    assert len(compiled_3) >= 4 and hits_3 < len(compiled_3)
    assert hits_5 == len(compiled_5) == len(compiled_3), f"{len(compiled_5) - hits_5} kernels compiled again"
    grids = [[launch["grid"] + launch["block"] for step in plan.steps for launch in step.launches]
             for plan in (plan_3, plan_5)]
    assert grids[0] != grids[1], "the launches are sized from each batch's shapes"


@pytest.mark.parametrize("name", ["row_ops", "image_ops", "conv_ops"])
def test_the_row_and_image_kernels_render_the_same_modules_at_a_new_batch_size(name, tmp_path) -> None:
    """rope, the scans, the extrema and logsumexp (row_ops), group_norm, the pools and their gradients
    (image_ops), conv2d (grouped, stride 2: dx in phases) and its gradients (conv_ops) read the batch
    from their arrays' lengths: batch 5 renders batch 3's modules (named by their structural hash,
    the cubin cache's key), only the launches differ."""
    import batch_size_programs as programs
    from runtime.artifact import module_name

    step, leaves, spec = {"row_ops": (programs.row_ops, programs.ROW_LEAVES, programs.row_spec),
                          "image_ops": (programs.image_ops, programs.IMAGE_LEAVES, programs.image_spec),
                          "conv_ops": (programs.conv_ops, programs.CONV_LEAVES, programs.conv_spec)}[name]
    rendered = []
    for batch in ((4, 6) if name == "conv_ops" else (3, 5)):  # (conv_spec: all slices from batch 4 on)
        graph = bendc.jit(step, leaves=leaves, target="reference").lower(spec(batch)).graph
        plan = render_cuda(graph, str(tmp_path)).plan
        rendered.append({s.name: (s.op, module_name(s.source), [l["grid"] for l in s.launches])
                         for s in plan.steps if s.launches})
    small, large = rendered
    assert small.keys() == large.keys()
    ops = {op for op, _, _ in small.values()}
    wanted = {"row_ops": {"rope", "cumsum", "cumprod", "amax", "amin", "logsumexp", "argmax"},
              "image_ops": {"group_norm", "group_norm_grad", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"},
              "conv_ops": {"conv2d", "conv2d_grad_input", "conv2d_grad_weight"}}[name]
    assert wanted <= ops, ops
    changed = sorted(f"{step} ({small[step][0]})" for step in small if small[step][1] != large[step][1])
    assert changed == [], f"new modules at batch {batch}: {changed}"
    assert any(small[step][2] != large[step][2] for step in small)  # grids sized from each batch
