"""Run a kernel plan on a GPU with numba.cuda (or under numba's CUDA simulator).

Every value is a flat device array: a planned buffer's typed slice, a fresh
output, or the caller's input itself. A layout view has no array of its own:
it shares its operand's (the generated kernels index it with the view's
offset and strides; a step whose plan lists ``windows`` gets such an input as
the slice of the array it reads, so its kernels hold no batch-sized offset).
Binding (once per signature) allocates the planned
buffers, uploads constants, configures every launch (``kernel[grid, block]``)
and runs the hoisted steps; a call then binds the inputs, allocates the
outputs and launches the steps in order.

Inputs may be numpy arrays (copied to the device), numba device arrays, or
anything with ``__cuda_array_interface__`` such as torch CUDA tensors (used
in place, no copy; they must be C-contiguous). Outputs are device arrays.

Index checks: kernels that read indices record a bad one in two int64 words
per step; after the launches the runtime reads them back (one small copy,
which waits for the kernels) and raises :class:`~runtime.cpu.KernelError`.
"""
from __future__ import annotations

import glob
import importlib.util
import os
from types import ModuleType
from typing import Any, Sequence

import numpy as np

from runtime.dtypes import DTYPES, numel

from runtime.cpu import KernelError

KERNEL_MODULE_PREFIX = "bendc_kernel_"  # the name generated modules are imported under


def numba_cuda_installed() -> bool:
    """Whether the numba-cuda package is installed (a GPU may still be missing)."""
    return importlib.util.find_spec("numba_cuda") is not None


SYSTEM_TOOLKIT = "/usr/local/cuda"  # where a system CUDA toolkit lives when no CUDA_HOME names one


def nvvm_wheel_installed() -> bool:
    """Whether a pip wheel brings libnvvm (``nvidia-nvvm``, or the cu13 wheels' ``nvidia/cu13/lib``),
    where numba-cuda finds it with no CUDA_HOME."""
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    return any(glob.glob(os.path.join(root, "*", pattern)) for root in roots
               for pattern in ("lib/libnvvm.so*", "nvvm/lib64/libnvvm.so*", "lib/nvvm*.dll", "bin/nvvm*.dll"))


def nvvm_home_fallback(environ: dict | None = None, system: str = SYSTEM_TOOLKIT,
                       wheel: bool | None = None) -> str | None:
    """Point numba-cuda at a system toolkit's NVVM when nothing else would find it.

    The rule: when neither CUDA_HOME nor CUDA_PATH is set and no pip wheel brings libnvvm, but
    ``system`` (/usr/local/cuda) has an ``nvvm/`` folder, set CUDA_HOME to it (numba-cuda looks
    there next) and return it; otherwise change nothing and return None. Called before NVVM is
    first loaded (install_nvvm_options).
    """
    environ = os.environ if environ is None else environ
    if environ.get("CUDA_HOME") or environ.get("CUDA_PATH"):
        return None
    if nvvm_wheel_installed() if wheel is None else wheel:
        return None
    if not os.path.isdir(os.path.join(system, "nvvm")):
        return None
    environ["CUDA_HOME"] = system
    return system


def install_nvvm_options() -> None:
    """Make NVVM keep a*b+c as a rounded multiply and a rounded add in bendc's kernels.

    NVVM contracts a*b+c into ``fma.rn`` by default even without fastmath (numba
    only passes the ``fma`` option with fastmath on), which rounds once instead
    of twice and so differs from PyTorch's CPU results. The wrapper sets
    ``fma=False`` for modules compiled from bendc's generated kernels, unless
    the kernel asked for fastmath; other numba code in the process is untouched.
    """
    nvvm_home_fallback()
    from numba.cuda.cudadrv import nvvm

    if getattr(nvvm.compile_ir, "bendc_wrapped", False) or not hasattr(nvvm, "CompilationUnit"):
        return  # already wrapped, or the simulator (which has no NVVM)
    original = nvvm.compile_ir

    def compile_ir(llvmir, **options):
        modules = [llvmir] if isinstance(llvmir, (str, bytes)) else list(llvmir)
        texts = [m.decode(errors="replace") if isinstance(m, bytes) else str(m) for m in modules]
        if not options.get("fastmath") and any(KERNEL_MODULE_PREFIX in text for text in texts):
            options.setdefault("fma", False)
        return original(llvmir, **options)

    compile_ir.bendc_wrapped = True
    nvvm.compile_ir = compile_ir


