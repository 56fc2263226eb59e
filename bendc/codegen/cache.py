"""Generated source on disk: one module per kernel, named by its structural hash.

A module is written to a temporary name and linked into place (the first
writer wins, so a file once there never changes under numba's cache, which
is keyed by the file's time stamp), then imported from its file (runtime.artifact.load_kernel), so tracebacks show
the generated line and numba's ``cache=True`` keeps the compiled machine code
beside it (second processes load it instead of compiling). Kernels that differ only in comments share a
file.
"""
from __future__ import annotations

import functools
import os
import tempfile

from runtime.artifact import is_module_file, module_name
from runtime.files import default_cache_dir, sweep_stale  # noqa: F401 - default_cache_dir re-exported


def structural_hash(source: str) -> str:
    return module_name(source)[2:]


def kernel_path(cache_dir: str, module: str) -> str:
    return os.path.join(cache_dir, "kernels", f"{module}.py")


def write_kernel(cache_dir: str, source: str) -> str:
    """Write the kernel module (once) and return its module name.

    The kernel folder is shared by every program and process: a file already
    there is kept when it is complete (its structural hash is its name; another
    process may have written it with other comments) and replaced when damaged.
    """
    module = module_name(source)
    path = kernel_path(cache_dir, module)
    folder = os.path.dirname(path)
    _sweep_once(folder)
    if is_module_file(path, module):
        return module
    os.makedirs(folder, mode=0o700, exist_ok=True)  # runtime/trust.py private_cache made it where it checked
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=".tmp-")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(source.encode())
        try:
            os.link(temporary, path)  # only where no file is: a concurrent writer's stays
        except FileExistsError:
            if not is_module_file(path, module):
                os.replace(temporary, path)  # a damaged file: never imported, replaced whole
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return module


@functools.lru_cache(maxsize=None)
def _sweep_once(folder: str) -> None:
    """Remove temporaries that killed processes left in a kernel folder (once per process)."""
    sweep_stale(folder, lambda name: name.startswith(".tmp-"))
    # numba writes its cache files as NAME.tmp.<hex> and renames them.
    sweep_stale(os.path.join(folder, "__pycache__"), lambda name: ".tmp." in name)
