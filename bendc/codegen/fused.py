"""The body of a fused elementwise kernel, shared by the CPU and CUDA renderers.

A fused group computes its members per cell of its iteration space (the
domain): each member reads its operands (a local of the kernel, an inlined
float32 constant, or an input read at the cell, broadcast or through a size-1
reshape) and renders its value with its op's ``scalar``; epilogue sums add
into the output cell their reduction keeps. The targets differ only in how
an input element is read and how the loops or threads are laid out.
"""
from __future__ import annotations

from typing import Callable

from bendc.ir.graph import Graph, Node
from bendc.ops import OPS
from bendc.ops.base import reduced_axes

__all__ = ["cell_index", "epilogues", "member_expression", "operand_reference", "reduction_index"]


def epilogues(graph: Graph, ids: list[int]) -> list[int]:
    """The members of a fused group that are epilogue sums (a reduction accumulated per cell)."""
    return [id for id in ids if reduced_axes(graph, graph.node(id)) is not None]


def broadcast_index(shape: tuple[int, ...], domain: tuple[int, ...], loops: list[str]) -> list[str]:
    """Index of a value of ``shape`` read at the domain cell: right-aligned, size-1 dims at 0."""
    lead = len(domain) - len(shape)
    return ["0" if d == 1 else loops[lead + axis] for axis, d in enumerate(shape)]


def unit_reshape_index(shape: tuple[int, ...], domain: tuple[int, ...], loops: list[str]) -> list[str]:
    """Index of the operand of a size-1 reshape: its non-1 dims are the domain's, in order."""
    wide = [loops[axis] for axis, d in enumerate(domain) if d != 1]
    return ["0" if d == 1 else wide.pop(0) for d in shape]


def operand_reference(graph: Graph, value: int, node: Node, local: dict[int, str], domain: tuple[int, ...],
                      loops: list[str], read: Callable[[int, list[str]], str]) -> str:
    """How a fused kernel's member ``node`` reads operand ``value`` at the current cell: a
    local of the kernel, an inlined float32 constant, or ``read(value, index)`` of an input
    (broadcast, size-1 reshape or one-element index). Shared by the CPU and CUDA renderers."""
    source = graph.node(value)
    if value in local:
        return local[value]
    if source.op == "const":
        return OPS["const"].lowering.scalar(value=source.attr["value"])
    shape = source.type.shape
    if source.type.numel == 1:
        return read(value, ["0"] * len(shape))
    if node.op == "reshape":
        return read(value, unit_reshape_index(shape, domain, loops))
    return read(value, broadcast_index(shape, domain, loops))


def cell_index(node: Node, domain: tuple[int, ...], loops: list[str]) -> str:
    """The row-major linear index of ``node``'s own element at the current cell, as an integer
    expression over the loop indexes (a member's shape is the domain's, or it has one element)."""
    if node.type.numel == 1:
        return "0"
    expression = ""
    for size, name in zip(node.type.shape, broadcast_index(node.type.shape, domain, loops)):
        expression = name if not expression else f"({expression} * {size} + {name})"
    return expression


def member_expression(node: Node, operands: list[str], domain: tuple[int, ...], loops: list[str],
                      cpu: bool = False) -> str:
    """One fused member's value over its operands' names: expand and size-1 reshape just read
    their operand (at the index ``operand_reference`` chose); other ops render their scalar (given
    the element's linear index too where the op's value depends on it: Lowering.cell_index), on
    the CPU its ``cpu_scalar`` where it has one for the node's attrs."""
    if node.op in ("expand", "reshape"):
        return operands[0]
    lowering = OPS[node.op].lowering
    if cpu and lowering.cpu_scalar is not None:
        expression = lowering.cpu_scalar(*operands, **node.attr)
        if expression is not None:
            return expression
    if lowering.cell_index:
        return lowering.scalar(*operands, index=cell_index(node, domain, loops), **node.attr)
    return lowering.scalar(*operands, **node.attr)


def reduction_index(graph: Graph, node: Node, loops: list[str]) -> list[str]:
    """The output cell a domain cell adds into: reduced axes dropped (or 0 where kept as size 1)."""
    axes = reduced_axes(graph, node)
    if node.type.ndim == len(loops) - len(axes):  # the reduced axes are dropped
        return [loop for axis, loop in enumerate(loops) if axis not in axes]
    # kept as size 1, after any leading axes that are dropped (sum_to_size)
    lead = len(loops) - node.type.ndim
    return ["0" if lead + axis in axes else loops[lead + axis] for axis in range(node.type.ndim)]
