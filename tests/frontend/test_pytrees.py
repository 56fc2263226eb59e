"""Pytrees in and out of jitted functions, and bendc.tree."""
from __future__ import annotations

import collections
import dataclasses
import json

import numpy as np
import pytest

import bendc
import bendc.functional as F
from bendc import tree
from runtime.artifact import unflatten_outputs
from runtime.cli import describe_template

Pair = collections.namedtuple("Pair", "w b")


@dataclasses.dataclass
class Result:
    loss: object
    grads: object


def test_flatten_unflatten_round_trip_and_none_is_an_empty_container():
    value = {"a": [1, (2, 3)], "b": None, "c": Pair(4, {"d": 5}), "e": [], "f": {}, "g": Result(6, ())}
    leaves, treedef = tree.flatten(value)
    assert leaves == [1, 2, 3, 4, 5, 6]
    assert tree.unflatten(treedef, leaves) == value
    assert treedef.paths("v")[:4] == ["v['a'][0]", "v['a'][1][0]", "v['a'][1][1]", "v['c'].w"]


def test_map_over_trees_of_one_structure_and_mismatch():
    assert tree.map(lambda a, b: a + b, {"x": [1, 2]}, {"x": [10, 20]}) == {"x": [11, 22]}
    with pytest.raises(ValueError, match="different structures"):
        tree.map(lambda a, b: a, {"x": [1]}, {"x": [1, 2]})


def _params():
    rng = np.random.default_rng(0)
    return {"layer": Pair(rng.standard_normal((3, 4)).astype(np.float32), np.zeros(3, np.float32)),
            "extra": [rng.standard_normal(3).astype(np.float32)], "unused": None, "empty": {}}


@pytest.mark.parametrize("target", ["reference", "cpu"])
def test_leaves_inside_a_pytree_take_gradients_and_outputs_mirror_the_structure(target):
    @bendc.jit(leaves=("params",), target=target)
    def step(params, batch, config):
        y = F.linear(batch["x"], params["layer"].w, params["layer"].b) * params["extra"][0]
        loss = (y * config[0]).sum()
        loss.backward()
        grads = tree.map(lambda p: p.grad, params)
        return Result(loss, grads), [], {"note": config[1], "none": None}

    params = _params()
    x = np.ones((5, 4), np.float32)
    result, empty, meta = step(params, {"x": x}, (2.0, "tag"))
    assert isinstance(result, Result) and isinstance(result.grads["layer"], Pair)
    assert empty == [] and meta == {"note": "tag", "none": None}
    assert result.grads["unused"] is None and result.grads["empty"] == {}
    w, b, e = params["layer"].w, params["layer"].b, params["extra"][0]
    np.testing.assert_allclose(result.loss, ((x @ w.T + b) * e * 2.0).sum(), rtol=1e-5)
    np.testing.assert_allclose(result.grads["layer"].b, 5 * 2.0 * e, rtol=1e-6)
    np.testing.assert_allclose(result.grads["layer"].w, 2.0 * np.outer(e, x.sum(0)), rtol=1e-6)
    np.testing.assert_allclose(result.grads["extra"][0], 2.0 * (x @ w.T + b).sum(0), rtol=1e-5)
    assert "%params_layer_w: f32[3,4] leaf" in step.ir("traced")


def test_a_new_container_structure_is_a_new_signature():
    @bendc.jit(target="reference")
    def total(xs):
        return sum(x.sum() for x in xs)

    one = np.ones(2, np.float32)
    assert float(total([one])) == 2.0
    assert float(total([one, one])) == 4.0
    assert float(total((one, one, one))) == 6.0
    assert len(total.signatures()) == 3


def test_static_values_may_be_any_hashable_and_unhashable_ones_are_refused():
    @bendc.jit(target="reference")
    def scale(x, mode, factors):
        return x * factors[0] if mode == "first" else x * factors[1]

    x = np.ones(2, np.float32)
    np.testing.assert_array_equal(scale(x, "first", (2.0, 3.0)), [2.0, 2.0])
    np.testing.assert_array_equal(scale(x, "second", (2.0, 3.0)), [3.0, 3.0])
    with pytest.raises(bendc.SignatureError, match="hashable"):
        scale(x, {1, 2}, (1.0, 1.0))
    with pytest.raises(bendc.SignatureError, match=r"leaf .p\['s'\]. must be an array"):
        bendc.jit(lambda p: p["a"] * 1.0, leaves=("p",))({"a": x, "s": 1.0})


