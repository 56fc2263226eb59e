"""bench/run.py --target cuda: bendc's cuda artifacts against torch on the same GPU, in one run.

Each workload's step is exported as a cuda artifact for this GPU (``bendc.jit(...).export(...,
target="cuda")``) and run three ways from the same plan: the cubin runtime replaying one CUDA
graph (``graph``), the same packed launches one by one through cuda.core (``eager``) and numba's
dispatcher per launch (``numba``, the JIT path); against torch eager CUDA and
``torch.compile(mode="reduce-overhead")`` (the forward and loss compiled, backward and Adam
eager, as the cpu workloads do). Inputs live on the device (torch CUDA tensors); a training
step's updated parameters and moments feed the next step. Times are host wall time per step
including a final synchronisation (median of alternating rounds); ``us_per_launch_<mode>`` is
that time over the plan's kernel launches, and ``launch_overhead`` measures it at tiny shapes
where the kernels themselves take next to nothing (with the graph replay's GPU time per node, from
CUDA events). The elementwise bandwidth is the graph replay's GPU time against a device-to-device
copy's. Nothing here has run on a GPU yet.
"""
from __future__ import annotations

import inspect
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import bendc
import runtime

MODES = ("graph", "eager", "numba")


def gpu_missing() -> str | None:
    """Why the cuda benchmarks cannot run here, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA GPU"
    from runtime.cuda_graph import device_arch

    if device_arch() is None:
        return "cuda.core (pip install 'bendc[cuda]') cannot reach a GPU"
    from bendc.compile import cuda_status

    if cuda_status() != "gpu":
        return "numba-cuda cannot use the GPU"
    return None


def timed(fns: dict, runs: int, warmup: int = 3) -> dict:
    """Median seconds per call of each function (each followed by a device synchronisation)."""
    import torch

    for fn in fns.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    times: dict = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def spec_of(fn, arrays: list[np.ndarray]) -> str:
    """``x=f32[256,784] y=i64[256] ...`` for the function's first parameters."""
    names = list(inspect.signature(fn).parameters)[:len(arrays)]
    kinds = {np.dtype(np.float32): "f32", np.dtype(np.int64): "i64"}
    return " ".join(f"{n}={kinds[a.dtype]}[{','.join(map(str, a.shape))}]" for n, a in zip(names, arrays))


def bendc_steps(fn, leaves, arrays, feeds: dict[int, int], folder: str) -> tuple[dict, dict]:
    """(mode -> one training step on device-resident state, facts): ``feeds`` maps an output
    slot to the input slot it updates."""
    import torch
    from runtime.cuda_graph import device_arch

    bendc.jit(fn, leaves=leaves, target="cpu").export(folder, spec_of(fn, arrays), target="cuda", arch=device_arch())
    steps, facts = {}, {}
    for mode in MODES:
        program = runtime.load(folder, cuda_runtime=mode, outputs="static")
        state = [torch.as_tensor(a, device="cuda") for a in arrays]

        def step(program=program, state=state):
            outputs = program.run_device(*state)
            for output, slot in feeds.items():
                state[slot] = outputs[output]  # read back on the next call (device to device)
            return outputs

        steps[mode] = step
        facts["plan"] = program.plan
        facts.setdefault("graph_program", program._program)  # the first mode: graph
    facts["launches"] = sum(len(s["launches"]) for s in facts["plan"]["steps"] if not s["hoisted"])
    return steps, facts


def gpu_seconds(fn, runs: int) -> float:
    """GPU time per call of ``fn`` (CUDA events around ``runs`` calls on torch's current stream)."""
    import torch

    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(runs):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / runs


def replay_gpu_seconds(program, runs: int) -> float:
    """GPU time of one replay of a cubin program's graph alone (no input copies, no host work):
    the program is moved to torch's current stream first, as a call with torch inputs does."""
    import torch

    program.device.select_stream([torch.empty(1, device="cuda")])
    return gpu_seconds(lambda: program.device.replay(program.graph), runs)


def report(name: str, seconds: dict, launches: int, extra: dict | None = None) -> dict:
    result = {"name": name, "target": "cuda", "launches": launches, **(extra or {})}
    for key, value in seconds.items():
        result[f"{key}_ms"] = value * 1e3
    for mode in MODES:
        result[f"us_per_launch_{mode}"] = seconds[mode] * 1e6 / max(launches, 1)
    for torch_name in ("torch_eager", "torch_compile"):
        if torch_name in seconds:
            result[f"graph_speedup_vs_{torch_name}"] = seconds[torch_name] / seconds["graph"]
    return result


