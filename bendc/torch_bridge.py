"""torch inside a traced function: ``__torch_function__`` on traced tensors, modules, parameters.

``torch.*``, ``torch.nn.functional.*`` and ``torch.Tensor`` methods called on a
traced :class:`bendc.trace.Tensor` reach :func:`torch_function`, which traces
them into bendc's ops with PyTorch's semantics: an explicit table of torch
functions (``TORCH_FUNCTIONS``, by qualified name) and, for the rest, the
bendc Tensor method of the same name (``torch.exp(x)`` and
``torch.Tensor.exp(x)`` are ``x.exp()``). A torch function bendc lacks raises
an UnsupportedError naming it and the user's line, with close supported names.

torch is an optional front-end dependency: this module imports it only when
a torch function is called on a traced tensor (torch is loaded then) or
when :func:`functional_call` / :func:`params` are given a module.
"""
from __future__ import annotations

import difflib
import functools
import math
from typing import Any, Callable

import numpy as np

from bendc import functional as F
from bendc.errors import UnsupportedError, user_location
from bendc.ops.base import METHODS
from bendc.trace import TORCH_FUNCTION, Tensor, matmul

# ------------------------------------------------------------------ operands
def _operand(value: Any, name: str) -> Any:
    """A traced tensor, a Python number, or a 0-d torch constant as a Python float; other torch
    tensors are refused (bendc has no array constants: pass them as parameters of the step)."""
    if isinstance(value, Tensor) or value is None or isinstance(value, (bool, int, float, str, tuple, list)):
        return value
    if type(value).__module__.startswith("torch") and hasattr(value, "shape") and hasattr(value, "item"):
        if tuple(value.shape) == ():
            return float(value.item())
        raise UnsupportedError(f"{name}: a torch tensor constant of shape {list(value.shape)} inside a traced "
                               "function is not supported; pass it as an array parameter of the jitted "
                               "function (or as a buffer in bendc.functional_call's dict)",
                               loc=user_location(), op=name)
    return value


def _defaults(name: str, given: dict[str, Any], **expected: Any) -> None:
    """Arguments bendc supports only at their default values."""
    for key, default in expected.items():
        value = given.get(key, default)
        if value is not default and value != default:
            raise UnsupportedError(f"{name}: {key}={value!r} is not supported (only {default!r})",
                                   loc=user_location(), op=name)


# ------------------------------------------------------------------ the table
def _linear(input, weight, bias=None):
    return F.linear(input, weight, bias)


def _relu(input, inplace=False):
    return F.relu(input)


def _gelu(input, approximate="none"):
    return F.gelu(input, approximate=approximate)


def _silu(input, inplace=False):
    return input * F.sigmoid(input)


def _softmax(input, dim=None, _stacklevel=3, dtype=None):
    _defaults("softmax", {"dtype": dtype}, dtype=None)
    return F.softmax(input, dim)


def _log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    _defaults("log_softmax", {"dtype": dtype}, dtype=None)
    return F.log_softmax(input, dim)


def _layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    return F.layer_norm(input, tuple(normalized_shape), weight, bias, eps)


def _group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    return F.group_norm(input, num_groups, weight, bias, eps)


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def _mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    _defaults("mse_loss", {"reduction": reduction, "size_average": size_average, "reduce": reduce,
                           "weight": weight}, reduction="mean", size_average=None, reduce=None, weight=None)
    return F.mse_loss(input, target)


def _cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                   reduction="mean", label_smoothing=0.0):
    _defaults("cross_entropy", dict(weight=weight, size_average=size_average, ignore_index=ignore_index,
                                    reduce=reduce, reduction=reduction, label_smoothing=label_smoothing),
              weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
              label_smoothing=0.0)
    return F.cross_entropy(input, target)


def _embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
               sparse=False):
    """torch's embedding: rows of ``weight`` picked by an integer index of any shape."""
    _defaults("embedding", dict(padding_idx=padding_idx, max_norm=max_norm, scale_grad_by_freq=scale_grad_by_freq,
                                sparse=sparse), padding_idx=None, max_norm=None, scale_grad_by_freq=False,
              sparse=False)
    if not isinstance(input, Tensor):
        raise UnsupportedError("embedding: the index must be an integer array parameter of the jitted function",
                               loc=user_location(), op="embedding")
    flat = input.reshape(-1) if input.ndim != 1 else input
    rows = F.index_select(weight, 0, flat)
    return rows.reshape(*input.shape, weight.shape[-1]) if input.ndim != 1 else rows


