"""bendc benchmarks: ratios against PyTorch measured in the same run.

    python bench/run.py [--quick] [--json] [--target cpu]

Workloads (each a median of several timed runs after warm-up):
  mlp          784-512-512-10 MLP training step, batch 256, cross-entropy, Adam:
               bendc vs torch eager and torch.compile (inductor, CPU)
  elementwise  a VJP chain over 1e7 floats: achieved GB/s vs this machine's copy bandwidth
  compile      time to the first result: cold (empty cache) and warm (second process),
               against torch.compile's cold time
  fusion       kernel launches and bytes moved per mlp step, fused vs unfused
  attention    causal grouped-query attention forward + backward (B=4, H=8, Hkv=2, T=512, D=64):
               the triangular schedule vs the dense one (same compiler, each forced), and vs
               torch's scaled_dot_product_attention (eager, same thread count)
Benchmarks are not tests: nothing here asserts on time. With --json the last
line is one JSON object {"machine": ..., "workloads": [...]}.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import bendc  # noqa: E402
import bendc.functional as F  # noqa: E402

BATCH, FEATURES, HIDDEN, CLASSES = 256, 784, 512, 10
LEAVES = ("w1", "b1", "w2", "b2", "w3", "b3")


def median_time(fn, runs: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# ------------------------------------------------------------------ mlp
def mlp_step(x, y, w1, b1, w2, b2, w3, b3, m_w1, v_w1, m_b1, v_b1, m_w2, v_w2, m_b2, v_b2,
             m_w3, v_w3, m_b3, v_b3, step=1):
    """Forward, cross-entropy, backward and an Adam update of every parameter."""
    hidden = F.relu(F.linear(x, w1, b1))
    hidden = F.relu(F.linear(hidden, w2, b2))
    loss = F.cross_entropy(F.linear(hidden, w3, b3), y)
    loss.backward()
    results = [loss]
    for param, m, v in ((w1, m_w1, v_w1), (b1, m_b1, v_b1), (w2, m_w2, v_w2), (b2, m_b2, v_b2),
                        (w3, m_w3, v_w3), (b3, m_b3, v_b3)):
        results.extend(F.adam_step(param, param.grad, m, v, step, 1e-3))
    return tuple(results)


def mlp_inputs(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)

    def layer(out_features, in_features):
        bound = 1.0 / np.sqrt(in_features)
        return (rng.uniform(-bound, bound, (out_features, in_features)).astype(np.float32),
                rng.uniform(-bound, bound, out_features).astype(np.float32))

    w1, b1 = layer(HIDDEN, FEATURES)
    w2, b2 = layer(HIDDEN, HIDDEN)
    w3, b3 = layer(CLASSES, HIDDEN)
    x = rng.standard_normal((BATCH, FEATURES), dtype=np.float32)
    y = rng.integers(0, CLASSES, BATCH)
    params = [w1, b1, w2, b2, w3, b3]
    moments = [np.zeros_like(p) for p in params for _ in range(2)]
    return [x, y, *params, *moments]


def bench_mlp(target: str, runs: int, with_compile: bool) -> dict:
    import torch

    args = mlp_inputs()
    step = bendc.jit(mlp_step, leaves=LEAVES, target=target,
                     donate=LEAVES + tuple(f"{k}_{p}" for p in LEAVES for k in ("m", "v")))
    state = [a.copy() for a in args]

    def bendc_step():
        # A training loop: the updated parameters and moments feed the next step (donated, in place).
        out = step(*state)
        for index in range(6):
            state[2 + index] = out[1 + 3 * index]
            state[8 + 2 * index] = out[2 + 3 * index]
            state[9 + 2 * index] = out[3 + 3 * index]

    bendc_time = median_time(bendc_step, runs)

    torch.set_num_threads(os.cpu_count() or 1)
    params = [torch.tensor(a, requires_grad=True) for a in args[2:8]]
    x, y = torch.tensor(args[0]), torch.tensor(args[1])
    optimizer = torch.optim.Adam(params, lr=1e-3)

    def forward(x, y, w1, b1, w2, b2, w3, b3):
        hidden = torch.relu(torch.nn.functional.linear(x, w1, b1))
        hidden = torch.relu(torch.nn.functional.linear(hidden, w2, b2))
        return torch.nn.functional.cross_entropy(torch.nn.functional.linear(hidden, w3, b3), y)

    def torch_step(loss_fn):
        optimizer.zero_grad(set_to_none=True)
        loss_fn(x, y, *params).backward()
        optimizer.step()

    eager_time = median_time(lambda: torch_step(forward), runs)
    result = {"name": "mlp", "target": target, "bendc_ms": bendc_time * 1e3, "torch_eager_ms": eager_time * 1e3,
              "speedup_vs_torch_eager": eager_time / bendc_time}
    if with_compile:
        try:
            compiled = torch.compile(forward)
            torch_step(compiled)
            compile_time = median_time(lambda: torch_step(compiled), runs)
            result["torch_compile_ms"] = compile_time * 1e3
            result["speedup_vs_torch_compile"] = compile_time / bendc_time
        except Exception as error:  # inductor needs a working C++ toolchain
            result["torch_compile_error"] = str(error).splitlines()[0][:200]
    return result


# ------------------------------------------------------------------ elementwise
def elementwise_chain(x, w, b):
    """A long elementwise forward and its VJP chain (+ - * and relu): one fused kernel,
    bound by memory bandwidth."""
    y = ((x * w + b).relu() * x - b) * w
    (y * x).sum().backward()
    return w.grad, b.grad


def transcendental_chain(x, w, b):
    """The same shape of chain through tanh and sigmoid: bound by the math library."""
    y = ((x * w + b).tanh() * x - b).sigmoid() * w
    (y * x).sum().backward()
    return w.grad, b.grad


def bench_elementwise(target: str, runs: int, size: int, chain=elementwise_chain,
                      name: str = "elementwise") -> dict:
    import torch

    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(size, dtype=np.float32) for _ in range(3))
    step = bendc.jit(chain, leaves=("w", "b"), target=target)
    step(x, w, b)
    seconds = median_time(lambda: step(x, w, b), runs)
    stats = step.stats()
    moved = stats.get("bytes_moved", 0)
    source, destination = np.empty(size, np.float32), np.empty(size, np.float32)
    source[:] = 1.0
    copy_seconds = median_time(lambda: np.copyto(destination, source), runs)
    copy_bandwidth = 2 * source.nbytes / copy_seconds
    tx, tw, tb = (torch.tensor(a, requires_grad=name != "x") for name, a in (("x", x), ("w", w), ("b", b)))

    def torch_chain():  # the chains use tensor methods only: the same function runs on torch tensors
        tw.grad = tb.grad = None
        chain(tx, tw, tb)

    torch_seconds = median_time(torch_chain, runs)
    return {"name": name, "target": target, "elements": size, "bendc_ms": seconds * 1e3,
            "torch_eager_ms": torch_seconds * 1e3, "speedup_vs_torch_eager": torch_seconds / seconds,
            "launches": stats.get("launches"), "bytes_moved": moved,
            "achieved_gb_per_s": moved / seconds / 1e9, "copy_gb_per_s": copy_bandwidth / 1e9,
            "fraction_of_copy_bandwidth": moved / seconds / copy_bandwidth}


# ------------------------------------------------------------------ compile latency
_FIRST_RESULT = """
import sys, time
start = time.perf_counter()
sys.path.insert(0, {root!r})
sys.path.insert(0, {bench!r})
import bendc
from run import mlp_step, mlp_inputs, LEAVES
step = bendc.jit(mlp_step, leaves=LEAVES, target={target!r})
step(*mlp_inputs())
print(time.perf_counter() - start)
"""

_TORCH_FIRST_RESULT = """
import time
start = time.perf_counter()
import torch
torch.manual_seed(0)
x, y = torch.randn(256, 784), torch.randint(0, 10, (256,))
params = [torch.randn(512, 784, requires_grad=True), torch.zeros(512, requires_grad=True),
          torch.randn(512, 512, requires_grad=True), torch.zeros(512, requires_grad=True),
          torch.randn(10, 512, requires_grad=True), torch.zeros(10, requires_grad=True)]
