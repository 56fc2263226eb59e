"""bench/run.py's alternating rounds: the order steps run in and which figure each lands in (no
timing is asserted: only the calls and the counts)."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import run  # noqa: E402


def _recording(calls: list, name: str):
    return lambda: calls.append(name)


def test_each_turn_runs_its_steps_in_a_row_and_its_first_is_reported_apart() -> None:
    calls: list = []
    fns = {"bendc": _recording(calls, "bendc"), "torch": _recording(calls, "torch")}
    firsts: dict = {}
    times = run.interleaved_times(fns, runs=3, warmup=1, block=4, firsts=firsts)
    assert calls[:2] == ["bendc", "torch"]  # the warm-up
    assert calls[2:] == (["bendc"] * 4 + ["torch"] * 4) * 3
    assert {name: len(values) for name, values in times.items()} == {"bendc": 9, "torch": 9}
    assert {name: len(values) for name, values in firsts.items()} == {"bendc": 3, "torch": 3}


def test_one_step_a_turn_keeps_every_step() -> None:
    calls: list = []
    firsts: dict = {}
    times = run.interleaved_times({"a": _recording(calls, "a"), "b": _recording(calls, "b")}, runs=5, warmup=0,
                                  firsts=firsts)
    assert calls == ["a", "b"] * 5
    assert [len(times["a"]), len(times["b"]), firsts] == [5, 5, {}]
