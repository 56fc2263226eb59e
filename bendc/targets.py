"""From the final graph to something that runs, per target, and the on-disk
cache of compiled cpu programs.

``reference`` interprets the graph with numpy. ``cpu`` builds the kernel
plan, renders each step to source (codegen), writes and imports the kernel
modules, plans memory, and binds the plan in the runtime. ``cuda`` does the
same with numba.cuda kernels (codegen/cuda.py, runtime/cuda.py); it is not
cached on disk as a program yet (its kernel modules are, by hash). A compiled cpu
program is stored as an artifact under ``<cache>/programs/<key>``, keyed by
the traced IR, the passes, the target and the bendc/numba/numpy versions; a
second process with the same signature loads it instead of compiling, and a
corrupt entry is discarded and rebuilt.
"""
from __future__ import annotations

import ctypes.util
import functools
import hashlib
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from bendc.artifact import (compiler_fingerprint, read_stages, read_text, template_from_json, versions,
                            write_artifact)
from bendc.codegen.cache import default_cache_dir, kernel_path, write_kernel
from bendc.codegen.cpu import render_plan
from bendc.codegen.memory import plan_memory
from bendc.codegen.plan import KernelPlan, build_plan, describe_plan, plan_stats
from bendc.errors import RuntimeCheckError, SourceLoc
from bendc.ir.graph import Graph
from bendc.ir.interp import Interpreter
from runtime.artifact import ArtifactInvalid, load_kernel, load_module, load_program
from runtime.cpu import CpuProgram, KernelError


@functools.lru_cache(maxsize=None)
def cuda_status() -> str | None:
    """"gpu" where numba-cuda imports and a GPU is usable, "simulator" under NUMBA_ENABLE_CUDASIM=1
    (numba's CUDA simulator, read when numba.cuda is imported), else None.

    Cheap where there is no GPU: numba.cuda is imported only when a CUDA driver is present.
    """
    if importlib.util.find_spec("numba_cuda") is None:
        return None
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return "simulator"
    if not (os.path.exists("/dev/nvidiactl") or ctypes.util.find_library("cuda")):
        return None
    try:
        from numba import cuda

        return "gpu" if cuda.is_available() else None
    except Exception:  # a broken driver or toolkit: no cuda target
        return None


@dataclass
class Built:
    """What a target made of a graph."""

    run: Callable[[Sequence[np.ndarray]], list]
    kernels: dict[str, str] = field(default_factory=dict)
    report: list[str] = field(default_factory=list)
    plan: KernelPlan | None = None
    files: dict[str, str | bytes] = field(default_factory=dict)  # extra artifact files (PTX, cubin)


def build_reference(graph: Graph) -> Built:
    interpreter = Interpreter(graph)
    aliases = set(graph.params)

    def run(inputs: Sequence[np.ndarray]) -> list:
        results = interpreter.run(inputs)
        # An output that is a parameter (or a view of one) must not alias the caller's array.
        return [np.array(r) if (o in aliases or r.base is not None) else r
                for o, r in zip(graph.outputs, results)]

    return Built(run)


def cpu_runner(plan: dict, program: Any) -> Callable[[Sequence[np.ndarray]], list]:
    """program.run (cpu or cuda), with a kernel's failed check raised as a BendcError at the user's line."""
    steps = {step["name"]: step for step in plan["steps"]}

    def run(inputs: Sequence[np.ndarray]) -> list:
        try:
            return program.run(inputs)
        except KernelError as error:
            step = steps[error.step]
            path, _, line = step["loc"].rpartition(":")
            loc = SourceLoc(path, int(line)) if path else None
            raise RuntimeCheckError(error.message.split(": ", 1)[-1], loc=loc, op=step["op"]) from None

    return run


Progress = Callable[[int, int, str], None]  # (kernel number from 1, kernel count, kernel name)


def build_cpu(graph: Graph, cache_dir: str, donate: Sequence[str] = (), progress: Progress | None = None) -> Built:
    plan = build_plan(graph)
    render_plan(plan, graph)
    donated = frozenset(p for p in graph.params if graph.node(p).attr["name"] in donate)
    decisions = plan_memory(plan, donated)
    kernels = {}
    for number, step in enumerate(plan.steps, start=1):
        if progress is not None:
            progress(number, len(plan.steps), step.name)
        step.module = write_kernel(cache_dir, step.source)
        kernels[step.name] = load_kernel(kernel_path(cache_dir, step.module), step.module)
    plan_json = plan.to_json()
    report = describe_plan(plan) + [f"memory: {d}" for d in decisions]
    return Built(cpu_runner(plan_json, CpuProgram(plan_json, kernels)),
                 {s.name: s.source for s in plan.steps}, report, plan)


@dataclass
class CudaKernels:
    """The cuda kernels of a graph, rendered and imported but not bound to a device."""

    plan: KernelPlan
    modules: dict[str, Any]  # step name -> imported kernel module
    report: list[str]


