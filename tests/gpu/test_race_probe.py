"""The device script's race probe (issue 25 item 1): one program's outputs fed to another program
on another stream, the __cuda_array_interface__ stream protocol both ways (runtime/cuda_graph.py):
the consumer waits on the producer's stream, holds what it reads until its stream passed it, and
the producer's next call waits for the streams that read its buffers. Checked bit for bit against
the same two steps run in order by one program (the optimizer: + - * and a deterministic sum).
Under NUMBA_ENABLE_CUDASIM=1 the devices share a simulated GPU with asynchronous streams."""
from __future__ import annotations

import gc

import numpy as np
import pytest

from devices import carried_folder, new_streams, program, require_device

FEEDS = {0: 0, 1: 1, 3: 2, 4: 3, 6: 4}  # momentum: input slot -> the output slot that updates it


def fed(inputs: list, outputs: list) -> list:
    return [outputs[FEEDS[k]] if k in FEEDS else value for k, value in enumerate(inputs)]


def carried_inputs() -> list[np.ndarray]:
    home = carried_folder() / "momentum"
    return [np.load(home / "inputs" / f"in{k}.npy") for k in range(8)]


@pytest.mark.parametrize("contract", ["copy", "static"])
def test_outputs_fed_to_a_program_on_another_stream(contract: str) -> None:
    require_device()
    folder = carried_folder() / "momentum" / "cuda"
    inputs = carried_inputs()
    reference = program(folder)
    first = [o.copy_to_host() for o in reference.run([a.copy() for a in inputs])]
    want = [o.copy_to_host() for o in reference.run(fed([a.copy() for a in inputs], first))]
    streams = new_streams()
    a, b = program(folder, outputs=contract, streams=streams), program(folder, outputs=contract, streams=streams)
    produced = a.run([x.copy() for x in inputs])
    consumed = b.run(fed([x.copy() for x in inputs], produced))
    del produced
    gc.collect()
    again = a.run([x.copy() for x in inputs])  # overwrites A's static and resident buffers
    got = [o.copy_to_host() for o in consumed]
    for index, (mine, theirs) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(mine, theirs, err_msg=f"{contract}: B's out{index}")
    for index, (mine, theirs) in enumerate(zip([o.copy_to_host() for o in again], first)):
        np.testing.assert_array_equal(mine, theirs, err_msg=f"{contract}: A's second call out{index}")
    b.synchronize()
    assert not b.held
