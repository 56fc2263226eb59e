"""The reference interpreter: runs graph IR with numpy. It is the spec that
every pass and every generated kernel is checked against."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from bendc.errors import RuntimeCheckError
from bendc.ir.graph import Graph
from bendc.ops import OPS
from bendc.ops.gather import IndexRangeError


class Interpreter:
    """Evaluates a graph; the evaluation order is computed once."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.steps = [(node, OPS[node.op].reference) for node in graph.nodes() if node.op != "param"]
        constants = set(graph.constant_params())
        self.params = [p for p in graph.params if p not in constants]  # the caller's inputs
        self.constants = dict(zip(graph.constant_params(), graph.constant_values())) if constants else {}
        # A value can be dropped after its last use (keeps peak memory down).
        last_use: dict[int, int] = {}
        for position, (node, _) in enumerate(self.steps):
            for operand in node.inputs:
                last_use[operand] = position
        keep = set(graph.outputs)
        self.release = [
            [v for v in set(node.inputs) if last_use.get(v) == position and v not in keep]
            for position, (node, _) in enumerate(self.steps)
        ]

    def initial(self, inputs: Sequence[np.ndarray]) -> dict[int, np.ndarray]:
        """The parameters' values: the caller's inputs, in order, and the lifted constants."""
        values: dict[int, np.ndarray] = dict(zip(self.params, inputs))
        values.update(self.constants)
        return values

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        values = self.initial(inputs)
        for (node, reference), dead in zip(self.steps, self.release):
            try:
                result = reference([values[i] for i in node.inputs], node.attr)
            except IndexRangeError as error:
                raise RuntimeCheckError(str(error), loc=node.loc, op=node.op) from None
            result = np.asarray(result, dtype=node.type.np_dtype)
            assert result.shape == node.type.shape, (node, result.shape)
            values[node.id] = result
            for value in dead:
                del values[value]
        return [values[o] for o in self.graph.outputs]


def interpret(graph: Graph, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run ``graph`` on ``inputs`` (one array per parameter, in order; the lifted constants are the graph's)."""
    return Interpreter(graph).run(inputs)
