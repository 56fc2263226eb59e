"""`bendc compile` of a function with pytree parameters: a SPEC with dotted entries (or a dict
EXAMPLE_SHAPES), the artifact's recorded input and output structures, and `runtime.load` /
`bendc run` taking and returning those structures."""
from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

import bendc
import runtime
from bendc import cli
from bendc.errors import SignatureError
from bendc.spec import spec_shapes
from conftest import assert_bitwise
from runtime.artifact import InputsInvalid, read_manifest

STEP = textwrap.dedent('''
    import bendc
    import bendc.functional as F

    SPEC = ("params.w=f32[3,4]:leaf params.b=f32[3]:leaf state.step=f32[] state.exp_avg.w=f32[3,4] "
            "state.exp_avg.b=f32[3] state.exp_avg_sq.w=f32[3,4] state.exp_avg_sq.b=f32[3] "
            "batch.0=f32[5,4] batch.1=i64[5]")
    EXAMPLE_SHAPES = SPEC


    @bendc.jit(leaves=("params",))
    def step(params, state, batch, lr=0.01):
        x, y = batch
        loss = F.cross_entropy(F.linear(x, params["w"], params["b"]), y)
        loss.backward()
        grads = bendc.tree.map(lambda p: p.grad, params)
        params, state = bendc.optim.adam(params, grads, state, lr)
        return {"loss": loss, "params": params}, state
''')


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    folder = tmp_path_factory.mktemp("src")
    (folder / "tree_step.py").write_text(STEP)
    return folder / "tree_step.py"


@pytest.fixture(scope="module")
def artifact(module, tmp_path_factory):
    out = tmp_path_factory.mktemp("build") / "tree"
    assert cli.main(["compile", f"{module}:step", "--target", "cpu", "-o", str(out)]) == 0
    return out


def _arguments(seed: int = 0):
    rng = np.random.default_rng(seed)
    params = {"w": rng.standard_normal((3, 4)).astype(np.float32), "b": rng.standard_normal(3).astype(np.float32)}
    state = bendc.optim.init_adam(params)
    batch = (rng.standard_normal((5, 4)).astype(np.float32), rng.integers(0, 3, size=5))
    return params, state, batch


def _jitted(tmp_path):
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("tree_step_jit", tmp_path / "tree_step.py")
    loaded = importlib.util.module_from_spec(spec)
    sys.modules["tree_step_jit"] = loaded
    spec.loader.exec_module(loaded)
    return bendc.jit(loaded.step.fn, leaves=("params",), target="cpu", cache_dir=str(tmp_path / "cache"))


def test_spec_with_dotted_entries_makes_pytrees():
    shapes, leaves = spec_shapes("p.w=f32[2]:leaf p.layers.0=f32[3]:leaf p.layers.1=f32[4]:leaf x=i64[5]")
    assert shapes == {"p": {"w": "f32[2]", "layers": ["f32[3]", "f32[4]"]}, "x": "i64[5]"}
    assert leaves == ("p",)


@pytest.mark.parametrize("spec, message", [
    ("p.w=f32[2]:leaf p.b=f32[2]", "mark every entry of 'p' :leaf or none"),
    ("p.0=f32[2] p.b=f32[2]", "mixes list indices and dict keys"),
    ("p.0=f32[2] p.2=f32[2]", "a list needs 0..n-1"),
    ("p=f32[2] p.b=f32[2]", "is an array and a container"),
])
def test_bad_tree_specs_are_refused(spec, message):
    with pytest.raises(SignatureError, match=message):
        spec_shapes(spec)


def test_the_manifest_records_the_input_and_output_structures(artifact):
    manifest = read_manifest(str(artifact))
    parameters = manifest["parameters"]
    assert list(parameters) == ["params", "state", "batch", "lr"]
    assert parameters["params"] == {"kind": "dict", "items": {"w": {"kind": "input", "value": "params_w"},
                                                              "b": {"kind": "input", "value": "params_b"}}}
    assert parameters["batch"]["kind"] == "list" and parameters["lr"] == {"kind": "static", "value": 0.01}
    assert [spec["name"] for spec in manifest["inputs"]][:3] == ["params_w", "params_b", "state_step"]
    assert manifest["template"]["kind"] == "tuple"
    assert set(manifest["template"]["items"][0]["items"]) == {"loss", "params"}


