"""bench/run.py's alternating rounds: the order steps run in and which figure each lands in (no
timing is asserted: only the calls and the counts)."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import run  # noqa: E402


def _recording(calls: list, name: str):
    return lambda: calls.append(name)


def test_each_turn_runs_its_steps_in_a_row_and_its_first_is_reported_apart(monkeypatch) -> None:
    monkeypatch.setattr(run, "TURN_SECONDS", 0.0)  # turns of exactly `block` steps
    monkeypatch.setattr(run, "TURN_PAUSE", 0.0)
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


def test_a_turn_of_short_steps_lasts_turn_seconds(monkeypatch) -> None:
    """Steps of 1 ms (a fake clock) in turns of at least 4 steps and 10.5 ms: 11 steps a turn."""
    clock = [0.0]

    def step() -> None:
        clock[0] += 0.001

    monkeypatch.setattr(run, "TURN_SECONDS", 0.0105)
    monkeypatch.setattr(run, "TURN_PAUSE", 0.0)
    monkeypatch.setattr(run.time, "perf_counter", lambda: clock[0])
    firsts: dict = {}
    times = run.interleaved_times({"short": step}, runs=2, warmup=0, block=4, firsts=firsts)
    assert (len(times["short"]), len(firsts["short"])) == (2 * 10, 2)
