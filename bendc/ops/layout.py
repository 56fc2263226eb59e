"""Layout ops: reshape, permute, expand, and basic indexing with its scatter."""
from __future__ import annotations

import numpy as np

from bendc.kernels import cpu_policy as policy
from bendc.kernels import cuda_kit as kit
from bendc.kernels.cpu_kit import njit_decorator
from bendc.kernels.access import dense, indexed
from bendc.ops.base import InferError, Lowering, define_op


def _shape_text(shape) -> str:
    return f"[{','.join(map(str, shape))}]"


# ------------------------------------------------------------------ reshape
def _infer_reshape(types, attrs):
    (x,) = types
    shape = tuple(attrs["shape"])
    if any(not isinstance(d, int) or d < 0 for d in shape):
        raise InferError(f"reshape to {_shape_text(shape)}: sizes must be non-negative ints")
    result = x.with_shape(shape)
    if result.numel != x.numel:
        raise InferError(f"cannot reshape {x} ({x.numel} elements) to {_shape_text(shape)}")
    return result


def vjp_reshape(b, node, grad, needs):
    """d reshape(a) = reshape(g, a.shape)."""
    return (b.reshape(grad, b.shape(node.inputs[0])),)


define_op(
    name="reshape",
    arity=1,
    infer=_infer_reshape,
    reference=lambda v, a: np.ascontiguousarray(v[0]).reshape(tuple(a["shape"])),
    lowering=Lowering("layout", cpu=lambda attrs, ins, out: (
        f"def kernel(in0):\n    return in0.reshape({tuple(attrs['shape'])!r})\n")),
    vjp=vjp_reshape,
    attr_names=("shape",),
    doc="`%1 = reshape[shape=(4,8)] %0`: same elements in row-major order.",
)


# ------------------------------------------------------------------ permute
def _infer_permute(types, attrs):
    (x,) = types
    perm = tuple(attrs["perm"])
    if sorted(perm) != list(range(x.ndim)):
        raise InferError(f"permute dims {perm} is not a permutation of the {x.ndim} dims of {x}")
    return x.with_shape(tuple(x.shape[p] for p in perm))


def inverse_permutation(perm) -> tuple[int, ...]:
    inverse = [0] * len(perm)
    for position, axis in enumerate(perm):
        inverse[axis] = position
    return tuple(inverse)


def vjp_permute(b, node, grad, needs):
    """d permute(a, p) = permute(g, inverse(p))."""
    return (b.permute(grad, inverse_permutation(node.attr["perm"])),)


define_op(
    name="permute",
    arity=1,
    infer=_infer_permute,
    reference=lambda v, a: np.ascontiguousarray(np.transpose(v[0], tuple(a["perm"]))),
    lowering=Lowering("layout", cpu=lambda attrs, ins, out: (
        f"def kernel(in0):\n    return in0.transpose({tuple(attrs['perm'])!r})\n")),
    vjp=vjp_permute,
    attr_names=("perm",),
    doc="`%1 = permute[perm=(1,0)] %0 : f32[64,16]`: transpose, .T and permute.",
)


# ------------------------------------------------------------------ expand
def _infer_expand(types, attrs):
    (x,) = types
    shape = tuple(attrs["shape"])
    lead = len(shape) - x.ndim
    if lead < 0 or any(d not in (1, shape[lead + axis]) for axis, d in enumerate(x.shape)):
        raise InferError(f"cannot expand {x} to {_shape_text(shape)}")
    return x.with_shape(shape)


def vjp_expand(b, node, grad, needs):
    """d expand(a) = sum_to_size(g, a.shape)."""
    return (b.sum_to_size(grad, b.shape(node.inputs[0])),)


define_op(
    name="expand",
    arity=1,
    infer=_infer_expand,
    reference=lambda v, a: np.ascontiguousarray(np.broadcast_to(v[0], tuple(a["shape"]))),
    lowering=Lowering("layout", cpu=lambda attrs, ins, out: (
        f"def kernel(in0):\n    return np.broadcast_to(in0, {tuple(attrs['shape'])!r})\n")),
    vjp=vjp_expand,
    attr_names=("shape",),
    doc="`%1 = expand[shape=(32,16)] %0`: broadcast to a shape (PyTorch's expand).",
)


# ------------------------------------------------------------------ basic indexing
def index_key(spec) -> tuple:
    """The numpy key for an index spec: ints stay, (start, stop, step) become slices."""
    return tuple(entry if isinstance(entry, int) else slice(*entry) for entry in spec)


