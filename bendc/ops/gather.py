"""Index reads (index_select, gather) and their ordered scatters (index_add,
scatter_add), which accumulate into +0.0 words in index order like PyTorch's
index_add_ and scatter_add_. On cuda scatter_add keeps that order (one thread per
output element: the same bits every run); index_add adds with atomics."""
from __future__ import annotations

import numpy as np

from bendc.ir.types import TensorType, numel
from bendc.kernels import cpu_policy as policy
from bendc.kernels import cuda_kit as kit
from bendc.kernels.access import dense
from bendc.kernels.cpu_kit import njit_decorator
from bendc.ops.base import InferError, Lowering, define_op

# The one message for an index outside its dimension: the reference, the CPU kernels and the
# cuda kernels' checks (formatted by the runtime) all say it; the op and the user's line are
# added by whoever raises the BendcError.
INDEX_RANGE = "index {index} is out of range for a dimension of size {size}"


class IndexRangeError(ValueError):
    """An index value outside its dimension; the interpreter adds the user's line and the op."""


def _check_index_type(index: TensorType, op: str) -> None:
    if not index.is_index:
        raise InferError(f"{op} needs an int64 or int32 index, got {index}", unsupported=True)


def _check_dim(dim, ndim, op):
    if not isinstance(dim, int) or not 0 <= dim < max(ndim, 1):
        raise InferError(f"{op} dim {dim} is out of range for {ndim} dimensions")


def _check_range(index: np.ndarray, size: int, op: str) -> None:
    """PyTorch's gather, index_select, scatter_add_ and index_add_ refuse indices outside [0, size)."""
    if index.size and (index.min() < 0 or index.max() >= size):
        bad = index[(index < 0) | (index >= size)].flat[0]
        raise IndexRangeError(INDEX_RANGE.format(index=int(bad), size=size))


# The CPU index kernels as numba loops over (before dim, dim, after dim) lines: one native call
# where numpy's take / take_along_axis / add.at (and the range check's min and max) made several,
# each with its own overhead on the small index arrays of a training step. Their loops are
# ``prange`` where the execution policy makes the kernel parallel (bendc/kernels/cpu_policy.py, by
# its output's cells).
_LINES = {
    "first_outside": ["def _first_outside(index, size, found):",
                      "    # found[0]: the first index outside [0, size) in C order (its flat position), or -1",
                      "    found[0] = -1",
                      "    for p in range(index.shape[0]):",
                      "        if index[p] < 0 or index[p] >= size:",
                      "            found[0] = p",
                      "            return"],
    # select and gather: a body run for each (p, k) line of out (see _cpu_lines)
    "select": ["def _select_lines(source, index, out):",
               "t = index[k]",
               "for q in range(out.shape[2]):",
               "    out[p, k, q] = source[p, t, q]"],
    "gather": ["def _gather_lines(source, index, out):",
               "for q in range(out.shape[2]):",
               "    out[p, k, q] = source[p, index[p, k, q], q]"],
}
SCATTER_COLUMNS = 64  # after-dim lines a parallel ordered add's work item adds (whole cache lines of out's rows)


def _cpu_lines(parallel: bool, *names: str) -> str:
    """The helpers ``names`` of _LINES. The (p, k) lines of select and gather run as one prange over
    both when ``parallel`` (a gather along dim 0 has one p), else as two plain loops (no division per
    line)."""
    if parallel:
        head, indent = ["    for pk in prange(out.shape[0] * out.shape[1]):", "        p = pk // out.shape[1]",
                        "        k = max(pk - p * out.shape[1], 0)"], " " * 8
    else:
        head, indent = ["    for p in range(out.shape[0]):", "        for k in range(out.shape[1]):"], " " * 12
    text = ""
    for name in names:
        signature, *body = _LINES[name]
        if name in ("select", "gather"):
            body = head + [indent + row for row in body]
        text += njit_decorator(parallel and name != "first_outside") + "\n" + "\n".join([signature] + body) + "\n\n\n"
    return text


