"""Line reductions other than sums: amax / amin over dims, the full max() / min(), argmax / argmin
along a dim, the ``extremum_mask`` their VJP rules use, and logsumexp. PyTorch's names and semantics:

- NaN propagates: a line holding a NaN has the NaN as its extremum, and argmax / argmin give the
  index of its first NaN (as torch's CPU kernels do).
- Ties: argmax / argmin give the first occurrence.
- Gradients (derivatives.yaml): amax / amin scale the gradient by the count of ties,
  ``(g / mask.sum(dims, keepdim=True)) * mask`` with ``mask = (result == x)`` (a line with a NaN
  gets NaN gradients, as in torch); the full max() / min() distribute it evenly among the ties,
  NaNs included (``evenly_distribute_backward``). ``x.max(dim)`` is no op of its own: the front-end
  gathers x at ``argmax(x, dim)``, so its gradient goes to the chosen element by gather's VJP, as
  torch's ``value_selecting_reduction_backward`` scatters it.

- logsumexp: torch's stable formula, m = amax(x, dims) with infinite maxima replaced by 0, then
  log(sum(exp(x - m))) + m (the sum of exponentials accumulated in float64, rounded once); its
  gradient is torch's logsumexp_backward, ``g * exp(x - result)``.

The ops are not sums, so they declare no ``reduced_axes`` (fusion takes only sums as epilogues).
Every kernel reads its operand as a matrix of lines (the kept axes) by reduced elements (the
reduced axes, row-major), one output element per line: on the CPU a numba loop over lines,
``prange`` when the operand is large (a large operand of few lines: chunks of each line in
parallel, combined in order); on cuda a thread per output element in a grid-stride loop,
or for extrema over lines of TREE_MIN_EXTENT or more elements a block per output element (a
shared-memory tree of (value, index) pairs; for logsumexp trees of the maxima and the sums).
"""
from __future__ import annotations

import numpy as np

from bendc.ir.types import TensorType, numel
from bendc.kernels import cuda_kit as kit
from bendc.kernels import cpu_policy as policy
from bendc.kernels.cpu_kit import REDUCTION_CHUNKS, lane_sum, lines_call, njit_decorator
from bendc.ops.base import InferError, Lowering, broadcast_shapes, define_op, normalize_dims, require_float
from bendc.ops.reduce import TREE_MIN_EXTENT


def keepdim_shape(shape: tuple[int, ...], dims) -> tuple[int, ...]:
    return tuple(1 if axis in dims else d for axis, d in enumerate(shape))


def _reduced_shape(shape, dims, keepdim) -> tuple[int, ...]:
    if keepdim:
        return keepdim_shape(shape, dims)
    return tuple(d for axis, d in enumerate(shape) if axis not in dims)


def extremum_axes(in_shape: tuple[int, ...], attrs) -> tuple[int, ...]:
    """The axes an extremum op reduces: ``dims`` (amax, amin), ``dim`` (argmax, argmin), or all."""
    if "dims" in attrs:
        return tuple(attrs["dims"])
    if "dim" in attrs:
        return (attrs["dim"],) if in_shape else ()
    return tuple(range(len(in_shape)))


def _check_extent(x: TensorType, axes, name: str) -> None:
    if x.numel == 0 or any(x.shape[a] == 0 for a in axes):
        raise InferError(f"{name} over an empty dimension of {x} is not supported", unsupported=True)


# ------------------------------------------------------------------ inference
def _infer_amax(name):
    def infer(types, attrs):
        (x,) = types
        require_float(types, name)
        dims = tuple(attrs["dims"])
        if normalize_dims(dims, x.ndim) != dims:
            raise InferError(f"{name} dims {dims} must be sorted, distinct and non-negative")
        _check_extent(x, dims, name)
        return x.with_shape(_reduced_shape(x.shape, dims, attrs["keepdim"]))

    return infer


def _infer_full(name):
    def infer(types, attrs):
        (x,) = types
        require_float(types, name)
        _check_extent(x, range(x.ndim), name)
        return x.with_shape(())

    return infer


