"""bendc benchmarks: ratios against PyTorch measured in the same run.

    python bench/run.py [--quick] [--json] [--target cpu|cuda]

Workloads (each a median of several timed runs after warm-up):
  transformer  4-layer decoder (B=4 T=64 D=64, 4 heads, 2 kv heads, FF=128, vocab 50, RoPE, GELU) step with Adam:
               bendc vs torch eager and torch.compile, alternating rounds (bench/models.py)
  gpt          2-layer char GPT (B=16 T=64 D=128, 4 heads, fused q/k/v projection split by slices, GELU MLP,
               Adam), the same comparisons
  attention_long  the attention workload at B=4 T=2048 (few runs): the pass's own schedule (tiled: the
               triangular one's P and G would take 512 MiB, over the budget) vs torch's SDPA
  cnn          examples/cnn.py's step (batch 64, 16x16 digits, two conv/GroupNorm/SiLU/pool blocks, AdamW):
               bendc vs torch eager and torch.compile, alternating rounds
  transcendental  also reports max ulp of exp, log, tanh, sigmoid, gelu and the chain against torch
  mlp          784-512-512-10 MLP training step, batch 256, cross-entropy, Adam:
               bendc vs torch eager and torch.compile (inductor, CPU)
  elementwise  a VJP chain over 1e7 floats: achieved GB/s vs this machine's copy bandwidth
  gpt_small    nanoGPT's model (examples/gpt.py) at 2 layers, n_embd 64, 4 heads, B=8 T=64, vocab 65, through
               functional_call, AdamW with nanoGPT's decay groups, lr traced: vs torch eager and torch.compile
  mnist_cnn    pytorch/examples' MNIST Net (conv 1->32->64 3x3, max pool, dropout 0.25/0.5, 9216->128->10,
               log_softmax + nll, SGD), batch 64 of 1x28x28, through functional_call: the same comparisons
  compile      time to the first result of mlp, transformer, gpt, cnn, gpt_small and mnist_cnn, each in a
               fresh process: bendc cold (empty kernel cache) and warm (a second process), against
               torch.compile's cold time (empty inductor cache)
  fusion       kernel launches and bytes moved per mlp step, fused vs unfused
  data_parallel  the mlp step data-parallel on 1, 2, 4 and 8 ranks (mpiexec -n N, global batch 256 split):
               step time, beside the step without the all-reduce, the exchange alone, the share of
               the exchange hidden behind compute, and the bytes a rank sends per step over the
               gradient bytes (bench/data_parallel.py; bench/scaling.py models more ranks)
  attention    causal grouped-query attention forward + backward (B=4, H=8, Hkv=2, T=512, D=64):
               the tiled, triangular and dense schedules (same compiler, each forced), and vs
               torch's scaled_dot_product_attention (eager, same thread count)
  attention_short  the same at T=64 (B=4, H=8, Hkv=2, D=64): the pass's own schedule (tiled: each head
               fused in cache), triangular and dense, vs torch's SDPA
Steps against torch alternate in rounds; each turn starts after TURN_PAUSE idle and runs steps in
a row, as a training loop does (at least STEPS_PER_TURN and TURN_SECONDS of them), and the figures
are the medians of all but each turn's first (``first_step_ms``: those, which start after the other
framework's step; see STEPS_PER_TURN).
--target cuda runs bench/cuda_bench.py's workloads instead (mlp, transformer, gpt, attention,
elementwise, launch_overhead: the cubin runtime's graph and eager launches and numba's loop vs
torch eager CUDA and torch.compile(mode="reduce-overhead")); without a GPU it stops with a message.
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
from typing import Sequence

# --threads N: every pool (numba's, OpenBLAS's, torch's OpenMP and MKL) gets N threads; set
# before numpy, numba or torch load. On a machine whose cores other work shares, spinning
# OpenMP pools slow each other down unpredictably: one thread each compares the code itself.
if "--threads" in sys.argv[1:-1]:
    _THREADS = sys.argv[sys.argv.index("--threads") + 1]
    for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[_name] = _THREADS

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import bendc  # noqa: E402
import bendc.functional as F  # noqa: E402
from models import GPT, TRANSFORMER  # noqa: E402

BATCH, FEATURES, HIDDEN, CLASSES = 256, 784, 512, 10
LEAVES = ("w1", "b1", "w2", "b2", "w3", "b3")


def bench_threads() -> int:
    """The threads torch gets: --threads N, else every core (bendc's numba pool has them all)."""
    return int(os.environ.get("NUMBA_NUM_THREADS", os.cpu_count() or 1))


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

    torch.set_num_threads(bench_threads())
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
    ulp = {}
    if name == "transcendental":
        ulp = {"max_ulp_vs_torch": transcendental_ulps(target)}
        grads = step(x, w, b)
        torch_chain()
        # The chain's gradients cancel (1 - y*y, 1 - y near 0): relative to their largest value, not ulp.
        ulp["chain_max_rel_diff_vs_torch"] = max(
            float(np.max(np.abs(a - t.numpy())) / np.max(np.abs(t.numpy()))) for a, t in zip(grads, (tw.grad, tb.grad)))
    return {**ulp, "name": name, "target": target, "elements": size, "bendc_ms": seconds * 1e3,
            "torch_eager_ms": torch_seconds * 1e3, "speedup_vs_torch_eager": torch_seconds / seconds,
            "launches": stats.get("launches"), "bytes_moved": moved,
            "achieved_gb_per_s": moved / seconds / 1e9, "copy_gb_per_s": copy_bandwidth / 1e9,
            "fraction_of_copy_bandwidth": moved / seconds / copy_bandwidth}


def ulp_distance(actual, expected) -> np.ndarray:
    def ordered(x):
        bits = np.asarray(x, dtype=np.float32).view(np.int32).astype(np.int64)
        return np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)

    return np.abs(ordered(actual) - ordered(expected))