def _ordered_adds(name: str, per_cell: bool, word: str, parallel: bool) -> str:
    """The numba function ``name(source, index, out)`` of scatter_add (``per_cell``: an index per source
    cell, index[p, k, q]) and index_add (an index per line, index[k]): out cleared to ``word``, then
    each (p, q) line's sources added with k ascending (np.add.at's order, and torch's scatter_add_ and
    index_add_'s). index_add reads its index once per k: read in the q loop, the loop did not
    vectorize (125 us against 25 us for a GPT's embedding gradient). In parallel a work item adds
    SCATTER_COLUMNS of one p's lines, else all of them."""
    loop = "prange" if parallel else "range"
    columns = (f"{SCATTER_COLUMNS}  # after-dim lines a work item adds" if parallel else
               "max(out.shape[2], 1)  # one work item a p: all its after-dim lines")
    lines = [njit_decorator(parallel), f"def {name}(source, index, out):",
             "    cells = out.reshape(out.shape[0] * out.shape[1] * out.shape[2])",
             f"    for i in {loop}(cells.shape[0]):",
             f"        cells[i] = np.float32({word})",
             f"    columns = {columns}",
             "    chunks = (out.shape[2] + columns - 1) // columns",
             f"    for item in {loop}(out.shape[0] * chunks):",
             "        p = item // chunks",
             "        # max(..., 0): never negative, and saying so keeps numba's wraparound out of the loop",
             "        first = max((item - p * chunks) * columns, 0)",
             "        last = min(first + columns, out.shape[2])",
             "        for k in range(source.shape[1]):"]
    if per_cell:
        lines += ["            for q in range(first, last):", "                t = index[p, k, q]"]
    else:
        lines += ["            t = index[k]", "            for q in range(first, last):"]
    lines.append("                out[p, t, q] = out[p, t, q] + source[p, k, q]")
    return "\n".join(lines) + "\n\n\n"


def _cpu_checked(size: int) -> str:
    """Kernel source lines (after _cpu_lines("first_outside")) that raise IndexError for an index
    outside [0, size), naming the first one in C order; ``flat`` is the index as one line."""
    message = INDEX_RANGE.format(index="{int(flat[bad])}", size=size)
    return ("    flat = np.ascontiguousarray(in1).reshape(-1)\n"
            "    found = np.empty(1, np.int64)\n"
            f"    _first_outside(flat, {size}, found)\n"
            "    bad = found[0]\n"
            "    if bad >= 0:\n"
            f"        raise IndexError(f'{message}')\n")


def _same_off_dim(a: tuple[int, ...], b: tuple[int, ...], dim: int) -> bool:
    """Whether two shapes agree on every axis but ``dim`` (the line kernels' condition)."""
    return [n for axis, n in enumerate(a) if axis != dim] == [n for axis, n in enumerate(b) if axis != dim]


def _lines_shape(array: str, ndim: int, dim: int) -> str:
    """``array``'s shape as (before dim, dim, after dim): source text read from the array at run time
    (one source for every batch size)."""
    def product(axes: range) -> str:
        return " * ".join(f"{array}.shape[{axis}]" for axis in axes) or "1"

    return f"({product(range(dim))}, {array}.shape[{dim}], {product(range(dim + 1, ndim))})"


# ------------------------------------------------------------------ cuda kernels
def _index_read(op, names: list[str]) -> str:
    """The flat element of the index operand for the cell whose indexes are ``names``:
    index_select and index_add read a 1-D index along dim, gather and scatter_add one per cell."""
    dim = op.attrs["dim"]
    if op.node.op in ("index_select", "index_add"):
        return op.read(1, [names[dim]] if op.shapes[1] else [])
    return op.read(1, names)


