"""Views on targets whose kernels index flat arrays (cuda): the access of every value.

Layout ops (permute, expand, basic indexing, reshape) only change a value's
offset and strides (bendc/kernels/access.py), so a kernel reads a transposed
or broadcast operand in place, without a copy. A reshape of a strided value
that no strides can describe (numpy would copy there too), and a view that
the caller gets back, are materialized by a copy kernel instead: ``resolve_accesses``
names those steps, and ``materialize`` turns them into ``write`` steps, which
the memory plan then gives a buffer.
"""
from __future__ import annotations

from collections import ChainMap
from dataclasses import dataclass, field

from bendc.codegen.plan import KernelPlan
from bendc.ir.graph import Graph
from bendc.kernels.access import Access, dense, expanded, indexed, permuted, reshaped
from runtime.dtypes import numel


@dataclass
class Views:
    """Every value's access, the layout steps that must be copied, and why (report lines)."""

    access: dict[int, Access]
    copies: set[str] = field(default_factory=set)
    decisions: list[str] = field(default_factory=list)


def resolve_accesses(plan: KernelPlan, graph: Graph) -> Views:
    """The access of every value, in launch order, and the layout steps that need a copy."""
    access: dict[int, Access] = {p: dense(p, plan.values[p][1]) for p in plan.params}
    outputs = set(plan.outputs)
    # A collective step hands its operands' arrays to the backend as they are: they must be dense.
    dense_reads = {value for step in plan.steps if step.kind == "collective" for value in step.inputs}
    views = Views(access)
    for step in plan.steps:
        if step.convention == "write":
            for value in step.outputs:
                access[value] = dense(value, plan.values[value][1])
            continue
        (value,) = step.outputs
        node = graph.node(value)
        if step.kind == "source":
            access[value] = dense(value, node.type.shape)
            continue
        view = view_access(graph, value, access[node.inputs[0]])
        if view is not None and value not in outputs and value not in dense_reads:
            access[value] = view
            continue
        views.copies.add(step.name)
        access[value] = dense(value, node.type.shape)
        why = ("it is returned to the caller" if value in outputs else
               "a collective reads it whole" if value in dense_reads else "no strides describe it")
        views.decisions.append(f"{step.name}: %{value} = {node.op} is copied into its own buffer ({why})")
    return views


def materialize(plan: KernelPlan, views: Views) -> None:
    """The copied layout steps write their own buffer: call before the memory plan reads conventions."""
    for step in plan.steps:
        if step.name in views.copies:
            step.convention = "write"


def view_access(graph: Graph, value: int, operand: Access) -> Access | None:
    """The access of a layout node's result given its operand's, or None when it needs a copy."""
    node = graph.node(value)
    source = graph.node(node.inputs[0]).type.shape
    attrs = node.attr
    if node.op == "permute":
        return permuted(operand, attrs["perm"])
    if node.op == "expand":
        return expanded(operand, source, node.type.shape)
    if node.op == "index":
        return indexed(operand, attrs["spec"])
    if node.op == "reshape":
        return reshaped(operand, source, node.type.shape)
    raise AssertionError(f"no strided view for {node.op}")


# ------------------------------------------------------------------ argument windows
def window(access: Access, shape: tuple[int, ...]) -> tuple[int, int]:
    """(first element, elements) of the root's flat array that a read of ``shape`` through ``access``
    can touch: from the lowest flat index to the highest."""
    if numel(shape) == 0:
        return 0, 0
    low = access.offset + sum((size - 1) * stride for size, stride in zip(shape, access.strides) if stride < 0)
    high = access.offset + sum((size - 1) * stride for size, stride in zip(shape, access.strides) if stride > 0)
    return low, high - low + 1


class StepReads(ChainMap):
    """The accesses as one step's kernels read them, and the elements of each input's argument.

    A kernel argument is the window of its root's flat array that the step reads (``window``), not
    the whole root: a view at an offset (a slice of a packed output, one of several results in one
    buffer) is passed from its first element, so the kernel's source holds no offset that depends
    on the batch, and a dense view of a longer root is an argument of exactly its cells, whose
    length the kernel can read its cell count from (kit.length_of). ``windows`` gives the runtime
    (runtime/cuda.py, runtime/cuda_graph.py) each input whose argument is not its root's whole
    array: (input position, first element, elements)."""

    def __init__(self, step, graph: Graph, access: dict[int, Access]) -> None:
        rebased: dict[int, Access] = {}
        self.lengths: dict[int, int] = {}
        self.windows: list[list[int]] = []
        for position, value in enumerate(step.inputs):
            read = access[value]
            root = graph.node(read.root).type.numel
            first, cells = window(read, graph.node(value).type.shape)
            if (first, cells) == (0, root):
                self.lengths[value] = root
                continue
            rebased[value] = Access(read.root, read.offset - first, read.strides)
            self.lengths[value] = cells
            self.windows.append([position, first, cells])
        super().__init__(rebased, access)