def torch_training(loss_fn, tensors: list, params: list, runs: int, compile_too: bool) -> dict:
    """torch eager and reduce-overhead steps: loss_fn(*tensors) forward, backward, Adam on ``params``."""
    import torch

    optimizer = torch.optim.Adam(params, lr=1e-3)

    def step(fn):
        optimizer.zero_grad(set_to_none=True)
        fn(*tensors).backward()
        optimizer.step()

    fns = {"torch_eager": lambda: step(loss_fn)}
    if compile_too:
        compiled = torch.compile(loss_fn, mode="reduce-overhead")
        fns["torch_compile"] = lambda: step(compiled)
    return fns


# ------------------------------------------------------------------ workloads
def mlp(runs: int, quick: bool, folder: str) -> dict:
    import torch
    import torch.nn.functional as TF
    from run import LEAVES, mlp_inputs, mlp_step

    arrays = mlp_inputs()
    feeds = {1 + 3 * k + j: (2 + k if j == 0 else 8 + 2 * k + j - 1) for k in range(6) for j in range(3)}
    steps, facts = bendc_steps(mlp_step, LEAVES, arrays, feeds, folder)
    x, y = (torch.as_tensor(a, device="cuda") for a in arrays[:2])
    params = [torch.tensor(a, device="cuda", requires_grad=True) for a in arrays[2:8]]

    def loss(x, y, w1, b1, w2, b2, w3, b3):
        hidden = torch.relu(TF.linear(torch.relu(TF.linear(x, w1, b1)), w2, b2))
        return TF.cross_entropy(TF.linear(hidden, w3, b3), y)

    fns = {**steps, **torch_training(loss, [x, y, *params], params, runs, not quick)}
    return report("mlp", timed(fns, runs), facts["launches"])


def decoder(runs: int, quick: bool, folder: str, config, name: str) -> dict:
    import torch
    from models import TorchOps, decoder_forward, decoder_inputs, decoder_program

    data = decoder_inputs(config)
    fn, names = decoder_program(config)
    params = [data["params"][n] for n in names]
    moments = [np.zeros_like(p) for p in params]
    count = len(names)
    arrays = [data["tokens"], data["targets"], data["cos"], data["sin"], np.array(1, np.int64),
              *params, *moments, *moments]
    feeds = {1 + 3 * k + j: 5 + k + j * count for k in range(count) for j in range(3)}
    steps, facts = bendc_steps(fn, tuple(names), arrays, feeds, folder)
    ops = TorchOps()
    tensors = [torch.as_tensor(a, device="cuda") for a in arrays[:4]]
    tparams = [torch.tensor(p, device="cuda", requires_grad=True) for p in params]

    def loss(tokens, targets, cos, sin, *values):
        logits = decoder_forward(ops, config, tokens, cos, sin, dict(zip(names, values)))
        return torch.nn.functional.cross_entropy(logits, targets.reshape(-1))

    fns = {**steps, **torch_training(loss, [*tensors, *tparams], tparams, runs, not quick)}
    return report(name, timed(fns, runs), facts["launches"], {"model": config.describe()})


