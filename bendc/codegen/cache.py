"""Generated source on disk: one module per kernel, named by its structural hash.

A module is written to a temporary name and renamed into place, then
imported from its file (runtime.artifact.load_kernel), so tracebacks show
the generated line and numba's ``cache=True`` keeps the compiled machine code
beside it (second processes load it instead of compiling). Kernels that differ only in comments share a
file.
"""
from __future__ import annotations

import hashlib
import os

from bendc.codegen.cpu import strip_comments
from runtime.files import atomic_write


def default_cache_dir() -> str:
    configured = os.environ.get("BENDC_CACHE_DIR")
    if configured:
        return configured
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "bendc")


def structural_hash(source: str) -> str:
    return hashlib.sha256(strip_comments(source).encode()).hexdigest()[:24]


def kernel_path(cache_dir: str, module: str) -> str:
    return os.path.join(cache_dir, "kernels", f"{module}.py")


def write_kernel(cache_dir: str, source: str) -> str:
    """Write the kernel module (once) and return its module name."""
    module = "k_" + structural_hash(source)
    path = kernel_path(cache_dir, module)
    if not os.path.exists(path):
        atomic_write(path, source)
    return module