def _dropout(input, p=0.5, training=True, inplace=False):
    if training and p != 0.0:
        raise UnsupportedError(f"dropout with p={p} in training mode is not supported here; call "
                               "module.eval() or use p=0.0", loc=user_location(), op="dropout")
    return input


def _binary(op: str, reflected: bool = False) -> Callable:
    symbol = {"add": "+", "sub": "-", "mul": "*", "div": "/"}[op]

    def apply(input, other, alpha=1, out=None):
        _defaults(op, {"out": out}, out=None)
        a, b = (other, input) if reflected else (input, other)
        if alpha != 1:
            b = b * alpha
        if not isinstance(a, Tensor):  # a number on the left: the tensor's reflected operator
            return {"add": b.__radd__, "sub": b.__rsub__, "mul": b.__rmul__, "div": b.__rtruediv__}[op](a)
        return {"add": a.__add__, "sub": a.__sub__, "mul": a.__mul__, "div": a.__truediv__}[op](b)

    apply.bendc = f"`a {symbol} b`" + (f" (alpha: `a {symbol} alpha * b`)" if op in ("add", "sub") else "")
    return apply


def _div(input, other, rounding_mode=None, out=None):
    _defaults("div", {"rounding_mode": rounding_mode}, rounding_mode=None)
    return _binary("div")(input, other, out=out)


def _matmul(input, other, out=None):
    return matmul(input, other)


def _rmatmul(input, other):
    return matmul(other, input)


def _sum(input, dim=None, keepdim=False, dtype=None):
    _defaults("sum", {"dtype": dtype}, dtype=None)
    return input.sum(dim, keepdim)


def _mean(input, dim=None, keepdim=False, dtype=None):
    _defaults("mean", {"dtype": dtype}, dtype=None)
    return input.mean(dim, keepdim)


def _rsqrt(input):
    return 1.0 / input.sqrt()


def _index_select(input, dim, index):
    return F.index_select(input, dim, index)


def _gather(input, dim, index, sparse_grad=False):
    return F.gather(input, dim, index)


def _flatten(input, start_dim=0, end_dim=-1):
    ndim = max(input.ndim, 1)
    start, end = start_dim % ndim, end_dim % ndim
    shape = input.shape[:start] + (int(math.prod(input.shape[start:end + 1])),) + input.shape[end + 1:]
    return input.reshape(*shape) if input.ndim else input.reshape(1)


def _t(input):
    return input.T if input.ndim == 2 else input


def _contiguous(input, memory_format=None):
    return input


for _handler, _text in ((_silu, "`x * bendc.functional.sigmoid(x)`"),
                        (_embedding, "`bendc.functional.index_select(weight, 0, index)`"),
                        (_dropout, "identity (eval mode or p=0)"), (_matmul, "`a @ b` (torch.matmul)"),
                        (_rmatmul, "`a @ b` (torch.matmul)"), (_sum, "`Tensor.sum`"), (_mean, "`Tensor.mean`"),
                        (_rsqrt, "`1 / x.sqrt()`"), (_flatten, "`Tensor.reshape`"), (_t, "`Tensor.T`"),
                        (_contiguous, "the tensor itself"), (_div, "`a / b`"),
                        (_sdpa, "`bendc.functional.scaled_dot_product_attention`")):
    _handler.bendc = _text


def _neg(input):
    return -input


_neg.bendc = "`-x`"