def is_device_array(value: Any) -> bool:
    """A numba device array (or the simulator's), or an object exposing __cuda_array_interface__."""
    return bool(getattr(value, "__cuda_ndarray__", False)) or hasattr(value, "__cuda_array_interface__")


def as_device_array(value: Any) -> Any:
    """A numba device array over a device input's memory (no copy): torch CUDA tensors and the like."""
    if getattr(value, "__cuda_ndarray__", False):
        return value
    if hasattr(value, "detach"):  # torch refuses to export tensors that require grad
        value = value.detach()
    from numba import cuda

    return cuda.as_cuda_array(value)


def to_device_flat(value: Any) -> Any:
    """A flat (1-D, contiguous) device array over an input; host arrays are copied to the device."""
    from numba import cuda

    if is_device_array(value):
        array = as_device_array(value)
    else:
        return cuda.to_device(np.ascontiguousarray(value).reshape(-1))
    if not array.is_c_contiguous():
        raise ValueError("a device input must be C-contiguous (torch: .contiguous())")
    return array.reshape(numel(array.shape))


class _Step:
    """One bound step: its configured launches and the array slots of its arguments."""

    __slots__ = ("name", "launches", "arguments", "windows", "fresh", "errors")

    def __init__(self, name: str, launches: list, arguments: list[int], windows: list, fresh: list,
                 errors: Any) -> None:
        self.name = name
        self.launches = launches
        self.arguments = arguments
        self.windows = windows  # (argument, first, stop): an input passed as that slice of its array
        self.fresh = fresh  # (slot, count, dtype): a new array each call (outputs the caller keeps)
        self.errors = errors  # this step's two error words (flag, bad index), or None


