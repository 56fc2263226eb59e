"""Size-generic cuda kernels under numba's CUDA simulator (issue 25, item 7; tests/cuda/run_simulator.sh,
skipped in any other process): batch 3's kernel modules of one training step (batch_size_programs.py)
are batch 5's (named by the structural hash of their source, which is what the cubin cache is keyed
by: tests/cuda/test_ptx_batch_sizes.py counts its hits), with launch grids sized from each batch's
shapes; batch 5 run through them matches the reference interpreter. (Batch 3 is rendered, not run,
and blocks have at most a warp, kit.MAX_BLOCK lowered: a simulated thread costs ~170 us, and a sum
over the batch would otherwise take 256 of them per output element.)"""
from __future__ import annotations

import importlib.util
import os

import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1" or importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("CUDA simulator tests run in their own process: tests/cuda/run_simulator.sh "
                "(needs numba-cuda and NUMBA_ENABLE_CUDASIM=1)", allow_module_level=True)

import bendc  # noqa: E402
import bendc.kernels.cuda_kit as cuda_kit  # noqa: E402
from batch_size_programs import LEAVES, batch_step, inputs, spec  # noqa: E402
from bendc.compile import render_cuda  # noqa: E402
from conftest import assert_close  # noqa: E402
from runtime.artifact import module_name  # noqa: E402
from test_simulator import host  # noqa: E402  (also makes the simulator's shared arrays thread safe)


def run_batch_5_after_batch_3(function, leaves, spec, make, folder) -> tuple[dict, dict]:
    """Batch 3's plan rendered, then batch 5 run on cuda (the same kernel folder) and checked against
    the reference: (batch 3's steps with launches by name, batch 5's kernel sources by step name)."""
    graph = bendc.jit(function, leaves=leaves, target="reference").lower(spec(3)).graph
    plan_3 = render_cuda(graph, str(folder)).plan
    step = bendc.jit(function, leaves=leaves, target="cuda", cache_dir=str(folder))
    got = step(*make(5))
    want = bendc.jit(function, leaves=leaves, target="reference")(*make(5))
    for index, (mine, theirs) in enumerate(zip(got, want)):
        assert_close(host(mine), theirs, f"{function.__name__} batch 5 output {index}")
    return {s.name: s for s in plan_3.steps if s.launches}, step.kernels()


def test_a_new_batch_size_runs_the_same_kernels_and_matches_the_reference(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(cuda_kit, "MAX_BLOCK", cuda_kit.WARP)
    kernels_3, sources = run_batch_5_after_batch_3(batch_step, LEAVES, spec, inputs, tmp_path)
    assert len(kernels_3) >= 15 and set(kernels_3) == {name for name in sources if "\n@jit" in sources[name]}
    changed = sorted(name for name, s in kernels_3.items() if module_name(sources[name]) != s.module)
    assert changed == [], f"kernels batch 5 compiles again: {changed}"
    resized = [name for name, s in kernels_3.items() if _launches(sources[name]) != _launches(s.source)]
    assert len(resized) >= 5, "the launches are sized from each batch's shapes"


def _launches(source: str) -> str:
    """The launch configurations a kernel module's header lists."""
    return source.split("Launches:", 1)[1].split('"""', 1)[0]


@pytest.mark.parametrize("name", ["row_ops", "image_ops"])
def test_the_row_and_image_kernels_at_a_new_batch_size_match_the_reference(name, tmp_path, monkeypatch) -> None:
    """rope, scans, extrema, logsumexp (row_ops); group_norm, the pools and their gradients (image_ops):
    batch 5 runs batch 3's modules and matches the reference."""
    import batch_size_programs as programs

    monkeypatch.setattr(cuda_kit, "MAX_BLOCK", cuda_kit.WARP)
    function, leaves, spec, make = {
        "row_ops": (programs.row_ops, programs.ROW_LEAVES, programs.row_spec, programs.row_inputs),
        "image_ops": (programs.image_ops, programs.IMAGE_LEAVES, programs.image_spec, programs.image_inputs)}[name]
    kernels_3, sources = run_batch_5_after_batch_3(function, leaves, spec, make, tmp_path)
    changed = sorted(name for name, s in kernels_3.items() if module_name(sources[name]) != s.module)
    assert kernels_3 and changed == [], f"kernels batch 5 compiles again: {changed}"