def transcendental_ulps(target: str, size: int = 10**6) -> dict:
    """Max ulp of each compiled transcendental against torch's CPU result on random float32 inputs."""
    import torch

    rng = np.random.default_rng(1)
    wide = rng.standard_normal(size, dtype=np.float32) * np.float32(20)
    positive = np.abs(wide) + np.float32(1e-3)
    cases = {"exp": (lambda x: x.exp(), wide, torch.exp), "log": (lambda x: x.log(), positive, torch.log),
             "tanh": (lambda x: x.tanh(), wide, torch.tanh), "sigmoid": (lambda x: x.sigmoid(), wide, torch.sigmoid),
             "gelu": (lambda x: F.gelu(x), wide / np.float32(4), torch.nn.functional.gelu)}
    result = {}
    def program_of(fn):
        def program(x):
            return fn(x)
        return program

    for name, (fn, x, reference) in cases.items():
        actual = bendc.jit(program_of(fn), target=target)(x)
        expected = reference(torch.tensor(x)).numpy()
        if name == "gelu":  # x * (1 + erf(x / sqrt 2)) / 2 cancels for x < 0: an erf ulp is many gelu ulps
            result["gelu_max_abs_diff"] = float(np.max(np.abs(actual - expected)))
        else:
            result[name] = int(ulp_distance(actual, expected).max())
    return result


# ------------------------------------------------------------------ compile latency
def _time_subprocess(code: str, env: dict) -> float:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
    if result.returncode != 0:
        raise RuntimeError(result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "failed")
    return float(result.stdout.strip().splitlines()[-1])


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


# Consecutive steps each framework runs per turn of the alternating rounds. A training loop runs
# step after step; a step that follows the other framework's pays for it: the other's data in the
# caches and, at two threads and more, torch's OpenMP workers still spinning after its step (~5-7
# ms of a core after a torch.compile step, measured with getrusage around a sleep: the next bendc
# step ran 6.2 ms against 4.2 ms back to back, gpt_small at 2 threads; the attention at T=64, ~0.6
# ms a step back to back, ran ~1.05 ms through turns of 4 steps). So each turn starts after
# TURN_PAUSE seconds idle (the other's workers asleep by then) and runs at least STEPS_PER_TURN
# steps and TURN_SECONDS of them; the steady figure is the median of all but each turn's first, and
# the first steps are reported beside (``first_step_ms``).
STEPS_PER_TURN = 4
TURN_SECONDS = 0.05
TURN_PAUSE = 0.02


