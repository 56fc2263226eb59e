"""The cubins of a cuda plan, kept in the kernel cache beside the kernel modules.

A kernel's cubin depends on its module's source (named by structural hash, the
``@cuda.jit`` options included), the kernel's name in it, the architecture, the
compiler (bendc's own source: the no-FMA NVVM options live there) and the
toolchain (numba-cuda, cuda-core, nvJitLink). Each cached kernel is two files
under ``<cache>/cubins/``: ``<key>.cubin`` and ``<key>.json`` (entry symbol,
parameters, PTX, resources, the linker's log), the JSON written last so that
its presence means a complete entry. A read entry is checked against the cubin's
ELF (runtime/cubin_elf.py) and recompiled when it disagrees. ``bendc compile
--target cuda`` and ``bendc.jit(target="cuda")`` share it; compiling needs
numba-cuda's NVVM and nvJitLink (not a GPU, and not numba's CUDA simulator:
there only cached cubins are found).
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
from typing import Any

from bendc.codegen.ptx import CompiledKernel
from runtime.cubin_elf import CubinUnreadable, entry_symbols, kernel_parameters
from runtime.files import atomic_write

CACHE_FOLDER = "cubins"
TOOLCHAIN = ("numba-cuda", "cuda-core", "cuda-bindings", "nvidia-nvjitlink", "nvidia-nvjitlink-cu13",
             "nvidia-nvjitlink-cu12")


@functools.lru_cache(maxsize=None)
def toolchain() -> str:
    """The compiler and toolchain a cubin was made by, as one string (part of each cache key)."""
    from bendc.artifact import compiler_fingerprint

    found = []
    for name in TOOLCHAIN:
        try:
            found.append(f"{name}={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return ";".join([compiler_fingerprint(), *found])


def cache_key(module: str, kernel: str, arch: str) -> str:
    digest = hashlib.sha256(f"{module}|{kernel}|{arch}|{toolchain()}".encode()).hexdigest()[:24]
    return f"{module}.{kernel}.{arch}.{digest}"


class CubinCache:
    """The cached cubins for ``arch`` under ``cache_dir`` (the ``cache`` of ptx.compile_plan);
    ``hits`` counts the kernels found."""

    def __init__(self, cache_dir: str, arch: str) -> None:
        self.cache_dir, self.arch, self.hits = cache_dir, arch, 0

    def _paths(self, step: Any, kernel: str) -> tuple[str, str]:
        base = os.path.join(self.cache_dir, CACHE_FOLDER, cache_key(step.module, kernel, self.arch))
        return base + ".cubin", base + ".json"

    def load(self, step: Any, kernel: str) -> CompiledKernel | None:
        """The cached kernel of ``step`` (for that step's name), None when absent or damaged."""
        cubin_path, meta_path = self._paths(step, kernel)
        try:
            with open(meta_path, encoding="utf-8") as stream:
                meta = json.load(stream)
            with open(cubin_path, "rb") as stream:
                cubin = stream.read()
            parameters = tuple(tuple(p) for p in meta["parameters"])
            if (meta["entry"] not in entry_symbols(cubin)
                    or tuple(kernel_parameters(cubin, meta["entry"])) != parameters):
                return None
            found = CompiledKernel(step.name, kernel, self.arch, meta["ptx"], cubin, meta["registers"],
                                   meta["spill_stores"], meta["spill_loads"], meta["shared_bytes"],
                                   meta["info_log"], seconds=0.0, entry=meta["entry"], parameters=parameters,
                                   cached=True)
        except (OSError, ValueError, KeyError, TypeError, CubinUnreadable):
            return None
        self.hits += 1
        return found

    def store(self, step: Any, kernel: CompiledKernel) -> None:
        cubin_path, meta_path = self._paths(step, kernel.kernel)
        os.makedirs(os.path.dirname(cubin_path), mode=0o700, exist_ok=True)  # as runtime/trust.py checks it
        atomic_write(cubin_path, kernel.cubin)
        meta = {"ptx": kernel.ptx, "entry": kernel.entry, "parameters": [list(p) for p in kernel.parameters],
                "registers": kernel.registers, "spill_stores": kernel.spill_stores,
                "spill_loads": kernel.spill_loads, "shared_bytes": kernel.shared_bytes,
                "info_log": kernel.info_log}
        atomic_write(meta_path, json.dumps(meta))  # last: a complete entry