def render_cuda(graph: Graph, cache_dir: str) -> CudaKernels:
    """Plan, render numba.cuda kernels (strided views resolved first), plan memory, import the modules.

    Needs numba-cuda but no GPU: the PTX tests and ``bendc compile`` use it too.
    Parameters are never donated on cuda: the caller's device arrays are only read.
    """
    from bendc.codegen.cuda import describe_launches, render_cuda_plan

    plan = build_plan(graph)
    layout = render_cuda_plan(plan, graph)
    decisions = plan_memory(plan)
    modules = {}
    for step in plan.steps:
        step.module = write_kernel(cache_dir, step.source)
        modules[step.name] = load_module(kernel_path(cache_dir, step.module), step.module)
    report = (describe_plan(plan) + [f"layout: {d}" for d in layout] + [f"memory: {d}" for d in decisions]
              + [f"launch: {line}" for line in describe_launches(plan)])
    return CudaKernels(plan, modules, report)


def build_cuda(graph: Graph, cache_dir: str) -> Built:
    """The cuda kernels bound on the GPU (or numba's simulator)."""
    from runtime.cuda import CudaProgram

    kernels = render_cuda(graph, cache_dir)
    plan_json = kernels.plan.to_json()
    return Built(cpu_runner(plan_json, CudaProgram(plan_json, kernels.modules)),
                 {s.name: s.source for s in kernels.plan.steps}, kernels.report, kernels.plan)


def build_cuda_artifact(graph: Graph, cache_dir: str, arch: str, progress: Progress | None = None) -> Built:
    """The cuda kernels compiled ahead of time for ``arch``: PTX (NVVM) and cubin (nvJitLink) per
    kernel, with registers, spills and shared memory in the report. Needs numba-cuda, not a GPU."""
    from bendc.codegen.ptx import compile_plan

    kernels = render_cuda(graph, cache_dir)
    compiled = compile_plan(kernels.plan, kernels.modules, arch, progress)
    files: dict[str, str | bytes] = {}
    for kernel in compiled:
        files[f"ptx/{kernel.step}.{kernel.kernel}.ptx"] = kernel.ptx
        files[f"cubin/{kernel.step}.{kernel.kernel}.{arch}.cubin"] = kernel.cubin
    report = kernels.report + [f"compiled: {kernel.describe()}" for kernel in compiled]

    def run(inputs: Sequence[np.ndarray]) -> list:
        raise RuntimeError("an ahead-of-time cuda build runs on a GPU: bendc run OUT there")

    built = Built(run, {s.name: s.source for s in kernels.plan.steps}, report, kernels.plan)
    built.files = files
    return built


def build(target: str, graph: Graph, cache_dir: str | None, donate: Sequence[str] = (),
          progress: Progress | None = None) -> Built:
    if target == "reference":
        return build_reference(graph)
    if target == "cpu":
        return build_cpu(graph, cache_dir or default_cache_dir(), donate, progress)
    if target == "cuda":
        return build_cuda(graph, cache_dir or default_cache_dir())
    raise AssertionError(f"no builder for target {target}")


# ------------------------------------------------------------------ on-disk cache
def program_key(traced_ir: str, passes: list[str], target: str, template: Any, donate: Sequence[str]) -> str:
    blob = json.dumps([traced_ir, passes, target, repr(template), sorted(donate), versions(),
                       compiler_fingerprint()], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def program_entry(cache_dir: str | None, key: str) -> str:
    return os.path.join(cache_dir or default_cache_dir(), "programs", key)


@dataclass
class Cached:
    stages: dict[str, str]
    tape: str
    template: Any
    report: str
    run: Callable
    kernels: dict[str, str]
    stats: dict[str, int]


def load_cached(entry: str, cache_dir: str | None) -> Cached | None:
    """The cached program at ``entry``, None when absent; a corrupt entry is removed."""
    if not os.path.exists(entry):
        return None
    try:
        kernel_dir = os.path.dirname(kernel_path(cache_dir or default_cache_dir(), "k"))
        manifest, plan, program = load_program(entry, kernel_dir)
        kernels = {step["name"]: read_text(entry, f"kernels/{step['module']}.py") for step in plan["steps"]}
        stats = plan_stats(KernelPlan.from_json(plan))
        return Cached(read_stages(entry, manifest), read_text(entry, "tape.txt"),
                      template_from_json(manifest["template"]),
                      read_text(entry, "report.txt") + "[cache] loaded from the on-disk cache\n",
                      cpu_runner(plan, program), kernels, stats)
    except (ArtifactInvalid, OSError, ValueError, KeyError) as error:
        shutil.rmtree(entry, ignore_errors=True)
        print(f"bendc: discarded a corrupt cache entry {entry}: {error}", flush=True)
        return None
