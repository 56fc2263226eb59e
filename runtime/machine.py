"""Machine code in artifacts: numba's cache files of every kernel, read where they lie.

A cpu artifact holds, under ``numba/``, numba's cache index (``.nbi``) and data
(``.nbc``) files of its kernels for the CPU it was built on, which the manifest
records as ``machine`` (numba's codegen "magic tuple": target triple, CPU name
and CPU features, the same triple numba keys its cache entries by). They are
listed in the manifest with their hashes like every other file.

numba finds a function's cache through a *locator* (numba/core/caching.py):
the default ones put it in ``__pycache__`` beside the source file (which would
write into the artifact) or in a user-wide folder, and all of them stamp the
index with the source's content hash (numba 0.68), not its path. The
:class:`ArtifactCacheLocator` here is tried first for the kernel files that
:func:`place_cache` registered: it points numba at the artifact's ``numba/``
folder, read-only (saving is switched off, so a kernel that misses is compiled
in memory and never written), or, when the host is another CPU, at a writable
folder of bendc's cache outside the artifact. Since the index names and stamps
depend on the module file's name, line numbers and content only, the files
keep validating after the artifact is copied or moved.
"""
from __future__ import annotations

import os
from typing import Any, Iterable

from numba.core import caching

# Absolute path of a kernel source file -> (folder of its numba cache files, read-only, the sha256
# of each file there by name, from a verified manifest, or None: files checked by their .sig).
_HOMES: dict[str, tuple[str, bool, dict[str, str] | None]] = {}
MACHINE_FOLDER = "numba"


def host_machine() -> dict[str, str]:
    """The CPU numba compiles for here (it honours NUMBA_CPU_NAME / NUMBA_CPU_FEATURES)."""
    from numba.core.registry import cpu_target

    triple, name, features = cpu_target.target_context.codegen().magic_tuple()
    return {"triple": triple, "cpu": name, "features": features}


def same_machine(recorded: dict | None, host: dict | None = None) -> bool:
    host = host or host_machine()
    return isinstance(recorded, dict) and all(recorded.get(k) == host[k] for k in ("triple", "cpu", "features"))


def describe_machine(machine: dict) -> str:
    return f"{machine.get('cpu', '?')} ({machine.get('triple', '?')})"


class ArtifactCacheLocator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
    """numba's cache of a registered kernel file: in the folder :func:`place_cache` gave it."""

    def __init__(self, py_func: Any, py_file: str, folder: str, readonly: bool,
                 expected: dict[str, str] | None = None) -> None:
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._folder = folder
        self.readonly = readonly
        self.expected = expected  # what runtime/artifact.py checks each file against before numba reads it

    def get_cache_path(self) -> str:
        return self._folder

    def ensure_cache_path(self) -> None:
        if not self.readonly:  # a read-only folder is only read: never made, never tested for writing
            super().ensure_cache_path()

    @classmethod
    def from_function(cls, py_func: Any, py_file: str) -> "ArtifactCacheLocator | None":
        home = _HOMES.get(os.path.abspath(py_file))
        if home is None:
            return None
        locator = cls(py_func, py_file, *home)
        try:
            locator.ensure_cache_path()
        except OSError:  # the outside cache cannot be written: read (nothing) and never write
            locator.readonly = True
        return locator


def install() -> None:
    """Put the artifact locator first for every ``cache=True`` function (idempotent)."""
    impl = caching.CompileResultCacheImpl
    if ArtifactCacheLocator not in impl._locator_classes:
        impl._locator_classes = [ArtifactCacheLocator, *impl._locator_classes]


def place_cache(source_file: str, folder: str, readonly: bool, expected: dict[str, str] | None = None) -> None:
    """numba's cache of the functions in ``source_file`` (imported after this) lives in ``folder``;
    ``expected``: the sha256 of each file there (a verified artifact's), else they carry .sig files."""
    install()
    _HOMES[os.path.abspath(source_file)] = (folder, readonly, expected)


def home_of(source_file: str) -> tuple[str, bool, dict[str, str] | None] | None:
    """The machine-code folder :func:`place_cache` registered for a kernel file (None: numba's default)."""
    return _HOMES.get(os.path.abspath(source_file))


def seal(dispatcher: Any) -> None:
    """A dispatcher whose cache is a read-only artifact never saves (it would write there)."""
    cache = getattr(dispatcher, "_cache", None)
    locator = getattr(getattr(cache, "_impl", None), "locator", None)
    if isinstance(locator, ArtifactCacheLocator) and locator.readonly:
        cache.save_overload = lambda sig, data: None


def dispatchers(modules: Iterable[Any]) -> list[Any]:
    """The numba functions defined by generated kernel modules (kernels and their helpers)."""
    found = []
    for module in modules:
        for value in vars(module).values():
            if hasattr(value, "stats") and hasattr(value, "py_func") and \
                    getattr(value.py_func, "__module__", None) == module.__name__:
                found.append(value)
    return found


def compile_counts(modules: Iterable[Any]) -> dict[str, int]:
    """How many functions numba compiled and how many it loaded from a cache, in these modules."""
    compiled = loaded = 0
    for dispatcher in dispatchers(modules):
        stats = dispatcher.stats
        compiled += sum(stats.cache_misses.values())
        loaded += sum(stats.cache_hits.values())
    return {"compiled": compiled, "loaded": loaded}
