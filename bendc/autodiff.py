"""The autodiff stage: traced graph -> joint forward + backward graph.

For each backward root (a scalar), VJP rules are applied newest-first (in
decreasing node id, i.e. reverse creation order, as PyTorch's engine runs
them), contributions are accumulated into each value's slot in that order,
and a broadcast operand's contribution is reduced to its shape
(sum_to_size). Constant operands are frozen: a rule is told which operands
need a gradient and builds nothing for the others. Finally every ``grad``
placeholder (a ``.grad`` read) becomes the sum, in backward-call order, of its
leaf's contributions from the roots it names.
"""
from __future__ import annotations

from bendc.builder import Builder
from bendc.errors import InternalError
from bendc.ir.graph import Graph
from bendc.ops import OPS


def requires_grad_set(graph: Graph) -> set[int]:
    """Values that require grad: leaves, and results of differentiable ops on them."""
    result: set[int] = set()
    for node in graph.nodes():
        if node.op == "param":
            if node.attr["leaf"]:
                result.add(node.id)
        elif OPS[node.op].differentiable and node.type.is_float and any(i in result for i in node.inputs):
            result.add(node.id)
    return result


class _Sweeps:
    """Backward sweeps, one per root, built once each."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.builder = Builder(graph)
        self.requires_grad = requires_grad_set(graph)
        self.leaves = {p for p in graph.params if graph.node(p).attr["leaf"]}
        self.done: dict[int, dict[int, int]] = {}

    def contributions(self, root: int) -> dict[int, int]:
        """leaf -> value of d root / d leaf, for the leaves the root reaches."""
        if root not in self.done:
            self.done[root] = self._sweep(root)
        return self.done[root]

    def _sweep(self, root: int) -> dict[int, int]:
        graph, b = self.graph, self.builder
        root_node = graph.node(root)
        if root_node.type.shape != ():
            raise InternalError(f"autodiff: backward root %{root} is not a scalar ({root_node.type})")
        b.loc, b.vjp_of = root_node.loc, root
        pending: dict[int, int] = {root: b.const(1.0)}
        relevant = (graph.ancestors(root) | {root}) & self.requires_grad
        for id in sorted(relevant, reverse=True):
            if id not in pending or id in self.leaves:
                continue
            node = graph.node(id)
            grad = pending.pop(id)
            needs = tuple(i in self.requires_grad for i in node.inputs)
            b.loc, b.vjp_of = node.loc, node.id
            contributions = OPS[node.op].vjp(b, node, grad, needs)
            if len(contributions) != len(node.inputs):
                raise InternalError(f"autodiff: the VJP of {node.op} returned {len(contributions)} "
                                    f"contributions for {len(node.inputs)} operands")
            for operand, contribution in zip(node.inputs, contributions):
                if contribution is None or operand not in self.requires_grad:
                    continue
                contribution = b.sum_to_size(contribution, b.shape(operand))
                if operand in pending:
                    pending[operand] = b.add(pending[operand], contribution)
                else:
                    pending[operand] = contribution
        b.loc = b.vjp_of = None
        return {leaf: value for leaf, value in pending.items() if leaf in self.leaves}


def differentiate(traced: Graph) -> Graph:
    """Resolve every grad placeholder of ``traced`` into backward nodes."""
    graph = traced.copy()
    sweeps = _Sweeps(graph)
    placeholders = [node for node in graph.nodes() if node.op == "grad"]
    resolved: dict[int, int] = {}
    for node in placeholders:
        leaf, *roots = node.inputs
        terms = [sweeps.contributions(root).get(leaf) for root in roots]
        terms = [t for t in terms if t is not None]
        if not terms:
            raise InternalError(f"autodiff: no backward root of %{node.id} reaches leaf %{leaf}")
        value = terms[0]
        sweeps.builder.loc = node.loc
        for term in terms[1:]:  # .grad accumulates across backward() calls in call order
            value = sweeps.builder.add(value, term)
        sweeps.builder.loc = None
        resolved[node.id] = value
    for node in placeholders:
        graph.replace_uses(node.id, resolved[node.id])
        graph.remove(node.id)
    return graph
