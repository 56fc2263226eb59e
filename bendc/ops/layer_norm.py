"""Layer norm as two fused ops: ``layer_norm`` (the forward) and ``layer_norm_grad`` (its VJP).

How F.layer_norm uses them (bendc/functional.py): x's trailing ``normalized_shape`` dims become one
row of L elements, x a (rows, L) view, weight and bias (L,) views::

    %4 = layer_norm[bias=True, eps=1e-05, weight=True] %x, %w, %b               : f32[512,64]
    %9 = layer_norm_grad[eps=1e-05, grad_affine=True, grad_input=True, weight=True] %x, %g, %w
                                                                                 : f32[32896]
    %10 = index[spec=((0,64,1),)] %9                                              dweight
    %11 = index[spec=((64,128,1),)] %9                                            dbias
    %12 = index[spec=((128,32896,1),)] %9 ; %13 = reshape[shape=(512,64)] %12    dx

The forward saves nothing: the backward recomputes each row's mean and rstd from x (its row is in
L1 while the kernel works on it). The backward packs dweight, dbias and dx into one flat value,
taken apart by free views, as group_norm_grad does (bendc/ops/group_norm.py: a kernel step has one
output). dweight and dbias come first: their offsets do not depend on the rows, so where the
caller gets them back (on cuda a copy kernel of the slice) one kernel serves every batch size.

Why fused ops, and no longer the composed statistics (norm_mean, norm_rstd, then the normalization
and the affine as elementwise ops, and autodiff's backward of them): in bench/run.py's gpt_small
(2 layers, n_embd 64, B=8 T=64; five layer norms of (512, 64)) the composed form took two row
kernels and one fused kernel forward (~0.07 ms a layer norm in the step at 1 thread), three to four
kernels backward whose sum_to_size epilogues add one dependent float64 per cell (~0.08 ms). Here
each direction is one kernel: 0.016-0.019 ms forward, 0.050-0.056 backward, the step's kernels
touching a layer norm 0.54-0.69 -> 0.43 ms (``step.profile``, 30 runs, 125 -> 105 kernels). The
composed form's one advantage, fusing the normalization with the elementwise work around it, was
worth little: a layer norm's input is the residual stream, which the step keeps anyway, and its
output feeds a matrix product.

Numbers:
- the statistics in float64, as norm_mean and norm_rstd computed them: mean = sum(x) / L, then
  var = sum((x - mean)^2) / L (centered: a second pass over the row, in L1), rstd =
  1 / sqrt(var + eps); each sum in the CPU kernels' eight lanes (cpu_kit.row_lanes through
  bendc_lanes8: lane l takes the elements l, l + 8, ... and the tail past the last full block
  lane 0, the lanes added in a fixed tree), which the reference's cpu_kit.lane_row_sums repeats;
  each row's pass runs over a group of ROW_GROUP rows before the next pass, so the rows' chains
  of dependent adds, divisions and square roots overlap;
- the forward in float32 from the rounded statistics, as the composed form computed it (the same
  bits): y = ((x - mean) * rstd) * w + b (without weight or bias, without that operation);
- the backward in float64 inside a row, rounded once per output element, PyTorch's formula:
  xhat = (x - mean) * rstd, gw = g * w (g without weight), a = sum(gw) / L, c = sum(gw * xhat) / L
  (lanes), dx = rstd * ((gw - a) - xhat * c); dweight = sum over rows of g * xhat and dbias = sum
  over rows of g, each of ROW_BLOCKS blocks of rows summing its rows in order into its own float64
  partials (in the same pass as dx: x and g are read once), the partials then added in block order.
PyTorch computes these in float32 (its statistics by Welford's method); bendc's results are within
the usual tolerances of PyTorch's (tests/ops/test_norms.py). The reference interpreter computes the
same sums in the same order, so the cpu kernels match it bit for bit, at every thread count (rows
are independent; the blocks are the same at any thread count).

On cuda the ops are group_norm's kernels with one group (x (rows, L) is rows samples of L channels
of one element each; bendc/ops/group_norm.py): one block per row, float64 trees, the variance
centered, the forward's output in float64 rounded once; results agree with the reference within
the usual tolerances (the forward's last bits can differ: the CPU's output is float32 arithmetic).
"""
from __future__ import annotations

