"""Common-subexpression elimination: one node per (op, operands, attrs)."""
from __future__ import annotations

import struct

from bendc.ir.graph import Graph
from bendc.passes.manager import PassContext, register


def _attr_key(value):
    """An attribute value as a key that tells apart what == does not: -0.0 from 0.0,
    1 from 1.0 and True; NaNs compare by bit pattern."""
    if isinstance(value, float):
        return ("float", struct.pack("<d", value))
    if isinstance(value, tuple):
        return ("tuple", tuple(_attr_key(v) for v in value))
    return (type(value).__name__, value)


@register("cse", "Merge nodes with the same op, operands and attributes (the lowest id survives).")
def common_subexpression_elimination(graph: Graph, context: PassContext) -> Graph:
    seen: dict[tuple, int] = {}
    merged = 0
    for id in graph.order():
        node = graph.node(id)
        if node.op == "param":
            continue
        key = (node.op, node.inputs, tuple((k, _attr_key(v)) for k, v in node.attrs), node.type)
        if key in seen:
            graph.replace_uses(id, seen[key])
            graph.remove(id)
            merged += 1
        else:
            seen[key] = id
    if merged:
        context.decide("cse", f"merged {merged} repeated nodes")
    return graph
