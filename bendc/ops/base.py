"""What an op is: one OpDef carries everything about it.

An op's definition holds its arity, shape and dtype inference, numpy
reference semantics (the executable spec), its VJP rule (written with the same
:class:`Builder` the tracer uses, so backward is ordinary IR), and its
lowering (how codegen turns it into kernels). ``tests/ops/test_registry.py``
walks the registry and fails for an op that lacks any part.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from bendc.ir.graph import Graph, Node
from bendc.ir.types import TensorType

Attrs = dict[str, Any]

LOWERING_KINDS = (
    "source",       # parameters and constants: no kernel
    "placeholder",  # must be gone after autodiff (grad slots)
    "elementwise",  # one output element per cell; ``scalar`` renders the body
    "reduce",       # sum over dims: a reduction cell per output element
    "layout",       # reshape/permute/expand/slices: index arithmetic or views
    "matmul",       # BLAS on the CPU, a tiled template on CUDA
    "gather",       # index reads
    "scatter",      # ordered index accumulation into +0.0 words
    "row",          # row-wise kernels (softmax, log_softmax): one cell per row
    "attention",    # attention and its VJPs: one cell per row pair (triangular) or row (dense)
    "collective",   # all_reduce: start and wait steps per bucket, host code over the runtime's backend
)


class InferError(Exception):
    """Raised by an op's inference; the Builder adds the user's line and op."""

    def __init__(self, message: str, *, unsupported: bool = False):
        super().__init__(message)
        self.unsupported = unsupported


# The renderers an op of each kind brings (``Lowering`` fields); codegen writes the rest for every
# op of the kind: fused elementwise kernels from ``scalar`` on both targets, strided views and
# their copies on cuda, constants. ``tests/ops/test_registry.py`` checks every op against it.
REQUIRED_RENDERERS: dict[str, tuple[str, ...]] = {
    "source": (), "placeholder": (), "elementwise": ("scalar",), "layout": ("cpu",),
    **{kind: ("cpu", "cuda") for kind in ("reduce", "matmul", "gather", "scatter", "row", "attention",
                                         "collective")},
}
assert set(REQUIRED_RENDERERS) == set(LOWERING_KINDS)


@dataclass(frozen=True)
class Lowering:
    """How an op becomes kernel code.

    ``kind`` is one of LOWERING_KINDS. For elementwise ops ``scalar`` renders
    the body of one cell: it takes the operand expressions (strings) and the
    node's attrs and returns an expression string in float32 arithmetic.
    For the other kinds ``cpu`` renders the CPU kernel: given the node's
    attrs, operand types and result type it returns the source of a function
    ``kernel(in0, ..., out0)`` that writes its result into ``out0`` or, for
    layout ops (``view`` convention), ``kernel(in0, ...)`` that returns a view.

    ``cuda`` renders the op's CUDA kernels: given a
    :class:`bendc.kernels.cuda_kit.CudaNode` (the node, its operands' shapes,
    strided reads and kernel argument names) it returns a
    :class:`bendc.kernels.cuda_kit.Kernels`. REQUIRED_RENDERERS says which
    renderers each kind's ops bring; ``tests/ops/test_registry.py`` checks it.
    Collective ops' ``cpu`` and ``cuda`` are given a
    :class:`bendc.ops.collective.CollectiveStep` (one phase of a bucket) instead.
    """

    kind: str
    scalar: Callable[..., str] | None = None
    cpu: Callable[..., str] | None = None
    cuda: Callable[..., Any] | None = None
    # An elementwise op whose value depends on the element's position (counter-based random
    # numbers): its ``scalar`` also takes ``index``, an integer expression for the row-major linear
    # index of the op's own result element at the cell (bendc/codegen/fused.py, ``cell_index``).
    cell_index: bool = False
    # An elementwise op's CPU-only scalar renderer (same arguments as ``scalar``), where the kit's
    # float32 helpers (bendc/kernels/templates/cpu_math.py) compute it in fewer vector operations
    # than the shared expression with its libm calls would (gelu: one exp for the cdf and the pdf).
    # It returns None where it does not cover the attrs; then ``scalar`` renders the cell.
    cpu_scalar: Callable[..., str | None] | None = None
    # An op whose CPU kernel can apply the elementwise work that follows it (bendc/kernels/epilogue.py):
    # the fusion pass folds the elementwise group reading its result into its step on the cpu target,
    # and its ``cpu`` renderer is then also given ``epilogue=`` (an Epilogue) to call on each block of
    # its result, its leading axis split in blocks of rows.
    epilogue: bool = False

    @property
    def convention(self) -> str:
        """'view' for layout ops (a kernel returns a view), 'write' otherwise."""
        return "view" if self.kind in ("layout", "source") else "write"


@dataclass(frozen=True)
class OpDef:
    """Everything about one op, in one place."""

    name: str
    arity: int | None  # None: one or more operands
    infer: Callable[[Sequence[TensorType], Attrs], TensorType]
    reference: Callable[[Sequence[np.ndarray], Attrs], np.ndarray]
    lowering: Lowering
    doc: str
    vjp: Callable[..., tuple] | None = None
    no_vjp: str | None = None  # why an op has no VJP (exactly one of vjp / no_vjp)
    attr_names: tuple[str, ...] = field(default=())
    # Op facts that passes and codegen read (never by op name):
    # reductions: the axes of the operand summed over, from (operand shape, attrs);
    reduced_axes: Callable[[tuple[int, ...], Attrs], tuple[int, ...]] | None = None
    # ops reading an integer operand as indices into a dimension: that operand's position,
    # and the size of the dimension it indexes, from (operand shapes, result shape, attrs).
    index_operand: int | None = None
    indexed_size: Callable[[Sequence[tuple[int, ...]], tuple[int, ...], Attrs], int] | None = None
    # The front-end spelling of an op that traces straight from its operands (no attributes):
    # the Tensor method ``x.<method>(*others)`` and the function ``bendc.functional.<method>(x, ...)``,
    # PyTorch's name and semantics. Ops with richer spellings are written in trace.py/functional.py.
    method: str | None = None

    @property
    def differentiable(self) -> bool:
        return self.vjp is not None


OPS: dict[str, OpDef] = {}
METHODS: dict[str, str] = {}  # Tensor method name -> op, for ops that declare ``method``

def define_op(**fields: Any) -> OpDef:
    """Register an op; the registry is keyed by the op's printed name."""
    opdef = OpDef(**fields)
    assert opdef.name not in OPS, f"op {opdef.name} defined twice"
    assert (opdef.vjp is None) != (opdef.no_vjp is None), opdef.name
    assert opdef.lowering.kind in LOWERING_KINDS, opdef.lowering.kind
    assert (opdef.index_operand is None) == (opdef.indexed_size is None), opdef.name
    assert opdef.method is None or opdef.method not in METHODS, f"method {opdef.method} defined twice"
    OPS[opdef.name] = opdef
    if opdef.method is not None:
        METHODS[opdef.method] = opdef.name
    return opdef


