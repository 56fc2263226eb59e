"""Stage 1 of tests/gpu/device_check.sh: the artifacts built on the build machine and carried here
(tests/gpu/carried.py), run from their cubins through cuda.core, so that nothing of this machine's
compiler is needed: the cubins' ELF against the plan's records, each loaded kernel's
``arguments_info`` against both (CudaCoreDevice.load), then eager and graph runs against the cpu
build's outputs (bit for bit for the + - * / chain and the optimizer's updates) and against each
other (bit for bit: no atomics). Under NUMBA_ENABLE_CUDASIM=1 (the script's dry run) the same
runs go through the simulated device."""
from __future__ import annotations

import numpy as np
import pytest

from devices import carried_folder, listing, program, require_device

PROGRAMS = ("chain", "momentum", "mlp")


def inputs_and_expected(name: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    home = carried_folder() / name
    entry = listing()["programs"][name]
    inputs = [np.load(home / "inputs" / f"in{k}.npy") for k in range(entry["inputs"])]
    expected = [np.load(home / "expected" / f"out{k}.npy") for k in range(entry["outputs"])]
    return inputs, expected


@pytest.mark.parametrize("name", PROGRAMS)
def test_carried_artifact_runs_eager_and_graph_like_the_cpu_build(name: str) -> None:
    require_device()
    inputs, expected = inputs_and_expected(name)
    bitwise = set(listing()["programs"][name]["bitwise"])
    runs = {}
    for mode in ("eager", "graph"):
        bound = program(carried_folder() / name / "cuda", mode=mode)
        runs[mode] = [o.copy_to_host() for o in bound.run([a.copy() for a in inputs])]
        for index, (got, want) in enumerate(zip(runs[mode], expected)):
            assert got.shape == want.shape and got.dtype == want.dtype, (mode, index)
            if index in bitwise:
                np.testing.assert_array_equal(got, want, err_msg=f"{name} {mode} out{index} (bitwise)")
            else:
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{name} {mode} out{index}")
    for index, (eager, graph) in enumerate(zip(runs["eager"], runs["graph"])):
        np.testing.assert_array_equal(graph, eager, err_msg=f"{name} out{index}: graph and eager differ")
