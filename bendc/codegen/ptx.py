"""Ahead-of-time compilation of the cuda kernels, with no GPU needed: NVVM
to PTX for an architecture (``cuda.compile_ptx`` with a fixed compute
capability), then nvJitLink to cubin through ``cuda.core``'s Linker (the
PTX's ISA version is newer than the toolkit's ptxas accepts). The linker's
info log gives each kernel's registers, spills and shared memory.

Each kernel's entry symbol (the PTX's one ``.visible .entry``: numba mangles a
per-process counter into it, so the runtime cannot guess it) and its parameters
(offset and size of each, as the PTX declares them) are recorded in the plan's
launches (:func:`record_launches`), for the runtime that loads the cubins.

NVVM is told not to contract a*b+c into fma (runtime.cuda.install_nvvm_options)
unless a kernel asks for fastmath. Not usable in a process running numba's
CUDA simulator (NUMBA_ENABLE_CUDASIM=1), which replaces numba.cuda.
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Any, Callable

from bendc.codegen.plan import KernelPlan
from runtime.cuda import install_nvvm_options


@dataclass
class CompiledKernel:
    """One kernel of one step, compiled for ``arch``."""

    step: str
    kernel: str
    arch: str
    ptx: str
    cubin: bytes
    registers: int
    spill_stores: int
    spill_loads: int
    shared_bytes: int
    info_log: str
    seconds: float  # NVVM and nvJitLink together
    entry: str = ""  # the cubin's kernel symbol
    parameters: tuple[tuple[int, int], ...] = ()  # (offset, size) in bytes of each kernel parameter
    cached: bool = False  # found in the kernel cache (bendc/codegen/cubins.py), not compiled now
    threads: int = 0  # of a block of its launch (compile_plan), 0: not known

    def describe(self) -> str:
        when = "from the kernel cache" if self.cached else f"compiled in {self.seconds * 1000:.0f} ms"
        found = occupancy(self.registers, self.shared_bytes, self.threads, self.arch) if self.threads else None
        resident = ""
        if found is not None:
            resident = (f", {found['blocks']} blocks of {self.threads} threads per SM ({found['percent']}% occupancy, "
                        f"limited by {found['limit']})")
        return (f"{self.step}.{self.kernel} ({self.arch}): {self.registers} registers, "
                f"{self.spill_stores} bytes spill stores, {self.spill_loads} bytes spill loads, "
                f"{self.shared_bytes} bytes shared memory{resident}; {when}")


# Per-SM limits of the architectures whose occupancy the report gives (CUDA's occupancy calculator
# for compute capability 9.0: H100, H200): threads, warps, blocks, 32-bit registers (allocated per
# warp in units of 256), shared memory (bytes; 228 KiB per SM, at most 227 KiB per block, 1 KiB
# reserved per block, allocated in 128 bytes).
SM_LIMITS = {"sm_90": {"warps": 64, "blocks": 32, "registers": 65536, "register_unit": 256,
                       "shared": 233472, "shared_per_block": 232448, "shared_reserved": 1024, "shared_unit": 128}}


def occupancy(registers: int, shared_bytes: int, threads: int, arch: str = "sm_90") -> dict[str, Any] | None:
    """Blocks of ``threads`` resident per SM for a kernel of ``registers`` per thread and
    ``shared_bytes`` of static shared memory, the occupancy (resident warps over the SM's) and
    which limit binds: the fewest blocks that warps, registers, shared memory and the block limit
    allow (no block: more shared memory than a block may have). None for an architecture SM_LIMITS
    does not list."""
    limits = SM_LIMITS.get(arch)
    if limits is None or threads <= 0:
        return None
    if shared_bytes > limits["shared_per_block"]:
        return {"blocks": 0, "percent": 0, "limit": "shared memory per block"}
    warps = -(-threads // 32)
    unit = limits["register_unit"]
    per_warp = -(-max(registers, 1) * 32 // unit) * unit
    shared_unit = limits["shared_unit"]
    per_block = -(-(shared_bytes + limits["shared_reserved"]) // shared_unit) * shared_unit
    by = {"warps": limits["warps"] // warps, "registers": (limits["registers"] // per_warp) // warps,
          "shared memory": limits["shared"] // per_block, "blocks per SM": limits["blocks"]}
    limit = min(by, key=lambda name: by[name])
    blocks = by[limit]
    return {"blocks": blocks, "percent": round(100 * blocks * warps / limits["warps"]), "limit": limit}


class CompileError(Exception):
    """A kernel that NVVM or nvJitLink refused; the message names the step and kernel."""


def compute_capability(arch: str) -> tuple[int, int]:
    """``sm_90`` -> (9, 0)."""
    match = re.fullmatch(r"sm_(\d+)(\d)[a-z]?", arch)
    if match is None:
        raise ValueError(f"not a CUDA architecture: {arch!r} (expected e.g. sm_90)")
    return int(match.group(1)), int(match.group(2))


def parse_resources(log: str) -> dict[str, int]:
    """Registers, spill stores and loads (bytes) and static shared memory (bytes) from ptxas/nvJitLink output."""
    def largest(pattern: str) -> int:
        return max((int(m) for m in re.findall(pattern, log)), default=0)

    return {
        "registers": largest(r"[Uu]sed (\d+) registers"),
        "spill_stores": largest(r"(\d+) bytes spill stores"),
        "spill_loads": largest(r"(\d+) bytes spill loads"),
        "shared_bytes": largest(r"(\d+) bytes smem"),
    }


ENTRY = re.compile(r"\.visible\s+\.entry\s+([\w$.]+)\s*\(([^)]*)\)", re.S)
PARAMETER = re.compile(r"\.param\s+(?:\.align\s+(\d+)\s+)?\.(b|u|s|f)(8|16|32|64)\s+[\w$.]+(?:\[(\d+)\])?")


def entry_point(ptx: str) -> tuple[str, tuple[tuple[int, int], ...]]:
    """(entry symbol, (offset, size) of each parameter) of the single ``.visible .entry`` of a
    kernel's PTX. Offsets follow the parameters' alignment, as the cubin's parameter table does."""
    entries = ENTRY.findall(ptx)
    if len(entries) != 1:
        raise CompileError(f"expected one .visible .entry in the PTX, found {len(entries)}")
    name, declared = entries[0]
    parameters, offset = [], 0
    for align, _, bits, count in PARAMETER.findall(declared):
        size = int(bits) // 8 * (int(count) if count else 1)
        alignment = int(align) if align else int(bits) // 8
        offset = -(-offset // alignment) * alignment
        parameters.append((offset, size))
        offset += size
    if len(parameters) != declared.count(".param"):
        raise CompileError(f"{name}: unreadable parameter list in the PTX")
    return name, tuple(parameters)


def kernel_arguments(plan: KernelPlan, step: Any) -> list[dict]:
    """The arguments every kernel of a cuda step takes, in order: its inputs, its outputs and the
    error words of an index check, each a flat C-contiguous array (numba passes one as
    5 + 2*ndim words: runtime.cuda_graph.array_words)."""
    values = step.inputs + step.outputs
    arguments = [{"dtype": plan.values[value][0], "ndim": 1} for value in values]
    if step.check:
        arguments.append({"dtype": "i64", "ndim": 1})
    return arguments


def record_launches(plan: KernelPlan, compiled: list[CompiledKernel]) -> None:
    """Write each launch's ``entry``, ``cubin`` (its file in the artifact), ``arguments`` and
    ``parameters`` into the plan, after checking that numba's layout of the arguments is what the
    PTX declares: one 8-byte word per field, in order."""
    from runtime.cuda_graph import array_words_count

    by_launch = {(kernel.step, kernel.kernel): kernel for kernel in compiled}
    for step in plan.steps:
        for launch in step.launches:
            kernel = by_launch[(step.name, launch["kernel"])]
            arguments = kernel_arguments(plan, step)
            words = sum(array_words_count(argument["ndim"]) for argument in arguments)
            expected = tuple((8 * k, 8) for k in range(words))
            if kernel.parameters != expected:
                raise CompileError(f"{step.name}.{launch['kernel']}: the PTX declares {len(kernel.parameters)} "
                                   f"parameters {list(kernel.parameters)[:4]}..., numba's layout of "
                                   f"{len(arguments)} arrays is {words} words of 8 bytes")
            launch["entry"] = kernel.entry
            launch["cubin"] = cubin_file(step.name, launch["kernel"], kernel.arch)
            launch["arguments"] = arguments
            launch["parameters"] = [list(p) for p in kernel.parameters]


def cubin_file(step: str, kernel: str, arch: str) -> str:
    """Where a kernel's cubin lies in a cuda artifact."""
    return f"cubin/{step}.{kernel}.{arch}.cubin"


def jit_options(dispatcher: Any) -> dict[str, Any]:
    """The options a generated kernel's decorator gave numba-cuda that change its machine code
    (fastmath, launch bounds: kernels/cuda_kit.py bounded_decorator), for :func:`compile_kernel` to
    compile it as numba's JIT would."""
    options = getattr(dispatcher, "targetoptions", {})
    return {"fastmath": bool(options.get("fastmath")), "launch_bounds": options.get("launch_bounds")}


def compile_kernel(function: Callable, signature: str, *, arch: str = "sm_90", fastmath: bool = False,
                   launch_bounds: Any = None, step: str = "", kernel: str = "") -> CompiledKernel:
    """NVVM -> PTX -> cubin for one Python kernel function and its numba signature. Any failure,
    an older cuda.core without a Linker included (ImportError), is a CompileError naming the kernel
    (bendc.jit then falls back to numba's JIT)."""
    from numba import cuda

    if not hasattr(cuda, "compile_ptx"):
        raise CompileError("numba's CUDA simulator is on in this process (NUMBA_ENABLE_CUDASIM=1): "
                           "compile PTX in another process")
    install_nvvm_options()
    start = time.perf_counter()
    try:
        from cuda.core import Linker, LinkerOptions, ObjectCode

        ptx, _ = cuda.compile_ptx(function, signature, cc=compute_capability(arch), fastmath=fastmath,
                                  launch_bounds=launch_bounds)
        linker = Linker(ObjectCode.from_ptx(ptx.encode()), options=LinkerOptions(arch=arch, verbose=True))
        cubin = linker.link("cubin")
    except Exception as error:
        raise CompileError(f"{step}.{kernel}: {type(error).__name__}: {error}") from error
    seconds = time.perf_counter() - start
    log = linker.get_info_log() or ""
    code = cubin.code if hasattr(cubin, "code") else bytes(cubin)
    try:
        entry, parameters = entry_point(ptx)
    except CompileError as error:
        raise CompileError(f"{step}.{kernel}: {error}") from None
    return CompiledKernel(step, kernel, arch, ptx, bytes(code), seconds=seconds, info_log=log,
                          entry=entry, parameters=parameters, **parse_resources(log))


def compile_plan(plan: KernelPlan, modules: dict[str, Any], arch: str = "sm_90",
                 progress: Callable[[int, int, str], None] | None = None,
                 cache: Any = None) -> list[CompiledKernel]:
    """Every kernel every step launches, in launch order; ``progress(number, count, step)`` before each.
    ``cache`` (bendc/codegen/cubins.py CubinCache): kernels it holds are taken from it, the others
    compiled and given to it."""
    compiled = []
    count = sum(len(step.launches) for step in plan.steps)
    for step in plan.steps:
        module = modules[step.name]
        for launch in step.launches:
            if progress is not None:
                progress(len(compiled) + 1, count, step.name)
            kernel = cache.load(step, launch["kernel"]) if cache is not None else None
            if kernel is None:
                dispatcher = getattr(module, launch["kernel"])
                kernel = compile_kernel(dispatcher.py_func, module.SIGNATURE, arch=arch, **jit_options(dispatcher),
                                        step=step.name, kernel=launch["kernel"])
                if cache is not None:
                    cache.store(step, kernel)
            block = launch["block"]
            kernel.threads = int(block[0]) * int(block[1]) * int(block[2])
            compiled.append(kernel)
    return compiled


# ------------------------------------------------------------------ the toolchain
def toolchain() -> dict[str, Any]:
    """The versions and paths the cuda path depends on, each recorded as found or as the error that
    stopped it: NVVM (its API and IR versions and the library numba-cuda loads), nvJitLink, the
    driver's CUDA version (needs a GPU's driver), CUDA_HOME (after the /usr/local/cuda fallback:
    runtime.cuda.nvvm_home_fallback), numba-cuda and cuda.core."""
    import importlib

    from runtime.cuda import nvvm_home_fallback

    facts: dict[str, Any] = {"cuda_home_fallback": nvvm_home_fallback(), "CUDA_HOME": os.environ.get("CUDA_HOME")}

    def record(name: str, read: Callable[[], Any]) -> None:
        try:
            facts[name] = read()
        except Exception as error:  # noqa: BLE001 - recorded: toolchain_problems reads it
            facts[name] = f"error: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"

    def nvvm_facts() -> dict:
        from numba.cuda.cudadrv import libs, nvvm

        found = libs.get_cuda_paths()["nvvm"]
        return {"version": list(nvvm.NVVM().get_version()), "ir_version": list(nvvm.NVVM().get_ir_version()),
                "library": getattr(found, "info", None), "found_by": getattr(found, "by", None)}

    def nvjitlink_version() -> list[int]:
        from cuda.bindings import nvjitlink

        return list(nvjitlink.version())

    def driver_version() -> int:
        from cuda.bindings import driver

        (result,) = driver.cuInit(0)
        if result != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuInit: {result!r}")
        return int(driver.cuDriverGetVersion()[1])

    record("nvvm", nvvm_facts)
    record("nvjitlink", nvjitlink_version)
    record("cuda_driver", driver_version)
    for module in ("numba_cuda", "cuda.core", "cuda.bindings"):
        record(module, lambda module=module: getattr(importlib.import_module(module), "__version__", "?"))
    return facts


def toolchain_problems(facts: dict[str, Any], driver: bool = True) -> list[str]:
    """What in ``toolchain()``'s facts stops the cuda path, one line each (empty: none). The rules:
    NVVM and nvJitLink must load; with ``driver`` (a GPU run) the driver must answer, and its CUDA
    major version must be at least nvJitLink's (cubins from nvJitLink 13 need a CUDA 13 driver)."""
    problems = [f"{name}: {facts.get(name)}" for name in ("nvvm", "nvjitlink")
                if not isinstance(facts.get(name), (dict, list))]
    if driver:
        found = facts.get("cuda_driver")
        if not isinstance(found, int):
            problems.append(f"cuda_driver: {found}")
        elif isinstance(facts.get("nvjitlink"), list) and found // 1000 < facts["nvjitlink"][0]:
            problems.append(f"the driver supports CUDA {found // 1000}.{found % 1000 // 10}, older than nvJitLink "
                            f"{'.'.join(map(str, facts['nvjitlink']))}: its cubins will not load (update the "
                            "driver or install the cuda wheels of the driver's version)")
    return problems


def smoke_compile(arch: str = "sm_90") -> CompiledKernel:
    """One tiny kernel through NVVM and nvJitLink for ``arch``: the toolchain works end to end
    (CompileError otherwise). Needs no GPU."""
    source = ("def bendc_kernel_smoke(x, out):\n"
              "    i = cuda.grid(1)\n"
              "    if i < out.shape[0]:\n"
              "        out[i] = x[i] * x[i] + x[i]\n")
    from numba import cuda

    namespace: dict[str, Any] = {"cuda": cuda}
    exec(compile(source, "<bendc toolchain smoke test>", "exec"), namespace)  # noqa: S102 - a fixed kernel
    return compile_kernel(namespace["bendc_kernel_smoke"], "void(float32[::1], float32[::1])", arch=arch,
                          step="smoke", kernel="kernel")
