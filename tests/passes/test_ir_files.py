"""IR-text pass tests, the MLIR FileCheck habit: one ``tests/passes/*.ir`` file per case.

File format
-----------
Lines that start with ``#`` in column 0 are directives or comments; every other line
is IR text (bendc's textual IR, as ``bendc.ir.printer.format_graph`` prints it; node
lines are indented, so their own ``# file.py:3`` comments are never directives)::

    # What rule this file checks, in a sentence or two (free comment lines).
    # RUN: dce, cse
    func @f(%x: f32[4]) -> (f32[4]) {
      ...
    }
    # EXPECT:
    func @f(%x: f32[4]) -> (f32[4]) {
      ...
    }
    # DECISION: cse: merged 1 repeated nodes

- ``# RUN: a, b`` (exactly one): the pass pipeline, names from ``bendc.passes.PASSES``,
  run in order by ``bendc.passes.Pipeline`` (the verifier runs after each pass);
- the IR text between the directives above and ``# EXPECT:`` is the input graph;
- ``# EXPECT:`` (exactly one) starts the expected output: ``format_graph`` of the
  result, compared exactly (a unified diff on mismatch). The expected text must also
  parse and print back identically, so it is always canonical printer output;
- ``# DECISION: pass: text`` (any number, anywhere): each must be, verbatim, one of the
  decisions the passes record in the ``PassContext`` (``f"{pass}: {text}"``, as in the
  compile report; trailing spaces aside); decisions not listed are not checked;
- blank lines around the IR blocks are ignored; other ``#`` lines are comments.

Every registered pass must appear in the RUN line of at least one file.

Regenerating one file by hand
-----------------------------
``PYTHONPATH=. python tests/passes/test_ir_files.py tests/passes/cse.ir > /tmp/cse.ir``
prints the file back with its EXPECT block (and its DECISION lines: every decision
the passes record now) replaced by today's output. Read the diff against the old
file, delete the DECISION lines not worth pinning, and only then copy it over: a
wrong expectation is worse than none.
"""
from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bendc.ir.parser import parse_graph
from bendc.ir.printer import format_graph
from bendc.ir.verify import verify
from bendc.passes import PASSES, PassContext, Pipeline

HERE = Path(__file__).resolve().parent
FILES = sorted(HERE.glob("*.ir"))


@dataclass
class IrCase:
    path: Path
    passes: list[str]
    input: str
    expected: str
    decisions: list[str] = field(default_factory=list)
    header: list[str] = field(default_factory=list)  # the lines before "# EXPECT:", for regeneration


def _block(lines: list[str]) -> str:
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return "\n".join(lines) + "\n" if lines else ""


def read_case(path: Path, *, new: bool = False) -> IrCase:
    """The case in one file; ``new``: the EXPECT block may be empty (a file being written)."""
    passes: list[str] | None = None
    decisions: list[str] = []
    sections: dict[str, list[str]] = {"input": [], "expect": []}
    header: list[str] = []
    section = "input"
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        where = f"{path.name}:{number}"
        if line.startswith("#"):
            directive = line[1:].strip()
            if directive.startswith("RUN:"):
                if passes is not None or section != "input":
                    raise ValueError(f"{where}: one '# RUN:' line, before '# EXPECT:'")
                passes = [p.strip() for p in directive[len("RUN:"):].split(",") if p.strip()]
            elif directive.startswith("EXPECT:"):
                if section == "expect" or directive[len("EXPECT:"):].strip():
                    raise ValueError(f"{where}: one '# EXPECT:' line, alone on its line")
                section = "expect"
                continue
            elif directive.startswith("DECISION:"):
                decisions.append(directive[len("DECISION:"):].strip())
                continue
            if section == "input":
                header.append(line)
            continue
        sections[section].append(line)
        if section == "input":
            header.append(line)
    if not passes:
        raise ValueError(f"{path.name}: no '# RUN: pass, ...' line")
    if section != "expect":
        raise ValueError(f"{path.name}: no '# EXPECT:' line")
    case = IrCase(path, passes, _block(sections["input"]), _block(sections["expect"]), decisions,
                  _block(header).splitlines())
    if not case.input or not (case.expected or new):
        raise ValueError(f"{path.name}: the input or the expected IR is empty")
    return case


def run_case(case: IrCase) -> tuple[str, PassContext]:
    graph = parse_graph(case.input)
    verify(graph, "input", allow_placeholders=False)
    context = PassContext()
    result = Pipeline(case.passes).run(graph, context, on_stage=lambda name, g: None)
    return format_graph(result), context


def _diff(expected: str, actual: str, name: str) -> str:
    return "".join(difflib.unified_diff(expected.splitlines(keepends=True), actual.splitlines(keepends=True),
                                        fromfile=f"{name} (# EXPECT:)", tofile=f"{name} (actual)"))


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_ir_file(path: Path):
    case = read_case(path)
    actual, context = run_case(case)
    if actual != case.expected:
        pytest.fail(f"{path.name}: output of {', '.join(case.passes)} differs:\n"
                    f"{_diff(case.expected, actual, path.name)}", pytrace=False)
    recorded = [f"{name}: {text}".rstrip() for name, text in context.decisions]
    missing = [d for d in case.decisions if d not in recorded]
    if missing:
        pytest.fail(f"{path.name}: decisions not recorded:\n" + "".join(f"    {d}\n" for d in missing)
                    + "recorded:\n" + "".join(f"    {d}\n" for d in recorded), pytrace=False)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_expected_ir_round_trips(path: Path):
    expected = read_case(path).expected
    printed = format_graph(parse_graph(expected))
    if printed != expected:
        pytest.fail(f"{path.name}: the EXPECT block is not what the printer prints for it:\n"
                    f"{_diff(expected, printed, path.name)}", pytrace=False)


def test_every_registered_pass_has_a_file():
    used = {name for path in FILES for name in read_case(path).passes}
    assert set(PASSES) <= used, f"passes with no tests/passes/*.ir file: {sorted(set(PASSES) - used)}"


def regenerated(path: Path) -> str:
    """The file with its EXPECT block and DECISION lines from the passes as they are now."""
    case = read_case(path, new=True)
    actual, context = run_case(case)
    lines = case.header + ["# EXPECT:"] + actual.splitlines()
    lines += [f"# DECISION: {name}: {text}".rstrip() for name, text in context.decisions]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    for argument in sys.argv[1:]:
        sys.stdout.write(regenerated(Path(argument)))
