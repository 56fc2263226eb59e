"""Recompiles you can see and bound: static vs dynamic scalars, the log, the limit, signatures()."""
from __future__ import annotations

import logging

import numpy as np
import pytest

import bendc


def _scaled():
    @bendc.jit(target="reference")
    def scaled(x, lr):
        return x * lr
    return scaled


def test_each_recompile_is_logged_with_its_reason(monkeypatch, caplog):
    monkeypatch.setenv("BENDC_LOG", "recompiles")
    step = _scaled()
    x = np.ones((2, 3), np.float32)
    with caplog.at_level(logging.INFO, logger="bendc"):
        step(x, 0.1)
        step(x, 0.1)
        assert not caplog.records  # the first compile is no recompile
        step(x, 0.2)
        step(np.ones((4, 3), np.float32), 0.2)
    messages = [r.getMessage() for r in caplog.records if r.name == "bendc"]
    assert len(messages) == 2
    assert "lr: static 0.1 -> static 0.2" in messages[0]
    assert "x: f32[2,3] -> f32[4,3]" in messages[1]
    assert [s["lr"] for s in step.signatures()] == ["static 0.1", "static 0.2", "static 0.2"]


def test_no_log_without_bendc_log(monkeypatch, caplog):
    monkeypatch.delenv("BENDC_LOG", raising=False)
    step = _scaled()
    with caplog.at_level(logging.INFO, logger="bendc"):
        for lr in (0.1, 0.2):
            step(np.ones(2, np.float32), lr)
    assert not [r for r in caplog.records if r.levelno < logging.WARNING]


def test_dynamic_scalars_are_traced_values_with_one_signature():
    @bendc.jit(target="cpu", dynamic=("lr",))
    def scaled(x, lr):
        return x * lr

    x = np.ones(3, np.float32)
    for lr in (0.5, 0.25, 2, 0.125):
        np.testing.assert_array_equal(scaled(x, lr), np.float32(lr) * x)
    np.testing.assert_array_equal(scaled(x=x, lr=3.0), 3.0 * x)  # keyword call: the bound path
    assert scaled.signatures() == [{"x": "f32[3]", "lr": "dynamic f32[]"}]
    assert "%lr: f32[]" in scaled.ir("traced")


def test_a_warning_past_the_recompile_limit():
    @bendc.jit(target="reference", recompile_limit=2)
    def scaled(x, factor):
        return x * factor

    x = np.ones(2, np.float32)
    scaled(x, 1.0)
    scaled(x, 2.0)
    with pytest.warns(bendc.RecompileWarning, match="recompile_limit of 2.*factor: static 2.0 -> static 3.0"):
        scaled(x, 3.0)
    assert len(scaled.signatures()) == 3


def test_dynamic_names_a_parameter():
    with pytest.raises(bendc.SignatureError, match="dynamic"):
        bendc.jit(lambda x: x, dynamic=("lr",))