def index_text(spec) -> str:
    """Python index text for a spec, ending in ``...`` so that the result is always an array
    view: ``1, 2:5:1, ...``; ``a[1, ...]`` is a 0-d view where ``a[1]`` would be a numpy scalar."""
    parts = [str(e) if isinstance(e, int) else f"{e[0]}:{e[1]}:{e[2]}" for e in spec]
    return ", ".join(parts + ["..."])


def index_shape(shape, spec) -> tuple[int, ...]:
    """Result shape of basic indexing ``x[spec]``, or InferError."""
    if len(spec) > len(shape):
        raise InferError(f"too many indices ({len(spec)}) for a tensor of {len(shape)} dimensions")
    out = []
    for axis, entry in enumerate(spec):
        size = shape[axis]
        if isinstance(entry, int):
            if not 0 <= entry < size:
                raise InferError(f"index {entry} is out of range for dimension {axis} of size {size}")
            continue
        start, stop, step = entry
        if step <= 0 or not 0 <= start <= size or not 0 <= stop <= size:
            raise InferError(f"slice {entry} is not normalized for dimension {axis} of size {size}")
        out.append(len(range(start, stop, step)))
    return tuple(out) + tuple(shape[len(spec):])


def _infer_index(types, attrs):
    (x,) = types
    return x.with_shape(index_shape(x.shape, attrs["spec"]))


def vjp_index(b, node, grad, needs):
    """d a[spec] = index_scatter(g): g written into +0.0 words of a's shape. A piece of a split keeps
    its split's number (``split``): the pieces' scatters then add up to their concat, as torch's
    split_backward gives (canonicalize's concat_tiling_scatters)."""
    shape = b.shape(node.inputs[0])
    piece = {"split": node.attr["split"]} if "split" in node.attr else {}
    return (b.emit("index_scatter", (grad,), spec=node.attr["spec"], shape=shape, **piece),)


define_op(
    name="index",
    arity=1,
    infer=_infer_index,
    reference=lambda v, a: np.array(v[0][index_key(a["spec"])]),
    lowering=Lowering("layout", cpu=lambda attrs, ins, out: (
        f"def kernel(in0):\n    return in0[{index_text(attrs['spec'])}]\n")),
    vjp=vjp_index,
    attr_names=("spec",),
    doc="`%1 = index[spec=(1,(2,5,1))] %0`: basic indexing; ints drop a dim, (start,stop,step) slice it "
        "(a split's pieces also carry ``split=N``, their split call's number).",
)


def _infer_index_scatter(types, attrs):
    (g,) = types
    shape = tuple(attrs["shape"])
    expected = index_shape(shape, attrs["spec"])
    if g.shape != expected:
        raise InferError(f"index_scatter of {g} into {_shape_text(shape)} needs {_shape_text(expected)}")
    return g.with_shape(shape)


def _reference_index_scatter(values, attrs):
    (g,) = values
    out = np.zeros(tuple(attrs["shape"]), dtype=np.float32)
    out[index_key(attrs["spec"])] = g
    return out


def vjp_index_scatter(b, node, grad, needs):
    """d index_scatter(g) = grad[spec]."""
    return (b.emit("index", (grad,), spec=node.attr["spec"]),)


def _cuda_index_scatter(op):
    """index_scatter on cuda: a ``zero`` kernel, then one source element per thread, stored at its
    place in the output (basic indexing moves the offset and strides)."""
    split, names = kit.unflatten("cell", op.shapes[0], "s")
    target = indexed(dense(op.node.id, op.shape), op.attrs["spec"])
    body = [f"out0[{target.flat(names)}] = {op.read(0, names)}"]
    return kit.scatter_kernels(op, split, body, "stores", checked=False)


define_op(
    name="index_scatter",
    arity=1,
    infer=_infer_index_scatter,
    reference=_reference_index_scatter,
    lowering=Lowering("scatter", cpu=lambda attrs, ins, out: (
        "def kernel(in0, out0):\n"
        "    out0[...] = np.float32(0.0)\n"
        f"    out0[{index_text(attrs['spec'])}] = in0\n"), cuda=_cuda_index_scatter),
    vjp=vjp_index_scatter,
    attr_names=("spec", "shape"),
    doc="`%1 = index_scatter[shape=(4,8), spec=(1,)] %0`: zeros of shape with %0 written at spec (``split=N``: "
        "the VJP of a split's piece).",
)


