"""The cuda toolchain's checks, offline: the /usr/local/cuda fallback for NVVM, what
bendc.codegen.ptx.toolchain() records and which facts stop a device run
(tests/gpu/device_info.py prints them first), the smoke compile, and an older cuda.core without a
Linker failing as a CompileError (which bendc.jit answers with numba's JIT) instead of an
ImportError."""
from __future__ import annotations

import importlib.util
import os
import sys
import types

import pytest

from runtime.cuda import nvvm_home_fallback


def test_cuda_home_falls_back_to_a_system_toolkit_with_nvvm_only_when_nothing_else_finds_nvvm(tmp_path) -> None:
    system = tmp_path / "cuda"
    (system / "nvvm").mkdir(parents=True)
    environ: dict = {}
    assert nvvm_home_fallback(environ, str(system), wheel=False) == str(system)
    assert environ == {"CUDA_HOME": str(system)}
    for given in ({"CUDA_HOME": "/opt/cuda"}, {"CUDA_PATH": "/opt/cuda"}):
        environ = dict(given)
        assert nvvm_home_fallback(environ, str(system), wheel=False) is None and environ == given
    environ = {}
    assert nvvm_home_fallback(environ, str(system), wheel=True) is None and environ == {}  # the wheel's NVVM
    assert nvvm_home_fallback(environ, str(tmp_path / "no-toolkit"), wheel=False) is None and environ == {}


needs_nvvm = pytest.mark.skipif(importlib.util.find_spec("numba_cuda") is None
                                or os.environ.get("NUMBA_ENABLE_CUDASIM") == "1",
                                reason="needs numba-cuda's NVVM, outside the simulator")


def test_the_problems_that_stop_a_device_run() -> None:
    from bendc.codegen.ptx import toolchain_problems

    good = {"nvvm": {"version": [2, 0]}, "nvjitlink": [13, 5], "cuda_driver": 13000}
    assert toolchain_problems(good) == []
    old_driver = toolchain_problems({**good, "cuda_driver": 12080})
    assert len(old_driver) == 1 and "the driver supports CUDA 12.8, older than nvJitLink 13.5" in old_driver[0]
    assert toolchain_problems({**good, "cuda_driver": "error: no driver"}) == ["cuda_driver: error: no driver"]
    assert toolchain_problems({**good, "cuda_driver": "error: no driver"}, driver=False) == []
    assert toolchain_problems({**good, "nvvm": "error: OSError: libnvvm"}) == ["nvvm: error: OSError: libnvvm"]


@needs_nvvm
def test_toolchain_records_nvvm_nvjitlink_and_cuda_home_and_the_smoke_compile_links() -> None:
    from bendc.codegen.ptx import smoke_compile, toolchain, toolchain_problems

    facts = toolchain()
    assert {"nvvm", "nvjitlink", "cuda_driver", "CUDA_HOME", "cuda_home_fallback", "numba_cuda", "cuda.core"} <= set(facts)
    assert isinstance(facts["nvvm"], dict) and facts["nvvm"]["library"] and len(facts["nvjitlink"]) == 2
    assert toolchain_problems(facts, driver=False) == []
    kernel = smoke_compile("sm_90")
    assert kernel.cubin and kernel.registers > 0 and "fma.rn" not in kernel.ptx  # bendc's NVVM options held


@needs_nvvm
def test_a_cuda_core_without_a_linker_is_a_compile_error_naming_the_kernel(monkeypatch) -> None:
    from bendc.codegen.ptx import CompileError, smoke_compile

    monkeypatch.setitem(sys.modules, "cuda.core", types.ModuleType("cuda.core"))  # an older cuda.core
    with pytest.raises(CompileError, match=r"smoke\.kernel: ImportError: cannot import name 'Linker'"):
        smoke_compile("sm_90")


def test_occupancy_for_sm_90_from_registers_shared_memory_and_threads() -> None:
    """The issue's figures for the tiled attention kernels at 128 threads: 96 registers and 35 KiB
    of shared memory give 5 blocks (31%), 158 registers 3 blocks (19%)."""
    from bendc.codegen.ptx import CompiledKernel, occupancy

    assert occupancy(96, 35 * 1024, 128) == {"blocks": 5, "percent": 31, "limit": "registers"}
    assert occupancy(158, 39 * 1024, 128) == {"blocks": 3, "percent": 19, "limit": "registers"}
    assert occupancy(32, 0, 256) == {"blocks": 8, "percent": 100, "limit": "warps"}
    assert occupancy(16, 0, 32) == {"blocks": 32, "percent": 50, "limit": "blocks per SM"}
    assert occupancy(32, 100 * 1024, 128)["limit"] == "shared memory"
    assert occupancy(32, 227 * 1024, 128) == {"blocks": 1, "percent": 6, "limit": "shared memory"}
    assert occupancy(32, 227 * 1024 + 4, 128) == {"blocks": 0, "percent": 0, "limit": "shared memory per block"}
    assert occupancy(32, 0, 128, "sm_80") is None
    kernel = CompiledKernel("s", "k", "sm_90", "", b"", 96, 0, 0, 35 * 1024, "", 0.1, threads=128)
    assert "35840 bytes shared memory, 5 blocks of 128 threads per SM (31% occupancy, limited by registers)" \
        in kernel.describe()
