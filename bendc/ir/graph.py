"""The graph IR: frozen typed nodes held in a networkx DiGraph.

Operand order lives on the node (``Node.inputs``); the networkx edges are
derived from it (``x * x`` has one edge and two uses). Iteration is always in
the deterministic topological order of :meth:`Graph.order` (node id breaks
ties), so printed IR is stable.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Hashable, Iterator

import networkx as nx

from bendc.errors import SourceLoc
from bendc.ir.types import TensorType

AttrValue = Any  # int | float | bool | str | None | tuple of these


@dataclass(frozen=True)
class Node:
    """One IR value: ``%id = op[attrs] inputs : type  # comment``.

    ``attrs`` is a tuple of (name, value) pairs sorted by name, so nodes
    compare and hash by value. ``loc`` is the user's source line the node came
    from; ``vjp_of`` names the forward node whose vector-Jacobian product it
    is part of; ``kernel`` is the fused kernel the fusion pass put it in.
    """

    id: int
    op: str
    inputs: tuple[int, ...]
    attrs: tuple[tuple[str, AttrValue], ...]
    type: TensorType
    loc: SourceLoc | None = field(default=None, compare=False)
    vjp_of: int | None = field(default=None, compare=False)
    kernel: int | None = field(default=None, compare=False)

    @property
    def attr(self) -> dict[str, AttrValue]:
        return dict(self.attrs)

    def replace(self, **changes: Any) -> Node:
        """A copy with some fields changed (nodes are immutable)."""
        if "attrs" in changes and isinstance(changes["attrs"], dict):
            changes["attrs"] = make_attrs(changes["attrs"])
        return replace(self, **changes)


def make_attrs(attrs: dict[str, AttrValue]) -> tuple[tuple[str, AttrValue], ...]:
    return tuple(sorted(attrs.items()))


class Graph:
    """A function in graph IR: parameters, nodes, outputs.

    Passes use these methods, not networkx directly.
    """

    def __init__(self, name: str = "f") -> None:
        self.name = name
        self._nx = nx.DiGraph()
        self.params: list[int] = []
        self.outputs: list[int] = []
        # The values of the lifted constants (parameters with a ``const`` attribute: a large tensor the
        # traced function captured), by parameter name. The IR text names them by content hash only;
        # programs hold the arrays and pass them after the caller's inputs (runtime/artifact.py).
        self.constants: dict[str, Any] = {}
        self._next_id = 0
        self._order: list[int] | None = None  # order(), kept until an edge or node changes

    # ----------------------------------------------------------- building
    def add(
        self,
        op: str,
        inputs: tuple[int, ...] | list[int],
        attrs: dict[str, AttrValue] | None,
        type: TensorType,
        *,
        loc: SourceLoc | None = None,
        vjp_of: int | None = None,
        kernel: int | None = None,
        id: int | None = None,
    ) -> Node:
        """Add a node; its id is the next free one unless given."""
        if id is None:
            id = self._next_id
        assert id not in self._nx, f"duplicate node id %{id}"
        self._next_id = max(self._next_id, id + 1)
        node = Node(id, op, tuple(inputs), make_attrs(attrs or {}), type, loc, vjp_of, kernel)
        self._put(node)
        if op == "param":
            self.params.append(id)
        return node

    def _put(self, node: Node) -> None:
        for operand in node.inputs:
            assert operand in self._nx, f"%{node.id} uses undefined %{operand}"
        self._order = None
        self._nx.add_node(node.id, node=node)
        for operand in set(node.inputs):
            self._nx.add_edge(operand, node.id)

    def replace(self, node: Node) -> None:
        """Put a changed node in place of the node with the same id."""
        old = self.node(node.id)
        if set(old.inputs) != set(node.inputs):
            self._order = None
        for operand in set(old.inputs) - set(node.inputs):
            self._nx.remove_edge(operand, node.id)
        self._nx.nodes[node.id]["node"] = node
        for operand in set(node.inputs):
            assert operand in self._nx, f"%{node.id} uses undefined %{operand}"
            self._nx.add_edge(operand, node.id)

    def replace_uses(self, old: int, new: int) -> None:
        """Make every use of ``old`` (operands and outputs) a use of ``new``."""
        for user in list(self.users(old)):
            node = self.node(user)
            inputs = tuple(new if i == old else i for i in node.inputs)
            self.replace(node.replace(inputs=inputs))
        self.outputs = [new if o == old else o for o in self.outputs]

    def remove(self, id: int) -> None:
        assert not list(self._nx.successors(id)), f"%{id} still has users"
        self._order = None
        self._nx.remove_node(id)
        if id in self.params:
            self.params.remove(id)

    # ----------------------------------------------------------- reading
    def node(self, id: int) -> Node:
        return self._nx.nodes[id]["node"]

    def __contains__(self, id: int) -> bool:
        return id in self._nx

    def __len__(self) -> int:
        return self._nx.number_of_nodes()

    def users(self, id: int) -> list[int]:
        """Ids of the nodes that use ``id`` as an operand, in id order."""
        return sorted(self._nx.successors(id))

    def order(self) -> list[int]:
        """Node ids in deterministic topological order (lowest id first); computed once per shape of
        the graph (passes read it many times between changes)."""
        if self._order is None:
            self._order = list(nx.lexicographical_topological_sort(self._nx, key=lambda n: n))
        return list(self._order)

    def nodes(self) -> Iterator[Node]:
        for id in self.order():
            yield self.node(id)

    def ancestors(self, id: int) -> set[int]:
        return nx.ancestors(self._nx, id)

    def descendants(self, id: int) -> set[int]:
        return nx.descendants(self._nx, id)

    def is_acyclic(self) -> bool:
        return nx.is_directed_acyclic_graph(self._nx)

    def contract(self, unit_of: Callable[[int], Hashable | None]) -> nx.DiGraph:
        """The graph of units (groups of nodes, e.g. kernels): an edge where a node of one unit
        reads a value of another. Nodes whose unit is None are left out. Units are added in the
        topological order of their first node."""
        contracted = nx.DiGraph()
        for id in self.order():
            unit = unit_of(id)
            if unit is None:
                continue
            contracted.add_node(unit)
            for operand in self.node(id).inputs:
                source = unit_of(operand)
                if source is not None and source != unit:
                    contracted.add_edge(source, unit)
        return contracted

    def copy(self) -> Graph:
        other = Graph(self.name)
        other._nx = self._nx.copy()
        other.params = list(self.params)
        other.outputs = list(self.outputs)
        other.constants = dict(self.constants)
        other._next_id = self._next_id
        other._order = self._order
        return other

    def constant_params(self) -> list[int]:
        """The lifted constants' parameters, in order: always the last parameters."""
        return [p for p in self.params if "const" in self.node(p).attr]

    def constant_values(self) -> list[Any]:
        """The lifted constants' arrays in parameter order (a program passes them after the inputs)."""
        missing = [self.node(p).attr["name"] for p in self.constant_params()
                   if self.node(p).attr["name"] not in self.constants]
        if missing:
            raise ValueError(f"the graph {self.name} lacks the values of its lifted constants {missing} (IR text "
                             "names them by hash only: parsed IR needs them from the trace or the artifact)")
        return [self.constants[self.node(p).attr["name"]] for p in self.constant_params()]

    @property
    def next_id(self) -> int:
        return self._next_id
