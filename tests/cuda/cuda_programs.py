"""Small programs that together produce every kind of CUDA kernel, with tiny
inputs (the simulator costs ~170 us per thread) and the kinds each must make.

Shared by the simulator tests (run them, compare with the reference
interpreter) and the PTX tests (compile every kernel for sm_90).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

import bendc
import bendc.functional as F

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Program:
    name: str
    fn: Callable
    leaves: tuple[str, ...]
    make_inputs: Callable[[np.random.Generator], tuple]
    kinds: frozenset[str]  # step kinds (with "copy" for a materialized view) the plan must contain
    bitwise: tuple[int, ...] = ()  # outputs that must match the reference bit for bit
    static: dict = field(default_factory=dict)
    passes: tuple[str, ...] | None = None  # None: the default passes


def normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# ------------------------------------------------------------------ elementwise and epilogues
def elementwise_chain(x, w, b):
    y = ((x * w + b) * x - b) / (w * w + 1.0)
    (y * x).sum().backward()
    return y, w.grad, b.grad


def activations(x, g):
    y = F.gelu(x) + F.gelu(x, approximate="tanh") + F.sigmoid(x) * F.tanh(x) + x.exp().sqrt()
    z = (F.relu(x) + 1.0).log()
    return y * g, z


def adam(p, g, m, v):
    return F.adam_step(p, g, m, v, 3, 1e-2, weight_decay=0.01)


# ------------------------------------------------------------------ rows and reductions
def softmax_rows(x, w):
    a = F.softmax(x * w, 1)
    b = F.log_softmax(x * w, 0)
    ((a * b).sum() + (a * x).sum()).backward()
    return a, b, w.grad


def sums(x, t):
    return x.sum(1), x.sum(0, keepdim=True), x.sum(), t.sum((0, 2)), t.mean(1)


# ------------------------------------------------------------------ matrix products
def linear_layer(x, w, b):
    loss = F.mse_loss(F.linear(x, w, b), x[:, :3] * 2.0)
    loss.backward()
    return loss, w.grad, b.grad


def batched(a, b, c):
    y = (a @ b).tanh() @ c.transpose(0, 1)
    y.sum().backward()
    return y, a.grad, b.grad


# ------------------------------------------------------------------ gathers and scatters
def indexing(x, i, j):
    picked = F.index_select(x, 0, i) * 2.0
    taken = F.gather(x, 1, j)
    (picked.sum() + (taken * taken).sum()).backward()
    return picked, taken, x.grad


def split_projection(x, w):
    """Slices that tile a product: their gradient is one concat (canonicalize), read through views."""
    qkv = x @ w
    y = (qkv[:, :2] * qkv[:, 2:3]).sum() + qkv[:, 3:].T.sum()
    y.backward()
    return y, w.grad


def cross_entropy(logits, y):
    loss = F.cross_entropy(logits, y)
    loss.backward()
    return loss, logits.grad


# ------------------------------------------------------------------ layout
def layouts(x, w):
    t = x.permute(1, 0, 2)                       # returned to the caller: a copy
    r = x.permute(2, 1, 0).reshape(4, 6)         # no strides describe the reshape: a copy
    s = x[1, :, 1:4:2]                           # basic indexing: offset and strides
    y = (r * 2.0).sum(0) + s.reshape(6)[:4].sum() + t[0, 1, 2]
    (y * w).sum().backward()
    return y, t, w.grad, x.grad, s


def hoisted(a, b):
    """b.grad sums an expanded constant seed: a step that depends on constants only (run once, at bind)."""
    y = a * 2.0 + b
    y.sum().backward()
    return y, b.grad


# ------------------------------------------------------------------ normalization and rope
def layer_norms(x, w, b, g):
    """layer_norm with an affine over the last dim, without one over the last two, and over a
    transposed view (no strides describe its rows: the statistics split row and column indexes)."""
    y = F.layer_norm(x, (4,), w, b)
    z = F.layer_norm(x, (3, 4))
    u = F.layer_norm(x.transpose(0, 1), (2, 4), eps=1e-3)
    ((y * g).sum() + (z * z * g).sum() + (u * u).sum()).backward()
    return y, z, u, x.grad, w.grad, b.grad


def group_norm(x, w, b, g):
    y = F.group_norm(x, 2, w, b)
    (y * g).sum().backward()
    return y, x.grad, w.grad, b.grad


def rope(x, cos, sin, g):
    """rope of a transposed view (as q after its head split), gradients for x, cos and sin."""
    y = F.rope(x.transpose(1, 2), cos, sin)
    y.backward(g)
    return y, x.grad, cos.grad, sin.grad


# ------------------------------------------------------------------ attention
def attention(causal: bool):
    def step(q, k, v, g):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        o.backward(g)
        return o, q.grad, k.grad, v.grad

    step.__name__ = f"attention_{'causal' if causal else 'full'}"
    return step


def self_attention(x, g):
    """One operand read as q, k and v (one kernel argument each), causal; run with the dense schedule."""
    o = F.scaled_dot_product_attention(x, x, x, is_causal=True)
    o.backward(g)
    return o, x.grad


def _attention_inputs(batch: int, heads: int, kv_heads: int, t: int, depth: int, width: int):
    def make(rng: np.random.Generator) -> tuple:
        return (normal(rng, batch, heads, t, depth), normal(rng, batch, kv_heads, t, depth),
                normal(rng, batch, kv_heads, t, width), normal(rng, batch, heads, t, width))

    return make


def _dense_passes() -> tuple[str, ...]:
    from bendc.passes import default_passes

    return tuple("attention_schedule_dense" if p == "attention_schedule" else p for p in default_passes())


def _triangular_passes() -> tuple[str, ...]:
    from bendc.passes import default_passes

    return tuple("attention_schedule_triangular" if p == "attention_schedule" else p for p in default_passes())


def mlp_program():
    """tests/flat_mlp.py's train_step, the mlp example with one parameter per array (the caller
    picks tiny shapes)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import flat_mlp as mlp

    return mlp.train_step.fn, mlp.LEAVES