def test_runtime_load_takes_and_returns_the_structures(artifact, module, tmp_path):
    (tmp_path / "tree_step.py").write_text(module.read_text())
    program = runtime.load(str(artifact))
    params, state, batch = _arguments()
    got, got_state = program(params, state, list(batch))
    want, want_state = _jitted(tmp_path)(params, state, list(batch))
    assert set(got) == {"loss", "params"} and set(got["params"]) == {"w", "b"}
    assert_bitwise(got["loss"], want["loss"], "loss")
    for name in ("w", "b"):
        assert_bitwise(got["params"][name], want["params"][name], name)
        assert_bitwise(got_state["exp_avg_sq"][name], want_state["exp_avg_sq"][name], name)
    assert_bitwise(got_state["step"], want_state["step"], "step")
    # by name, with a tuple batch and the static lr at its recorded value
    again, _ = program(batch=batch, state=state, params=params, lr=0.01)
    assert_bitwise(again["loss"], want["loss"], "loss by name")


def test_runtime_load_refuses_a_wrong_structure(artifact):
    program = runtime.load(str(artifact))
    params, state, batch = _arguments()
    with pytest.raises(InputsInvalid, match=r"params lacks 'b'"):
        program({"w": params["w"]}, state, batch)
    with pytest.raises(InputsInvalid, match=r"batch must be a list of 2 items"):
        program(params, state, batch[:1])
    with pytest.raises(InputsInvalid, match="lr was fixed to 0.01"):
        program(params, state, batch, 0.5)
    with pytest.raises(InputsInvalid, match=r"'params_w' must be f32\[3,4\]"):
        program({"w": params["w"][:2], "b": params["b"]}, state, batch)


def test_bendc_run_reads_inputs_by_dotted_path(artifact, tmp_path, capsys):
    params, state, batch = _arguments()
    flat = {"params.w": params["w"], "params.b": params["b"], "state.step": state["step"],
            "state.exp_avg.w": state["exp_avg"]["w"], "state.exp_avg.b": state["exp_avg"]["b"],
            "state.exp_avg_sq.w": state["exp_avg_sq"]["w"], "state_exp_avg_sq_b": state["exp_avg_sq"]["b"],
            "batch.0": batch[0], "batch.1": batch[1]}
    np.savez(tmp_path / "in.npz", **flat)
    capsys.readouterr()
    assert cli.main(["run", str(artifact), "--inputs", str(tmp_path / "in.npz"),
                     "--outputs", str(tmp_path / "out.npz")]) == 0
    out = capsys.readouterr().out
    assert "takes params={'w': params_w, 'b': params_b}" in out
    assert "returns ({'loss': out0, 'params': {'w': out1, 'b': out2}}" in out
    want, _ = runtime.load(str(artifact))(params, state, batch)
    with np.load(tmp_path / "out.npz") as got:
        assert_bitwise(got["out0"], want["loss"], "loss")
        assert_bitwise(got["out1"], want["params"]["w"], "w")
    assert cli.main(["run", str(artifact), "--random-inputs"]) == 0


def test_a_dict_example_shapes_compiles_too(tmp_path):
    source = STEP.replace("EXAMPLE_SHAPES = SPEC", "EXAMPLE_SHAPES = {\n"
                          "    'params': {'w': 'f32[3,4]:leaf', 'b': 'f32[3]:leaf'},\n"
                          "    'state': {'step': 'f32[]', 'exp_avg': {'w': 'f32[3,4]', 'b': 'f32[3]'},\n"
                          "              'exp_avg_sq': {'w': 'f32[3,4]', 'b': 'f32[3]'}},\n"
                          "    'batch': ['f32[5,4]', 'i64[5]']}")
    (tmp_path / "dict_step.py").write_text(source)
    out = tmp_path / "out"
    assert cli.main(["compile", f"{tmp_path / 'dict_step.py'}:step", "--target", "cpu", "-o", str(out)]) == 0
    manifest = read_manifest(str(out))
    assert json.dumps(manifest["parameters"]["batch"]) == json.dumps(
        {"kind": "list", "items": [{"kind": "input", "value": "batch_0"}, {"kind": "input", "value": "batch_1"}]})
    loss = runtime.load(str(out))(*_arguments())[0]["loss"]
    assert loss.shape == () and np.isfinite(loss)


def test_ir_and_report_take_a_tree_spec(module, capsys):
    assert cli.main(["ir", f"{module}:step", "--stage", "traced"]) == 0
    assert "func @step(%params_w: f32[3,4] leaf, %params_b: f32[3] leaf, %state_step: f32[]" in capsys.readouterr().out
    spec = "p.w=f32[3,4]:leaf p.b=f32[3]"
    assert cli.main(["ir", f"{module}:step", "--shapes", spec]) == 1
    assert "mark every entry of 'p' :leaf" in capsys.readouterr().err
