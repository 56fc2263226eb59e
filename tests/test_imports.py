"""The import graph of bendc/ and runtime/, read with ``ast`` (nothing is imported).

What counts as an edge A -> B (A, B modules under bendc/ or runtime/; a package's
``__init__.py`` is the module named after the package):

- every ``import`` statement anywhere in A: module level, inside functions, inside
  ``if``/``try`` blocks (a function-level import is still a dependency, it is only
  paid later);
- ``import a.b.c`` -> a.b.c only. Python also runs ``a/__init__`` and
  ``a/b/__init__``, but counting those would make every submodule depend on its
  package (and close a cycle wherever a package's ``__init__`` re-exports a
  submodule), so only the module named counts;
- ``from a.b import c`` -> a.b.c when a/b/c.py (or a/b/c/) is a module, else
  a.b (its ``__init__``), where the name c is defined;
- relative imports are resolved against A's package (A itself for an ``__init__``);
- imports of anything outside bendc/ and runtime/ are ignored, and so are
  imports of a module by itself.

Strings passed to importlib are not seen (there are none today).
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bendc", "runtime")


@dataclass(frozen=True)
class Edge:
    source: str  # importing module
    target: str  # imported module
    path: str    # file of the import, relative to the repository root
    line: int

    def __str__(self) -> str:
        return f"{self.source} -> {self.target}  ({self.path}:{self.line})"


def module_name(relative: Path) -> str:
    """``bendc/ir/graph.py`` -> ``bendc.ir.graph``; ``bendc/ops/__init__.py`` -> ``bendc.ops``."""
    parts = list(relative.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def find_modules(root: Path = ROOT, packages=PACKAGES) -> dict[str, Path]:
    """Module name -> file, for every .py file under the packages."""
    modules = {}
    for package in packages:
        for directory, subdirs, files in os.walk(root / package):
            subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    path = Path(directory, name)
                    modules[module_name(path.relative_to(root))] = path
    return modules


def imports_of(source_module: str, is_package: bool, text: str, modules, path: str = "") -> list[Edge]:
    """The edges from one module's source text to the known ``modules``."""
    # Names that are packages (directories), with or without an __init__: relative
    # imports climb through them and "from pkg import x" may name a submodule of them.
    packages = {m.rsplit(".", i)[0] for m in modules for i in range(m.count(".") + 1)}
    own_package = source_module if is_package else source_module.rpartition(".")[0]
    edges = []

    def add(target: str, line: int) -> None:
        edge = Edge(source_module, target, path, line)
        if target in modules and target != source_module and edge not in edges:  # one per statement
            edges.append(edge)

    for node in ast.walk(ast.parse(text, filename=path or source_module)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = own_package.split(".") if own_package else []
                if node.level - 1 > len(parts):
                    raise ValueError(f"{path}:{node.lineno}: relative import beyond the top package")
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if alias.name != "*" and (submodule in modules or submodule in packages):
                    add(submodule, node.lineno)
                else:
                    add(base, node.lineno)
    return edges


def import_graph(root: Path = ROOT, packages=PACKAGES) -> tuple[dict[str, Path], list[Edge]]:
    modules = find_modules(root, packages)
    edges = []
    for name, path in modules.items():
        edges += imports_of(name, path.name == "__init__.py", path.read_text(), modules,
                            str(path.relative_to(root)))
    return modules, edges


def strongly_connected(nodes, edges: list[Edge]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components of more than one module, sorted."""
    successors: dict[str, list[str]] = {n: [] for n in nodes}
    for edge in edges:
        successors[edge.source].append(edge.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in sorted(successors):
        if start in index:
            continue
        work = [(start, iter(sorted(set(successors[start]))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(set(successors[child])))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components, key=lambda c: (-len(c), c))


def describe_cycles(components: list[list[str]], edges: list[Edge]) -> str:
    lines = []
    for component in components:
        members = set(component)
        lines.append(f"cycle of {len(component)} modules: {', '.join(component)}")
        inside = sorted((e for e in edges if e.source in members and e.target in members),
                        key=lambda e: (e.source, e.target, e.line))
        lines += [f"    {edge}" for edge in inside]
    return "\n".join(lines)


# --- the analysis itself, on small made-up packages -------------------------------------

FAKE_MODULES = {name: Path() for name in
                ("pkg", "pkg.a", "pkg.b", "pkg.sub", "pkg.sub.c", "pkg.nsp.d", "other")}


def _targets(module: str, text: str, is_package: bool = False) -> list[str]:
    return sorted(e.target for e in imports_of(module, is_package, textwrap.dedent(text), FAKE_MODULES))


def test_analysis_resolves_every_import_form():
    assert _targets("pkg.a", "import pkg.b") == ["pkg.b"]
    assert _targets("pkg.a", "import pkg.sub.c as c") == ["pkg.sub.c"]  # not pkg, not pkg.sub
    assert _targets("pkg.a", "from pkg import b") == ["pkg.b"]  # a submodule
    assert _targets("pkg.a", "from pkg import helper") == ["pkg"]  # a name in pkg/__init__
    assert _targets("pkg.a", "from pkg.sub import c, thing") == ["pkg.sub", "pkg.sub.c"]
    assert _targets("pkg.a", "from . import b") == ["pkg.b"]
    assert _targets("pkg.a", "from .sub import c") == ["pkg.sub.c"]
    assert _targets("pkg.sub.c", "from .. import a\nfrom ..b import x") == ["pkg.a", "pkg.b"]
    assert _targets("pkg.sub", "from . import c", is_package=True) == ["pkg.sub.c"]
    assert _targets("pkg.sub", "from .. import b", is_package=True) == ["pkg.b"]
    assert _targets("pkg.a", "from pkg.nsp import d") == ["pkg.nsp.d"]  # namespace package
    assert _targets("pkg.a", "def f():\n    import pkg.b\n    from other import x") == ["other", "pkg.b"]
    assert _targets("pkg.a", "try:\n    import numpy\nexcept ImportError:\n    import pkg.b") == ["pkg.b"]
    assert _targets("pkg.a", "from pkg.a import x\nimport os") == []  # itself, outside


def test_cycle_report_names_each_import():
    edges = [Edge("m.a", "m.b", "m/a.py", 3), Edge("m.b", "m.c", "m/b.py", 4),
             Edge("m.c", "m.a", "m/c.py", 9), Edge("m.c", "m.d", "m/c.py", 10)]
    components = strongly_connected(["m.a", "m.b", "m.c", "m.d"], edges)
    assert components == [["m.a", "m.b", "m.c"]]
    report = describe_cycles(components, edges)
    assert "m.c -> m.a  (m/c.py:9)" in report and "m.d" not in report


def test_analysis_sees_the_real_tree():
    modules, edges = import_graph()
    assert {"bendc", "bendc.ir.graph", "bendc.passes.manager", "runtime", "runtime.cpu"} <= set(modules)
    assert any(e.source == "runtime.artifact" and e.target == "runtime.cpu" for e in edges)
    assert any(e.source == "bendc.passes.manager" and e.target == "bendc.ir.graph" for e in edges)


# --- the architecture rules ------------------------------------------------------------------

def test_no_import_cycles():
    modules, edges = import_graph()
    components = strongly_connected(modules, edges)
    assert not components, "import cycles (every import inside each cycle listed):\n" + \
        describe_cycles(components, edges)


def test_runtime_never_imports_bendc():
    # Read the statements themselves, not the resolved edges: an import of a bendc
    # module that does not exist (any more) counts too.
    found = []
    for name, path in find_modules().items():
        if name.split(".")[0] != "runtime":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            found += [f"    {path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if n.split(".")[0] == "bendc"]
    assert not found, "runtime/ must run without the compiler:\n" + "\n".join(found)


def _loaded_after(statement: str, prefixes: tuple[str, ...]) -> list[str]:
    """Top-level packages among ``prefixes`` in sys.modules after running ``statement`` in a
    fresh interpreter, from the repository root."""
    code = (f"import sys\n{statement}\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(prefixes)!r}))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return ast.literal_eval(result.stdout.strip().splitlines()[-1])


def test_import_bendc_is_light():
    assert _loaded_after("import bendc", ("networkx", "numba")) == []


def test_import_runtime_leaves_the_compiler_out():
    assert _loaded_after("import runtime", ("bendc", "networkx")) == []


if __name__ == "__main__":  # print today's graph report: python tests/test_imports.py
    found_modules, found_edges = import_graph()
    print(f"{len(found_modules)} modules, {len(found_edges)} edges")
    print(describe_cycles(strongly_connected(found_modules, found_edges), found_edges) or "no cycles")