def interleaved_times(fns: dict, runs: int, warmup: int = 2, block: int = 1, firsts: dict | None = None) -> dict:
    """Seconds of each run of each function, timed in alternating rounds (a noisy machine drifts).
    With ``block`` > 1 each round runs each function in a turn of its own, after TURN_PAUSE seconds
    idle: at least ``block`` calls and TURN_SECONDS of them; the first call of a turn goes to
    ``firsts`` where given, the others to the result."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            if block > 1:
                time.sleep(TURN_PAUSE)
            index, turn = 0, time.perf_counter()
            while index < block or (block > 1 and time.perf_counter() - turn < TURN_SECONDS):
                start = time.perf_counter()
                fn()
                seconds = time.perf_counter() - start
                if block > 1 and index == 0:
                    if firsts is not None:
                        firsts.setdefault(name, []).append(seconds)
                else:
                    times[name].append(seconds)
                index += 1
    return times


def interleaved_medians(fns: dict, runs: int, warmup: int = 2) -> dict:
    """Median seconds of each function, timed in alternating rounds (a noisy machine drifts)."""
    return {name: statistics.median(values) for name, values in interleaved_times(fns, runs, warmup).items()}


def interleaved_turns(fns: dict, runs: int) -> tuple[dict, dict]:
    """Each function timed in turns of STEPS_PER_TURN steps and more (interleaved_times): the seconds
    of all but each turn's first step, and the median milliseconds of the first steps (the
    ``first_step_ms`` of a result)."""
    firsts: dict = {}
    times = interleaved_times(fns, runs, block=STEPS_PER_TURN, firsts=firsts)
    return times, {name: statistics.median(values) * 1e3 for name, values in firsts.items()}


def bench_attention(target: str, runs: int, shape: tuple[int, int, int, int, int],
                    schedules: tuple[str, ...] = ("tiled", "triangular", "dense"), name: str = "attention") -> dict:
    """Each schedule forced (``auto``: the attention_schedule pass's own choice, named in the
    result), against torch's SDPA: medians and minimums of alternating rounds."""
    import numba
    import torch
    from bendc.passes import default_passes

    batch, heads, kv_heads, t, depth = shape
    rng = np.random.default_rng(0)
    q = rng.standard_normal((batch, heads, t, depth), dtype=np.float32)
    k = rng.standard_normal((batch, kv_heads, t, depth), dtype=np.float32)
    v = rng.standard_normal((batch, kv_heads, t, depth), dtype=np.float32)
    g = rng.standard_normal((batch, heads, t, depth), dtype=np.float32)
    steps = {}
    for schedule in schedules:
        passes = [f"attention_schedule_{schedule}" if p == "attention_schedule" and schedule != "auto" else p
                  for p in default_passes()]
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
    result = {"name": name, "target": target, "shape": f"B={batch} H={heads} Hkv={kv_heads} T={t} D={depth}",
              "threads": threads}
    for schedule, step in steps.items():
        outputs = step(q, k, v, g)
        result[f"{schedule}_max_rel_diff_vs_torch"] = max(
            float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30)) for a, b in zip(outputs, expected))
        if schedule == "auto":
            line = next(l for l in step.report().splitlines() if l.startswith("[attention_schedule]"))
            _, chosen, reason = line.split(": ", 2)
            result["auto_schedule"] = chosen
            result["auto_reason"] = reason.split("; ")[0]
    fns = {schedule: (lambda step=step: step(q, k, v, g)) for schedule, step in steps.items()}
    fns["torch"] = torch_step
    times, result["first_step_ms"] = interleaved_turns(fns, runs)
    seconds = {name: statistics.median(values) for name, values in times.items()}
    for schedule in steps:
        result[f"{schedule}_ms"] = seconds[schedule] * 1e3
        result[f"{schedule}_min_ms"] = min(times[schedule]) * 1e3
    result["torch_eager_ms"] = seconds["torch"] * 1e3
    result["torch_eager_min_ms"] = min(times["torch"]) * 1e3
    best = min(steps, key=lambda schedule: seconds[schedule])
    if "triangular" in steps and "dense" in steps:
        result["triangular_vs_dense"] = seconds["dense"] / seconds["triangular"]
    if "tiled" in steps and "dense" in steps:
        result["tiled_vs_dense"] = seconds["dense"] / seconds["tiled"]
    if "tiled" in steps and "triangular" in steps:
        result["tiled_vs_triangular"] = seconds["triangular"] / seconds["tiled"]
    result["fastest_schedule"] = best
    result["speedup_vs_torch_eager"] = seconds["torch"] / seconds[best]
    result["speedup_vs_torch_eager_of_mins"] = min(times["torch"]) / min(times[best])
    return result


# ------------------------------------------------------------------ decoder language models
def torch_decoder(config, data: dict, names: list[str]):
    """torch's side of a decoder workload, from the same inputs and parameters as bendc's: (the eager
    step given a loss function, the loss function torch.compile compiles); Adam at lr 3e-3."""
    import torch
    from models import TorchOps, decoder_forward

    ops = TorchOps()
    tparams = {n: torch.tensor(data["params"][n], requires_grad=True) for n in names}
    tokens, targets = torch.tensor(data["tokens"]), torch.tensor(data["targets"]).reshape(-1)
    cos, sin = torch.tensor(data["cos"]), torch.tensor(data["sin"])
    optimizer = torch.optim.Adam(list(tparams.values()), lr=3e-3)

    def loss_fn(tokens, targets, cos, sin, *values):
        logits = decoder_forward(ops, config, tokens, cos, sin, dict(zip(names, values)))
        return torch.nn.functional.cross_entropy(logits, targets)

    def torch_step(fn):
        optimizer.zero_grad(set_to_none=True)
        loss = fn(tokens, targets, cos, sin, *tparams.values())
        loss.backward()
        optimizer.step()
        return loss

    return torch_step, loss_fn


