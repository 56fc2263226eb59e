"""How a user program reaches every IR op in ``bendc.ops.OPS``.

One entry per op name. ``test_fuzz.test_every_op_has_an_entry`` fails when an op in OPS has
no entry here (or an entry names an op that no longer exists), so a newly defined op has to be
given a front-end spelling (and a generator family in ``fuzz_gen.FAMILIES``) or a reason it is
reached only indirectly before the suite passes again.

Fields:
- ``kind``: "direct" (a user spelling emits it), "indirect" (emitted only by a VJP rule, by
  autodiff or by a composite), or "source" (graph inputs and constants).
- ``spelling``: the front-end spelling(s) and their argument/shape constraints.
- ``torch``: the torch eager equivalent the fuzzer compares with.
- ``families``: names of generator families (``fuzz_gen.FAMILIES``) that emit it. Every direct
  op needs at least one; indirect ops name the families whose *backward* (or composite) reaches
  them, and ``test_fuzz.test_sample_reaches_every_op`` checks a fixed sample's IR holds each one.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OpEntry:
    kind: str
    spelling: str
    torch: str
    families: tuple[str, ...]


D, I, S = "direct", "indirect", "source"

OP_TABLE: dict[str, OpEntry] = {
    # ---------------------------------------------------------------- sources
    "param": OpEntry(S, "every array parameter of the jitted function; a lifted constant (F.tensor of more than "
                        "4096 values, a large captured torch tensor)", "torch.tensor(..., requires_grad=leaf)",
                     ("creation",)),
    "const": OpEntry(S, "Python scalars in arithmetic (2.0 * x, x / 3, x * math.inf), constants of VJP rules",
                     "Python scalars", ("arith_scalar", "nonfinite")),
    "grad": OpEntry(D, "leaf.grad after a backward() (placeholder resolved by autodiff); zero_grad empties it",
                    "leaf.grad (cloned: torch accumulates into it in place)", ("grad_read",)),
    # ---------------------------------------------------------------- made inside the step (issue 22)
    "iota": OpEntry(D, "F.arange(n), torch.arange, zeros/ones/full/eye and *_like inside the step",
                    "torch.arange, torch.full, ...", ("creation",)),
    "literal": OpEntry(D, "F.tensor([...]), torch.tensor of a list inside the step", "torch.tensor", ("creation",)),
    "int_add": OpEntry(D, "idx + 1 on an integer tensor (F.arange(n) * 3 + 2)", "same", ("creation",)),
    "int_sub": OpEntry(D, "idx - 1 on an integer tensor, -idx", "same", ("creation",)),
    "int_mul": OpEntry(D, "idx * stride on an integer tensor", "same", ("creation",)),
    "int_floordiv": OpEntry(D, "idx // n on an integer tensor", "same", ("creation",)),
    "int_remainder": OpEntry(D, "idx % n on an integer tensor", "same", ("creation",)),
    "int_sum": OpEntry(D, "x.sum() / torch.sum of an integer or bool tensor: an int64 count ((a > b).sum(dim))",
                       "same", ("creation",)),
    "to_int": OpEntry(D, "x.long(), x.int(), x.to(torch.int64) of a float tensor", "same", ("creation",)),
    "wrap_index": OpEntry(I, "x[..., idx] with an integer tensor idx (negative entries counted from the end)",
                          "advanced indexing", ("creation",)),
    # ---------------------------------------------------------------- elementwise
    "add": OpEntry(D, "a + b (broadcast), a + 2.0, 2.0 + a, x + x", "same", ("arith_tensor", "arith_scalar")),
    "sub": OpEntry(D, "a - b (broadcast), a - 2.0, 2.0 - a", "same", ("arith_tensor", "arith_scalar")),
    "mul": OpEntry(D, "a * b (broadcast), a * 2.0, 2.0 * a, x * x, x ** 2, x ** 3", "same",
                   ("arith_tensor", "arith_scalar", "pow")),
    "div": OpEntry(D, "a / (b*b + 1) (broadcast), a / 2.0; mean() divides by the count", "same",
                   ("arith_tensor", "arith_scalar", "reduce", "combine")),
    "reciprocal": OpEntry(D, "2.0 / (x*x + 1) (scalar / tensor), (x*x + 1) ** -1", "same",
                          ("arith_scalar", "pow")),
    "neg": OpEntry(D, "-x", "-x", ("unary",)),
    "exp": OpEntry(D, "x.exp(), F.exp(x) (x.tanh() first where |x| may exceed 2)", "torch.exp", ("unary",)),
    "log": OpEntry(D, "(x*x + 1).log(), F.log", "torch.log", ("unary",)),
    "sqrt": OpEntry(D, "(x*x + 1).sqrt(), (x*x + 1) ** 0.5", "torch.sqrt", ("unary", "pow")),
    "tanh": OpEntry(D, "x.tanh(), F.tanh", "torch.tanh", ("unary",)),
    "sigmoid": OpEntry(D, "x.sigmoid(), F.sigmoid", "torch.sigmoid", ("unary",)),
    "relu": OpEntry(D, "x.relu(), F.relu", "torch.relu", ("unary",)),
    "gelu": OpEntry(D, "F.gelu(x, approximate='none'|'tanh')", "torch.nn.functional.gelu", ("gelu",)),
    "gelu_vjp": OpEntry(I, "backward of F.gelu", "autograd of gelu", ("gelu",)),
    "le": OpEntry(I, "backward of relu (mask y <= 0)", "autograd of relu", ("unary",)),
    "where": OpEntry(I, "backward of relu (select 0 or the gradient)", "autograd of relu", ("unary",)),
    # ---------------------------------------------------------------- reductions and rows
    "sum": OpEntry(D, "x.sum(dim=None|int|tuple, keepdim), x.mean(...), the loss reduction; x.sum/mean(..., "
                      "dtype=torch.float32), x.any/x.all (counts), F.einsum's summed letters", "same",
                   ("reduce", "backward", "composites")),
    "sum_to_size": OpEntry(I, "gradient of a broadcast operand (autodiff) and of batched matmul operands",
                           "autograd's sum over broadcast dims", ("arith_tensor", "matmul")),
    "expand": OpEntry(I, "backward of sum/mean", "autograd of sum", ("reduce",)),
    "softmax": OpEntry(D, "x.softmax(dim), F.softmax(x, dim) (any rank, 0-d included)", "torch.softmax",
                       ("rows",)),
    "log_softmax": OpEntry(D, "x.log_softmax(dim), F.log_softmax; F.cross_entropy", "torch.log_softmax",
                           ("rows", "cross_entropy")),
    # layer norm as fused ops (bendc/ops/layer_norm.py)
    "layer_norm": OpEntry(D, "F.layer_norm(x, x.shape[-k:], w?, b?) (x viewed as (rows, L))",
                          "torch.nn.functional.layer_norm", ("norm",)),
    "layer_norm_grad": OpEntry(I, "backward of F.layer_norm (dx, dweight and dbias packed)", "autograd of layer_norm",
                               ("norm",)),
    # group norm as fused ops (bendc/ops/group_norm.py)
    "group_norm": OpEntry(D, "F.group_norm(x (N,C,*), G, w?, b?) (G divides C)", "torch.nn.functional.group_norm",
                          ("norm", "group_norm_family")),
    "group_norm_grad": OpEntry(I, "backward of F.group_norm (dx, dweight and dbias packed)",
                               "autograd of group_norm", ("norm", "group_norm_family")),
    # training batch norm as fused ops (bendc/ops/batch_norm.py)
    "batch_norm": OpEntry(D, "F.batch_norm(x (N,C,*), mean?, var?, w?, b?, training=True)",
                          "torch.nn.functional.batch_norm", ("resample",)),
    "batch_norm_grad": OpEntry(I, "backward of a training F.batch_norm (dx, dweight and dbias packed)",
                               "autograd of batch_norm", ("resample",)),
    "batch_norm_stats": OpEntry(I, "a training F.batch_norm's running statistics (batch mean, biased variance)",
                                "torch's in-place running_mean / running_var update", ("resample",)),
    # ---------------------------------------------------------------- layout
    "reshape": OpEntry(D, "x.reshape(shape) / x.view (-1 allowed; same shape is an identity), x.unsqueeze(d), "
                          "x.unflatten(dim, sizes) / torch.unflatten (nn.Unflatten), 1-D matmul operands", "same",
                       ("layout", "matmul", "shape")),
    "permute": OpEntry(D, "x.permute(*dims), x.transpose(d0, d1), x.T (2-D); F.linear's w.T", "same",
                       ("layout", "matmul")),
    "index": OpEntry(D, "x[key]: ints, slices with steps, negative indices, ellipsis, full slices", "same",
                     ("index", "rope_family")),
    "index_scatter": OpEntry(I, "backward of x[key]", "autograd of indexing", ("index",)),
    # ---------------------------------------------------------------- products, attention, rope
    "matmul": OpEntry(D, "a @ b (1-D promotion, batched, broadcast batch dims, x @ x), F.linear(x, w, b?); "
                         "F.einsum(equation, x, y) (its contractions)",
                      "torch.matmul / F.linear / torch.einsum", ("matmul", "composites")),
    "attention": OpEntry(D, "F.scaled_dot_product_attention(q, k, v, is_causal, scale, enable_gqa); "
                            "q (B,H,T,D), k/v (B,Hkv,T,D); q, q, q allowed",
                         "torch.nn.functional.scaled_dot_product_attention", ("attention",)),
    "attention_probs": OpEntry(I, "backward of attention (recomputed P)", "autograd of SDPA", ("attention",)),
    "attention_score_grad": OpEntry(I, "backward of attention (score gradient G)", "autograd of SDPA",
                                    ("attention",)),
    "attention_vjp": OpEntry(I, "backward of attention (dq, dk, dv from P and G)", "autograd of SDPA",
                             ("attention",)),
    # the tiled attention schedule: the attention_schedule pass's rewrite of a site (t >= 8 on the cpu)
    "attention_tiled": OpEntry(I, "attention's tiled schedule (O and the logsumexp)", "torch SDPA",
                               ("attention",)),
    "attention_tiled_grad": OpEntry(I, "backward of attention's tiled schedule", "autograd of SDPA",
                                    ("attention",)),
    "rope": OpEntry(D, "F.rope(x (..., t, 2h), cos (t, h), sin (t, h)); backward is rope(inverse=True)",
                    "cat(x1*cos - x2*sin, x2*cos + x1*sin)", ("rope_family",)),
    # ---------------------------------------------------------------- integer indices
    "index_select": OpEntry(D, "F.index_select(x, dim, idx) with idx an int64 1-D input in range",
                            "torch.index_select", ("index_select",)),
    "index_add": OpEntry(I, "backward of index_select", "autograd of index_select", ("index_select",)),
    "gather": OpEntry(D, "F.gather(x, dim, idx) (idx int64, same rank, in range), F.cross_entropy",
                      "torch.gather", ("gather", "cross_entropy")),
    "scatter_add": OpEntry(I, "backward of gather / cross_entropy", "autograd of gather",
                           ("gather", "cross_entropy")),
    # ---------------------------------------------------------------- optimizers
    "adam_step_size": OpEntry(D, "F.adam_step(..., step=<0-d array parameter>, ...)",
                              "torch.optim.Adam's update formulas (single-tensor), step as a float",
                              ("adam",)),
    "adam_bias_root": OpEntry(D, "F.adam_step with a traced 0-d step (as adam_step_size)", "as adam_step_size",
                              ("adam", "adam_traced")),
    "concat": OpEntry(I, "backward of slices that tile an axis (x[..., :k] and x[..., k:] both used): "
                      "canonicalize turns the sum of their index_scatters into one concat; x.roll / torch.roll "
                      "(two slices joined)", "autograd of the slices; torch.roll", ("split", "composites")),
    "adam_lr_step_size": OpEntry(D, "bendc.optim.adam(..., lr=<0-d array parameter>)", "lr / (1 - beta1 ** step)",
                                 ("adam_traced",)),
    "bias_correction": OpEntry(D, "bendc.optim.adam(..., betas=(<0-d array parameter>, 0.999))",
                               "1 - beta ** step", ("adam_traced",)),
    # ---------------------------------------------------------------- data parallel (bendc.distributed)
    # Not fuzzed: in one process it is the identity, and a multi-rank run needs mpiexec; kind "source"
    # because no generator family can reach it. tests/distributed checks it on two ranks against torch.
    "all_reduce": OpEntry(S, "F.all_reduce(x, op='mean'|'sum'); every .grad under jit(data_parallel=True)",
                          "torch.distributed.all_reduce (identity on one rank)", ()),
    "reduce_scatter": OpEntry(S, "bendc.optim under jit(data_parallel='sharded'): the gradient's shard",
                              "torch.distributed.reduce_scatter_tensor (flat, padded; one rank: the flat tensor)", ()),
    "all_gather": OpEntry(S, "bendc.optim under jit(data_parallel='sharded'): the updated parameter",
                          "torch.distributed.all_gather_into_tensor (one rank: the shard reshaped)", ()),
    # ---------------------------------------------------------------- dropout, activations, losses
    "dropout": OpEntry(D, "F.dropout(x, p, training?, seed=<0-d int64 input>), p in {0, 0.25, 0.5, 0.9, 1}",
                       "x * noise with bendc's Philox mask (fuzz_gen.TorchF.dropout)", ("dropout",)),
    "causal_fill": OpEntry(D, "F.scaled_dot_product_attention(..., dropout_p>0, is_causal=True) (composed path)",
                           "masked_fill of the scores", ("dropout",)),
    "silu": OpEntry(D, "F.silu(x)", "torch.nn.functional.silu", ("activation_fns",)),
    "silu_vjp": OpEntry(I, "backward of F.silu", "autograd of silu", ("activation_fns",)),
    "softplus": OpEntry(D, "F.softplus(x, beta, threshold)", "torch.nn.functional.softplus", ("activation_fns",)),
    "softplus_vjp": OpEntry(I, "backward of F.softplus", "autograd of softplus", ("activation_fns",)),
    "leaky_relu": OpEntry(D, "F.leaky_relu(x, negative_slope)", "torch.nn.functional.leaky_relu",
                          ("activation_fns",)),
    "leaky_relu_vjp": OpEntry(I, "backward of F.leaky_relu", "autograd of leaky_relu", ("activation_fns",)),
    "elu": OpEntry(D, "F.elu(x, alpha)", "torch.nn.functional.elu", ("activation_fns",)),
    "elu_vjp": OpEntry(I, "backward of F.elu", "autograd of elu", ("activation_fns",)),
    "hardtanh": OpEntry(D, "F.hardtanh(x, min_val, max_val)", "torch.nn.functional.hardtanh", ("activation_fns",)),
    "hardtanh_vjp": OpEntry(I, "backward of F.hardtanh", "autograd of hardtanh", ("activation_fns",)),
    "class_valid": OpEntry(I, "F.cross_entropy / F.nll_loss (rows not ignored)", "torch's ignore_index",
                           ("losses", "cross_entropy")),
    "class_safe": OpEntry(I, "F.cross_entropy / F.nll_loss (the gathered class)", "torch's ignore_index",
                          ("losses", "cross_entropy")),
    "bce_logits": OpEntry(D, "F.binary_cross_entropy_with_logits(x, y.sigmoid(), reduction=...)",
                          "torch.nn.functional.binary_cross_entropy_with_logits", ("losses",)),
    "bce_logits_vjp": OpEntry(I, "backward of F.binary_cross_entropy_with_logits", "autograd of it", ("losses",)),
    "padding_rows": OpEntry(D, "F.embedding(idx, table, padding_idx=k)", "torch.nn.functional.embedding",
                            ("losses",)),
    "zero_padding": OpEntry(I, "backward of F.embedding with padding_idx", "autograd of embedding", ("losses",)),
    "norm_clamp": OpEntry(D, "F.normalize(x, dim=d)", "torch.nn.functional.normalize", ("losses",)),
    "norm_clamp_vjp": OpEntry(I, "backward of F.normalize", "autograd of normalize", ("losses",)),
    # ---------------------------------------------------------------- reductions beyond sum (bendc/reductions.py)
    "amax": OpEntry(D, "x.amax(dim=int|tuple|(), keepdim), F.amax", "torch.amax", ("extrema",)),
    "amin": OpEntry(D, "x.amin(dim=int|tuple|(), keepdim), F.amin", "torch.amin", ("extrema",)),
    "max": OpEntry(D, "x.max() (0-d), F.max(x)", "torch.max", ("extrema",)),
    "min": OpEntry(D, "x.min() (0-d), F.min(x)", "torch.min", ("extrema",)),
    "argmax": OpEntry(D, "x.argmax(dim=None|int, keepdim), x.max(dim) (its indices; values gathered there)",
                      "torch.argmax / torch.max(x, dim)", ("extrema",)),
    "argmin": OpEntry(D, "x.argmin(dim=None|int, keepdim), x.min(dim)", "torch.argmin / torch.min(x, dim)",
                      ("extrema",)),
    "extremum_mask": OpEntry(I, "backward of amax/amin/max()/min() (the ties)", "autograd of amax / max",
                             ("extrema",)),
    "logsumexp": OpEntry(D, "x.logsumexp(dim=int|tuple, keepdim), F.logsumexp", "torch.logsumexp", ("moments",)),
    "cumsum": OpEntry(D, "x.cumsum(dim), F.cumsum; its backward is cumsum[reverse=True]", "torch.cumsum",
                      ("moments",)),
    # ---- end of reductions beyond sum
    # ---------------------------------------------------------------- issue 22: products, sorts, scatters (bendc/sort_scatter.py)
    "cumprod": OpEntry(D, "x.cumprod(dim), torch.prod(x, dim, keepdim) (the last element of a cumprod)",
                       "torch.cumprod / torch.prod", ("sort_scatter",)),
    "argsort": OpEntry(D, "x.sort(dim, descending, stable=True) (values gathered at it), x.topk(k, dim, largest), "
                          "x.argsort(dim, descending)", "torch.sort / torch.topk / torch.argsort", ("sort_scatter",)),
    "scatter_reduce": OpEntry(D, "x.scatter(dim, index, src | value), x.scatter_add, x.scatter_reduce(dim, index, src, "
                                 "reduce, include_self) with a constant index", "same", ("sort_scatter",)),
    "floor_divide": OpEntry(D, "(x // c).detach() of float x (torch refuses its backward)", "same", ("sort_scatter",)),
    "remainder": OpEntry(D, "x % c, torch.remainder(x, c) of float x", "same", ("sort_scatter",)),
    # ---------------------------------------------------------------- issue 14: comparisons, casts, powers, shapes
    **{op: OpEntry(D, f"a {symbol} b (a tensor or a number): a bool mask used in arithmetic, .float(), "
                      "F.where, masked_fill", f"a {symbol} b", ("select",))
       for op, symbol in (("lt", "<"), ("gt", ">"), ("ge", ">="), ("eq", "=="), ("ne", "!="))},
    "to_float": OpEntry(D, "mask.float(), mask * x, x + mask (a bool operand of arithmetic)", "same", ("select",)),
    "detach": OpEntry(D, "x.detach()", "x.detach()", ("select",)),
    "abs": OpEntry(D, "x.abs(), abs(x), F.abs(x)", "torch.abs", ("select", "method")),
    "sign": OpEntry(D, "x.sign(), F.sign(x)", "torch.sign", ("select", "method")),
    "clamp": OpEntry(D, "x.clamp(min, max) / x.clip (numbers or None), F.clamp(x, tensor, tensor)", "torch.clamp",
                     ("select",)),
    "rsqrt": OpEntry(D, "(x*x + 1).rsqrt()", "torch.rsqrt", ("power",)),
    "pow_scalar": OpEntry(D, "(x*x + 1) ** e (e any float), x ** n (n an int but 1 and 2), x.pow(e)", "same",
                          ("power", "pow")),
    "pow": OpEntry(D, "(x*x + 1) ** y (a tensor exponent), 2.0 ** x (a number base)", "same", ("power",)),
    "triangle": OpEntry(D, "x.tril(k), x.triu(k) (at least 2-D)", "torch.tril / torch.triu", ("shape",)),
    # ---------------------------------------------------------------- convolution and pooling (op-coverage issue)
    "conv2d": OpEntry(D, "F.conv2d(x (N,C,H,W), w (O,C/g,KH,KW), b?, stride, padding (int, 'same', 'valid'), "
                         "dilation, groups); F.conv1d(x (N,C,L), ...) as conv2d of (N,C,1,L)",
                      "torch.nn.functional.conv2d / conv1d", ("conv",)),
    "conv2d_grad_input": OpEntry(D, "backward of conv2d (the input gradient); F.conv_transpose2d(x, w (C_in,C_out/g,"
                                    "KH,KW), b?, stride, padding, output_padding, groups, dilation) and "
                                    "F.conv_transpose1d (issue 22)", "autograd of conv2d; torch.nn.functional."
                                    "conv_transpose2d / 1d", ("conv", "resample")),
    "conv2d_grad_weight": OpEntry(I, "backward of conv2d (the weight gradient)", "autograd of conv2d", ("conv",)),
    "max_pool2d": OpEntry(D, "F.max_pool2d(x (N,C,H,W), kernel_size, stride, padding, dilation, ceil_mode)",
                          "torch.nn.functional.max_pool2d", ("pool",)),
    "max_pool2d_grad": OpEntry(I, "backward of max_pool2d (to each window's first max)", "autograd of max_pool2d",
                               ("pool",)),
    "avg_pool2d": OpEntry(D, "F.avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad)",
                          "torch.nn.functional.avg_pool2d", ("pool",)),
    "avg_pool2d_grad": OpEntry(I, "backward of avg_pool2d", "autograd of avg_pool2d", ("pool",)),
    "adaptive_avg_pool2d": OpEntry(D, "F.adaptive_avg_pool2d(x, output_size)",
                                   "torch.nn.functional.adaptive_avg_pool2d", ("pool",)),
    "adaptive_avg_pool2d_grad": OpEntry(I, "backward of adaptive_avg_pool2d", "autograd of adaptive_avg_pool2d",
                                        ("pool",)),
    # ---------------------------------------------------------------- issue 22: elementwise math, optimizers
    **{op: OpEntry(D, f"x.{op}(y), F.{op}(x, y) (tensors, broadcasting; exact operands: ties and zeros)",
                   f"torch.{op}", ("math_ops",)) for op in ("maximum", "minimum", "fmax", "fmin")},
    "atan2": OpEntry(D, "x.atan2(+-(y*y + 0.5)), F.atan2 (broadcasting)", "torch.atan2", ("math_ops",)),
    "lerp": OpEntry(D, "x.lerp(end, weight), F.lerp (a number or a tensor weight, broadcasting)", "torch.lerp",
                    ("math_ops",)),
    "nan_to_num": OpEntry(D, "x.nan_to_num(nan, posinf=, neginf=), F.nan_to_num: of a finite value, of "
                             "x.log() / 1.0 / x (NaN and +-inf where x <= 0 or x = 0), of x * inf",
                          "torch.nan_to_num", ("math_ops",)),
    **{op: OpEntry(D, f"(x*x + 0.5).{op}(), F.{op} (log1p of x*x): a positive domain", f"torch.{op}",
                   ("math_ops",)) for op in ("log2", "log10", "log1p")},
    "adagrad_lr": OpEntry(D, "bendc.optim.adagrad(..., {'step': <0-d array parameter>, ...}, lr_decay=d)",
                          "lr / (1 + (step - 1) * lr_decay) (torch.optim.Adagrad)", ("optimizers",)),
}


def _registry_method_entries() -> None:
    """Ops that declare their Tensor method (OpDef.method) are reached by the ``method`` family."""
    from bendc.ops import OPS
    from bendc.ops.base import METHODS

    for name, op in METHODS.items():
        if op not in OP_TABLE and OPS[op].arity == 1:
            OP_TABLE[op] = OpEntry(D, f"x.{name}(), F.{name}(x) (declared in its op file)", f"torch.{name}",
                                   ("method",))


_registry_method_entries()
