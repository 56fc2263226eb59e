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


@register("cse", "Merge nodes with the same op, operands and attributes (the lowest id survives); "
                "a value's later reshapes read its first reshape.")
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
    shared = _share_reshapes(graph)
    if shared:
        context.decide("cse", f"{shared} reshapes read another reshape of their operand")
    return graph


def _share_reshapes(graph: Graph) -> int:
    """reshape(x, s2) beside reshape(x, s1) -> reshape(reshape(x, s1), s2), the same values. Where x
    is strided (a permuted gradient: dq moved back to (B, T, H, D)), each reshape of it is a copy;
    chained, the later ones are views of the first one's copy. (The transformer's backward reshaped
    each of dq, dk, dv twice: to (B, T, H D) for the data gradient's product and to (B T, H D) for
    the weight gradient's, 24 copies a step.)"""
    first: dict[int, int] = {}
    shared = 0
    for id in graph.order():
        node = graph.node(id)
        if node.op != "reshape":
            continue
        source = node.inputs[0]
        if source not in first:
            first[source] = id
            continue
        graph.replace(node.replace(inputs=(first[source],)))
        shared += 1
    return shared