import numpy as np

from bendc.kernels import cpu_policy as policy
from bendc.kernels.cpu_kit import lane_row_sums, njit_decorator, row_lanes
from bendc.ops.base import InferError, Lowering, define_op
from bendc.ops.group_norm import (_affine_names, _cuda_group_norm, _cuda_group_norm_grad, infer_affine_norm,
                                  infer_packed_grad, packed_affine_vjp)

# Rows a kernel deals in this many blocks (over the threads when parallel; each block allocates its
# float64 rows of terms once, and the backward's block sums its own dweight and dbias partials: the
# same blocks at any thread count, so the same bits); a block's passes run ROW_GROUP rows at a time.
ROW_BLOCKS = 16
ROW_GROUP = 16


# ------------------------------------------------------------------ shapes
def _check_attrs(x, attrs, op: str) -> None:
    if x.ndim != 2:
        raise InferError(f"{op} needs x of shape (rows, L) (layer_norm's view of its input), got {x}")
    if not isinstance(attrs["eps"], float):
        raise InferError(f"{op} eps must be a float, got {attrs['eps']!r}")


def _infer_layer_norm(types, attrs):
    return infer_affine_norm(types, attrs, "layer_norm", _check_attrs)


def _infer_layer_norm_grad(types, attrs):
    return infer_packed_grad(types, attrs, "layer_norm_grad", _check_attrs)


