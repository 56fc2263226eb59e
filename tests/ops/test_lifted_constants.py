"""Large captured constants (issue 22): a torch tensor of more than LITERAL_LIMIT values that the traced
function captures (nanoGPT's causal mask made outside it) or makes with torch.tensor is a lifted constant:
a parameter marked ``const=<hash>`` whose values the program holds and passes after the caller's inputs.
Checked against torch eager on the reference and cpu targets, through
IR text (print -> parse -> print, the values outside it), and through an artifact (``constants/*.npy``,
hashed like the rest).

Tolerances: masked_fill and the float mask product are bit for bit; softmax values and gradients within
rtol 1e-5 (exp in another order than torch's).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import bendc
import runtime
from bendc import cli
from bendc.ir.interp import interpret
from bendc.ir.parser import parse_graph
from bendc.ir.printer import format_graph
from bendc.ops.creation import LITERAL_LIMIT
from conftest import assert_bitwise
from runtime.artifact import ArtifactInvalid

T = 128
CAUSAL = torch.tril(torch.ones(T, T))  # made outside the traced function, as nanoGPT's bias buffer
TABLE = list(range(LITERAL_LIMIT + 100))  # torch.tensor([...]) of more values than a literal holds


def masked_step(x, w):
    scores = (x * w).masked_fill(CAUSAL == 0, float("-inf"))  # a bool constant made by torch eagerly
    weights = torch.softmax(scores, dim=-1)
    kept = x * CAUSAL + x * CAUSAL  # the float mask twice: one lifted parameter
    table = torch.tensor(TABLE, dtype=torch.float32)[:T]
    loss = (weights * kept).sum() + (scores.clamp(min=-1e4) * table).sum()
    return loss, weights, scores


def _inputs():
    rng = np.random.default_rng(22)
    return (rng.standard_normal((2, T, T)).astype(np.float32),
            rng.standard_normal((T, T)).astype(np.float32))


def _torch_results(x, w):
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    loss, weights, scores = masked_step(xt, wt)
    loss.backward()
    return [t.detach().numpy() for t in (loss, weights, scores, xt.grad, wt.grad)]


def _jitted(target_name: str, **options):
    def step(x, w):
        loss, weights, scores = masked_step(x, w)
        loss.backward()
        return loss, weights, scores, x.grad, w.grad

    return bendc.jit(step, leaves=("x", "w"), target=target_name, **options)


@pytest.mark.parametrize("target", ["reference", "cpu"])
def test_captured_mask_matches_torch(target):
    x, w = _inputs()
    step = _jitted(target)
    got = [np.asarray(g) for g in step(x, w)]
    want = _torch_results(x, w)
    assert_bitwise(got[2], want[2], "masked scores")
    for name, mine, theirs in zip(("loss", "softmax", "scores", "x.grad", "w.grad"), got, want):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6, err_msg=name)
    header = step.ir("traced").splitlines()[0]
    # the bool mask, the float mask (used twice: one parameter) and the table, named by hash only
    assert header.count(" const=") == 3, header
    assert "bool[128,128] const=" in header and f"f32[{len(TABLE)}] const=" in header
    assert len(step.ir("traced")) < 20_000  # no values in the text
    assert len(step(x, w)) == 5  # a second call reuses the program and its constants


def test_ir_round_trip_names_the_constants_by_hash():
    x, w = _inputs()
    step = _jitted("reference")
    step(x, w)
    for stage in ("traced", "final"):
        text = step.ir(stage)
        parsed = parse_graph(text)
        assert format_graph(parsed) == text
        traced = step._executable().graph
        assert [parsed.node(p).attr["const"] for p in parsed.constant_params()] == \
            [traced.node(p).attr["const"] for p in traced.constant_params()]
    final = parse_graph(step.ir("final"))
    with pytest.raises(ValueError, match="lacks the values of its lifted constants"):
        interpret(final, [x, w])
    final.constants = step._executable().graph.constants
    for mine, theirs in zip(interpret(final, [x, w]), step(x, w)):
        assert_bitwise(mine, theirs)


def _captured_scale(values: torch.Tensor):
    def scaled(x):
        return x * values

    return bendc.jit(scaled, target="reference")


def test_other_values_are_another_hash():
    ramp = torch.arange(float(LITERAL_LIMIT + 1))
    x = np.ones(LITERAL_LIMIT + 1, np.float32)
    headers = []
    for values in (ramp, ramp + 1, ramp.clone()):
        step = _captured_scale(values)
        np.testing.assert_array_equal(step(x), values.numpy())
        headers.append(step.ir("traced").splitlines()[0])
    assert headers[0] != headers[1] and headers[0] == headers[2]  # the hash of the values, not the object

    # the values at trace time, as a literal's: changing the captured tensor later changes nothing
    captured = ramp.clone()
    step = _captured_scale(captured)
    step(x)
    captured.fill_(-1.0)
    np.testing.assert_array_equal(step(x), ramp.numpy())


def test_artifact_carries_the_constants(tmp_path: Path):
    x, w = _inputs()
    step = _jitted("cpu", cache_dir=str(tmp_path / "cache"))
    want = step(x, w)
    again = _jitted("cpu", cache_dir=str(tmp_path / "cache"))  # the on-disk cache entry holds them too
    for mine, theirs in zip(again(x, w), want):
        assert_bitwise(mine, theirs)
    assert "loaded from the on-disk cache" in again.report()
    folder = tmp_path / "masked"
    step.export(str(folder), "x=f32[2,128,128]:leaf w=f32[128,128]:leaf")
    manifest = json.loads((folder / "manifest.json").read_text())
    files = [spec["file"] for spec in manifest["constants"]]
    assert len(files) == 3 and all(name in manifest["files"] for name in files)
    assert [spec["name"] for spec in manifest["inputs"]] == ["x", "w"]
    program = runtime.load(str(folder))
    for mine, theirs in zip(program(x, w), want):
        assert_bitwise(mine, theirs)
    # a changed constant is refused by its hash, as any changed file
    mask_file = folder / files[0]
    data = bytearray(mask_file.read_bytes())
    data[-1] ^= 1
    mask_file.write_bytes(bytes(data))
    with pytest.raises(ArtifactInvalid, match="changed since it was built"):
        runtime.load(str(folder))


MODULE = """
import torch, bendc
MASK = torch.tril(torch.ones(128, 128))
EXAMPLE_SHAPES = "x=f32[2,128,128]:leaf"

@bendc.jit(leaves=("x",), target="cpu")
def step(x):
    scores = x.masked_fill(MASK == 0, float("-inf")).softmax(-1)
    loss = (scores * scores).sum()
    loss.backward()
    return loss, x.grad
"""


def test_bendc_compile_and_run_carry_the_constants(tmp_path: Path, capsys):
    (tmp_path / "masked_module.py").write_text(MODULE)
    out = tmp_path / "build"
    assert cli.main(["compile", f"{tmp_path / 'masked_module.py'}:step", "--target", "cpu", "-o", str(out)]) == 0
    assert "consts   constants/_tensor_constant0.npy (bool[128,128])" in capsys.readouterr().out
    assert cli.main(["run", str(out), "--random-inputs"]) == 0
    assert "out1   f32[2,128,128]" in capsys.readouterr().out
