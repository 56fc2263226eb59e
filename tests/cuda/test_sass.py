"""No FMA contraction in the machine code of bendc's cuda kernels, proven offline from SASS.

bendc promises PyTorch's numbers: a*b+c rounds twice (FMUL then FADD), never once (FFMA),
unless the user asks for fastmath. PTX is not enough to check it: numba-cuda's ``cuda.jit``
defaults to link-time optimization where nvJitLink is present, and then the machine code is
made inside nvJitLink, which never sees NVVM's ``fma=False`` and contracts. So these tests
disassemble cubins (nvdisasm, from the nvidia-cuda-nvdisasm wheel: no GPU needed) made by
both routes a kernel takes:

- the build path (``bendc compile --target cuda``): NVVM to PTX, nvJitLink to cubin;
- the JIT path (``bendc.jit(target="cuda")`` on a GPU): numba's own kernel compilation with
  the generated module's decorator options (``lto=False``), its device query pinned to sm_90.

A negative control compiles the same kernel with LTO on and must find FFMA: the check can fail.
"""
from __future__ import annotations

import collections
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("numba-cuda is not installed (pip install 'bendc[cuda]')", allow_module_level=True)
if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    pytest.skip("SASS needs the real numba.cuda: run without NUMBA_ENABLE_CUDASIM", allow_module_level=True)

import bendc  # noqa: E402
from bendc.codegen.cuda import CudaOptions, render_cuda_plan  # noqa: E402
from bendc.codegen.cache import kernel_path, write_kernel  # noqa: E402
from bendc.codegen.plan import build_plan  # noqa: E402
from bendc.codegen.ptx import compile_plan  # noqa: E402
from runtime.artifact import load_module  # noqa: E402
from runtime.cuda import install_nvvm_options  # noqa: E402

ARCH = "sm_90"
FLOAT_OPS = re.compile(r"\b(FFMA|FMUL|FADD)\b")


def find_nvdisasm(prefix: str = sys.prefix, path: str | None = None) -> str | None:
    """nvdisasm from the nvidia-cuda-nvdisasm wheel under ``prefix``, else the first on ``path``
    ($PATH), else CUDA_HOME's or /usr/local/cuda's bin/ (a device image with a system toolkit and
    no wheel); None when there is none."""
    found = glob.glob(os.path.join(prefix, "lib", "python3*", "site-packages", "nvidia", "*", "bin", "nvdisasm"))
    if found:
        return found[0]
    on_path = shutil.which("nvdisasm", path=path)
    if on_path:
        return on_path
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home and os.access(os.path.join(home, "bin", "nvdisasm"), os.X_OK):
            return os.path.join(home, "bin", "nvdisasm")
    return None


def nvdisasm() -> str:
    found = find_nvdisasm()
    if found is None:
        pytest.fail("nvdisasm is missing: the cuda extra installs nvidia-cuda-nvdisasm (or put a CUDA toolkit's "
                    "bin/ on PATH)")
    return found


def test_nvdisasm_is_found_on_path_without_the_wheel(tmp_path, monkeypatch) -> None:
    tool = tmp_path / "bin" / "nvdisasm"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    assert find_nvdisasm(prefix=str(tmp_path / "no-wheel"), path=str(tool.parent)) == str(tool)
    assert find_nvdisasm(prefix=sys.prefix, path=str(tool.parent)) != str(tool)  # the wheel's comes first


def sass_ops(cubin: bytes, tmp_path) -> collections.Counter:
    """How many FFMA, FMUL and FADD instructions the cubin's SASS holds."""
    path = tmp_path / f"k{len(list(tmp_path.iterdir()))}.cubin"
    path.write_bytes(cubin)
    sass = subprocess.run([nvdisasm(), "-c", str(path)], capture_output=True, text=True, check=True).stdout
    return collections.Counter(FLOAT_OPS.findall(sass))


def multiply_add(x, y, z):
    return x * y + z


def rendered(fn, shapes: str, tmp_path, fastmath: bool = False):
    """The plan of ``fn`` with cuda kernels rendered and their modules imported."""
    graph = bendc.jit(fn, target="reference").lower(shapes).graph
    plan = build_plan(graph)
    render_cuda_plan(plan, graph, CudaOptions(fastmath=fastmath))
    modules = {}
    for step in plan.steps:
        step.module = write_kernel(str(tmp_path), step.source)
        modules[step.name] = load_module(kernel_path(str(tmp_path), step.module), step.module)
    return plan, modules