def _infer_arg(name):
    def infer(types, attrs):
        (x,) = types
        require_float(types, name)
        dim = attrs["dim"]
        if not isinstance(dim, int) or not 0 <= dim < max(x.ndim, 1):
            raise InferError(f"{name} dim {dim} is out of range for {x}")
        axes = extremum_axes(x.shape, attrs)
        _check_extent(x, axes, name)
        return TensorType("i64", _reduced_shape(x.shape, axes, attrs["keepdim"]))

    return infer


# ------------------------------------------------------------------ reference
def _lines(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """x as (lines, reduced elements): kept axes first, reduced axes last, row-major."""
    kept = [a for a in range(x.ndim) if a not in axes]
    moved = np.transpose(x, kept + list(axes)) if x.ndim else x.reshape(1)
    reduced = numel(tuple(x.shape[a] for a in axes))
    return np.ascontiguousarray(moved).reshape(-1, reduced)


def line_extrema(lines: np.ndarray, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    """(value, first index) of each line's extremum; a line's first NaN wins."""
    nan = np.isnan(lines)
    index = np.argmax(lines, axis=1) if largest else np.argmin(lines, axis=1)  # first occurrence
    first_nan = np.argmax(nan, axis=1)
    index = np.where(nan.any(axis=1), first_nan, index)
    return lines[np.arange(lines.shape[0]), index], index.astype(np.int64)


def _reference(largest: bool, want_index: bool):
    def reference(values, attrs):
        (x,) = values
        x = np.asarray(x, dtype=np.float32)
        axes = extremum_axes(x.shape, attrs)
        value, index = line_extrema(_lines(x, axes), largest)
        out = index if want_index else value
        shape = _reduced_shape(x.shape, axes, attrs.get("keepdim", False))
        return np.array(out.reshape(shape), order="C")

    return reference


# ------------------------------------------------------------------ VJP rules
def _restored(b, value: int, shape, dims, keepdim) -> int:
    """``value`` with the reduced dims back as size 1 (PyTorch's restore_reduced_dims)."""
    target = keepdim_shape(shape, dims)
    return value if keepdim or b.shape(value) == target else b.reshape(value, target)


def _mask_and_count(b, x: int, result: int, dims, nan_equal: bool) -> tuple[int, int, int]:
    """(bool mask of x == result, the mask as 0/1 floats, its count over dims kept as size 1)."""
    mask = b.emit("extremum_mask", (x, result), nan_equal=nan_equal)
    ones = b.where(mask, b.const(1.0), b.const(0.0))
    return mask, ones, b.sum(ones, dims, keepdim=True)


def vjp_amax(b, node, grad, needs):
    """d amax(a, dims) = (g / count) * mask, mask = (result == a), count = mask.sum(dims):
    PyTorch's scale_grad_by_count (a line holding a NaN gets NaN gradients, as in torch)."""
    x = node.inputs[0]
    shape, dims, keepdim = b.shape(x), tuple(node.attr["dims"]), node.attr["keepdim"]
    dims = dims or tuple(range(len(shape)))
    result = _restored(b, node.id, shape, dims, keepdim)
    _, ones, count = _mask_and_count(b, x, result, dims, nan_equal=False)
    return (b.mul(b.div(_restored(b, grad, shape, dims, keepdim), count), ones),)


def vjp_full(b, node, grad, needs):
    """d max(a) = g / count where a == result (or both are NaN), 0 elsewhere: PyTorch's
    evenly_distribute_backward."""
    x = node.inputs[0]
    shape = b.shape(x)
    dims = tuple(range(len(shape)))
    mask, _, count = _mask_and_count(b, x, node.id, dims, nan_equal=True)
    share = b.div(grad, b.reshape(count, ()) if shape else count)
    return (b.where(mask, share, b.const(0.0)),)


# ------------------------------------------------------------------ CPU kernels
def _scan_lines(largest: bool, want_index: bool, parallel: bool) -> str:
    """The numba function taking (lines, reduced) and writing each line's extremum or its index."""
    better = "v > best" if largest else "v < best"
    result = "at" if want_index else "best"
    loop = "prange" if parallel else "range"
    return (f"{njit_decorator(parallel)}\n"
            "def _lines(x, out):\n"
            f"    for r in {loop}(x.shape[0]):\n"
            "        best = x[r, 0]\n"
            "        at = 0\n"
            "        for c in range(1, x.shape[1]):\n"
            "            if best != best:  # a NaN is the extremum; the first one is kept\n"
            "                break\n"
            "            v = x[r, c]\n"
            f"            if {better} or v != v:\n"
            "                best = v\n"
            "                at = c\n"
            f"        out[r] = {result}\n\n\n")


def _scan_chunks(largest: bool, want_index: bool) -> str:
    """A large operand of few lines: each line split into REDUCTION_CHUNKS parts scanned in parallel,
    the parts' (value, index) then combined in order (the same first NaN, first extremum)."""
    better = "v > best" if largest else "v < best"
    return (f"{njit_decorator(True)}\n"
            "def _lines(x, out):\n"
            "    lines, n = x.shape\n"
            f"    chunks = min({REDUCTION_CHUNKS}, n)\n"
            "    values = np.empty((lines, chunks), x.dtype)\n"
            "    indices = np.empty((lines, chunks), np.int64)\n"
            "    for job in prange(lines * chunks):\n"
            "        r, k = job // chunks, job % chunks\n"
            "        start, stop = k * n // chunks, (k + 1) * n // chunks\n"
            "        best = x[r, start]\n"
            "        at = start\n"
            "        for c in range(start + 1, stop):\n"
            "            if best != best:\n"
            "                break\n"
            "            v = x[r, c]\n"
            f"            if {better} or v != v:\n"
            "                best = v\n"
            "                at = c\n"
            "        values[r, k] = best\n"
            "        indices[r, k] = at\n"
            "    for r in range(lines):\n"
            "        best = values[r, 0]\n"
            "        at = indices[r, 0]\n"
            "        for k in range(1, chunks):\n"
            "            if best != best:\n"
            "                break\n"
            "            v = values[r, k]\n"
            f"            if {better} or v != v:\n"
            "                best = v\n"
            "                at = indices[r, k]\n"
            f"        out[r] = {'at' if want_index else 'best'}\n\n\n")


def _cpu_extremum(largest: bool, want_index: bool):
    def render(attrs, ins, out):
        shape = ins[0].shape
        axes = extremum_axes(shape, attrs)
        large = policy.parallel("rows", ins[0].numel)
        if large and out.numel < REDUCTION_CHUNKS:
            return _scan_chunks(largest, want_index) + lines_call(shape, axes)
        return _scan_lines(largest, want_index, large) + lines_call(shape, axes)

    return render


# ------------------------------------------------------------------ cuda kernels
def _line_indexing(op, shape, axes):
    """(outputs, reduced, statements splitting ``o``, statements splitting ``q``, the element read)."""
    kept_shape = tuple(1 if axis in axes else size for axis, size in enumerate(shape))
    reduced_shape = tuple(size if axis in axes else 1 for axis, size in enumerate(shape))
    kept_split, kept = kit.unflatten("o", kept_shape, "k")
    reduced_split, moved = kit.unflatten("q", reduced_shape, "s")
    index = [s if axis in axes else k for axis, (k, s) in enumerate(zip(kept, moved))]
    return numel(kept_shape), numel(reduced_shape), kept_split, reduced_split, op.read(0, index)


def _block_per_output(op, what: str, block: int, outputs: int, types: tuple[str, str], inner: list[str],
                      doc: str):
    """A kernel of one block per output element (``o``, looping over the grid), with two shared arrays of
    BLOCK elements, ``partial`` and ``wide``, of the numba ``types``; ``inner`` is one output's body."""
    body = ([f"partial = cuda.shared.array({block}, numba.{types[0]})",
             f"wide = cuda.shared.array({block}, numba.{types[1]})", "t = cuda.threadIdx.x",
             "o = cuda.blockIdx.x", f"while o < {op.count(outputs)}:"] + ["    " + line for line in inner]
            + ["    o += cuda.gridDim.x"])
    source = f"\nBLOCK = {block}\n" + kit.kernel_source("kernel", op.arguments, body, doc)
    launch = kit.block_per_row_launch("kernel", outputs, block, 12 * block)
    return kit.Kernels(f"{what}: a block per output element", source, [launch])


def _cuda_extremum(largest: bool, want_index: bool):
    """A thread per output element scanning its line in order; a line of TREE_MIN_EXTENT or more
    elements gets a block: each thread scans every BLOCK-th element, then a shared-memory tree of
    (value, index) pairs keeps the first NaN, else the extremum of lowest index."""
    def render(op):
        shape = op.shapes[0]
        axes = set(extremum_axes(shape, op.attrs))
        outputs, reduced, kept_split, reduced_split, read = _line_indexing(op, shape, axes)
        better = "v > best" if largest else "v < best"
        result = "at" if want_index else "best"
        what = f"{op.node.op} of [{','.join(map(str, shape))}] over axes {tuple(sorted(axes))}"
        if reduced < TREE_MIN_EXTENT:
            body = (kept_split + ["q = 0"] + reduced_split + [f"best = {read}", "at = 0"]
                    + [f"for q in range(1, {reduced}):", "    if best != best:", "        break"]
                    + ["    " + line for line in reduced_split]
                    + [f"    v = {read}", f"    if {better} or v != v:", "        best = v", "        at = q",
                       f"out0[o] = {result}"])
            source = kit.kernel_source("kernel", op.arguments, kit.grid_stride_loop(op.count(outputs), body, "o"),
                                       "One thread per output element, scanning its line in order.")
            return kit.Kernels(f"{what}: a thread per output element", source,
                               [kit.grid_stride_launch("kernel", outputs)])
        block = kit.tree_block(reduced)
        wins = "ob > mb" if largest else "ob < mb"
        inner = (kept_split + ["best = np.float32(0.0)", "at = -1  # no element yet", "q = t",
                               f"while q < {reduced}:"]
                 + ["    " + line for line in reduced_split]
                 + [f"    v = {read}", f"    if at < 0 or (best == best and ({better} or v != v)):",
                    "        best = v", "        at = q", "    q += BLOCK",
                    "partial[t] = best", "wide[t] = at", "cuda.syncthreads()", "half = BLOCK // 2",
                    "while half > 0:", "    if t < half:",
                    "        ob, oi, mb, mi = partial[t + half], wide[t + half], partial[t], wide[t]",
                    "        take = False", "        if oi >= 0:", "            if mi < 0:", "                take = True",
                    "            elif mb != mb:", "                take = ob != ob and oi < mi",
                    "            elif ob != ob:", "                take = True",
                    f"            elif {wins} or (ob == mb and oi < mi):", "                take = True",
                    "        if take:", "            partial[t] = ob", "            wide[t] = oi",
                    "    cuda.syncthreads()", "    half //= 2",
                    "if t == 0:", f"    out0[o] = {'wide' if want_index else 'partial'}[0]",
                    "cuda.syncthreads()  # the shared arrays are reused"])
        return _block_per_output(op, what, block, outputs, ("float32", "int64"), inner,
                                 "One block per output element: a shared-memory tree of (value, index).")

    return render


# ------------------------------------------------------------------ the ops
for _name, _largest in (("amax", True), ("amin", False)):
    define_op(
        name=_name,
        arity=1,
        infer=_infer_amax(_name),
        reference=_reference(_largest, False),
        lowering=Lowering("reduce", cpu=_cpu_extremum(_largest, False), cuda=_cuda_extremum(_largest, False)),
        vjp=vjp_amax,
        attr_names=("dims", "keepdim"),
        doc=f"`%1 = {_name}[dims=(1,), keepdim=False] %0 : f32[4]`: torch.{_name} (NaN propagates; "
            "the gradient is shared among ties).",
    )

for _name, _largest in (("max", True), ("min", False)):
    define_op(
        name=_name,
        arity=1,
        infer=_infer_full(_name),
        reference=_reference(_largest, False),
        lowering=Lowering("reduce", cpu=_cpu_extremum(_largest, False), cuda=_cuda_extremum(_largest, False)),
        vjp=vjp_full,
        doc=f"`%1 = {_name} %0 : f32[]`: torch.{_name}(x) over every element (the gradient is split evenly "
            "among ties, NaNs included).",
    )

for _name, _largest in (("argmax", True), ("argmin", False)):
    define_op(
        name=_name,
        arity=1,
        infer=_infer_arg(_name),
        reference=_reference(_largest, True),
        lowering=Lowering("reduce", cpu=_cpu_extremum(_largest, True), cuda=_cuda_extremum(_largest, True)),
        no_vjp="an index result has no gradient",
        attr_names=("dim", "keepdim"),
        doc=f"`%1 = {_name}[dim=1, keepdim=False] %0 : i64[4]`: the first index of the extremum along dim "
            "(of the first NaN where there is one).",
    )


# ------------------------------------------------------------------ the mask of the VJP rules
def _infer_mask(types, attrs):
    require_float(types, "extremum_mask")
    return TensorType("bool", broadcast_shapes(*(t.shape for t in types)))


def _reference_mask(values, attrs):
    a, b = values
    equal = np.equal(a, b)
    if attrs["nan_equal"]:
        equal = equal | (np.isnan(a) & np.isnan(b))
    return np.asarray(equal)


def _scalar_mask(a, b, *, nan_equal):
    if nan_equal:
        return f"(({a} == {b}) or ({a} != {a} and {b} != {b}))"
    return f"({a} == {b})"


define_op(
    name="extremum_mask",
    arity=2,
    infer=_infer_mask,
    reference=_reference_mask,
    lowering=Lowering("elementwise", scalar=_scalar_mask),
    no_vjp="a mask has a boolean result",
    attr_names=("nan_equal",),
    doc="`%2 = extremum_mask[nan_equal=False] %x, %m : bool[..]`: x == m (and both NaN when nan_equal), "
        "the ties of an extremum.",
)


# ------------------------------------------------------------------ logsumexp
def _infer_logsumexp(types, attrs):
    return _infer_amax("logsumexp")(types, attrs)


def _reference_logsumexp(values, attrs):
    (x,) = values
    x = np.asarray(x, dtype=np.float32)
    dims = tuple(attrs["dims"])
    lines = _lines(x, dims)
    shift, _ = line_extrema(lines, largest=True)
    shift = np.where(np.isinf(shift), np.float32(0.0), shift).astype(np.float32)
    with np.errstate(all="ignore"):
        exps = np.exp(lines - shift[:, None]).astype(np.float32)
        total = np.sum(exps.astype(np.float64), axis=1).astype(np.float32)
        out = (np.log(total).astype(np.float32) + shift).astype(np.float32)
    return np.array(out.reshape(_reduced_shape(x.shape, dims, attrs["keepdim"])), order="C")


def vjp_logsumexp(b, node, grad, needs):
    """d logsumexp(a, dims) = g * exp(a - result), g and result with the reduced dims restored:
    PyTorch's logsumexp_backward."""
    x = node.inputs[0]
    shape, dims, keepdim = b.shape(x), tuple(node.attr["dims"]), node.attr["keepdim"]
    result = _restored(b, node.id, shape, dims, keepdim)
    return (b.mul(_restored(b, grad, shape, dims, keepdim), b.exp(b.sub(x, result))),)


def _cpu_logsumexp(attrs, ins, out):
    shape = ins[0].shape
    dims = tuple(attrs["dims"])
    parallel = policy.parallel("rows", ins[0].numel) and out.numel > 1
    loop = "prange" if parallel else "range"
    return (f"{njit_decorator(parallel)}\n"
            "def _lines(x, out):\n"
            f"    for r in {loop}(x.shape[0]):\n"
            "        m = x[r, 0]\n"
            "        for c in range(1, x.shape[1]):\n"
            "            v = x[r, c]\n"
            "            if v > m or v != v:\n"
            "                m = v\n"
            "        if m == np.float32(np.inf) or m == np.float32(-np.inf):\n"
            "            m = np.float32(0.0)\n"
            + "".join(f"        {line}\n" for line in lane_sum("total", "np.float64(math.exp(x[r, c] - m))", "c",
                                                                 "x.shape[1]"))
            + "        out[r] = math.log(np.float32(total)) + m\n\n\n") + lines_call(shape, dims)


def _cuda_logsumexp(op):
    """A thread per output element: the line's maximum, then the float64 sum of exp(x - max). A line
    of TREE_MIN_EXTENT or more elements gets a block: each thread takes every BLOCK-th element, a
    shared-memory tree combines the maxima (a NaN wins), then the float64 partial sums."""
    shape = op.shapes[0]
    axes = set(op.attrs["dims"])
    outputs, reduced, kept_split, reduced_split, read = _line_indexing(op, shape, axes)
    shift = ["if m == np.float32(math.inf) or m == np.float32(-math.inf):", "    m = np.float32(0.0)"]
    what = f"logsumexp of [{','.join(map(str, shape))}] over axes {tuple(sorted(axes))}"
    if reduced < TREE_MIN_EXTENT:
        body = (kept_split + ["q = 0"] + reduced_split + [f"m = {read}", f"for q in range(1, {reduced}):"]
                + ["    " + line for line in reduced_split]
                + [f"    v = {read}", "    if v > m or v != v:", "        m = v"] + shift
                + ["total = np.float64(0.0)", f"for q in range({reduced}):"]
                + ["    " + line for line in reduced_split]
                + [f"    total += np.float64(math.exp({read} - m))", "out0[o] = math.log(np.float32(total)) + m"])
        source = kit.kernel_source("kernel", op.arguments, kit.grid_stride_loop(op.count(outputs), body, "o"),
                                   "One thread per output element: its line's maximum, then the sum of exponentials.")
        return kit.Kernels(f"{what}: a thread per output element", source,
                           [kit.grid_stride_launch("kernel", outputs)])
    block = kit.tree_block(reduced)

    def strided(lines: list[str]) -> list[str]:
        return ["q = t", f"while q < {reduced}:"] + ["    " + line for line in reduced_split + lines] + ["    q += BLOCK"]

    inner = (kept_split + ["m = np.float32(-math.inf)"]
             + strided([f"v = {read}", "if v > m or v != v:", "    m = v"])
             + ["partial[t] = m", "cuda.syncthreads()", "half = BLOCK // 2", "while half > 0:", "    if t < half:",
                "        other = partial[t + half]", "        if other > partial[t] or other != other:",
                "            partial[t] = other", "    cuda.syncthreads()", "    half //= 2",
                "m = partial[0]"] + shift
             + ["total = np.float64(0.0)"] + strided([f"total += np.float64(math.exp({read} - m))"])
             + ["wide[t] = total"] + kit.tree_lines("sum", ("wide",))
             + ["if t == 0:", "    out0[o] = math.log(np.float32(wide[0])) + m",
                "cuda.syncthreads()  # the shared arrays are reused"])
    return _block_per_output(op, what, block, outputs, ("float32", "float64"), inner,
                             "One block per output element: trees of the maxima and of the sums.")


define_op(
    name="logsumexp",
    arity=1,
    infer=_infer_logsumexp,
    reference=_reference_logsumexp,
    lowering=Lowering("reduce", cpu=_cpu_logsumexp, cuda=_cuda_logsumexp),
    vjp=vjp_logsumexp,
    attr_names=("dims", "keepdim"),
    doc="`%1 = logsumexp[dims=(1,), keepdim=False] %0`: log(sum(exp(x - m))) + m, m the maximum "
        "(0 where it is infinite), torch.logsumexp.",
)
