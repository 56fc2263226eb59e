"""The profiler's table: structure only (every kernel present, shares summing to the step, names that
map to source lines), never wall-time values."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import bendc
from bendc import cli
from bendc.ir.parser import parse_graph

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import flat_mlp as mlp  # noqa: E402


@pytest.fixture
def step(tmp_path):
    return bendc.jit(mlp.train_step.fn, leaves=mlp.LEAVES, target="cpu", cache_dir=str(tmp_path))


def mlp_inputs() -> list[np.ndarray]:
    x, y = mlp.make_data(mlp.BATCH)
    return [x, y, *mlp.init_params()]


def test_profile_table_covers_every_kernel(step, tmp_path) -> None:
    inputs = mlp_inputs()
    before = [a.copy() for a in inputs]
    table = step.profile(*inputs, runs=3)
    for a, b in zip(inputs, before):
        np.testing.assert_array_equal(a, b)  # the profiled runs leave the caller's arrays alone
    from bendc.codegen.plan import build_plan

    plan = build_plan(parse_graph(step.ir("final")))
    launched = {s.name for s in plan.steps if not s.hoisted}
    rows = [row for row in table.rows if row["kernel"] != "(launch overhead)"]
    assert {row["step"] for row in rows} == launched
    assert abs(sum(row["share"] for row in table.rows) - 1.0) < 1e-9
    assert all(row["calls"] == 3 and row["total_ms"] >= 0 for row in table.rows)
    assert [row["total_ms"] for row in table.rows] == sorted((row["total_ms"] for row in table.rows), reverse=True)
    for row in rows:
        assert set(row) >= {"kernel", "source_lines", "calls", "total_ms", "mean_ms", "share"}
        name, _, line = row["kernel"].rpartition("@")
        assert re.fullmatch(r"[a-z_0-9]+", name), row["kernel"]
        assert line in row["source_lines"] and line.startswith("flat_mlp.py:"), row
        assert not re.search(r"k_[0-9a-f]{8}", row["kernel"])  # no hash names
    assert any(row["kernel"].startswith("fused_") for row in rows)
    text = str(table)
    assert "total ms" in text and all(row["kernel"][:44] in text for row in rows)


def test_bendc_profile_writes_a_chrome_trace(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("BENDC_CACHE_DIR", str(tmp_path / "cache"))
    trace = tmp_path / "trace.json"
    assert cli.main(["profile", f"{ROOT / 'tests' / 'flat_mlp.py'}:train_step", "--runs", "2",
                     "--chrome", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "bendc profile of train_step: 2 runs" in out and f"matmul@flat_mlp.py:{mlp.line_of('hidden = F.relu(F.linear(x')}" in out
    events = json.loads(trace.read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") != "step"]
    assert all(e["ph"] == "X" and e["dur"] >= 0 and "step" in e["args"] for e in kernels)
    assert sum(1 for e in events if e.get("cat") == "step") == 2
