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
    listed = {name for name, *_ in step._executable().run.program.program}  # less the views bound once
    assert listed <= launched
    assert all(s.convention == "view" for s in plan.steps if s.name in launched - listed)
    rows = [row for row in table.rows if row["kernel"] != "(launch overhead)"]
    assert {row["step"] for row in rows} == listed
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


def test_overhead_row_is_the_launch_list_run_with_its_kernels_off(step) -> None:
    """The (launch overhead) row times the launch list's own code (CpuProgram.time_launch_list): the
    driver's source with every kernel a no-op, so it writes nothing; and the stepped spans call a native
    kernel through the entry the launch list calls, not through the function object."""
    from bendc.profile import OVERHEAD

    inputs = mlp_inputs()
    step(*inputs)
    binding = step._bind(tuple(inputs), {})
    program = step._executable().run.program
    # other numbers than the call's: a kernel that ran would write other values into the buffers
    arrays = [value * 1.5 + 0.25 if value.dtype == np.float32 else np.array(value) for _, value in binding.arrays]
    buffers = [value for value in program.values if isinstance(value, np.ndarray)]
    before = [array.copy() for array in arrays + buffers]
    ticks = iter(range(0, 10**6, 7))  # a clock whose every call returns 7 more: each run 7 ticks
    assert program.time_launch_list(arrays, lambda: next(ticks), 5) == 7
    for array, copy in zip(arrays + buffers, before):
        np.testing.assert_array_equal(array, copy)  # no kernel ran: no input or bound buffer written

    natives = [kernel for _, kernel, _, _, view, _ in program.program
               if not view and getattr(kernel, "launcher", None) is not None and kernel.launcher is not kernel]
    assert natives, "the mlp has native kernels"
    calls = []  # the steps' native kernels called as function objects (a Python kernel's helpers may be)
    original = type(natives[0]).__call__  # (a call looks __call__ up on the type)
    type(natives[0]).__call__ = lambda self, *args: (calls.append(self) if self in natives else None, original(self, *args))[1]
    try:
        spans = program.time_steps(arrays, lambda: 0)
    finally:
        type(natives[0]).__call__ = original
    assert [name for name, _, _ in spans] == [name for name, *_ in program.program]
    assert not calls  # every native step ran through its entry, as the launch list runs it

    table = step.profile(*inputs, runs=2)
    overhead = next(row for row in table.rows if row["kernel"] == OVERHEAD)
    kernels = sum(row["total_ms"] for row in table.rows if row["kernel"] != OVERHEAD)
    assert table.step_ms == pytest.approx((kernels + overhead["total_ms"]) / 2)