def attention(runs: int, quick: bool, folder: str) -> dict:
    import torch
    from run import attention_step

    batch, heads, kv_heads, t, depth = (2, 8, 2, 128, 64) if quick else (4, 8, 2, 512, 64)
    rng = np.random.default_rng(0)
    shapes = [(batch, heads, t, depth), (batch, kv_heads, t, depth), (batch, kv_heads, t, depth), (batch, heads, t, depth)]
    arrays = [rng.standard_normal(s, dtype=np.float32) for s in shapes]
    steps, facts = bendc_steps(attention_step, ("q", "k", "v"), arrays, {}, folder)
    q, k, v = (torch.tensor(a, device="cuda", requires_grad=True) for a in arrays[:3])
    g = torch.as_tensor(arrays[3], device="cuda")

    def forward(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    def step(fn):
        q.grad = k.grad = v.grad = None
        fn(q, k, v).backward(g)

    fns = {**steps, "torch_eager": lambda: step(forward)}
    if not quick:
        compiled = torch.compile(forward, mode="reduce-overhead")
        fns["torch_compile"] = lambda: step(compiled)
    return report("attention", timed(fns, runs), facts["launches"],
                  {"shape": f"B={batch} H={heads} Hkv={kv_heads} T={t} D={depth}"})


def elementwise(runs: int, quick: bool, folder: str) -> dict:
    import torch
    from bendc.codegen.plan import KernelPlan, plan_stats
    from run import elementwise_chain

    size = 10**6 if quick else 10**7
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(size, dtype=np.float32) for _ in range(3)]
    steps, facts = bendc_steps(elementwise_chain, ("w", "b"), arrays, {}, folder)
    x = torch.as_tensor(arrays[0], device="cuda")
    w, b = (torch.tensor(a, device="cuda", requires_grad=True) for a in arrays[1:])

    def forward(x, w, b):
        return ((((x * w + b).relu() * x - b) * w) * x).sum()

    def step(fn):
        w.grad = b.grad = None
        fn(x, w, b).backward()

    fns = {**steps, "torch_eager": lambda: step(forward)}
    if not quick:
        compiled = torch.compile(forward, mode="reduce-overhead")
        fns["torch_compile"] = lambda: step(compiled)
    seconds = timed(fns, runs)
    # Bandwidth from GPU time: the graph's kernels alone against a device-to-device copy.
    source, destination = torch.ones(size, device="cuda"), torch.empty(size, device="cuda")
    copy_bandwidth = 2 * source.nbytes / gpu_seconds(lambda: destination.copy_(source), runs)
    replay = replay_gpu_seconds(facts["graph_program"], runs)
    moved = plan_stats(KernelPlan.from_json(facts["plan"]))["bytes_moved"]
    return report("elementwise", seconds, facts["launches"],
                  {"elements": size, "bytes_moved": moved, "graph_replay_gpu_ms": replay * 1e3,
                   "achieved_gb_per_s": moved / replay / 1e9, "copy_gb_per_s": copy_bandwidth / 1e9,
                   "fraction_of_copy_bandwidth": moved / replay / copy_bandwidth})


def overhead_step(x, w1, w2, lr=0.1):
    """A two-layer step with no index checks (whose read-back would wait for the GPU each call)."""
    import bendc.functional as F

    y = F.linear(F.relu(F.linear(x, w1)), w2)
    loss = (y * y).sum()
    loss.backward()
    return loss, F.sgd_step(w1, w1.grad, lr), F.sgd_step(w2, w2.grad, lr)


def launch_overhead(runs: int, quick: bool, folder: str) -> dict:
    """overhead_step at tiny shapes: its time per step is launch overhead (and the input copies)."""
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s, dtype=np.float32) for s in ((4, 8), (8, 8), (3, 8))]
    steps, facts = bendc_steps(overhead_step, ("w1", "w2"), arrays, {1: 1, 2: 2}, folder)
    seconds = timed(steps, runs * 5)
    replay = replay_gpu_seconds(facts["graph_program"], runs * 5)
    return report("launch_overhead", seconds, facts["launches"],
                  {"graph_replay_gpu_us_per_node": replay * 1e6 / max(facts["launches"], 1)})


def gpu_info() -> dict:
    import cuda.core
    import torch

    from runtime.cuda_graph import device_arch

    return {"gpu": torch.cuda.get_device_name(), "arch": device_arch(), "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "cuda_core": getattr(cuda.core, "__version__", "?")}


def run_cuda(only: list[str] | None, quick: bool, print_row) -> list[dict]:
    """Every cuda workload (or ``only`` those), each printed as it finishes; exits with a message
    when no GPU is usable."""
    missing = gpu_missing()
    if missing is not None:
        raise SystemExit(f"bench/run.py --target cuda needs an NVIDIA GPU: {missing}")
    from models import GPT, TRANSFORMER

    runs = 5 if quick else 20
    workloads = {"mlp": lambda f: mlp(runs, quick, f),
                 "transformer": lambda f: decoder(runs, quick, f, TRANSFORMER, "transformer"),
                 "gpt": lambda f: decoder(runs, quick, f, GPT, "gpt"),
                 "attention": lambda f: attention(runs, quick, f),
                 "elementwise": lambda f: elementwise(runs, quick, f),
                 "launch_overhead": lambda f: launch_overhead(runs, quick, f)}
    results = []
    with tempfile.TemporaryDirectory(prefix="bendc-bench-cuda-") as folder:
        for name, workload in workloads.items():
            if only and name not in only:
                continue
            result = workload(str(Path(folder) / name))
            results.append(result)
            print_row(result)
    return results