# qualified torch name -> how bendc traces it (PyTorch's signature and semantics).
TORCH_FUNCTIONS: dict[str, Callable] = {
    **{f"torch.nn.functional.{name}": fn for name, fn in (
        ("linear", _linear), ("relu", _relu), ("gelu", _gelu), ("silu", _silu), ("softmax", _softmax),
        ("log_softmax", _log_softmax), ("layer_norm", _layer_norm), ("group_norm", _group_norm),
        ("scaled_dot_product_attention", _sdpa), ("mse_loss", _mse_loss), ("cross_entropy", _cross_entropy),
        ("embedding", _embedding), ("dropout", _dropout), ("sigmoid", F.sigmoid), ("tanh", F.tanh))},
    **{f"torch.{name}": fn for name, fn in (
        ("matmul", _matmul), ("mm", _matmul), ("bmm", _matmul), ("add", _binary("add")), ("sub", _binary("sub")),
        ("subtract", _binary("sub")), ("mul", _binary("mul")), ("multiply", _binary("mul")), ("div", _div),
        ("divide", _div), ("true_divide", _div), ("sum", _sum), ("mean", _mean), ("rsqrt", _rsqrt),
        ("relu", _relu), ("softmax", _softmax), ("log_softmax", _log_softmax), ("index_select", _index_select),
        ("gather", _gather), ("flatten", _flatten), ("t", _t), ("neg", _neg),
        ("negative", _neg))},
    **{f"torch.Tensor.{name}": fn for name, fn in (
        ("__add__", _binary("add")), ("__radd__", _binary("add", True)), ("__iadd__", _binary("add")),
        ("__sub__", _binary("sub")), ("__rsub__", _binary("sub", True)), ("__mul__", _binary("mul")),
        ("__rmul__", _binary("mul", True)), ("__truediv__", _div), ("__rtruediv__", _binary("div", True)),
        ("__matmul__", _matmul), ("__rmatmul__", _rmatmul), ("__neg__", _neg),
        ("add", _binary("add")), ("sub", _binary("sub")), ("mul", _binary("mul")), ("div", _div),
        ("matmul", _matmul), ("mm", _matmul), ("sum", _sum), ("mean", _mean), ("rsqrt", _rsqrt),
        ("index_select", _index_select), ("gather", _gather), ("flatten", _flatten), ("t", _t),
        ("contiguous", _contiguous), ("neg", _neg))},
}

# convolution and pooling (op-coverage issue): bendc.functional's signatures are torch's
TORCH_FUNCTIONS.update({
    **{f"torch.nn.functional.{name}": getattr(F, name)
       for name in ("conv1d", "conv2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d")},
    **{f"torch.{name}": getattr(F, name) for name in ("conv1d", "conv2d", "max_pool2d")},
})

# bendc Tensor methods that torch.<name> and torch.Tensor.<name> reach with the same meaning.
_SAME_NAMED = ("exp", "log", "tanh", "relu", "sigmoid", "sqrt", "softmax", "log_softmax", "reshape", "view",
               "permute", "transpose", "unsqueeze", "size", "dim", "numel", "square")


def method_names() -> list[str]:
    """The Tensor methods (bendc's own and the registry's) that torch names reach."""
    return sorted(set(_SAME_NAMED) | set(METHODS))


def supported_names() -> list[str]:
    """Every torch name bendc traces, qualified."""
    names = set(TORCH_FUNCTIONS)
    for method in method_names():
        names.add(f"torch.Tensor.{method}")
        if method not in ("view", "size", "dim"):
            names.add(f"torch.{method}")
    return sorted(names)


@functools.lru_cache(maxsize=1)
def _torch_names() -> dict[int, str]:
    """id(torch object) -> its qualified name, for torch, torch.nn.functional and torch.Tensor."""
    import torch
    import torch.nn.functional as TF

    names: dict[int, str] = {}
    for prefix, namespace in (("torch.Tensor", torch.Tensor), ("torch", torch), ("torch.nn.functional", TF)):
        for attr in dir(namespace):
            try:
                value = getattr(namespace, attr)
            except Exception:
                continue
            if callable(value):
                names[id(value)] = f"{prefix}.{attr}"
    return names


def torch_name(func: Any) -> str:
    """The qualified torch name of a function torch dispatched (``torch.nn.functional.linear``)."""
    name = _torch_names().get(id(func))
    if name is None:
        qualname = getattr(func, "__qualname__", getattr(func, "__name__", repr(func)))
        module = getattr(func, "__module__", None) or ""
        name = f"{module}.{qualname}" if module else qualname
        if module.startswith("torch._C") and "." not in qualname:
            name = f"torch.{qualname}"
        if qualname.startswith("TensorBase.") or qualname.startswith("_TensorBase."):
            name = "torch.Tensor." + qualname.split(".", 1)[1]
    return name


