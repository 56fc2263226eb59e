"""The pass manager: named passes run in order, the verifier after each, the
IR text kept for every stage, and BENDC_DUMP_DIR dumps."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from bendc.errors import BendcError, InternalError, UnsupportedError, user_location
from bendc.ir.graph import Graph
from bendc.ir.printer import format_graph
from bendc.ir.verify import verify


@dataclass
class PassContext:
    """What passes record: decisions with reasons, for the compile report; and the target the
    graph is compiled for (passes whose choice depends on it read it)."""

    decisions: list[tuple[str, str]] = field(default_factory=list)
    target: str = "cpu"

    def decide(self, pass_name: str, text: str) -> None:
        self.decisions.append((pass_name, text))


@dataclass(frozen=True)
class Pass:
    """A named graph -> graph rewrite. A pass with options (a frozen dataclass) is called as
    ``run(graph, context, options)``; one without as ``run(graph, context)``."""

    name: str
    run: Callable[..., Graph]
    doc: str = ""
    options: Any = None

    def apply(self, graph: Graph, context: PassContext) -> Graph:
        if self.options is None:
            return self.run(graph, context)
        return self.run(graph, context, self.options)

    def configured(self, name: str, doc: str, **fields: Any) -> "Pass":
        """This pass under another name with some options changed."""
        return Pass(name, self.run, doc, replace(self.options, **fields))


PASSES: dict[str, Pass] = {}


def register(name: str, doc: str, options: Any = None) -> Callable:
    """Register ``fn`` as the pass ``name`` (with its default ``options``, if it takes any)."""
    def wrap(fn: Callable[..., Graph]) -> Callable:
        PASSES[name] = Pass(name, fn, doc, options)
        return fn

    return wrap


def register_variant(base: str, name: str, doc: str, **fields: Any) -> None:
    """Register pass ``base`` with options changed as the pass ``name`` (e.g. a forced choice)."""
    PASSES[name] = PASSES[base].configured(name, doc, **fields)


def get_pass(name: str) -> Pass:
    if name not in PASSES:
        raise UnsupportedError(f"unknown pass {name!r}; known passes: {', '.join(sorted(PASSES))}",
                               loc=user_location(), op="passes")
    return PASSES[name]


def default_passes() -> list[str]:
    return ["dce", "canonicalize", "cse", "attention_schedule", "fuse"]


StageCallback = Callable[[str, Graph], None]


class Pipeline:
    """Runs passes in order; ``on_stage(name, graph)`` is called after each."""

    def __init__(self, passes: Sequence[str | Pass]) -> None:
        self.passes = [p if isinstance(p, Pass) else get_pass(p) for p in passes]
        names = [p.name for p in self.passes]
        if len(set(names)) != len(names):
            raise UnsupportedError(f"pass names repeat in {names}", loc=user_location(), op="passes")

    def run(self, graph: Graph, context: PassContext, on_stage: StageCallback) -> Graph:
        for pass_ in self.passes:
            try:
                graph = pass_.apply(graph.copy(), context)
            except BendcError:
                raise
            except Exception as error:  # a bug in the pass: name it and show what it was given
                raise InternalError(f"pass {pass_.name!r} failed: {type(error).__name__}: {error}",
                                    op=pass_.name, context=_graph_head(graph)) from error
            verify(graph, pass_.name, allow_placeholders=False)
            on_stage(pass_.name, graph)
        return graph


def _graph_head(graph: Graph, limit: int = 40) -> str:
    """The pass's input graph as IR text, cut to ``limit`` lines (BENDC_DUMP_DIR has every stage)."""
    lines = format_graph(graph).splitlines()
    if len(lines) <= limit:
        return "\n".join(lines)
    return "\n".join(lines[:limit] + [f"... {len(lines) - limit} more lines (BENDC_DUMP_DIR=dir writes every stage)"])
