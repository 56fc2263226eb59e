"""The rotary embedding (rope).

(This module also held layer norm's composed statistics, norm_mean and norm_rstd, until layer norm
became two fused ops of its own: bendc/ops/layer_norm.py says why.)

rope is a row op, not an elementwise one: the elementwise renderer reads each
operand at the cell's own (broadcast) index, and a rotary output reads its
partner half a row away. Its CPU kernel is one cell per row of the last dim;
on cuda it is one thread per output element, which reads its partner
(no row loop: every element is independent once the partner is known). Its
VJP is the inverse rotation, ``rope[inverse=True]``, and gradients for cos
and sin (when they are leaves) are elementwise products of ``index`` views of
the halves, summed over the leading dims by autodiff's ``sum_to_size``.
"""
from __future__ import annotations

import numpy as np

from bendc.kernels import cuda_kit as kit
from bendc.kernels import cpu_policy as policy
from bendc.kernels.cpu_kit import njit_decorator
from bendc.ops.base import InferError, Lowering, define_op, require_float


# ------------------------------------------------------------------ rope
def _infer_rope(types, attrs):
    x, cos, sin = types
    require_float(types, "rope")
    if not isinstance(attrs["inverse"], bool):
        raise InferError(f"rope inverse must be True or False, got {attrs['inverse']!r}")
    if x.ndim < 2 or x.shape[-1] % 2:
        raise InferError(f"rope needs x of shape (..., t, 2*half), got {x}")
    table = (x.shape[-2], x.shape[-1] // 2)
    if cos.shape != table or sin.shape != table:
        raise InferError(f"rope needs cos and sin of shape [{table[0]},{table[1]}] (t, half) for x {x}, "
                         f"got {cos} and {sin}")
    return x


def _reference_rope(values, attrs):
    x, cos, sin = values
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    if attrs["inverse"]:
        zero = np.float32(0.0)
        first, second = (x1 * cos + x2 * sin) + zero, (x2 * cos - x1 * sin) + zero
    else:
        first, second = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    return np.concatenate([first, second], axis=-1).astype(np.float32)


def _halves(b, value: int) -> tuple[int, int]:
    """Views of the first and second half of the last dim."""
    shape = b.shape(value)
    half = shape[-1] // 2
    lead = tuple((0, d, 1) for d in shape[:-1])
    return (b.emit("index", (value,), spec=lead + ((0, half, 1),)),
            b.emit("index", (value,), spec=lead + ((half, 2 * half, 1),)))


def vjp_rope(b, node, grad, needs):
    """d rope(x) = the inverse rotation of g; d cos = g1*x1 + g2*x2; d sin = g2*x1 - g1*x2 (negated
    for the inverse), summed over the leading dims by autodiff's sum_to_size."""
    x, cos, sin = node.inputs
    inverse = node.attr["inverse"]
    grad_x = b.emit("rope", (grad, cos, sin), inverse=not inverse) if needs[0] else None
    grad_cos = grad_sin = None
    if needs[1] or needs[2]:
        g1, g2 = _halves(b, grad)
        x1, x2 = _halves(b, x)
        if needs[1]:
            grad_cos = b.add(b.mul(g1, x1), b.mul(g2, x2))
        if needs[2]:
            grad_sin = b.sub(b.mul(g1, x2), b.mul(g2, x1)) if inverse else b.sub(b.mul(g2, x1), b.mul(g1, x2))
    return (grad_x, grad_cos, grad_sin)


def _cpu_rope(attrs, ins, out):
    """One cell per row of the last dim: each output pair reads its partner element. The loops run
    over x's own axes (its strides: the attention layout's transposed q and k are not copied), the
    pair loop over a literal half that LLVM unrolls, so the row loop vectorizes; inputs with rows
    longer than ROPE_STRIDED_HALF pairs are copied contiguous first. Measured (1 thread, x a
    transposed (4, 4, 64, D) view): D=16 23 -> 11 us, D=32 52 -> 44 us (the copy and a flat row
    loop before)."""
    x = ins[0]
    half = x.shape[-1] // 2
    parallel = policy.parallel("rows", x.numel) and x.numel // max(x.shape[-1], 1) > 1
    lead = [f"i{axis}" for axis in range(x.ndim - 2)] + ["t"]
    # the parallel loop: the first axis of more than one row
    parallel_axis = next((axis for axis, size in enumerate(x.shape[:-1]) if size > 1), 0) if parallel else None
    if attrs["inverse"]:
        # PyTorch's slice backward accumulates each half into +0.0 words: -0.0 becomes +0.0.
        first = "(a * c + p * s) + np.float32(0.0)"
        second = "(p * c - a * s) + np.float32(0.0)"
    else:
        first, second = "a * c - p * s", "p * c + a * s"
    cell, partner = ", ".join(lead + ["j"]), ", ".join(lead + [f"j + {half}"])
    lines = []
    for axis, name in enumerate(lead):
        loop = "prange" if axis == parallel_axis else "range"
        lines.append("    " * (axis + 1) + f"for {name} in {loop}(x.shape[{axis}]):")
    inner = "    " * (len(lead) + 1)
    lines += [inner + f"for j in range({half}):"] + [inner + "    " + line for line in (
        f"a = x[{cell}]", f"p = x[{partner}]", "c = cos[t, j]", "s = sin[t, j]",
        f"out[{cell}] = {first}", f"out[{partner}] = {second}")]
    copy = "in0" if half <= ROPE_STRIDED_HALF else "np.ascontiguousarray(in0)"  # (no copy when it already is)
    return (
        njit_decorator(parallel) + "\n"
        "def _rows(x, cos, sin, out):\n" + "\n".join(lines) + "\n\n\n"
        "def kernel(in0, in1, in2, out0):\n"
        f"    _rows({copy}, np.ascontiguousarray(in1), np.ascontiguousarray(in2), out0)\n"
    )


# rope rows of up to this many pairs are read in place through x's strides; longer ones are copied
# contiguous first (D=64 from a transposed view: 44 us in place, 37 us copied, 4 x 4 x 64 rows)
ROPE_STRIDED_HALF = 16


def _cuda_rope(op):
    """rope on cuda: one thread per output element (grid-stride), which reads its own element and
    its partner half a row away; x, cos and sin are read through their strides. The products and
    the sum are the CPU kernel's, in the same order, so the results agree bit for bit."""
    shape = op.shape
    half = shape[-1] // 2
    split, names = kit.unflatten("cell", shape, "o")
    column, position = names[-1], names[-2]
    partner = list(names[:-1]) + ["partner"]
    if op.attrs["inverse"]:
        # PyTorch's slice backward accumulates each half into +0.0 words: -0.0 becomes +0.0.
        first, second = "(own * cs + other * sn) + np.float32(0.0)", "(own * cs - other * sn) + np.float32(0.0)"
    else:
        first, second = "own * cs - other * sn", "own * cs + other * sn"
    body = [f"j = {column}",
            f"partner = {column} + {half}",
            f"if {column} >= {half}:",
            f"    j = {column} - {half}",
            "    partner = j",
            f"own = {op.read(0, names)}",
            f"other = {op.read(0, partner)}",
            f"cs = {op.read(1, [position, 'j'])}",
            f"sn = {op.read(2, [position, 'j'])}",
            f"if {column} < {half}:",
            f"    out0[cell] = {first}",
            "else:",
            f"    out0[cell] = {second}"]
    body = kit.used(split, body) + body
    cells = op.node.type.numel
    direction = "inverse rotation" if op.attrs["inverse"] else "rotation"
    source = kit.kernel_source("kernel", op.arguments, kit.grid_stride_loop(op.count(cells), body),  # length_of
                              f"rope ({direction}): one output element per thread, reading its partner.")
    return kit.Kernels(f"rope {direction} of [{','.join(map(str, shape))}] by ({shape[-2]}, {half}) tables",
                      source, [kit.grid_stride_launch("kernel", cells)])


define_op(
    name="rope",
    arity=3,
    infer=_infer_rope,
    reference=_reference_rope,
    lowering=Lowering("row", cpu=_cpu_rope, cuda=_cuda_rope),
    vjp=vjp_rope,
    attr_names=("inverse",),
    doc="`%3 = rope[inverse=False] %x, %cos, %sin : f32[2,8,16]`: x (..., t, 2*half) rotated by the (t, half) "
        "tables: cat(x1*cos - x2*sin, x2*cos + x1*sin); inverse=True rotates back "
        "(cat(x1*cos + x2*sin, x2*cos - x1*sin)), as rope's VJP.",
)
