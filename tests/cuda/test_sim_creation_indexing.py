"""Issue 22's tensor creation, PyTorch indexing and composite ops on the cuda target under numba's CUDA
simulator, against the reference interpreter (tiny shapes: a simulated thread costs ~170 us). Runs in
its own process (tests/cuda/run_simulator.sh); skipped elsewhere.

One tiny case each, written as users write them (torch functions inside the traced step):
- creation: torch.arange (int and float), zeros / ones / full, eye, linspace, torch.tensor, F.one_hot
  (and the *_like forms), folded into arithmetic with a leaf; an integer torch.where and clamp;
- indexing: a list index, an int-tensor index (a negative entry too), None, negative steps, index
  assignment (a slice, a list, a mask), a boolean mask into a sum;
- composites: einsum (a batched contraction, an outer product), roll, repeat_interleave, any / all.

Values that only move, count or make numbers (the created tensors, the picked and rolled values, the
any/all flags) match the reference bit for bit; the sums, the einsums, the losses and the gradients
within the conftest tolerances."""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1" or importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("CUDA simulator tests run in their own process: tests/cuda/run_simulator.sh "
                "(needs numba-cuda and NUMBA_ENABLE_CUDASIM=1)", allow_module_level=True)

torch = pytest.importorskip("torch")
TF = torch.nn.functional

from cuda_programs import Program  # noqa: E402
from test_simulator import check_program  # noqa: E402


def made(x, w):
    t = x.shape[1]
    h = x * w
    pos = torch.arange(0, t, dtype=torch.long, device=x.device)
    constants = (torch.zeros(2, t, device=x.device) + torch.ones(t) * 2 + torch.full((t,), 0.5) + torch.eye(2, t)
                 + torch.linspace(-1, 3, t) + torch.tensor([1.0, 2.0, 3.0, 4.0])[:t] + pos.float()
                 + torch.arange(0.5, t, 1.0) + torch.zeros_like(h) + torch.full_like(h, -2.0))
    onehot = TF.one_hot(torch.tensor([0, 3, 1]), t)
    loss = (h * (constants + onehot.float().sum(0))).sum()
    loss.backward()
    return constants * x, pos + 1, onehot, loss, w.grad, torch.where(pos > 1, pos, 0).clamp(max=2)


def indexed(x, w, idx):
    h = x * w
    picked = [h[:, [-1], :], h[idx], h[:, None, :, 1:], h[::-1], h[:, ::-2], h[0, idx]]
    y = h.clone()
    y[:, 0] = 3.0
    y[1, [2, 0]] = h[0, :2] * h[1, 1]
    y[y < -0.5] = 0.25
    masked = h[h > 0].sum()
    loss = sum((p * p).sum() for p in picked) + (y * y).sum() + masked
    loss.backward()
    return (*picked, y, masked, loss, w.grad)


def composites(a, b, v, counts):
    values = [torch.einsum("bij,bjk->bik", a, b), torch.einsum("i,j->ij", v, v), a.roll(1, 2),
              torch.roll(a, (1, -1), (0, 1)), b.repeat_interleave(2, dim=1), torch.repeat_interleave(v, 2)]
    flags = [a.any(), (a > 0).all(1), counts.any(0), torch.all(counts, 1, keepdim=True), a.relu().all(2)]
    loss = sum((value * value).sum() for value in values)
    loss.backward()
    return (*values, *flags, loss, a.grad, b.grad, v.grad)


def _made_inputs(rng):
    return rng.standard_normal((2, 4)).astype(np.float32), rng.standard_normal((2, 4)).astype(np.float32)


def _indexed_inputs(rng):
    return (rng.standard_normal((2, 3, 4)).astype(np.float32), rng.standard_normal((2, 3, 4)).astype(np.float32),
            np.array([1, -1, 0], np.int64))


def _composite_inputs(rng):
    a = rng.standard_normal((2, 3, 2)).astype(np.float32)
    a[1, 2, 1] = 0.0  # a row with a zero: all() is False there, relu's zeros too
    return (a, rng.standard_normal((2, 2, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32),
            np.array([[0, 1, 2], [0, 0, 0]], np.int64))


PROGRAMS = [
    Program("creation", made, ("w",), _made_inputs, frozenset({"elementwise"}), bitwise=(1, 2, 5)),
    Program("indexing", indexed, ("w",), _indexed_inputs, frozenset({"elementwise"}), bitwise=(0, 1, 2, 3, 4, 5, 6)),
    Program("composites", composites, ("a", "b", "v"), _composite_inputs, frozenset({"elementwise"}),
            bitwise=(2, 3, 4, 5, 6, 7, 8, 9, 10)),
]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cuda-creation-indexing-kernels"))


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_program_matches_reference(program, cache_dir: str) -> None:
    check_program(program, cache_dir)
