"""Random programs over bendc's public API, rendered as Python source.

A drawn ``Program`` is Python source for one function ``step(...)`` plus its inputs. The same
source runs three times: under ``bendc.jit`` (F = bendc.functional), and as plain torch eager
code in float32 and in float64 (F = ``TorchF`` below, a shim with torch's functions under
bendc's names). Only two spellings differ between the bendc and the torch rendering:
``.backward()`` gets ``retain_graph=True`` (programs call backward several times over shared
graphs) and a ``leaf.grad`` read is ``_grad(leaf)``, a clone (torch accumulates into an
existing ``.grad`` in place; bendc's ``.grad`` is a value). ``Program.repro(target)`` is the
standalone snippet printed with a failure.

Values stay finite as in tests/test_properties.py: inputs are uniform in [-2, 2], a tensor
divisor y becomes (y*y + 1.0), log/sqrt take (x*x + 1.0), exp takes x.tanh() once |x| may
exceed 2, and a magnitude bound on every value refuses products that would pass ``LIMIT``.
Non-finite constants (x * math.inf, x * math.nan) make "poisoned" values that are only returned,
never fed to further ops or losses.
"""
from __future__ import annotations

import linecache
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as TF
from hypothesis import strategies as st

from conftest import factor_shape

LIMIT = 1e3
MAX_RANK = 4

# Shapes come from a small pool so generated kernels (whose sources hold the shapes) repeat
# across programs and numba's compiles are shared. (4, 8) and (6, 3) are the shapes of known bug 5.
BASE_SHAPES = [(), (1,), (3,), (4,), (1, 4), (4, 1), (2, 3), (3, 4), (4, 4), (2, 1, 4), (2, 3, 4), (4, 8), (6, 3)]
# Past bendc.kernels.cpu_policy.parallel_from("rows") and parallel_from("elementwise") cells (~4.7K and
# ~18.7K at a 5 us launch): CPU op kernels and fused elementwise kernels this large run their cells
# with prange. Drawn rarely (each such program compiles its own parallel kernels).
LARGE_SHAPES = [(512, 512), (16, 64, 64)]
ATTENTION_SHAPES = [(1, 2, 3, 4), (1, 1, 4, 2), (2, 2, 2, 4),
                    (1, 2, 9, 4), (1, 1, 70, 4)]  # the tiled schedule's: from t=8 on the cpu, a ragged block

# Pass pipelines (bendc.jit(passes=...)): the default most of the time, else a forced attention
# schedule, or some passes left out (no fusion, no cse/dce).
PIPELINES = (None, None, None, None,
             ("dce", "canonicalize", "cse", "attention_schedule_dense", "fuse"),
             ("dce", "canonicalize", "cse", "attention_schedule_triangular", "fuse"),
             ("dce", "canonicalize", "cse", "attention_schedule_tiled", "fuse"),  # the tiled attention schedule
             ("dce", "canonicalize", "cse", "attention_schedule"),
             ("canonicalize", "attention_schedule", "fuse"),
             ("attention_schedule",))

# Rows and groups normalized by layer_norm/group_norm hold at least this many elements (see norm()).
MIN_NORMALIZED = 8

# Families of generated steps. Each is drawn with nonzero probability (``draw_family``); core
# elementwise families are listed several times (weights).
FAMILIES = ("arith_tensor", "arith_scalar", "unary", "method", "pow", "identity", "nonfinite", "reduce", "rows",
            "layout", "index", "matmul", "gelu", "norm", "rope_family", "attention", "index_select",
            "gather", "cross_entropy", "mse", "sgd", "adam", "adam_traced", "split", "combine", "backward",
            "zero_grad", "grad_read",
            "dropout", "activation_fns", "losses")  # dropout, activations, losses (op-coverage issue)
# ---- reductions beyond sum (max/min/amax/amin/argmax/argmin, var/std/logsumexp/cumsum)
FAMILIES = FAMILIES + ("extrema", "moments")
# ---- end of reductions beyond sum
FAMILIES += ("select", "power", "shape")  # comparisons/where/clamp, powers, shape and joining ops (issue 14)
# convolution and pooling (op-coverage issue)
FAMILIES += ("conv", "pool")
FAMILIES += ("group_norm_family",)  # group norm as fused ops (bendc/ops/group_norm.py)
FAMILIES += ("creation",)  # tensors made inside the step, integer index arithmetic (issue 22)
FAMILIES += ("math_ops", "optimizers")  # issue 22: two-operand math, lerp, nan_to_num, logs; adagrad/rmsprop/adadelta
FAMILIES += ("composites",)  # issue 22: roll, repeat_interleave, any/all, sum/mean(dtype=), einsum
FAMILIES += ("sort_scatter",)  # issue 22: prod/cumprod, flip, sort/argsort/topk, scatter*, float // and %
FAMILIES += ("resample",)  # issue 22: pad modes, interpolate, conv_transpose1d/2d, batch_norm
WEIGHTED_FAMILIES = FAMILIES + ("arith_tensor", "arith_scalar", "unary", "backward", "arith_tensor",
                                "reduce", "layout", "index", "matmul", "combine", "combine")
# Families whose results round once per element exactly as torch's do (bitwise comparable).
EXACT_FAMILIES = {"arith_tensor", "arith_scalar", "neg", "relu", "pow", "identity", "layout", "index", "creation"}


@dataclass(frozen=True)
class Input:
    name: str
    shape: tuple[int, ...]
    kind: str            # "f32", "i64" (indices below ``high``), "step" (0-d float32 Adam step count)
    leaf: bool
    seed: int
    high: int = 0

    def array(self) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        if self.kind == "i64":
            return rng.integers(0, self.high, size=self.shape).astype(np.int64)
        if self.kind == "step":
            return np.array(float(1 + self.seed % 5), dtype=np.float32)
        if self.kind == "hyper":
            return np.array(self.hyper_value(), dtype=np.float32)
        if self.kind == "seed":
            return np.array(self.seed, dtype=np.int64)
        return rng.uniform(-2.0, 2.0, size=self.shape).astype(np.float32)

    def hyper_value(self) -> float:
        """A traced optimizer hyperparameter: a learning rate (0.1, 0.01) or a beta (0.9, 0.8)."""
        return (0.1, 0.01)[self.seed % 2] if self.high == 0 else (0.9, 0.8)[self.seed % 2]

    def numpy_source(self) -> str:
        if self.kind == "i64":
            return (f"np.random.default_rng({self.seed}).integers(0, {self.high}, size={self.shape})"
                    ".astype(np.int64)")
        if self.kind == "step":
            return f"np.array({float(1 + self.seed % 5)!r}, dtype=np.float32)"
        if self.kind == "hyper":
            return f"np.array({self.hyper_value()!r}, dtype=np.float32)"
        if self.kind == "seed":
            return f"np.array({self.seed}, dtype=np.int64)"
        return f"np.random.default_rng({self.seed}).uniform(-2.0, 2.0, size={self.shape}).astype(np.float32)"


@dataclass(frozen=True)
class Output:
    text: str            # the returned expression (bendc spelling)
    torch_text: str
    exact: bool          # bitwise comparable with torch float32
    what: str            # "value", "loss" or "grad of x0"


@dataclass(frozen=True)
class Program:
    inputs: tuple[Input, ...]
    lines: tuple[tuple[str, str], ...]      # (bendc line, torch line)
    outputs: tuple[Output, ...]
    bare_return: bool                         # `return v` rather than a tuple
    families: frozenset[str]
    passes: tuple[str, ...] | None = None      # bendc.jit(passes=...): None is the default pipeline

    @property
    def leaves(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.inputs if i.leaf)

    def source(self, flavor: str = "bendc") -> str:
        params = ", ".join(i.name for i in self.inputs)
        body = [line if flavor == "bendc" else torch_line for line, torch_line in self.lines]
        rets = [o.text if flavor == "bendc" else o.torch_text for o in self.outputs]
        ret = rets[0] if self.bare_return else "(" + ", ".join(rets) + ("," if len(rets) == 1 else "") + ")"
        text = [f"def step({params}):"] + [f"    {line}" for line in body] + [f"    return {ret}"]
        return "\n".join(text) + "\n"

    def repro(self, target: str) -> str:
        head = ["import math", "import numpy as np", "import torch", "import bendc", "import bendc.functional as F", "",
                f"@bendc.jit(leaves={self.leaves!r}, target={target!r}"
                + ("" if self.passes is None else f", passes={list(self.passes)!r}") + ")"]
        inputs = [f"{i.name} = {i.numpy_source()}  # {i.kind}{list(i.shape)}{' leaf' if i.leaf else ''}"
                  for i in self.inputs]
        call = f"print(step({', '.join(i.name for i in self.inputs)}))"
        return "\n".join(head) + "\n" + self.source("bendc") + "\n" + "\n".join(inputs + [call]) + "\n"

    def __repr__(self) -> str:
        return "\n" + self.repro("cpu")

    def _repr_pretty_(self, printer, cycle) -> None:  # hypothesis prints falsifying examples with this
        printer.text(repr(self))


def _method_bounds() -> tuple[dict[str, float], frozenset[str]]:
    """Each registry method's largest magnitude over [-1, 1] (its numpy reference on a grid), for ops
    that are unary and finite there (others need a family of their own), and those of them whose
    result is boolean (isnan, isinf, isfinite)."""
    from bendc.ops import OPS
    from bendc.ops.base import METHODS

    grid = np.linspace(-1.0, 1.0, 2001, dtype=np.float32)
    bounds, boolean = {}, set()
    for name, op in METHODS.items():
        if OPS[op].arity != 1:
            continue
        with np.errstate(all="ignore"):
            result = np.asarray(OPS[op].reference([grid], {}))
        values = result.astype(np.float64)
        if np.isfinite(values).all():
            bounds[name] = max(1.0, float(np.abs(values).max()))
            if result.dtype == np.bool_:
                boolean.add(name)
    return bounds, frozenset(boolean)


REGISTRY_METHODS, BOOLEAN_METHODS = _method_bounds()