def bench_decoder(target: str, runs: int, with_compile: bool, config, name: str) -> dict:
    """A decoder's training step (forward, cross-entropy, backward, Adam): bendc vs torch eager
    and torch.compile (the forward and loss compiled, Adam eager, as in `mlp`)."""
    import torch
    from models import decoder_inputs, decoder_program

    data = decoder_inputs(config)
    step_fn, names = decoder_program(config)
    params = [data["params"][n] for n in names]
    moments = [np.zeros_like(p) for p in params]
    count = len(names)
    donated = tuple(names) + tuple(f"{k}_{n}" for n in names for k in ("m", "v"))
    step = bendc.jit(step_fn, leaves=tuple(names), target=target, donate=donated)
    fixed = [data["tokens"], data["targets"], data["cos"], data["sin"], np.array(1, np.int64)]
    state = [a.copy() for a in params] + [a.copy() for a in moments] + [a.copy() for a in moments]

    def bendc_step():
        out = step(*fixed, *state)
        state[:count] = out[1::3]
        state[count:2 * count] = out[2::3]
        state[2 * count:] = out[3::3]
        return out[0]

    torch.set_num_threads(bench_threads())
    torch_step, loss_fn = torch_decoder(config, data, names)

    # The first step from the same parameters: the losses agree (a check that both run one model).
    first_bendc = float(step(*fixed, *(a.copy() for a in params + moments + moments))[0])
    result = {"name": name, "target": target, "model": config.describe()}
    return compare_with_torch(result, bendc_step, torch_step, loss_fn, runs, with_compile, first_bendc)


def compare_with_torch(result: dict, bendc_step, torch_step, loss_fn, runs: int, with_compile: bool,
                       first_bendc: float) -> dict:
    """``result`` with bendc's step against ``torch_step(loss_fn)`` eager and, with_compile, with
    loss_fn under torch.compile, in alternating rounds; the first losses of both."""
    import torch

    first_torch = float(torch_step(loss_fn).detach())
    fns = {"bendc": bendc_step, "eager": lambda: torch_step(loss_fn)}
    if with_compile:
        try:
            compiled = torch.compile(loss_fn)
            torch_step(compiled)
            fns["compile"] = lambda: torch_step(compiled)
        except Exception as error:  # inductor needs a working C++ toolchain
            result["torch_compile_error"] = str(error).splitlines()[0][:200]
    times, result["first_step_ms"] = interleaved_turns(fns, runs)
    seconds = {name: statistics.median(values) for name, values in times.items()}
    result.update({"bendc_ms": seconds["bendc"] * 1e3, "torch_eager_ms": seconds["eager"] * 1e3,
                   "speedup_vs_torch_eager": seconds["eager"] / seconds["bendc"]})
    if "compile" in seconds:
        result["torch_compile_ms"] = seconds["compile"] * 1e3
        result["speedup_vs_torch_compile"] = seconds["compile"] / seconds["bendc"]
    result["first_loss_bendc"], result["first_loss_torch"] = first_bendc, first_torch
    return result


# ------------------------------------------------------------------ cnn (op-coverage issue)
def bench_cnn(target: str, runs: int, with_compile: bool) -> dict:
    """examples/cnn.py's training step (two conv -> GroupNorm -> SiLU -> max pool blocks, a linear
    head, cross-entropy, AdamW) vs the same model in torch eager and torch.compile (the forward and
    loss compiled, AdamW eager), alternating rounds."""
    import torch
    import torch.nn.functional as TF

    sys.path.insert(0, str(ROOT / "examples"))
    import cnn

    x, y = cnn.make_data(cnn.BATCH)
    step = bendc.jit(cnn.train_step.fn, leaves=("params",), target=target, donate=("params", "opt_state"))
    state = {"params": cnn.init_params(), "opt_state": bendc.optim.init_adam(cnn.init_params())}

    def bendc_step():
        loss, state["params"], state["opt_state"] = step(state["params"], state["opt_state"], x, y)
        return loss

    torch.set_num_threads(bench_threads())
    tparams = {n: torch.tensor(a, requires_grad=True) for n, a in cnn.init_params().items()}
    optimizer = torch.optim.AdamW(list(tparams.values()), lr=1e-2)
    tx, ty = torch.tensor(x), torch.tensor(y)

    def loss_fn(x, y, p):
        h = x
        for number in (1, 2):
            h = TF.conv2d(h, p[f"conv{number}_w"], p[f"conv{number}_b"], padding=1)
            h = TF.group_norm(h, cnn.GROUPS[number - 1], p[f"norm{number}_w"], p[f"norm{number}_b"])
            h = TF.max_pool2d(TF.silu(h), 2)
        logits = TF.linear(h.reshape(h.shape[0], cnn.HIDDEN), p["head_w"], p["head_b"])
        return TF.cross_entropy(logits, y)

    def torch_step(fn):
        optimizer.zero_grad(set_to_none=True)
        loss = fn(tx, ty, tparams)
        loss.backward()
        optimizer.step()
        return loss

    first_bendc = float(np.asarray(step(cnn.init_params(), bendc.optim.init_adam(cnn.init_params()), x, y)[0]))
    result = {"name": "cnn", "target": target, "model": f"batch {cnn.BATCH}, 1x{cnn.SIZE}x{cnn.SIZE}, "
                                                       f"channels {cnn.CHANNELS}"}
    return compare_with_torch(result, bendc_step, torch_step, loss_fn, runs, with_compile, first_bendc)


