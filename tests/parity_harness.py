"""The parity harness: run one program through bendc and through PyTorch eager, compare.

Every program is written once against the common API (Tensor methods plus an
``F`` namespace) and run through ``bendc.jit`` on each target (``reference``
and ``cpu``) and through torch with ``requires_grad`` leaves. The harness
calls ``backward()`` on the result (a seed of ones for a scalar, a fixed
random seed otherwise, which is exactly ``backward(gradient=seed)`` in both
systems) and compares the value and every leaf's gradient.

A test module uses it with ``from parity_harness import target`` (the autouse
fixture that runs each test on every target) and ``parity``; the torch side
of functions torch lacks (``rope``) is written here with torch ops.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import pytest
import torch

import bendc
import bendc.functional as BF
from conftest import ATOL, RTOL, assert_bitwise, assert_close


# ------------------------------------------------------------------ the two F namespaces
class _TorchF:
    """torch.nn.functional with the elementwise and index functions bendc.functional also has, and rope."""

    def __getattr__(self, name: str) -> Any:
        if name in ("exp", "log", "sqrt", "square", "tanh", "sigmoid", "index_select", "gather"):
            return getattr(torch, name)
        return getattr(torch.nn.functional, name)

    @staticmethod
    def cross_entropy(logits, target, *args, **kwargs):
        # torch's nll_loss takes int64 (or uint8) targets only; bendc also takes int32.
        # The class indices are the same, so widening here keeps the reference identical.
        return torch.nn.functional.cross_entropy(logits, target.long(), *args, **kwargs)

    @staticmethod
    def nll_loss(log_probs, target, *args, **kwargs):
        return torch.nn.functional.nll_loss(log_probs, target.long(), *args, **kwargs)

    @staticmethod
    def rope(x, cos, sin):
        """API.md's rope written with torch ops: cat(x1*cos - x2*sin, x2*cos + x1*sin)."""
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


TF = _TorchF()

# Every test runs on each of these targets (the cpu target compiles numba kernels).
TARGET = "reference"


@pytest.fixture(params=["reference", "cpu"], autouse=True)
def target(request):
    """Run the test with bendc on this target."""
    global TARGET
    TARGET = request.param
    yield request.param
    TARGET = "reference"


# ------------------------------------------------------------------ the harness
@dataclass
class Outcome:
    """What one system computed: the program's value and each leaf's gradient (None: no grad)."""

    value: np.ndarray
    grads: dict[str, np.ndarray | None]


def _named_function(names: Sequence[str], run: Callable[[tuple], Any]) -> Callable:
    """A plain function with the given parameter names (bendc.jit binds parameters by name)."""
    params = ", ".join(names)
    source = f"def program({params}):\n    return _run(({params},))\n"
    namespace: dict[str, Any] = {"_run": run}
    exec(source, namespace)  # noqa: S102 - names come from the test's own dict keys
    return namespace["program"]


def run_torch(body: Callable, inputs: dict[str, np.ndarray], leaves: Sequence[str],
              seed: np.ndarray | None) -> Outcome:
    tensors = {}
    for name, array in inputs.items():
        tensor = torch.from_numpy(np.array(array, copy=True))
        if name in leaves:
            tensor.requires_grad_(True)
        tensors[name] = tensor
    out = body(TF, **tensors)
    if seed is None:
        out.backward()
    else:
        out.backward(torch.from_numpy(np.array(seed, copy=True)))
    grads = {name: None if tensors[name].grad is None else tensors[name].grad.numpy() for name in leaves}
    return Outcome(out.detach().numpy(), grads)


