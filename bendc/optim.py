"""Functional optimizers over pytrees, with torch.optim's update rules and defaults.

```python
@bendc.jit(leaves=("params",), dynamic=("lr",))
def train_step(params, opt_state, batch, lr):
    loss = model(params, batch)
    loss.backward()
    grads = bendc.tree.map(lambda p: p.grad, params)
    params, opt_state = bendc.optim.adamw(params, grads, opt_state, lr)
    return loss, params, opt_state

opt_state = bendc.optim.init_adam(params)      # numpy, outside the trace
```

Each function takes the parameters, their gradients (same structure; a ``None``
gradient leaves its parameter and state as they are, as torch skips a
parameter whose ``.grad`` is None) and the state, and returns
``(new_params, new_state)``. ``lr`` (and Adam's ``betas``) may be Python
numbers (static: part of the signature) or traced 0-d values (a 0-d array
parameter, or a Python float named in ``jit(dynamic=...)``), so a learning
rate schedule never recompiles. With Python numbers the arithmetic is
torch's to the rounding: bias corrections and step sizes in float64, rounded
once (``F.adam_step``). With traced values they are the same expressions with
the traced float32 value (lr / (1 - beta1**step) is still computed in float64
from it).

The state's ``step`` is a float32 0-d array, as torch keeps it.

Under ``jit(..., data_parallel="sharded")`` (ZeRO-1, bendc/distributed.py) each update runs on
this rank's padded shard of the parameter (``bendc.distributed.shard_of``) with the
``reduce_scatter`` of its gradient, and ``all_gather`` makes the new parameter whole: the state
arrays are this rank's shards (``init_*(params, sharded=True)``: 1-d, ceil(numel / N) elements
each), and the state the step returns is too.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from bendc import tree
from bendc.errors import UnsupportedError, user_location
from bendc.trace import Tensor, active_tracer


# ------------------------------------------------------------------ state (numpy, outside a trace)
def _zeros_like(param: Any, sharded: bool = False, fill: float = 0.0) -> np.ndarray:
    """``fill`` (zeros) of the parameter's shape, or (``sharded``) of this rank's padded shard of it."""
    if not sharded:
        return np.full(np.shape(param), fill, np.float32)
    from runtime.collective import shard_size, world

    return np.full((shard_size(int(np.prod(np.shape(param), dtype=np.int64)), world().size),), fill, np.float32)


def _zeros_tree(params: Any, sharded: bool = False, fill: float = 0.0) -> Any:
    """Zeros (or ``fill``) like each array of ``params`` (or its shard); one array object under two
    paths (tied weights) gets one array, so that the state keeps the aliasing the step returns."""
    leaves, treedef = tree.flatten(params)
    made: dict[int, np.ndarray] = {}
    zeros = []
    for leaf in leaves:
        if id(leaf) not in made:
            made[id(leaf)] = _zeros_like(leaf, sharded, fill)
        zeros.append(made[id(leaf)])
    return tree.unflatten(treedef, zeros)


def init_sgd(params: Any, momentum: float = 0.0, sharded: bool = False) -> dict:
    """SGD's state: ``{}`` without momentum, else ``{"step": 0, "momentum_buffer": zeros}``
    (a zero buffer and the step count reproduce torch's first step, buf = grad). ``sharded``:
    this rank's shards (``data_parallel="sharded"``; call after ``bendc.distributed.init``)."""
    if momentum == 0.0:
        return {}
    return {"step": np.zeros((), np.float32), "momentum_buffer": _zeros_tree(params, sharded)}


def init_adam(params: Any, sharded: bool = False) -> dict:
    """Adam's and AdamW's state: ``{"step": 0, "exp_avg": zeros, "exp_avg_sq": zeros}``;
    ``sharded``: this rank's shards (``data_parallel="sharded"``)."""
    return {"step": np.zeros((), np.float32), "exp_avg": _zeros_tree(params, sharded),
            "exp_avg_sq": _zeros_tree(params, sharded)}


def init_rmsprop(params: Any, momentum: float = 0.0, centered: bool = False, sharded: bool = False) -> dict:
    """RMSprop's state: ``{"step": 0, "square_avg": zeros}``, with ``"momentum_buffer"`` when
    momentum > 0 and ``"grad_avg"`` when centered (as torch keeps them). ``sharded``: this rank's
    shards (``data_parallel="sharded"``)."""
    state = {"step": np.zeros((), np.float32), "square_avg": _zeros_tree(params, sharded)}
    if momentum > 0:
        state["momentum_buffer"] = _zeros_tree(params, sharded)
    if centered:
        state["grad_avg"] = _zeros_tree(params, sharded)
    return state


def init_adagrad(params: Any, initial_accumulator_value: float = 0.0, sharded: bool = False) -> dict:
    """Adagrad's state: ``{"step": 0, "sum": initial_accumulator_value everywhere}``. ``sharded``:
    this rank's shards (``data_parallel="sharded"``)."""
    return {"step": np.zeros((), np.float32), "sum": _zeros_tree(params, sharded, fill=initial_accumulator_value)}


def init_adadelta(params: Any, sharded: bool = False) -> dict:
    """Adadelta's state: ``{"step": 0, "square_avg": zeros, "acc_delta": zeros}``. ``sharded``: this
    rank's shards (``data_parallel="sharded"``)."""
    return {"step": np.zeros((), np.float32), "square_avg": _zeros_tree(params, sharded),
            "acc_delta": _zeros_tree(params, sharded)}


# ------------------------------------------------------------------ helpers
def _traced(value: Any) -> bool:
    return isinstance(value, Tensor)


def _hyper(value: Any, name: str, op: str) -> Any:
    """A hyperparameter: a Python number (as float), or a traced 0-d float value."""
    if isinstance(value, Tensor):
        if value.shape != () or not value.type.is_float:
            raise UnsupportedError(f"{name} must be a Python number or a 0-d float tensor, got {value.type}",
                                   loc=user_location(), op=op)
        return value
    if isinstance(value, np.ndarray) and value.shape == ():
        return float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise UnsupportedError(f"{name} must be a Python number or a 0-d float tensor, got "
                               f"{type(value).__name__}", loc=user_location(), op=op)
    return float(value)


# op -> the function that makes its state (named in errors about a state that does not fit)
_INIT = {"sgd": "init_sgd", "adam": "init_adam", "adamw": "init_adam", "rmsprop": "init_rmsprop",
         "adagrad": "init_adagrad", "adadelta": "init_adadelta"}


def _state_part(state: Any, key: str, treedef: tree.TreeDef, op: str) -> list:
    if not isinstance(state, dict) or key not in state:
        raise UnsupportedError(f"the optimizer state has no {key!r} (make it with bendc.optim.{_INIT[op]}"
                               "(params))", loc=user_location(), op=op)
    try:
        return tree.flatten_up_to(treedef, state[key])
    except ValueError as error:
        raise UnsupportedError(f"state[{key!r}] does not match the parameters: {error}",
                               loc=user_location(), op=op) from None


def _grads(grads: Any, treedef: tree.TreeDef, op: str) -> list:
    try:
        return tree.flatten_up_to(treedef, grads)
    except ValueError as error:
        raise UnsupportedError(f"the gradients do not match the parameters: {error}",
                               loc=user_location(), op=op) from None


def _shard_update(param: Any, grad: Any, sharding: tuple[int, int] | None, state: list[tuple[str, Any]],
                  op: str) -> tuple[Any, Any, tuple[int, ...] | None]:
    """Under ``data_parallel="sharded"``: (this rank's shard of ``param``, the reduce-scatter of
    ``grad``, the whole shape for the all-gather), the ``state`` arrays checked to be shards;
    else (param, grad, None)."""
    if sharding is None or not isinstance(param, Tensor) or param.type.numel == 0:
        return param, grad, None
    from bendc import distributed

    rank, ranks = sharding
    shard = distributed.shard_of(param, rank, ranks)
    for key, value in state:
        if isinstance(value, Tensor) and value.shape != shard.shape:
            raise UnsupportedError(f"under data_parallel='sharded' state[{key!r}] of a parameter {param.type} is "
                                   f"this rank's shard {shard.type}, got {value.type} (make the state with "
                                   f"bendc.optim.{_INIT[op]}(params, ..., sharded=True), or "
                                   "bendc.distributed.shard_state)", loc=user_location(), op=op)
    return shard, distributed.sharded_gradient(grad, rank, ranks), param.shape


def _gathered(new_param: Any, shape: tuple[int, ...] | None, sharding: tuple[int, int] | None) -> Any:
    """The whole updated parameter: the all-gather of the shards under sharding."""
    if shape is None:
        return new_param
    from bendc import distributed

    return distributed.gather_shard(new_param, shape, sharding[1])


def _next_step(step: Any) -> Any:
    """torch's ``state_step += 1``."""
    return step + 1.0 if isinstance(step, Tensor) else step + 1


# ------------------------------------------------------------------ SGD
def sgd(params: Any, grads: Any, state: Any, lr: Any = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
        weight_decay: float = 0.0, nesterov: bool = False) -> tuple[Any, dict]:
    """torch.optim.SGD's step (maximize=False): returns (new_params, new_state).

    grad += weight_decay * param; with momentum, buf = grad on the first step, else
    buf * momentum + (1 - dampening) * grad, and grad = grad + momentum * buf (nesterov) or buf;
    then param - lr * grad.
    """
    lr = _hyper(lr, "lr", "sgd")
    momentum, dampening, weight_decay = (float(_hyper(v, n, "sgd")) if not _traced(v) else v for v, n in
                                         ((momentum, "momentum"), (dampening, "dampening"),
                                          (weight_decay, "weight_decay")))
    if nesterov and (_traced(momentum) or momentum <= 0 or dampening != 0):
        raise UnsupportedError("nesterov momentum requires a momentum and zero dampening (as torch)",
                               loc=user_location(), op="sgd")
    leaves, treedef = tree.flatten(params)
    gradients = _grads(grads, treedef, "sgd")
    use_momentum = _traced(momentum) or momentum != 0.0
    buffers = _state_part(state, "momentum_buffer", treedef, "sgd") if use_momentum else []
    step = state.get("step") if use_momentum and isinstance(state, dict) else None
    from bendc.distributed import sharding as _sharding

    sharding = _sharding(leaves)
    new_params, new_buffers = [], []
    updated: dict[int, tuple] = {}  # a traced parameter under two paths (tied weights): updated once
    for index, (param, grad) in enumerate(zip(leaves, gradients)):
        if id(param) in updated and isinstance(param, Tensor):
            new_param, buf = updated[id(param)]
            new_params.append(new_param)
            new_buffers.append(buf)
            continue
        buf = buffers[index] if use_momentum else None
        if grad is None:
            new_params.append(param)
            new_buffers.append(buf)
            continue
        whole = param
        param, grad, shape = _shard_update(param, grad, sharding, [("momentum_buffer", buf)], "sgd")
        if _traced(weight_decay) or weight_decay != 0.0:
            grad = grad + weight_decay * param
        if use_momentum:
            if buf is None:
                buf = grad
            else:
                scaled = grad if (not _traced(dampening) and dampening == 0.0) else (1.0 - dampening) * grad
                computed = buf * momentum + scaled
                if (_traced(dampening) or dampening != 0.0) and isinstance(step, Tensor):
                    tracer = step.tracer
                    with tracer.at_user_line("sgd"):
                        first = tracer.emit("le", (step.id, tracer.const(0.0).id))
                        buf = tracer.emit("where", (first.id, grad.id, computed.id))
                else:  # a zero buffer's first step is grad already (0 * momentum + grad)
                    buf = computed
            grad = grad + momentum * buf if nesterov else buf
        new_params.append(_gathered(param - lr * grad, shape, sharding))
        new_buffers.append(buf)
        updated[id(whole)] = (new_params[-1], buf)
    new_state: dict = {}
    if use_momentum:
        new_state = dict(state)
        new_state["momentum_buffer"] = tree.unflatten(treedef, new_buffers)
        if step is not None:
            new_state["step"] = _next_step(step)
    return tree.unflatten(treedef, new_params), new_state


# ------------------------------------------------------------------ Adam, AdamW
def _adam_leaf(param: Tensor, grad: Tensor, m: Tensor, v: Tensor, step: Any, lr: Any, beta1: Any, beta2: Any,
               eps: float, weight_decay: float, decoupled: bool) -> tuple[Tensor, Tensor, Tensor]:
    """One parameter's Adam(W) update; ``step`` is the count after its increment."""
    from bendc import functional as F

    if not decoupled and weight_decay != 0.0:
        grad = grad + weight_decay * param  # torch: grad.add(param, alpha=weight_decay)
    if not (_traced(lr) or _traced(beta1) or _traced(beta2)):
        # torch's float64 host arithmetic, rounded once (bendc.functional.adam_step).
        return F.adam_step(param, grad, m, v, step, lr, (beta1, beta2), eps,
                           weight_decay if decoupled else 0.0)
    tracer = param.tracer if isinstance(param, Tensor) else active_tracer("adam")
    with tracer.at_user_line("adam"):
        if decoupled and weight_decay != 0.0:
            param = param * (1.0 - lr * weight_decay)
        step = step if isinstance(step, Tensor) else tracer.const(float(step))
        new_m = m + (1.0 - beta1) * (grad - m)            # m.lerp_(grad, 1 - beta1)
        new_v = v * beta2 + (1.0 - beta2) * grad * grad   # v.mul_(beta2).addcmul_(grad, grad, 1 - beta2)
        # A Python-float beta keeps torch's float64 bias correction (rounded once); a traced one
        # is computed from the traced value, in float64 too, then rounded.
        if not _traced(beta1):
            step_size = tracer.emit("adam_lr_step_size", (step.id, tracer.value(lr, "adam").id), beta1=beta1)
        else:
            step_size = lr / tracer.emit("bias_correction", (tracer.value(beta1, "adam").id, step.id))
        if not _traced(beta2):
            bias_correction2_sqrt = tracer.emit("adam_bias_root", (step.id,), beta2=beta2)
        else:
            bias_correction2_sqrt = tracer.emit("bias_correction", (tracer.value(beta2, "adam").id, step.id)).sqrt()
        denom = new_v.sqrt() / bias_correction2_sqrt + eps
        return param + (-step_size) * (new_m / denom), new_m, new_v


def _adam(params: Any, grads: Any, state: Any, lr: Any, betas: Any, eps: float, weight_decay: float,
          decoupled: bool, op: str) -> tuple[Any, dict]:
    lr = _hyper(lr, "lr", op)
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise UnsupportedError(f"betas must be a pair, got {betas!r}", loc=user_location(), op=op)
    beta1, beta2 = (_hyper(b, "betas", op) for b in betas)
    eps, weight_decay = float(_hyper(eps, "eps", op)), float(_hyper(weight_decay, "weight_decay", op))
    leaves, treedef = tree.flatten(params)
    gradients = _grads(grads, treedef, op)
    exp_avg = _state_part(state, "exp_avg", treedef, op)
    exp_avg_sq = _state_part(state, "exp_avg_sq", treedef, op)
    if "step" not in state:
        raise UnsupportedError("the optimizer state has no 'step' (make it with bendc.optim.init_adam(params))",
                               loc=user_location(), op=op)
    step = _next_step(state["step"])
    from bendc.distributed import sharding as _sharding

    sharding = _sharding(leaves)
    new_params, new_m, new_v = [], [], []
    updated: dict[int, tuple] = {}  # a traced parameter under two paths (tied weights): updated once
    for param, grad, m, v in zip(leaves, gradients, exp_avg, exp_avg_sq):
        if grad is None:
            new_params.append(param), new_m.append(m), new_v.append(v)
            continue
        if id(param) in updated and isinstance(param, Tensor):
            p, m, v = updated[id(param)]
        else:
            shard, grad, shape = _shard_update(param, grad, sharding, [("exp_avg", m), ("exp_avg_sq", v)], op)
            p, m, v = _adam_leaf(shard, grad, m, v, step, lr, beta1, beta2, eps, weight_decay, decoupled)
            p = _gathered(p, shape, sharding)
            updated[id(param)] = (p, m, v)
        new_params.append(p), new_m.append(m), new_v.append(v)
    new_state = dict(state)
    new_state.update(step=step, exp_avg=tree.unflatten(treedef, new_m), exp_avg_sq=tree.unflatten(treedef, new_v))
    return tree.unflatten(treedef, new_params), new_state


def adam(params: Any, grads: Any, state: Any, lr: Any = 1e-3, betas: Any = (0.9, 0.999), eps: float = 1e-8,
         weight_decay: float = 0.0) -> tuple[Any, dict]:
    """torch.optim.Adam's step (amsgrad=False, maximize=False): weight decay is L2
    (grad += weight_decay * param). Returns (new_params, new_state)."""
    return _adam(params, grads, state, lr, betas, eps, weight_decay, decoupled=False, op="adam")


def adamw(params: Any, grads: Any, state: Any, lr: Any = 1e-3, betas: Any = (0.9, 0.999), eps: float = 1e-8,
          weight_decay: float = 0.01) -> tuple[Any, dict]:
    """torch.optim.AdamW's step (amsgrad=False, maximize=False): decoupled weight decay
    (param *= 1 - lr * weight_decay). Returns (new_params, new_state)."""
    return _adam(params, grads, state, lr, betas, eps, weight_decay, decoupled=True, op="adamw")


# ------------------------------------------------------------------ RMSprop, Adagrad, Adadelta
def _static(value: Any, name: str, op: str) -> float:
    """A hyperparameter that must be a Python number (only ``lr`` may be traced in these optimizers)."""
    value = _hyper(value, name, op)
    if _traced(value):
        raise UnsupportedError(f"{name} must be a Python number here (only lr may be a traced value in "
                               f"bendc.optim.{op})", loc=user_location(), op=op)
    return value


def _update_leaves(params: Any, grads: Any, state: Any, keys: tuple[str, ...], op: str, update: Any) -> tuple:
    """Apply ``update(param, grad, *state_values) -> (new_param, *new_state_values)`` to each parameter
    with a gradient; a None gradient keeps its parameter and state, and a traced parameter under two
    paths (tied weights) is updated once. Under ``data_parallel="sharded"`` the update runs on this
    rank's shard of the parameter, of its reduce-scattered gradient and of the state, and the new
    parameter is all-gathered. Returns (new_params, new_state) with the step incremented."""
    from bendc.distributed import sharding as _sharding

    leaves, treedef = tree.flatten(params)
    gradients = _grads(grads, treedef, op)
    parts = [_state_part(state, key, treedef, op) for key in keys]
    sharding = _sharding(leaves)
    new_params: list = []
    new_parts: list[list] = [[] for _ in keys]
    updated: dict[int, tuple] = {}
    for index, (param, grad) in enumerate(zip(leaves, gradients)):
        values = tuple(part[index] for part in parts)
        if grad is not None and id(param) in updated and isinstance(param, Tensor):
            result = updated[id(param)]
        elif grad is None:
            result = (param, *values)
        else:
            shard, grad, shape = _shard_update(param, grad, sharding, list(zip(keys, values)), op)
            new_param, *new_values = update(shard, grad, *values)
            result = updated[id(param)] = (_gathered(new_param, shape, sharding), *new_values)
        new_params.append(result[0])
        for collected, value in zip(new_parts, result[1:]):
            collected.append(value)
    new_state = dict(state)
    new_state.update({key: tree.unflatten(treedef, collected) for key, collected in zip(keys, new_parts)})
    new_state["step"] = _next_step(state["step"])
    return tree.unflatten(treedef, new_params), new_state


def _require_step(state: Any, op: str) -> None:
    if not isinstance(state, dict) or "step" not in state:
        raise UnsupportedError(f"the optimizer state has no 'step' (make it with bendc.optim.{_INIT[op]}(params))",
                               loc=user_location(), op=op)


def rmsprop(params: Any, grads: Any, state: Any, lr: Any = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
            weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False) -> tuple[Any, dict]:
    """torch.optim.RMSprop's step (maximize=False), state from ``init_rmsprop(params, momentum, centered)``:

    grad += weight_decay * param; square_avg = square_avg * alpha + (1 - alpha) * grad * grad;
    centered: grad_avg = grad_avg.lerp(grad, 1 - alpha) and avg = sqrt(square_avg - grad_avg**2),
    else avg = sqrt(square_avg); avg += eps; with momentum buf = buf * momentum + grad / avg and
    param - lr * buf, else param + (-lr * grad) / avg. Returns (new_params, new_state).
    """
    lr = _hyper(lr, "lr", "rmsprop")
    alpha, eps, weight_decay, momentum = (_static(v, n, "rmsprop") for v, n in (
        (alpha, "alpha"), (eps, "eps"), (weight_decay, "weight_decay"), (momentum, "momentum")))
    _require_step(state, "rmsprop")
    keys = ("square_avg",) + (("momentum_buffer",) if momentum > 0 else ()) + (("grad_avg",) if centered else ())

    def update(param, grad, square_avg, *rest):
        rest = list(rest)
        buf = rest.pop(0) if momentum > 0 else None
        grad_avg = rest.pop(0) if centered else None
        if weight_decay != 0.0:
            grad = grad + weight_decay * param            # grad.add(param, alpha=weight_decay)
        square_avg = square_avg * alpha + (1.0 - alpha) * grad * grad  # mul_(alpha).addcmul_(g, g, 1 - alpha)
        if centered:
            grad_avg = _lerp(grad_avg, grad, 1.0 - alpha)
            avg = (square_avg - grad_avg * grad_avg).sqrt()  # square_avg.addcmul(grad_avg, grad_avg, value=-1)
        else:
            avg = square_avg.sqrt()
        avg = avg + eps
        if momentum > 0:
            buf = buf * momentum + grad / avg              # buf.mul_(momentum).addcdiv_(grad, avg)
            new_param = param + (-lr) * buf                # param.add_(buf, alpha=-lr)
        else:
            new_param = param + ((-lr) * grad) / avg       # param.addcdiv_(grad, avg, value=-lr)
        return (new_param, square_avg) + ((buf,) if momentum > 0 else ()) + ((grad_avg,) if centered else ())

    return _update_leaves(params, grads, state, keys, "rmsprop", update)


def _lerp(start: Any, end: Any, weight: float) -> Any:
    """torch's lerp with a Python-number weight: start + w * (end - start) for |w| < 0.5, else
    end - (end - start) * (1 - w)."""
    if abs(weight) < 0.5:
        return start + weight * (end - start)
    return end - (end - start) * (1.0 - weight)


def adagrad(params: Any, grads: Any, state: Any, lr: Any = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
            eps: float = 1e-10) -> tuple[Any, dict]:
    """torch.optim.Adagrad's step (maximize=False), state from ``init_adagrad(params,
    initial_accumulator_value)``: grad += weight_decay * param; clr = lr / (1 + (step - 1) * lr_decay)
    (float64 from the step count, rounded once); sum += grad * grad; param + (-clr * grad) /
    (sqrt(sum) + eps). Returns (new_params, new_state)."""
    lr = _hyper(lr, "lr", "adagrad")
    lr_decay, weight_decay, eps = (_static(v, n, "adagrad") for v, n in (
        (lr_decay, "lr_decay"), (weight_decay, "weight_decay"), (eps, "eps")))
    _require_step(state, "adagrad")
    step = _next_step(state["step"])
    if lr_decay == 0.0:
        clr = lr                                           # lr / 1.0
    elif not _traced(step):  # a Python step count: torch's float64 arithmetic here
        decayed = 1.0 + (float(step) - 1.0) * lr_decay
        clr = lr * (1.0 / decayed) if _traced(lr) else lr / decayed
    else:
        tracer = step.tracer
        with tracer.at_user_line("adagrad"):
            scale = tracer.emit("adagrad_lr", (step.id,), lr=1.0 if _traced(lr) else lr, lr_decay=lr_decay)
        clr = lr * scale if _traced(lr) else scale         # a traced lr: one more float32 rounding

    def update(param, grad, total):
        if weight_decay != 0.0:
            grad = grad + weight_decay * param             # grad.add(param, alpha=weight_decay)
        total = total + grad * grad                        # state_sum.addcmul_(grad, grad, value=1)
        std = total.sqrt() + eps                           # state_sum.sqrt().add_(eps)
        return param + ((-clr) * grad) / std, total        # param.addcdiv_(grad, std, value=-clr)

    return _update_leaves(params, grads, state, ("sum",), "adagrad", update)


def adadelta(params: Any, grads: Any, state: Any, lr: Any = 1.0, rho: float = 0.9, eps: float = 1e-6,
             weight_decay: float = 0.0) -> tuple[Any, dict]:
    """torch.optim.Adadelta's step (maximize=False), state from ``init_adadelta(params)``:
    grad += weight_decay * param; square_avg = square_avg * rho + (1 - rho) * grad * grad;
    delta = sqrt(acc_delta + eps) / sqrt(square_avg + eps) * grad;
    acc_delta = acc_delta * rho + (1 - rho) * delta * delta; param - lr * delta.
    Returns (new_params, new_state)."""
    lr = _hyper(lr, "lr", "adadelta")
    rho, eps, weight_decay = (_static(v, n, "adadelta") for v, n in (
        (rho, "rho"), (eps, "eps"), (weight_decay, "weight_decay")))
    _require_step(state, "adadelta")

    def update(param, grad, square_avg, acc_delta):
        if weight_decay != 0.0:
            grad = grad + weight_decay * param             # grad.add(param, alpha=weight_decay)
        square_avg = square_avg * rho + (1.0 - rho) * grad * grad  # mul_(rho).addcmul_(g, g, 1 - rho)
        std = (square_avg + eps).sqrt()
        delta = (acc_delta + eps).sqrt() / std * grad      # acc_delta.add(eps).sqrt_().div_(std).mul_(grad)
        acc_delta = acc_delta * rho + (1.0 - rho) * delta * delta
        return param + (-lr) * delta, square_avg, acc_delta  # param.add_(delta, alpha=-lr)

    return _update_leaves(params, grads, state, ("square_avg", "acc_delta"), "adadelta", update)


# ------------------------------------------------------------------ gradient clipping
def clip_grad_norm(grads: Any, max_norm: float, norm_type: float = 2.0) -> tuple[Any, Any]:
    """torch.nn.utils.clip_grad_norm_ as a function: returns (clipped_grads, total_norm).

    total_norm is the norm (``norm_type``: 2, 1, any p > 0, or inf) of the per-gradient norms, in
    float32; every gradient is multiplied by min(max_norm / (total_norm + 1e-6), 1), as torch does
    (clip_coef.clamp(max=1.0)); None gradients stay None. ``max_norm`` is a Python number or a traced
    0-d value.
    """
    max_norm = _hyper(max_norm, "max_norm", "clip_grad_norm")
    norm_type = float(_static(norm_type, "norm_type", "clip_grad_norm"))
    if not norm_type > 0:
        raise UnsupportedError(f"norm_type must be positive (or inf), got {norm_type!r}", loc=user_location(),
                               op="clip_grad_norm")
    leaves, treedef = tree.flatten(grads)
    present = [g for g in leaves if g is not None]
    if not present:
        raise UnsupportedError("clip_grad_norm got no gradients (all None)", loc=user_location(),
                               op="clip_grad_norm")
    if not all(isinstance(g, Tensor) for g in present):
        raise UnsupportedError("clip_grad_norm takes the traced gradients of a jitted step (p.grad)",
                               loc=user_location(), op="clip_grad_norm")
    from bendc import functional as F

    norms = F.stack([_vector_norm(g, norm_type) for g in present])
    total_norm = _vector_norm(norms, norm_type)
    coefficient = (max_norm / (total_norm + 1e-6)).clamp(max=1.0)
    clipped = [None if g is None else g * coefficient for g in leaves]
    return tree.unflatten(treedef, clipped), total_norm


def _vector_norm(x: Tensor, p: float) -> Tensor:
    """torch.linalg.vector_norm of all elements: sqrt(sum x*x) for p = 2, max |x| for inf,
    sum |x| for 1, else sum(|x|**p) ** (1/p)."""
    if p == 2.0:
        return (x * x).sum().sqrt()
    if p == float("inf"):
        return x.abs().amax()
    if p == 1.0:
        return x.abs().sum()
    return (x.abs() ** p).sum() ** (1.0 / p)
