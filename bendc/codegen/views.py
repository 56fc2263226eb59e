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

from dataclasses import dataclass, field

from bendc.codegen.plan import KernelPlan
from bendc.ir.graph import Graph
from bendc.kernels.access import Access, dense, expanded, indexed, permuted, reshaped


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
