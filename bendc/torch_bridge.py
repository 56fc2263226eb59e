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

import contextlib
import difflib
import functools
import math
from typing import Any, Callable, Iterator

import numpy as np

from bendc import functional as F
from bendc.errors import UnsupportedError, user_location
from bendc.ops.base import METHODS
from bendc.trace import TORCH_FUNCTION, TORCH_METHODS, TORCH_MODE, TORCH_ORIGINS, Tensor, matmul, unrepeatable

# ------------------------------------------------------------------ operands
def _operand(value: Any, name: str) -> Any:
    """A traced tensor, a Python number, or a 0-d torch constant as a Python float; another torch tensor
    the function captured is a constant of the graph (bendc.trace.torch_constant, which refuses those made
    during the trace by torch functions bendc does not trace, naming the line that made them)."""
    if isinstance(value, Tensor) or value is None or isinstance(value, (bool, int, float, str, tuple, list)):
        return value
    if type(value).__module__.startswith("torch") and hasattr(value, "shape") and hasattr(value, "item"):
        if tuple(value.shape) == ():
            return float(value.item())
        from bendc.trace import active_tracer, torch_constant

        return torch_constant(active_tracer(name), value, name)
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


def _gelu(input, approximate="none"):
    return F.gelu(input, approximate=approximate)




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
    _defaults("mse_loss", {"weight": weight}, weight=None)
    return F.mse_loss(input, target, size_average, reduce, reduction)


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
    return input.sum(dim, keepdim, dtype=dtype)


def _mean(input, dim=None, keepdim=False, dtype=None):
    return input.mean(dim, keepdim, dtype=dtype)


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


for _handler, _text in ((_matmul, "`a @ b` (torch.matmul)"),
                        (_rmatmul, "`a @ b` (torch.matmul)"), (_sum, "`Tensor.sum`"), (_mean, "`Tensor.mean`"),
                        (_rsqrt, "`1 / x.sqrt()`"), (_flatten, "`Tensor.reshape`"), (_t, "`Tensor.T`"),
                        (_contiguous, "the tensor itself"), (_div, "`a / b`"),
                        (_sdpa, "`bendc.functional.scaled_dot_product_attention`")):
    _handler.bendc = _text


# ------------------------------------------------------------------ dropout, activations, losses
# (op-coverage issue): torch's signatures onto bendc.functional's functions
def _applied(name: str, input: Any, inplace: Any, compute: Callable) -> Any:
    """An activation's value; with ``inplace=True`` written into ``input`` as torch's (every name of the
    tensor sees it: Tensor._in_place), where bendc used to return a new tensor and leave ``input``."""
    if inplace and isinstance(input, Tensor):
        return input._in_place(f"{name}(inplace=True)", compute)
    return compute()


def _activation(name: str, *parameters: str) -> Callable:
    """torch.nn.functional.<name>(input, *parameters, inplace=False) onto bendc.functional.<name>(input,
    **parameters): torch's parameters before inplace (inplace too) positional or by name, as torch takes
    them; bendc's function names them as torch does."""
    names = parameters + ("inplace",)

    def handler(input, *args, **kwargs):
        if len(args) > len(names):
            raise TypeError(f"{name}() takes at most {len(names) + 1} positional arguments ({len(args) + 1} given)")
        given = dict(zip(names, args))
        repeated = sorted(given.keys() & kwargs.keys())
        if repeated:
            raise TypeError(f"{name}() got multiple values for argument {repeated[0]!r}")
        given.update(kwargs)
        inplace = given.pop("inplace", False)
        return _applied(name, input, inplace, lambda: getattr(F, name)(input, **given))

    handler.__name__ = f"_{name}"
    handler.bendc = f"`bendc.functional.{name}`"
    return handler


_relu, _silu = _activation("relu"), _activation("silu")
_leaky_relu, _elu = _activation("leaky_relu", "negative_slope"), _activation("elu", "alpha")
_hardtanh, _dropout = _activation("hardtanh", "min_val", "max_val"), _activation("dropout", "p", "training")