def _close_names(name: str) -> list[str]:
    """Supported names close to ``name``: by the last part (cumprod -> cumsum), same namespace first."""
    namespace, _, short = name.rpartition(".")
    by_short: dict[str, list[str]] = {}
    for supported in supported_names():
        by_short.setdefault(supported.rpartition(".")[2], []).append(supported)
    close = []
    for match in difflib.get_close_matches(short, list(by_short), n=4, cutoff=0.5):
        options = sorted(by_short[match], key=lambda n: n.rpartition(".")[0] != namespace)
        close.append(options[0])
    return close


def torch_function(func: Any, args: tuple, kwargs: dict) -> Any:
    """Trace a torch function called with traced tensors among its arguments."""
    name = torch_name(func)
    args = tuple(_operand(a, name) for a in args)
    kwargs = {k: _operand(v, name) for k, v in kwargs.items()}
    handler = TORCH_FUNCTIONS.get(name)
    if handler is not None:
        return handler(*args, **kwargs)
    short = name.rpartition(".")[2]
    if short in method_names() and args and isinstance(args[0], Tensor) and name in (
            f"torch.{short}", f"torch.Tensor.{short}", f"torch.nn.functional.{short}"):
        return getattr(args[0], short)(*args[1:], **kwargs)
    if name == "torch.Tensor.__get__" or short in ("shape", "ndim", "T", "grad", "requires_grad"):
        return getattr(args[0], short)
    close = _close_names(name)
    hint = f"; close supported names: {', '.join(close)}" if close else ""
    raise UnsupportedError(f"torch function {name} is not supported by bendc{hint} (docs/ops.md lists them)",
                           loc=user_location(), op=name)


# ------------------------------------------------------------------ modules
def params(module: Any) -> dict[str, np.ndarray]:
    """A torch.nn.Module's parameters (``named_parameters()``, tied ones once) as float32 numpy arrays,
    copies: the dict to pass as a pytree leaf parameter and to ``functional_call``. Trained values load
    back with ``module.load_state_dict({k: torch.from_numpy(v) for k, v in d.items()}, strict=False)``."""
    return {name: np.array(p.detach().cpu().numpy(), dtype=np.float32, copy=True)
            for name, p in module.named_parameters()}


def _owner(module: Any, name: str) -> tuple[Any, str]:
    *path, attr = name.split(".")
    for part in path:
        module = getattr(module, part)
    return module, attr


def functional_call(module: Any, parameters: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``module(*args, **kwargs)`` with ``parameters`` (name -> traced tensor, as
    ``module.named_parameters()``; buffers may be given too) in place of its own, as
    ``torch.func.functional_call`` does. Tied parameters (one object under two names) take the
    value given for either name. The module is restored afterwards."""
    if not isinstance(parameters, dict):
        raise UnsupportedError(f"functional_call takes a dict name -> tensor, got {type(parameters).__name__}",
                               loc=user_location(), op="functional_call")
    named = list(module.named_parameters(remove_duplicate=False))
    buffers = list(module.named_buffers(remove_duplicate=False))
    known = {name for name, _ in named} | {name for name, _ in buffers}
    unknown = sorted(set(parameters) - known)
    if unknown:
        raise UnsupportedError(f"functional_call: {unknown} are not parameters or buffers of "
                               f"{type(module).__name__}", loc=user_location(), op="functional_call")
    by_object = {id(p): parameters[name] for name, p in named + buffers if name in parameters}
    missing = sorted(name for name, p in named if name not in parameters and id(p) not in by_object)
    if missing:
        raise UnsupportedError(f"functional_call: no value for the parameters {missing} of "
                               f"{type(module).__name__} (bendc.params(module) gives them all)",
                               loc=user_location(), op="functional_call")
    swapped: list[tuple[dict, str, Any]] = []
    try:
        for slot, entries in (("_parameters", named), ("_buffers", buffers)):
            for name, value in entries:
                replacement = parameters.get(name, by_object.get(id(value)))
                if replacement is None:
                    continue
                owner, attr = _owner(module, name)
                table = getattr(owner, slot)
                swapped.append((table, attr, table[attr]))
                table[attr] = replacement
        return module(*args, **kwargs)
    finally:
        for table, attr, original in reversed(swapped):
            table[attr] = original



TORCH_FUNCTION[:] = [torch_function]