def _mlp_inputs(rng: np.random.Generator, batch: int = 4, features: int = 8, hidden: int = 8,
                classes: int = 3) -> tuple:
    return (normal(rng, batch, features), rng.integers(0, classes, size=batch).astype(np.int64),
            normal(rng, hidden, features) * 0.3, normal(rng, hidden) * 0.1,
            normal(rng, classes, hidden) * 0.3, normal(rng, classes) * 0.1)


def _indexing_inputs(rng: np.random.Generator) -> tuple:
    return (normal(rng, 5, 4), np.array([4, 0, 4, 2], np.int64), rng.integers(0, 4, size=(5, 3)).astype(np.int32))


PROGRAMS: list[Program] = [
    Program("elementwise_chain", elementwise_chain, ("w", "b"),
            lambda rng: (normal(rng, 4, 5), normal(rng, 4, 5), normal(rng, 5)),
            frozenset({"elementwise"}), bitwise=(0, 1)),
    Program("activations", activations, (),
            lambda rng: (normal(rng, 3, 5), normal(rng, 3, 5)), frozenset({"elementwise"})),
    Program("adam", adam, (),
            lambda rng: (normal(rng, 4, 6), normal(rng, 4, 6), normal(rng, 4, 6), np.abs(normal(rng, 4, 6))),
            frozenset({"elementwise"})),
    Program("softmax_rows", softmax_rows, ("w",),
            lambda rng: (normal(rng, 3, 5), normal(rng, 3, 5)), frozenset({"row", "elementwise"})),
    Program("sums", sums, (),
            lambda rng: (normal(rng, 3, 70), normal(rng, 2, 3, 4)), frozenset({"reduce"})),
    Program("linear_layer", linear_layer, ("w", "b"),
            lambda rng: (normal(rng, 4, 5), normal(rng, 3, 5), normal(rng, 3)),
            frozenset({"matmul", "elementwise"})),
    Program("batched_matmul", batched, ("a", "b"),
            lambda rng: (normal(rng, 2, 1, 3, 4), normal(rng, 2, 4, 5) * 0.5, normal(rng, 2, 5)),
            frozenset({"matmul", "reduce"})),
    Program("indexing", indexing, ("x",), _indexing_inputs,
            frozenset({"gather", "scatter"})),
    Program("split_projection", split_projection, ("w",),
            lambda rng: (normal(rng, 3, 4), normal(rng, 4, 5)), frozenset({"matmul", "scatter"})),
    Program("cross_entropy", cross_entropy, ("logits",),
            lambda rng: (normal(rng, 4, 3), np.array([2, 0, 1, 2], np.int64)),
            frozenset({"row", "gather", "scatter"})),
    Program("hoisted", hoisted, ("b",), lambda rng: (normal(rng, 3, 4), normal(rng, 4)),
            frozenset({"elementwise", "reduce"})),
    Program("layouts", layouts, ("w", "x"),
            lambda rng: (normal(rng, 2, 3, 4), normal(rng, 6)), frozenset({"layout", "copy"})),
    Program("layer_norm", layer_norms, ("x", "w", "b"),
            lambda rng: (normal(rng, 2, 3, 4), normal(rng, 4), normal(rng, 4), normal(rng, 2, 3, 4)),
            frozenset({"row", "elementwise"})),
    Program("group_norm", group_norm, ("x", "w", "b"),
            lambda rng: (normal(rng, 2, 4, 3), normal(rng, 4), normal(rng, 4), normal(rng, 2, 4, 3)),
            frozenset({"row", "elementwise"})),
    Program("rope", rope, ("x", "cos", "sin"),
            lambda rng: (normal(rng, 1, 3, 2, 4), normal(rng, 3, 2), normal(rng, 3, 2), normal(rng, 1, 2, 3, 4)),
            frozenset({"row"}), bitwise=(0, 1)),
    # GQA (4 query heads over 2 key/value heads), odd and even t, tiny head sizes (D 2, Dv 3).
    Program("attention_causal_t3", attention(True), ("q", "k", "v"), _attention_inputs(1, 4, 2, 3, 2, 3),
            frozenset({"attention"})),
    Program("attention_causal_t4", attention(True), ("q", "k", "v"), _attention_inputs(2, 4, 2, 4, 2, 2),
            frozenset({"attention"})),
    Program("attention_full_t3", attention(False), ("q", "k", "v"), _attention_inputs(1, 4, 2, 3, 2, 3),
            frozenset({"attention"})),
    Program("attention_full_t4", attention(False), ("q", "k", "v"), _attention_inputs(1, 4, 2, 4, 3, 2),
            frozenset({"attention"})),
    Program("attention_causal_dense", self_attention, ("x",),
            lambda rng: (normal(rng, 1, 2, 3, 2), normal(rng, 1, 2, 3, 2)), frozenset({"attention"}),
            passes=_dense_passes()),
]