def jit_path_cubin(dispatcher, signature: str, lto: bool | None = None) -> bytes:
    """The cubin numba's JIT makes of a generated kernel for sm_90 (as on a GPU of that kind), with
    the dispatcher's own options (``lto`` overrides them for the negative control)."""
    import numba.cuda.codegen as codegen
    import numba.cuda.dispatcher as numba_dispatcher
    from numba.core import sigutils

    class SM90:
        compute_capability = (9, 0)

    install_nvvm_options()
    saved = numba_dispatcher.get_current_device, codegen.CUDACodeLibrary._ensure_cc
    numba_dispatcher.get_current_device = lambda: SM90()
    codegen.CUDACodeLibrary._ensure_cc = lambda self, cc: (9, 0) if cc is None else cc
    try:
        options = {k: v for k, v in dispatcher.targetoptions.items() if k in ("fastmath", "lto", "debug", "lineinfo")}
        if lto is not None:
            options["lto"] = lto
        arguments, _ = sigutils.normalize_signature(signature)
        kernel = numba_dispatcher._Kernel(dispatcher.py_func, arguments, **options)
        cubin = kernel.library.get_cubin(cc=(9, 0))
    finally:
        numba_dispatcher.get_current_device, codegen.CUDACodeLibrary._ensure_cc = saved
    return bytes(cubin.code) if hasattr(cubin, "code") else bytes(cubin)


def test_the_build_path_rounds_a_times_b_plus_c_twice(tmp_path) -> None:
    plan, modules = rendered(multiply_add, "x=f32[64] y=f32[64] z=f32[64]", tmp_path / "kernels")
    compiled = compile_plan(plan, modules, ARCH)
    ops = sum((sass_ops(kernel.cubin, tmp_path) for kernel in compiled), collections.Counter())
    assert ops["FMUL"] >= 1 and ops["FADD"] >= 1 and ops["FFMA"] == 0, ops


def test_the_jit_path_rounds_a_times_b_plus_c_twice_and_lto_would_not(tmp_path) -> None:
    plan, modules = rendered(multiply_add, "x=f32[64] y=f32[64] z=f32[64]", tmp_path / "kernels")
    (step,) = [s for s in plan.steps if s.launches]
    module = modules[step.name]
    dispatcher = getattr(module, step.launches[0]["kernel"])
    assert dispatcher.targetoptions.get("lto") is False  # as generated: @cuda.jit(lto=False)
    ops = sass_ops(jit_path_cubin(dispatcher, module.SIGNATURE), tmp_path)
    assert ops["FMUL"] >= 1 and ops["FADD"] >= 1 and ops["FFMA"] == 0, ops
    # The negative control: numba-cuda's default (LTO through nvJitLink) contracts.
    contracted = sass_ops(jit_path_cubin(dispatcher, module.SIGNATURE, lto=True), tmp_path)
    assert contracted["FFMA"] >= 1, contracted


def test_fastmath_is_the_only_way_to_ffma(tmp_path) -> None:
    plan, modules = rendered(multiply_add, "x=f32[64] y=f32[64] z=f32[64]", tmp_path / "kernels", fastmath=True)
    compiled = compile_plan(plan, modules, ARCH)
    ops = sum((sass_ops(kernel.cubin, tmp_path) for kernel in compiled), collections.Counter())
    assert ops["FFMA"] >= 1, ops


# PTX instructions whose SASS legitimately holds FFMA: libdevice's exp/log (fma in the PTX, by
# design of their range reduction) and correctly rounded division and square root (ptxas refines a
# reciprocal or a reciprocal square root with FFMA). A kernel without them must have none.
EXPANDS_TO_FFMA = re.compile(r"^\s*(fma\.|div\.rn\.f32|div\.full|sqrt\.rn\.f32|rcp\.rn\.f32)", re.M)


@pytest.mark.long  # 20 s of builds; the three tests above check the build path, the JIT path and fastmath
def test_no_kernel_of_the_mlp_example_contracts(tmp_path) -> None:
    """Kernels of the mlp training step (matmul tiles, sums, elementwise VJP chains), build path:
    where the PTX asks for no fma, division or square root, the SASS holds no FFMA."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    try:
        import flat_mlp as mlp
    finally:
        sys.path.pop(0)
    graph = bendc.jit(mlp.train_step.fn, leaves=mlp.LEAVES, target="reference").lower(mlp.EXAMPLE_SHAPES).graph
    plan = build_plan(graph)
    render_cuda_plan(plan, graph)
    modules = {}
    for step in plan.steps:
        step.module = write_kernel(str(tmp_path / "kernels"), step.source)
        modules[step.name] = load_module(kernel_path(str(tmp_path / "kernels"), step.module), step.module)
    compiled = [k for k in compile_plan(plan, modules, ARCH) if not EXPANDS_TO_FFMA.search(k.ptx)]
    assert len(compiled) >= 10, "too few kernels checked"  # the matmuls and the elementwise chains
    contracted = [f"{k.step}.{k.kernel}" for k in compiled if sass_ops(k.cubin, tmp_path)["FFMA"]]
    assert not contracted, f"FFMA in {contracted}"