# ------------------------------------------------------------------ models as users write them (issue 23)
class MnistNet:
    """pytorch/examples' MNIST model (conv 1->32->64 3x3, max pool, dropout 0.25 / 0.5, linear
    9216->128->10, log_softmax), built lazily so that importing this file needs no torch."""

    @staticmethod
    def make(seed: int = 0):
        import torch
        import torch.nn as nn
        import torch.nn.functional as TF

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv1 = nn.Conv2d(1, 32, 3, 1)
                self.conv2 = nn.Conv2d(32, 64, 3, 1)
                self.dropout1 = nn.Dropout(0.25)
                self.dropout2 = nn.Dropout(0.5)
                self.fc1 = nn.Linear(9216, 128)
                self.fc2 = nn.Linear(128, 10)

            def forward(self, x):
                x = TF.relu(self.conv1(x))
                x = TF.relu(self.conv2(x))
                x = TF.max_pool2d(x, 2)
                x = self.dropout1(x)
                x = torch.flatten(x, 1)
                x = TF.relu(self.fc1(x))
                x = self.dropout2(x)
                return TF.log_softmax(self.fc2(x), dim=1)

        torch.manual_seed(seed)
        return Net()


def gpt_small_model():
    """examples/gpt.py's nanoGPT model at the public 2-layer size: n_embd 64, 4 heads, T=64, vocab 65."""
    sys.path.insert(0, str(ROOT / "examples"))
    import gpt
    import torch

    torch.manual_seed(0)
    config = gpt.GPTConfig(block_size=64, vocab_size=65, n_layer=2, n_head=4, n_embd=64, dropout=0.0, bias=True)
    return gpt, gpt.GPT(config)


GPT_SMALL_BATCH, MNIST_BATCH = 8, 64


def gpt_small_workload(target: str):
    """(bendc step, torch eager step, the loss function to torch.compile, the compiled step maker) of
    gpt_small: nanoGPT's model through functional_call, AdamW with nanoGPT's decay groups, lr traced."""
    import torch

    gpt, model = gpt_small_model()
    groups = model.configure_optimizers(0.1)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 65, (GPT_SMALL_BATCH, 64))
    targets = rng.integers(0, 65, (GPT_SMALL_BATCH, 64))

    @bendc.jit(leaves=("params",), dynamic=("lr",), target=target, donate=("params", "opt_state"))
    def step(params, opt_state, batch, lr):
        x, y = batch
        _, loss = bendc.functional_call(model, params, x, y)
        loss.backward()
        new_params, new_state = dict(params), []
        for group, state in zip(groups, opt_state):
            names = group["params"]
            updated, state = bendc.optim.adamw({n: params[n] for n in names}, {n: params[n].grad for n in names},
                                               state, lr, betas=(0.9, 0.99), weight_decay=group["weight_decay"])
            new_params.update(updated)
            new_state.append(state)
        return loss, new_params, new_state

    params = bendc.params(model)
    state = {"params": params, "opt_state": [bendc.optim.init_adam({n: params[n] for n in g["params"]})
                                             for g in groups]}

    def bendc_step():
        loss, state["params"], state["opt_state"] = step(state["params"], state["opt_state"], (idx, targets), 1e-3)
        return loss

    torch.set_num_threads(bench_threads())
    tmodel = gpt.GPT(model.config)
    tmodel.load_state_dict(model.state_dict())
    named = dict(tmodel.named_parameters())
    optimizer = torch.optim.AdamW([{"params": [named[n] for n in g["params"]], "weight_decay": g["weight_decay"]}
                                   for g in groups], lr=1e-3, betas=(0.9, 0.99))
    tx, ty = torch.tensor(idx), torch.tensor(targets)

    def loss_fn(x, y):
        return tmodel(x, y)[1]

    def torch_step(fn):
        optimizer.zero_grad(set_to_none=True)
        loss = fn(tx, ty)
        loss.backward()
        optimizer.step()
        return loss

    return bendc_step, torch_step, loss_fn


