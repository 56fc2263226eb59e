"""The textual IR: one op a line, typed, parseable back (see parser.py).

```
func @step(%x: f32[32,64], %w: f32[16,64] leaf) -> (f32[], f32[16,64]) {
  %0 = permute[perm=(1,0)] %w                : f32[64,16]    # step.py:7
  %1 = matmul %x, %0                         : f32[32,16]    # step.py:7
  ...
  %9 = mul %8, %2                            : f32[32,16]    # vjp of %3 (step.py:8)
  return %7, %13
}
```
"""
from __future__ import annotations

import json

import numpy as np

from bendc.ir.graph import Graph, Node

TYPE_COLUMN = 44
COMMENT_COLUMN = 62


def format_value(value) -> str:
    """An attribute value as IR text (floats as their shortest float32 form)."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(np.float32(value))
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, tuple):
        items = ",".join(format_value(v) for v in value)
        return f"({items},)" if len(value) == 1 else f"({items})"
    raise TypeError(f"cannot print attribute value {value!r}")


def value_name(graph: Graph, id: int) -> str:
    if id not in graph:  # an undefined operand: the verifier prints the broken line
        return f"%{id}"
    node = graph.node(id)
    if node.op == "param":
        return f"%{node.attr['name']}"
    return f"%{id}"


def format_context(graph: Graph, ids, limit: int = 40) -> str:
    """The IR lines of ``ids`` with their operands and users, in order: what an internal error
    shows of the graph (at most ``limit`` lines, the named nodes first)."""
    named = [id for id in ids if id in graph]
    around = {i for id in named for i in graph.node(id).inputs + tuple(graph.users(id))} - set(named)
    shown = (named + sorted(around))[:limit]
    order = {id: position for position, id in enumerate(graph.order())}
    lines = [("=>" if id in named else "  ") + " " + format_node(graph, graph.node(id))
             for id in sorted(shown, key=order.get)]
    hidden = len(named) + len(around) - len(shown)
    return "\n".join(lines + ([f"   ... {hidden} more"] if hidden > 0 else []))


def node_comment(node: Node) -> str:
    """``[k3] vjp of %12 (mlp.py:36)``: fused kernel, VJP origin, user's line."""
    parts = []
    if node.kernel is not None:
        parts.append(f"[k{node.kernel}]")
    if node.vjp_of is not None:
        parts.append(f"vjp of %{node.vjp_of}")
    if node.loc is not None:
        parts.append(f"({node.loc.short})" if node.vjp_of is not None else node.loc.short)
    return " ".join(parts)


def format_node(graph: Graph, node: Node) -> str:
    text = f"{value_name(graph, node.id)} = {node.op}"
    if node.attrs:
        text += "[" + ", ".join(f"{k}={format_value(v)}" for k, v in node.attrs) + "]"
    if node.inputs:
        text += " " + ", ".join(value_name(graph, i) for i in node.inputs)
    text = f"{text:<{TYPE_COLUMN}} : {node.type}"
    comment = node_comment(node)
    if comment:
        text = f"{text:<{COMMENT_COLUMN}} # {comment}"
    return text


def format_graph(graph: Graph) -> str:
    """The whole function as IR text, nodes in deterministic topological order."""
    params = []
    for id in graph.params:
        node = graph.node(id)
        leaf = " leaf" if node.attr["leaf"] else ""
        if "const" in node.attr:  # a lifted constant: its values live outside the text, named by hash
            leaf = f" const={node.attr['const']}"
        params.append(f"%{node.attr['name']}: {node.type}{leaf}")
    result_types = ", ".join(str(graph.node(o).type) for o in graph.outputs)
    lines = [f"func @{graph.name}({', '.join(params)}) -> ({result_types}) {{"]
    for node in graph.nodes():
        if node.op != "param":
            lines.append("  " + format_node(graph, node))
    returned = ", ".join(value_name(graph, o) for o in graph.outputs)
    lines.append(f"  return {returned}".rstrip())
    lines.append("}")
    return "\n".join(lines) + "\n"