def _cuda_gather(op):
    """index_select / gather: one output element per thread; the index picks the element along dim.
    An index outside its dimension sets ``err`` (the runtime raises the user's error)."""
    node = op.node
    dim = op.attrs["dim"]
    shape = op.shape
    size = op.shapes[0][dim]
    split, names = kit.unflatten("cell", shape, "o")
    source_index = list(names)
    source_index[dim] = "j"
    body = kit.checked_read(_index_read(op, names), size, ["out0[cell] = np.float32(0.0)"],
                            [f"out0[cell] = {op.read(0, source_index)}"])
    body = kit.used(split, body) + body
    cells = numel(shape)
    source = kit.kernel_source("kernel", op.checked_arguments, kit.grid_stride_loop(op.count(cells), body),
                               f"{node.op} along dim {dim}; a bad index sets err.")
    return kit.Kernels(f"{node.op} along dim {dim}", source, [kit.grid_stride_launch("kernel", cells)],
                       check=INDEX_RANGE.format(index="{index}", size=size))


def index_line_walk(op, names: list[str], index_operand: int, source_operand: int, fold: list[str]) -> list[str]:
    """The statements by which the thread of one output element (indexes ``names``) walks its line of
    the index along dim in index order, folding each contributor ``s`` (the source element beside an
    index equal to its own position) into ``acc`` by the ``fold`` statements and counting them in ``n``;
    a bad index sets ``err``. No atomics: the same bits every run, in the order of torch's CPU loops
    (scatter_add, scatter_reduce)."""
    shape, dim = op.shape, op.attrs["dim"]
    index_shape = op.shapes[index_operand]
    along = list(names)
    along[dim] = "k"
    inside = [f"{names[a]} < {index_shape[a]}" for a in range(len(shape)) if a != dim and index_shape[a] < shape[a]]
    walk = [f"for k in range({index_shape[dim]}):",
            f"    t = {op.read(index_operand, along)}",
            f"    if t < 0 or t >= {shape[dim]}:", "        err[0] = 1", "        err[1] = t",
            f"    elif t == {names[dim]}:", f"        s = {op.read(source_operand, along)}"]
    walk += ["        " + line for line in fold] + ["        n += 1"]
    if inside:
        walk = [f"if {' and '.join(inside)}:"] + ["    " + line for line in walk]
    return walk


def _cuda_scatter_add(op):
    """scatter_add (gather's gradient): one output element per thread, its contributors summed from
    +0.0 in index order (index_line_walk), as torch's scatter_add_ on the CPU and the reference add
    them: the reference's bits, the same every run."""
    node = op.node
    shape = op.shape
    dim = op.attrs["dim"]
    split, names = kit.unflatten("cell", shape, "o")
    body = ["acc = np.float32(0.0)", "n = 0"] + index_line_walk(op, names, 1, 0, ["acc = acc + s"])
    body += [f"out0[{dense(node.id, shape).flat(names)}] = acc"]
    body = kit.used(split, body) + body
    cells = numel(shape)
    source = kit.kernel_source("kernel", op.checked_arguments, kit.grid_stride_loop(op.count(cells), body),
                               f"scatter_add along dim {dim}: one output element per thread, its contributors "
                               "in index order; a bad index sets err.")
    return kit.Kernels(f"scatter_add along dim {dim} (index order)", source, [kit.grid_stride_launch("kernel", cells)],
                       check=INDEX_RANGE.format(index="{index}", size=shape[dim]))


def _cuda_index_add(op):
    """index_add (index_select's gradient: embeddings) into a cleared output: one source element per
    thread, accumulated with ``cuda.atomic.add``. Repeated indices sum in an unspecified order, where
    PyTorch's CPU kernels add in index order: equal within tolerance, not bit for bit. (An ordered
    walk, as scatter_add's, would read the whole index per output element: a vocabulary times the
    tokens for an embedding's gradient.)"""
    node = op.node
    shape = op.shape
    dim = op.attrs["dim"]
    split, names = kit.unflatten("cell", op.shapes[0], "s")
    target = list(names)
    target[dim] = "j"
    body = kit.checked_read(_index_read(op, names), shape[dim], [],
                            [f"cuda.atomic.add(out0, {dense(node.id, shape).flat(target)}, {op.read(0, names)})"])
    return kit.scatter_kernels(op, split, body, "atomic adds", checked=True,
                               check=INDEX_RANGE.format(index="{index}", size=shape[dim]), word=_word(op.attrs))