# ------------------------------------------------------------------ reference semantics
def _row_stats(x: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x (rows, L) in float64, its rows' mean and rstd (rows, 1): the kernels' sums, in their order."""
    rows = np.asarray(x, np.float64)
    length = rows.shape[1]
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = lane_row_sums(rows) / length
        deviation = rows - mean[:, None]
        rstd = 1.0 / np.sqrt(lane_row_sums(deviation * deviation) / length + eps)
    return rows, mean[:, None], rstd[:, None]


def _reference_layer_norm(values, attrs):
    x = values[0]
    affine = dict(zip(_affine_names(attrs), values[1:]))
    _, mean, rstd = _row_stats(x, attrs["eps"])
    y = (np.asarray(x, np.float32) - mean.astype(np.float32)) * rstd.astype(np.float32)
    if "weight" in affine:
        y = y * np.asarray(affine["weight"], np.float32)
    if "bias" in affine:
        y = y + np.asarray(affine["bias"], np.float32)
    return y.astype(np.float32)


def _reference_layer_norm_grad(values, attrs):
    x, g = values[0], values[1]
    rows, mean, rstd = _row_stats(x, attrs["eps"])
    dy = np.asarray(g, np.float64)
    length = rows.shape[1]
    parts = []
    with np.errstate(divide="ignore", invalid="ignore"):
        xhat = (rows - mean) * rstd
        if attrs["grad_affine"]:
            count = rows.shape[0]
            blocks = min(count, ROW_BLOCKS)
            terms = dy * xhat
            dweight = np.zeros(length)
            dbias = np.zeros(length)
            for block in range(blocks):  # each block's rows in order, then the blocks in order, as the kernels
                wpart = np.zeros(length)
                bpart = np.zeros(length)
                for r in range(block * count // blocks, (block + 1) * count // blocks):
                    wpart = wpart + terms[r]
                    bpart = bpart + dy[r]
                dweight = dweight + wpart
                dbias = dbias + bpart
            parts += [dweight.astype(np.float32), dbias.astype(np.float32)]
        if attrs["grad_input"]:
            gw = dy * np.asarray(values[2], np.float64) if attrs["weight"] else dy
            a = (lane_row_sums(gw) / length)[:, None]
            c = (lane_row_sums(gw * xhat) / length)[:, None]
            parts.append((rstd * ((gw - a) - xhat * c)).astype(np.float32).reshape(-1))
    return np.concatenate(parts)


# ------------------------------------------------------------------ VJP
def vjp_layer_norm(b, node, grad, needs):
    """One layer_norm_grad (dx, and dweight|dbias where either is needed), taken apart by views."""
    return packed_affine_vjp(b, node, grad, needs, "layer_norm_grad", affine_first=True)


# ------------------------------------------------------------------ CPU kernels
def _stats_passes(eps: float) -> list[list[str]]:
    """Two passes over a group of rows (row r: ``row``, ``size`` elements; ``at`` its place in the
    group): the means into ``means``, then the rstds into ``rstds`` (``squares`` a float64 row),
    the sums the composed statistics took. A pass runs every row of the group before the next starts,
    so the rows' dependent chains (a sum, a division, a square root) overlap."""
    add, total = row_lanes("row", "size")
    add_squares, squares = row_lanes("squares", "size")
    return [[add, f"means[at] = {total} / size"],
            ["mean = means[at]", "for c in range(size):", "    deviation = np.float64(row[c]) - mean",
             "    squares[c] = deviation * deviation",
             add_squares, f"rstds[at] = 1.0 / math.sqrt({squares} / size + {eps!r})"]]


def _row_groups(parallel: bool, scratch: list[str], passes: list[list[str]], blocked: bool = False,
                setup: tuple[str, ...] = ()) -> list[str]:
    """The loop over x's rows (``rows``): in ROW_BLOCKS blocks (``blocks``) when ``parallel`` (a
    prange) or ``blocked``, each block allocating the float64 rows ``scratch`` (of ``size``) and a
    group's ``means`` and ``rstds`` once, then running ``setup``; within a block, groups of
    ROW_GROUP rows, each of ``passes`` over the group's rows (r, and ``at`` = r's place in the
    group, ``row`` = x[r]) in turn."""
    allocate = ([f"{name} = np.empty(size, np.float64)" for name in scratch]
                + [f"{name} = np.empty({ROW_GROUP}, np.float64)" for name in ("means", "rstds")] + list(setup))
    group = [f"for first in range(start, stop, {ROW_GROUP}):", f"    last = min(first + {ROW_GROUP}, stop)"]
    for body in passes:
        group += ["    for r in range(first, last):", "        at = r - first", "        row = in0[r]"]
        group += ["        " + line for line in body]
    if not (parallel or blocked):
        return allocate + ["start, stop = 0, rows"] + group
    return [f"for block in {'prange' if parallel else 'range'}(blocks):"] + ["    " + line for line in allocate + [
        "start, stop = block * rows // blocks, (block + 1) * rows // blocks"] + group]


def _cpu_layer_norm(attrs, ins, out):
    """One kernel: each row's statistics, then its normalized, scaled and shifted elements."""
    x = ins[0]
    parallel = policy.parallel("elementwise", x.numel) and x.shape[0] > 1
    weight, bias = attrs["weight"], attrs["bias"]
    value = "(row[c] - centre) * scale" + (" * in1[c]" if weight else "") + (f" + in{1 + weight}[c]" if bias else "")
    passes = _stats_passes(float(attrs["eps"])) + [
        ["centre = np.float32(means[at])", "scale = np.float32(rstds[at])", "for c in range(size):",
         f"    out0[r, c] = {value}"]]
    arguments = ", ".join(["in0"] + [f"in{1 + k}" for k in range(weight + bias)] + ["out0"])
    lines = [njit_decorator(parallel), f"def kernel({arguments}):", "    rows, size = in0.shape[0], in0.shape[1]"]
    if parallel:
        lines.append(f"    blocks = min(rows, {ROW_BLOCKS})")
    return "\n".join(lines + ["    " + line for line in _row_groups(parallel, ["squares"], passes)]) + "\n"


def _cpu_layer_norm_grad(attrs, ins, out):
    """One kernel: each row's statistics, its two sums and dx (packed after dweight and dbias), and
    its terms of dweight and dbias added into its block's partial sums; then the partials added in
    block order."""
    x = ins[0]
    parallel = policy.parallel("elementwise", x.numel) and x.shape[0] > 1
    weight, grad_input, grad_affine = attrs["weight"], attrs["grad_input"], attrs["grad_affine"]
    gw = "gv * np.float64(in2[c])" if weight else "gv"
    passes = _stats_passes(float(attrs["eps"]))
    terms = ["gv = np.float64(grow[c])", "xhat = (np.float64(row[c]) - mean) * rstd"]
    affine = ["wpart[c] += gv * xhat", "bpart[c] += gv"] if grad_affine else []
    body = ["grow = in1[r]", "mean = means[at]", "rstd = rstds[at]", "for c in range(size):"]
    scratch = ["squares"]
    if grad_input:
        add_terms, total = row_lanes("terms", "size")
        add_products, products = row_lanes("products", "size")
        body += ["    " + line for line in terms + [f"gw = {gw}", "terms[c] = gw", "products[c] = gw * xhat"] + affine]
        body += [add_terms, f"a = {total} / size", add_products, f"b = {products} / size",  # then dx, gw from terms
                 "for c in range(size):", "    xhat = (np.float64(row[c]) - mean) * rstd",
                 f"    out0[{'2 * size + ' if grad_affine else ''}r * size + c] = "
                 "np.float32(rstd * ((terms[c] - a) - xhat * b))"]
        scratch += ["terms", "products"]
    else:
        body += ["    " + line for line in terms + affine]
    passes.append(body)
    lines = ["rows, size = in0.shape[0], in0.shape[1]", f"blocks = min(rows, {ROW_BLOCKS})"]
    setup: tuple[str, ...] = ()
    if grad_affine:
        lines.append("partial = np.zeros((blocks, 2, size), np.float64)")
        setup = ("wpart = partial[block, 0]", "bpart = partial[block, 1]")
    lines += _row_groups(parallel, scratch, passes, blocked=grad_affine, setup=setup)
    if grad_affine:  # the blocks' partial sums in block order (the same bits at any thread count)
        lines += ["for c in range(size):", "    wsum = 0.0", "    bsum = 0.0", "    for block in range(blocks):",
                  "        wsum += partial[block, 0, c]", "        bsum += partial[block, 1, c]",
                  "    out0[c] = np.float32(wsum)", "    out0[size + c] = np.float32(bsum)"]
    arguments = "in0, in1, in2, out0" if weight else "in0, in1, out0"
    return "\n".join([njit_decorator(parallel), f"def kernel({arguments}):"] + ["    " + line for line in lines]) + "\n"


# ------------------------------------------------------------------ cuda kernels
class _OneGroup:
    """A layer_norm op's CudaNode as group_norm's renderers read it: x (rows, L) is rows samples of L
    channels with one group (each channel one element), its weight and bias one value a channel."""

    def __init__(self, op) -> None:
        self._op = op

    def __getattr__(self, name: str):
        return getattr(self._op, name)

    @property
    def attrs(self) -> dict:
        return {**self._op.attrs, "groups": 1}


def _cuda_layer_norm(op):
    return _cuda_group_norm(_OneGroup(op))


def _cuda_layer_norm_grad(op):
    return _cuda_group_norm_grad(_OneGroup(op), affine_first=True)


# ------------------------------------------------------------------ the ops
define_op(
    name="layer_norm",
    arity=None,
    infer=_infer_layer_norm,
    reference=_reference_layer_norm,
    lowering=Lowering("row", cpu=_cpu_layer_norm, cuda=_cuda_layer_norm),
    vjp=vjp_layer_norm,
    attr_names=("eps", "weight", "bias"),
    doc="`%4 = layer_norm[bias=True, eps=1e-05, weight=True] %x, %w, %b : f32[512,64]`: torch's layer_norm "
        "of each row of x (rows, L), times weight (L,) plus bias (L,) when present (their attrs say which "
        "operands follow x); float64 statistics.",
)

define_op(
    name="layer_norm_grad",
    arity=None,
    infer=_infer_layer_norm_grad,
    reference=_reference_layer_norm_grad,
    lowering=Lowering("row", cpu=_cpu_layer_norm_grad, cuda=_cuda_layer_norm_grad),
    no_vjp="built only by layer_norm's VJP (bendc has no create_graph)",
    attr_names=("eps", "weight", "grad_input", "grad_affine"),
    doc="`%9 = layer_norm_grad[eps=1e-05, grad_affine=True, grad_input=True, weight=True] %x, %g, %w "
        ": f32[32896]`: layer_norm's VJP by PyTorch's formula, the statistics recomputed from x; packed flat: "
        "dweight and dbias (grad_affine), then dx (grad_input).",
)