def forward(x, y, w1, b1, w2, b2, w3, b3):
    h = torch.relu(torch.nn.functional.linear(x, w1, b1))
    h = torch.relu(torch.nn.functional.linear(h, w2, b2))
    return torch.nn.functional.cross_entropy(torch.nn.functional.linear(h, w3, b3), y)
optimizer = torch.optim.Adam(params, lr=1e-3)
compiled = torch.compile(forward)
compiled(x, y, *params).backward()
optimizer.step()
print(time.perf_counter() - start)
"""


def _time_subprocess(code: str, env: dict) -> float:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
    if result.returncode != 0:
        raise RuntimeError(result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "failed")
    return float(result.stdout.strip().splitlines()[-1])


def bench_compile(target: str, with_torch: bool) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "BENDC_CACHE_DIR": cache, "NUMBA_CACHE_DIR": os.path.join(cache, "numba")}
        code = _FIRST_RESULT.format(root=str(ROOT), bench=str(ROOT / "bench"), target=target)
        cold = _time_subprocess(code, env)
        warm = _time_subprocess(code, env)
    result = {"name": "compile", "target": target, "bendc_cold_s": cold, "bendc_warm_s": warm}
    if with_torch:
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
            try:
                torch_cold = _time_subprocess(_TORCH_FIRST_RESULT, env)
                result["torch_compile_cold_s"] = torch_cold
                result["cold_speedup_vs_torch_compile"] = torch_cold / cold
            except Exception as error:
                result["torch_compile_error"] = str(error)[:200]
    return result


# ------------------------------------------------------------------ fusion effect
def bench_fusion(target: str) -> dict:
    args = mlp_inputs()
    result = {"name": "fusion", "target": target}
    for label, passes in (("fused", None), ("unfused", ["dce", "canonicalize", "cse"])):
        step = bendc.jit(mlp_step, leaves=LEAVES, target=target, passes=passes)
        step.lower({name: bendc_type(a) for name, a in zip(step.signature.parameters, args)})
        for key, value in step.stats().items():
            result[f"{label}_{key}"] = value
    return result


def bendc_type(array: np.ndarray) -> str:
    dtype = {np.dtype(np.float32): "f32", np.dtype(np.int64): "i64"}[array.dtype]
    return f"{dtype}[{','.join(map(str, array.shape))}]"


# ------------------------------------------------------------------ attention
def attention_step(q, k, v, g):
    """Causal grouped-query attention, forward and backward with the output gradient g."""
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    o.backward(g)
    return o, q.grad, k.grad, v.grad


def interleaved_medians(fns: dict, runs: int, warmup: int = 2) -> dict:
    """Median seconds of each function, timed in alternating rounds (a noisy machine drifts)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def bench_attention(target: str, runs: int, quick: bool) -> dict:
    import numba
    import torch
    from bendc.passes import default_passes

    batch, heads, kv_heads, t, depth = (2, 8, 2, 128, 64) if quick else (4, 8, 2, 512, 64)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((batch, heads, t, depth), dtype=np.float32)
    k = rng.standard_normal((batch, kv_heads, t, depth), dtype=np.float32)
    v = rng.standard_normal((batch, kv_heads, t, depth), dtype=np.float32)
    g = rng.standard_normal((batch, heads, t, depth), dtype=np.float32)
    steps = {}
    for schedule in ("triangular", "dense"):
        passes = [f"attention_schedule_{schedule}" if p == "attention_schedule" else p for p in default_passes()]
        steps[schedule] = bendc.jit(attention_step, leaves=("q", "k", "v"), target=target, passes=passes)

    threads = numba.get_num_threads()
    torch.set_num_threads(threads)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    tg = torch.tensor(g)

    def torch_step():
        tq.grad = tk.grad = tv.grad = None
        o = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True, enable_gqa=True)
        o.backward(tg)
        return o

    expected = [torch_step().detach().numpy(), tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy()]
    error = max(float(np.max(np.abs(a - b))) for step in steps.values() for a, b in zip(step(q, k, v, g), expected))
    seconds = interleaved_medians({"triangular": lambda: steps["triangular"](q, k, v, g),
                                   "dense": lambda: steps["dense"](q, k, v, g), "torch": torch_step}, runs)
    return {"name": "attention", "target": target, "shape": f"B={batch} H={heads} Hkv={kv_heads} T={t} D={depth}",
            "threads": threads, "triangular_ms": seconds["triangular"] * 1e3, "dense_ms": seconds["dense"] * 1e3,
            "torch_eager_ms": seconds["torch"] * 1e3, "triangular_vs_dense": seconds["dense"] / seconds["triangular"],
            "speedup_vs_torch_eager": seconds["torch"] / seconds["triangular"], "max_abs_diff_vs_torch": error}