def _word(attrs) -> str:
    """What index_add's output starts as: +0.0 words (torch's zeros), or -0.0, the identity of +, for
    ``unique=True`` (each position written at most once: x[key] = value, whose values keep their bits,
    -0.0 included)."""
    return "-0.0" if attrs.get("unique") else "0.0"


def _cpu_index_select(attrs, ins, out):
    dim = attrs["dim"]
    if ins[0].ndim == 0:
        return (_cpu_lines(False, "first_outside") + "def kernel(in0, in1, out0):\n" + _cpu_checked(ins[0].shape[dim])
                + f"    np.take(in0, in1.reshape(-1), axis={dim}, out=out0)\n")
    x = ins[0].shape
    parallel = policy.parallel("rows", out.numel)
    return (_cpu_lines(parallel, "first_outside", "select") + "def kernel(in0, in1, out0):\n" + _cpu_checked(x[dim])
            + "    if out0.size:\n"
            + f"        _select_lines(np.ascontiguousarray(in0).reshape({_lines_shape('in0', len(x), dim)}), flat,\n"
            + f"                      out0.reshape({_lines_shape('out0', len(x), dim)}))\n")


def _cpu_index_add(attrs, ins, out):
    """The source's lines added into the cleared output in index order (_ordered_adds). The kernel
    took 2.29 ms with np.add.at for a GPT's embedding gradient (1024 tokens of 128 into 65 rows),
    0.13 ms with a numba loop (bendc profile, 1 thread)."""
    dim = attrs["dim"]
    return (_cpu_lines(False, "first_outside")
            + _ordered_adds("_add_lines", False, _word(attrs), policy.parallel("rows", out.numel))
            + "def kernel(in0, in1, out0):\n" + _cpu_checked(out.shape[dim])
            + "    if not out0.size:\n"
            + "        return\n"
            + f"    _add_lines(np.ascontiguousarray(in0).reshape({_lines_shape('in0', len(ins[0].shape), dim)}), flat,\n"
            + f"               out0.reshape({_lines_shape('out0', len(out.shape), dim)}))\n")


def _cpu_gather(attrs, ins, out):
    """Lines of the index's shape along ``dim`` read from the source (a numba loop); an index smaller
    than the source across dim (torch allows it) takes numpy's take_along_axis of the window."""
    dim = attrs["dim"]
    x, index = ins[0].shape, ins[1].shape
    window = ", ".join(":" if axis == dim else f":in1.shape[{axis}]" for axis in range(ins[1].ndim))
    if not x or not _same_off_dim(x, index, dim):
        return (_cpu_lines(False, "first_outside") + "def kernel(in0, in1, out0):\n" + _cpu_checked(x[dim] if x else 1)
                + f"    out0[...] = np.take_along_axis(in0[{window},], in1, axis={dim})\n")
    lines = _lines_shape("in1", len(index), dim)
    parallel = policy.parallel("rows", out.numel)
    return (_cpu_lines(parallel, "first_outside", "gather") + "def kernel(in0, in1, out0):\n" + _cpu_checked(x[dim])
            + "    if out0.size:\n"
            + f"        _gather_lines(np.ascontiguousarray(in0).reshape({_lines_shape('in0', len(x), dim)}),\n"
            + f"                      flat.reshape({lines}), out0.reshape({lines}))\n")


