"""A dry run of the whole device script (tests/gpu/device_check.sh, BENDC_DRY_RUN=1) under numba's
CUDA simulator (tests/cuda/run_simulator.sh; skipped in any other process): the carried artifacts
are built (tests/gpu/carried.py), every stage runs, and $OUT holds what a device run would bring
back: each stage's line, each test's result as it ended, the logs and the summary."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    pytest.skip("the device script's dry run is part of the simulator run: tests/cuda/run_simulator.sh",
                allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
STAGES = ("info", "build_carried", "carried", "race", "grid", "jit", "parity")
GPU_ONLY = ("jit", "parity")


def test_the_device_scripts_dry_run_leaves_its_evidence(tmp_path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "BENDC_DRY_RUN": "1", "OUT": str(out), "BENDC_CARRIED": str(tmp_path / "carried"),
           "PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(["bash", "tests/gpu/device_check.sh"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=1800)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(path.name for path in out.iterdir()) == ["bench.log", "info.log", "results.jsonl", "stages.jsonl",
                                                          "summary.json", "tests.log"]  # the device tool brings 8
    stages = {line["name"]: line for line in map(json.loads, (out / "stages.jsonl").read_text().splitlines())}
    logs = (out / "info.log").read_text() + (out / "tests.log").read_text()
    for name in STAGES:
        # jit and parity are GPU-only: without one every module skips itself (pytest's exit 5: no test ran)
        allowed = (0, 5) if name in GPU_ONLY else (0,)
        assert stages[name].get("rc") in allowed and not stages[name]["timed_out"], (name, stages[name], logs[-3000:])
    assert stages["bench_mlp"] == {"name": "bench_mlp", "skipped": "dry run"}
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    passed = {(r["stage"], r["test"].split("::")[-1]) for r in results if r["outcome"] == "passed"}
    for stage, test in [("carried", "test_carried_artifact_runs_eager_and_graph_like_the_cpu_build[chain]"),
                        ("carried", "test_carried_artifact_runs_eager_and_graph_like_the_cpu_build[momentum]"),
                        ("carried", "test_carried_artifact_runs_eager_and_graph_like_the_cpu_build[mlp]"),
                        ("race", "test_outputs_fed_to_a_program_on_another_stream[copy]"),
                        ("race", "test_outputs_fed_to_a_program_on_another_stream[static]"),
                        ("grid", "test_the_tall_products_launches_are_within_the_limits")]:
        assert (stage, test) in passed, (stage, test, results)
    assert not [r for r in results if r["outcome"] == "failed"]
    assert {r["stage"] for r in results if r["outcome"] == "skipped"} >= set(GPU_ONLY)  # ran, and skipped themselves
    assert " PASSED" in (out / "tests.log").read_text()  # -v: a line per test, written as it ends
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tests"]["carried"]["passed"] == 3 and summary["info"]["problems"] == []
    assert summary["info"]["smoke_compile"].startswith("sm_90: ")
