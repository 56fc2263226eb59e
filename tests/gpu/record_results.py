"""A pytest plugin for tests/gpu/device_check.sh: one JSON line per test appended (and flushed) to
$BENDC_RESULTS as soon as the test ends, with the stage ($BENDC_STAGE), so a stage killed at its
time limit still leaves what it found. Loaded with ``-p record_results`` (tests/gpu on
PYTHONPATH)."""
from __future__ import annotations

import json
import os


def pytest_runtest_logreport(report) -> None:
    path = os.environ.get("BENDC_RESULTS")
    if not path:
        return
    if report.when != "call" and not (report.failed or report.skipped):
        return  # setup and teardown: only when they fail or skip
    record = {"stage": os.environ.get("BENDC_STAGE", ""), "test": report.nodeid, "when": report.when,
              "outcome": report.outcome, "seconds": round(report.duration, 2)}
    if report.failed:
        record["message"] = str(report.longrepr).strip().splitlines()[-1][:300] if report.longrepr else ""
    with open(path, "a", encoding="utf-8") as stream:
        stream.write(json.dumps(record) + "\n")
        stream.flush()
