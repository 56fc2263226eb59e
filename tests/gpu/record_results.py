"""A pytest plugin for tests/gpu/device_check.sh: one JSON line per test appended (and flushed) to
$BENDC_RESULTS as soon as the test ends, with the stage ($BENDC_STAGE), so a stage killed at its
time limit still leaves what it found. Loaded with ``-p record_results`` (tests/gpu on
PYTHONPATH)."""
from __future__ import annotations

import json
import os


def _append(report, when: str, seconds: float) -> None:
    path = os.environ.get("BENDC_RESULTS")
    if not path:
        return
    record = {"stage": os.environ.get("BENDC_STAGE", ""), "test": report.nodeid, "when": when,
              "outcome": report.outcome, "seconds": round(seconds, 2)}
    if report.failed or report.skipped:
        text = str(report.longrepr).strip() if report.longrepr else ""
        record["message"] = text.splitlines()[-1][:300] if text else ""
    with open(path, "a", encoding="utf-8") as stream:
        stream.write(json.dumps(record) + "\n")
        stream.flush()


def pytest_runtest_logreport(report) -> None:
    if report.when == "call" or report.failed or report.skipped:  # setup, teardown: when they fail or skip
        _append(report, report.when, report.duration)


def pytest_collectreport(report) -> None:
    """A module that skips itself (no GPU) or fails to import: one line, as for a test."""
    if report.failed or report.skipped:
        _append(report, "collect", 0.0)