def mnist_cnn_workload(target: str):
    """mnist_cnn: pytorch/examples' MNIST Net through functional_call (dropout on, a seed a step),
    nll_loss, SGD (lr 0.01), batch 64 of 1x28x28."""
    import torch
    import torch.nn.functional as TF

    model = MnistNet.make()
    model.train()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((MNIST_BATCH, 1, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, MNIST_BATCH)

    @bendc.jit(leaves=("params",), target=target, donate=("params",))
    def step(params, opt_state, x, y, seed):
        bendc.functional.dropout_seed(seed)
        loss = TF.nll_loss(bendc.functional_call(model, params, x), y)
        loss.backward()
        params, opt_state = bendc.optim.sgd(params, bendc.tree.map(lambda p: p.grad, params), opt_state, 0.01)
        return loss, params, opt_state

    params = bendc.params(model)
    state = {"params": params, "opt_state": bendc.optim.init_sgd(params), "seed": 0}

    def bendc_step():
        state["seed"] += 1
        loss, state["params"], state["opt_state"] = step(state["params"], state["opt_state"], x, y,
                                                         np.array(state["seed"], np.int64))
        return loss

    torch.set_num_threads(bench_threads())
    tmodel = MnistNet.make()
    tmodel.train()
    optimizer = torch.optim.SGD(tmodel.parameters(), lr=0.01)
    tx, ty = torch.tensor(x), torch.tensor(y)

    def loss_fn(x, y):
        return TF.nll_loss(tmodel(x), y)

    def torch_step(fn):
        optimizer.zero_grad(set_to_none=True)
        loss = fn(tx, ty)
        loss.backward()
        optimizer.step()
        return loss

    return bendc_step, torch_step, loss_fn


def bench_workload(name: str, make, target: str, runs: int, with_compile: bool, model: str) -> dict:
    """A user-written model's training step: bendc vs torch eager and torch.compile, alternating."""
    bendc_step, torch_step, loss_fn = make(target)
    first_bendc = float(np.asarray(bendc_step()))
    return compare_with_torch({"name": name, "target": target, "model": model}, bendc_step, torch_step, loss_fn,
                              runs, with_compile, first_bendc)


# ------------------------------------------------------------------ cold compile, per workload
# Each a script that times its own process from start to the first result: bendc with an empty
# kernel cache, torch.compile with an empty inductor cache.
_COLD_BENDC = """
import sys, time
start = time.perf_counter()
sys.path.insert(0, {root!r}); sys.path.insert(0, {bench!r})
import run
step = run.COLD_WORKLOADS[{name!r}]({target!r})[0]
step()
print(time.perf_counter() - start)
"""

_COLD_TORCH = """
import sys, time
start = time.perf_counter()
sys.path.insert(0, {root!r}); sys.path.insert(0, {bench!r})
import torch, run
_, torch_step, loss_fn = run.COLD_WORKLOADS[{name!r}]("reference")
torch_step(torch.compile(loss_fn))
print(time.perf_counter() - start)
"""


def mlp_workload(target: str):
    import torch

    args = mlp_inputs()
    step = bendc.jit(mlp_step, leaves=LEAVES, target=target)
    params = [torch.tensor(a, requires_grad=True) for a in args[2:8]]
    x, y = torch.tensor(args[0]), torch.tensor(args[1])
    optimizer = torch.optim.Adam(params, lr=1e-3)

    def loss_fn(x, y, *p):
        hidden = torch.relu(torch.nn.functional.linear(x, p[0], p[1]))
        hidden = torch.relu(torch.nn.functional.linear(hidden, p[2], p[3]))
        return torch.nn.functional.cross_entropy(torch.nn.functional.linear(hidden, p[4], p[5]), y)

    def torch_step(fn):
        optimizer.zero_grad(set_to_none=True)
        loss = fn(x, y, *params)
        loss.backward()
        optimizer.step()
        return loss

    return (lambda: step(*args)), torch_step, loss_fn


def decoder_workload(config):
    def make(target: str):
        from models import decoder_inputs, decoder_program

        data = decoder_inputs(config)
        step_fn, names = decoder_program(config)
        params = [data["params"][n] for n in names]
        moments = [np.zeros_like(p) for p in params]
        step = bendc.jit(step_fn, leaves=tuple(names), target=target)
        fixed = [data["tokens"], data["targets"], data["cos"], data["sin"], np.array(1, np.int64)]
        torch_step, loss_fn = torch_decoder(config, data, names)
        return (lambda: step(*fixed, *params, *moments, *moments)[0]), torch_step, loss_fn
    return make


def cnn_workload(target: str):
    import torch
    import torch.nn.functional as TF

    sys.path.insert(0, str(ROOT / "examples"))
    import cnn

    x, y = cnn.make_data(cnn.BATCH)
    step = bendc.jit(cnn.train_step.fn, leaves=("params",), target=target)
    tparams = {n: torch.tensor(a, requires_grad=True) for n, a in cnn.init_params().items()}
    optimizer = torch.optim.AdamW(list(tparams.values()), lr=1e-2)
    tx, ty = torch.tensor(x), torch.tensor(y)

    def loss_fn(x, y):
        h = x
        for number in (1, 2):
            h = TF.conv2d(h, tparams[f"conv{number}_w"], tparams[f"conv{number}_b"], padding=1)
            h = TF.group_norm(h, cnn.GROUPS[number - 1], tparams[f"norm{number}_w"], tparams[f"norm{number}_b"])
            h = TF.max_pool2d(TF.silu(h), 2)
        return TF.cross_entropy(TF.linear(h.reshape(h.shape[0], cnn.HIDDEN), tparams["head_w"], tparams["head_b"]), y)

    def torch_step(fn):
        optimizer.zero_grad(set_to_none=True)
        loss = fn(tx, ty)
        loss.backward()
        optimizer.step()
        return loss

    params = cnn.init_params()
    return (lambda: step(params, bendc.optim.init_adam(params), x, y)[0]), torch_step, loss_fn


COLD_WORKLOADS = {"mlp": mlp_workload, "transformer": decoder_workload(TRANSFORMER), "gpt": decoder_workload(GPT),
                  "cnn": cnn_workload, "gpt_small": gpt_small_workload, "mnist_cnn": mnist_cnn_workload}


def bench_cold_compile(target: str, names: Sequence[str], with_torch: bool) -> dict:
    """Time to the first result of each workload in a fresh process: bendc with an empty kernel cache
    (and again warm: a second process), torch.compile with an empty inductor cache."""
    result: dict = {"name": "compile", "target": target}
    for name in names:
        values = {"root": str(ROOT), "bench": str(ROOT / "bench"), "name": name, "target": target}
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "BENDC_CACHE_DIR": cache}
            try:
                cold = _time_subprocess(_COLD_BENDC.format(**values), env)
                warm = _time_subprocess(_COLD_BENDC.format(**values), env)
            except Exception as error:  # noqa: BLE001 - reported, the others still run
                result[f"{name}_error"] = str(error)[:200]
                continue
        result[f"{name}_bendc_cold_s"], result[f"{name}_bendc_warm_s"] = cold, warm
        if with_torch:
            with tempfile.TemporaryDirectory() as cache:
                env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
                try:
                    torch_cold = _time_subprocess(_COLD_TORCH.format(**values), env)
                except Exception as error:  # noqa: BLE001 - inductor needs a working C++ toolchain
                    result[f"{name}_torch_compile_error"] = str(error)[:200]
                    continue
            result[f"{name}_torch_compile_cold_s"] = torch_cold
            result[f"{name}_bendc_over_torch_compile"] = cold / torch_cold
    return result