# ------------------------------------------------------------------ main
def machine() -> dict:
    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "numpy": np.__version__, "bendc": bendc.__version__}


def format_row(result: dict) -> str:
    parts = [f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items() if k != "name"]
    return f"{result['name']:<12} " + "  ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs, smaller sizes, no torch.compile")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument("--target", default="cpu", choices=["cpu"])
    parser.add_argument("--only", nargs="*", help="workload names to run")
    args = parser.parse_args(argv)
    runs = 5 if args.quick else 20
    workloads = {
        "mlp": lambda: bench_mlp(args.target, runs, with_compile=not args.quick),
        "elementwise": lambda: bench_elementwise(args.target, runs, 10**6 if args.quick else 10**7),
        "transcendental": lambda: bench_elementwise(args.target, runs, 10**6 if args.quick else 10**7,
                                                    transcendental_chain, "transcendental"),
        "compile": lambda: bench_compile(args.target, with_torch=not args.quick),
        "fusion": lambda: bench_fusion(args.target),
        "attention": lambda: bench_attention(args.target, runs, args.quick),
    }
    results = []
    for name, run in workloads.items():
        if args.only and name not in args.only:
            continue
        result = run()
        results.append(result)
        print(format_row(result), flush=True)
    if args.json:
        print(json.dumps({"machine": machine(), "workloads": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