def run_bendc(body: Callable, inputs: dict[str, np.ndarray], leaves: Sequence[str],
              seed: np.ndarray | None) -> Outcome:
    names = list(inputs) + (["seed_"] if seed is not None else [])

    def run(args: tuple):
        bound = dict(zip(names, args))
        seed_tensor = bound.pop("seed_", None)
        out = body(BF, **bound)
        if seed_tensor is None:
            out.backward()
        else:
            out.backward(seed_tensor)
        return out, tuple(bound[name].grad for name in leaves)

    step = bendc.jit(_named_function(names, run), leaves=tuple(leaves), target=TARGET)
    arrays = list(inputs.values()) + ([seed] if seed is not None else [])
    value, grads = step(*arrays)
    return Outcome(np.asarray(value), dict(zip(leaves, grads)))


def parity(body: Callable, inputs: dict[str, np.ndarray], leaves: Sequence[str] = (), *,
           exact: bool = False, exact_grads: bool | None = None, seed: Any = "auto",
           rtol: float = RTOL, atol: float = ATOL, grad_rtol: float | None = None,
           grad_atol: float | None = None) -> tuple[Outcome, Outcome]:
    """Run ``body`` through bendc and torch; compare the value and the leaves' gradients.

    ``seed="auto"``: a scalar result gets ``backward()``, any other a fixed random seed;
    ``seed="wide"``: a seed whose values span six decades (summation order shows).
    ``exact`` compares values bit for bit; ``exact_grads`` (default: ``exact``) the gradients.
    Returns (bendc, torch) outcomes for extra checks.
    """
    if isinstance(seed, str):
        probe = body(TF, **{n: torch.from_numpy(np.array(a, copy=True)) for n, a in inputs.items()})
        if seed == "wide":
            seed = wide(tuple(probe.shape), 98)
        else:
            seed = None if probe.ndim == 0 else normal(tuple(probe.shape), 99)
    expected = run_torch(body, inputs, leaves, seed)
    actual = run_bendc(body, inputs, leaves, seed)
    exact_grads = exact if exact_grads is None else exact_grads
    grad_rtol = rtol if grad_rtol is None else grad_rtol
    grad_atol = atol if grad_atol is None else grad_atol
    if exact:
        assert_bitwise(actual.value, expected.value, "value")
    else:
        assert_close(actual.value, expected.value, "value", rtol=rtol, atol=atol)
    for name in leaves:
        want, got = expected.grads[name], actual.grads[name]
        if want is None:
            assert got is None, f"grad of {name}: torch has None, bendc returned an array"
            continue
        assert got is not None, f"grad of {name}: bendc returned None, torch has a gradient"
        if exact_grads:
            assert_bitwise(got, want, f"grad of {name}")
        else:
            assert_close(got, want, f"grad of {name}", rtol=grad_rtol, atol=grad_atol)
    return actual, expected


# ------------------------------------------------------------------ inputs
def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


# np.asarray: a 0-d result must stay an ndarray (a numpy scalar would be a static argument).
def normal(shape, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    return np.asarray(_rng(seed).standard_normal(shape) * scale, dtype=np.float32)


def positive(shape, seed: int = 0, low: float = 0.5, high: float = 2.0) -> np.ndarray:
    """Away from zero: safe for log, sqrt and as a divisor."""
    return np.asarray(_rng(seed).uniform(low, high, shape), dtype=np.float32)


def wide(shape, seed: int = 0) -> np.ndarray:
    """Values over six decades, both signs, so that rounding and summation order show."""
    rng = _rng(seed)
    mantissa = rng.uniform(1.0, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
    return np.asarray(mantissa * 10.0 ** rng.integers(-3, 4, shape), dtype=np.float32)


def int_index(values, dtype=np.int64) -> np.ndarray:
    return np.asarray(values, dtype=dtype)


# ------------------------------------------------------------------ user errors
def assert_user_error(fn: Callable, args: Sequence[Any], kind: type, test_file: str, *words: str) -> None:
    """Tracing ``fn`` on the reference target raises ``kind`` naming the test's own file and ``words``."""
    step = bendc.jit(fn, target="reference")
    with pytest.raises(kind) as info:
        step(*args)
    message = str(info.value)
    assert test_file in message, message
    for word in words:
        assert word in message, message