# ------------------------------------------------------------------ concatenation
def _infer_concat(types, attrs):
    axis = attrs["axis"]
    first = types[0]
    if not 0 <= axis < first.ndim:
        raise InferError(f"concat axis {axis} is out of range for {first}")
    for other in types[1:]:
        if other.dtype != first.dtype or other.ndim != first.ndim or any(
                a != b for position, (a, b) in enumerate(zip(first.shape, other.shape)) if position != axis):
            raise InferError(f"concat along axis {axis} needs operands equal but on that axis: {first}, {other}")
    return first.with_shape(first.shape[:axis] + (sum(t.shape[axis] for t in types),) + first.shape[axis + 1:])


def concat_spec(shapes, axis: int, operand: int) -> tuple:
    """The index spec of operand ``operand``'s part of a concatenation along ``axis``."""
    start = sum(shape[axis] for shape in shapes[:operand])
    full = tuple((0, size, 1) for size in shapes[operand][:axis])
    return full + ((start, start + shapes[operand][axis], 1),)


def vjp_concat(b, node, grad, needs):
    """d concat(a0, a1, ...) = (g[part 0], g[part 1], ...): each operand's part of the gradient."""
    shapes = [b.shape(i) for i in node.inputs]
    return tuple(b.emit("index", (grad,), spec=concat_spec(shapes, node.attr["axis"], k)) if needs[k] else None
                 for k in range(len(shapes)))


def _cpu_concat(attrs, ins, out):
    """concat on the cpu: nested loops copying each operand into its part (a numba kernel: numpy's
    slice assignment copied the attention gradients' transposed heads at ~4.7 GB/s, runs of 32
    floats; the loops ~1.5x faster at one thread), the outermost axis split over the pool where the
    output is large. The loop extents are read from the arrays (one source for every batch size)."""
    axis, ndim = attrs["axis"], out.ndim
    names = [f"in{k}" for k in range(len(ins))]
    parallel = policy.parallel("elementwise", out.numel)
    index = [f"a{d}" for d in range(ndim)]

    def loop(depth: int, array: str, first: bool) -> str:
        kind = "prange" if parallel and first else "range"
        return f"for a{depth} in {kind}({array}.shape[{depth}]):"

    lines = [njit_decorator(parallel), f"def _concat({', '.join(names)}, out0):"]
    indent = "    "
    for depth in range(axis):  # the axes before the concat axis: shared by the operands
        lines.append(indent + loop(depth, "out0", depth == 0))
        indent += "    "
    offset = "0"
    for k, name in enumerate(names):
        inner = indent
        for depth in range(axis, ndim):
            lines.append(inner + loop(depth, name, depth == 0))
            inner += "    "
        target = index[:axis] + [f"{offset} + a{axis}" if k else f"a{axis}"] + index[axis + 1:]
        lines.append(f"{inner}out0[{', '.join(target)}] = {name}[{', '.join(index)}]")
        offset = f"{offset} + {name}.shape[{axis}]" if offset != "0" else f"{name}.shape[{axis}]"
    return "\n".join(lines) + f"""


def kernel({', '.join(names)}, out0):
    _concat({', '.join(names)}, out0)
"""


def _cuda_concat(op):
    """concat on cuda: one output element per thread, read from the operand whose part holds it."""
    axis = op.attrs["axis"]
    split, names = kit.unflatten("cell", op.shape, "o")
    body: list[str] = []
    start = 0
    for k, shape in enumerate(op.shapes):
        index = list(names)
        index[axis] = f"({names[axis]} - {start})" if start else names[axis]
        test = "if" if k == 0 else ("else" if k == len(op.shapes) - 1 else "elif")
        condition = "" if test == "else" else f" {names[axis]} < {start + shape[axis]}"
        body += [f"{test}{condition}:", f"    out0[cell] = {op.read(k, index)}"]
        start += shape[axis]
    body = kit.used(split, body) + body
    cells = int(np.prod(op.shape))
    source = kit.kernel_source("kernel", op.arguments, kit.grid_stride_loop(op.count(cells), body),
                               "concat: one output element per thread, from its operand's part.")
    return kit.Kernels(f"concat into [{','.join(map(str, op.shape))}] along axis {axis}", source,
                       [kit.grid_stride_launch("kernel", cells)])


define_op(
    name="concat",
    arity=None,
    infer=_infer_concat,
    reference=lambda v, a: np.concatenate(v, axis=a["axis"]).astype(np.float32),
    lowering=Lowering("scatter", cpu=_cpu_concat, cuda=_cuda_concat),
    vjp=vjp_concat,
    attr_names=("axis",),
    doc="`%3 = concat[axis=2] %0, %1, %2`: the operands side by side along axis (torch.cat); "
        "canonicalize writes the gradient of slices that tile a tensor as one.",
)