def reduced_axes(graph: Graph, node: Node) -> tuple[int, ...] | None:
    """Axes of its operand that a reduction (sum, sum_to_size) sums over; None for other ops."""
    fact = OPS[node.op].reduced_axes
    return None if fact is None else fact(graph.node(node.inputs[0]).type.shape, node.attr)


def indexed_size(graph: Graph, node: Node) -> int:
    """The size of the dimension an index op's index operand reads from or writes into."""
    shapes = [graph.node(i).type.shape for i in node.inputs]
    return OPS[node.op].indexed_size(shapes, node.type.shape, node.attr)


# ---------------------------------------------------------------- helpers
def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """numpy/PyTorch broadcasting of shapes, or InferError."""
    ndim = max((len(s) for s in shapes), default=0)
    result = []
    for axis in range(ndim):
        size = 1
        for shape in shapes:
            index = axis - (ndim - len(shape))
            if index < 0:
                continue
            dim = shape[index]
            if dim == 1:
                continue
            if size not in (1, dim):
                text = " and ".join(f"[{','.join(map(str, s))}]" for s in shapes)
                raise InferError(f"shapes {text} do not broadcast (dimension {axis - ndim}: {size} vs {dim})")
            size = dim
        result.append(size)
    return tuple(result)


def normalize_dims(dims: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    """Dims as sorted non-negative ints; None means all; InferError if out of range."""
    if dims is None:
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = (dims,)
    out = []
    for dim in dims:
        rank = max(ndim, 1)
        if not -rank <= dim < rank:
            raise InferError(f"dim {dim} is out of range for a tensor of {ndim} dimensions")
        out.append(dim % rank if ndim else 0)
    if len(set(out)) != len(out):
        raise InferError(f"dim {tuple(dims)} repeats a dimension")
    return tuple(sorted(out))


def require_float(types: Sequence[TensorType], op: str) -> None:
    for t in types:
        if not t.is_float:
            raise InferError(f"{op} needs float32 operands, got {t}", unsupported=True)


def f32_value(value: float) -> float:
    """A Python float holding exactly the float32 nearest ``value``."""
    return float(np.float32(value))
