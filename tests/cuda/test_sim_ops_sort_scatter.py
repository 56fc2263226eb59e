"""Issue 22's products, sorts, scatters and float // and % on the cuda target under numba's CUDA
simulator, against the reference interpreter (tiny shapes: a simulated thread costs ~170 us). Runs in
its own process (tests/cuda/run_simulator.sh); skipped elsewhere.

The cumprod scan, the argsort rank kernel (ties and a NaN, both directions), the index-ordered
scatter_reduce kernel (every reduce, include_self both ways), gather's gradient (scatter_add, repeated
indices, index order), integer sorts, and the // (quotients past 2**24 too) and % scalars are compared bit
for bit with the reference; the gradients within the conftest tolerances. No zero divisor or
infinity reaches // and %: the simulator evaluates them with Python's float operators, which raise
there (compiled code gives torch's inf and NaN)."""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1" or importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("CUDA simulator tests run in their own process: tests/cuda/run_simulator.sh "
                "(needs numba-cuda and NUMBA_ENABLE_CUDASIM=1)", allow_module_level=True)

import bendc.functional as F  # noqa: E402
from cuda_programs import Program  # noqa: E402
from test_simulator import check_program  # noqa: E402


def sorts_and_products(x, w, n):
    a = x * w
    values, order = a.sort(dim=1, descending=True)
    up, _ = a.sort(dim=0)
    top, _ = a.topk(2, dim=1, largest=False)
    flipped = a.flip(1)
    loss = (values * x).sum() + (up * up).sum() + top.sum() + (flipped * x).sum() + a.prod(1).sum() \
        + (a.cumprod(1) * x).sum()
    loss.backward()
    nan_order = F.argsort(x * n, dim=1, descending=True), (x * n).argsort(dim=0)
    whole = (x * 2.0).long()  # an integer sort: ties in their order of position
    return (order, values, a.argsort(dim=1), a.cumprod(1), nan_order[0], nan_order[1], loss, w.grad,
            whole.sort(dim=1, descending=True, stable=True)[1], whole.int().sort(dim=0)[0])


def scatters_and_modulo(x, src, index, a, b):
    blocks = [x.scatter(0, index[:1], src[:1]), x.scatter_add(0, index, src)]
    for reduce in ("sum", "prod", "mean", "amax", "amin"):
        for include_self in (True, False):
            blocks.append(x.scatter_reduce(0, index, src, reduce, include_self=include_self))
    spread = F.cat(blocks, 1)
    (spread * spread).sum().backward()
    huge = (a * 1e20) // (b * 3e-10)  # quotients past 2**24: torch's float32 steps
    return spread, F.stack([a // b, a % b, a % -0.75, huge]), x.grad, src.grad


def gather_gradients(x, index_rows, index_columns, g_rows, g_columns):
    """gather's gradient (scatter_add) along both dims, indices repeated: x.grad is summed in index
    order, as the reference sums it, only where each output element's contributors are added in that
    order (1e8 and -1e8 among them: another order gives other bits)."""
    loss = (F.gather(x, 1, index_columns) * g_columns).sum() + (F.gather(x, 0, index_rows) * g_rows).sum()
    loss.backward()
    return x.grad


def _gather_inputs(rng):
    x = np.zeros((3, 4), np.float32)
    index_columns = np.array([[0, 0, 0, 0, 1, 3], [2, 2, 3, 2, 2, 2]], np.int64)   # rows 0-1 of 3
    g_columns = np.array([[1.0, 1e8, -1e8, 3.0, 0.5, 2.0], [-1e8, 7.0, 1.0, 1e8, 1.0, 0.25]], np.float32)
    index_rows = np.array([[1, 0, 2], [1, 0, 2], [1, 1, 2], [0, 0, 2], [1, 0, 2]], np.int64)  # columns 0-2 of 4
    g_rows = np.array([[1e8, 1.0, 3.0], [1.0, -1e8, 1e8], [-1e8, 1e8, -1e8], [5.0, -1e8, 1.0], [1.0, 1.0, 1.0]],
                      np.float32)
    return x, index_rows, index_columns, g_rows, g_columns


def _sort_inputs(rng):
    x = np.array([[1.0, 2.0, 2.0, -0.5], [0.0, -0.0, 3.0, 1.0], [2.0, 2.0, 2.0, -1.0]], np.float32)
    w = np.ones((3, 4), np.float32)  # keeps the ties of x
    n = np.ones((3, 4), np.float32)
    n[1, 3] = n[2, 0] = np.nan  # NaNs (no gradient reaches them): sorted as the largest
    return x, w, n


def _scatter_inputs(rng):
    x = np.round(rng.standard_normal((3, 3)) * 2.0).astype(np.float32)
    src = np.round(rng.standard_normal((2, 3)) * 2.0).astype(np.float32)
    src[0, 0] = src[1, 0] = 1.0
    src[1, 2] = 0.0
    index = np.array([[0, 2, 1], [0, 1, 1]], np.int64)
    a = np.array([5.5, -5.5, -0.0, 7.25, 0.1, 3.0], np.float32)
    b = np.array([2.0, 2.0, 3.0, -1.5, -0.3, 3.0], np.float32)
    return x, src, index, a, b


PROGRAMS = [
    Program("sorts_and_products", sorts_and_products, ("w",), _sort_inputs, frozenset({"row"}),
            bitwise=(0, 1, 2, 3, 4, 5, 8, 9)),
    Program("scatters_and_modulo", scatters_and_modulo, ("x", "src"), _scatter_inputs, frozenset({"scatter"}),
            bitwise=(0, 1)),
    Program("gather_gradients", gather_gradients, ("x",), _gather_inputs, frozenset({"scatter"}), bitwise=(0,)),
]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cuda-sort-scatter-kernels"))


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_program_matches_reference(program, cache_dir: str) -> None:
    check_program(program, cache_dir)


def test_gather_gradient_sums_in_index_order_without_atomics(cache_dir: str) -> None:
    """gather's backward on cuda: one thread per output element summing its contributors in index order
    (the reference's bits above, the same every run), no atomic add in any kernel of the step."""
    program = next(p for p in PROGRAMS if p.name == "gather_gradients")
    step = check_program(program, cache_dir)
    sources = step.kernels()
    assert any("scatter_add along dim 0" in text for text in sources.values())
    assert any("scatter_add along dim 1" in text for text in sources.values())
    atomics = [name for name, text in sources.items() if "atomic" in text]
    assert not atomics, f"kernels with atomics: {atomics}"
