"""Run a kernel plan on the CPU.

Binding (once per signature) allocates the planned buffers, makes the typed
views of them, and runs the hoisted steps. A call then only binds the
inputs, allocates the outputs and runs the steps in order: no graph walks
and no lookups by name in the hot loop.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import numba
import numpy as np

# Parallel kernels use numba's own thread pool: its OpenMP layer spins its threads and
# collapses when another OpenMP runtime (PyTorch's) or another process shares the cores.
if "NUMBA_THREADING_LAYER" not in os.environ:
    numba.config.THREADING_LAYER = "workqueue"


class KernelError(Exception):
    """A check inside a kernel failed (e.g. an index out of range)."""

    def __init__(self, step: str, message: str) -> None:
        super().__init__(f"{step}: {message}")
        self.step = step
        self.message = message


def _typed(buffer: np.ndarray, dtype: str, shape: Sequence[int]) -> np.ndarray:
    count = int(np.prod(shape, dtype=np.int64))
    return buffer.view(_DTYPES[dtype])[:count].reshape(tuple(shape))


_DTYPES = {"f32": np.float32, "i64": np.int64, "i32": np.int32, "bool": np.bool_}


class CpuProgram:
    """A bound plan: call ``run(inputs)`` with one array per parameter."""

    def __init__(self, plan: dict[str, Any], kernels: dict[str, Callable]) -> None:
        values = {int(k): (d, tuple(s)) for k, (d, s) in plan["values"].items()}
        ids = sorted(values)
        slot = {id: index for index, id in enumerate(ids)}
        self.values: list[Any] = [None] * len(ids)
        buffers = [np.empty(size, dtype=np.uint8) for size in plan["buffers"]]
        for value, buffer in plan["storage"].items():
            dtype, shape = values[int(value)]
            self.values[slot[int(value)]] = _typed(buffers[buffer], dtype, shape)
        self.param_slots = [slot[p] for p in plan["params"]]
        outputs = set(plan["outputs"])
        donations = {int(k): v for k, v in plan.get("donations", {}).items()}
        written_outputs: set[int] = set()
        program = []
        for step in plan["steps"]:
            view = step["convention"] == "view"
            fresh = []  # (slot, shape, dtype): a new array each call; dtype None: the donated input's array
            if not view:
                for value in step["outputs"]:
                    if value in donations:
                        fresh.append((slot[value], slot[donations[value]], None))
                        written_outputs.add(value)
                    elif self.values[slot[value]] is None:
                        dtype, shape = values[value]
                        fresh.append((slot[value], shape, _DTYPES[dtype]))
                        if value in outputs and not step["hoisted"]:
                            written_outputs.add(value)
            entry = (step["name"], kernels[step["name"]], [slot[i] for i in step["inputs"]],
                     [slot[o] for o in step["outputs"]], view, fresh)
            if step["hoisted"]:
                self._run_step(entry)
            else:
                program.append(entry)
        self.program = program
        # Outputs that a step wrote into a fresh array are the caller's; views and parameters are copied.
        self.output_slots = [(slot[o], o in written_outputs) for o in plan["outputs"]]

    def _run_step(self, entry) -> None:
        name, kernel, ins, outs, view, fresh = entry
        values = self.values
        for index, shape, dtype in fresh:
            values[index] = np.empty(shape, dtype) if dtype is not None else values[shape]
        if view:
            values[outs[0]] = kernel(*[values[i] for i in ins])
        else:
            kernel(*[values[i] for i in ins], *[values[o] for o in outs])

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        values = self.values
        for index, array in zip(self.param_slots, inputs):
            values[index] = array
        step = None
        try:
            for step in self.program:
                _, kernel, ins, outs, view, fresh = step
                for index, shape, dtype in fresh:
                    values[index] = np.empty(shape, dtype) if dtype is not None else values[shape]
                if view:
                    values[outs[0]] = kernel(*[values[i] for i in ins])
                else:
                    kernel(*[values[i] for i in ins], *[values[o] for o in outs])
        except IndexError as error:
            raise KernelError(step[0] if step else "?", str(error)) from None
        return [values[index] if owned else np.array(values[index]) for index, owned in self.output_slots]
