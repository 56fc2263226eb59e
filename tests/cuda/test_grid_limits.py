"""Every cuda kernel's launch within the GPU's limits at shapes past them (rendered only: nothing is
compiled or run, so no numba-cuda or GPU is needed).

A launch past grid.x = 2^31 - 1, grid.y or grid.z = 65535 blocks, or 1024 threads a block fails
with CUDA_ERROR_INVALID_VALUE. The programs below use every op with a cuda lowering (a test checks
that none is left out) at rows > 2^20, batch x heads > 65535, batch entries > 65535, groups > 65535
and columns > 2^20; large dimensions go on grid.x, or on y and z with each block looping over
them (kernels/cuda_kit.py block_loop), or into a grid-stride loop. The loops themselves run under
the simulator with the limit lowered (tests/cuda/test_sim_grid_loops.py).
"""
from __future__ import annotations

import pytest

import bendc
import bendc.functional as F
from bendc.codegen.cuda import render_cuda_plan
from bendc.codegen.memory import plan_memory
from bendc.codegen.plan import build_plan
from bendc.ops import OPS
from bendc.passes import default_passes

# The limits, written out (as the CUDA programming guide's technical specifications give them for
# every compute capability since 3.0), not read from the code under test.
GRID = (2**31 - 1, 65535, 65535)
BLOCK = (1024, 1024, 64)
THREADS = 1024

ROWS = 2**20 + 5          # rows of a matrix: a tile or a block per row would pass 65535 blocks on y
HEADS = 70000             # batch x heads of attention: a block per (batch, head) would pass 65535
GROUPS = 70000            # conv2d groups: a group per grid.z block would pass 65535


def with_schedule(schedule: str) -> tuple[str, ...]:
    return tuple(schedule if p == "attention_schedule" else p for p in default_passes())


def rows(x, w, i, g, b):
    """The row kernels (softmax, norms, reductions, int64 counts, scans, extrema, sorts), gathers and
    scatters, concat, triangle, slicing, the elementwise epilogues, and x @ w with 2^20 rows."""
    a = F.softmax(x, -1) + F.log_softmax(x, -1) + x.cumsum(1) + x.cumprod(1) + F.layer_norm(x, (4,)) + b
    s = x.logsumexp(1).sum() + x.amax(1).sum() + x.amin(1).sum() + x.max(1)[0].sum() + x.min(1)[0].sum()
    s = s + x.argmax(1).float().sum() + x.argmin(1).float().sum() + x.max() + x.min()
    s = s + (x > 0).sum(1).float().sum() + (x > 0).sum().float()  # int_sum: a thread per row, one block's tree
    c = F.gather(x, 1, i).sum() + F.index_select(w, 0, i[:, 0]).sum() + F.cat([x, x], 1).sum() + x.tril().sum()
    c = c + x.sort(1)[0].sum() + x.scatter_reduce(1, i, x[:, :1], "amax").sum()
    loss = (a * g).sum() + s + c + (x @ w).sum() + (x[1:, 1:3] * 2.0).sum()
    loss.backward()
    return loss, x.grad, w.grad, b.grad


def products(a, b, c, d, e, f):
    """matmul with 70000 batch entries, with 2^21 columns, and with 2^21 rows."""
    loss = (a @ b).sum() + (c @ d).sum() + (e @ f).sum()
    loss.backward()
    return a.grad, d.grad, e.grad


def attention(q, k, v, cos, sin):
    """rope and attention (causal and not) with 70000 batch x heads."""
    r = F.rope(q, cos, sin)
    o = F.scaled_dot_product_attention(r, k, v, is_causal=True)
    u = F.scaled_dot_product_attention(q, k, v)
    (o * u).sum().backward()
    return q.grad, k.grad, v.grad


def images(x, w, x2, w2, g, rm, rv):
    """conv2d and its gradients with 65536 images and with 70000 groups, the pools, group_norm, and a
    training batch_norm (with its running statistics) of 70000 channels."""
    y = F.conv2d(x, w, padding=1)
    z = F.conv2d(x2, w2, groups=GROUPS)
    p = F.max_pool2d(y, 2).sum() + F.avg_pool2d(y, 2).sum() + F.adaptive_avg_pool2d(y, 3).sum()
    n = F.group_norm(y, 2)
    m = F.batch_norm(z, rm, rv, None, None, True)
    loss = p + (n * g).sum() + (z * z).sum() + (m * m).sum()
    loss.backward()
    return loss, x.grad, w.grad, x2.grad, w2.grad, rm, rv


ATTENTION = (f"q=f32[{HEADS},1,8,4]:leaf k=f32[{HEADS},1,8,4]:leaf v=f32[{HEADS},1,8,4]:leaf "
             "cos=f32[8,2] sin=f32[8,2]")
PROGRAMS = [
    ("rows", rows, f"x=f32[{ROWS},4]:leaf w=f32[4,4]:leaf i=i64[{ROWS},1] g=f32[{ROWS},4] b=f32[4]:leaf", None),
    ("products", products, f"a=f32[{HEADS},4,4]:leaf b=f32[{HEADS},4,4] c=f32[4,8] d=f32[8,{2**21}]:leaf "
                           f"e=f32[{2**21},4]:leaf f=f32[4,4]", None),
    ("attention dense", attention, ATTENTION, with_schedule("attention_schedule_dense")),
    ("attention triangular", attention, ATTENTION, with_schedule("attention_schedule_triangular")),
    ("attention tiled", attention, ATTENTION, with_schedule("attention_schedule_tiled")),
    ("images", images, f"x=f32[65536,2,6,6]:leaf w=f32[4,2,3,3]:leaf x2=f32[1,{GROUPS},3,3]:leaf "
                       f"w2=f32[{GROUPS},1,2,2]:leaf g=f32[65536,4,6,6] rm=f32[{GROUPS}] rv=f32[{GROUPS}]", None),
]


