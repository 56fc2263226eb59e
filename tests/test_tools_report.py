"""The compile report's summary (fused kernels, the static peak of memory), nodes named by op and
user line, repeated reasons grouped; BENDC_DUMP_DIR on a cache hit."""
from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import numpy as np

import bendc
from bendc.ir.parser import parse_graph
from bendc.reporting import group_decisions, node_name

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import flat_mlp as mlp  # noqa: E402


def mlp_step(cache_dir: Path):
    return bendc.jit(mlp.train_step.fn, leaves=mlp.LEAVES, target="cpu", cache_dir=str(cache_dir))


def mlp_inputs() -> list[np.ndarray]:
    x, y = mlp.make_data(mlp.BATCH)
    return [x, y, *mlp.init_params()]


def test_report_summary_names_nodes_and_gives_the_peak(tmp_path) -> None:
    step = mlp_step(tmp_path)
    step(*mlp_inputs())
    report = step.report()
    match = re.search(r"kernels: (\d+) kernels \((\d+) fused, holding (\d+) nodes\)", report)
    assert match and 0 < int(match[2]) <= int(match[1]), report
    assert re.search(r"memory: static peak .* of live temporaries \(at \w+\); planned buffers", report), report
    stats = step.stats()
    assert stats["planned_bytes"] <= stats["naive_bytes"]
    # pass decisions name their nodes by op and the user's line
    assert re.search(r"%\d+ [a-z_]+@flat_mlp\.py:\d+", report), report


def test_plan_peak_is_at_most_the_planned_buffers(tmp_path) -> None:
    from bendc.codegen.memory import plan_memory
    from bendc.codegen.plan import build_plan

    step = mlp_step(tmp_path)
    step(*mlp_inputs())
    graph = parse_graph(step.ir("final"))
    plan = build_plan(graph)
    plan_memory(plan)
    assert 0 < plan.memory["peak_bytes"] <= plan.memory["planned_bytes"] <= plan.memory["naive_bytes"]
    assert plan.memory["peak_step"] in {s.name for s in plan.steps}


def test_repeated_reasons_are_grouped(tmp_path) -> None:
    step = mlp_step(tmp_path)
    step(*mlp_inputs())
    graph = parse_graph(step.ir("final"))
    ids = graph.order()[:6]
    decisions = [("fuse", f"not fused %{ids[0]} -> %{ids[1]}: matmul is a matmul kernel"),
                 ("fuse", f"not fused %{ids[2]} -> %{ids[3]}: matmul is a matmul kernel"),
                 ("fuse", f"not fused %{ids[4]} -> %{ids[5]}: permute is a layout kernel")]
    lines = group_decisions(decisions, graph)
    assert len(lines) == 2
    assert lines[0].startswith("[fuse] not fused: matmul is a matmul kernel (2x): ")
    assert f"{node_name(graph, ids[0])} -> {node_name(graph, ids[1])}" in lines[0]
    assert lines[1] == f"[fuse] not fused {node_name(graph, ids[4])} -> {node_name(graph, ids[5])}: " \
                       "permute is a layout kernel"


def test_dump_dir_gets_every_stage_on_a_cache_hit(tmp_path, monkeypatch) -> None:
    inputs = mlp_inputs()
    monkeypatch.setenv("BENDC_DUMP_DIR", str(tmp_path / "first"))
    first = mlp_step(tmp_path / "cache")
    first(*inputs)
    monkeypatch.setenv("BENDC_DUMP_DIR", str(tmp_path / "second"))
    second = mlp_step(tmp_path / "cache")  # a new function object: the on-disk cache serves it
    second(*inputs)
    assert "[cache] loaded" in second.report()
    dumped = lambda run: sorted(p.name for p in (tmp_path / run / "train_step").iterdir())  # noqa: E731
    assert dumped("second") == dumped("first") and len(dumped("first")) == len(first.stages())
    for name in dumped("second"):
        assert (tmp_path / "second" / "train_step" / name).read_text() == second.ir(name[3:-3])


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_on_a_terminal_only(tmp_path) -> None:
    from bendc.progress import CompileWatch

    inputs = mlp_inputs()
    terminal = _Terminal()
    with CompileWatch(terminal, delay=0.0) as watch:
        mlp_step(tmp_path / "a")(*inputs)
    assert watch.functions > 0 and watch.total >= watch.functions
    assert f"bendc: compiling kernels {watch.functions}/{watch.total}" in terminal.getvalue()
    pipe = io.StringIO()
    with CompileWatch(pipe, delay=0.0) as quiet:
        bendc.jit(mlp.train_step.fn, leaves=mlp.LEAVES, target="cpu", cache_dir=str(tmp_path / "b"),
                  passes=["dce", "cse"])(*inputs)
    assert quiet.functions > 0 and pipe.getvalue() == ""


def test_bendc_cache_lists_and_clears(tmp_path, capsys) -> None:
    from bendc import cli

    cache = tmp_path / "cache"
    mlp_step(cache)(*mlp_inputs())
    (cache / "unrelated.txt").write_text("not bendc's")
    assert cli.main(["cache", "--dir", str(cache)]) == 0
    out = capsys.readouterr().out
    assert f"bendc cache {cache}: 1 programs" in out
    assert re.search(r"train_step\s+[\d.]+ (KiB|MiB)\s+\d+ s\s+x=f32\[64,64\] y=i64\[64\] w1=f32\[128,64\]:leaf", out), out
    assert re.search(r"^total [\d.]+ (KiB|MiB): programs ", out, re.M), out
    assert cli.main(["cache", "clear", "--dir", str(cache)]) == 0
    assert "cleared" in capsys.readouterr().out
    assert sorted(p.name for p in cache.iterdir()) == ["unrelated.txt"]
    assert cli.main(["cache", "--dir", str(cache)]) == 0
    assert ": 0 programs" in capsys.readouterr().out
