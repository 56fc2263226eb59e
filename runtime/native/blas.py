"""The sgemm bendc's float32 products call: MKL's where it is installed (the ``mkl`` extra) and
chosen, else the OpenBLAS libraries numpy and scipy bundle.

``BENDC_BLAS`` chooses: ``auto`` (the default) takes MKL where its ``libmkl_rt`` is installed and
the CPU is Intel's (where it was measured); ``mkl`` takes it on any CPU; ``openblas`` never loads
it. Any other value is a ValueError naming the variable (the runtime runs without the compiler,
so not BendcError: runtime/native/pool.py's BENDC_POOL_SPIN_US is checked the same way).

MKL runs sequential here (``MKL_Set_Threading_Layer``, before its first call): its sgemm is then
safe to call from the pool's threads (runtime/native/pool.py) and keeps no threads of its own, so
one sgemm serves a kernel at one thread and inside the pool's work items, with the same bits at any
thread count. Only the ``mkl`` wheel's library is taken, and not where numpy itself is built on
MKL (conda's numpy: bendc would take that MKL's threads from the user's numpy). Where MKL was
already running with another threading layer in this process (another library linked to the
wheel called it first), it answers with that layer and bendc leaves it alone. The OpenBLAS
fallback is two libraries: numpy's at one thread (its one global thread count stays the user's)
and scipy's, held to one thread, inside the pool.

Measured (this 2-vCPU Sapphire Rapids machine, one thread, ``OPENBLAS_*`` unset, GFLOP/s, best of
3 in one process; M x N x K): MKL 2026.2 / numpy's OpenBLAS 0.3.31: 1024x128x512 153/122,
1024x512x128 137/120, 128x1024x512 147/109, 64x288x576 148/117 (conv2d's per-sample weight
gradient), 288x64x576 142/117, 512x256x64 125/118. The bits differ from OpenBLAS's on some shapes
(both are correct sgemms: neither is torch's order); MKL's do not depend on its operands'
alignment (300 shapes at byte offsets 0-60 compared).
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys
import threading
from dataclasses import dataclass

import numpy as np

CHOICES = ("auto", "mkl", "openblas")
MKL_SEQUENTIAL = 1  # MKL_THREADING_SEQUENTIAL, MKL_Set_Threading_Layer's argument

_LOCK = threading.Lock()
_CHOSEN: dict[str, "Sgemm"] = {}


@dataclass(frozen=True)
class Sgemm:
    """The sgemm bendc calls: its address (Fortran's sgemm, every argument by address; 0: none),
    whether its integers are 64-bit (ILP64), whether it may be called from the pool's threads at
    any thread count, and what it is (for reports and benchmark records)."""

    address: int
    ilp64: bool
    any_thread: bool
    name: str

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """a @ b (float32 matrices) by one call of this sgemm, through ctypes: the whole-product
        reference the tests and benchmarks compare bendc's products with."""
        a, b = np.ascontiguousarray(a, np.float32), np.ascontiguousarray(b, np.float32)
        (m, k), n = a.shape, b.shape[1]
        if not self.address or b.shape[0] != k:
            raise ValueError(f"sgemm of {a.shape} @ {b.shape} ({self.name})")
        out = np.zeros((m, n), np.float32)
        size = ctypes.c_int64 if self.ilp64 else ctypes.c_int32
        function = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 13)(self.address)
        byref = ctypes.byref
        n_, m_, k_ = size(n), size(m), size(k)  # out^T = b^T a^T, column-major: n x m, every ld tight
        one, zero, no = ctypes.c_float(1.0), ctypes.c_float(0.0), ctypes.c_char(b"N")
        function(byref(no), byref(no), byref(n_), byref(m_), byref(k_), byref(one), b.ctypes.data, byref(n_),
                 a.ctypes.data, byref(k_), byref(zero), out.ctypes.data, byref(n_))
        return out


# No sgemm of bendc's own (address 0): np.dot as numba calls it (scipy's OpenBLAS).
NUMBA_SGEMM = Sgemm(0, True, False, "numba's (scipy's OpenBLAS)")


