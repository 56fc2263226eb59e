"""The graph in Graphviz dot format (``bendc ir --dot FILE``).

One box per IR node labelled with its value name, op (with attributes) and
type; parameters and the returned values stand out; an edge runs from each
operand to its user (once per operand position, so ``mul %a, %a`` has two).

```
digraph "step" {
  n0 [label="%x\nparam\nf32[32,64]", shape=ellipse];
  n2 [label="%2\nmatmul\nf32[32,16]"];
  n0 -> n2;
  ...
}
```
"""
from __future__ import annotations

from bendc.ir.graph import Graph, Node
from bendc.ir.printer import format_value, value_name


def quote(text: str) -> str:
    """A dot string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def node_label(graph: Graph, node: Node) -> str:
    """``%7`` / ``matmul[...]`` / ``f32[64,128]`` on three lines."""
    op = node.op
    if node.op == "param":
        op = "param (leaf)" if node.attr["leaf"] else "param"
    elif node.attrs:
        op += "[" + ", ".join(f"{key}={format_value(value)}" for key, value in node.attrs if key != "name") + "]"
    return f"{value_name(graph, node.id)}\n{op}\n{node.type}"


def node_style(graph: Graph, node: Node) -> str:
    if node.op == "param":
        return "shape=ellipse"
    if node.id in graph.outputs:
        return "shape=box, peripheries=2"
    return "shape=box"


def format_dot(graph: Graph) -> str:
    """The whole graph as a dot digraph, nodes in the printer's order, then a return node."""
    lines = [f"digraph {quote(graph.name)} {{", "  node [fontname=monospace];"]
    for node in graph.nodes():
        lines.append(f"  n{node.id} [label={quote(node_label(graph, node))}, {node_style(graph, node)}];")
    for node in graph.nodes():
        for operand in node.inputs:
            lines.append(f"  n{operand} -> n{node.id};")
    lines.append('  returned [label="return", shape=plaintext];')
    for position, output in enumerate(graph.outputs):
        lines.append(f'  n{output} -> returned [label="{position}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"
