"""Size-generic cuda kernels under numba's CUDA simulator (issue 25, item 7; tests/cuda/run_simulator.sh,
skipped in any other process): batch 3 and batch 5 of one training step (batch_size_programs.py)
run the same kernel modules (named by the structural hash of their source, which is what the cubin
cache is keyed by: tests/cuda/test_ptx_batch_sizes.py counts its hits), with launch grids sized from
each batch's shapes, and both match the reference interpreter."""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1" or importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("CUDA simulator tests run in their own process: tests/cuda/run_simulator.sh "
                "(needs numba-cuda and NUMBA_ENABLE_CUDASIM=1)", allow_module_level=True)

import bendc  # noqa: E402
from batch_size_programs import LEAVES, batch_step, inputs  # noqa: E402
from conftest import assert_close  # noqa: E402
from runtime.artifact import module_name  # noqa: E402
from test_simulator import host  # noqa: E402  (also makes the simulator's shared arrays thread safe)


def test_two_batch_sizes_share_kernels_and_match_the_reference(tmp_path) -> None:
    step = bendc.jit(batch_step, leaves=LEAVES, target="cuda", cache_dir=str(tmp_path))
    modules, launches = [], []
    for batch in (3, 5):
        got = step(*inputs(batch, seed=batch))
        want = bendc.jit(batch_step, leaves=LEAVES, target="reference")(*inputs(batch, seed=batch))
        for index, (mine, theirs) in enumerate(zip(got, want)):
            assert_close(host(mine), theirs, f"batch {batch} output {index}")
        kernels = {name: source for name, source in step.kernels().items() if "\n@jit" in source}
        modules.append({name: module_name(source) for name, source in kernels.items()})
        launches.append({name: source.split("Launches:", 1)[1].split('"""', 1)[0] for name, source in kernels.items()})
    assert len(step.signatures()) == 2
    assert len(modules[0]) >= 15, sorted(modules[0])
    assert modules[1] == modules[0], sorted(name for name in modules[1] if modules[1][name] != modules[0].get(name))
    resized = [name for name in launches[0] if launches[0][name] != launches[1][name]]
    assert len(resized) >= 5, "the launches are sized from each batch's shapes"