def choice() -> str:
    """``BENDC_BLAS``, checked."""
    value = os.environ.get("BENDC_BLAS", "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"BENDC_BLAS={os.environ['BENDC_BLAS']!r}: expected one of {', '.join(CHOICES)}")
    return value


def mkl_library() -> str | None:
    """The path of MKL's single dynamic library (``libmkl_rt.so.N``) of the ``mkl`` wheel (its
    recorded files); None where the wheel is not installed. Only the wheel's: an MKL another
    package brought (conda's, which its numpy links) is that package's, threads and all."""
    if not sys.platform.startswith("linux"):
        return None
    from importlib import metadata

    try:
        distribution = metadata.distribution("mkl")
    except metadata.PackageNotFoundError:
        return None
    found = [distribution.locate_file(f) for f in distribution.files or [] if f.name.startswith("libmkl_rt.so")]
    for path in sorted(str(p) for p in found):
        if os.path.isfile(path):
            return os.path.realpath(path)
    return None


def _numpy_blas() -> dict:
    """numpy's build configuration of its BLAS (name, version); empty where numpy does not say
    (numpy < 2 has no ``mode="dicts"``)."""
    try:
        return dict(np.show_config(mode="dicts")["Build Dependencies"]["blas"])
    except Exception:  # noqa: BLE001
        return {}


def _intel() -> bool:
    try:
        with open("/proc/cpuinfo") as stream:
            return any(line.startswith("vendor_id") and "GenuineIntel" in line for line in stream)
    except OSError:
        return False


def _mkl() -> Sgemm | None:
    """MKL's ILP64 sgemm (``sgemm_64``: 64-bit integers whatever ``MKL_INTERFACE_LAYER`` says),
    sequential; None where it is missing or runs threaded already."""
    path = mkl_library()
    if path is None or "mkl" in str(_numpy_blas().get("name", "")).lower():  # numpy's own MKL keeps its threads
        return None
    try:
        library = ctypes.CDLL(path)
        set_layer, sgemm = library.MKL_Set_Threading_Layer, library.sgemm_64
    except (OSError, AttributeError):
        return None
    set_layer.argtypes, set_layer.restype = [ctypes.c_int], ctypes.c_int
    if set_layer(MKL_SEQUENTIAL) != MKL_SEQUENTIAL:
        return None
    text = ctypes.create_string_buffer(256)
    library.MKL_Get_Version_String(text, len(text))
    version = text.value.decode(errors="replace").split(" for ")[0].replace("Intel(R) oneAPI Math Kernel Library ", "")
    return Sgemm(ctypes.cast(sgemm, ctypes.c_void_p).value or 0, True, True, f"MKL {version} (sequential)")


def _numpy_openblas() -> Sgemm | None:
    """The sgemm of the OpenBLAS numpy's wheels bundle (``numpy.libs``, ILP64 ``scipy_sgemm_64_``):
    at one thread only (its thread count is numpy's)."""
    folder = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    for path in sorted(glob.glob(os.path.join(folder, "libscipy_openblas64_*.so*"))):
        try:
            function = getattr(ctypes.CDLL(path), "scipy_sgemm_64_", None)
        except OSError:
            continue
        if function is not None:
            version = _numpy_blas().get("version", "")
            return Sgemm(ctypes.cast(function, ctypes.c_void_p).value or 0, True, False,
                         f"numpy's OpenBLAS {version}".strip())
    return None


def sgemm() -> Sgemm:
    """The sgemm native kernels call (runtime/native/jit.py binds it), chosen once a process:
    MKL's as ``BENDC_BLAS`` allows, else numpy's OpenBLAS (one thread only), else none (address
    0: numba's np.dot, scipy's OpenBLAS). ``BENDC_NUMPY_SGEMM=0`` (the translator's test switch)
    keeps numba's."""
    if "sgemm" in _CHOSEN:
        return _CHOSEN["sgemm"]
    with _LOCK:
        if "sgemm" not in _CHOSEN:
            wanted = choice()
            found = None
            if os.environ.get("BENDC_NUMPY_SGEMM", "1") == "0":
                found = NUMBA_SGEMM
            if found is None and (wanted == "mkl" or (wanted == "auto" and _intel())):
                found = _mkl()
            if found is None:
                found = _numpy_openblas() or NUMBA_SGEMM
            _CHOSEN["sgemm"] = found
    return _CHOSEN["sgemm"]