def test_the_cached_program_rebuilds_named_tuples_and_dataclasses(tmp_path):
    def make():
        @bendc.jit(leaves=("p",), target="cpu", cache_dir=str(tmp_path))
        def step(p):
            loss = (p.w * p.b).sum()
            loss.backward()
            return Result(loss, Pair(p.w.grad, p.b.grad))
        return step

    p = Pair(np.ones(3, np.float32), np.full(3, 2.0, np.float32))
    first = make()(p)
    second_step = make()
    second = second_step(p)  # loaded from the on-disk cache: the template comes from the manifest
    assert "loaded from the on-disk cache" in second_step.report()
    assert isinstance(second, Result) and isinstance(second.grads, Pair)
    np.testing.assert_array_equal(second.grads.w, first.grads.w)


def test_manifest_template_json_and_the_runtime_reads_named_tuples_as_dicts():
    outputs: list = []
    template = tree.Template(*_template_of(Result(1, Pair(2, None)), outputs))
    data = json.loads(json.dumps(template.to_json()))
    assert data["kind"] == "dataclass" and data["type"].endswith(":Result")
    assert tree.Template.from_json(data) == template
    assert describe_template(data) == "Result(loss=out0, grads=Pair(w=out1, b=None))"
    assert unflatten_outputs(data, ["L", "W"]) == {"loss": "L", "grads": {"w": "W", "b": None}}
    data["type"] = "no_such_module:Result"
    rebuilt = tree.Template.from_json(data)
    assert rebuilt.rebuild(["L", "W"]) == {"loss": "L", "grads": Pair("W", None)}


def _template_of(value, outputs):
    leaves, treedef = tree.flatten(value)
    return treedef, tuple(("out", i) for i in range(len(leaves)))


def test_plain_positional_arrays_keep_the_fast_path():
    @bendc.jit(target="reference")
    def mul(x, y):
        return x * y

    x = np.ones(3, np.float32)
    mul(x, x)
    assert len(mul._fast) == 1
    mul(x, x)
    assert len(mul.signatures()) == 1


def test_calls_with_defaults_and_names_keep_the_fast_path(monkeypatch):
    """A step whose last parameters have defaults (``lr=1e-3``), called without them, or called
    with parameters by name, is not bound again at every call: the defaults and the named values
    fill the fast key as binding fills the parameters. A call passing the same values positionally
    finds the same signature; another value is another one; binding still reports a parameter
    given twice or an unknown name."""
    @bendc.jit(target="reference")
    def scaled(x, w, scale=2.0, mode="plain"):
        return x * w * scale if mode == "plain" else x - w

    x, w = np.ones(3, np.float32), np.full(3, 3.0, np.float32)
    np.testing.assert_array_equal(scaled(x, w), [6.0, 6.0, 6.0])
    binds = []
    original = type(scaled)._bind
    monkeypatch.setattr(type(scaled), "_bind", lambda self, *a: binds.append(a) or original(self, *a))
    np.testing.assert_array_equal(scaled(x, w), [6.0, 6.0, 6.0])
    np.testing.assert_array_equal(scaled(x, w, 2.0), [6.0, 6.0, 6.0])
    assert binds == [] and len(scaled.signatures()) == 1
    np.testing.assert_array_equal(scaled(x, w=w), [6.0, 6.0, 6.0])  # by name: the same key
    np.testing.assert_array_equal(scaled(w=w, x=x, mode="plain"), [6.0, 6.0, 6.0])
    assert binds == [] and len(scaled.signatures()) == 1
    np.testing.assert_array_equal(scaled(x, w, 2.0, "minus"), [-2.0, -2.0, -2.0])
    np.testing.assert_array_equal(scaled(x, w, 0.5), [1.5, 1.5, 1.5])
    np.testing.assert_array_equal(scaled(x, w, scale=0.5), [1.5, 1.5, 1.5])
    assert len(scaled.signatures()) == 3
    for wrong in ({"x": x}, {"w": w, "typo": 1.0}):  # given twice, an unknown name: binding's errors
        with pytest.raises(bendc.SignatureError):
            scaled(x, **wrong)


def test_pytree_calls_take_the_fast_path_and_a_changed_leaf_misses_it():
    @bendc.jit(target="reference", dynamic=("scale",))
    def weighted(params, scale, mode):
        total = params["a"] * scale + params["b"][0]
        return total if mode == "plain" else total * 2.0

    a, b = np.ones(2, np.float32), np.full(2, 3.0, np.float32)
    np.testing.assert_array_equal(weighted({"a": a, "b": [b]}, 2.0, "plain"), [5.0, 5.0])
    np.testing.assert_array_equal(weighted({"a": a, "b": [b]}, 0.5, "plain"), [3.5, 3.5])  # fast hit
    assert len(weighted._fast) == 1 and len(weighted.signatures()) == 1
    np.testing.assert_array_equal(weighted({"a": a, "b": [b]}, 0.5, "double"), [7.0, 7.0])
    np.testing.assert_array_equal(weighted({"a": a, "b": (b,)}, 0.5, "plain"), [3.5, 3.5])
    np.testing.assert_array_equal(weighted({"a": a, "b": [b[:1]]}, 0.5, "plain"), [3.5, 3.5])
    assert len(weighted.signatures()) == 4