def _softplus(input, beta=1.0, threshold=20.0):
    return F.softplus(input, beta, threshold)


def _torch_dropout(input, p, train):
    return F.dropout(input, p, train)


def _embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
               sparse=False):
    _defaults("embedding", dict(max_norm=max_norm, scale_grad_by_freq=scale_grad_by_freq),
              max_norm=None, scale_grad_by_freq=False)
    return F.embedding(input, weight, padding_idx)  # sparse=True: the same (dense) gradient values


def _cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                   reduction="mean", label_smoothing=0.0):
    return F.cross_entropy(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing)


def _nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
    return F.nll_loss(input, target, weight, size_average, ignore_index, reduce, reduction)


def _bce_with_logits(input, target, weight=None, size_average=None, reduce=None, reduction="mean",
                     pos_weight=None):
    return F.binary_cross_entropy_with_logits(input, target, weight, size_average, reduce, reduction, pos_weight)


def _normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    _defaults("normalize", {"out": out}, out=None)
    return F.normalize(input, p, dim, eps)


for _handler, _text in ((_softplus, "`bendc.functional.softplus`"),
                        (_dropout, "`bendc.functional.dropout` (the seed of `bendc.functional.dropout_seed`)"),
                        (_torch_dropout, "`bendc.functional.dropout` (the seed of `bendc.functional.dropout_seed`)"),
                        (_embedding, "`bendc.functional.embedding`"),
                        (_cross_entropy, "`bendc.functional.cross_entropy`"),
                        (_nll_loss, "`bendc.functional.nll_loss`"),
                        (_bce_with_logits, "`bendc.functional.binary_cross_entropy_with_logits`"),
                        (_normalize, "`bendc.functional.normalize`")):
    _handler.bendc = _text

_RANDOM_ACTIVATIONS_LOSSES: dict[str, Callable] = {
    **{f"torch.nn.functional.{name}": fn for name, fn in (
        ("silu", _silu), ("softplus", _softplus), ("leaky_relu", _leaky_relu), ("elu", _elu),
        ("hardtanh", _hardtanh), ("dropout", _dropout), ("embedding", _embedding),
        ("cross_entropy", _cross_entropy), ("nll_loss", _nll_loss),
        ("binary_cross_entropy_with_logits", _bce_with_logits), ("normalize", _normalize))},
    **{f"torch.nn.functional.{name}": getattr(F, name) for name in (
        "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy", "kl_div", "glu", "logsigmoid",
        "softsign", "tanhshrink", "softshrink", "hardshrink")},
    **{f"torch.nn.functional.{name}": _activation(name) for name in (
        "hardswish", "hardsigmoid", "relu6", "mish", "selu")},
    "torch.nn.functional.celu": _activation("celu", "alpha"),
    "torch.nn.functional.threshold": _activation("threshold", "threshold", "value"),
    "torch.selu": _activation("selu"), "torch.celu": _activation("celu", "alpha"),
    "torch.nn.functional.relu_": lambda input: _relu(input, inplace=True),
    "torch.dropout": _torch_dropout,
}


def _neg(input):
    return -input


_neg.bendc = "`-x`"

# qualified torch name -> how bendc traces it (PyTorch's signature and semantics).
TORCH_FUNCTIONS: dict[str, Callable] = {
    **{f"torch.nn.functional.{name}": fn for name, fn in (
        ("linear", _linear), ("relu", _relu), ("gelu", _gelu), ("silu", _silu), ("softmax", _softmax),
        ("log_softmax", _log_softmax), ("layer_norm", _layer_norm), ("group_norm", _group_norm),
        ("scaled_dot_product_attention", _sdpa), ("mse_loss", _mse_loss), ("sigmoid", F.sigmoid),
        ("tanh", F.tanh))},
    **_RANDOM_ACTIVATIONS_LOSSES,
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

# ------------------------------------------------------------------ shapes, selection, powers, casts (issue 14)
def _tensor_method(name: str) -> Callable:
    """torch.<name>(input, ...) / torch.Tensor.<name>(input, ...) as bendc's ``input.<name>(...)``."""
    def apply(input, *args, out=None, **kwargs):
        _defaults(name, {"out": out}, out=None)
        return getattr(input, name)(*args, **kwargs)

    apply.bendc = f"`Tensor.{name}`"
    return apply


def _comparison(op: str) -> Callable:
    reflected = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}[op]

    def apply(input, other, out=None):
        _defaults(op, {"out": out}, out=None)
        if not isinstance(input, Tensor):  # a number (or 0-d torch constant) on the left
            return getattr(other, f"__{reflected}__")(input)
        return getattr(input, f"__{op}__")(other)

    apply.bendc = f"`a {dict(lt='<', le='<=', gt='>', ge='>=', eq='==', ne='!=')[op]} b` (a bool tensor)"
    return apply