# ================================================================== torch equivalents of bendc.functional
class TorchF:
    """torch's functions under bendc.functional's names (float32 or float64 alike); an op that
    declares its method (OpDef.method) is torch's function of that name."""

    def __getattr__(self, name):
        if name in REGISTRY_METHODS:
            return getattr(torch, name)
        raise AttributeError(name)

    relu = staticmethod(torch.relu)
    arange = staticmethod(torch.arange)  # the creation family (bendc.functional's creation functions)
    tensor = staticmethod(torch.tensor)
    full = staticmethod(torch.full)
    ones_like = staticmethod(torch.ones_like)
    sigmoid = staticmethod(torch.sigmoid)
    tanh = staticmethod(torch.tanh)
    exp = staticmethod(torch.exp)
    log = staticmethod(torch.log)
    sqrt = staticmethod(torch.sqrt)
    gelu = staticmethod(TF.gelu)
    softmax = staticmethod(torch.softmax)
    log_softmax = staticmethod(torch.log_softmax)
    linear = staticmethod(TF.linear)
    layer_norm = staticmethod(TF.layer_norm)
    group_norm = staticmethod(TF.group_norm)
    mse_loss = staticmethod(TF.mse_loss)
    cross_entropy = staticmethod(TF.cross_entropy)
    index_select = staticmethod(torch.index_select)
    gather = staticmethod(torch.gather)

    # dropout, activations, losses (op-coverage issue). dropout draws bendc's mask (Philox words at
    # the call's offset: one counter per program run, as bendc's trace counts its dropout calls).
    silu = staticmethod(TF.silu)
    softplus = staticmethod(TF.softplus)
    leaky_relu = staticmethod(TF.leaky_relu)
    elu = staticmethod(TF.elu)
    hardtanh = staticmethod(TF.hardtanh)
    nll_loss = staticmethod(TF.nll_loss)
    binary_cross_entropy_with_logits = staticmethod(TF.binary_cross_entropy_with_logits)
    normalize = staticmethod(TF.normalize)
    embedding = staticmethod(TF.embedding)

    def dropout(self, x, p=0.5, training=True, seed=None):
        from bendc.ops.random import dropout_scale, dropout_words, keep_threshold

        if not training or p == 0.0:
            return x
        offset = self.__dict__.setdefault("dropouts", 0)
        self.__dict__["dropouts"] = offset + 1
        keep = dropout_words(int(seed), offset, tuple(x.shape)) < np.uint64(keep_threshold(p))
        noise = np.where(keep, np.float32(dropout_scale(p)), np.float32(0.0))
        return x * torch.from_numpy(noise).to(x.dtype)

    def scaled_dot_product_attention(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                     enable_gqa=False, seed=None):
        """torch's; with dropout_p, its math path with the mask of ``dropout`` above."""
        if dropout_p == 0.0:
            return TF.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        k, v = (x.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for x in (k, v))
        scores = q @ k.transpose(-1, -2) * (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
        if is_causal:
            t = q.shape[2]
            scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), -math.inf)
        return self.dropout(scores.softmax(-1), dropout_p, True, seed) @ v

    @staticmethod
    def rope(x, cos, sin):
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    @staticmethod
    def sgd_step(param, grad, lr, momentum=0.0, buf=None):
        if momentum == 0.0:
            return param - lr * grad
        new_buf = grad if buf is None else buf * momentum + grad
        return param - lr * new_buf, new_buf

    @staticmethod
    def adam_step(param, grad, m, v, step, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        # torch.optim.AdamW's single-tensor update, written out of place.
        beta1, beta2 = betas
        step = float(step)
        if weight_decay != 0.0:
            param = param * (1.0 - lr * weight_decay)
        m = torch.lerp(m, grad, 1.0 - beta1)
        v = v * beta2 + (1.0 - beta2) * grad * grad
        step_size = lr / (1.0 - beta1 ** step)
        denom = v.sqrt() / math.sqrt(1.0 - beta2 ** step) + eps
        return param + (-step_size) * (m / denom), m, v


class TorchOptim:
    @staticmethod
    def adam(params, grads, state, lr, betas=(0.9, 0.999), eps=1e-8):
        """torch.optim.Adam's update (out of place) with tensor hyperparameters."""
        beta1, beta2 = betas
        step = state["step"] + 1
        new_params, exp_avg, exp_avg_sq = [], [], []
        for param, grad, m, v in zip(params, grads, state["exp_avg"], state["exp_avg_sq"]):
            m = m + (1.0 - beta1) * (grad - m)
            v = v * beta2 + (1.0 - beta2) * grad * grad
            step_size = lr / (1.0 - beta1 ** step)
            denom = v.sqrt() / math.sqrt(1.0 - 0.999 ** step) + eps if not isinstance(beta2, torch.Tensor) \
                else v.sqrt() / (1.0 - beta2 ** step).sqrt() + eps
            new_params.append(param + (-step_size) * (m / denom))
            exp_avg.append(m)
            exp_avg_sq.append(v)
        return tuple(new_params), {"step": step, "exp_avg": tuple(exp_avg), "exp_avg_sq": tuple(exp_avg_sq)}


def _torch_step(state):
    """torch.optim's ``state_step += 1`` and the step as a Python float (``_get_value``)."""
    step = state["step"] + 1
    return step, float(step)


def _torch_adagrad(params, grads, state, lr=1e-2, lr_decay=0.0, weight_decay=0.0, eps=1e-10):
    """torch.optim.Adagrad's single-tensor step, out of place."""
    step, count = _torch_step(state)
    clr = lr / (1 + (count - 1) * lr_decay)
    new_params, sums = [], []
    for param, grad, total in zip(params, grads, state["sum"]):
        if weight_decay != 0:
            grad = grad + weight_decay * param
        total = total + grad * grad
        new_params.append(param + (-clr) * grad / (total.sqrt() + eps))
        sums.append(total)
    return tuple(new_params), {"step": step, "sum": tuple(sums)}


def _torch_rmsprop(params, grads, state, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0,
                   centered=False):
    """torch.optim.RMSprop's single-tensor step, out of place."""
    step, _ = _torch_step(state)
    new_state = {"step": step, "square_avg": [], "momentum_buffer": [], "grad_avg": []}
    new_params = []
    for index, (param, grad) in enumerate(zip(params, grads)):
        if weight_decay != 0:
            grad = grad + weight_decay * param
        square_avg = state["square_avg"][index] * alpha + (1 - alpha) * grad * grad
        if centered:
            grad_avg = torch.lerp(state["grad_avg"][index], grad, 1 - alpha)
            avg = (square_avg - grad_avg * grad_avg).sqrt() + eps
            new_state["grad_avg"].append(grad_avg)
        else:
            avg = square_avg.sqrt() + eps
        if momentum > 0:
            buf = state["momentum_buffer"][index] * momentum + grad / avg
            new_params.append(param - lr * buf)
            new_state["momentum_buffer"].append(buf)
        else:
            new_params.append(param + (-lr) * grad / avg)
        new_state["square_avg"].append(square_avg)
    return tuple(new_params), {key: tuple(value) if isinstance(value, list) else value
                               for key, value in new_state.items() if value != []}


def _torch_adadelta(params, grads, state, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0):
    """torch.optim.Adadelta's single-tensor step, out of place."""
    step, _ = _torch_step(state)
    new_params, square_avgs, acc_deltas = [], [], []
    for param, grad, square_avg, acc_delta in zip(params, grads, state["square_avg"], state["acc_delta"]):
        if weight_decay != 0:
            grad = grad + weight_decay * param
        square_avg = square_avg * rho + (1 - rho) * grad * grad
        delta = (acc_delta + eps).sqrt() / (square_avg + eps).sqrt() * grad
        acc_delta = acc_delta * rho + (1 - rho) * delta * delta
        new_params.append(param - lr * delta)
        square_avgs.append(square_avg)
        acc_deltas.append(acc_delta)
    return tuple(new_params), {"step": step, "square_avg": tuple(square_avgs), "acc_delta": tuple(acc_deltas)}


def _torch_clip_grad_norm(grads, max_norm, norm_type=2.0):
    """torch.nn.utils.clip_grad_norm_'s arithmetic, out of place: the norm of the per-gradient norms,
    every gradient times clamp(max_norm / (norm + 1e-6), max=1)."""
    norms = [torch.linalg.vector_norm(g, norm_type) for g in grads]
    total = torch.linalg.vector_norm(torch.stack(norms), norm_type)
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    return tuple(g * coefficient for g in grads), total


TorchOptim.clip_grad_norm = staticmethod(_torch_clip_grad_norm)
TorchOptim.adagrad = staticmethod(_torch_adagrad)
TorchOptim.rmsprop = staticmethod(_torch_rmsprop)
TorchOptim.adadelta = staticmethod(_torch_adadelta)


class TorchBendc:
    optim = TorchOptim

    @staticmethod
    def zero_grad(*leaves):
        for leaf in leaves:
            leaf.grad = None


def _torch_grad(leaf):
    return None if leaf.grad is None else leaf.grad.detach().clone()


# ================================================================== running
_COUNTER = [0]


def compile_step(source: str, namespace: dict) -> Any:
    """exec the source; register it with linecache so tracebacks and inspect see the lines."""
    _COUNTER[0] += 1
    filename = f"<fuzz program {_COUNTER[0]}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)
    return namespace["step"]


def _as_tuple(result) -> tuple:
    return result if isinstance(result, tuple) else (result,)


def run_torch(program: Program, dtype: torch.dtype) -> tuple:
    fn = compile_step(program.source("torch"), {"F": TorchF(), "bendc": TorchBendc, "math": math,
                                                "_grad": _torch_grad, "torch": torch})
    tensors = []
    for item in program.inputs:
        array = item.array()
        tensor = torch.from_numpy(array)
        if item.kind == "f32":
            tensor = tensor.to(dtype).requires_grad_(item.leaf)
        tensors.append(tensor)
    return tuple(None if r is None else r.detach().to(torch.float64).numpy() for r in _as_tuple(fn(*tensors)))


def run_bendc(program: Program, target: str, cache_dir: str | None, repeat: bool = True) -> tuple:
    import bendc
    import bendc.functional as F
    fn = compile_step(program.source("bendc"), {"F": F, "bendc": bendc, "math": math, "torch": torch})
    jitted = bendc.jit(fn, leaves=program.leaves, target=target, cache_dir=cache_dir,
                       passes=None if program.passes is None else list(program.passes))
    def host(r):
        return r.copy_to_host() if hasattr(r, "copy_to_host") else np.asarray(r)  # cuda: device arrays

    first = _as_tuple(jitted(*[item.array() for item in program.inputs]))
    kept = tuple(None if r is None else host(r).copy() for r in first)
    if not repeat:
        return jitted, kept
    # a second call (the compiled program reused; output buffers may be recycled) must give the same
    # bits and leave the first call's outputs, still held here, alone
    second = tuple(None if r is None else host(r) for r in _as_tuple(jitted(*[i.array() for i in program.inputs])))
    for position, (a, b, c) in enumerate(zip(kept, (None if r is None else host(r) for r in first), second)):
        if a is None:
            continue
        if not (np.array_equal(a, b, equal_nan=True) and np.array_equal(a, c, equal_nan=True)):
            raise RepeatCallError(f"output {position}: a second call changed the first call's result or "
                                  f"differs from it:\nfirst {a!r}\nfirst after the second call {b!r}\nsecond {c!r}")
    return jitted, kept


class RepeatCallError(AssertionError):
    """A jitted program gave different bits on a second identical call, or overwrote earlier outputs."""


# ================================================================== the strategy
@dataclass
class Value:
    name: str
    shape: tuple[int, ...]
    bound: float
    deps: frozenset          # leaves in its autograd graph (empty: requires_grad False)
    exact: bool
    poison: bool = False


def _broadcast(a, b):
    try:
        return tuple(np.broadcast_shapes(a, b))
    except ValueError:
        return None


def _matmul_shape(a, b):
    if not a or not b:
        return None
    try:
        return np.matmul(np.zeros(a, np.float32), np.zeros(b, np.float32)).shape
    except ValueError:
        return None


def _numel(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _scalar_text(value) -> str:
    return repr(value)


_SCALARS = st.one_of(st.sampled_from([2, -1, 3, 1, 0.5, -2.0]),
                     st.builds(lambda m, neg: -m if neg else m, st.floats(0.25, 3.0, width=32), st.booleans()))
_DIVISORS = st.one_of(st.sampled_from([2, -4, 1, 0.5]),
                      st.builds(lambda m, neg: -m if neg else m, st.floats(0.5, 3.0, width=32), st.booleans()))


# torch.nn.functional activations composed of bendc's ops (bendc/functional.py): (arguments, the bound of
# the result from the operand's, value bitwise, gradient bitwise)
_MORE_ACTIVATIONS = {
    "hardswish": ("", lambda b: b, True, False), "hardsigmoid": ("", lambda b: 1.0, True, True),
    "relu6": ("", lambda b: 6.0, True, True), "softsign": ("", lambda b: 1.0, True, False),
    "mish": ("", lambda b: b, False, False), "logsigmoid": ("", lambda b: b + 1.0, False, False),
    "selu": ("", lambda b: 1.8 * b + 1.8, False, False), "celu": (", 0.5", lambda b: b + 0.5, False, False),
    "tanhshrink": ("", lambda b: b + 1.0, False, False), "softshrink": (", 0.7", lambda b: b, False, False),
    "hardshrink": ("", lambda b: b, True, True), "threshold": (", 0.5, -1.0", lambda b: max(b, 1.0), True, True)}


class Builder:
    def __init__(self, draw) -> None:
        self.draw = draw
        self.inputs: list[Input] = []
        self.values: list[Value] = []
        self.lines: list[tuple[str, str]] = []
        self.families: set[str] = set()
        self.exact_grads = True           # every step exact and no broadcast operand
        self.grad_set: dict[str, bool] = {}  # leaf -> its .grad is not None now
        self.counter = 0
        self.backwards = 0
        self.roots: list[Value] = []   # the values backward() was called on
        self.required: list[Value] = []  # values every program returns (batch_norm's updated statistics)

    # ------------------------------------------------------------- helpers
    def new_input(self, shape, kind="f32", leaf=None, high=0) -> Value:
        draw = self.draw
        if leaf is None:
            leaf = kind == "f32" and draw(st.booleans())
        prefix = {"f32": "x", "i64": "i", "step": "s", "hyper": "h", "seed": "r"}[kind]
        name = f"{prefix}{sum(1 for i in self.inputs if i.name[0] == prefix)}"
        item = Input(name, tuple(shape), kind, leaf, draw(st.integers(0, 2 ** 16)), high)
        self.inputs.append(item)
        value = Value(name, tuple(shape), 2.0, frozenset([name]) if leaf else frozenset(), True)
        if kind == "f32":
            self.values.append(value)
            if leaf:
                self.grad_set[name] = False
        return value

    def fresh(self, prefix="v") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def emit(self, expr: str, shape, bound: float, operands, family: str, exact: bool | None = None,
             torch_expr: str | None = None, poison=False, grad_exact: bool | None = None) -> Value:
        """``exact``: the value rounds as torch's does (bitwise); ``grad_exact``: so does its VJP (defaults
        to ``exact``; reciprocal's VJP, -g * (y * y), is a formula whose order may differ)."""
        name = self.fresh()
        deps = frozenset().union(*[o.deps for o in operands]) if operands else frozenset()
        if exact is None:
            exact = family in EXACT_FAMILIES
        if grad_exact is None:
            grad_exact = exact
        exact = exact and all(o.exact for o in operands)
        if not (exact and grad_exact):
            self.exact_grads = False
        value = Value(name, tuple(shape), float(bound), deps, exact, poison)
        self.lines.append((f"{name} = {expr}", f"{name} = {torch_expr or expr}"))
        self.values.append(value)
        self.families.add(family)
        return value

    def usable(self, pred=lambda v: True) -> list[Value]:
        return [v for v in self.values if not v.poison and pred(v)]

    def pick(self, pred=lambda v: True) -> Value | None:
        options = self.usable(pred)
        if not options:
            return None
        if self.draw(st.booleans()):
            return options[-1]
        return self.draw(st.sampled_from(options))

    def pick_or_new(self, shape, pred=None) -> Value:
        options = self.usable(lambda v: v.shape == tuple(shape) and (pred is None or pred(v)))
        if options and self.draw(st.booleans()):
            return self.draw(st.sampled_from(options))
        return self.new_input(shape)

    # ------------------------------------------------------------- families
    def arith_tensor(self) -> bool:
        draw = self.draw
        x = self.pick()
        if x is None:
            return False
        op = draw(st.sampled_from("+-*/"))
        partners = self.usable(lambda v: _broadcast(v.shape, x.shape) is not None)
        y = x if draw(st.integers(0, 4)) == 0 else draw(st.sampled_from(partners))  # repeated operands
        left, right = (x, y) if draw(st.booleans()) else (y, x)
        out = _broadcast(left.shape, right.shape)
        if op in "+-":
            bound = left.bound + right.bound
        elif op == "*":
            bound = left.bound * right.bound
        else:
            if right.bound ** 2 + 1 > LIMIT:
                return False
            bound = left.bound
        if bound > LIMIT:
            return False
        rtext = f"({right.name} * {right.name} + 1.0)" if op == "/" else right.name
        if left.shape != right.shape:
            self.exact_grads = False
        self.emit(f"{left.name} {op} {rtext}", out, bound, (left, right), "arith_tensor")
        return True

    def arith_scalar(self) -> bool:
        draw = self.draw
        x = self.pick()
        if x is None:
            return False
        op = draw(st.sampled_from("+-*/"))
        side = draw(st.sampled_from(["right", "left"]))
        if op == "/" and side == "right":
            s = draw(_DIVISORS)
            bound = x.bound / abs(s)
            expr = f"{x.name} / {_scalar_text(s)}"
        elif op == "/":
            s = draw(_SCALARS)
            if x.bound ** 2 + 1 > LIMIT:
                return False
            bound = abs(s)
            expr = f"{_scalar_text(s)} / ({x.name} * {x.name} + 1.0)"
            self.emit(expr, x.shape, bound, (x,), "arith_scalar", grad_exact=False)  # a reciprocal
            return True
        else:
            s = draw(_SCALARS)
            bound = x.bound + abs(s) if op in "+-" else x.bound * abs(s)
            expr = f"{x.name} {op} {_scalar_text(s)}" if side == "right" else f"{_scalar_text(s)} {op} {x.name}"
        if bound > LIMIT:
            return False
        self.emit(expr, x.shape, bound, (x,), "arith_scalar")
        return True

    def unary(self) -> bool:
        draw = self.draw
        x = self.pick()
        if x is None:
            return False
        op = draw(st.sampled_from(["relu", "neg", "exp", "tanh", "sigmoid", "log", "sqrt"]))
        method = draw(st.booleans())
        if op == "neg":
            self.emit(f"-{x.name}", x.shape, x.bound, (x,), "neg")
            return True
        operand = x.name
        if op == "exp" and x.bound > 2.0:
            operand, bound = f"{x.name}.tanh()", math.e
        elif op == "exp":
            bound = math.exp(x.bound)
        elif op in ("log", "sqrt"):
            if x.bound ** 2 + 1 > LIMIT:
                return False
            operand = f"({x.name} * {x.name} + 1.0)"
            bound = math.log(x.bound ** 2 + 1) if op == "log" else math.sqrt(x.bound ** 2 + 1)
        elif op in ("tanh", "sigmoid"):
            bound = 1.0
        else:
            bound = x.bound
        expr = f"{operand}.{op}()" if method else f"F.{op}({operand})"
        self.emit(expr, x.shape, bound, (x,), "relu" if op == "relu" else "unary")
        self.families.add("unary")
        return True

    def method(self) -> bool:
        """One to three ops that declare their Tensor method in their op file (OpDef.method: PyTorch's
        name and semantics), each on its operand squashed into [-1, 1], so new such ops are fuzzed
        with no edit here. A boolean result (isnan, isinf, isfinite) becomes a float mask at once
        (``.float()``; torch's spelling casts to the operand's dtype) and ends the chain."""
        x = self.pick()
        if x is None or not REGISTRY_METHODS:
            return False
        names = self.draw(st.lists(st.sampled_from(sorted(REGISTRY_METHODS)), min_size=1, max_size=3, unique=True))
        for name in names:
            squashed = f"{x.name}.tanh()"
            spelling = f"{squashed}.{name}()" if self.draw(st.booleans()) else f"F.{name}({squashed})"
            if name in BOOLEAN_METHODS:
                self.emit(f"{spelling}.float()", x.shape, 1.0, (), "method",  # a mask requires no grad
                          torch_expr=f"{spelling}.to({x.name}.dtype)")
                break
            x = self.emit(spelling, x.shape, REGISTRY_METHODS[name], (x,), "method")
        return True

    def pow(self) -> bool:
        draw = self.draw
        x = self.pick()
        if x is None:
            return False
        e = draw(st.sampled_from([2, 3, 1, 0.5, -1]))
        if e in (0.5, -1):
            if x.bound ** 2 + 1 > LIMIT:
                return False
            expr = f"({x.name} * {x.name} + 1.0) ** {e}"
            bound = math.sqrt(x.bound ** 2 + 1) if e == 0.5 else 1.0
            exact = e == -1
        else:
            bound = x.bound ** e
            if bound > LIMIT:
                return False
            expr, exact = f"{x.name} ** {e}", True
        # torch differentiates x ** 3 as g * (3 * x ** 2) and x ** -1 as -g * y * y; bendc's x * x * x and
        # reciprocal VJPs round differently (close, not bitwise); x ** 2's 2 * (g * x) is exact both ways
        self.emit(expr, x.shape, bound, (x,), "pow", exact=exact, grad_exact=exact and e in (1, 2))
        return True

    def identity(self) -> bool:
        draw = self.draw
        x = self.pick()
        if x is None:
            return False
        forms = ["{x} / 1", "{x}.reshape({shape})", "{x}[..., ...]", "{x} * 1", "{x} ** 1", "{x}[...]",
                 "+{x}", "{x} + 0", "{x}.view({shape})"]
        if x.shape:
            forms += ["{x}[:]", "{x}.permute({perm})"]
        form = draw(st.sampled_from(forms))
        expr = form.format(x=x.name, shape=tuple(x.shape), perm=", ".join(map(str, range(len(x.shape)))))
        self.emit(expr, x.shape, x.bound, (x,), "identity")
        return True

    def nonfinite(self) -> bool:
        draw = self.draw
        x = self.pick()
        if x is None:
            return False
        c = draw(st.sampled_from(["math.inf", "-math.inf", "math.nan"]))
        expr = f"{x.name} * {c}" if draw(st.booleans()) else f"{c} * {x.name}"
        self.emit(expr, x.shape, math.inf, (x,), "nonfinite", exact=True, poison=True)
        return True

    def reduce(self) -> bool:
        draw = self.draw
        x = self.pick()
        if x is None:
            return False
        op = draw(st.sampled_from(["sum", "mean"]))
        rank = len(x.shape)
        form = draw(st.sampled_from(["int", "all", "tuple", "none"]))
        if form in ("all", "none"):
            dim, axes = None, list(range(rank))
        elif form == "int" or rank == 0:
            dim = draw(st.integers(-max(rank, 1), max(rank, 1) - 1))
            axes = [dim % rank] if rank else []
        else:
            axes = draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True))
            dim = tuple(a - rank if draw(st.booleans()) else a for a in axes)
        keepdim = draw(st.booleans()) if form != "none" else False
        out = ([1 if a in axes else d for a, d in enumerate(x.shape)] if keepdim
               else [d for a, d in enumerate(x.shape) if a not in axes])
        count = _numel([x.shape[a] for a in axes])
        bound = x.bound * count if op == "sum" else x.bound
        if bound > LIMIT:
            return False
        expr = f"{x.name}.{op}()" if form == "none" else f"{x.name}.{op}(dim={dim!r}, keepdim={keepdim})"
        self.emit(expr, out, bound, (x,), "reduce")
        return True

    # ---- reductions beyond sum (bendc/reductions.py)
    def _reduction_dims(self, rank: int):
        """(spelling of dim, reduced axes): an int (negative too), a tuple, or every dim."""
        draw = self.draw
        form = draw(st.sampled_from(["int", "tuple", "all"])) if rank else "all"
        if form == "all":
            return None, list(range(rank))
        if form == "int":
            dim = draw(st.integers(-rank, rank - 1))
            return dim, [dim % rank]
        axes = draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True))
        return tuple(a - rank if draw(st.booleans()) else a for a in axes), sorted(axes)

    def extrema(self) -> bool:
        """max/min (0-d, or .values / [0] of (values, indices) along a dim), amax/amin over dims, on
        values torch computes bit for bit alike (ties then fall on the same elements; relu makes
        many)."""
        draw = self.draw
        x = self.pick(lambda v: v.exact)
        if x is None:
            return False
        rank = len(x.shape)
        op = draw(st.sampled_from(["max", "min"]))
        form = draw(st.sampled_from(["full", "dim", "amax", "amax"]))
        operand = f"{x.name}.relu()" if draw(st.integers(0, 2)) == 0 else x.name
        if form == "full" or (form == "dim" and rank == 0 and draw(st.booleans())):
            self.emit(f"{operand}.{op}()", (), x.bound, (x,), "extrema", exact=True, grad_exact=False)
            return True
        keepdim = draw(st.booleans())
        if form == "dim":
            dim = draw(st.integers(-max(rank, 1), max(rank, 1) - 1))
            axes = [dim % rank] if rank else []
            pick = draw(st.sampled_from([".values", "[0]"]))
            expr = f"{operand}.{op}(dim={dim}, keepdim={keepdim}){pick}"
        else:
            dim, axes = self._reduction_dims(rank)
            spelled = "" if dim is None else f"dim={dim!r}, "
            expr = f"{operand}.a{op}({spelled}keepdim={keepdim})"
        out = ([1 if a in axes else d for a, d in enumerate(x.shape)] if keepdim
               else [d for a, d in enumerate(x.shape) if a not in axes])
        self.emit(expr, out, x.bound, (x,), "extrema", exact=True, grad_exact=False)
        return True

    def moments(self) -> bool:
        """var/std (correction 0, 1, 2 or unbiased=False) where the count exceeds the correction,
        logsumexp over dims, cumsum along a dim."""
        draw = self.draw
        x = self.pick()
        if x is None:
            return False
        rank = len(x.shape)
        op = draw(st.sampled_from(["var", "std", "logsumexp", "cumsum"]))
        if op == "cumsum":
            if rank == 0:
                return False
            dim = draw(st.integers(-rank, rank - 1))
            bound = x.bound * x.shape[dim]
            if bound > LIMIT:
                return False
            # torch's CPU cumsum accumulates in float64 and rounds each prefix, as bendc's does
            self.emit(f"{x.name}.cumsum({dim})", x.shape, bound, (x,), "moments", exact=x.exact, grad_exact=False)
            return True
        dim, axes = self._reduction_dims(rank)
        keepdim = draw(st.booleans())
        out = ([1 if a in axes else d for a, d in enumerate(x.shape)] if keepdim
               else [d for a, d in enumerate(x.shape) if a not in axes])
        count = _numel([x.shape[a] for a in axes])
        spelled = "" if dim is None else f"{dim!r}, "
        if op == "logsumexp":
            if dim is None:
                spelled = f"{tuple(range(rank))!r}, "
            self.emit(f"{x.name}.logsumexp({spelled}keepdim={keepdim})", out, x.bound + math.log(count) + 1,
                      (x,), "moments", exact=False)
            return True
        correction = draw(st.sampled_from(["correction=0", "correction=1", "correction=2", "unbiased=False", ""]))
        subtract = {"correction=0": 0, "unbiased=False": 0, "correction=2": 2}.get(correction, 1)
        if count <= subtract + 1:  # no degrees of freedom (torch: inf or NaN), or a single one
            return False
        variance = (2 * x.bound) ** 2 * count / (count - subtract)
        bound = variance if op == "var" else math.sqrt(variance)
        if bound > LIMIT:
            return False
        args = ", ".join(a for a in (spelled.rstrip(", "), correction, f"keepdim={keepdim}") if a)
        if dim is None and correction.startswith("unbiased"):  # torch: unbiased needs a dim beside keepdim
            args = ", ".join(a for a in (f"{tuple(range(rank))!r}" if rank else "None", correction,
                                         f"keepdim={keepdim}") if a)
        self.emit(f"{x.name}.{op}({args})", out, bound, (x,), "moments", exact=False)
        return True
    # ---- end of reductions beyond sum

    def rows(self) -> bool:
        draw = self.draw
        x = self.pick()
        if x is None:
            return False
        op = draw(st.sampled_from(["softmax", "log_softmax"]))
        rank = len(x.shape)
        dim = draw(st.integers(-max(rank, 1), max(rank, 1) - 1))
        size = x.shape[dim] if rank else 1
        bound = 1.0 if op == "softmax" else 2 * x.bound + math.log(size) + 1
        expr = f"{x.name}.{op}({dim})" if draw(st.booleans()) else f"F.{op}({x.name}, {dim})"
        self.emit(expr, x.shape, bound, (x,), "rows")
        return True

    def layout(self) -> bool:
        draw = self.draw
        x = self.pick()
        if x is None:
            return False
        rank = len(x.shape)
        # (x.view is drawn only as an identity: torch refuses other views of non-contiguous tensors)
        form = draw(st.sampled_from(["reshape", "permute", "transpose", "T", "unsqueeze"]))
        if form == "reshape":
            target = factor_shape(draw, _numel(x.shape))
            spelled = list(target)
            if spelled and draw(st.booleans()):
                spelled[draw(st.integers(0, len(spelled) - 1))] = -1
            self.emit(f"{x.name}.{form}({tuple(spelled)!r})", target, x.bound, (x,), "layout")
        elif form == "permute":
            if rank < 2:
                return False
            perm = tuple(draw(st.permutations(range(rank))))
            perm = tuple(p - rank if draw(st.booleans()) else p for p in perm)
            self.emit(f"{x.name}.permute({', '.join(map(str, perm))})", tuple(x.shape[p] for p in perm),
                      x.bound, (x,), "layout")
        elif form == "transpose":
            if rank < 2:
                return False
            d0, d1 = draw(st.integers(-rank, rank - 1)), draw(st.integers(-rank, rank - 1))
            out = list(x.shape)
            out[d0], out[d1] = out[d1], out[d0]
            self.emit(f"{x.name}.transpose({d0}, {d1})", out, x.bound, (x,), "layout")
        elif form == "T":
            if rank != 2:
                return False
            self.emit(f"{x.name}.T", x.shape[::-1], x.bound, (x,), "layout")
        else:
            if rank >= MAX_RANK:
                return False
            d = draw(st.integers(-rank - 1, rank))
            out = list(x.shape)
            out.insert(d % (rank + 1), 1)
            self.emit(f"{x.name}.unsqueeze({d})", out, x.bound, (x,), "layout")
        return True

    def split(self) -> bool:
        """Slices that tile the last axis (a fused projection split into parts), each used, and a
        backward through all of them: the gradient is their concatenation (canonicalize's concat)."""
        draw = self.draw
        x = self.pick(lambda v: len(v.shape) > 0 and v.shape[-1] >= 2 and bool(v.deps) and math.isfinite(v.bound))
        if x is None:
            return False
        size = x.shape[-1]
        cuts = sorted(set(draw(st.lists(st.integers(1, size - 1), min_size=1, max_size=2))))
        bounds = [0, *cuts, size]
        parts = [self.fresh() for _ in range(len(bounds) - 1)]
        for name, start, stop in zip(parts, bounds, bounds[1:]):
            self.lines.append((f"{name} = {x.name}[..., {start}:{stop}]",) * 2)
        root = self.fresh("loss")
        terms = " + ".join(f"({name} * {float(k + 1)!r}).sum()" for k, name in enumerate(parts))
        self.lines.append((f"{root} = {terms}",) * 2)
        self.lines.append((f"{root}.backward()", f"{root}.backward(retain_graph=True)"))
        scalar = Value(root, (), x.bound * len(parts) ** 2 * max(1, _numel(x.shape)), x.deps, False)
        self.values.append(scalar)
        self.roots.append(scalar)
        for leaf in x.deps:
            self.grad_set[leaf] = True
        self.backwards += 1
        self.families.add("split")
        return True

    def index(self) -> bool:
        draw = self.draw
        x = self.pick(lambda v: len(v.shape) > 0)
        if x is None:
            return False
        rank = len(x.shape)
        style = draw(st.sampled_from(["prefix", "all_int", "ellipsis", "prefix", "none", "reverse", "list",
                                      "mask_sum", "assign", "in_place"]))
        if style == "in_place":
            return self._in_place(x)
        if style in ("none", "reverse", "list", "mask_sum", "assign"):
            return self._torch_index(x, style)
        axes = list(range(rank))
        if style == "prefix":
            axes = axes[:draw(st.integers(1, rank))]
        elif style == "ellipsis":
            axes = axes[rank - draw(st.integers(1, rank)):]
        parts, out = [], list(x.shape)
        dropped = []
        for axis in axes:
            size = x.shape[axis]
            kind = "int" if style == "all_int" else draw(st.sampled_from(["int", "slice", "full"]))
            if kind == "int":
                parts.append(str(draw(st.integers(-size, size - 1))))
                dropped.append(axis)
            elif kind == "full":
                parts.append(":")
            else:
                start = draw(st.integers(0, size - 1))
                stop = draw(st.integers(start + 1, size))
                stride = draw(st.sampled_from([None, 1, 2]))
                s_start = start - size if draw(st.booleans()) else start
                s_stop = "" if stop == size and draw(st.booleans()) else str(stop)
                parts.append(f"{s_start}:{s_stop}" + ("" if stride is None else f":{stride}"))
                out[axis] = len(range(start, stop, stride or 1))
        out = [d for a, d in enumerate(out) if a not in dropped]
        if style == "ellipsis":
            parts = ["..."] + parts
        self.emit(f"{x.name}[{', '.join(parts)}]", out, x.bound, (x,), "index")
        return True

    def _in_place(self, x: Value) -> bool:
        """An in-place op on a copy of x (x.clone() or x * 1.0), sometimes first bound to a second
        name, which must see the write as PyTorch's does: y += v, y -= v, y *= v, y /= 2,
        y.add_(v, alpha=a), y.mul_(c), y.clamp_(lo, hi), y.copy_(v), y.zero_() or y.fill_(c);
        v is a value of x's shape or a number."""
        draw = self.draw
        name, alias = self.fresh(), self.fresh() if draw(st.booleans()) else None
        copy = f"{x.name}.clone()" if draw(st.booleans()) else f"{x.name} * 1.0"
        self.lines.append((f"{name} = {copy}",) * 2)
        if alias:
            self.lines.append((f"{alias} = {name}",) * 2)
        other = self.pick(lambda v: v.shape == x.shape and v.bound <= 8)
        form = draw(st.sampled_from(["+=", "-=", "*=", "/=", "add_", "mul_", "clamp_", "copy_", "zero_", "fill_"]))
        deps, exact, bound = x.deps, x.exact, x.bound
        used = form in ("+=", "-=", "*=", "add_", "copy_") and other is not None and draw(st.booleans())
        if used:
            operand, operand_bound = other.name, other.bound
            deps, exact = deps | other.deps, exact and other.exact
        else:
            number = draw(st.sampled_from([0.5, -2.0, 3.0]))
            operand, operand_bound = repr(number), abs(number)
        if form in ("+=", "-="):
            line, bound = f"{name} {form} {operand}", bound + operand_bound
        elif form in ("*=", "mul_"):
            line = f"{name} *= {operand}" if form == "*=" else f"{name}.mul_({operand})"
            bound *= operand_bound
        elif form == "/=":
            line, bound = f"{name} /= 2.0", bound / 2
        elif form == "add_":  # torch's add_ with alpha is one fused multiply-add in its vector loop
            alpha = draw(st.sampled_from([1, -0.5]))
            line, bound = f"{name}.add_({operand}, alpha={alpha!r})", bound + abs(alpha) * operand_bound
            exact = exact and alpha == 1
        elif form == "clamp_":
            line = f"{name}.clamp_({draw(st.sampled_from([-1.0, None]))!r}, 1.0)"
        elif form == "copy_":  # x's value is gone: only the copied one's leaves remain
            line, bound = f"{name}.copy_({operand})", operand_bound
            deps, exact = (other.deps, other.exact) if used else (frozenset(), True)
        else:
            line, bound = (f"{name}.zero_()", 0.0) if form == "zero_" else (f"{name}.fill_({operand})", operand_bound)
            deps, exact = frozenset(), True
        self.lines.append((line,) * 2)
        self.values.append(Value(name, x.shape, bound, deps, exact))
        if alias:
            self.values.append(Value(alias, x.shape, bound, deps, exact))
        self.families.add("index")
        return True

    def _torch_index(self, x: Value, style: str) -> bool:
        """PyTorch's indexing beyond ints and slices (issue 22): None inserting a dim; a negative step
        (bendc reverses as numpy's x[::-1]; torch refuses it, so torch's program spells the positions
        as a list); a list of distinct positions (negative ones too) on one dim; x[mask].sum(); and
        x[key] = value (a slice key, a value or a number; or a mask key and a number) into x.clone()."""
        draw = self.draw
        rank = len(x.shape)
        axis = draw(st.integers(0, rank - 1))
        size = x.shape[axis]
        lead = ":, " * axis
        if style == "none":
            at = draw(st.integers(0, rank))
            key = ", ".join([":"] * at + ["None"]) if at < rank or draw(st.booleans()) else "..., None"
            self.emit(f"{x.name}[{key}]", (*x.shape[:at], 1, *x.shape[at:]), x.bound, (x,), "index")
            return True
        if style in ("reverse", "list"):
            if size == 0:
                return False
            if style == "reverse":
                step = draw(st.sampled_from([-1, -1, -2, -3]))
                start = draw(st.one_of(st.none(), st.integers(-size, size - 1)))
                stop = draw(st.one_of(st.none(), st.integers(-size - 1, size - 1)))
                part = f"{'' if start is None else start}:{'' if stop is None else stop}:{step}"
                positions = list(range(size))[slice(start, stop, step)]
                if not positions:
                    return False
            else:
                positions = draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=size, unique=True))
                positions = [p - size if draw(st.booleans()) else p for p in positions]
                part = repr(positions)
            self.emit(f"{x.name}[{lead}{part}]", (*x.shape[:axis], len(positions), *x.shape[axis + 1:]), x.bound,
                      (x,), "index", torch_expr=f"{x.name}[{lead}{positions!r}]")
            return True
        threshold = draw(st.sampled_from([-0.5, 0.0, 0.25]))
        if style == "mask_sum":  # sums in another order than torch's: not bitwise
            self.emit(f"{x.name}[{x.name} > {threshold!r}].sum()", (), x.bound * max(1, _numel(x.shape)), (x,),
                      "index", exact=False)
            return True
        name = self.fresh()
        self.lines.append((f"{name} = {x.name}.clone()",) * 2)
        deps, exact, bound = x.deps, x.exact, x.bound
        if draw(st.integers(0, 2)) == 0:  # a mask key, a number
            number = draw(st.sampled_from([0.25, -3.0]))
            key = f"{name} {draw(st.sampled_from(['<', '>=']))} {threshold!r}"
            self.lines.append((f"{name}[{key}] = {number!r}",) * 2)
            bound = max(bound, abs(number))
        else:
            if size == 0:
                return False
            start = draw(st.integers(0, size - 1))
            stop = draw(st.integers(start + 1, size))
            part = draw(st.sampled_from([str(start), f"{start}:{stop}", f"{start}::2", f"-{size - start}:"]))
            source = self.pick(lambda v: v.shape == x.shape)
            if source is None or draw(st.booleans()):
                number = draw(st.sampled_from([0.25, -3.0]))
                value, bound = repr(number), max(bound, abs(number))
            else:
                value, bound = f"{source.name}[{lead}{part}] * 0.5", max(bound, source.bound * 0.5)
                deps, exact = deps | source.deps, exact and source.exact
            self.lines.append((f"{name}[{lead}{part}] = {value}",) * 2)
        self.values.append(Value(name, x.shape, bound, deps, exact))
        self.families.add("index")
        return True

    def creation(self) -> bool:
        """Tensors made inside the step (issue 22), each rounding as torch's does (linspace within 1 ulp):
        F.arange under integer arithmetic (int_add, int_sub, int_mul, int_floordiv, int_remainder)
        scaling x, a torch.tensor literal (and one of more values than a literal holds: a lifted
        constant parameter), F.full, torch.zeros / ones / eye / linspace, the *_like forms, torch.empty
        (_like) written whole by x[...] = value, counts from F.one_hot and of a mask (int64 sums), an
        integer torch.where / clamp, some with ``device=x.device``;
        and integer index tensors made from an arange (.long() of a float: to_int; negative entries:
        wrap_index). Index entries are distinct, so the backward's scatter adds each gradient once,
        as torch's does."""
        draw = self.draw
        x = self.pick(lambda v: len(v.shape) > 0 and v.shape[-1] > 0)
        if x is None:
            return False
        n = x.shape[-1]
        style = draw(st.sampled_from(["arange", "literal", "full", "index", "lifted", "zeros", "eye", "linspace",
                                      "like", "empty", "one_hot", "count", "int_select"]))
        device = ", device=" + x.name + ".device" if draw(st.booleans()) else ""  # torch.device handed back
        c = draw(st.sampled_from([0.5, -1.0, 2.0]))
        if style == "zeros":
            expr = f"{x.name} + torch.zeros({tuple(x.shape)!r}{device}) + torch.ones({n}) * {c!r}"
            self.emit(expr, x.shape, x.bound + abs(c), (x,), "creation")
        elif style == "eye":  # n x m, broadcast against x's last two dims (or a row of it)
            rows = x.shape[-2] if len(x.shape) > 1 else None
            eye = f"torch.eye({rows}, {n}{device})" if rows is not None else \
                f"torch.eye({n}{device})[{draw(st.integers(-n, n - 1))}]"
            self.emit(f"{x.name} + {eye} * {c!r}", x.shape, x.bound + abs(c), (x,), "creation")
        elif style == "linspace":  # torch's vectorized loop (its vector width is the CPU's) rounds
            lo, hi = draw(st.sampled_from([(-1.5, 2.0), (0.0, 1.0), (3.0, -0.25)]))  # interior values
            self.emit(f"{x.name} * torch.linspace({lo!r}, {hi!r}, {n}{device})", x.shape,  # within 1 ulp
                      x.bound * 3.0, (x,), "creation", exact=False)
        elif style == "like":
            expr = (f"{x.name} + torch.zeros_like({x.name}) + torch.full_like({x.name}, {c!r}) * "
                    f"torch.ones_like({x.name}, dtype=torch.float32)")
            self.emit(expr, x.shape, x.bound + abs(c), (x,), "creation")
        elif style == "empty":  # written whole before it is read: x[...] = value on torch.empty(_like)
            name = self.fresh()
            # torch.empty in x's dtype: the float64 reference run's would otherwise stay float32 (the
            # default dtype) and a product reading it mixes dtypes, which torch rejects (seed 20261210)
            made = f"torch.empty_like({x.name})" if draw(st.booleans()) else \
                f"torch.empty({tuple(x.shape)!r}, dtype={x.name}.dtype{device})"
            self.lines += [(f"{name} = {made}",) * 2, (f"{name}[...] = {x.name} * {c!r}",) * 2]
            self.values.append(Value(name, x.shape, x.bound * abs(c), x.deps, x.exact))
            self.families.add("creation")
        elif style == "one_hot":  # counts of picked classes, an int64 tensor made float
            k = draw(st.integers(1, 4))
            classes = draw(st.lists(st.integers(0, n - 1), min_size=k, max_size=k))
            made_float = ".float()" if draw(st.booleans()) else ""  # else an int64 sum (int_sum)
            counts = f"torch.nn.functional.one_hot(torch.tensor({classes!r}), {n}){made_float}.sum(0)"
            self.emit(f"{x.name} * {counts}", x.shape, x.bound * k, (x,), "creation")
        elif style == "int_select":  # integer where / clamp: int64 results, as torch's
            m, shift, c = draw(st.integers(2, 3)), draw(st.integers(0, 3)), draw(st.integers(-2, 2))
            low, high = draw(st.sampled_from([(0, 3), (-1, 2), (-2, None), (None, 1)]))
            bounds = ", ".join(f"{name}={value}" for name, value in (("min", low), ("max", high)) if value is not None)
            index = f"torch.where(F.arange({n}{device}) % {m} == 0, F.arange({n}) - {shift}, {c}).clamp({bounds})"
            self.emit(f"{x.name} * {index}", x.shape, x.bound * max(abs(c), shift, n, 3), (x,), "creation")
        elif style == "count":  # an int64 count of a mask along a dim (int_sum), scaling x
            axis = draw(st.integers(-len(x.shape), len(x.shape) - 1))
            threshold = draw(st.sampled_from([-0.5, 0.0, 1.0]))
            self.emit(f"{x.name} * ({x.name} > {threshold!r}).sum({axis}, keepdim=True)", x.shape,
                      x.bound * x.shape[axis], (x,), "creation")
        elif style == "lifted":  # over the 4096 values a literal holds: a lifted constant parameter
            values = draw(st.lists(st.sampled_from([-2.0, -1.5, -0.5, 0.25, 1.0, 2.0]), min_size=n, max_size=n))
            rows = 4096 // n + 1
            self.emit(f"{x.name} * F.tensor([{values!r}] * {rows})[{rows - 1}]", x.shape, x.bound * 2, (x,),
                      "creation")
        elif style == "arange":
            scale, shift, modulus = draw(st.integers(1, 3)), draw(st.integers(0, 4)), draw(st.integers(2, 4))
            expr = f"{x.name} * ((F.arange({n}{device}) * {scale} + {shift}) // 2 % {modulus} - 1)"
            self.emit(expr, x.shape, x.bound * max(1, modulus - 2), (x,), "creation")
        elif style == "literal":
            values = draw(st.lists(st.sampled_from([-2.0, -1.5, -0.5, 0.25, 1.0, 2.0]), min_size=n, max_size=n))
            self.emit(f"{x.name} * F.tensor({values!r})", x.shape, x.bound * 2, (x,), "creation")
        elif style == "full":
            expr = f"{x.name} + F.full({tuple(x.shape)!r}, 0.5) * F.ones_like({x.name})"
            self.emit(expr, x.shape, x.bound + 0.5, (x,), "creation")
        else:
            count, back = draw(st.integers(1, n)), draw(st.integers(0, n))
            back = min(back, n)  # entries -back .. count-1-back: distinct after wrapping, all in [-n, n)
            if count - 1 - back >= n:
                return False
            index = f"(F.arange({count}) * 1.0 - {back}).long()"
            self.emit(f"{x.name}[..., {index}]", (*x.shape[:-1], count), x.bound, (x,), "creation")
        return True

    def matmul(self) -> bool:
        draw = self.draw
        x = self.pick(lambda v: len(v.shape) > 0)
        if x is None:
            return False
        if draw(st.integers(0, 3)) == 0:  # F.linear(x, w, b?)
            n_out = draw(st.sampled_from([1, 3, 4]))
            w = self.pick_or_new((n_out, x.shape[-1]))
            b = self.pick_or_new((n_out,)) if draw(st.booleans()) else None
            bound = x.bound * w.bound * x.shape[-1] + (b.bound if b else 0)
            if bound > LIMIT:
                return False
            args = f"{x.name}, {w.name}" + (f", {b.name}" if b else "")
            operands = (x, w) + ((b,) if b else ())
            self.emit(f"F.linear({args})", tuple(x.shape[:-1]) + (n_out,), bound, operands, "matmul")
            return True
        partners = [(v, _matmul_shape(x.shape, v.shape)) for v in self.usable()]
        partners = [(v, out) for v, out in partners
                    if out is not None and x.bound * v.bound * x.shape[-1] <= LIMIT]
        same = [(v, out) for v, out in partners if v is x]
        if same and draw(st.booleans()):
            y, out = same[0]                        # x @ x
        elif partners and draw(st.integers(0, 3)) > 0:
            y, out = draw(st.sampled_from(partners))
        else:
            k = x.shape[-1]
            shape = draw(st.sampled_from([(k,), (k, 3), (k, 1), (2, k, 4)]))
            if x.bound * 2 * k > LIMIT:
                return False
            y, out = self.new_input(shape), _matmul_shape(x.shape, shape)
            if out is None:
                return False
        self.exact_grads = False
        self.emit(f"{x.name} @ {y.name}", out, x.bound * y.bound * x.shape[-1], (x, y), "matmul")
        return True

    def gelu(self) -> bool:
        x = self.pick()
        if x is None:
            return False
        approx = self.draw(st.sampled_from(["none", "tanh", None]))
        arg = "" if approx is None else f", approximate={approx!r}"
        self.emit(f"F.gelu({x.name}{arg})", x.shape, x.bound, (x,), "gelu")
        return True

    def norm(self, group_only: bool = False) -> bool:
        # Normalized operands are the program's own random inputs, over MIN_NORMALIZED or more
        # elements per row or group: a row of nearly equal values (a few elements of which two are
        # close) has a near-zero variance, where bendc's composed norm (float64 statistics rounded
        # to float32, then float32 x - mean) loses digits that torch's fused kernel keeps (7e-6
        # against torch's 1.3e-7 for a group of 2); a row of equal values (one element, an
        # index_select repeating an element, a relu's zeros) has zero variance, where the input
        # gradient is a cancellation of terms of size rstd * g ~ 300 * g. torch's fused backward
        # cancels those exactly; bendc's layer_norm backward (composed of its ops) leaves about
        # one ulp of them. A known difference, not fuzzed: see the reliability note. (group_norm is
        # fused and float64 inside, bendc/ops/group_norm.py: there torch's float32 is the less
        # accurate side, tests/ops/test_group_norm.py.)
        draw = self.draw
        inputs = {i.name for i in self.inputs}
        if not group_only and draw(st.booleans()):
            x = self.pick(lambda v: len(v.shape) >= 1 and v.name in inputs)
            if x is None:
                return False
            k = draw(st.integers(1, len(x.shape)))
            normalized = tuple(x.shape[-k:])
            if _numel(normalized) < MIN_NORMALIZED:
                return False
            w = self.pick_or_new(normalized) if draw(st.booleans()) else None
            b = self.pick_or_new(normalized) if draw(st.booleans()) else None
            args = f"{x.name}, {normalized!r}" + (f", {w.name}" if w else ", None" if b else "") + \
                   (f", {b.name}" if b else "")
            groups = None
        else:
            x = self.pick(lambda v: len(v.shape) >= 2 and v.name in inputs)
            if x is None:
                return False
            c = x.shape[1]
            spatial = _numel(x.shape[2:])
            options = [g for g in range(1, c + 1) if c % g == 0 and c // g * spatial >= MIN_NORMALIZED]
            if not options:
                return False
            groups = draw(st.sampled_from(options))
            b = self.pick_or_new((c,)) if draw(st.booleans()) else None
            # torch 2.13's group_norm backward fails ("tensor does not have a device") with a bias and no
            # weight: a weight always comes with a bias here
            w = self.pick_or_new((c,)) if b is not None or draw(st.booleans()) else None
            args = f"{x.name}, {groups}" + (f", {w.name}" if w else ", None" if b else "") + \
                   (f", {b.name}" if b else "")
            normalized = x.shape[1:]
        scale = math.sqrt(_numel(normalized)) + 1
        bound = scale * (w.bound if w else 1.0) + (b.bound if b else 0.0)
        if bound > LIMIT:
            return False
        fn = "layer_norm" if groups is None else "group_norm"
        self.emit(f"F.{fn}({args})", x.shape, bound, tuple(o for o in (x, w, b) if o), "norm")
        return True

    def group_norm_family(self) -> bool:
        """norm's group_norm branch alone (the fused ops of bendc/ops/group_norm.py)."""
        return self.norm(group_only=True)

    def rope_family(self) -> bool:
        x = self.pick(lambda v: len(v.shape) >= 2 and v.shape[-1] % 2 == 0)
        if x is None:
            return False
        t, half = x.shape[-2], x.shape[-1] // 2
        cos, sin = self.pick_or_new((t, half)), self.pick_or_new((t, half))
        bound = 2 * x.bound * max(cos.bound, sin.bound)
        if bound > LIMIT:
            return False
        self.emit(f"F.rope({x.name}, {cos.name}, {sin.name})", x.shape, bound, (x, cos, sin), "rope_family")
        return True

    def attention(self) -> bool:
        draw = self.draw
        q = self.pick(lambda v: len(v.shape) == 4 and v.bound <= 8) if draw(st.booleans()) else None
        if q is None:
            q = self.new_input(draw(st.sampled_from(ATTENTION_SHAPES)))
        b, h, t, d = q.shape
        if draw(st.integers(0, 2)) == 0:
            k = v = q
            gqa = False
        else:
            hkv = draw(st.sampled_from([g for g in range(1, h + 1) if h % g == 0]))
            k = self.pick_or_new((b, hkv, t, d), lambda v: v.bound <= 8)
            v = k if draw(st.integers(0, 3)) == 0 else self.pick_or_new((b, hkv, t, d))
            gqa = hkv != h
        args = [q.name, k.name, v.name]
        if draw(st.booleans()):
            args.append(f"is_causal={draw(st.booleans())}")
        if draw(st.booleans()):
            args.append(f"scale={draw(st.sampled_from([0.5, 1.0, 0.25]))!r}")
        if gqa:
            args.append("enable_gqa=True")
        self.emit(f"F.scaled_dot_product_attention({', '.join(args)})", q.shape, v.bound, (q, k, v), "attention")
        return True

    def index_select(self) -> bool:
        draw = self.draw
        x = self.pick(lambda v: len(v.shape) >= 1)
        if x is None:
            return False
        rank = len(x.shape)
        dim = draw(st.integers(-rank, rank - 1))
        length = draw(st.integers(1, 4))
        idx = self.new_input((length,), "i64", False, high=x.shape[dim])
        out = list(x.shape)
        out[dim] = length
        self.emit(f"F.index_select({x.name}, {dim}, {idx.name})", out, x.bound, (x,), "index_select")
        return True

    def gather(self) -> bool:
        draw = self.draw
        x = self.pick(lambda v: len(v.shape) >= 1)
        if x is None:
            return False
        rank = len(x.shape)
        dim = draw(st.integers(-rank, rank - 1))
        shape = [draw(st.integers(1, 4)) if a == dim % rank else draw(st.integers(1, x.shape[a]))
                 for a in range(rank)]
        idx = self.new_input(tuple(shape), "i64", False, high=x.shape[dim])
        self.emit(f"F.gather({x.name}, {dim}, {idx.name})", shape, x.bound, (x,), "gather")
        return True

    def cross_entropy(self) -> bool:
        x = self.pick(lambda v: len(v.shape) == 2)
        if x is None:
            return False
        n, c = x.shape
        target = self.new_input((n,), "i64", False, high=c)
        self.emit(f"F.cross_entropy({x.name}, {target.name})", (), 2 * x.bound + math.log(c) + 1, (x,),
                  "cross_entropy")
        return True

    def mse(self) -> bool:
        x = self.pick()
        if x is None:
            return False
        y = self.pick_or_new(x.shape)
        bound = (x.bound + y.bound) ** 2
        if bound > LIMIT:
            return False
        self.emit(f"F.mse_loss({x.name}, {y.name})", (), bound, (x, y), "mse")
        return True

    def sgd(self) -> bool:
        draw = self.draw
        p = self.pick()
        if p is None:
            return False
        g = self.pick_or_new(p.shape)
        lr = draw(st.sampled_from([0.1, 0.01, 1.0]))
        if draw(st.booleans()):
            self.emit(f"F.sgd_step({p.name}, {g.name}, {lr!r})", p.shape, p.bound + lr * g.bound, (p, g), "sgd")
            return True
        buf = self.pick_or_new(p.shape) if draw(st.booleans()) else None
        new_buf_bound = g.bound + (0.9 * buf.bound if buf else 0)
        bound = p.bound + lr * new_buf_bound
        if bound > LIMIT:
            return False
        pname, bname = self.fresh(), self.fresh()
        operands = (p, g) + ((buf,) if buf else ())
        call = f"F.sgd_step({p.name}, {g.name}, {lr!r}, momentum=0.9" + (f", buf={buf.name})" if buf else ")")
        self.lines.append((f"{pname}, {bname} = {call}",) * 2)
        deps = frozenset().union(*[o.deps for o in operands])
        buf_deps = g.deps | (buf.deps if buf else frozenset())
        self.values += [Value(pname, p.shape, bound, deps, False),
                        Value(bname, p.shape, new_buf_bound, buf_deps, False)]
        self.families.add("sgd")
        self.exact_grads = False
        return True

    def adam_operands(self):
        """(param, grad, m, v) for an Adam step, or None: v is squared, so it stays small."""
        p = self.pick()
        if p is None:
            return None
        return p, self.pick_or_new(p.shape), self.pick_or_new(p.shape), self.pick_or_new(p.shape, lambda u: u.bound <= 30)

    def adam(self) -> bool:
        draw = self.draw
        operands = self.adam_operands()
        if operands is None:
            return False
        p, g, m, v = operands
        if draw(st.booleans()):
            step = self.new_input((), "step", False).name
        else:
            step = str(draw(st.integers(1, 4)))
        lr = draw(st.sampled_from([0.1, 0.001]))
        wd = draw(st.sampled_from([0.0, 0.0, 0.01]))
        call = f"F.adam_step({p.name}, {g.name}, {m.name}, {v.name} * {v.name}, {step}, {lr!r}" + \
               (f", weight_decay={wd!r})" if wd else ")")
        names = [self.fresh() for _ in range(3)]
        self.lines.append((f"{', '.join(names)} = {call}",) * 2)
        deps = frozenset().union(p.deps, g.deps, m.deps, v.deps)
        # the step is at most lr / (1 - beta1) * |m / sqrt(v)| ~ lr * 10 * sqrt(1 / (1 - beta2)) ~ 32 lr,
        # large where v ~ 0; the bound keeps these out of products
        self.values += [Value(names[0], p.shape, LIMIT, deps, False),
                        Value(names[1], p.shape, g.bound + m.bound, g.deps | m.deps, False),
                        Value(names[2], p.shape, (v.bound ** 2) + g.bound ** 2, g.deps | v.deps, False)]
        self.families.add("adam")
        self.exact_grads = False
        return True

    def adam_traced(self) -> bool:
        """bendc.optim.adam with a traced (0-d array) learning rate, and sometimes traced betas."""
        draw = self.draw
        operands = self.adam_operands()
        if operands is None:
            return False
        p, g, m, v = operands
        lr = self.new_input((), "hyper", False, high=0).name
        if draw(st.booleans()):
            betas = f"({self.new_input((), 'hyper', False, high=1).name}, 0.999)"
        else:
            betas = "(0.9, 0.999)"
        step = draw(st.integers(0, 3))
        state = f"{{'step': {step}, 'exp_avg': ({m.name},), 'exp_avg_sq': ({v.name} * {v.name},)}}"
        names = [self.fresh() for _ in range(3)]
        self.lines.append((f"({names[0]},), {names[1]} = bendc.optim.adam(({p.name},), ({g.name},), {state}, "
                           f"lr={lr}, betas={betas})",) * 2)
        self.lines.append((f"({names[2]},) = {names[1]}['exp_avg']",) * 2)
        deps = frozenset().union(p.deps, g.deps, m.deps, v.deps)
        self.values += [Value(names[0], p.shape, LIMIT, deps, False),
                        Value(names[2], p.shape, g.bound + m.bound, g.deps | m.deps, False)]
        self.families.add("adam_traced")
        self.exact_grads = False
        return True

    def combine(self) -> bool:
        """a.<f>().mean() * b.<g>().sum(): scalar reductions of two values (two inputs) combined (known bug 5)."""
        draw = self.draw
        x, y = self.pick(), self.pick()
        if x is None:
            return False
        parts = []
        for v in (x, y):
            f = draw(st.sampled_from(["", ".exp()", ".sigmoid()", ".tanh()"]))
            if f == ".exp()" and v.bound > 2:
                f = ".tanh().exp()"
            r = draw(st.sampled_from(["sum", "mean"]))
            bound = (math.e ** min(v.bound, 1.0) if "exp" in f else 1.0 if f else v.bound) * \
                (_numel(v.shape) if r == "sum" else 1)
            parts.append((f"{v.name}{f}.{r}()", bound))
        op = draw(st.sampled_from("*+-"))
        bound = parts[0][1] * parts[1][1] if op == "*" else parts[0][1] + parts[1][1]
        if bound > LIMIT:
            return False
        out = self.emit(f"{parts[0][0]} {op} {parts[1][0]}", (), bound, (x, y), "combine")
        if out.deps and draw(st.booleans()):  # out.backward() at once
            self.lines.append((f"{out.name}.backward()", f"{out.name}.backward(retain_graph=True)"))
            for leaf in out.deps:
                self.grad_set[leaf] = True
            self.backwards += 1
            self.roots.append(out)
        return True

    def backward(self) -> bool:
        draw = self.draw
        x = self.pick(lambda v: bool(v.deps) and math.isfinite(v.bound))
        if x is None:
            return False
        if x.shape == () and draw(st.booleans()):
            root = x.name
        else:
            form = draw(st.sampled_from(["sum", "mean", "scaled"]))
            root = self.fresh("loss")
            expr = {"sum": f"{x.name}.sum()", "mean": f"{x.name}.mean()", "scaled": f"({x.name} * 0.5).sum()"}[form]
            self.lines.append((f"{root} = {expr}",) * 2)
            self.values.append(Value(root, (), x.bound * max(1, _numel(x.shape)), x.deps, False))
        self.lines.append((f"{root}.backward()", f"{root}.backward(retain_graph=True)"))
        self.roots.append(self.values[-1] if root != x.name else x)
        for leaf in x.deps:
            self.grad_set[leaf] = True
        self.families.add("backward")
        self.backwards += 1
        return True

    def zero_grad(self) -> bool:
        leaves = [name for name in self.grad_set]
        if not leaves:
            return False
        chosen = self.draw(st.lists(st.sampled_from(leaves), min_size=1, max_size=len(leaves), unique=True))
        self.lines.append((f"bendc.zero_grad({', '.join(chosen)})",) * 2)
        for leaf in chosen:
            self.grad_set[leaf] = False
        self.families.add("zero_grad")
        return True

    def grad_read(self) -> bool:
        leaves = [name for name, set_ in self.grad_set.items() if set_]
        if not leaves:
            return False
        leaf = self.draw(st.sampled_from(leaves))
        shape = next(i.shape for i in self.inputs if i.name == leaf)
        name = self.fresh("g")
        self.lines.append((f"{name} = {leaf}.grad", f"{name} = _grad({leaf})"))
        self.values.append(Value(name, shape, LIMIT / 2, frozenset(), self.exact_grads))
        self.families.add("grad_read")
        return True

    # ------------------------------------------------------------- dropout, activations, losses (op-coverage issue)
    def dropout(self) -> bool:
        """F.dropout with a seed input; torch's side draws the same mask (TorchF.dropout)."""
        draw = self.draw
        seeds = [i for i in self.inputs if i.kind == "seed"]
        s = seeds[0].name if seeds and draw(st.booleans()) else self.new_input((), "seed", False).name
        if draw(st.integers(0, 3)) == 0:  # attention's dropout_p (the composed path)
            q = self.new_input(draw(st.sampled_from(ATTENTION_SHAPES)))
            b, h, t, d = q.shape
            k = self.pick_or_new((b, 1, t, d), lambda v: v.bound <= 8)
            causal = draw(st.booleans())
            self.emit(f"F.scaled_dot_product_attention({q.name}, {k.name}, {k.name}, dropout_p=0.5, "
                      f"is_causal={causal}, enable_gqa={h != 1}, seed={s})", q.shape, 2 * k.bound, (q, k), "dropout",
                      exact=False)
            return True
        x = self.pick()
        if x is None:
            return False
        p = draw(st.sampled_from([0.0, 0.25, 0.5, 0.9, 1.0]))
        training = "" if draw(st.integers(0, 4)) else ", training=False"
        bound = x.bound / (1.0 - p) if p < 1.0 else x.bound
        if bound > LIMIT:
            return False
        self.emit(f"F.dropout({x.name}, {p!r}{training}, seed={s})", x.shape, bound, (x,), "dropout", exact=True)
        return True

    def pick_grad(self, pred=lambda v: True) -> Value | None:
        """A value whose gradient a backward can reach, when there is one (else any)."""
        return self.pick(lambda v: bool(v.deps) and pred(v)) or self.pick(pred)

    def activation_fns(self) -> bool:
        draw = self.draw
        x = self.pick_grad()
        if x is None:
            return False
        forms = ["silu", "softplus", "leaky_relu", "elu", "hardtanh"] + list(_MORE_ACTIVATIONS) + ["glu", "inplace"]
        for form in draw(st.lists(st.sampled_from(forms), min_size=1, max_size=3, unique=True)):
            x = self._activation(x, form)
            if x is None:
                return False
        return True

    def _activation(self, x: Value, form: str) -> Value | None:
        draw = self.draw
        if form in _MORE_ACTIVATIONS:  # torch.nn.functional's spelling in both programs
            arguments, bound, exact, grad_exact = _MORE_ACTIVATIONS[form]
            return self.emit(f"torch.nn.functional.{form}({x.name}{arguments})", x.shape, bound(x.bound), (x,),
                             "activation_fns", exact=exact, grad_exact=grad_exact)
        if form == "glu":  # the halves of the last dim
            if not x.shape or x.shape[-1] % 2:
                return None
            return self.emit(f"torch.nn.functional.glu({x.name})", (*x.shape[:-1], x.shape[-1] // 2), x.bound, (x,),
                             "activation_fns", exact=False)
        if form == "inplace":  # an activation written into a copy, read through a second name
            name, alias = self.fresh(), self.fresh()
            self.lines += [(f"{name} = {x.name}.clone()",) * 2, (f"{alias} = {name}",) * 2,
                           (f"torch.nn.functional.relu({name}, inplace=True)",) * 2]
            value = Value(alias, x.shape, x.bound, x.deps, x.exact)
            self.values.append(value)
            self.families.add("activation_fns")
            return value
        if form == "silu":
            expr, bound, exact = f"F.silu({x.name})", x.bound + 1, False
        elif form == "softplus":
            beta, threshold = draw(st.sampled_from([(1.0, 20.0), (2.0, 1.0), (0.5, 2.0)]))
            expr, bound, exact = f"F.softplus({x.name}, {beta!r}, {threshold!r})", x.bound + 2 / beta, False
        elif form == "leaky_relu":
            slope = draw(st.sampled_from([0.01, 0.2, 1.5]))
            expr, bound, exact = f"F.leaky_relu({x.name}, {slope!r})", x.bound * max(1.0, slope), True
        elif form == "elu":
            alpha = draw(st.sampled_from([1.0, 0.5, 2.0]))
            expr, bound, exact = f"F.elu({x.name}, {alpha!r})", max(x.bound, alpha), False
        else:
            low, high = draw(st.sampled_from([(-1.0, 1.0), (-0.5, 2.0), (0.0, 1.0)]))
            expr, bound, exact = f"F.hardtanh({x.name}, {low!r}, {high!r})", 2.0, True
        return self.emit(expr, x.shape, bound, (x,), "activation_fns", exact=exact)

    def losses(self) -> bool:
        draw = self.draw
        form = draw(st.sampled_from(["cross_entropy", "nll_loss", "bce", "normalize", "embedding", "pointwise",
                                     "probabilities"]))
        if form == "pointwise":  # mse / l1 / smooth_l1 / huber against a second operand, reduced
            x = self.pick_grad()
            if x is None:
                return False
            y = self.pick_or_new(x.shape)
            name = draw(st.sampled_from(["mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss"]))
            option = {"smooth_l1_loss": ", beta=" + repr(draw(st.sampled_from([1.0, 0.5, 0.0]))),
                      "huber_loss": ", delta=" + repr(draw(st.sampled_from([1.0, 2.0])))}.get(name, "")
            reduction = draw(st.sampled_from(["mean", "sum", "none"]))
            scale = (x.bound + y.bound) ** (2 if name == "mse_loss" else 1) + 1
            bound = scale * (max(1, _numel(x.shape)) if reduction == "sum" else 1)
            if bound > LIMIT:
                return False
            self.emit(f"torch.nn.functional.{name}({x.name}, {y.name}, reduction={reduction!r}{option})",
                      x.shape if reduction == "none" else (), bound, (x, y), "losses", exact=False)
            return True
        if form == "probabilities":  # binary_cross_entropy and kl_div of (log-)probabilities made by the step
            x = self.pick_grad(lambda v: len(v.shape) >= 1 and v.bound <= 20)
            if x is None:
                return False
            y = self.pick_or_new(x.shape, lambda v: v.bound <= 20)
            if draw(st.booleans()):
                reduction = draw(st.sampled_from(["mean", "sum", "none"]))
                call = (f"torch.nn.functional.binary_cross_entropy({x.name}.sigmoid(), {y.name}.sigmoid(), "
                        f"reduction={reduction!r})")
                bound = (x.bound + 2) * (max(1, _numel(x.shape)) if reduction == "sum" else 1)
            else:
                reduction = draw(st.sampled_from(["batchmean", "sum", "none"]))  # "mean": torch warns
                log_target = draw(st.booleans())
                target = f"{y.name}.log_softmax(-1)" if log_target else f"{y.name}.softmax(-1)"
                call = (f"torch.nn.functional.kl_div({x.name}.log_softmax(-1), {target}, reduction={reduction!r}, "
                        f"log_target={log_target})")
                bound = (2 * x.bound + 2 * y.bound + 2) * (max(1, _numel(x.shape)) if reduction != "none" else 1)
            if bound > LIMIT:
                return False
            self.emit(call, x.shape if reduction == "none" else (), bound, (x, y), "losses", exact=False)
            return True
        if form in ("cross_entropy", "nll_loss"):
            x = self.pick_grad(lambda v: len(v.shape) == 2 and v.bound <= 50)
            if x is None:
                return False
            n, c = x.shape
            target = self.new_input((n,), "i64", False, high=c)
            # ignoring a class only with reduction="sum" or "none": a mean over no rows is nan
            ignore = draw(st.sampled_from([-100, 0, c - 1]))
            reduction = draw(st.sampled_from(["mean", "sum", "none"] if ignore == -100 else ["sum", "none"]))
            args = f"ignore_index={ignore}, reduction={reduction!r}"
            if form == "cross_entropy":
                args += f", label_smoothing={draw(st.sampled_from([0.0, 0.1]))!r}"
                operand = x.name
            else:
                operand = f"F.log_softmax({x.name}, 1)"
            shape = (n,) if reduction == "none" else ()
            bound = (2 * x.bound + math.log(c) + 1) * (n if reduction == "sum" else 1)
            self.emit(f"F.{form}({operand}, {target.name}, {args})", shape, bound, (x,), "losses", exact=False)
            return True
        if form == "bce":
            x = self.pick_grad()
            if x is None:
                return False
            y = self.pick_or_new(x.shape)
            reduction = draw(st.sampled_from(["mean", "sum", "none"]))
            shape = x.shape if reduction == "none" else ()
            bound = (x.bound + 1) * (max(1, _numel(x.shape)) if reduction == "sum" else 1)
            if bound > LIMIT:
                return False
            call = f"F.binary_cross_entropy_with_logits({x.name}, {y.name}.sigmoid(), reduction={reduction!r})"
            self.emit(call, shape, bound, (x, y), "losses", exact=False)
            return True
        if form == "normalize":
            x = self.pick_grad(lambda v: len(v.shape) >= 1)
            if x is None:
                return False
            dim = draw(st.integers(-len(x.shape), len(x.shape) - 1))
            self.emit(f"F.normalize({x.name}, dim={dim})", x.shape, 1.0, (x,), "losses", exact=False)
            return True
        table = self.pick_grad(lambda v: len(v.shape) == 2 and bool(v.deps))
        if table is None or draw(st.booleans()):
            table = self.new_input(draw(st.sampled_from([(4, 3), (3, 4)])), leaf=True)
        rows = table.shape[0]
        index = self.new_input(draw(st.sampled_from([(3,), (2, 2)])), "i64", False, high=rows)
        padding = draw(st.sampled_from([None, 0, rows - 1]))
        arg = "" if padding is None else f", padding_idx={padding}"
        # the value moves data (bitwise); the gradient sums repeated rows in an order of its own
        self.emit(f"F.embedding({index.name}, {table.name}{arg})", index.shape + (table.shape[1],), table.bound,
                  (table,), "losses", exact=True, grad_exact=False)
    # ------------------------------------------------------------- issue 14: selection, powers, shapes
    def select(self) -> bool:
        """Comparisons as masks (bool arithmetic, .float(), where, masked_fill), clamp, abs, sign and
        detach, on values bitwise equal to torch's (a mask of a rounded value could flip)."""
        draw = self.draw
        x = self.pick(lambda v: v.exact and math.isfinite(v.bound))
        if x is None:
            return False
        y = self.pick(lambda v: v.exact and math.isfinite(v.bound) and _broadcast(v.shape, x.shape) is not None)
        other = y.name if y is not None and draw(st.booleans()) else repr(draw(st.sampled_from([0.0, 0.5, -1.0])))
        operands = (x, y) if other == getattr(y, "name", None) else (x,)
        y_bound = y.bound if len(operands) == 2 else 1.0
        shape = _broadcast(x.shape, y.shape) if len(operands) == 2 else x.shape
        compare = draw(st.sampled_from(["<", "<=", ">", ">=", "==", "!="]))
        mask = f"({x.name} {compare} {other})"
        if draw(st.integers(0, 3)) == 0:  # masks combined: &, |, ^, ~
            joiner = draw(st.sampled_from(["&", "|", "^"]))
            mask = f"(~{mask} {joiner} ({x.name} > {draw(st.sampled_from([0.0, -0.5]))!r}))"
        form = draw(st.sampled_from(["mul", "add", "float", "where", "masked_fill", "clamp", "clamp_tensor", "abs",
                                     "sign", "detach"]))
        gradient_operands = None  # the operands the result's gradient reaches, where fewer than ``operands``
        # a mask carries no gradient: where y appears only in the mask, the result depends on x alone
        # (torch refuses a backward from a loss on such a result when x needs no grad)
        if form == "mul":
            expr, torch_expr, bound = f"{mask} * {x.name}", None, x.bound
            gradient_operands = (x,)
        elif form == "add":
            expr, torch_expr, bound = f"{x.name} + {mask}", None, x.bound + 1
            gradient_operands = (x,)
        elif form == "float":  # a mask alone requires no grad
            # torch's spelling casts to x's dtype: .float() in torch's float64 run would hand float32
            # to a float64 op after it (conv2d refused "expected scalar type Float but found Double")
            expr, torch_expr, bound, operands = f"{mask}.float() - 0.5", f"{mask}.to({x.name}.dtype) - 0.5", 0.5, ()
        elif form == "where":
            expr = f"F.where({mask}, {x.name}, {other})"
            torch_expr = f"torch.where({mask}, {x.name}, {other})"
            bound = max(x.bound, y_bound)
        elif form == "masked_fill":
            fill = draw(st.sampled_from([0.0, -2.5, 1.0]))
            expr, torch_expr, bound = f"{x.name}.masked_fill({mask}, {fill!r})", None, max(x.bound, 2.5)
            gradient_operands = (x,)
        elif form == "clamp":
            low = draw(st.sampled_from([None, -1.0, 0.0, -0.5]))
            high = draw(st.sampled_from([None, 1.0, 0.0, 0.5])) if low is not None else draw(st.sampled_from([1.0, 0.5]))
            method = draw(st.sampled_from(["clamp", "clip"]))
            expr, torch_expr, bound, operands = f"{x.name}.{method}({low!r}, {high!r})", None, x.bound, (x,)
            shape = x.shape
        elif form == "clamp_tensor":
            if len(operands) != 2:
                return False
            expr = f"F.clamp({x.name}, max={y.name})" if draw(st.booleans()) else f"F.clamp({x.name}, {y.name})"
            torch_expr = expr.replace("F.clamp", "torch.clamp")
            bound = max(x.bound, y.bound)
        elif form in ("abs", "sign"):
            spelled = f"abs({x.name})" if form == "abs" and draw(st.booleans()) else f"{x.name}.{form}()"
            expr, torch_expr, bound, operands, shape = spelled, None, x.bound if form == "abs" else 1.0, (x,), x.shape
        else:
            if not x.deps:
                return False
            expr, torch_expr, bound, operands, shape = f"{x.name}.detach() * {x.name}", None, x.bound ** 2, (x,), x.shape
        if bound > LIMIT:
            return False
        if len(operands) == 2 and x.shape != y.shape:
            self.exact_grads = False
        self.emit(expr, shape, bound, gradient_operands or operands, "select", exact=True, torch_expr=torch_expr)
        return True

    def power(self) -> bool:
        """x ** e for any float e (a positive base for fractional ones), tensor exponents, a number
        base, rsqrt; torch's pow_backward formulas."""
        draw = self.draw
        x = self.pick(lambda v: math.isfinite(v.bound))
        if x is None or x.bound ** 2 + 1 > LIMIT:
            return False
        base = f"({x.name} * {x.name} + 1.0)"
        base_bound = x.bound ** 2 + 1
        form = draw(st.sampled_from(["float", "integer", "tensor", "number", "rsqrt"]))
        operands = (x,)
        shape = x.shape
        if form == "float":
            e = draw(st.sampled_from([1.5, -0.5, 0.25, 2.5, -2.0, 0.5, -1.0, 0.0, -1.25]))
            expr, bound = f"{base} ** {e!r}" if draw(st.booleans()) else f"{base}.pow({e!r})", base_bound ** max(e, 0)
        elif form == "integer":
            e = draw(st.sampled_from([3, 4, 1, 0]))
            expr, bound = f"{x.name} ** {e}", x.bound ** e
        elif form == "tensor":
            y = self.pick(lambda v: v.bound <= 2 and _broadcast(v.shape, x.shape) is not None)
            if y is None:
                return False
            operands, shape = (x, y), _broadcast(x.shape, y.shape)
            expr, bound = f"{base} ** {y.name}", base_bound ** 2
            self.exact_grads = False
        elif form == "number":
            if x.bound > 3:
                return False
            number = draw(st.sampled_from([2.0, 0.5, 1.0, 3]))
            expr, bound = f"{number!r} ** {x.name}", max(number, 1 / number) ** x.bound
        else:
            expr, bound = f"{base}.rsqrt()", 1.0
        if bound > LIMIT:
            return False
        self.emit(expr, shape, bound, operands, "power", exact=False)
        return True

    def shape(self) -> bool:
        """cat, stack, split, chunk, squeeze, flatten, unflatten, expand, repeat, pad and tril/triu."""
        draw = self.draw
        x = self.pick(lambda v: len(v.shape) > 0 and math.isfinite(v.bound))
        if x is None:
            return False
        rank = len(x.shape)
        form = draw(st.sampled_from(["cat", "stack", "split", "chunk", "squeeze", "flatten", "expand", "repeat",
                                     "pad", "tril", "unflatten"]))
        dim = draw(st.integers(-rank, rank - 1))
        axis = dim % rank
        grad_exact = True
        operands = (x,)
        torch_expr = None
        if form == "cat":
            other_shape = list(x.shape)
            other_shape[axis] = draw(st.integers(1, 3))
            y = self.pick_or_new(tuple(other_shape))
            operands = (x, y)
            expr = f"F.cat([{x.name}, {y.name}], {dim})"
            torch_expr = f"torch.cat([{x.name}, {y.name}], {dim})"
            shape = list(x.shape)
            shape[axis] += other_shape[axis]
            bound = max(x.bound, y.bound)
        elif form == "stack":
            y = self.pick_or_new(x.shape)
            operands = (x, y)
            new = draw(st.integers(-rank - 1, rank))
            expr = f"F.stack(({x.name}, {y.name}), {new})"
            torch_expr = f"torch.stack(({x.name}, {y.name}), {new})"
            shape = list(x.shape)
            shape.insert(new % (rank + 1), 2)
            bound = max(x.bound, y.bound)
        elif form in ("split", "chunk"):
            size = x.shape[axis]
            if form == "split":
                piece = draw(st.integers(1, max(size, 1)))
                starts = list(range(0, size, piece)) or [0]
                which = draw(st.integers(0, len(starts) - 1))
                length = min(piece, size - starts[which])
                expr = f"{x.name}.split({piece}, {dim})[{which}]"
            else:
                chunks = draw(st.integers(1, 4))
                piece = -(-size // chunks)
                starts = list(range(0, size, piece))
                which = draw(st.integers(0, len(starts) - 1))
                length = min(piece, size - starts[which])
                expr = f"{x.name}.chunk({chunks}, {dim})[{which}]"
            shape = list(x.shape)
            shape[axis] = length
            bound = x.bound
        elif form == "squeeze":
            arg = "" if draw(st.booleans()) else str(dim)
            shape = [d for a, d in enumerate(x.shape) if not (d == 1 and (arg == "" or a == axis))]
            expr, bound = f"{x.name}.squeeze({arg})", x.bound
        elif form == "unflatten":  # x.unflatten / torch.unflatten (nn.Unflatten's forward), one size maybe -1
            if rank >= MAX_RANK:
                return False
            size = x.shape[axis]
            first = draw(st.sampled_from([d for d in range(1, size + 1) if size % d == 0] or [1]))
            if size == 0:
                return False
            sizes = [first, size // first]
            spelled = [draw(st.sampled_from([s, -1])) if k == 1 else s for k, s in enumerate(sizes)]
            shape = list(x.shape[:axis]) + sizes + list(x.shape[axis + 1:])
            expr = (f"{x.name}.unflatten({dim}, {tuple(spelled)!r})" if draw(st.booleans())
                    else f"torch.unflatten({x.name}, {dim}, {spelled!r})")
            bound = x.bound
        elif form == "flatten":
            start = draw(st.integers(0, rank - 1))
            end = draw(st.integers(start, rank - 1))
            shape = list(x.shape[:start]) + [_numel(x.shape[start:end + 1])] + list(x.shape[end + 1:])
            expr, bound = f"{x.name}.flatten({start}, {end - rank if draw(st.booleans()) else end})", x.bound
        elif form == "expand":
            sizes = [draw(st.sampled_from([d, -1])) if d != 1 else draw(st.sampled_from([1, 2, 3])) for d in x.shape]
            lead = [2] if draw(st.booleans()) and rank < MAX_RANK else []
            shape = lead + [d if s == -1 else s for d, s in zip(x.shape, sizes)]
            expr, bound = f"{x.name}.expand({', '.join(map(str, lead + sizes))})", x.bound
            grad_exact = False
        elif form == "repeat":
            sizes = [draw(st.integers(1, 2)) for _ in range(rank)]
            if draw(st.booleans()) and rank < MAX_RANK:
                sizes = [2] + sizes
            full = [1] * (len(sizes) - rank) + list(x.shape)
            shape = [s * d for s, d in zip(sizes, full)]
            if _numel(shape) > 256:
                return False
            expr, bound = f"{x.name}.repeat({', '.join(map(str, sizes))})", x.bound
            grad_exact = False
        elif form == "pad":
            pairs = draw(st.integers(1, min(rank, 2)))
            amounts = []
            for k in range(pairs):
                size = x.shape[rank - 1 - k]
                left = draw(st.integers(-min(size, 2) // 2 if size > 1 else 0, 2))
                right = draw(st.integers(-(size + min(left, 0)) // 2 if size > 1 else 0, 2))
                amounts += [left, right]
            shape = list(x.shape)
            for k in range(pairs):
                shape[rank - 1 - k] += amounts[2 * k] + amounts[2 * k + 1]
            if any(d < 0 for d in shape):
                return False
            value = draw(st.sampled_from([None, 0.0, 1.5]))
            arg = "" if value is None else f", value={value!r}"
            expr = f"F.pad({x.name}, {tuple(amounts)!r}{arg})"
            torch_expr = f"torch.nn.functional.pad({x.name}, {tuple(amounts)!r}{arg})"
            bound = max(x.bound, 1.5)
        else:
            if rank < 2:
                return False
            which = draw(st.sampled_from(["tril", "triu"]))
            diagonal = draw(st.integers(-2, 2))
            expr, shape, bound = f"{x.name}.{which}({diagonal})", list(x.shape), x.bound
        if 0 in shape:
            return False
        self.emit(expr, tuple(shape), bound, operands, "shape", exact=True, grad_exact=grad_exact,
                  torch_expr=torch_expr)
        return True


# ---------------------------------------------------------------- convolution and pooling (op-coverage issue)
IMAGE_SHAPES = [(1, 2, 5, 5), (2, 3, 4, 6), (2, 4, 6, 5), (1, 1, 7, 3), (3, 2, 3, 3)]
TorchF.conv1d = staticmethod(TF.conv1d)
TorchF.conv2d = staticmethod(TF.conv2d)
TorchF.max_pool2d = staticmethod(TF.max_pool2d)
TorchF.avg_pool2d = staticmethod(TF.avg_pool2d)
TorchF.adaptive_avg_pool2d = staticmethod(TF.adaptive_avg_pool2d)


def _image_operand(builder: Builder, rank: int, pred=lambda v: True) -> Value:
    """A (N, C, H, W) (rank 4) or (N, C, L) (rank 3) value of the program, or a new input."""
    picked = builder.pick(lambda v: len(v.shape) == rank and min(v.shape) >= 1 and pred(v))
    if picked is not None and builder.draw(st.booleans()):
        return picked
    shape = builder.draw(st.sampled_from(IMAGE_SHAPES))
    return builder.new_input(shape if rank == 4 else shape[:2] + (shape[2] * shape[3],))


def _conv_family(self: Builder) -> bool:
    """F.conv2d / F.conv1d: stride, padding (ints, 'same', 'valid'), dilation, groups, bias.

    Padding stays at most 1 (or 'same'): a wider one only adds borders of bias-only outputs, and a
    sum over hundreds of those cancelling to a few units is where bendc's reference sum (numpy's
    float32 pairwise sum) drifts past torch's more accurate one (3e-5 against 1.3e-6 for 960
    outputs summing to 2): a property of the sum, not of the convolution."""
    draw = self.draw
    rank = draw(st.sampled_from((4, 4, 3)))
    x = _image_operand(self, rank)
    spatial = x.shape[2:]
    channels = x.shape[1]
    groups = draw(st.sampled_from([g for g in range(1, channels + 1) if channels % g == 0]))
    out_channels = groups * draw(st.integers(1, 2))
    kernel = tuple(draw(st.integers(1, 3)) for _ in spatial)
    dilation = draw(st.integers(1, 2))
    padding = draw(st.sampled_from([0, 1, "same", "valid"]))
    stride = 1 if padding == "same" else draw(st.integers(1, 2))
    pad = 0 if padding in ("same", "valid") else padding
    if any(size + 2 * pad < dilation * (k - 1) + 1 for size, k in zip(spatial, kernel)) and padding != "same":
        return False
    if padding == "same":
        out_spatial = spatial
    else:
        out_spatial = tuple((size + 2 * pad - dilation * (k - 1) - 1) // stride + 1 for size, k in zip(spatial, kernel))
    w = self.pick_or_new((out_channels, channels // groups) + kernel)
    b = self.pick_or_new((out_channels,)) if draw(st.booleans()) else None
    terms = channels // groups * math.prod(kernel)
    bound = x.bound * w.bound * terms + (b.bound if b else 0.0)
    if bound > LIMIT:
        return False
    fn = "conv2d" if rank == 4 else "conv1d"
    args = f"{x.name}, {w.name}, {b.name if b else None}, stride={stride}, padding={padding!r}, " \
           f"dilation={dilation}, groups={groups}"
    self.emit(f"F.{fn}({args})", (x.shape[0], out_channels) + out_spatial, bound,
              tuple(o for o in (x, w, b) if o), "conv")
    return True


def _pool_family(self: Builder) -> bool:
    """F.max_pool2d (kernel, stride, padding, dilation, ceil_mode), F.avg_pool2d (count_include_pad,
    ceil_mode), F.adaptive_avg_pool2d. Max pools read exact values only: an operand that rounds
    differently from torch's could move an argmax, and with it the gradient."""
    from bendc.ops.conv import pool_output_size

    draw = self.draw
    kind = draw(st.sampled_from(("max", "avg", "adaptive")))
    x = _image_operand(self, 4, (lambda v: v.exact) if kind == "max" else (lambda v: True))
    height, width = x.shape[2:]
    if kind == "adaptive":
        size = (draw(st.integers(1, height + 1)), draw(st.integers(1, width + 1)))
        self.emit(f"F.adaptive_avg_pool2d({x.name}, {size!r})", x.shape[:2] + size, x.bound, (x,), "pool")
        return True
    kernel = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2))) if kind == "max" else (1, 1)
    padding = tuple(draw(st.integers(0, k // 2)) for k in kernel)  # torch: at most half the kernel size
    ceil_mode = draw(st.booleans())
    out = tuple(pool_output_size(s, k, st_, p, d, ceil_mode)
                for s, k, st_, p, d in zip((height, width), kernel, stride, padding, dilation))
    if min(out) < 1:
        return False
    if kind == "max":
        call = (f"F.max_pool2d({x.name}, {kernel!r}, {stride!r}, {padding!r}, {dilation!r}, "
                f"ceil_mode={ceil_mode})")
    else:
        call = (f"F.avg_pool2d({x.name}, {kernel!r}, {stride!r}, {padding!r}, ceil_mode={ceil_mode}, "
                f"count_include_pad={draw(st.booleans())})")
    self.emit(call, x.shape[:2] + out, x.bound, (x,), "pool")
    return True


Builder.conv = _conv_family
Builder.pool = _pool_family


# ---------------------------------------------------------------- issue 22: elementwise math, more optimizers
for _name in ("maximum", "minimum", "fmax", "fmin", "atan2", "lerp", "log2", "log10", "log1p"):
    setattr(TorchF, _name, staticmethod(getattr(torch, _name)))
TorchF.nan_to_num = staticmethod(torch.nan_to_num)
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _math_ops_family(self: Builder) -> bool:
    """issue 22's elementwise math that the ``method`` family cannot reach: maximum/minimum/fmax/fmin
    and atan2 of two values (broadcasting), lerp (a number or a tensor weight), nan_to_num (of a
    finite value; of a log or a reciprocal that is NaN or +-inf where its operand is <= 0 or 0, or
    of a poisoned value, with NaN and the infinities replaced), log2/log10 of x*x + 0.5 and log1p
    of x*x (their positive domains).

    Extrema and the nan_to_num of non-finite values read values bitwise equal to torch's (a tie,
    or a sign at zero, of a rounded value could differ). atan2's second operand is y*y + 0.5 or,
    for an exact first operand only, its negative (the branch cut at +-pi sits on a's sign)."""
    draw = self.draw
    form = draw(st.sampled_from(["extremum", "log", "atan2", "lerp", "nan_to_num", "extremum", "log"]))
    if form == "extremum":
        x = self.pick(lambda v: v.exact and math.isfinite(v.bound))
        if x is None:
            return False
        y = self.pick(lambda v: v.exact and math.isfinite(v.bound) and _broadcast(v.shape, x.shape) is not None)
        if y is None or draw(st.integers(0, 3)) == 0:
            y = self.new_input(x.shape)
        # one or two in a row (x.maximum(low).minimum(high): a clamp between tensors)
        for op in draw(st.lists(st.sampled_from(["maximum", "minimum", "fmax", "fmin"]), min_size=1, max_size=2,
                                unique=True)):
            expr = f"{x.name}.{op}({y.name})" if draw(st.booleans()) else f"F.{op}({x.name}, {y.name})"
            if x.shape != y.shape:
                self.exact_grads = False
            x = self.emit(expr, _broadcast(x.shape, y.shape), max(x.bound, y.bound), (x, y), "math_ops", exact=True,
                          torch_expr=expr.replace("F.", "torch."))
            y = self.pick_or_new(x.shape, lambda v: v.exact and math.isfinite(v.bound))
        return True
    if form == "atan2":
        x = self.pick(lambda v: math.isfinite(v.bound))
        y = self.pick(lambda v: v.bound ** 2 + 0.5 <= LIMIT and _broadcast(v.shape, x.shape) is not None) \
            if x is not None else None
        if y is None:
            return False
        sign = "-" if x.exact and draw(st.booleans()) else ""
        expr = f"F.atan2({x.name}, {sign}({y.name} * {y.name} + 0.5))" if draw(st.booleans()) else \
            f"{x.name}.atan2({sign}({y.name} * {y.name} + 0.5))"
        self.emit(expr, _broadcast(x.shape, y.shape), math.pi, (x, y), "math_ops", exact=False,
                  torch_expr=expr.replace("F.", "torch."))
        return True
    if form == "lerp":
        x = self.pick(lambda v: math.isfinite(v.bound))
        if x is None:
            return False
        y = self.pick(lambda v: math.isfinite(v.bound) and _broadcast(v.shape, x.shape) is not None)
        if y is None or draw(st.booleans()):
            y = self.new_input(x.shape)
        shape = _broadcast(x.shape, y.shape)
        operands = (x, y)
        if draw(st.booleans()):
            weight = draw(st.sampled_from([0.25, 0.5, 0.75, -0.5, 1.5, 0.0, 1.0]))
            weight_text, weight_bound = repr(weight), abs(weight)
        else:
            w = self.pick(lambda v: v.bound <= 2.0 and _broadcast(v.shape, shape) is not None)
            if w is None:
                return False
            operands, shape = (x, y, w), _broadcast(shape, w.shape)
            weight_text, weight_bound = w.name, w.bound
        bound = x.bound + weight_bound * (x.bound + y.bound) + max(x.bound, y.bound)
        if bound > LIMIT:
            return False
        expr = f"{x.name}.lerp({y.name}, {weight_text})" if draw(st.booleans()) else \
            f"F.lerp({x.name}, {y.name}, {weight_text})"
        self.emit(expr, shape, bound, operands, "math_ops", exact=False, torch_expr=expr.replace("F.", "torch."))
        return True
    if form == "nan_to_num":
        return _nan_to_num(self)
    x = self.pick(lambda v: v.bound ** 2 + 1 <= LIMIT)
    if x is None:
        return False
    for op in draw(st.lists(st.sampled_from(["log2", "log10", "log1p"]), min_size=1, max_size=3, unique=True)):
        operand = f"({x.name} * {x.name})" if op == "log1p" else f"({x.name} * {x.name} + 0.5)"
        expr = f"{operand}.{op}()" if draw(st.booleans()) else f"F.{op}({operand})"
        x = self.emit(expr, x.shape, math.log(x.bound ** 2 + 1) + 1, (x,), "math_ops", exact=False,
                      torch_expr=expr.replace("F.", "torch."))
    return True


def _nan_to_num(self: Builder) -> bool:
    """x.nan_to_num(nan, posinf, neginf) of a finite value (the identity; its gradient is g), or of a
    value with NaN and infinities: x.log() (NaN below 0, -inf at 0), 1.0 / x (+-inf at +-0) or a
    poisoned value (x * inf, x * nan). A default replacement (the float32 extremes) makes a value
    that is only returned (poisoned); a non-finite operand is detached most of the time (its
    gradient is NaN, in torch as in bendc)."""
    draw = self.draw
    source = draw(st.sampled_from(["finite", "log", "reciprocal", "poisoned"]))
    if source == "finite":
        x = self.pick(lambda v: math.isfinite(v.bound))
        if x is None:
            return False
        operand, operands, finite_bound, exact = x.name, (x,), x.bound, x.exact
    elif source == "poisoned":
        poisoned = [v for v in self.values if v.poison and math.isinf(v.bound)]
        if not poisoned:
            return False
        x = draw(st.sampled_from(poisoned))
        operand, operands, finite_bound, exact = x.name, (x,), 0.0, x.exact
    else:
        x = self.pick(lambda v: v.exact and math.isfinite(v.bound))
        if x is None:
            return False
        detached = f"{x.name}.detach()" if draw(st.integers(0, 3)) else x.name
        if source == "log":
            operand, finite_bound = f"{detached}.log()", 104.0  # |log x| of any finite float32 x (a subnormal)
        else:
            operand, finite_bound = f"(1.0 / {detached})", 1e38  # 1 / a tiny x: only returned
        # a detached operand has no leaf in its autograd graph: a loss of it alone requires no grad
        # (fuzz seed 20261207 drew nan_to_num(x.detach().log()).sum().backward(), which torch rejects)
        operands, exact = ((x,) if detached == x.name else ()), source == "reciprocal"
    nan = draw(st.sampled_from([0.0, 1.5, -2.0]))
    posinf = draw(st.sampled_from([None, 10.0]))
    neginf = draw(st.sampled_from([None, -10.0]))
    arguments = [f"nan={nan!r}"] if draw(st.booleans()) or source == "finite" else [repr(nan)]
    if posinf is not None:
        arguments.append(f"posinf={posinf!r}")
    if neginf is not None:
        arguments.append(f"neginf={neginf!r}")
    bound = max(finite_bound, abs(nan), _FLOAT32_MAX if posinf is None or neginf is None else 10.0)
    if source == "finite":
        bound = x.bound
    expr = f"{operand}.nan_to_num({', '.join(arguments)})" if draw(st.booleans()) else \
        f"F.nan_to_num({operand}, {', '.join(arguments)})"
    self.emit(expr, x.shape, bound, operands, "math_ops", exact=exact, poison=bound > LIMIT,
              torch_expr=expr.replace("F.", "torch."))
    return True


def _optimizers_family(self: Builder) -> bool:
    """bendc.optim.adagrad (lr_decay from a traced 0-d step: the adagrad_lr op), rmsprop (momentum,
    centered) and adadelta on one parameter, a traced or a number lr, against TorchOptim's
    out-of-place torch.optim formulas."""
    draw = self.draw
    operands = self.adam_operands()
    if operands is None:
        return False
    p, g, first, second = operands
    which = draw(st.sampled_from(["adagrad", "adagrad", "rmsprop", "adadelta", "clip_grad_norm"]))
    if which == "clip_grad_norm":
        return _clip_grad_norm(self, g, first)
    lr = self.new_input((), "hyper", False, high=0).name if draw(st.booleans()) else \
        repr(draw(st.sampled_from([0.1, 0.01])))
    step = self.new_input((), "step", False).name if draw(st.booleans()) else str(draw(st.integers(0, 3)))
    square = f"{second.name} * {second.name}"
    state_deps = g.deps | second.deps  # what the new sum / square_avg depends on
    uses_first = which == "adadelta"
    if which == "adagrad":
        state = f"{{'step': {step}, 'sum': ({square},)}}"
        weight_decay = draw(st.sampled_from([0.0, 0.01]))
        options = f", lr_decay={draw(st.sampled_from([0.0, 0.1, 0.001]))!r}, weight_decay={weight_decay!r}"
        if weight_decay:
            state_deps = state_deps | p.deps
    elif which == "rmsprop":
        momentum = draw(st.sampled_from([0.0, 0.9]))
        centered = draw(st.booleans())
        parts = [f"'step': {step}", f"'square_avg': ({square},)"]
        if momentum:
            parts.append(f"'momentum_buffer': ({first.name},)")
        if centered:  # square_avg - grad_avg ** 2 stays >= 0.01: |grad_avg| < 0.1, square_avg >= 0.02
            parts.append(f"'grad_avg': ({first.name} * 0.1 / ({first.name}.abs() + 1.0),)")
            parts[1] = f"'square_avg': ({square} + 0.02,)"
        state = "{" + ", ".join(parts) + "}"
        options = f", momentum={momentum!r}, centered={centered}"
        uses_first = bool(momentum) or centered
    else:
        state = f"{{'step': {step}, 'square_avg': ({square},), 'acc_delta': ({first.name} * {first.name},)}}"
        options = f", rho={draw(st.sampled_from([0.9, 0.5]))!r}"
    names = [self.fresh(), self.fresh()]
    self.lines.append((f"({names[0]},), {names[1]} = bendc.optim.{which}(({p.name},), ({g.name},), {state}, "
                       f"lr={lr}{options})",) * 2)
    deps = p.deps | state_deps | (first.deps if uses_first else frozenset())
    key = {"adagrad": "sum", "rmsprop": "square_avg", "adadelta": "square_avg"}[which]
    state_value = self.fresh()
    self.lines.append((f"({state_value},) = {names[1]}['{key}']",) * 2)
    # adagrad's and rmsprop's steps are lr * g / sqrt(sum): as large as lr / eps where sum ~ 0
    self.values += [Value(names[0], p.shape, LIMIT, deps, False),
                    Value(state_value, p.shape, second.bound ** 2 + g.bound ** 2 + 1.0, state_deps, False)]
    self.families.add("optimizers")
    self.exact_grads = False
    return True


def _clip_grad_norm(self: Builder, g: Value, other: Value) -> bool:
    """bendc.optim.clip_grad_norm of one or two gradients (a number or a traced max_norm; norm_type 2,
    1, 3 or inf), against torch.nn.utils.clip_grad_norm_'s arithmetic (TorchOptim.clip_grad_norm)."""
    draw = self.draw
    grads = [g, other] if other is not g and draw(st.booleans()) else [g]
    max_norm = self.new_input((), "hyper", False, high=0).name if draw(st.booleans()) else \
        repr(draw(st.sampled_from([0.5, 100.0])))  # 100: usually no clipping (the coefficient clamps at 1)
    norm_type = draw(st.sampled_from(["2.0", "1.0", "3.0", "math.inf"]))
    clipped = [self.fresh() for _ in grads]
    total = self.fresh()
    arguments = f"({', '.join(v.name for v in grads)},), {max_norm}" + ("" if norm_type == "2.0" else f", {norm_type}")
    self.lines.append((f"({', '.join(clipped)},), {total} = bendc.optim.clip_grad_norm({arguments})",) * 2)
    deps = frozenset().union(*[v.deps for v in grads])
    self.values += [Value(name, v.shape, v.bound, deps, False) for name, v in zip(clipped, grads)]
    self.values.append(Value(total, (), sum(v.bound * max(1, _numel(v.shape)) for v in grads), deps, False))
    self.families.add("optimizers")
    self.exact_grads = False
    return True


def _composites_family(self: Builder) -> bool:
    """issue 22's composites of existing ops (bendc/tensor_math.py): x.roll / torch.roll, x.repeat_interleave,
    x.any / x.all as float masks, x.sum / x.mean with dtype=torch.float32, torch.einsum of x and a
    second operand over random letters (shared ones summed or kept, an output in any order), vector
    norms (torch.linalg.vector_norm, x.norm, torch.norm) and movedim / swapaxes / mT."""
    draw = self.draw
    x = self.pick(lambda v: len(v.shape) > 0 and math.isfinite(v.bound))
    if x is None:
        return False
    rank = len(x.shape)
    form = draw(st.sampled_from(["roll", "repeat_interleave", "any", "sum_dtype", "einsum", "einsum", "norm", "move"]))
    if form == "move":  # layouts of public code: movedim, swapaxes, mT
        if rank < 2:
            return False
        a, b = draw(st.lists(st.integers(-rank, rank - 1), min_size=2, max_size=2, unique_by=lambda d: d % rank))
        order = list(range(rank))
        style = draw(st.sampled_from(["movedim", "swapaxes", "mT"]))
        if style == "movedim":
            order.remove(a % rank)
            order.insert(b % rank, a % rank)
            expr = f"{x.name}.movedim({a}, {b})" if draw(st.booleans()) else f"torch.movedim({x.name}, {a}, {b})"
        else:
            a, b = (a, b) if style == "swapaxes" else (-2, -1)
            order[a], order[b] = order[b], order[a]
            expr = f"{x.name}.swapaxes({a}, {b})" if style == "swapaxes" else f"{x.name}.mT"
        self.emit(expr, tuple(x.shape[d] for d in order), x.bound, (x,), "composites", exact=True)
        return True
    if form == "norm":  # vector norms: 0 gradients where a norm is 0 (torch's)
        dim, axes = self._reduction_dims(rank)
        keepdim = draw(st.booleans())
        out = ([1 if a in axes else d for a, d in enumerate(x.shape)] if keepdim
               else [d for a, d in enumerate(x.shape) if a not in axes])
        order = draw(st.sampled_from(["2", "1", "math.inf", "3", "-math.inf"]))
        spelled = "None" if dim is None else repr(dim)
        spellings = [f"torch.linalg.vector_norm({x.name}, {order}, {spelled}, {keepdim})",
                     f"{x.name}.norm({order}, {spelled}, {keepdim})"]
        if not isinstance(dim, (tuple, list)) or len(dim) <= 2:  # torch's default p="fro": at most 2 dims
            spellings.append(f"torch.norm({x.name}, dim={spelled}, keepdim={keepdim})")
        expr = draw(st.sampled_from(spellings))
        self.emit(expr, out, x.bound * max(1, _numel(x.shape)), (x,), "composites", exact=False)
        return True
    if form == "roll":
        dims = draw(st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank, unique_by=lambda d: d % rank))
        shifts = [draw(st.integers(-5, 5)) for _ in dims]
        if len(dims) == 1 and draw(st.booleans()):
            expr = f"{x.name}.roll({shifts[0]}, {dims[0]})"
        elif draw(st.integers(0, 3)) == 0:
            expr = f"{x.name}.roll({shifts[0]})"
        else:
            expr = f"torch.roll({x.name}, {tuple(shifts)!r}, {tuple(dims)!r})"
        self.emit(expr, x.shape, x.bound, (x,), "composites", exact=True, grad_exact=False)
        return True
    if form == "repeat_interleave":
        repeats = draw(st.integers(1, 3))
        if draw(st.booleans()):
            dim = draw(st.integers(-rank, rank - 1))
            shape = list(x.shape)
            shape[dim] *= repeats
            expr = f"{x.name}.repeat_interleave({repeats}, dim={dim})"
        else:
            shape, expr = [_numel(x.shape) * repeats], f"torch.repeat_interleave({x.name}, {repeats})"
        self.emit(expr, tuple(shape), x.bound, (x,), "composites", exact=True, grad_exact=False)
        return True
    if form in ("any", "sum_dtype"):
        dim, axes = self._reduction_dims(rank)
        keepdim = draw(st.booleans())
        out = ([1 if a in axes else d for a, d in enumerate(x.shape)] if keepdim
               else [d for a, d in enumerate(x.shape) if a not in axes])
        spelled = f"{tuple(range(rank))!r}, " if dim is None else f"{dim!r}, "  # torch: keepdim needs a dim
        if form == "any":
            operand = f"{x.name}.relu()" if draw(st.booleans()) else x.name  # zeros, so that all() varies
            mask = f"{operand}.{draw(st.sampled_from(['any', 'all']))}({spelled}keepdim={keepdim})"
            self.emit(f"{mask}.float()", out, 1.0, (), "composites", torch_expr=f"{mask}.to({x.name}.dtype)")
            return True
        op = draw(st.sampled_from(["sum", "mean"]))
        bound = x.bound * (_numel([x.shape[a] for a in axes]) if op == "sum" else 1)
        if bound > LIMIT:
            return False
        # torch's float64 run keeps its dtype (float32 there would meet float64 operands later)
        call = f"{x.name}.{op}({spelled}keepdim={keepdim}, dtype={{}})"
        self.emit(call.format("torch.float32"), out, bound, (x,), "composites", exact=False,
                  torch_expr=call.format(f"{x.name}.dtype"))
        return True
    letters = "abcd"[:rank]
    size = dict(zip(letters, x.shape))
    shared = [c for c in letters if draw(st.booleans())]
    own = "efg"[:draw(st.integers(0, min(3, MAX_RANK - len(shared))))]
    for c in own:
        size[c] = draw(st.integers(1, 3))
    term = list(shared + list(own))
    term = [term[k] for k in draw(st.permutations(range(len(term))))] if term else []
    y = self.pick_or_new(tuple(size[c] for c in term))
    every = list(letters) + list(own)
    output = [c for c in every if draw(st.booleans())]
    output = [output[k] for k in draw(st.permutations(range(len(output))))] if output else []
    summed = [c for c in every if c not in output]
    bound = x.bound * y.bound * _numel([size[c] for c in summed])
    if bound > LIMIT or not math.isfinite(y.bound):
        return False
    equation = f"{letters},{''.join(term)}->{''.join(output)}"
    self.emit(f"F.einsum({equation!r}, {x.name}, {y.name})", tuple(size[c] for c in output), bound, (x, y),
              "composites", exact=False, torch_expr=f"torch.einsum({equation!r}, {x.name}, {y.name})")
    return True


for _name in ("pad", "interpolate", "conv_transpose1d", "conv_transpose2d", "batch_norm"):
    setattr(TorchF, _name, staticmethod(getattr(TF, _name)))


def _resample_family(self: Builder) -> bool:
    """issue 22's part B (bendc/resample.py, bendc/tensor_ops.py pad): F.pad reflect / replicate / circular,
    F.interpolate nearest (size= or scale_factor=, exact), bilinear and bicubic (align_corners both ways),
    trilinear (over x.unsqueeze(2), summed back) and area,
    F.conv_transpose2d / 1d (stride, padding, output_padding, dilation, groups, bias) and training-mode
    F.batch_norm (training on batch statistics, training updating running statistics, evaluation)."""
    draw = self.draw
    form = draw(st.sampled_from(["pad", "nearest", "bilinear", "conv_transpose", "batch_norm", "bicubic", "trilinear",
                                 "area"]))
    rank = 4 if form in ("bilinear", "bicubic", "trilinear") else draw(st.sampled_from((4, 3)))
    x = _image_operand(self, rank, lambda v: math.isfinite(v.bound))
    spatial = x.shape[2:]
    if form == "pad":
        mode = draw(st.sampled_from(["reflect", "replicate", "circular"]))
        limit = {"reflect": lambda n: n - 1, "replicate": lambda n: 3, "circular": lambda n: n}[mode]
        amounts = tuple(draw(st.integers(0, min(2, limit(n)))) for n in reversed(spatial) for _ in range(2))
        shape = x.shape[:2] + tuple(n + amounts[2 * (len(spatial) - 1 - a)] + amounts[2 * (len(spatial) - 1 - a) + 1]
                                    for a, n in enumerate(spatial))
        self.emit(f"F.pad({x.name}, {amounts!r}, mode={mode!r})", shape, x.bound, (x,), "resample", exact=True,
                  grad_exact=False)
        return True
    if form == "trilinear":  # over x.unsqueeze(2), 5-D, summed back to 4-D (values stay within MAX_RANK)
        depth = draw(st.integers(1, 3))
        sizes = (depth,) + tuple(draw(st.integers(1, 2 * n + 1)) for n in spatial)
        corners = draw(st.booleans())
        self.emit(f"F.interpolate({x.name}.unsqueeze(2), size={sizes!r}, mode='trilinear', align_corners={corners})"
                  ".sum(2)", x.shape[:2] + sizes[1:], x.bound * depth, (x,), "resample", exact=False)
        return True
    if form == "area":  # adaptive average pooling to the size drawn
        sizes = tuple(draw(st.integers(1, n)) for n in spatial)
        self.emit(f"F.interpolate({x.name}, size={sizes!r}, mode='area')", x.shape[:2] + sizes, x.bound, (x,),
                  "resample", exact=False)
        return True
    if form in ("nearest", "bilinear", "bicubic"):
        if draw(st.booleans()):
            sizes = tuple(draw(st.integers(1, 2 * n + 1)) for n in spatial)
            how = f"size={sizes!r}"
        else:
            scale = draw(st.sampled_from([0.5, 1.5, 2.0, 1.7, 3.0]))
            sizes = tuple(math.floor(n * scale) for n in spatial)
            if min(sizes) < 1:
                return False
            how = f"scale_factor={scale!r}"
        if form == "nearest":
            self.emit(f"F.interpolate({x.name}, {how})", x.shape[:2] + sizes, x.bound, (x,), "resample", exact=True,
                      grad_exact=False)
        else:  # bicubic overshoots: its weights' absolute values add to at most 1.5625 per dim
            corners = draw(st.booleans())
            bound = x.bound * (1.5625 ** 2 if form == "bicubic" else 1.0)
            self.emit(f"F.interpolate({x.name}, {how}, mode={form!r}, align_corners={corners})",
                      x.shape[:2] + sizes, bound, (x,), "resample", exact=False)
        return True
    channels = x.shape[1]
    if form == "batch_norm":
        return _batch_norm_form(self, x)
    groups = draw(st.sampled_from([g for g in range(1, channels + 1) if channels % g == 0]))
    out_channels = groups * draw(st.integers(1, 2))
    kernel = tuple(draw(st.integers(1, 3)) for _ in spatial)
    stride, dilation, padding = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(0, 1))
    output_padding = draw(st.integers(0, max(stride, dilation) - 1))
    if output_padding > padding + stride - 1:
        return False
    out = tuple((n - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1 for n, k in zip(spatial, kernel))
    if min(out) < 1:
        return False
    w = self.pick_or_new((channels, out_channels // groups) + kernel)
    b = self.pick_or_new((out_channels,)) if draw(st.booleans()) else None
    bound = x.bound * w.bound * channels / groups * math.prod(kernel) + (b.bound if b else 0.0)
    if bound > LIMIT:
        return False
    fn = "conv_transpose2d" if rank == 4 else "conv_transpose1d"
    self.emit(f"F.{fn}({x.name}, {w.name}, {b.name if b else None}, stride={stride}, padding={padding}, "
              f"output_padding={output_padding}, groups={groups}, dilation={dilation})",
              (x.shape[0], out_channels) + out, bound, tuple(o for o in (x, w, b) if o), "resample")
    return True


def _batch_norm_form(self: Builder, x: Value) -> bool:
    """F.batch_norm in one of three modes: training on batch statistics alone; training with running
    statistics, which torch updates in place (the traced tensors name the updated values afterwards),
    returned by the program; evaluation by running statistics (variance kept >= 0.5). The running
    statistics are fresh tensors made from constant inputs (``x * 1.0``, ``x * x + 0.5``), so that no
    other value of the program is a view torch's in-place update would change. eps 0.1 in training
    keeps a near-constant channel's gradient well conditioned."""
    draw = self.draw
    channels, count = x.shape[1], x.shape[0] * math.prod(x.shape[2:])
    mode = draw(st.sampled_from(["batch", "running", "eval"]))
    if mode != "eval" and count < 2:
        return False
    w = self.pick_or_new((channels,)) if draw(st.booleans()) else None
    b = self.pick_or_new((channels,)) if draw(st.booleans()) else None
    stats = "None, None"
    if mode != "batch":
        mean_input, var_input = (self.new_input((channels,), leaf=False) for _ in range(2))
        mean = self.emit(f"{mean_input.name} * 1.0", (channels,), mean_input.bound, (mean_input,), "resample",
                         exact=True)
        var = self.emit(f"{var_input.name} * {var_input.name} + 0.5", (channels,), var_input.bound ** 2 + 0.5,
                        (var_input,), "resample", exact=True)
        stats = f"{mean.name}, {var.name}"
    momentum = draw(st.sampled_from([0.1, 0.5, 1.0]))
    eps = draw(st.sampled_from([1e-5, 0.1])) if mode == "eval" else 0.1
    scale = (w.bound if w else 1.0)
    if mode == "eval":
        bound = (x.bound + mean.bound) / math.sqrt(0.5) * scale + (b.bound if b else 0.0)
    else:
        bound = math.sqrt(count) * scale + (b.bound if b else 0.0)
    affine = f"{w.name if w else None}, {b.name if b else None}"
    expr = (f"F.batch_norm({x.name}, {stats}, {affine}, {mode != 'eval'}, {momentum}, {eps})" if draw(st.booleans())
            else f"torch.batch_norm({x.name}, {affine}, {stats}, {mode != 'eval'}, {momentum}, {eps}, False)")  # aten's order
    self.emit(expr, x.shape, bound, tuple(o for o in (x, w, b) if o), "resample", exact=False)
    if mode == "running":  # the updated statistics: momentum-weighted means of old and batch values
        mean.bound = max(mean.bound, x.bound)
        var.bound = max(var.bound, x.bound ** 2 * count / (count - 1))
        mean.exact = var.exact = False
        self.required += [mean, var]
    return True


Builder.resample = _resample_family
Builder.math_ops = _math_ops_family
Builder.composites = _composites_family


def _sort_scatter_family(self: Builder) -> bool:
    """issue 22's products, flips, sorts and scatters (bendc/sort_scatter.py) and float // and %:
    x.cumprod / x.prod on small values, x.flip, the values of a stable x.sort / torch.sort, x.topk and
    x.argsort of a fresh input (no ties: torch's topk order among ties is its own; argsort's indices
    enter as float weights), x.scatter / scatter_add / scatter_reduce with a constant index (every
    reduce, include_self both ways), and x % c, torch.remainder, (x // c).detach() of a fresh input
    (a computed x may sit at a jump of // in torch's float64 run)."""
    draw = self.draw
    form = draw(st.sampled_from(["cumprod", "prod", "flip", "sort", "topk", "scatter", "scatter", "modulo"]))
    if form in ("topk", "modulo"):
        shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
        x = self.new_input(shape)
    else:
        x = self.pick(lambda v: len(v.shape) > 0 and math.isfinite(v.bound))
    if x is None:
        return False
    rank = len(x.shape)
    dim = draw(st.integers(-rank, rank - 1))
    size = x.shape[dim]
    if form in ("cumprod", "prod"):
        if size * math.log(max(x.bound, 1.0)) > math.log(LIMIT):  # bound ** size past LIMIT (or a float)
            return False
        bound = max(x.bound, 1.0) ** size
        if form == "cumprod":
            self.emit(f"{x.name}.cumprod({dim})", x.shape, bound, (x,), "sort_scatter", exact=False)
            return True
        keepdim = draw(st.booleans())
        out = [1 if a == dim % rank else d for a, d in enumerate(x.shape)] if keepdim else \
            [d for a, d in enumerate(x.shape) if a != dim % rank]
        self.emit(f"torch.prod({x.name}, {dim}, keepdim={keepdim})", out, bound, (x,), "sort_scatter", exact=False)
        return True
    if form == "flip":
        dims = draw(st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank, unique_by=lambda d: d % rank))
        expr = f"{x.name}.flip({tuple(dims)!r})" if draw(st.booleans()) else f"torch.flip({x.name}, {dims!r})"
        self.emit(expr, x.shape, x.bound, (x,), "sort_scatter", exact=True)
        return True
    if form == "sort" and draw(st.integers(0, 2)) == 0:  # an integer sort (ties everywhere), torch's stable order
        descending = draw(st.booleans())
        if draw(st.booleans()):
            # torch's spelling casts to x's dtype: .float() in torch's float64 run would hand float32
            # to the next op (F.linear then refuses a float64 weight)
            values = f"{x.name}.long().sort(dim={dim}, descending={descending}, stable=True).values"
            self.emit(f"{values}.float()", x.shape, x.bound, (), "sort_scatter", exact=True,
                      torch_expr=f"{values}.to({x.name}.dtype)")
        else:
            order = f"torch.argsort({x.name}.long(), dim={dim}, descending={descending}, stable=True)"
            self.emit(f"{x.name} * {order}.float()", x.shape, x.bound * size, (x,), "sort_scatter", exact=False,
                      torch_expr=f"{x.name} * {order}.to({x.name}.dtype)")
        return True
    if form == "sort":
        descending = draw(st.booleans())
        expr = (f"{x.name}.sort(dim={dim}, descending={descending}, stable=True).values" if draw(st.booleans())
                else f"torch.sort({x.name}, dim={dim}, descending={descending}, stable=True)[0]")
        self.emit(expr, x.shape, x.bound, (x,), "sort_scatter", exact=False)
        return True
    if form == "topk":
        k = draw(st.integers(1, size))
        out = list(x.shape)
        out[dim] = k
        largest = draw(st.booleans())
        self.emit(f"{x.name}.topk({k}, dim={dim}, largest={largest}).values", out, x.bound, (x,), "sort_scatter",
                  exact=True)
        order = f"{x.name}.argsort(dim={dim}, descending={largest}, stable=True)"
        self.emit(f"{x.name} * {order}.float()", x.shape, x.bound * size, (x,), "sort_scatter", exact=False,
                  torch_expr=f"{x.name} * {order}.to({x.name}.dtype)")
        return True
    if form == "modulo" and draw(st.integers(0, 3)) == 0:  # quotients past 2**24 (torch's float32 steps), scaled back
        c = draw(st.sampled_from([3e-08, -7e-09]))
        self.emit(f"({x.name} // {c!r} * {c!r}).detach()", x.shape, x.bound + 1.0, (), "sort_scatter", exact=True)
        return True
    if form == "modulo":
        c = draw(st.sampled_from([0.75, -1.5, 2.0]))
        expr = draw(st.sampled_from([f"{x.name} % {c!r}", f"torch.remainder({x.name}, {c!r})",
                                     f"({x.name} // {c!r}).detach()"]))
        self.emit(expr, x.shape, x.bound / abs(c) + 1.0 if "//" in expr else abs(c), (x,) if "//" not in expr
                  else (), "sort_scatter", exact=False)
        return True
    # scatter: self is x, the index a constant of the shape of src (at most x's shape outside dim)
    src = self.pick(lambda v: len(v.shape) == rank and math.isfinite(v.bound)
                    and all(n <= m for a, (n, m) in enumerate(zip(v.shape, x.shape)) if a != dim % rank))
    if src is None or _numel(src.shape) > 4096:  # the index is drawn value by value: keep it small
        return False
    index = np.asarray(draw(st.lists(st.integers(0, size - 1), min_size=_numel(src.shape),
                                     max_size=_numel(src.shape)))).reshape(src.shape).tolist()
    reduce = draw(st.sampled_from(["assign", "value", "add", "sum", "prod", "mean", "amax", "amin"]))
    include_self = draw(st.booleans())
    spelled = f"torch.tensor({index!r})"
    repeats = src.shape[dim] + 1
    if reduce == "assign":  # repeated indices: torch leaves the winner open, so one src per target here
        if src.shape[dim] > size:
            return False
        line = np.asarray(draw(st.permutations(range(size))))[:src.shape[dim]]
        shape = [1] * rank
        shape[dim] = src.shape[dim]
        index = np.broadcast_to(line.reshape(shape), src.shape).tolist()
        expr, bound = f"{x.name}.scatter({dim}, torch.tensor({index!r}), {src.name})", max(x.bound, src.bound)
    elif reduce == "value":
        expr, bound = f"torch.scatter({x.name}, {dim}, {spelled}, 2.5)", max(x.bound, 2.5)
        src = None
    elif reduce == "add":
        expr, bound = f"{x.name}.scatter_add({dim}, {spelled}, {src.name})", x.bound + src.bound * repeats
    else:
        if reduce == "prod":
            bound = max(x.bound, src.bound, 1.0) ** repeats
        elif reduce == "sum":
            bound = x.bound + src.bound * repeats
        else:
            bound = max(x.bound, src.bound)
        expr = f"{x.name}.scatter_reduce({dim}, {spelled}, {src.name}, {reduce!r}, include_self={include_self})"
    if bound > LIMIT:
        return False
    self.emit(expr, x.shape, bound, (x,) if src is None else (x, src), "sort_scatter", exact=False)
    return True


Builder.sort_scatter = _sort_scatter_family
Builder.optimizers = _optimizers_family


@st.composite
def programs(draw, families=WEIGHTED_FAMILIES, large_shapes: bool = True) -> Program:
    b = Builder(draw)
    for _ in range(draw(st.integers(1, 3))):
        large = large_shapes and draw(st.integers(0, 29)) == 0
        b.new_input(draw(st.sampled_from(LARGE_SHAPES if large else BASE_SHAPES)))
    length = draw(st.sampled_from((0,) + tuple(range(1, 11)) * 2))  # 0 (no ops) 1 in 21
    for _ in range(length):
        for _attempt in range(6):
            family = draw(st.sampled_from(families))
            if getattr(b, family)():
                break
    if b.backwards == 0 and draw(st.integers(0, 3)) > 0:
        b.backward()
    # returns: some values (inputs, poisoned ones and losses included), then some leaves' .grad
    values = [v for v in b.values]
    chosen = draw(st.lists(st.sampled_from(values), min_size=0, max_size=3, unique_by=lambda v: v.name))
    if b.roots and draw(st.booleans()) and b.roots[-1] not in chosen:  # the loss, beside the grads
        chosen.append(b.roots[-1])
    chosen += [v for v in b.required if v not in chosen]
    if not chosen:
        chosen = [values[-1]]
    if draw(st.integers(0, 7)) == 0:  # one value returned twice
        chosen.append(chosen[0])
    outputs = [Output(v.name, v.name, v.exact, "loss" if v.name.startswith("loss") else f"value {v.name}")
               for v in chosen]
    if draw(st.booleans()) and draw(st.booleans()):  # a leaf the program never uses
        b.new_input(draw(st.sampled_from(BASE_SHAPES)), leaf=True)
    for leaf in b.grad_set:
        if draw(st.integers(0, 3)) > 0:
            outputs.append(Output(f"{leaf}.grad", f"_grad({leaf})", b.exact_grads, f"grad of {leaf}"))
    bare = len(outputs) == 1 and draw(st.booleans())
    passes = draw(st.sampled_from(PIPELINES))
    return Program(tuple(b.inputs), tuple(b.lines), tuple(outputs), bare, frozenset(b.families), passes)


def explicit_program(inputs, lines, outputs, bare_return=False) -> Program:
    """A hand-written program: inputs as (name, shape, leaf), lines and returned expressions in bendc's
    spelling (the torch spelling is derived: retain_graph on backward, _grad for .grad)."""
    import re

    def torch_text(text: str) -> str:
        text = text.replace(".backward()", ".backward(retain_graph=True)")
        return re.sub(r"(\w+)\.grad\b", r"_grad(\1)", text)

    items = tuple(Input(name, tuple(shape), "f32", leaf, 7 + position)
                  for position, (name, shape, leaf) in enumerate(inputs))
    outs = tuple(Output(text, torch_text(text), False, text) for text in outputs)
    return Program(items, tuple((line, torch_text(line)) for line in lines), outs, bare_return, frozenset())