MLP_KINDS = frozenset({"matmul", "row", "gather", "scatter", "reduce", "elementwise"})


# ------------------------------------------------------------------ dropout, activations, losses (op-coverage issue)
def dropout_chain(x, w, s):
    y = F.dropout(x * w, 0.4, seed=s)
    z = F.dropout(y + 1.0, 0.25, seed=s)  # a second call: another offset
    (z * x).sum().backward()
    return y, z, w.grad


def activation_grads(x, w):
    h = x * w
    y = F.silu(h) + F.softplus(h, 2.0, 1.0) + F.leaky_relu(h, 0.1) + F.elu(h, 0.5) + F.hardtanh(h, -0.5, 0.5)
    y.sum().backward()
    return y, w.grad


def class_losses(logits, target, x, y, pos_weight, index, table):
    loss = F.cross_entropy(logits, target, ignore_index=1, label_smoothing=0.1)
    loss = loss + F.nll_loss(F.log_softmax(logits, 1), target, reduction="sum")
    loss = loss + F.binary_cross_entropy_with_logits(x, y, pos_weight=pos_weight)
    loss = loss + F.normalize(x).sum() + F.embedding(index, table, padding_idx=0).sum()
    loss.backward()
    return loss, logits.grad, x.grad, table.grad


def attention_dropout(q, k, v, s):
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, is_causal=True, enable_gqa=True, seed=s)
    (out * out).sum().backward()
    return out, q.grad, v.grad


