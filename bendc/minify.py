"""``bendc minify``: a standalone repro file for a kernel the self-check found wrong.

The repro holds the failing kernel alone: its IR nodes (with their fusion
group, so they compile to the same kernel) as a function whose parameters
are the values the kernel reads, those values as they were at the failing
call (the reference interpreter's, embedded as a compressed .npz), and a
main that compiles it with bendc's cpu backend, runs it beside the
reference interpreter and exits 1 when the kernel still leaves the
tolerance (0 when it no longer reproduces).
"""
from __future__ import annotations

import base64
import io
import re

import numpy as np

from bendc.check import KernelMismatchError
from bendc.ir.graph import Graph
from bendc.ir.printer import format_node
from runtime.files import atomic_write

_VALUE = re.compile(r"%(\w+)")

TEMPLATE = '''"""bendc repro: kernel {step} ({op} at {loc}) leaves the self-check's tolerance.

Written by `bendc minify`. Run it with bendc importable: python {name}
Exit code 1: it reproduces; 0: it does not.
"""
import base64
import io
import sys
import tempfile

import numpy as np

from bendc.check import worst_element
from bendc.compile import build_cpu
from bendc.ir.interp import Interpreter
from bendc.ir.parser import parse_graph
from bendc.ir.verify import verify

IR = """\\
{ir}"""

INPUTS = base64.b64decode(
    "{inputs}")


def main() -> int:
    graph = parse_graph(IR)
    verify(graph, "repro", allow_placeholders=False)
    with np.load(io.BytesIO(INPUTS)) as stored:
        inputs = [stored[name] for name in {names!r}]
    want = Interpreter(graph).run([np.array(a) for a in inputs])
    with tempfile.TemporaryDirectory() as cache:
        got = build_cpu(graph, cache).run([np.array(a) for a in inputs])
    failed = 0
    for index, (g, w) in enumerate(zip(got, want)):
        found = worst_element(g, w)
        if found is not None:
            where = found[0]
            print(f"output {{index}}: worst element {{list(where)}}: kernel {{np.asarray(g)[where]!r}}, "
                  f"reference {{np.asarray(w)[where]!r}}")
            failed = 1
    print("reproduces" if failed else "does not reproduce")
    return failed


if __name__ == "__main__":
    sys.exit(main())
'''


def repro_source(error: KernelMismatchError, path: str = "repro.py") -> str:
    """The repro file's text for a self-check failure (with its graph and reference values)."""
    graph: Graph = error.graph
    nodes = set(error.nodes)
    order = [id for id in graph.order() if id in nodes]
    external: list[int] = []
    for id in order:
        for operand in graph.node(id).inputs:
            if operand not in nodes and operand not in external:
                external.append(operand)
    names = {}
    for id in external:
        node = graph.node(id)
        names[id] = node.attr["name"] if node.op == "param" else f"t{id}"
    outputs = [id for id in order if id in graph.outputs or any(u not in nodes for u in graph.users(id))]
    if error.node not in outputs:
        outputs.append(error.node)

    def rename(line: str) -> str:
        code, hash, comment = line.partition("  #")
        code = _VALUE.sub(lambda m: f"%{names[int(m[1])]}" if m[1].isdigit() and int(m[1]) in names else m[0],
                          code)
        return code + hash + comment

    params = ", ".join(f"%{names[id]}: {graph.node(id).type}" for id in external)
    results = ", ".join(str(graph.node(id).type) for id in outputs)
    lines = [f"func @repro_{error.step}({params}) -> ({results}) {{"]
    lines += ["  " + rename(format_node(graph, graph.node(id))) for id in order]
    lines += [f"  return {', '.join(f'%{id}' for id in outputs)}", "}"]
    stream = io.BytesIO()
    np.savez_compressed(stream, **{names[id]: np.asarray(error.reference[id]) for id in external})
    encoded = base64.b64encode(stream.getvalue()).decode()
    wrapped = '"\n    "'.join(encoded[i:i + 96] for i in range(0, len(encoded), 96))
    return TEMPLATE.format(step=error.step, op=error.op, loc=error.loc, name=path, ir="\n".join(lines) + "\n",
                           inputs=wrapped, names=[names[id] for id in external])


def write_repro(error: KernelMismatchError, path: str) -> None:
    atomic_write(path, repro_source(error, path))
