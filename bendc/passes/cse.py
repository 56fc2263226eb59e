"""Common-subexpression elimination: one node per (op, operands, attrs)."""
from __future__ import annotations

from bendc.ir.graph import Graph
from bendc.passes.manager import PassContext, register


@register("cse", "Merge nodes with the same op, operands and attributes (the lowest id survives).")
def common_subexpression_elimination(graph: Graph, context: PassContext) -> Graph:
    seen: dict[tuple, int] = {}
    merged = 0
    for id in graph.order():
        node = graph.node(id)
        if node.op == "param":
            continue
        key = (node.op, node.inputs, node.attrs, node.type)
        if key in seen:
            graph.replace_uses(id, seen[key])
            graph.remove(id)
            merged += 1
        else:
            seen[key] = id
    if merged:
        context.decide("cse", f"merged {merged} repeated nodes")
    return graph