# ------------------------------------------------------------------ main
def blas() -> dict:
    """numpy's BLAS: library, version and the kernel it runs (threadpoolctl where installed, else
    numpy's build config and OpenBLAS's own openblas_get_corename), and the OPENBLAS_* variables."""
    info: dict = {name: os.environ[name] for name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if name in os.environ}
    try:
        from threadpoolctl import threadpool_info
        for entry in threadpool_info():
            if entry.get("user_api") == "blas":
                info.update({"library": entry.get("internal_api"), "version": entry.get("version"),
                             "kernel": entry.get("architecture"), "threads": entry.get("num_threads"),
                             "source": "threadpoolctl"})
                return info
    except ImportError:
        pass
    try:
        import ctypes
        config = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        info.update({"library": config.get("name"), "version": config.get("version"), "source": "numpy config"})
        libs = [line.split()[-1] for line in open(f"/proc/{os.getpid()}/maps") if "openblas" in line.lower()]
        if libs:
            library = ctypes.CDLL(libs[0])
            for prefix in ("scipy_openblas_get_corename64_", "openblas_get_corename64_", "openblas_get_corename"):
                if hasattr(library, prefix):
                    getattr(library, prefix).restype = ctypes.c_char_p
                    info["kernel"] = getattr(library, prefix)().decode()
                    break
    except Exception as error:  # the figures still run without it
        info["error"] = str(error)[:200]
    return info