def _cpu_scatter_add(attrs, ins, out):
    """The source's cells added into the cleared output in C order over the index (np.add.at's
    order): a numba loop where the output matches the index across ``dim``, else np.add.at."""
    dim = attrs["dim"]
    source, index, y = ins[0].shape, ins[1].shape, out.shape
    if not y or source != index or not _same_off_dim(y, index, dim):
        return (_cpu_lines(False, "first_outside") + "def kernel(in0, in1, out0):\n" + _cpu_checked(y[dim] if y else 1)
                + "    out0[...] = np.float32(0.0)\n"
                + f"    grids = list(np.indices(in1.shape, sparse=True))\n"
                + f"    grids[{dim}] = in1\n"
                + "    np.add.at(out0, tuple(grids), in0)\n")
    lines = _lines_shape("in1", len(index), dim)
    return (_cpu_lines(False, "first_outside")
            + _ordered_adds("_scatter_lines", True, "0.0", policy.parallel("rows", out.numel))
            + "def kernel(in0, in1, out0):\n" + _cpu_checked(y[dim])
            + "    if not in1.size:\n"
            + "        out0[...] = np.float32(0.0)\n"
            + "        return\n"
            + f"    _scatter_lines(np.ascontiguousarray(in0).reshape({lines}), flat.reshape({lines}),\n"
            + f"                   out0.reshape({_lines_shape('out0', len(y), dim)}))\n")


# ------------------------------------------------------------------ index_select / index_add
def _infer_index_select(types, attrs):
    x, index = types
    dim = attrs["dim"]
    _check_dim(dim, x.ndim, "index_select")
    _check_index_type(index, "index_select")
    if index.ndim > 1:
        raise InferError(f"index_select needs a 1-D index, got {index}")
    shape = list(x.shape)
    shape[dim] = index.numel
    return x.with_shape(tuple(shape))


def _reference_index_select(values, attrs):
    x, index = values
    dim = attrs["dim"]
    index = index.reshape(-1)
    _check_range(index, x.shape[dim], "index_select")
    return np.ascontiguousarray(np.take(x, index, axis=dim))


def vjp_index_select(b, node, grad, needs):
    """d index_select(a, dim, i) = index_add(+0.0 words of a's shape, dim, i, g)."""
    x, index = node.inputs
    return (b.emit("index_add", (grad, index), dim=node.attr["dim"], shape=b.shape(x)), None)


define_op(
    name="index_select",
    arity=2,
    infer=_infer_index_select,
    reference=_reference_index_select,
    lowering=Lowering("gather", cpu=_cpu_index_select, cuda=_cuda_gather),
    index_operand=1,
    indexed_size=lambda shapes, out, attrs: shapes[0][attrs["dim"]],
    vjp=vjp_index_select,
    attr_names=("dim",),
    doc="`%2 = index_select[dim=0] %x, %i`: rows (slices along dim) picked by a 1-D index.",
)


def _infer_index_add(types, attrs):
    source, index = types
    shape = tuple(attrs["shape"])
    dim = attrs["dim"]
    _check_dim(dim, len(shape), "index_add")
    _check_index_type(index, "index_add")
    expected = list(shape)
    expected[dim] = index.numel
    if source.shape != tuple(expected):
        raise InferError(f"index_add of {source} into [{','.join(map(str, shape))}] along {dim}")
    return source.with_shape(shape)


def _reference_index_add(values, attrs):
    source, index = values
    dim = attrs["dim"]
    out = np.full(tuple(attrs["shape"]), float(_word(attrs)), dtype=np.float32)
    index = index.reshape(-1)
    _check_range(index, out.shape[dim], "index_add")
    np.add.at(out, (slice(None),) * dim + (index,), source)
    return out


def vjp_index_add(b, node, grad, needs):
    """d index_add(g) = index_select(grad, dim, i)."""
    return (b.emit("index_select", (grad, node.inputs[1]), dim=node.attr["dim"]), None)


