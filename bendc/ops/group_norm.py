"""Group norm as two fused ops: ``group_norm`` (the forward) and ``group_norm_grad`` (PyTorch's
native_group_norm_backward).

How F.group_norm uses them (x (N, C, *), G groups of D = C/G channels, S spatial elements, so
each (sample, group) row holds L = D*S elements)::

    %3 = group_norm[bias=True, eps=1e-05, groups=2, weight=True] %x, %w, %b     : f32[64,8,16,16]
    %9 = group_norm_grad[eps=1e-05, grad_affine=True, grad_input=True, groups=2, weight=True]
             %x, %g, %w                                                          : f32[131088]
    %10 = index[spec=((0,131072,1),)] %9 ; %11 = reshape[shape=(64,8,16,16)] %10  dx
    %12 = index[spec=((131072,131080,1),)] %9                                    dweight
    %13 = index[spec=((131080,131088,1),)] %9                                    dbias

The forward saves nothing: the backward recomputes each row's mean and rstd from x (L elements,
4 KiB at the example's 1024: the row is in L1 while the kernel works on it). A kernel step has
one output, so the backward packs what its kernel writes into one flat value, dx (when x needs a
gradient) then dweight and dbias (when either needs one: both come from the same per-channel
sums), and free views take it apart (``index`` of a slice, ``reshape`` of a dense slice), as
attention_tiled_grad packs dq|dk|dv. One op rather than two (dx, and dweight|dbias) because both
need the same per-(sample, channel) sums ds = sum_s dy*x and db = sum_s dy: split, a second
kernel would read x and dy again and recompute them.

Why fused ops and no longer composed statistics (layer norm's norm_mean and norm_rstd, until layer
norm became fused ops too: bendc/ops/layer_norm.py): in examples/cnn.py's step the composed group
norm (norm_mean, norm_rstd, a normalize-and-affine kernel, and autodiff's backward: four kernels
with sum_to_size epilogues, one dependent float64 add per array cell) took 1.67 ms of a 4.1 ms
step, against torch's 0.07 ms forward and 0.16 ms backward per layer. The fused kernels read each
L1-resident row once for the statistics and once for the output (the backward once more for the
per-channel sums): 0.45 ms in all, the step 2.7 ms (1 thread, minima of ``step.profile``;
bench/run.py --only cnn --threads 1: bendc 5.9 -> 3.6 ms, torch eager 4.4 ms).

Numbers. Everything inside a row is float64, rounded once to float32 per output element:
- the statistics, in one pass: with d = x - x0 (x0 the row's first element), S1 = sum(d) and
  S2 = sum(d*d); mean = x0 + S1/L, var = (S2 - S1*(S1/L))/L (at least 0), rstd = 1/sqrt(var + eps).
  The shift keeps the cancellation small: (x0 - mean)^2 <= L*var, so var's relative error is at
  most ~1e-16 * L^2 / LANES (1e-12 at the example's L = 1024), far below float32's rounding; the
  second pass a centered variance needs cost ~15% of the kernels. Each sum runs LANES
  independent partial sums (lane k takes elements k, k+LANES, ... of the full blocks; the tail
  past the last full block one more sum) added in lane order: LLVM vectorizes the lanes, and
  the result does not depend on the thread count;
- the forward: y = (x - mean) * (rstd * w[c]) + b[c] (without weight the scale is rstd, without
  bias nothing is added);
- the backward, PyTorch's formula: per channel ds = sum_s dy*x, db = sum_s dy (lanes); per row,
  with sdw = sum_c ds*w and sbw = sum_c db*w in channel order,
  bc = (sbw*mean - sdw) * rstd^3 / L, cc = -bc*mean - sbw*rstd/L,
  dx = (rstd*w[c]) * dy + bc * x + cc; dweight[c] = sum_n (ds - db*mean) * rstd and
  dbias[c] = sum_n db, in sample order.
PyTorch computes the same formulas in float32 (ds - db*mean cancels catastrophically where a
group is nearly constant, and its forward's x*scale + (b - scale*mean) likewise): bendc's results
are at least as close to the exact (float64) ones as PyTorch's and, on ordinary data, within the
usual tolerances of PyTorch's (tests/ops/test_group_norm.py). The reference interpreter computes
the same float64 sums in the same order, so the cpu kernels match it bit for bit.

On cuda each op is one block per row: float64 partial sums combined in a shared-memory tree
(``.f64`` on purpose: tests/cuda/test_ptx.py allows it for these ops), the variance centered
(a second tree over (x - mean)^2), so results agree with the reference to
float64 rounding (tests use the usual tolerances). The backward's dweight and
dbias are a second kernel, one block per channel, each thread summing over samples (recomputing
its row's statistics and the channel's two sums), combined in a tree: no atomics, a fixed order.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from bendc.ir.types import TensorType, numel
from bendc.kernels import cuda_kit as kit
from bendc.kernels.access import reshaped
from bendc.kernels import cpu_policy as policy
from bendc.kernels.cpu_kit import njit_decorator
from bendc.ops.base import InferError, Lowering, define_op, require_float

# Independent partial sums per row statistic: 32 float64 lanes are four AVX-512 vectors (on the
# example's rows of 1024, 32 lanes ran ~2x faster than 8 scalar ones, 64 no faster than 32).
LANES = 32
# The kernels' first line: the lane count (their argument lane_count, LANES) bound to a name whose
# every binding is non-negative, so the native translator indexes ``row[block * lanes + k]`` without
# numba's negative-index wraparound (a parameter may be anything): with it the lane loops read x
# through gathers (group_norm_grad of (64, 8, 16, 16), 2 groups: 208 -> 139 us alone; the tail loops
# start at length // lanes * lanes for the same reason: a difference may be negative).
LANE_COUNT = "    lanes = max(lane_count, 1)"


# ------------------------------------------------------------------ shapes
def _geometry(shape: tuple[int, ...], groups: int) -> tuple[int, int, int, int]:
    """(rows N*G, channels per group D, spatial S, row length L = D*S)."""
    spatial = numel(shape[2:])
    per_group = shape[1] // groups
    return shape[0] * groups, per_group, spatial, per_group * spatial


def _check_attrs(x, attrs, op: str) -> None:
    groups, eps = attrs["groups"], attrs["eps"]
    if x.ndim < 2:
        raise InferError(f"{op} needs x of shape (N, C, *), got {x}")
    if not isinstance(groups, int) or isinstance(groups, bool) or groups <= 0 or x.shape[1] % groups:
        raise InferError(f"{op} groups {groups!r} must be a positive int dividing the {x.shape[1]} channels of {x}")
    if not isinstance(eps, float):
        raise InferError(f"{op} eps must be a float, got {eps!r}")


def _check_affine(x, affine, what: Sequence[str], op: str) -> None:
    for t, name in zip(affine, what):
        if t.shape != (x.shape[1],):
            raise InferError(f"{op} {name} must be of shape [{x.shape[1]}] (one per channel of {x}), got {t}")


def _affine_names(attrs) -> list[str]:
    return [name for name in ("weight", "bias") if attrs[name]]


def _infer_group_norm(types, attrs):
    return infer_affine_norm(types, attrs, "group_norm", _check_attrs)


def infer_affine_norm(types, attrs, op: str, check_attrs) -> TensorType:
    """The type of a norm of x (N, C, *) with optional weight and bias operands (attrs ``weight``,
    ``bias``): x's, its operands checked (group_norm, batch_norm)."""
    require_float(types, op)
    names = _affine_names(attrs)
    if len(types) != 1 + len(names):
        raise InferError(f"{op} takes x{''.join(', ' + n for n in names)}: {1 + len(names)} operands, "
                         f"got {len(types)}")
    x = types[0]
    check_attrs(x, attrs, op)
    _check_affine(x, types[1:], names, op)
    return x


