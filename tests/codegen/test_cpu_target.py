"""The cpu target: fusion, memory plan, donation, on-disk cache, generated source."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import bendc
import bendc.functional as F
from bendc.codegen.plan import value_bytes as nbytes
from bendc.codegen.plan import KernelPlan
from conftest import assert_bitwise, assert_close

ROOT = Path(__file__).resolve().parents[2]
rng = np.random.default_rng(7)


def rand(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def both(fn, leaves, args, cache_dir, **kwargs):
    """(cpu results, reference results, the cpu JitFunction)."""
    cpu = bendc.jit(fn, leaves=leaves, target="cpu", cache_dir=str(cache_dir), **kwargs)
    reference = bendc.jit(fn, leaves=leaves, target="reference")
    return cpu(*args), reference(*args), cpu


def test_elementwise_chain_is_one_kernel_and_bitwise(tmp_path):
    def chain(x, w, b):
        y = ((x * w + b) * x - b) / (w * w + 1.0)
        (y * x).sum().backward()
        return y, w.grad, b.grad

    args = (rand(64, 33), rand(64, 33), rand(33))
    got, want, step = both(chain, ("w", "b"), args, tmp_path)
    assert_bitwise(got[0], want[0], "y")
    assert_bitwise(got[1], want[1], "w.grad")  # + - * / only: bit for bit
    assert_close(got[2], want[2], "b.grad")     # a reduction over the broadcast dim
    # All elementwise work over [64,33], forward and backward, is one kernel, and b.grad's two
    # contributions are reduced (sum_to_size) in it as epilogues; a second kernel adds them,
    # as PyTorch accumulates them.
    full = [line for line in step.report().splitlines() if "elementwise, 2112 cells" in line]
    assert len(full) == 1, step.report()
    assert "epilogue sum_to_size" in step.report()
    assert step.stats()["launches"] == 2, step.report()


def test_adam_fuses_into_one_kernel_per_parameter(tmp_path):
    def update(p, g, m, v):
        return F.adam_step(p, g, m, v, 3, 1e-2, weight_decay=0.01)

    args = (rand(40, 24), rand(40, 24), rand(40, 24), np.abs(rand(40, 24)))
    got, want, step = both(update, (), args, tmp_path)
    for name, a, b in zip(("param", "m", "v"), got, want):
        assert_close(a, b, name, rtol=1e-6, atol=1e-7)
    assert step.stats()["launches"] == 1, step.report()


def test_generated_source_is_readable_and_typed(tmp_path):
    def f(x):
        return (x * 0.5 + 1.0).tanh()

    _, _, step = both(f, (), (rand(8, 8),), tmp_path)
    (source,) = [s for name, s in step.kernels().items() if name.startswith("k")]
    assert "np.float32(0.5)" in source and "np.float32(1.0)" in source
    assert "fastmath" not in source
    assert "%" in source and "= mul" in source  # comments name the IR nodes
    assert "@njit" in source


def _intervals(plan: KernelPlan) -> dict[int, tuple[int, int]]:
    """Value -> (step that writes it, last step that reads it or a view of it)."""
    written, last = {}, {}
    root = {}
    for index, step in enumerate(plan.steps):
        for value in step.outputs:
            written[value] = index
            root[value] = root.get(step.inputs[0], step.inputs[0]) if step.convention == "view" and step.inputs \
                else value
        for value in step.inputs:
            r = root.get(value, value)
            last[r] = max(last.get(r, -1), index)
    return {v: (written[v], last.get(v, written[v])) for v in plan.storage}


def test_memory_plan_never_overlaps_live_values(tmp_path):
    sys.path.insert(0, str(ROOT / "tests"))
    import flat_mlp as mlp

    step = bendc.jit(mlp.train_step.fn, leaves=mlp.LEAVES, target="cpu", cache_dir=str(tmp_path))
    x, y = mlp.make_data(mlp.BATCH)
    step(x, y, *mlp.init_params())
    (plan_file,) = (tmp_path / "programs").glob("*/plan.json")  # the plan as the cache stored it
    plan = KernelPlan.from_json(json.loads(plan_file.read_text()))
    intervals = _intervals(plan)
    for buffer in range(len(plan.buffers)):
        users = sorted((intervals[v], v) for v, b in plan.storage.items() if b == buffer)
        for ((_, end), first), ((start, _), second) in zip(users, users[1:]):
            assert end < start, f"%{first} and %{second} share buffer b{buffer} while both live"
        for _, value in users:
            assert nbytes(plan, value) == plan.buffers[buffer]
    assert plan.memory["planned_bytes"] <= plan.memory["naive_bytes"]


def test_donated_parameters_are_updated_in_place(tmp_path):
    def sgd(w, g):
        return F.sgd_step(w, g, 0.1)

    w, g = rand(16, 16), rand(16, 16)
    keep_w, keep_g = w.copy(), g.copy()
    plain = bendc.jit(sgd, target="cpu", cache_dir=str(tmp_path))
    out = plain(w, g)
    assert out is not w and np.array_equal(w, keep_w) and np.array_equal(g, keep_g)  # inputs untouched
    donating = bendc.jit(sgd, target="cpu", cache_dir=str(tmp_path), donate=("w",))
    out2 = donating(w, g)
    assert out2 is w  # written over the donated parameter
    assert_bitwise(out2, out, "donated update")
    assert np.array_equal(g, keep_g)
    assert "in place over the donated parameter w" in donating.report()
    # The kernel stores through w's own argument (one array loaded and stored at one index: LLVM
    # vectorizes that, where an output argument over w's memory failed its overlap check), not
    # through its output argument; the plain kernel stores through its output.
    (kernel,) = [s for s in donating.kernels().values() if "sgd" in s or "sub" in s]
    (plain_kernel,) = [s for s in plain.kernels().values() if "sgd" in s or "sub" in s]
    stores = re.findall(r"^\s+(\w+)\[i0(?:, i1)?\] = v\d+$", kernel, re.M)
    assert stores and all(name.startswith("in") for name in stores), kernel
    assert re.findall(r"^\s+(\w+)\[i0(?:, i1)?\] = v\d+$", plain_kernel, re.M) == ["out0"], plain_kernel
    w2 = keep_w.copy()
    assert_bitwise(donating(w2, g), out, "donated update, second call")


def test_a_donated_parameter_read_through_a_view_by_its_update_is_not_overwritten(tmp_path):
    # The update reads w[j, i] while it writes cell [i, j]: written over w, later cells would read
    # cells already updated (this gave wrong numbers before the memory plan refused it).
    torch = pytest.importorskip("torch")

    def f(w, g):
        return w - g * w.transpose(0, 1)

    w, g = rand(64, 64), rand(64, 64)
    want = (torch.from_numpy(w) - torch.from_numpy(g) * torch.from_numpy(w).transpose(0, 1)).numpy()
    donating = bendc.jit(f, target="cpu", cache_dir=str(tmp_path), donate=("w",))
    assert_bitwise(donating(w.copy(), g), want, "update read through a view")
    assert "the donated parameter w is not updated in place (its last reader k" in donating.report()
    assert "reads it through a view" in donating.report()


def test_cache_is_reused_and_a_corrupt_entry_is_rebuilt(tmp_path):
    def f(x, w):
        loss = (x @ w.T).relu().sum()
        loss.backward()
        return loss, w.grad

    args = (rand(8, 5), rand(3, 5))
    first = bendc.jit(f, leaves=("w",), target="cpu", cache_dir=str(tmp_path))
    want = first(*args)
    second = bendc.jit(f, leaves=("w",), target="cpu", cache_dir=str(tmp_path))
    got = second(*args)
    assert "[cache] loaded from the on-disk cache" in second.report()
    for a, b in zip(got, want):
        assert_bitwise(a, b)
    (entry,) = (tmp_path / "programs").iterdir()
    plan = entry / "plan.json"
    plan.write_text(plan.read_text().replace('"buffers"', '"buffers" ', 1))  # a changed byte
    third = bendc.jit(f, leaves=("w",), target="cpu", cache_dir=str(tmp_path))
    got = third(*args)
    assert "[cache] loaded" not in third.report()  # discarded and rebuilt
    for a, b in zip(got, want):
        assert_bitwise(a, b)
    (entry,) = (tmp_path / "programs").iterdir()
    (entry / "report.txt").unlink()  # a truncated entry
    fourth = bendc.jit(f, leaves=("w",), target="cpu", cache_dir=str(tmp_path))
    fourth(*args)
    assert "[cache] loaded" not in fourth.report()
    assert not [p for p in (tmp_path / "programs").iterdir() if p.name.startswith(".")]  # no temporaries left


def test_second_process_reuses_the_cache(tmp_path):
    code = (
        "import sys, numpy as np\n"
        f"sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
        "import flat_mlp as mlp, bendc\n"
        "step = bendc.jit(mlp.train_step.fn, leaves=mlp.LEAVES, target='cpu')\n"
        "x, y = mlp.make_data(64)\n"
        "out = step(x, y, *mlp.init_params())\n"
        "print(float(out[0]), 'cache' if '[cache] loaded' in step.report() else 'compiled')\n"
    )
    env = {**os.environ, "BENDC_CACHE_DIR": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
            for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
    first, second = (run.stdout.split() for run in runs)
    assert first[1] == "compiled" and second[1] == "cache"
    assert first[0] == second[0]


def test_index_out_of_range_names_the_line_on_cpu(tmp_path):
    def pick(x, i):
        return F.index_select(x, 0, i)  # the line the error must name

    step = bendc.jit(pick, target="cpu", cache_dir=str(tmp_path))
    step(rand(4, 3), np.array([0, 3]))
    with pytest.raises(bendc.RuntimeCheckError) as info:
        step(rand(4, 3), np.array([0, 4]))
    assert f"{Path(__file__).name}:" in str(info.value) and "index_select" in str(info.value)
    assert "index 4 is out of range" in str(info.value)


def test_canonicalize_keeps_pytorch_bits(tmp_path):
    def f(x):
        return x + 0.0, x * 1.0, (x.T).T - 0.0, -(-x)

    x = np.array([[-0.0, 0.0, 1.5], [-2.0, np.inf, -0.0]], np.float32)
    got, want, step = both(f, (), (x,), tmp_path)
    for a, b in zip(got, want):
        assert_bitwise(a, b)
    assert_bitwise(got[0], x + np.float32(0.0))  # -0.0 + 0.0 is +0.0: x + 0 is not folded
    final = step.ir("final")
    assert "permute" not in final  # permute(permute(x)) folded
    assert final.count("neg") == 0


def test_kernels_that_would_need_each_other_are_split(tmp_path):
    """Two groups, each convex, that feed each other through independent nodes."""
    def program(x, w, b):
        # an RMS-style scale from a row op: dx reads a row sum computed from the scaled rows
        loss = ((x * (x * x).logsumexp(1, keepdim=True) * w + b) * x).sum()
        loss.backward()
        return loss, x.grad, w.grad, b.grad

    args = (rand(3, 16), rand(16), rand(16))
    got, want, step = both(program, ("x", "w", "b"), args, tmp_path)
    for a, b in zip(got, want):
        assert_close(a, b)
    assert "needed each other" in step.report()


def test_outputs_the_caller_keeps_are_never_reused(tmp_path):
    """Output arrays are recycled only once the caller has dropped them."""
    def program(x):
        return x * 2.0, x + 1.0

    step = bendc.jit(program, target="cpu", cache_dir=str(tmp_path))
    x = np.arange(6, dtype=np.float32)
    kept = step(x)
    again = step(x + 1.0)
    assert kept[0] is not again[0] and np.array_equal(kept[0], x * 2.0)
    dropped = id(again[0])
    del again
    assert id(step(x)[0]) == dropped  # recycled: nothing held it


def test_views_of_planned_buffers_are_taken_once_and_copies_each_call(tmp_path):
    """A view step whose operand is a planned buffer is taken once, when the plan is bound (its
    array is the same every call); a reshape that numpy answers with a copy (here of a transposed
    buffer) stays in the launch list, so a second call with other inputs sees its new data."""
    def program(x, w):
        t = (x * w).exp().permute(1, 0)  # a view of a planned buffer: bound once
        return (t * 3.0).sum(), t.reshape(-1)[3:9] * 2.0  # the reshape of the transposed buffer copies

    step = bendc.jit(program, target="cpu", cache_dir=str(tmp_path))
    reference = bendc.jit(program, target="reference")
    for seed in (1, 2):
        args = (np.random.default_rng(seed).standard_normal((5, 4), np.float32),
                np.random.default_rng(seed + 9).standard_normal((5, 4), np.float32))
        for got, want, name in zip(step(*args), reference(*args), ("sum", "copy")):
            assert_close(got, want, f"{name}, call {seed}")
    cpu = step._executable().run.program
    views = [name for name, _, _, _, view, _ in cpu.program if view]
    bound = [array for array in cpu.values if isinstance(array, np.ndarray) and not array.flags.owndata]
    assert any(name.startswith("reshape") for name in views), views  # the copying reshape runs each call
    assert not any(name.startswith("permute") for name in views), views  # the view was bound
    assert bound, "no view bound"