define_op(
    name="index_add",
    arity=2,
    infer=_infer_index_add,
    reference=_reference_index_add,
    lowering=Lowering("scatter", cpu=_cpu_index_add, cuda=_cuda_index_add),
    index_operand=1,
    indexed_size=lambda shapes, out, attrs: out[attrs["dim"]],
    vjp=vjp_index_add,
    attr_names=("dim", "shape", "unique"),  # unique: optional (False when absent)
    doc="`%2 = index_add[dim=0, shape=(10,4)] %g, %i`: zeros.index_add_(dim, i, g), in index order; with "
        "`unique=True` (positions written once: x[key] = value) into -0.0 words, so values keep their bits.",
)


# ------------------------------------------------------------------ gather / scatter_add
def _infer_gather(types, attrs):
    x, index = types
    dim = attrs["dim"]
    _check_dim(dim, x.ndim, "gather")
    _check_index_type(index, "gather")
    if index.ndim != x.ndim:
        raise InferError(f"gather needs index and input of the same number of dimensions")
    for axis, (size, limit) in enumerate(zip(index.shape, x.shape)):
        if axis != dim and size > limit:
            raise InferError(f"gather index size {size} exceeds the input's {limit} in dimension {axis}")
    return x.with_shape(index.shape)


def _scatter_indices(index: np.ndarray, dim: int) -> tuple:
    grids = list(np.indices(index.shape, sparse=True))
    grids[dim] = index
    return tuple(grids)


def _reference_gather(values, attrs):
    x, index = values
    dim = attrs["dim"]
    _check_range(index, x.shape[dim], "gather")
    return np.ascontiguousarray(x[_scatter_indices(index, dim)])


def vjp_gather(b, node, grad, needs):
    """d gather(a, dim, i) = scatter_add(+0.0 words of a's shape, dim, i, g)."""
    x, index = node.inputs
    return (b.emit("scatter_add", (grad, index), dim=node.attr["dim"], shape=b.shape(x)), None)


define_op(
    name="gather",
    arity=2,
    infer=_infer_gather,
    reference=_reference_gather,
    lowering=Lowering("gather", cpu=_cpu_gather, cuda=_cuda_gather),
    index_operand=1,
    indexed_size=lambda shapes, out, attrs: shapes[0][attrs["dim"]],
    vjp=vjp_gather,
    attr_names=("dim",),
    doc="`%2 = gather[dim=1] %x, %i`: out[..., j, ...] = x[..., i[..., j, ...], ...] along dim.",
)


def _infer_scatter_add(types, attrs):
    source, index = types
    shape = tuple(attrs["shape"])
    dim = attrs["dim"]
    _check_dim(dim, len(shape), "scatter_add")
    _check_index_type(index, "scatter_add")
    if index.shape != source.shape or len(shape) != index.ndim:
        raise InferError("scatter_add needs index and source of one shape")
    return source.with_shape(shape)


def _reference_scatter_add(values, attrs):
    source, index = values
    dim = attrs["dim"]
    out = np.zeros(tuple(attrs["shape"]), dtype=np.float32)
    _check_range(index, out.shape[dim], "scatter_add")
    np.add.at(out, _scatter_indices(index, dim), source)
    return out


def vjp_scatter_add(b, node, grad, needs):
    """d scatter_add(g) = gather(grad, dim, i)."""
    return (b.emit("gather", (grad, node.inputs[1]), dim=node.attr["dim"]), None)


define_op(
    name="scatter_add",
    arity=2,
    infer=_infer_scatter_add,
    reference=_reference_scatter_add,
    lowering=Lowering("scatter", cpu=_cpu_scatter_add, cuda=_cuda_scatter_add),
    index_operand=1,
    indexed_size=lambda shapes, out, attrs: out[attrs["dim"]],
    vjp=vjp_scatter_add,
    attr_names=("dim", "shape"),
    doc="`%2 = scatter_add[dim=1, shape=(8,10)] %g, %i`: zeros.scatter_add_(dim, i, g), in index order.",
)
