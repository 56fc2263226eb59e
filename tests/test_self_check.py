"""Self-check mode: a deliberately broken kernel is found and named."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

import bendc
from bendc.check import KernelMismatchError
from bendc.ops import OPS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import flat_mlp as mlp  # noqa: E402


def mlp_inputs() -> list[np.ndarray]:
    x, y = mlp.make_data(mlp.BATCH)
    return [x, y, *mlp.init_params()]


def test_a_correct_program_passes_and_returns_its_outputs(tmp_path) -> None:
    checked = bendc.jit(mlp.train_step.fn, leaves=mlp.LEAVES, target="cpu", cache_dir=str(tmp_path), check="reference")
    plain = bendc.jit(mlp.train_step.fn, leaves=mlp.LEAVES, target="cpu", cache_dir=str(tmp_path))
    inputs = mlp_inputs()
    for got, want in zip(checked(*inputs), plain(*inputs)):
        np.testing.assert_array_equal(got, want)
    checked(*inputs)  # the fast path afterwards


def test_a_wrong_constant_in_one_kernel_is_named(tmp_path, monkeypatch) -> None:
    """relu's CPU body scaled by 1.01: the kernel holding relu (mlp.py's hidden layer) is named."""
    lowering = OPS["relu"].lowering
    broken = lambda a: f"(np.float32(0.0) if {a} < np.float32(0.0) else {a} * np.float32(1.01))"  # noqa: E731
    monkeypatch.setitem(OPS, "relu", dataclasses.replace(OPS["relu"], lowering=dataclasses.replace(lowering, scalar=broken)))
    step = bendc.jit(mlp.train_step.fn, leaves=mlp.LEAVES, target="cpu", cache_dir=str(tmp_path), check="reference")
    with pytest.raises(KernelMismatchError) as raised:
        step(*mlp_inputs())
    error = raised.value
    kernel = step.kernels()[error.step]
    assert "1.01" in kernel  # the named kernel is the broken one
    message = str(error)
    assert f"kernel {error.step} " in message and "relu@flat_mlp.py:" in message and "worst element" in message
    assert "mlp.py:" in message.splitlines()[0]
    assert isinstance(error, bendc.BendcError)


def test_bendc_check_turns_it_on(monkeypatch) -> None:
    monkeypatch.setenv("BENDC_CHECK", "1")
    assert bendc.jit(mlp.train_step.fn, leaves=mlp.LEAVES).check == "reference"
    monkeypatch.delenv("BENDC_CHECK")
    assert bendc.jit(mlp.train_step.fn, leaves=mlp.LEAVES).check is None
    with pytest.raises(bendc.BendcError, match="check='torch'"):
        bendc.jit(mlp.train_step.fn, leaves=mlp.LEAVES, check="torch")


def test_minify_writes_a_repro_of_the_broken_kernel_alone(tmp_path, monkeypatch) -> None:
    import runpy

    from bendc.minify import write_repro

    lowering = OPS["relu"].lowering
    broken = lambda a: f"(np.float32(0.0) if {a} < np.float32(0.0) else {a} * np.float32(1.01))"  # noqa: E731
    with monkeypatch.context() as patch:
        patch.setitem(OPS, "relu", dataclasses.replace(OPS["relu"], lowering=dataclasses.replace(lowering, scalar=broken)))
        step = bendc.jit(mlp.train_step.fn, leaves=mlp.LEAVES, target="cpu", cache_dir=str(tmp_path), check="reference")
        with pytest.raises(KernelMismatchError) as raised:
            step(*mlp_inputs())
        repro = tmp_path / "repro.py"
        write_repro(raised.value, str(repro))
        text = repro.read_text()
        assert f"func @repro_{raised.value.step}(" in text and "relu" in text and "matmul" not in text
        assert runpy.run_path(str(repro), run_name="repro")["main"]() == 1  # reproduces with the bug
    assert runpy.run_path(str(repro), run_name="repro")["main"]() == 0  # and not once it is fixed


def test_an_index_out_of_range_is_still_the_users_error(tmp_path) -> None:
    step = bendc.jit(mlp.train_step.fn, leaves=mlp.LEAVES, target="cpu", cache_dir=str(tmp_path), check="reference")
    x, y, *params = mlp_inputs()
    y = y.copy()
    y[0] = 99
    with pytest.raises(bendc.BendcError, match=f"flat_mlp.py:{mlp.line_of('loss = F.cross_entropy')}") as raised:
        step(x, y, *params)
    assert not isinstance(raised.value, KernelMismatchError)