OPS_RANDOM_PROGRAMS: list[Program] = [
    Program("dropout_chain", dropout_chain, ("w",),
            lambda rng: (normal(rng, 4, 6), normal(rng, 4, 6), np.array(77, np.int64)),
            frozenset({"elementwise"}), bitwise=(0, 1, 2)),
    Program("activation_grads", activation_grads, ("w",),
            lambda rng: (normal(rng, 3, 5), normal(rng, 3, 5)), frozenset({"elementwise"})),
    Program("class_losses", class_losses, ("logits", "x", "table"),
            lambda rng: (normal(rng, 4, 3), np.array([0, 1, 2, 1]), normal(rng, 2, 3),
                         rng.uniform(0, 1, (2, 3)).astype(np.float32), rng.uniform(0.5, 2, (3,)).astype(np.float32),
                         np.array([[0, 2], [1, 0]]), normal(rng, 3, 2)),
            frozenset({"elementwise", "gather", "row"})),
    Program("attention_dropout", attention_dropout, ("q", "v"),
            lambda rng: (normal(rng, 1, 2, 3, 2), normal(rng, 1, 1, 3, 2), normal(rng, 1, 1, 3, 2),
                         np.array(5, np.int64)),
            frozenset({"elementwise", "matmul", "row"})),
]


def mlp_tiny() -> Program:
    """tests/flat_mlp.py at batch 4, features 8, hidden 8, classes 3 (for the simulator)."""
    fn, leaves = mlp_program()
    return Program("mlp", fn, leaves, _mlp_inputs, MLP_KINDS, static={"lr": 0.1})


def mlp_example() -> Program:
    """tests/flat_mlp.py at its EXAMPLE_SHAPES (batch 64, 64 features, 128 hidden, 10 classes)."""
    fn, leaves = mlp_program()
    import flat_mlp as mlp

    def inputs(rng: np.random.Generator) -> tuple:
        return _mlp_inputs(rng, mlp.BATCH, mlp.FEATURES, mlp.HIDDEN, mlp.CLASSES)

    return Program("mlp_example", fn, leaves, inputs, MLP_KINDS, static={"lr": 0.1})


def transformer_layer(x, w, b, cos, sin, q, k, v):
    """The norm, rope and attention kernels at GPU shapes (for PTX: registers and spills)."""
    y = F.layer_norm(x, (512,), w, b)
    r = F.rope(q, cos, sin)
    o = F.scaled_dot_product_attention(r, k, v, is_causal=True, enable_gqa=True)
    u = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    ((y * y).sum() + (o * u).sum()).backward()
    return y, w.grad, q.grad, k.grad, v.grad


def transformer_example() -> Program:
    """transformer_layer with x (512, 512) and q (2, 8, 256, 64), k and v (2, 2, 256, 64)."""
    def inputs(rng: np.random.Generator) -> tuple:
        return (normal(rng, 512, 512), normal(rng, 512), normal(rng, 512), normal(rng, 256, 32),
                normal(rng, 256, 32), normal(rng, 2, 8, 256, 64), normal(rng, 2, 2, 256, 64),
                normal(rng, 2, 2, 256, 64))

    # The triangular schedule forced (dense where not causal): these are the row schedules' kernels at
    # GPU shapes (the reference target's rule, and cuda's, would tile t=256; tiled_attention_program
    # below covers the tiled kernels).
    return Program("transformer_example", transformer_layer, ("w", "q", "k", "v"), inputs,
                   frozenset({"row", "attention", "elementwise"}), passes=_triangular_passes())


# ------------------------------------------------------------------ the tiled attention schedule on cuda (GPU issue, item 5)
def _tiled_passes() -> tuple[str, ...]:
    from bendc.passes import default_passes

    return tuple("attention_schedule_tiled" if p == "attention_schedule" else p for p in default_passes())


def tiled_attention_program(name: str, causal: bool, batch: int, heads: int, kv_heads: int, t: int, depth: int,
                            width: int) -> Program:
    """Causal or full GQA attention, forward and backward, with the tiled schedule forced."""
    return Program(name, attention(causal), ("q", "k", "v"), _attention_inputs(batch, heads, kv_heads, t, depth, width),
                   frozenset({"attention"}), passes=_tiled_passes())


# ------------------------------------------------------------------ convolution and pooling (op-coverage issue)
def conv_block(x, w, b, w2):
    """conv2d (bias, padding) -> max pool (ceil_mode) -> grouped, strided, dilated conv2d without bias."""
    h = F.max_pool2d(F.conv2d(x, w, b, padding=1), 2, ceil_mode=True)
    y = F.conv2d(h, w2, stride=(1, 2), padding=(1, 0), dilation=(2, 1), groups=2)
    (y * y).sum().backward()
    return y, x.grad, w.grad, b.grad, w2.grad