def test_the_fast_key_tells_apart_every_structure_a_treedef_does(monkeypatch):
    """The fast path keys a pytree by container marks, sizes and dict keys in flatten's order, not
    by a TreeDef: structures with the same leaves in the same order (another nesting, key order, a
    tuple against a named tuple or a list, None against an empty dict) are other signatures, each
    found again on the fast path with the right value, and a named tuple or dataclass output comes
    back rebuilt from the generated rebuild."""
    @bendc.jit(target="reference")
    def first_minus_last(tree_):
        leaves = tree.leaves(tree_)
        return Result(leaves[0] - leaves[-1], Pair(leaves[0], {1: leaves[-1]}))

    x, y = np.ones(2, np.float32), np.full(2, 3.0, np.float32)
    calls = [[x, [y]], [[x], y], {"a": x, "b": y}, {"b": x, "a": y}, (x, y), Pair(x, y), [x, y],
             Result(x, y), {"a": x, "n": None, "b": y}, {"a": x, "n": {}, "b": y}]
    for call in calls:
        assert first_minus_last(call).loss.tolist() == [-2.0, -2.0]
    assert len(first_minus_last.signatures()) == len(calls) == len(first_minus_last._fast)
    binds = []
    original = type(first_minus_last)._bind
    monkeypatch.setattr(type(first_minus_last), "_bind", lambda self, *a: binds.append(a) or original(self, *a))
    for call in calls:
        result = first_minus_last(call)
        assert isinstance(result, Result) and isinstance(result.grads, Pair)
        assert result.grads.b[1].tolist() == [3.0, 3.0] and result.loss.tolist() == [-2.0, -2.0]
    assert binds == [] and len(first_minus_last.signatures()) == len(calls)
    first_minus_last([x, np.ones((2, 2), np.float32)[:, 0]])  # a strided leaf: bound, not fast
    assert len(binds) == 1
    # a dataclass type is a leaf (a static value), not a container: bound, as any leaf the fast path
    # does not take (the fast path once asked dataclasses.is_dataclass, true of the type too, and recursed)
    assert first_minus_last([x, Result, y]).loss.tolist() == [-2.0, -2.0]
    assert len(binds) == 2


def test_an_artifact_returning_a_named_tuple_runs_with_the_runtime(tmp_path, capsys):
    from bendc import cli

    @bendc.jit(leaves=("w",), target="cpu", cache_dir=str(tmp_path / "cache"))
    def step(x, w):
        loss = (x * w).sum()
        loss.backward()
        return Pair(loss, {"grad": w.grad, "none": None})

    out = tmp_path / "artifact"
    step.export(str(out), "x=f32[3] w=f32[3]:leaf")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["template"]["kind"] == "namedtuple"
    assert cli.main(["run", str(out), "--random-inputs"]) == 0
    assert "returns Pair(w=out0, b={'grad': out1, 'none': None})" in capsys.readouterr().out


def test_lower_and_export_take_pytrees_of_types(tmp_path, capsys):
    from bendc import cli

    @bendc.jit(leaves=("params",), target="cpu", cache_dir=str(tmp_path / "cache"))
    def train_step(params, batch, lr=0.1):
        x, y = batch
        loss = F.cross_entropy(F.linear(x, params["w"], params["b"]), y)
        loss.backward()
        return loss, tree.map(lambda p: p - lr * p.grad, params)

    shapes = {"params": {"w": "f32[3,4]", "b": "f32[3]"}, "batch": ("f32[5,4]", "i64[5]")}
    lowered = train_step.lower(shapes)
    assert "%params_w: f32[3,4] leaf" in lowered.stages["traced"] and "%batch_1: i64[5]" in lowered.stages["traced"]
    out = tmp_path / "artifact"
    train_step.export(str(out), shapes, {"lr": 0.5})
    assert cli.main(["run", str(out), "--random-inputs"]) == 0
    assert "returns (out0, {'w': out1, 'b': out2})" in capsys.readouterr().out
    with pytest.raises(bendc.SignatureError, match="not parameters"):
        train_step.lower({"params": {"w": "f32[3,4]"}, "nope": ("f32[1]",)})
