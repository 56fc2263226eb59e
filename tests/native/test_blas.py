"""Which sgemm bendc's products call (runtime/native/blas.py): ``BENDC_BLAS`` chooses, a wrong value
is refused by name, MKL runs sequential or not at all, and a step gives right values on either."""
from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest

from conftest import child_report
from runtime.native import blas

needs_mkl = pytest.mark.skipif(blas.mkl_library() is None, reason="MKL is not installed (the mkl extra)")

CHOSEN = textwrap.dedent('''
    import json, sys
    if sys.argv[1] == "torch first":
        import torch  # libtorch_cpu holds its own MKL, exported
    import numpy as np
    from runtime.native import blas
    chosen = blas.sgemm()
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((130, 70)).astype(np.float32), rng.standard_normal((70, 50)).astype(np.float32)
    error = float(np.abs(chosen.matmul(a, b) - a.astype(np.float64) @ b).max())
    print(json.dumps({"name": chosen.name, "any_thread": chosen.any_thread, "ilp64": chosen.ilp64, "error": error}))
''')


def test_an_unknown_choice_names_the_variable(monkeypatch):
    monkeypatch.setenv("BENDC_BLAS", "atlas")
    with pytest.raises(ValueError, match="BENDC_BLAS='atlas': expected one of auto, mkl, openblas"):
        blas.choice()
    monkeypatch.setenv("BENDC_BLAS", " MKL ")
    assert blas.choice() == "mkl"


def test_openblas_is_numpys_at_one_thread_only():
    report = child_report(CHOSEN, "plain", BENDC_BLAS="openblas")
    assert report["name"].startswith("numpy's OpenBLAS") and not report["any_thread"] and report["ilp64"]
    assert report["error"] < 1e-4


@needs_mkl
@pytest.mark.parametrize("order", ["plain", "torch first"])
def test_mkl_runs_sequential_at_any_thread_count(order):
    report = child_report(CHOSEN, order, BENDC_BLAS="mkl", MKL_THREADING_LAYER="INTEL")
    assert report["name"].startswith("MKL") and report["name"].endswith("(sequential)"), report["name"]
    assert report["any_thread"] and report["ilp64"]
    assert report["error"] < 1e-4


@needs_mkl
def test_mkl_already_threaded_in_the_process_is_left_alone():
    """Another library ran MKL threaded before bendc asked (numpy linked to MKL would): MKL keeps
    that layer, so bendc takes numpy's OpenBLAS instead of a threaded sgemm inside its pool."""
    code = textwrap.dedent('''
        import ctypes, json
        from runtime.native import blas
        library = ctypes.CDLL(blas.mkl_library())
        library.MKL_Set_Threading_Layer(0)  # MKL_THREADING_INTEL, as a threaded user sets it
        library.MKL_Get_Max_Threads()
        print(json.dumps({"name": blas.sgemm().name}))
    ''')
    report = child_report(code, BENDC_BLAS="mkl")
    assert report["name"].startswith("numpy's OpenBLAS"), report["name"]


@needs_mkl
def test_a_step_trains_alike_on_either_blas():
    """The mlp's step on MKL and on OpenBLAS, 1 and 2 threads: losses and parameters within float32
    rounding of each other (other sgemms, other last bits), each the same on a second run."""
    code = textwrap.dedent('''
        import json
        import numpy as np
        import bendc
        import bendc.functional as F
        from runtime.native import blas

        rng = np.random.default_rng(0)
        x, y = rng.standard_normal((96, 64)).astype(np.float32), rng.standard_normal((96, 10)).astype(np.float32)
        w1 = rng.standard_normal((48, 64)).astype(np.float32) * 0.1
        w2 = rng.standard_normal((10, 48)).astype(np.float32) * 0.1
        b1, b2 = np.zeros(48, np.float32), np.zeros(10, np.float32)

        @bendc.jit(leaves=("w1", "b1", "w2", "b2"))
        def step(x, y, w1, b1, w2, b2):
            loss = F.mse_loss(F.linear(F.relu(F.linear(x, w1, b1)), w2, b2), y)
            loss.backward()
            return loss, w1.grad, b1.grad, w2.grad, b2.grad

        losses = []
        for _ in range(3):
            loss, g1, gb1, g2, gb2 = step(x, y, w1, b1, w2, b2)
            w1, b1, w2, b2 = w1 - 0.1 * g1, b1 - 0.1 * gb1, w2 - 0.1 * g2, b2 - 0.1 * gb2
            losses.append(float(loss))
        print(json.dumps({"name": blas.sgemm().name, "losses": losses}))
    ''')
    runs = {(library, threads): child_report(code, threads=threads, BENDC_BLAS=library)
            for library in ("mkl", "openblas") for threads in ("1", "2")}
    assert runs[("mkl", "1")]["name"].startswith("MKL") and runs[("openblas", "1")]["name"].startswith("numpy")
    reference = np.array(runs[("openblas", "1")]["losses"])
    for key, run in runs.items():
        assert np.allclose(run["losses"], reference, rtol=1e-5, atol=0), key


@needs_mkl
def test_a_numpy_built_on_mkl_keeps_its_mkl(monkeypatch):
    """conda's numpy links MKL itself: bendc would set that library sequential under the user's
    numpy, so it takes no MKL there (numpy's own products keep their threads)."""
    monkeypatch.setattr(blas, "_numpy_blas", lambda: {"name": "mkl-sdl", "version": "2023.1"})
    assert blas._mkl() is None
    monkeypatch.setattr(blas, "_numpy_blas", lambda: {"name": "scipy-openblas", "version": "0.3.31"})
    assert blas._mkl() is not None, "numpy on OpenBLAS: the wheel's MKL is taken"