class CudaProgram:
    """A bound plan: call ``run(inputs)`` with one array per parameter."""

    def __init__(self, plan: dict[str, Any], modules: dict[str, ModuleType]) -> None:
        from numba import cuda

        install_nvvm_options()
        self.cuda = cuda
        values = {int(k): (d, tuple(s)) for k, (d, s) in plan["values"].items()}
        slot = {id: index for index, id in enumerate(sorted(values))}
        for step in plan["steps"]:  # a view shares its operand's array
            if step["convention"] == "view" and step["inputs"]:
                slot[step["outputs"][0]] = slot[step["inputs"][0]]
        self.arrays: list[Any] = [None] * len(values)
        self._bind_buffers(plan, values, slot)
        checked = [s for s in plan["steps"] if s.get("check")]
        self.errors = cuda.to_device(np.zeros(2 * len(checked), np.int64)) if checked else None
        error_words = {s["name"]: self.errors[2 * k:2 * k + 2] for k, s in enumerate(checked)}
        self.checks = [(s["name"], s["check"]) for s in checked]  # in the order of their error words
        self.param_slots = [slot[p] for p in plan["params"]]
        outputs = set(plan["outputs"])
        owned: set[int] = set()
        self.program: list[_Step] = []
        for step in plan["steps"]:
            module = modules[step["name"]]
            if step["kind"] == "source":
                (value,) = step["outputs"]
                dtype = DTYPES[values[value][0]]
                self.arrays[slot[value]] = cuda.to_device(np.array([module.VALUE], dtype=dtype))
                continue
            if step["convention"] == "view":
                continue
            fresh = []
            for value in step["outputs"]:
                if self.arrays[slot[value]] is None:
                    dtype, shape = values[value]
                    fresh.append((slot[value], numel(shape), DTYPES[dtype]))
                    if value in outputs and not step["hoisted"]:
                        owned.add(value)
            if step["kind"] == "collective":  # host code over the device arrays (runtime/collective.py)
                launches = [module.host]
            else:
                launches = [getattr(module, l["kernel"])[tuple(l["grid"]), tuple(l["block"])] for l in step["launches"]]
            arguments = [slot[v] for v in step["inputs"]] + [slot[v] for v in step["outputs"]]
            windows = [(position, first, first + cells) for position, first, cells in step.get("windows", ())]
            bound = _Step(step["name"], launches, arguments, windows, fresh, error_words.get(step["name"]))
            if step["hoisted"]:
                self._run_step(bound)
            else:
                self.program.append(bound)
        # Outputs a step wrote into a fresh array are the caller's; parameters and hoisted values are copied.
        self.output_slots = [(slot[o], o in owned, values[o]) for o in plan["outputs"]]

    def _bind_buffers(self, plan: dict, values: dict, slot: dict[int, int]) -> None:
        """One device allocation per planned buffer; each value stored there gets a typed flat slice."""
        cuda = self.cuda
        buffers = [cuda.device_array(max(size, 8), dtype=np.uint8) for size in plan["buffers"]]
        for value, buffer in plan["storage"].items():
            dtype, shape = values[int(value)]
            count = numel(shape)
            self.arrays[slot[int(value)]] = buffers[buffer].view(DTYPES[dtype])[:count]

    def _run_step(self, step: _Step) -> None:
        arrays = self.arrays
        for index, count, dtype in step.fresh:
            arrays[index] = self.cuda.device_array(count, dtype=dtype)
        arguments = [arrays[i] for i in step.arguments]
        for position, first, stop in step.windows:
            arguments[position] = arguments[position][first:stop]
        if step.errors is not None:
            arguments.append(step.errors)
        for launch in step.launches:
            launch(*arguments)

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        arrays = self.arrays
        for index, value in zip(self.param_slots, inputs):
            arrays[index] = to_device_flat(value)
        for step in self.program:
            self._run_step(step)
        if self.errors is not None:
            self._raise_index_errors()
        return [self._output(index, owned, dtype, shape) for index, owned, (dtype, shape) in self.output_slots]

    def time_steps(self, inputs: Sequence[Any], clock: Any, reuse: dict | None = None) -> list[tuple[str, int, int]]:
        """Run one call with a CUDA event recorded before and after each step's launches: (step
        name, start, end) in ``clock``'s nanoseconds (the host's time at the first event, plus the
        device's elapsed times between events); the profiler's view."""
        cuda = self.cuda
        arrays = self.arrays
        for index, value in zip(self.param_slots, inputs):
            arrays[index] = to_device_flat(value)
        origin = cuda.event()
        origin.record()
        base = clock()
        marks = []
        for step in self.program:
            begin, end = cuda.event(), cuda.event()
            begin.record()
            self._run_step(step)
            end.record()
            marks.append((step.name, begin, end))
        cuda.synchronize()
        if self.errors is not None:
            self._raise_index_errors()
        at = lambda event: base + int(origin.elapsed_time(event) * 1e6)  # noqa: E731 - ms -> ns
        return [(name, at(begin), at(end)) for name, begin, end in marks]

    def _output(self, index: int, owned: bool, dtype: str, shape: tuple[int, ...]) -> Any:
        array = self.arrays[index].reshape(shape)
        if owned:
            return array
        copy = self.cuda.device_array(shape, dtype=DTYPES[dtype])
        copy.copy_to_device(array)
        return copy

    def _raise_index_errors(self) -> None:
        words = self.errors.copy_to_host()
        if not words.any():
            return
        self.errors.copy_to_device(np.zeros_like(words))
        for k, (name, check) in enumerate(self.checks):
            if words[2 * k]:
                raise KernelError(name, check.format(index=int(words[2 * k + 1])))