def grad_size(shape: tuple[int, ...], attrs) -> int:
    """Elements of group_norm_grad's packed result: dx (if grad_input), then dweight and dbias."""
    return (numel(shape) if attrs["grad_input"] else 0) + (2 * shape[1] if attrs["grad_affine"] else 0)


def _infer_group_norm_grad(types, attrs):
    return infer_packed_grad(types, attrs, "group_norm_grad", _check_attrs)


def infer_packed_grad(types, attrs, op: str, check_attrs) -> TensorType:
    """The type of a packed norm gradient (x, g, weight?) -> flat (grad_size), its operands checked."""
    require_float(types, op)
    if len(types) != 2 + bool(attrs["weight"]):
        raise InferError(f"{op} takes x, g{', w' if attrs['weight'] else ''}, got {len(types)} operands")
    x, g = types[0], types[1]
    check_attrs(x, attrs, op)
    if g.shape != x.shape:
        raise InferError(f"{op} gradient {g} must have the shape of x {x}")
    _check_affine(x, types[2:], ["weight"], op)
    if not (attrs["grad_input"] or attrs["grad_affine"]):
        raise InferError(f"{op} computes nothing (grad_input and grad_affine are both False)")
    return x.with_shape((grad_size(x.shape, attrs),))


# ------------------------------------------------------------------ reference semantics
def lane_sum(a: np.ndarray) -> np.ndarray:
    """Sum over the last axis (float64) in the kernels' order: LANES sequential partial sums (lane k
    takes elements k, k + LANES, ... of the full blocks of LANES), added in lane order, then the
    sequential sum of the elements past the last full block."""
    length = a.shape[-1]
    full = length - length % LANES
    lanes = np.zeros(a.shape[:-1] + (LANES,))
    for start in range(0, full, LANES):
        lanes += a[..., start:start + LANES]
    tail = np.zeros(a.shape[:-1])
    for i in range(full, length):
        tail += a[..., i]
    total = np.zeros(a.shape[:-1])
    for k in range(LANES):
        total += lanes[..., k]
    return total + tail