def _cat(tensors, dim=0, out=None):
    _defaults("cat", {"out": out}, out=None)
    return F.cat(tensors, dim)


def _stack(tensors, dim=0, out=None):
    _defaults("stack", {"out": out}, out=None)
    return F.stack(tensors, dim)


def _where(condition, input=None, other=None, out=None):
    _defaults("where", {"out": out}, out=None)
    if input is None or other is None:
        raise UnsupportedError("torch.where(condition) (the indices of true elements) is not supported; "
                               "torch.where(condition, input, other) is", loc=user_location(), op="where")
    return F.where(condition, input, other)


def _clamp(input, min=None, max=None, out=None):
    _defaults("clamp", {"out": out}, out=None)
    return F.clamp(input, min, max)


def _pow(input, exponent, out=None):
    _defaults("pow", {"out": out}, out=None)
    return F.pow(input, exponent)


def _rpow(input, other):
    return F.pow(other, input)


def _pad(input, pad, mode="constant", value=None):
    return F.pad(input, pad, mode, value)


for _handler, _text in ((_cat, "`bendc.functional.cat`"), (_stack, "`bendc.functional.stack`"),
                        (_where, "`bendc.functional.where`"), (_clamp, "`Tensor.clamp`"), (_pow, "`a ** b`"),
                        (_rpow, "`a ** b`"), (_pad, "`bendc.functional.pad` (constant, reflect, replicate, circular)")):
    _handler.bendc = _text

_SHAPE_METHODS = ("split", "chunk", "squeeze", "flatten", "unflatten", "tril", "triu", "masked_fill", "repeat",
                  "expand", "expand_as", "unbind", "abs", "sign", "rsqrt", "reciprocal", "float", "to", "detach",
                  "clamp_min", "clamp_max")
TORCH_FUNCTIONS.update({
    **{f"torch.{name}": _tensor_method(name) for name in (
        "split", "chunk", "squeeze", "flatten", "unflatten", "tril", "triu", "masked_fill", "unbind", "abs", "sign",
        "rsqrt", "reciprocal", "clamp_min", "clamp_max", "detach")},
    **{f"torch.Tensor.{name}": _tensor_method(name) for name in _SHAPE_METHODS + ("where", "clip", "pow")},
    **{f"torch.{name}": _comparison(op) for name, op in (
        ("lt", "lt"), ("le", "le"), ("gt", "gt"), ("ge", "ge"), ("eq", "eq"), ("ne", "ne"), ("less", "lt"),
        ("less_equal", "le"), ("greater", "gt"), ("greater_equal", "ge"), ("not_equal", "ne"))},
    **{f"torch.Tensor.{name}": _comparison(op) for name, op in (
        ("__lt__", "lt"), ("__le__", "le"), ("__gt__", "gt"), ("__ge__", "ge"), ("__eq__", "eq"), ("__ne__", "ne"),
        ("lt", "lt"), ("le", "le"), ("gt", "gt"), ("ge", "ge"), ("eq", "eq"), ("ne", "ne"))},
    **{f"{prefix}.{name}": _tensor_method(method) for prefix in ("torch", "torch.Tensor") for name, method in (
        ("logical_and", "logical_and"), ("logical_or", "logical_or"), ("logical_xor", "logical_xor"),
        ("logical_not", "logical_not"))},
    **{f"torch.Tensor.{name}": _tensor_method(name) for name in (
        "__and__", "__rand__", "__or__", "__ror__", "__xor__", "__rxor__", "__invert__")},
    "torch.absolute": _tensor_method("abs"), "torch.cat": _cat, "torch.concat": _cat, "torch.concatenate": _cat,
    "torch.stack": _stack, "torch.where": _where, "torch.clamp": _clamp, "torch.clip": _clamp,
    "torch.Tensor.clamp": _clamp, "torch.pow": _pow, "torch.Tensor.__pow__": _pow, "torch.Tensor.__rpow__": _rpow,
    "torch.nn.functional.pad": _pad,
})


