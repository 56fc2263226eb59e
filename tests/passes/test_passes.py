"""Passes: DCE and CSE, the pipeline, custom passes, dumps and the report.

Every pass must leave the reference interpreter's results unchanged bit for
bit (DESIGN.md principle 2); DCE and CSE only drop or share work, so they are
checked with ``assert_bitwise``.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bendc
import bendc.functional as F
from bendc.ir.graph import Graph
from bendc.ir.interp import interpret
from bendc.ir.parser import parse_graph
from bendc.ir.printer import format_graph
from bendc.ir.types import f32
from bendc.ir.verify import verify
from bendc.passes import PASSES, Pass, PassContext, Pipeline, default_passes
from conftest import assert_bitwise


def rng_f32(shape, seed):
    return np.random.default_rng(seed).uniform(-2.0, 2.0, size=shape).astype(np.float32)


def ops_of(text: str) -> list[str]:
    return [node.op for node in parse_graph(text).nodes() if node.op != "param"]


# ------------------------------------------------------------------ programs
def with_dead_code(x, w, unused):
    dead = (x * 3.0).exp()
    also_dead = F.softmax(w, 0) + dead
    loss = F.mse_loss(x * w, x)
    loss.backward()
    return loss, w.grad


def with_duplicates(x, w):
    a = (x.exp() * w).sum()
    b = (x.exp() * w).sum()
    zero, negative_zero = x * 0.0, x * -0.0  # equal under ==, different bits
    rows, cols = (x * w).sum(0), (x * w).sum(1)
    soft0, soft1 = (x * w).softmax(0), (x * w).softmax(1)
    exact, approx = F.gelu(x * w), F.gelu(x * w, approximate="tanh")
    forward, backward = x - w, w - x
    loss = a + b + (rows * cols).sum() + (soft0 * soft1).sum() + (exact - approx).sum() + (forward * backward).sum()
    loss.backward()
    return loss, w.grad, zero, negative_zero, forward, backward


def mlp(x, target, w1, b1, w2, b2):
    h = F.relu(F.linear(x, w1, b1))
    loss = F.cross_entropy(F.linear(h, w2, b2), target)
    loss.backward()
    return loss, w1.grad, b1.grad, w2.grad, b2.grad


def indexing(x, index, w):
    y = x * w
    loss = F.index_select(y, 0, index).sum() + y[1:, ::2].sum() + y[0].tanh().sum() + y[0].tanh().sum()
    loss.backward()
    return loss, w.grad


def adam_like(p, g, m, v, w):
    loss = (p * w).sum()
    loss.backward()
    g = w.grad + g
    new_m = m * 0.9 + g * 0.1
    new_v = v * 0.999 + g * g * 0.001
    return new_m / ((new_v / 0.001).sqrt() + 1e-8), new_m, new_v


PROGRAMS = {
    "with_dead_code": (with_dead_code, ("w",), lambda: (rng_f32((3, 4), 0), rng_f32((3, 4), 1), rng_f32((2,), 2))),
    "with_duplicates": (with_duplicates, ("w",), lambda: (rng_f32((3, 3), 0), rng_f32((3, 3), 1))),
    "mlp": (mlp, ("w1", "b1", "w2", "b2"), lambda: (
        rng_f32((4, 5), 0), np.array([0, 2, 1, 2], dtype=np.int64), rng_f32((6, 5), 1), rng_f32((6,), 2),
        rng_f32((3, 6), 3), rng_f32((3,), 4))),
    "indexing": (indexing, ("w",), lambda: (rng_f32((3, 4), 0), np.array([2, 0, 2], dtype=np.int64),
                                            rng_f32((3, 4), 1))),
    "adam_like": (adam_like, ("w",), lambda: tuple(rng_f32((2, 3), s) for s in range(5))),
}


def compile_program(name: str, passes=("dce", "cse")):
    fn, leaves, make_inputs = PROGRAMS[name]
    step = bendc.jit(fn, leaves=leaves, target="reference", passes=list(passes))
    inputs = make_inputs()
    return step, inputs, step(*inputs)


def flat(outputs):
    return list(outputs) if isinstance(outputs, tuple) else [outputs]


def run_pass(name: str, graph: Graph) -> tuple[Graph, PassContext]:
    context = PassContext()
    result = PASSES[name].apply(graph.copy(), context)
    verify(result, name, allow_placeholders=False)
    return result, context


# ------------------------------------------------------------------ DCE
def test_dce_removes_what_no_output_needs_and_keeps_params():
    step, _, _ = compile_program("with_dead_code", passes=["dce"])
    before, after = step.ir("autodiff"), step.ir("dce")
    assert "exp" in ops_of(before) and "softmax" in ops_of(before)
    assert "exp" not in ops_of(after) and "softmax" not in ops_of(after)
    assert "%unused: f32[2]" in after.splitlines()[0]  # an unused parameter stays in the signature
    graph = parse_graph(after)
    needed = set(graph.params) | set(graph.outputs)
    for output in graph.outputs:
        needed |= graph.ancestors(output)
    assert set(graph.order()) == needed, "DCE left a node that no output needs"
    assert "removed" in step.report() and "[dce]" in step.report()


def test_dce_keeps_exactly_the_needed_nodes_of_a_hand_built_graph():
    graph = Graph("g")
    x = graph.add("param", (), {"name": "x", "leaf": False, "dtype": "f32", "shape": (2,)}, f32(2)).id
    unused = graph.add("param", (), {"name": "u", "leaf": True, "dtype": "f32", "shape": (2,)}, f32(2)).id
    a = graph.add("neg", (x,), {}, f32(2)).id
    dead_root = graph.add("exp", (a,), {}, f32(2)).id
    graph.add("exp", (dead_root,), {}, f32(2))
    kept = graph.add("mul", (a, a), {}, f32(2)).id
    graph.outputs = [kept, x]
    result, context = run_pass("dce", graph)
    assert result.order() == [x, unused, a, kept]
    assert result.params == [x, unused] and result.outputs == [kept, x]
    assert context.decisions == [("dce", "removed 2 dead nodes")]
    assert len(graph) == 6, "the pass ran on a copy"
    again, context = run_pass("dce", result)
    assert format_graph(again) == format_graph(result) and context.decisions == []


# ------------------------------------------------------------------ CSE
def test_cse_merges_duplicates_and_not_near_duplicates():
    step, inputs, outputs = compile_program("with_duplicates")
    before, after = parse_graph(step.ir("dce")), parse_graph(step.ir("cse"))
    assert len(after) < len(before)
    x, w = (p for p in after.params)

    def count(graph, op, operands=None, **attrs):
        return sum(1 for n in graph.nodes() if n.op == op and (operands is None or n.inputs == operands)
                   and all(n.attr.get(k) == v for k, v in attrs.items()))

    # x.exp() written twice, and exp(x) * w after it: one node each.
    assert count(before, "exp", (x,)) == 2 and count(after, "exp", (x,)) == 1
    # Near-duplicates differ in attributes and stay apart.
    assert count(after, "sum", dims=(0,), keepdim=False) >= 1 and count(after, "sum", dims=(1,), keepdim=False) >= 1
    assert count(after, "softmax", dim=0) == 1 and count(after, "softmax", dim=1) == 1
    assert count(after, "gelu", approximate="none") == 1 and count(after, "gelu", approximate="tanh") == 1
    assert count(after, "sub", (x, w)) == 1 and count(after, "sub", (w, x)) == 1
    consts = [n.attr["value"] for n in after.nodes() if n.op == "const"]
    assert len(consts) == len({(v, str(v)) for v in consts}), "CSE left two equal constants"
    assert any(str(v) == "-0.0" for v in consts) and any(str(v) == "0.0" for v in consts)
    # No two nodes remain with the same op, operands and attributes (repr tells -0.0 from 0.0).
    keys = [(n.op, n.inputs, repr(n.attrs)) for n in after.nodes() if n.op != "param"]
    assert len(keys) == len(set(keys))
    # x * 0.0 and x * -0.0 keep their signs.
    _, _, zero, negative_zero, forward, backward = outputs
    x_value = inputs[0]
    assert_bitwise(zero, x_value * np.float32(0.0), "x * 0.0")
    assert_bitwise(negative_zero, x_value * np.float32(-0.0), "x * -0.0")
    assert np.signbit(negative_zero[x_value > 0]).all() and not np.signbit(zero[x_value > 0]).any()
    assert_bitwise(forward, inputs[0] - inputs[1])
    assert_bitwise(backward, inputs[1] - inputs[0])
    assert "[cse] merged" in step.report()


def test_cse_on_a_hand_built_graph():
    graph = Graph("g")
    x = graph.add("param", (), {"name": "x", "leaf": False, "dtype": "f32", "shape": (2,)}, f32(2)).id
    e1 = graph.add("exp", (x,), {}, f32(2)).id
    e2 = graph.add("exp", (x,), {}, f32(2)).id
    m1 = graph.add("mul", (e1, x), {}, f32(2)).id
    m2 = graph.add("mul", (e2, x), {}, f32(2)).id  # a duplicate once e2 becomes e1
    m3 = graph.add("mul", (x, e2), {}, f32(2)).id  # operand order differs: not a duplicate
    c1 = graph.add("const", (), {"value": 0.0}, f32()).id
    c2 = graph.add("const", (), {"value": -0.0}, f32()).id
    c3 = graph.add("const", (), {"value": 0.0}, f32()).id
    s1 = graph.add("sum", (m1,), {"dims": (0,), "keepdim": False}, f32()).id
    s2 = graph.add("sum", (m2,), {"dims": (0,), "keepdim": True}, f32(1)).id
    graph.outputs = [m1, m2, m3, c1, c2, c3, s1, s2]
    result, context = run_pass("cse", graph)
    assert result.outputs == [m1, m1, m3, c1, c2, c1, s1, s2]
    assert result.node(m3).inputs == (x, e1)
    assert e2 not in result and m2 not in result and c3 not in result and c2 in result
    assert context.decisions == [("cse", "merged 3 repeated nodes")]
    value = np.array([1.5, -0.25], dtype=np.float32)
    for got, want in zip(interpret(result, [value]), interpret(graph, [value])):
        assert_bitwise(got, want)


# ------------------------------------------------------------------ bit-identical results
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_passes_leave_interpreter_results_bit_identical(name):
    step, inputs, outputs = compile_program(name)
    autodiff = parse_graph(step.ir("autodiff"))
    reference = interpret(autodiff, list(inputs))
    for pass_name in sorted(PASSES):  # dce, cse and every other registered pass
        result, _ = run_pass(pass_name, autodiff)
        for index, (got, want) in enumerate(zip(interpret(result, list(inputs)), reference)):
            assert_bitwise(got, want, f"{name}: {pass_name} changed output {index}")
    for index, (got, want) in enumerate(zip(flat(outputs), reference)):
        assert_bitwise(got, want, f"{name}: the pipeline changed output {index}")
    unoptimized = bendc.jit(PROGRAMS[name][0], leaves=PROGRAMS[name][1], target="reference", passes=[])
    for index, (got, want) in enumerate(zip(flat(unoptimized(*inputs)), flat(outputs))):
        assert_bitwise(got, want, f"{name}: passes=[] differs at output {index}")


_UNARY = ("neg", "exp", "sqrt", "relu")
_BINARY = ("add", "sub", "mul", "div")
_CONSTS = (0.0, -0.0, 1.0, -1.0, 0.5, 2.0)


@st.composite
def random_graphs(draw):
    """Small elementwise graphs over two f32[4] params with repeats, dead nodes and the
    constants local rewrites like to fold (0.0, -0.0, 1.0, -1.0)."""
    graph = Graph("random")
    values = [graph.add("param", (), {"name": name, "leaf": False, "dtype": "f32", "shape": (4,)}, f32(4)).id
              for name in ("x", "y")]
    for _ in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(("unary", "binary", "const", "repeat")))
        if kind == "const":
            values.append(graph.add("const", (), {"value": draw(st.sampled_from(_CONSTS))}, f32()).id)
            continue
        if kind == "repeat":
            candidates = [v for v in values if graph.node(v).op != "param"]
            if candidates:
                node = graph.node(draw(st.sampled_from(candidates)))
                values.append(graph.add(node.op, node.inputs, node.attr, node.type).id)
                continue
        operands = [draw(st.sampled_from(values)) for _ in range(1 if kind == "unary" else 2)]
        op = draw(st.sampled_from(_UNARY if kind == "unary" else _BINARY))
        shapes = [graph.node(v).type.shape for v in operands]
        type = f32(4) if any(shapes) else f32()
        values.append(graph.add(op, operands, {}, type).id)
    graph.outputs = draw(st.lists(st.sampled_from(values), min_size=1, max_size=4))
    return graph


@settings(max_examples=120, deadline=None)
@given(random_graphs())
def test_dce_and_cse_preserve_bits_on_random_graphs(graph):
    verify(graph, "random")
    inputs = [np.array([0.0, -0.0, 1.5, -3.0], dtype=np.float32), np.array([-0.0, 2.0, 0.0, 0.5], dtype=np.float32)]
    with np.errstate(all="ignore"):
        expected = interpret(graph, inputs)
        for names in [*([name] for name in sorted(PASSES)), ["cse", "dce"], ["dce", "cse"]]:
            result = graph
            for name in names:
                result, _ = run_pass(name, result)
            got = interpret(result, inputs)
            for index, (a, b) in enumerate(zip(got, expected)):
                assert_bitwise(a, b, f"{names} output {index}")


# ------------------------------------------------------------------ the pipeline
def test_default_pipeline_records_a_stage_per_pass():
    fn, leaves, make_inputs = PROGRAMS["with_duplicates"]
    step = bendc.jit(fn, leaves=leaves, target="reference")
    step(*make_inputs())
    stages = step.stages()
    assert stages == ["traced", "autodiff", *default_passes(), "final"]
    for name in ("traced", "autodiff", "dce", "cse", "final"):
        assert step.ir(name).startswith("func @with_duplicates(")
    assert step.ir("final") == step.ir(default_passes()[-1])


def test_passes_run_in_the_order_given():
    step, _, _ = compile_program("with_dead_code", passes=["cse", "dce"])
    assert step.stages() == ["traced", "autodiff", "cse", "dce", "final"]
    assert step.ir("final") == step.ir("dce")
    step, _, _ = compile_program("with_dead_code", passes=[])
    assert step.stages() == ["traced", "autodiff", "final"]
    assert step.ir("final") == step.ir("autodiff")


def test_pipeline_calls_back_after_each_pass_on_copies():
    step, _, _ = compile_program("with_duplicates")
    graph = parse_graph(step.ir("autodiff"))
    before = format_graph(graph)
    seen = []
    result = Pipeline(["dce", "cse"]).run(graph, PassContext(), lambda name, g: seen.append((name, format_graph(g))))
    assert [name for name, _ in seen] == ["dce", "cse"]
    assert seen[-1][1] == format_graph(result) == step.ir("cse")
    assert format_graph(graph) == before, "the pipeline changed its input graph"


def test_unknown_pass_names_raise_at_decoration():
    with pytest.raises(bendc.UnsupportedError) as info:
        bendc.jit(lambda x: x, target="reference", passes=["dce", "no_such_pass"])  # @unknown-pass
    message = str(info.value)
    assert "'no_such_pass'" in message and "cse" in message and "dce" in message
    assert info.value.loc is not None and info.value.loc.short == f"test_passes.py:{_marker_line('unknown-pass')}"


def test_repeated_pass_names_raise_at_decoration():
    with pytest.raises(bendc.UnsupportedError) as info:
        bendc.jit(lambda x: x, target="reference", passes=["dce", "dce"])
    assert "dce" in str(info.value)


def _marker_line(marker: str) -> int:
    import pathlib

    lines = pathlib.Path(__file__).read_text().splitlines()
    hits = [n for n, text in enumerate(lines, start=1) if text.rstrip().endswith(f"# @{marker}")]
    assert len(hits) == 1
    return hits[0]


# ------------------------------------------------------------------ custom passes
def fold_double_negation(graph: Graph, context: PassContext) -> Graph:
    """Fold neg(neg(x)) -> x."""
    folded = 0
    for id in graph.order():
        node = graph.node(id)
        if node.op == "neg" and graph.node(node.inputs[0]).op == "neg":
            graph.replace_uses(id, graph.node(node.inputs[0]).inputs[0])
            folded += 1
    if folded:
        context.decide("fold", f"folded {folded} double negations")
    return graph


def test_a_custom_pass_runs_in_the_pipeline():
    calls = []

    def spy(graph: Graph, context: PassContext) -> Graph:
        calls.append(format_graph(graph))
        return graph

    def program(x, w):
        loss = (-(-(x * w))).sum()
        loss.backward()
        return loss, w.grad

    step = bendc.jit(program, leaves=("w",), target="reference",
                     passes=[Pass("fold", fold_double_negation, "Fold neg(neg(x))."), "dce", Pass("spy", spy)])
    x, w = rng_f32((2, 3), 0), rng_f32((2, 3), 1)
    loss, grad = step(x, w)
    assert step.stages() == ["traced", "autodiff", "fold", "dce", "spy", "final"]
    assert "neg" in ops_of(step.ir("autodiff")) and "neg" in ops_of(step.ir("fold"))  # dead, not yet removed
    assert "neg" not in ops_of(step.ir("dce"))
    assert calls == [step.ir("dce")]
    assert "[fold] folded" in step.report()
    assert_bitwise(loss, (x * w).sum(dtype=np.float32))
    assert_bitwise(grad, x)


# ------------------------------------------------------------------ dumps and the report
def test_dump_dir_gets_one_file_per_stage_and_no_temporaries(monkeypatch, tmp_path):
    monkeypatch.setenv("BENDC_DUMP_DIR", str(tmp_path))
    step, _, _ = compile_program("with_duplicates", passes=["dce", "cse"])
    folder = tmp_path / "with_duplicates"
    files = sorted(path.name for path in folder.iterdir())
    assert files == ["00-traced.ir", "01-autodiff.ir", "02-dce.ir", "03-cse.ir", "04-final.ir"]
    for name in files:
        stage = name[3:-3]
        assert (folder / name).read_text() == step.ir(stage)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["with_duplicates"]
    assert not list(tmp_path.rglob(".*")), "a temporary file was left behind"


def test_no_dump_without_the_variable(monkeypatch, tmp_path):
    monkeypatch.delenv("BENDC_DUMP_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    compile_program("with_dead_code")
    assert list(tmp_path.iterdir()) == []


def test_report_mentions_cse_merges_with_their_count():
    step, _, _ = compile_program("with_duplicates")
    merged = len(parse_graph(step.ir("dce"))) - len(parse_graph(step.ir("cse")))
    assert merged > 0
    assert f"[cse] merged {merged} repeated nodes" in step.report()


def test_report_says_when_nothing_changed():
    step = bendc.jit(lambda x: x * 2.0, target="reference", passes=["dce", "cse"])
    step(rng_f32((2,), 0))
    report = step.report()
    assert "cse" not in report and "dce" not in report and "no pass changed the graph" in report