def _row_stats(x: np.ndarray, groups: int, eps: float):
    """x (N, C, *) -> rows (N, G, D, S) in float64, mean and rstd (N, G, 1, 1): one pass of sums
    of d and d*d, d = x - x0 (x0 the row's first element), as the cpu kernels."""
    batch, channels = x.shape[:2]
    rows = np.asarray(x, np.float64).reshape(batch, groups, channels // groups, numel(x.shape[2:]))
    length = rows.shape[2] * rows.shape[3]
    flat = rows.reshape(batch, groups, length)
    shift = flat[..., 0] if length else np.zeros((batch, groups))
    deviation = flat - shift[..., None]
    total, squares = lane_sum(deviation), lane_sum(deviation * deviation)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = shift + total / length
        variance = (squares - total * (total / length)) / length
        variance = np.where(variance < 0.0, 0.0, variance)
        rstd = 1.0 / np.sqrt(variance + eps)
    return rows, mean[..., None, None], rstd[..., None, None]


def _per_channel(v: np.ndarray | None, groups: int, channels: int) -> np.ndarray | None:
    return None if v is None else np.asarray(v, np.float64).reshape(1, groups, channels // groups, 1)


def _reference_group_norm(values, attrs):
    x = values[0]
    groups = attrs["groups"]
    affine = dict(zip(_affine_names(attrs), values[1:]))
    rows, mean, rstd = _row_stats(x, groups, attrs["eps"])
    weight, bias = (_per_channel(affine.get(n), groups, x.shape[1]) for n in ("weight", "bias"))
    scale = rstd if weight is None else rstd * weight
    y = (rows - mean) * scale
    if bias is not None:
        y = y + bias
    return y.astype(np.float32).reshape(x.shape)


def _reference_group_norm_grad(values, attrs):
    x, g = values[0], values[1]
    groups = attrs["groups"]
    batch, channels = x.shape[:2]
    rows, mean, rstd = _row_stats(x, groups, attrs["eps"])
    dy = np.asarray(g, np.float64).reshape(rows.shape)
    length = rows.shape[2] * rows.shape[3]
    w = (np.ones((1, groups, channels // groups, 1)) if not attrs["weight"]
         else _per_channel(values[2], groups, channels))
    ds = lane_sum(dy * rows)[..., None]  # (N, G, D, 1)
    db = lane_sum(dy)[..., None]
    sdw = np.zeros((batch, groups, 1, 1))
    sbw = np.zeros((batch, groups, 1, 1))
    for j in range(channels // groups):  # in channel order, as the kernels
        sdw = sdw + ds[:, :, j:j + 1] * w[:, :, j:j + 1]
        sbw = sbw + db[:, :, j:j + 1] * w[:, :, j:j + 1]
    parts = []
    with np.errstate(divide="ignore", invalid="ignore"):
        if attrs["grad_input"]:
            bc = (sbw * mean - sdw) * rstd * rstd * rstd / length
            cc = -bc * mean - sbw * rstd / length
            dx = (rstd * w) * dy + bc * rows + cc
            parts.append(dx.astype(np.float32).reshape(-1))
        if attrs["grad_affine"]:
            dweight = np.zeros(channels)
            dbias = np.zeros(channels)
            terms = ((ds - db * mean) * rstd).reshape(batch, channels)
            for n in range(batch):  # in sample order, as the kernels
                dweight = dweight + terms[n]
                dbias = dbias + db.reshape(batch, channels)[n]
            parts += [dweight.astype(np.float32), dbias.astype(np.float32)]
    return np.concatenate(parts)


# ------------------------------------------------------------------ VJP
def vjp_group_norm(b, node, grad, needs):
    """One group_norm_grad (dx, and dweight|dbias where either is needed), taken apart by views."""
    return packed_affine_vjp(b, node, grad, needs, "group_norm_grad", groups=node.attr["groups"])


def packed_affine_vjp(b, node, grad, needs, grad_op: str, affine_first: bool = False, **attrs):
    """The VJP of a norm op over x (N, C, *) with optional weight and bias operands (attrs ``weight``,
    ``bias``, ``eps``): one ``grad_op`` of (x, g, weight?) whose flat result packs dx (grad_input)
    then dweight and dbias (grad_affine), or with ``affine_first`` dweight and dbias then dx,
    taken apart by views (group_norm, batch_norm; layer_norm affine first)."""
    x = node.inputs[0]
    names = _affine_names(node.attr)
    positions = {name: 1 + k for k, name in enumerate(names)}
    grad_input = bool(needs[0])
    grad_affine = any(needs[positions[n]] for n in names)
    if not (grad_input or grad_affine):
        return (None,) * len(node.inputs)
    weight = node.attr["weight"]
    operands = (x, grad) + ((node.inputs[positions["weight"]],) if weight else ())
    packed = b.emit(grad_op, operands, **attrs, eps=node.attr["eps"], weight=weight, grad_input=grad_input,
                    grad_affine=grad_affine)
    shape = b.shape(x)
    cells, channels = numel(shape), shape[1]
    grads: list[int | None] = [None] * len(node.inputs)
    start = 0
    if grad_input:
        first = 2 * channels if affine_first and grad_affine else 0
        start = 0 if affine_first else cells
        dense = packed if not grad_affine else b.emit("index", (packed,), spec=((first, first + cells, 1),))
        grads[0] = b.reshape(dense, shape)
    for k, name in enumerate(("weight", "bias")):
        if name in positions and needs[positions[name]]:
            offset = start + k * channels
            grads[positions[name]] = b.emit("index", (packed,), spec=((offset, offset + channels, 1),))
    return tuple(grads)


# ------------------------------------------------------------------ CPU kernels
def _lane_lines(names: list[str], terms: list[str], length: str, indent: str) -> list[str]:
    """Source lines summing ``terms`` (expressions of ``i``) over ``range(length)`` into ``names``
    (float64) in lane_sum's order, the lanes of the k-th sum in the row's array ``lanes_k``
    (allocated once per row, _row_lines). The lane count ``lanes`` is the kernel's argument (LANE_COUNT), not a
    literal: LLVM would unroll a literal 32-trip loop before its loop vectorizer runs (numba leaves
    the SLP vectorizer off), and the scalar code is ~2x slower."""
    lines = lane_start(names) + lane_add(names, terms, length) + lane_finish(names)
    return [indent + line for line in lines]


def lane_start(names: list[str]) -> list[str]:
    """The sums' lanes (``lanes_k``, allocated by the caller) and tails zeroed."""
    return (["for k in range(lanes):"] + [f"    lanes_{k}[k] = 0.0" for k in range(len(names))]
            + [f"{name}_tail = 0.0" for name in names])


def lane_add(names: list[str], terms: list[str], length: str) -> list[str]:
    """``terms`` (expressions of ``i``) over ``range(length)`` added into the lanes (the full blocks
    of ``lanes``) and the tails (the rest); a caller may add several runs into the same lanes (batch
    norm: each sample's run of a channel)."""
    return ([f"for block in range({length} // lanes):", "    base = block * lanes", "    for k in range(lanes):",
             "        i = base + k"]
            + [f"        lanes_{k}[k] += {term}" for k, term in enumerate(terms)]
            + [f"for i in range({length} // lanes * lanes, {length}):"]
            + [f"    {name}_tail += {term}" for name, term in zip(names, terms)])


def lane_finish(names: list[str]) -> list[str]:
    """Each sum: its lanes added in lane order, then its tail."""
    return ([f"{name} = 0.0" for name in names] + ["for k in range(lanes):"]
            + [f"    {name} += lanes_{k}[k]" for k, name in enumerate(names)]
            + [f"{name} += {name}_tail" for name in names])


def _row_lines(parallel: bool, sums: int) -> list[str]:
    """The loop over (sample, group) rows and what each row starts with: its group, its elements
    as ``row`` and ``sums`` lane arrays (a local array: LLVM knows it aliases nothing, so the lane
    loops vectorize without runtime alias checks; once per row, as an allocation per channel cost
    more than the sums)."""
    return ([f"    for r in {'prange' if parallel else 'range'}(x2.shape[0]):", "        g = r % groups",
             "        row = x2[r]"] + [f"        lanes_{k} = np.empty(lanes)" for k in range(sums)])


def _stats_lines(indent: str) -> list[str]:
    """Row r's mean and rstd (float64) from ``row`` (x[r] flat, ``size`` elements), _row_stats's
    single pass."""
    d = "(np.float64(row[i]) - shift)"
    return ([f"{indent}shift = np.float64(row[0]) if size > 0 else 0.0"]
            + _lane_lines(["total", "squares"], [d, f"{d} * {d}"], "size", indent)
            + [f"{indent}mean = shift + total / size",
               f"{indent}variance = (squares - total * (total / size)) / size",
               f"{indent}if variance < 0.0:", f"{indent}    variance = 0.0",
               f"{indent}rstd = 1.0 / math.sqrt(variance + eps)"])


def _cpu_group_norm(attrs, ins, out):
    """One cell per (sample, group) row: the statistics, then the normalized and scaled row."""
    rows, _, _, _ = _geometry(ins[0].shape, attrs["groups"])
    parallel = policy.parallel("rows", ins[0].numel) and rows > 1
    weight, bias = attrs["weight"], attrs["bias"]
    scale = "rstd * np.float64(w[g * per_group + j])" if weight else "rstd"
    shift = " + shift" if bias else ""
    lines = [njit_decorator(parallel), "def _rows(x3, x2, w, b, y3, groups, eps, lane_count):", LANE_COUNT,
             "    per_group, spatial = x3.shape[1], x3.shape[2]", "    size = x2.shape[1]"] + _row_lines(parallel, 2)
    lines += _stats_lines("        ")
    lines += ["        for j in range(per_group):", f"            scale = {scale}"]
    if bias:
        lines.append("            shift = np.float64(b[g * per_group + j])")
    lines += ["            for s in range(spatial):",
              f"                y3[r, j, s] = np.float32((np.float64(x3[r, j, s]) - mean) * scale{shift})"]
    arguments = ["in0"] + [f"in{1 + k}" for k in range(weight + bias)] + ["out0"]
    w_arg = "np.ascontiguousarray(in1)" if weight else "None"
    b_arg = f"np.ascontiguousarray(in{1 + weight})" if bias else "None"
    return "\n".join(lines) + f'''


def kernel({", ".join(arguments)}):
    x = np.ascontiguousarray(in0)
    groups = {attrs["groups"]}
    rows = x.shape[0] * groups
    per_group = x.shape[1] // groups
    spatial = x.size // max(x.shape[0] * x.shape[1], 1)  # from the shape: one source for every batch size
    _rows(x.reshape((rows, per_group, spatial)), x.reshape((rows, per_group * spatial)), {w_arg}, {b_arg},
          out0.reshape((rows, per_group, spatial)), groups, {float(attrs["eps"])!r}, {LANES})
'''


def _cpu_group_norm_grad(attrs, ins, out):
    """One cell per (sample, group) row: the statistics, each channel's ds and db, then dx; after
    the rows, dweight and dbias summed over the samples in order."""
    rows, _, _, _ = _geometry(ins[0].shape, attrs["groups"])
    parallel = policy.parallel("rows", ins[0].numel) and rows > 1
    weight, grad_input, grad_affine = attrs["weight"], attrs["grad_input"], attrs["grad_affine"]
    wj = "np.float64(w[g * per_group + j])" if weight else "1.0"
    lines = [njit_decorator(parallel), "def _rows(x3, x2, g3, w, dx3, ds, db, stats, groups, eps, lane_count):",
             LANE_COUNT,
             "    per_group, spatial = x3.shape[1], x3.shape[2]", "    size = x2.shape[1]"] + _row_lines(parallel, 2)
    lines += _stats_lines("        ")
    lines += ["        stats[r, 0] = mean", "        stats[r, 1] = rstd",
              "        sdw = 0.0", "        sbw = 0.0", "        for j in range(per_group):",
              "            xs = x3[r, j]", "            gs = g3[r, j]"]
    lines += _lane_lines(["dsj", "dbj"], ["np.float64(gs[i]) * np.float64(xs[i])", "np.float64(gs[i])"], "spatial",
                         "            ")
    lines += ["            ds[r, j] = dsj", "            db[r, j] = dbj", f"            wj = {wj}",
              "            sdw += dsj * wj", "            sbw += dbj * wj"]
    if grad_input:
        lines += ["        bc = (sbw * mean - sdw) * rstd * rstd * rstd / size",
                  "        cc = -bc * mean - sbw * rstd / size",
                  "        for j in range(per_group):",
                  f"            c1 = rstd * {wj}",
                  "            for s in range(spatial):",
                  "                dx3[r, j, s] = np.float32(c1 * np.float64(g3[r, j, s]) + bc * np.float64(x3[r, j, s])"
                  " + cc)"]
    source = "\n".join(lines)
    if grad_affine:
        source += '''


''' + njit_decorator(False) + '''
def _affine(ds, db, stats, groups, dweight, dbias):
    """dweight[c] = sum_n (ds - db * mean) * rstd, dbias[c] = sum_n db: in sample order."""
    per_group = ds.shape[1]
    batch = ds.shape[0] // groups
    for c in range(groups * per_group):
        g = c // per_group
        j = c % per_group
        wsum = 0.0
        bsum = 0.0
        for n in range(batch):
            r = n * groups + g
            wsum += (ds[r, j] - db[r, j] * stats[r, 0]) * stats[r, 1]
            bsum += db[r, j]
        dweight[c] = np.float32(wsum)
        dbias[c] = np.float32(bsum)'''
    arguments = "in0, in1, in2, out0" if weight else "in0, in1, out0"
    w_arg = "np.ascontiguousarray(in2)" if weight else "None"
    dx = ("out0[:x.size].reshape((rows, per_group, spatial))" if grad_input
          else "np.empty((0, per_group, spatial), np.float32)")
    cells = "x.size" if grad_input else "0"
    affine = (f"\n    cells = {cells}  # dweight and dbias follow dx\n"
              "    _affine(ds, db, stats, groups, out0[cells:cells + x.shape[1]], out0[cells + x.shape[1]:])"
              if grad_affine else "")
    return source + f'''


def kernel({arguments}):
    x = np.ascontiguousarray(in0)
    groups = {attrs["groups"]}
    rows = x.shape[0] * groups
    per_group = x.shape[1] // groups
    spatial = x.size // max(x.shape[0] * x.shape[1], 1)  # from the shape: one source for every batch size
    ds = np.empty((rows, per_group), np.float64)
    db = np.empty((rows, per_group), np.float64)
    stats = np.empty((rows, 2), np.float64)
    _rows(x.reshape((rows, per_group, spatial)), x.reshape((rows, per_group * spatial)),
          np.ascontiguousarray(in1).reshape((rows, per_group, spatial)), {w_arg}, {dx}, ds, db, stats, groups,
          {float(attrs["eps"])!r}, {LANES}){affine}
'''


# ------------------------------------------------------------------ cuda kernels
def _row_read(op: kit.CudaNode, operand: int, row: str, column: str, prefix: str) -> tuple[list[str], str]:
    """Operand ``operand`` (N, C, *) read at (row = n*G + g, column = j*S + s of the row): one flat
    index where strides describe the (N*G, L) matrix, else the statements splitting it."""
    shape = op.shapes[operand]
    groups = op.attrs["groups"]
    rows, per_group, spatial, length = _geometry(shape, groups)
    matrix = reshaped(op.accesses[operand], shape, (rows, length))
    if matrix is not None:
        return [], f"{op.names[operand]}[{matrix.flat([row, column])}]"
    split = [f"{prefix}n = ({row}) // {groups}",
             f"{prefix}c = ({row}) % {groups} * {per_group} + ({column}) // {spatial}",
             f"{prefix}s = ({column}) % {spatial}"]
    spatial_split, spatial_names = kit.unflatten(f"{prefix}s", shape[2:], f"{prefix}a")
    return split + spatial_split, op.read(operand, [f"{prefix}n", f"{prefix}c"] + spatial_names)


def _strided(index: str, extent, body: list[str], step: str = "BLOCK") -> list[str]:
    """``index`` from the thread's own t up to ``extent`` by ``step``, around ``body``."""
    return [f"{index} = t", f"while {index} < {extent}:"] + ["    " + line for line in body] + [f"    {index} += {step}"]


def _cuda_stats_lines(split: list[str], x: str, length: int | str, eps: float | None,
                      column: str = "c") -> list[str]:
    """The block's row mean, variance and (with ``eps``) rstd in float64 (a shared-memory tree each);
    every thread gets them (group_norm's rows, batch_norm's channels)."""
    return (["total = np.float64(0.0)"] + _strided(column, length, split + [f"total += np.float64({x})"])
            + ["partial[t] = total"] + kit.tree_lines("sum") + [f"mean = partial[0] / {length}", "cuda.syncthreads()",
                                                                  "squares = np.float64(0.0)"]
            + _strided(column, length, split + [f"deviation = np.float64({x}) - mean",
                                                "squares += deviation * deviation"])
            + ["partial[t] = squares"] + kit.tree_lines("sum")
            + [f"variance = partial[0] / {length}"]
            + ([] if eps is None else [f"rstd = 1.0 / math.sqrt(variance + {eps!r})"]) + ["cuda.syncthreads()"])


def _rows_loop(rows: int | str, body: list[str], what: str) -> list[str]:
    return ([f"partial = cuda.shared.array(BLOCK, numba.float64)  # {what}", "t = cuda.threadIdx.x",
             "row = cuda.blockIdx.x", f"while row < {rows}:"]
            + ["    " + line for line in body] + ["    row += cuda.gridDim.x"])


def _cuda_group_norm(op: kit.CudaNode) -> kit.Kernels:
    """One block per (sample, group) row: the statistics (float64 trees), then the row's outputs."""
    attrs = op.attrs
    groups = attrs["groups"]
    rows, per_group, spatial, length = _geometry(op.shapes[0], groups)
    block = kit.tree_block(length)
    split, x = _row_read(op, 0, "row", "c", "x")
    scale = "rstd"
    if attrs["weight"]:
        scale = f"rstd * np.float64({op.read(1, ['channel'])})"
    shift = f" + np.float64({op.read(1 + attrs['weight'], ['channel'])})" if attrs["bias"] else ""
    body = (_cuda_stats_lines(split, x, length, attrs["eps"])
            + _strided("c", length, split + [f"channel = row % {groups} * {per_group} + c // {spatial}",
                                             f"out0[row * {length} + c] = np.float32((np.float64({x}) - mean) * "
                                             f"{scale}{shift})"]))
    source = f"\nBLOCK = {block}\n" + kit.kernel_source(
        "kernel", op.arguments, _rows_loop(op.count(rows, length), body, "the block's partial sums"),  # length_of
        "One block per (sample, group) row: mean and rstd in float64, then the normalized, scaled row.")
    return kit.Kernels(f"group_norm of {rows} rows of {length} (float64 trees)", source,
                       [kit.block_per_row_launch("kernel", rows, block, 8 * block)])


def _cuda_channel_sums(op: kit.CudaNode, row: str, j: str, spatial: int) -> list[str]:
    """ds and db of channel j of ``row`` into partial[0] and second[0] (two trees, one per level)."""
    x_split, x = _row_read(op, 0, row, f"{j} * {spatial} + s", "x")
    g_split, g = _row_read(op, 1, row, f"{j} * {spatial} + s", "g")
    return (["ds = np.float64(0.0)", "db = np.float64(0.0)"]
            + _strided("s", spatial, x_split + g_split + [f"dy = np.float64({g})", f"ds += dy * np.float64({x})",
                                                            "db += dy"])
            + ["partial[t] = ds", "second[t] = db"] + kit.tree_lines("sum", ("partial", "second")))


def _cuda_group_norm_grad(op: kit.CudaNode, affine_first: bool = False) -> kit.Kernels:
    """dx: one block per (sample, group) row (the statistics, each channel's ds and db, then dx);
    dweight and dbias: one block per channel, each thread summing its samples' terms, a tree. The
    packed result holds dx then dweight and dbias, or with ``affine_first`` (layer_norm_grad)
    dweight and dbias then dx."""
    attrs = op.attrs
    groups, eps = attrs["groups"], attrs["eps"]
    shape = op.shapes[0]
    rows, per_group, spatial, length = _geometry(shape, groups)
    batch, channels = shape[0], shape[1]
    weight = (lambda channel: f"np.float64({op.read(2, [channel])})") if attrs["weight"] else (lambda _: "1.0")
    # one block size for both kernels: the dx rows' L elements, and MAX_BLOCK where the affine kernel
    # sums over the samples (kit.sum_block: the batch is read from x's length, so one source serves
    # every batch size)
    block = kit.sum_block(length, attrs["grad_affine"])
    samples = op.count(batch, channels * spatial)  # kit.length_of: x (in0), or out0 without dx
    source, launches = f"\nBLOCK = {block}\n", []
    dx_offset = f"{2 * channels} + " if affine_first and attrs["grad_affine"] else ""
    x_split, x = _row_read(op, 0, "row", "c", "x")
    if attrs["grad_input"]:
        g_split, g = _row_read(op, 1, "row", "c", "g")
        body = (_cuda_stats_lines(x_split, x, length, eps)
                + ["sdw = np.float64(0.0)", "sbw = np.float64(0.0)", f"for j in range({per_group}):"]
                + ["    " + line for line in _cuda_channel_sums(op, "row", "j", spatial)
                   + [f"wj = {weight(f'row % {groups} * {per_group} + j')}",
                      "sdw += partial[0] * wj", "sbw += second[0] * wj", "cuda.syncthreads()"]]
                + [f"bc = (sbw * mean - sdw) * rstd * rstd * rstd / {length}", f"cc = -bc * mean - sbw * rstd / {length}"]
                + _strided("c", length, x_split + g_split + [
                    f"channel = row % {groups} * {per_group} + c // {spatial}",
                    f"c1 = rstd * {weight('channel')}",
                    f"out0[{dx_offset}row * {length} + c] = "
                    f"np.float32(c1 * np.float64({g}) + bc * np.float64({x}) + cc)"]))
        body = (["second = cuda.shared.array(BLOCK, numba.float64)"]
                + _rows_loop(op.count(rows, length), body, "the block's partial sums"))
        source += kit.kernel_source(
            "kernel", op.arguments, body, "One block per (sample, group) row: dx by PyTorch's formula, in float64.")
        launches.append(kit.block_per_row_launch("kernel", rows, block, 16 * block))
    if attrs["grad_affine"]:
        # after dx, or first
        offset = f"samples * {channels * spatial}" if attrs["grad_input"] and not affine_first else "0"
        # each thread: its samples' rows, sequential float64 sums (the row's statistics and the
        # channel's ds, db), the terms summed in its own sample order, then a tree over threads
        r_split, rx = _row_read(op, 0, "r", "k", "x")
        c_split, cx = _row_read(op, 0, "r", "j * %d + s" % spatial, "y")
        c_gsplit, cg = _row_read(op, 1, "r", "j * %d + s" % spatial, "h")
        per_sample = ([f"r = n * {groups} + channel // {per_group}", f"j = channel % {per_group}",
                       "total = np.float64(0.0)", f"for k in range({length}):"]
                      + ["    " + line for line in r_split + [f"total += np.float64({rx})"]]
                      + [f"mean = total / {length}", "squares = np.float64(0.0)", f"for k in range({length}):"]
                      + ["    " + line for line in r_split + [f"deviation = np.float64({rx}) - mean",
                                                              "squares += deviation * deviation"]]
                      + [f"rstd = 1.0 / math.sqrt(squares / {length} + {eps!r})",
                         "ds = np.float64(0.0)", "db = np.float64(0.0)", f"for s in range({spatial}):"]
                      + ["    " + line for line in c_split + c_gsplit + [f"dy = np.float64({cg})",
                                                                         f"ds += dy * np.float64({cx})", "db += dy"]]
                      + ["wsum += (ds - db * mean) * rstd", "bsum += db"])
        body = (["partial = cuda.shared.array(BLOCK, numba.float64)",
                 "second = cuda.shared.array(BLOCK, numba.float64)", "t = cuda.threadIdx.x",
                 f"samples = {samples}", "channel = cuda.blockIdx.x", f"while channel < {channels}:",
                 "    wsum = np.float64(0.0)", "    bsum = np.float64(0.0)"]
                + ["    " + line for line in _strided("n", "samples", per_sample)]
                + ["    partial[t] = wsum", "    second[t] = bsum"]
                + ["    " + line for line in kit.tree_lines("sum", ("partial", "second"))]
                + ["    if t == 0:", f"        out0[{offset} + channel] = np.float32(partial[0])",
                   f"        out0[{offset} + {channels} + channel] = np.float32(second[0])",
                   "    cuda.syncthreads()  # the shared arrays are reused by the block's next channel",
                   "    channel += cuda.gridDim.x"])
        source += kit.kernel_source("affine", op.arguments, body, "One block per channel: dweight and dbias, "
                                    "each thread its samples in order, a float64 tree over the threads.")
        launches.append(kit.block_per_row_launch("affine", channels, block, 16 * block))
    return kit.Kernels(f"group_norm_grad of {rows} rows of {length} (float64 trees)", source, launches)


# ------------------------------------------------------------------ the ops
define_op(
    name="group_norm",
    arity=None,
    infer=_infer_group_norm,
    reference=_reference_group_norm,
    lowering=Lowering("row", cpu=_cpu_group_norm, cuda=_cuda_group_norm),
    vjp=vjp_group_norm,
    attr_names=("groups", "eps", "weight", "bias"),
    doc="`%3 = group_norm[bias=True, eps=1e-05, groups=2, weight=True] %x, %w, %b : f32[64,8,16,16]`: torch's "
        "group_norm of x (N, C, *) over (sample, group of C/groups channels) rows, times weight (C,) plus "
        "bias (C,) when present (their attrs say which operands follow x); float64 statistics.",
)

define_op(
    name="group_norm_grad",
    arity=None,
    infer=_infer_group_norm_grad,
    reference=_reference_group_norm_grad,
    lowering=Lowering("row", cpu=_cpu_group_norm_grad, cuda=_cuda_group_norm_grad),
    no_vjp="built only by group_norm's VJP (bendc has no create_graph)",
    attr_names=("groups", "eps", "weight", "grad_input", "grad_affine"),
    doc="`%9 = group_norm_grad[eps=1e-05, grad_affine=True, grad_input=True, groups=2, weight=True] %x, %g, %w "
        ": f32[131088]`: group_norm's VJP by PyTorch's formula, the statistics recomputed from x; packed flat: "
        "dx (grad_input), then dweight and dbias (grad_affine).",
)