def pools(x, g):
    """max pool (padding, dilation) over ties, avg pools with and without the padding counted, adaptive."""
    a = F.max_pool2d(x, 2, 1, 1, 2)
    b = F.avg_pool2d(x, 3, 2, 1, ceil_mode=True) + F.avg_pool2d(x, 3, 2, 1, ceil_mode=True,
                                                                count_include_pad=False)
    c = F.adaptive_avg_pool2d(x, (2, 3))
    ((a * a).sum() + (b * g).sum() + (c * c).sum()).backward()
    return a, b, c, x.grad


CONV_PROGRAMS: list[Program] = [
    Program("conv_block", conv_block, ("x", "w", "b", "w2"),
            lambda rng: (normal(rng, 2, 2, 5, 4), normal(rng, 4, 2, 3, 3) * 0.3, normal(rng, 4),
                         normal(rng, 4, 2, 2, 2) * 0.3),
            frozenset({"matmul", "row", "reduce"})),
    Program("pools", pools, ("x",),
            lambda rng: (np.round(normal(rng, 1, 2, 5, 4)), normal(rng, 1, 2, 3, 3)),
            frozenset({"row"}), bitwise=(0, 1, 2)),
]


def cnn_example() -> Program:
    """examples/cnn.py's step at its EXAMPLE_SHAPES' batch and image size (for PTX: registers and spills)."""
    sys.path.insert(0, str(ROOT / "examples"))
    import cnn

    def step(x, y, conv1_w, conv1_b, norm1_w, norm1_b, conv2_w, conv2_b, norm2_w, norm2_b, head_w, head_b):
        params = dict(conv1_w=conv1_w, conv1_b=conv1_b, norm1_w=norm1_w, norm1_b=norm1_b, conv2_w=conv2_w,
                      conv2_b=conv2_b, norm2_w=norm2_w, norm2_b=norm2_b, head_w=head_w, head_b=head_b)
        loss = F.cross_entropy(cnn.forward(params, x), y)
        loss.backward()
        return (loss, *(p.grad for p in params.values()))

    def inputs(rng: np.random.Generator) -> tuple:
        x, y = cnn.make_data(cnn.BATCH)
        return (x, y, *cnn.init_params().values())

    return Program("cnn_example", step, tuple(cnn.param_shapes()), inputs,
                   frozenset({"matmul", "row", "elementwise"}))


def all_programs() -> list[Program]:
    """Every kind-covering program, the mlp example at tiny and at its own shapes, and the norm,
    rope and attention kernels at GPU shapes."""
    return (PROGRAMS + OPS_RANDOM_PROGRAMS + CONV_PROGRAMS
            + [mlp_tiny(), mlp_example(), transformer_example(), cnn_example()])


def plan_kinds(plan) -> set[str]:
    """The step kinds of a plan that launch kernels; a materialized view counts as "copy"."""
    kinds = set()
    for step in plan.steps:
        if step.kind == "layout":
            kinds.add("copy" if step.convention == "write" else "layout")
        else:
            kinds.add(step.kind)
    return kinds


def report_kinds(report: str) -> set[str]:
    """The same kinds, read from a compile report's plan lines (``k0: elementwise, 20 cells, ...``)."""
    kinds = set()
    for line in report.splitlines():
        if not line.startswith("[cuda] ") or ": " not in line[7:]:
            continue
        body = line[7:].split(": ", 1)[1]
        kind, _, rest = body.partition(", ")
        if rest.startswith("view"):
            kinds.add("layout" if kind == "layout" else kind)
        elif " cells" in rest.split(",")[0]:
            kinds.add("copy" if kind == "layout" else kind)
    return kinds


def spec_of(program: Program, inputs: tuple) -> str:
    """The SPEC string of a program's inputs (for ``lower``)."""
    import inspect

    names = [n for n in inspect.signature(program.fn).parameters if n not in program.static]
    parts = []
    for name, array in zip(names, inputs):
        dtype = {np.float32: "f32", np.int64: "i64", np.int32: "i32"}[array.dtype.type]
        leaf = ":leaf" if name in program.leaves else ""
        parts.append(f"{name}=f32[{','.join(map(str, array.shape))}]{leaf}".replace("f32", dtype, 1))
    return " ".join(parts)


def jitted(program: Program, target: str, cache_dir: str | None = None):
    return bendc.jit(program.fn, leaves=program.leaves, target=target, cache_dir=cache_dir,
                     passes=program.passes)
