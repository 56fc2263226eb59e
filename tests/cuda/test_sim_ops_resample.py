"""Issue 22's batch_norm (torch.batch_norm's order too), transposed convolutions, interpolation (bicubic,
trilinear and area too), unflatten and pad modes on the cuda target under
numba's CUDA simulator, against the reference interpreter (tiny shapes: a simulated thread costs
~170 us). Runs in its own process (tests/cuda/run_simulator.sh); skipped elsewhere.

The pads and the nearest interpolation move values, bit for bit; the rest (sums, weights, statistics)
and the gradients within the conftest tolerances."""
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


def moves(x):
    """Pads and nearest interpolation: gathers of x, exact."""
    return (F.pad(x, (1, 1, 1, 0), mode="reflect"), F.pad(x, (0, 2, 1, 1), mode="replicate"),
            F.pad(x, (1, 2, 0, 1), mode="circular"), F.interpolate(x, scale_factor=(1.5, 2.0), mode="nearest"))


def resampled_and_normalized(x, w, g, rm, rv):
    """conv_transpose2d (strided, output_padding), bilinear both ways, batch_norm training (the running
    statistics updated) and eval, with the gradients of x, w and g."""
    up = F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1)
    smooth = F.interpolate(x, size=(3, 5), mode="bilinear") + F.interpolate(x, size=(3, 5), mode="bilinear",
                                                                           align_corners=True)
    mean, var = rm * 1.0, rv * 1.0
    normed = F.batch_norm(up, mean, var, g, None, True, 0.1, 1e-5)
    evaluated = F.batch_norm(x, rm, rv, None, None, False)
    loss = (normed * normed).sum() + (smooth * smooth).sum() + (evaluated * up[:, :, :2, :3]).sum()
    loss.backward()
    return loss, normed, mean, var, x.grad, w.grad, g.grad


def more_modes(x, x5, g, b):
    """bicubic both ways, trilinear, area, torch.batch_norm (aten's order) and unflatten, with gradients."""
    import torch

    bicubic = F.interpolate(x, size=(3, 4), mode="bicubic") + F.interpolate(x, size=(3, 4), mode="bicubic",
                                                                          align_corners=True)
    tri = F.interpolate(x5, size=(2, 2, 3), mode="trilinear")
    area = F.interpolate(x, size=(1, 2), mode="area")
    normed = torch.batch_norm(x, g, b, None, None, True, 0.1, 1e-5, False).unflatten(1, (1, 2))
    loss = (bicubic * bicubic).sum() + (tri * tri).sum() + (area * area).sum() + (normed * normed[..., :1]).sum()
    loss.backward()
    return loss, bicubic, tri, area, normed, x.grad, x5.grad, g.grad


def _normal(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


PROGRAMS = [
    Program("moves", moves, (), lambda rng: (_normal(rng, 1, 2, 2, 3),), frozenset(), bitwise=(0, 1, 2, 3)),
    Program("resampled_and_normalized", resampled_and_normalized, ("x", "w", "g"), lambda rng: (
        _normal(rng, 1, 2, 2, 3), _normal(rng, 2, 2, 3, 3), _normal(rng, 2),
        _normal(rng, 2), (rng.random(2) + 0.5).astype(np.float32)), frozenset()),
    Program("more_modes", more_modes, ("x", "x5", "g"), lambda rng: (
        _normal(rng, 1, 2, 2, 3), _normal(rng, 1, 1, 2, 2, 2), _normal(rng, 2), _normal(rng, 2)), frozenset()),
]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cuda-resample-kernels"))


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_program_matches_reference(program, cache_dir: str) -> None:
    check_program(program, cache_dir)