# ------------------------------------------------------------------ data parallel (bendc.distributed)
def bench_data_parallel(runs: int) -> dict:
    """bench/data_parallel.py under ``mpiexec -n 1``, ``2``, ``4`` and ``8`` (the venv's mpiexec,
    loopback only: 4 and 8 ranks oversubscribe a machine of fewer cores) with DDP's 25 MB buckets
    (one bucket for this model: nothing to overlap), and on 2 ranks with 1 MB ones."""
    from bendc.distributed import LOOPBACK_ENV, loopback_command, mpiexec, remove_stale_shared_memory

    if not mpiexec().exists():
        return {"name": "data_parallel", "skipped": "no mpiexec beside python: pip install -e '.[distributed]'"}
    env = {**os.environ, **LOOPBACK_ENV, "PYTHONPATH": str(ROOT)}
    measured = {}
    for ranks, bucket_mb in ((1, 25.0), (2, 25.0), (2, 1.0), (4, 25.0), (8, 25.0)):
        command = loopback_command(ranks, [str(ROOT / "bench" / "data_parallel.py"), str(runs), str(bucket_mb)])
        remove_stale_shared_memory()  # killed ranks' regions: a rank reusing their pid fails in MPI_Init
        output = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800, check=True).stdout
        measured[(ranks, bucket_mb)] = json.loads(output.strip().splitlines()[-1])
    one, two, small = measured[(1, 25.0)], measured[(2, 25.0)], measured[(2, 1.0)]
    return {"name": "data_parallel", "step_ms_1rank": one["step_ms"], "step_ms_2ranks": two["step_ms"],
            "no_all_reduce_ms_2ranks": two["step_ms_without_all_reduce"], "comm_ms": two["communication_ms"],
            "hidden": two["hidden"], "step_ms_2ranks_1mb": small["step_ms"], "buckets_1mb": small["buckets"],
            "no_all_reduce_ms_1mb": small["step_ms_without_all_reduce"], "comm_ms_1mb": small["communication_ms"],
            "hidden_1mb": small["hidden"],
            **{f"step_ms_{n}ranks": measured[(n, 25.0)]["step_ms"] for n in (4, 8)},
            **{f"bytes_per_gradient_byte_{n}ranks": measured[(n, 25.0)]["bytes_per_gradient_byte"] for n in (2, 4, 8)}}


def machine() -> dict:
    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "threads": bench_threads(), "load_average": os.getloadavg(),
            "numpy": np.__version__, "bendc": bendc.__version__, "blas": blas(), "bendc_sgemm": bendc_sgemm()}


def bendc_sgemm() -> str:
    """The sgemm bendc's float32 products call (runtime/native/blas.py: MKL or OpenBLAS, BENDC_BLAS)."""
    from runtime.native import blas as native_blas

    return native_blas.sgemm().name


def format_row(result: dict) -> str:
    parts = [f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items() if k != "name"]
    return f"{result['name']:<12} " + "  ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs, smaller sizes, no torch.compile")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument("--target", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--only", nargs="*", help="workload names to run")
    parser.add_argument("--threads", type=int, help="threads for every pool, bendc's and torch's (default: all cores)")
    args = parser.parse_args(argv)
    # --target cuda: the cuda workloads (bench/cuda_bench.py), which need a GPU
    if args.target == "cuda":
        from cuda_bench import gpu_info, run_cuda

        results = run_cuda(args.only, args.quick, lambda result: print(format_row(result), flush=True))
        if args.json:
            print(json.dumps({"machine": {**machine(), **gpu_info()}, "workloads": results}))
        return 0
    runs = 5 if args.quick else 20
    workloads = {
        "mlp": lambda: bench_mlp(args.target, runs, with_compile=not args.quick),
        "elementwise": lambda: bench_elementwise(args.target, runs, 10**6 if args.quick else 10**7),
        "transcendental": lambda: bench_elementwise(args.target, runs, 10**6 if args.quick else 10**7,
                                                    transcendental_chain, "transcendental"),
        "compile": lambda: bench_cold_compile(args.target, ["mlp"] if args.quick else list(COLD_WORKLOADS),
                                              with_torch=not args.quick),
        "fusion": lambda: bench_fusion(args.target),
        "attention": lambda: bench_attention(args.target, runs, (2, 8, 2, 128, 64) if args.quick else (4, 8, 2, 512, 64)),
        # T=64: each head fused in cache (the pass's choice from t=8 to 64) against the per-row schedules
        "attention_short": lambda: bench_attention(args.target, runs, (2, 8, 2, 32, 64) if args.quick else (4, 8, 2, 64, 64),
                                                   ("auto", "triangular", "dense"), "attention_short"),
        # T=2048, B=4: the pass's own choice, which must be tiled (triangular's P and G would take
        # 512 MiB, over the budget); few runs.
        "attention_long": lambda: bench_attention(args.target, 3, (1, 8, 2, 512, 64) if args.quick else (4, 8, 2, 2048, 64),
                                                  ("auto",), "attention_long"),
        "transformer": lambda: bench_decoder(args.target, runs, not args.quick, TRANSFORMER, "transformer"),
        "gpt": lambda: bench_decoder(args.target, runs, not args.quick, GPT, "gpt"),
        "data_parallel": lambda: bench_data_parallel(runs),
        "cnn": lambda: bench_cnn(args.target, runs, not args.quick),  # op-coverage issue
        "gpt_small": lambda: bench_workload("gpt_small", gpt_small_workload, args.target, runs, not args.quick,
                                            "nanoGPT 2 layers, n_embd 64, 4 heads, B=8 T=64, vocab 65, AdamW"),
        "mnist_cnn": lambda: bench_workload("mnist_cnn", mnist_cnn_workload, args.target, runs, not args.quick,
                                            "pytorch/examples MNIST Net, batch 64 of 1x28x28, dropout, SGD"),
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