# convolution and pooling (op-coverage issue): bendc.functional's signatures are torch's
TORCH_FUNCTIONS.update({
    **{f"torch.nn.functional.{name}": getattr(F, name)
       for name in ("conv1d", "conv2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d")},
    **{f"torch.{name}": getattr(F, name) for name in ("conv1d", "conv2d", "max_pool2d")},
})

# issue 22's batch norm, transposed convolutions and interpolation (bendc/resample.py)
def _resampling(name: str) -> Callable:
    def handler(*args, **kwargs):
        from bendc import resample

        return getattr(resample, name)(*args, **kwargs)

    handler.__name__ = f"_{name}"
    handler.bendc = f"`bendc.functional.{name}`" + _RESAMPLING_NOTES.get(name, "")
    return handler


_RESAMPLING_NOTES = {
    "batch_norm": " (training updates the running statistics given in place)",
    "conv_transpose1d": " (conv2d's input gradient, `conv2d_grad_input`)",
    "conv_transpose2d": " (conv2d's input gradient, `conv2d_grad_input`)",
    "interpolate": " (nearest, linear, bilinear, trilinear, bicubic: align_corners both ways; area)",
    "upsample": " (as interpolate)",
}


def _aten_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled):
    """torch.batch_norm, aten's argument order (weight and bias before the running statistics, every
    argument given) onto F.batch_norm; cudnn_enabled chooses a torch backend and means nothing here."""
    from bendc import resample

    if not isinstance(cudnn_enabled, (bool, int)):
        raise UnsupportedError(f"torch.batch_norm: cudnn_enabled={cudnn_enabled!r} must be a bool",
                               loc=user_location(), op="batch_norm")
    return resample.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)


_aten_batch_norm.bendc = ("`bendc.functional.batch_norm` (torch's order: input, weight, bias, running_mean, "
                          "running_var, training, momentum, eps, cudnn_enabled)")