def rendered(fn, shapes: str, passes):
    """(graph, plan) of a program's cuda kernels, rendered only."""
    leaves = tuple(spec.split("=")[0] for spec in shapes.split() if spec.endswith(":leaf"))
    graph = bendc.jit(fn, leaves=leaves, target="reference", passes=passes).lower(shapes).graph
    plan = build_plan(graph)
    render_cuda_plan(plan, graph)
    return graph, plan


@pytest.fixture(scope="module")
def launches() -> list[tuple[str, set[str], dict]]:
    """(program and step, the step's ops, launch) of every launch of every program."""
    found = []
    for name, fn, shapes, passes in PROGRAMS:
        graph, plan = rendered(fn, shapes, passes)
        for step in plan.steps:
            ops = {graph.node(i).op for i in step.nodes}
            found += [(f"{name}: {step.name}.{launch['kernel']}", ops, launch) for launch in step.launches]
    return found


def broken(grid, block) -> list[str]:
    problems = [f"grid.{a} = {n}" for a, n, limit in zip("xyz", grid, GRID) if not 1 <= n <= limit]
    problems += [f"block.{a} = {n}" for a, n, limit in zip("xyz", block, BLOCK) if not 1 <= n <= limit]
    if block[0] * block[1] * block[2] > THREADS:
        problems.append(f"{block[0] * block[1] * block[2]} threads a block")
    return problems


def test_every_launch_is_within_the_gpus_limits_past_each_limit(launches) -> None:
    bad = [f"{where}: grid {tuple(l['grid'])} block {tuple(l['block'])}: {', '.join(broken(l['grid'], l['block']))}"
           for where, _, l in launches if broken(l["grid"], l["block"])]
    assert bad == [], "\n".join(bad)


def test_the_programs_use_every_op_with_a_cuda_lowering(launches) -> None:
    """The collectives (all_reduce, reduce_scatter, all_gather) are host code over device arrays (no
    kernel launch of their own)."""
    host = {"all_reduce", "reduce_scatter", "all_gather"}
    lowered = {name for name, op in OPS.items() if getattr(op.lowering, "cuda", None)} - host
    used = set().union(*(ops for _, ops, _ in launches))
    assert lowered - used == set()


def test_the_large_dimensions_are_on_grid_x_or_looped(launches) -> None:
    """The shapes are past the limits for real: y and z are at their limit where a dimension is
    looped over (matmul's rows and batch entries, conv2d's groups)."""
    by_step = {where: l for where, _, l in launches}
    matmuls = [l for where, ops, l in launches if ops == {"matmul"} and where.startswith("products")]
    assert sorted(tuple(l["grid"]) for l in matmuls) >= [(1, 1, 65535)]
    assert any(tuple(l["grid"])[1] == 65535 for l in matmuls)  # 2^21 rows: 131072 row tiles, looped
    grouped = [l for where, ops, l in launches if ops & {"conv2d_grad_input", "conv2d_grad_weight"}
               and where.startswith("images")]
    assert any(tuple(l["grid"])[2] == 65535 for l in grouped), by_step


def gqa_attention(q, k, v, g):
    """bench/run.py's attention workload: causal grouped-query attention, forward and backward."""
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    o.backward(g)
    return o, q.grad, k.grad, v.grad


BENCH_ATTENTION = "q=f32[4,8,512,64]:leaf k=f32[4,2,512,64]:leaf v=f32[4,2,512,64]:leaf g=f32[4,8,512,64]"
SMS = 132  # streaming multiprocessors of an H100 or H200 (SXM), sm_90


def test_key_grads_splits_its_walk_to_fill_the_gpu_at_the_bench_shape() -> None:
    """B=4, H=8, Hkv=2, T=512, D=64 (bench/run.py's attention): a block per (batch, kv head, key tile)
    is 4 x 2 x 16 = 128 blocks for 132 SMs; split in parts of each tile's walk over 4 heads x up to
    16 query tiles it is at least two blocks per SM, and a small kernel adds the parts (in order,
    from a scratch array the memory plan places in a temporary buffer: no atomics)."""
    graph, plan = rendered(gqa_attention, BENCH_ATTENTION, with_schedule("attention_schedule_tiled"))
    (step,) = [s for s in plan.steps if "attention_tiled_grad" in {graph.node(i).op for i in s.nodes}]
    launches = {launch["kernel"]: launch for launch in step.launches}
    assert list(launches) == ["key_grads", "key_grads_sum", "query_grads"], step.launches
    assert launches["key_grads"]["grid"][0] >= 2 * SMS, launches["key_grads"]
    assert launches["key_grads"]["grid"][0] % 128 == 0  # every (batch, kv head, key tile) in the same number of parts
    parts = launches["key_grads"]["grid"][0] // 128
    scratch = step.outputs[-1]
    assert scratch >= graph.next_id and plan.values[scratch] == ("f32", (parts * 4 * 2 * 512 * (64 + 64),))
    assert step.source.count("float32[::1]") == 5 + 1 + 1  # q, k, v, the saved output, g; the packed grads; scratch
    assert "cuda.atomic" not in step.source and "key_grads_sum(in0, in1, in2, in3, in4, out0, out1)" in step.source
    plan_memory(plan)
    assert scratch in plan.storage and scratch not in plan.outputs