TORCH_FUNCTIONS.update({
    "torch.batch_norm": _aten_batch_norm,
    **{f"torch.nn.functional.{name}": _resampling(name)
       for name in ("batch_norm", "conv_transpose1d", "conv_transpose2d", "interpolate", "upsample")},
    **{f"torch.{name}": _resampling(name) for name in ("conv_transpose1d", "conv_transpose2d")},
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
    for prefix, namespace in (("torch.Tensor", torch.Tensor), ("torch", torch), ("torch.nn.functional", TF),
                              ("torch.linalg", torch.linalg)):
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


def buffers(module: Any) -> dict[str, np.ndarray]:
    """A torch.nn.Module's buffers (``named_buffers()``: BatchNorm's running_mean, running_var and
    num_batches_tracked) as numpy copies in their own dtypes (float32, int64): pass them to
    ``functional_call`` with the parameters; a train-mode forward updates the traced buffers it was
    given in place (as torch.func.functional_call mutates the tensors it is given), so the step returns
    the updated dict for the next step."""
    out = {}
    for name, buffer in module.named_buffers():
        value = buffer.detach().cpu().numpy()
        out[name] = np.array(value, dtype=np.float32 if value.dtype.kind == "f" else value.dtype, copy=True)
    return out


def _owner(module: Any, name: str) -> tuple[Any, str]:
    *path, attr = name.split(".")
    for part in path:
        module = getattr(module, part)
    return module, attr


def _refuse_untied(module: Any, entries: list[tuple[str, Any]], parameters: dict[str, Any]) -> None:
    """Names the module ties (one parameter or buffer under several names) must be given one value
    (torch.func.functional_call's tie_weights=True raises the same way)."""
    tied: dict[int, list[str]] = {}
    for name, value in entries:
        tied.setdefault(id(value), []).append(name)
    for names in tied.values():
        given = [name for name in names if name in parameters]
        if len({id(parameters[name]) for name in given}) > 1:
            raise UnsupportedError(
                f"functional_call got different values for {given}, which {type(module).__name__} ties (one "
                "parameter under these names). Pass the same array object under each of them (it is then one "
                "leaf, with the tied gradient), or only one name (bendc.params(module) gives tied parameters "
                "once). Arrays are matched by identity: two .numpy() views of one tensor are two arrays",
                loc=user_location(), op="functional_call")


@contextlib.contextmanager
def _watched(module: Any, given: set[str]) -> Iterator[None]:
    """Watch the forward when a trace is running: the trace is reused only while what the forward
    read from the module tree stays as it was (bendc/guards.py)."""
    from bendc.trace import _ACTIVE

    if not _ACTIVE:
        yield
        return
    from bendc.guards import root_name, watch

    with watch(module, root_name(_ACTIVE[-1].fn, module), given) as watched:
        yield
    _ACTIVE[-1].add_module_guard(watched.guard)


def functional_call(module: Any, parameters: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``module(*args, **kwargs)`` with ``parameters`` (name -> traced tensor, as
    ``module.named_parameters()``; buffers may be given too) in place of its own, as
    ``torch.func.functional_call`` does. Tied parameters (one object under two names) take the
    value given for either name; giving different values for names the module ties is an error
    (as torch's tie_weights=True). The module is restored afterwards.

    In a trace, the module state the forward read (training flags, attributes, ties, buffers) is
    recorded, and the jitted function traces again when it changes (bendc/guards.py)."""
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
    _refuse_untied(module, named + buffers, parameters)
    by_object = {id(p): parameters[name] for name, p in named + buffers if name in parameters}
    missing = sorted(name for name, p in named if name not in parameters and id(p) not in by_object)
    if missing:
        raise UnsupportedError(f"functional_call: no value for the parameters {missing} of "
                               f"{type(module).__name__} (bendc.params(module) gives them all)",
                               loc=user_location(), op="functional_call")
    with _watched(module, set(parameters)):
        return _swapped_call(module, named, buffers, parameters, by_object, args, kwargs)


def _swapped_call(module: Any, named: list, buffers: list, parameters: dict[str, Any], by_object: dict,
                  args: tuple, kwargs: dict) -> Any:
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
        with _traced_batch_norms(module):
            return module(*args, **kwargs)
    finally:
        for table, attr, original in reversed(swapped):
            table[attr] = original


@contextlib.contextmanager
def _traced_batch_norms(module: Any) -> Iterator[None]:
    """nn.BatchNorm*'s forward, for the call, is bendc.resample's (the same arithmetic, with the
    num_batches_tracked count kept in the graph, so that momentum=None needs no float() of a traced
    value). It is set on each instance and removed afterwards (the guards watch reads, not it)."""
    from torch.nn.modules.batchnorm import _BatchNorm

    from bendc.resample import batch_norm_module_forward

    patched = [sub for sub in module.modules() if isinstance(sub, _BatchNorm) and "forward" not in sub.__dict__]
    try:
        for sub in patched:
            sub.__dict__["forward"] = functools.partial(batch_norm_module_forward, sub)
        yield
    finally:
        for sub in patched:
            sub.__dict__.pop("forward", None)



# ---- reductions beyond sum/mean (bendc/reductions.py): torch.X and torch.Tensor.X, torch's signatures
def _reduction(name: str) -> Callable:
    def handler(input, *args, out=None, **kwargs):
        _defaults(name, {"out": out}, out=None)
        if not isinstance(input, Tensor):
            raise UnsupportedError(f"{name}: the input must be a traced tensor, got {type(input).__name__}",
                                   loc=user_location(), op=name)
        return getattr(input, name)(*args, **kwargs)

    handler.__name__ = f"_{name}"
    handler.bendc = f"`Tensor.{name}`" + (" (with dim: `(values, indices)`)" if name in ("max", "min") else "")
    return handler


for _name in ("max", "min", "amax", "amin", "argmax", "argmin", "var", "std", "logsumexp", "cumsum"):
    TORCH_FUNCTIONS[f"torch.{_name}"] = TORCH_FUNCTIONS[f"torch.Tensor.{_name}"] = _reduction(_name)
# ---- end of reductions

# ---- issue 22's elementwise math: methods with attributes (bendc/tensor_math.py) and torch's aliases of the
# ops that declare their method (bendc/ops/math_ops.py)
from bendc.tensor_math import FUNCTIONS as _MATH_FUNCTIONS, TENSOR_METHODS as _MATH_METHODS  # noqa: E402
from bendc.tensor_math import vector_norm as _vector_norm  # noqa: E402

for _name, _function in _MATH_FUNCTIONS.items():
    TORCH_FUNCTIONS[f"torch.{_name}"] = _function
    if _name in _MATH_METHODS:
        TORCH_FUNCTIONS[f"torch.Tensor.{_name}"] = _function
for _alias, _method in (("fix", "trunc"), ("arcsin", "asin"), ("arccos", "acos"), ("arctan", "atan"),
                        ("arctan2", "atan2")):
    TORCH_FUNCTIONS[f"torch.{_alias}"] = TORCH_FUNCTIONS[f"torch.Tensor.{_alias}"] = _tensor_method(_method)


def _linalg_norm(input, ord=None, dim=None, keepdim=False, *, out=None, dtype=None):
    """torch.linalg.norm: a vector norm (vector_norm), and of a matrix (two dims: ``dim`` a pair, or a
    2-D input without ``dim``) the Frobenius norm only."""
    matrix = isinstance(dim, (tuple, list)) and len(dim) == 2 or dim is None and input.ndim == 2
    if (ord not in (None, "fro")) if matrix else not (ord is None or isinstance(ord, (int, float))):
        raise UnsupportedError(f"torch.linalg.norm(ord={ord!r}) of {input.type}: of matrices only the Frobenius "
                               "norm is supported (ord None or 'fro'); vector norms take a number",
                               loc=user_location(), op="torch.linalg.norm")
    return _vector_norm(input, 2.0 if ord in (None, "fro") else ord, dim, keepdim, dtype=dtype, out=out)


_vector_norm.bendc = "`bendc.tensor_math.vector_norm` (ord 2, 1, inf, -inf or p > 0; 0 gradients at a 0 norm)"
_linalg_norm.bendc = "`bendc.tensor_math.vector_norm` (vector norms; of matrices the Frobenius norm)"
TORCH_FUNCTIONS["torch.linalg.norm"] = _linalg_norm
TORCH_FUNCTIONS["torch.linalg.vector_norm"] = _vector_norm
# ---- end of elementwise math

# ---- issue 22's products, flips, sorts and scatters (bendc/sort_scatter.py)
from bendc.sort_scatter import FUNCTIONS as _SORT_SCATTER_FUNCTIONS  # noqa: E402

for _name, _function in _SORT_SCATTER_FUNCTIONS.items():
    TORCH_FUNCTIONS[f"torch.{_name}"] = TORCH_FUNCTIONS[f"torch.Tensor.{_name}"] = _function
# ---- end of products, flips, sorts and scatters


TORCH_FUNCTION[:] = [torch_function]


# ---- tensor creation inside a traced function (issue 22): constants of the graph
def _one_hot(tensor, num_classes=-1):
    return F.one_hot(tensor, num_classes)


def _floor_divide(input, other, out=None):
    _defaults("floor_divide", {"out": out}, out=None)
    return input // other


def _remainder(input, other, out=None):
    _defaults("remainder", {"out": out}, out=None)
    return input % other


def _getitem(input, key):
    if not isinstance(input, Tensor):  # a torch constant indexed by a traced index
        from bendc.trace import active_tracer, torch_constant

        input = torch_constant(active_tracer("index"), input, "index")
    return input[key]


def _clone(input, memory_format=None):
    return input.clone()


_one_hot.bendc = "`bendc.functional.one_hot` (num_classes given)"
_floor_divide.bendc = _remainder.bendc = ("`a // b`, `a % b` (float operands: torch's floor_divide and remainder, "
                                          "`//` in torch's float32 steps, bit for bit also where |a / b| >= 2**24; "
                                          "an integer tensor by a positive int)")
_getitem.bendc = "`x[key]` (ints, slices, None, ..., lists, integer tensors, bool masks into a reduction)"
_clone.bendc = "`Tensor.clone`"

CREATION_FUNCTIONS: dict[str, Callable] = {
    f"torch.{name}": getattr(F, name) for name in (
        "arange", "zeros", "ones", "empty", "full", "eye", "linspace", "tensor", "zeros_like", "ones_like",
        "empty_like", "full_like")}
CREATION_FUNCTIONS["torch.as_tensor"] = F.tensor
for _name, _function in CREATION_FUNCTIONS.items():
    _function.bendc = f"`bendc.functional.{_function.__name__}` (a constant of the graph)"
TORCH_FUNCTIONS.update(CREATION_FUNCTIONS)
TORCH_FUNCTIONS.update({
    "torch.nn.functional.one_hot": _one_hot,
    "torch.floor_divide": _floor_divide, "torch.Tensor.__floordiv__": _floor_divide,
    "torch.Tensor.floor_divide": _floor_divide, "torch.remainder": _remainder, "torch.Tensor.__mod__": _remainder,
    "torch.Tensor.remainder": _remainder, "torch.Tensor.__getitem__": _getitem, "torch.Tensor.clone": _clone,
    "torch.clone": _clone,
    **{f"torch.Tensor.{name}": _tensor_method(name) for name in ("long", "int", "float", "cpu", "cuda")},
})
# torch.Tensor methods reach traced tensors by name too (x.add(y), x.index_select(0, i)): bendc.trace's
# Tensor.__getattr__ reads this for names it does not define.
TORCH_METHODS.update({name.rpartition(".")[2]: handler for name, handler in TORCH_FUNCTIONS.items()
                      if name.startswith("torch.Tensor.") and not name.rpartition(".")[2].startswith("__")})


def _traced_among(values: Any) -> bool:
    if isinstance(values, Tensor):
        return True
    if isinstance(values, (list, tuple)):
        return any(_traced_among(v) for v in values)
    if isinstance(values, dict):
        return any(_traced_among(v) for v in values.values())
    return False


@functools.lru_cache(maxsize=1)
def _creation_mode_class() -> type:
    """The torch function mode active while a function is traced: torch's creation functions called
    without a traced operand (``torch.arange(t, device=idx.device)``) make constants of the graph; any
    other torch function runs as torch runs it, and a tensor it makes is remembered with the user's line,
    so that bendc can name that line if the tensor is used as an operand."""
    from torch.overrides import TorchFunctionMode

    class CreationMode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = torch_name(func)
            handler = CREATION_FUNCTIONS.get(name)
            if handler is not None and not _traced_among((args, kwargs)):
                return handler(*args, **kwargs)
            result = func(*args, **kwargs)
            if type(result).__module__.startswith("torch") and hasattr(result, "shape") and not _traced_among(
                    (args, kwargs)):
                # a result of a random tensor keeps the random function's line (it is no constant either)
                inherited = [TORCH_ORIGINS[id(a)] for a in (*args, *kwargs.values())
                             if id(a) in TORCH_ORIGINS and unrepeatable(TORCH_ORIGINS[id(a)][1])]
                TORCH_ORIGINS[id(result)] = inherited[0] if inherited else (user_location(), name)
            return result

    return CreationMode


def creation_mode() -> Any:
    """A fresh CreationMode (bendc.trace enters one for each trace, where torch is loaded)."""
    TORCH_ORIGINS.clear()
    return _creation_mode_class()()


TORCH_MODE[:] = [creation_mode]
