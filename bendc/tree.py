"""Pytrees: nested containers of arrays, flattened to leaves and a structure (treedef).

```python
leaves, treedef = bendc.tree.flatten({"w": w, "layers": [a, b], "bias": None})
tree = bendc.tree.unflatten(treedef, leaves)
grads = bendc.tree.map(lambda p: p.grad, params)
```

Containers: ``dict`` (keys kept in insertion order), ``list``, ``tuple``,
named tuples and dataclasses (their ``init`` fields), nested. ``None`` is an
empty container, as in JAX: it has no leaves and comes back as ``None``.
Everything else (arrays, traced tensors, Python scalars, strings) is a leaf.
bendc itself binds a jitted function's arguments and builds its return value
with this module.

On disk (an artifact's manifest) a treedef is JSON (:func:`to_json`): named
tuples and dataclasses record their type as ``module:qualname``;
:func:`from_json` rebuilds that type where it imports, else a ``dict`` of
the fields (and the runtime alone, which imports no user code, always gives
a ``dict``).
"""
from __future__ import annotations

import builtins
import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

CONTAINERS = ("none", "tuple", "list", "dict", "namedtuple", "dataclass")


@dataclass(frozen=True)
class TreeDef:
    """The structure of a pytree: ``kind`` is "leaf" or one of CONTAINERS; ``keys`` are a dict's keys
    or a named tuple's/dataclass's field names; ``type`` the named tuple or dataclass type."""

    kind: str
    children: tuple["TreeDef", ...] = ()
    keys: tuple[Any, ...] = ()
    type: Any = None

    @property
    def num_leaves(self) -> int:
        if self.kind == "leaf":
            return 1
        return sum(child.num_leaves for child in self.children)

    def paths(self, prefix: str = "") -> list[str]:
        """Each leaf's path, in leaf order: ``params['w']``, ``state[0]``, ``opt.step``."""
        if self.kind == "leaf":
            return [prefix]
        out: list[str] = []
        for index, child in enumerate(self.children):
            if self.kind == "dict":
                step = f"[{self.keys[index]!r}]"
            elif self.kind in ("namedtuple", "dataclass"):
                step = f".{self.keys[index]}"
            else:
                step = f"[{index}]"
            out.extend(child.paths(prefix + step))
        return out

    def describe(self) -> str:
        """The structure with ``*`` for leaves: ``{'w': *, 'layers': [*, *], 'opt': Pair(m=*, v=*)}``."""
        return _describe(self)

    def __repr__(self) -> str:  # types by module and qualname: a program cache key reads it
        return f"TreeDef({_describe(self, qualified=True)})"


LEAF = TreeDef("leaf")
NONE = TreeDef("none")


def _describe(treedef: TreeDef, qualified: bool = False) -> str:
    kind = treedef.kind
    if kind == "leaf":
        return "*"
    if kind == "none":
        return "None"
    items = [_describe(child, qualified) for child in treedef.children]
    if kind == "dict":
        return "{" + ", ".join(f"{k!r}: {v}" for k, v in zip(treedef.keys, items)) + "}"
    if kind in ("namedtuple", "dataclass"):
        name = f"{treedef.type.__module__}.{treedef.type.__qualname__}" if qualified else treedef.type.__name__
        return f"{name}(" + ", ".join(f"{k}={v}" for k, v in zip(treedef.keys, items)) + ")"
    if kind == "tuple":
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    return "[" + ", ".join(items) + "]"


def is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


def _fields(value: Any) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(value) if f.init)


def _flatten(value: Any, leaves: list) -> TreeDef:
    kind = type(value)
    if value is None:
        return NONE
    if kind is tuple or kind is list:
        children = tuple(_flatten(item, leaves) for item in value)
        return TreeDef("tuple" if kind is tuple else "list", children)
    if kind is dict:
        children = tuple(_flatten(item, leaves) for item in value.values())
        return TreeDef("dict", children, tuple(value))
    if is_namedtuple(value):
        children = tuple(_flatten(item, leaves) for item in value)
        return TreeDef("namedtuple", children, tuple(kind._fields), kind)
    if dataclasses.is_dataclass(value) and not isinstance(value, builtins.type):
        names = _fields(value)
        children = tuple(_flatten(getattr(value, name), leaves) for name in names)
        return TreeDef("dataclass", children, names, kind)
    if isinstance(value, (tuple, list, dict)):  # subclasses bendc does not know how to rebuild
        return _flatten(tuple(value) if isinstance(value, tuple) else
                        list(value) if isinstance(value, list) else dict(value), leaves)
    leaves.append(value)
    return LEAF


def flatten(tree: Any) -> tuple[list, TreeDef]:
    """(leaves in order, treedef) of a pytree."""
    leaves: list = []
    return leaves, _flatten(tree, leaves)


def _build(treedef: TreeDef, leaves: Iterator) -> Any:
    kind = treedef.kind
    if kind == "leaf":
        return next(leaves)
    if kind == "none":
        return None
    items = [_build(child, leaves) for child in treedef.children]
    if kind == "tuple":
        return tuple(items)
    if kind == "list":
        return items
    if kind == "dict":
        return dict(zip(treedef.keys, items))
    if kind == "namedtuple":
        return treedef.type(*items)
    if kind == "dataclass":
        return treedef.type(**dict(zip(treedef.keys, items)))
    raise AssertionError(f"unknown treedef kind {kind}")


def unflatten(treedef: TreeDef, leaves: Sequence) -> Any:
    """The pytree of ``treedef`` with ``leaves`` in order."""
    leaves = list(leaves)
    if len(leaves) != treedef.num_leaves:
        raise ValueError(f"{treedef} takes {treedef.num_leaves} leaves, got {len(leaves)}")
    return _build(treedef, iter(leaves))


def map(fn: Callable[..., Any], tree: Any, *rest: Any) -> Any:
    """``fn`` applied leaf by leaf to trees of one structure; the result has that structure."""
    leaves, treedef = flatten(tree)
    others = []
    for other in rest:
        other_leaves, other_def = flatten(other)
        if other_def != treedef:
            raise ValueError(f"tree.map: trees of different structures: {treedef} and {other_def}")
        others.append(other_leaves)
    return _build(treedef, iter([fn(*items) for items in zip(leaves, *others)]))


def flatten_up_to(treedef: TreeDef, tree: Any) -> list:
    """The subtrees of ``tree`` at the leaves of ``treedef`` (a gradient tree may hold None where
    the parameter tree holds an array): ``tree`` must have treedef's containers above them."""
    if treedef.kind == "leaf":
        return [tree]
    if treedef.kind == "none":
        return []
    if treedef.kind == "dict":
        if not isinstance(tree, dict) or tuple(tree) != treedef.keys:
            raise ValueError(f"expected a dict with keys {list(treedef.keys)}, got {_short(tree)}")
        items = list(tree.values())
    elif treedef.kind == "dataclass":
        items = [getattr(tree, name) for name in treedef.keys] if dataclasses.is_dataclass(tree) else None
    else:
        items = list(tree) if isinstance(tree, (tuple, list)) else None
    if items is None or len(items) != len(treedef.children):
        raise ValueError(f"expected the structure {_describe(treedef)}, got {_short(tree)}")
    out: list = []
    for child, item in zip(treedef.children, items):
        out.extend(flatten_up_to(child, item))
    return out


def _short(value: Any) -> str:
    return type(value).__name__ if not isinstance(value, dict) else f"a dict with keys {list(value)}"


def leaves(tree: Any) -> list:
    """The leaves of a pytree, in order."""
    return flatten(tree)[0]


# ------------------------------------------------------------------ JSON (artifact manifests)
def to_json(treedef: TreeDef, leaf: Callable[[int], Any]) -> Any:
    """The manifest form: ``{"kind": ..., "items": ...}``; ``leaf(i)`` gives the i-th leaf's entry.

    tuple/list items are a list, dict items a dict (string keys), named tuples and dataclasses
    ``{"kind": "namedtuple" | "dataclass", "type": "module:qualname", "items": {field: ...}}``,
    None ``{"kind": "static", "value": null}``.
    """
    counter = iter(range(treedef.num_leaves))

    def convert(node: TreeDef) -> Any:
        if node.kind == "leaf":
            return leaf(next(counter))
        if node.kind == "none":
            return {"kind": "static", "value": None}
        items = [convert(child) for child in node.children]
        if node.kind == "dict":
            return {"kind": "dict", "items": dict(zip(node.keys, items))}
        if node.kind in ("namedtuple", "dataclass"):
            return {"kind": node.kind, "type": f"{node.type.__module__}:{node.type.__qualname__}",
                    "items": dict(zip(node.keys, items))}
        return {"kind": node.kind, "items": items}

    return convert(treedef)


def import_type(path: str) -> Any | None:
    """The type named ``module:qualname``, or None where it does not import."""
    module_name, _, qualname = path.partition(":")
    try:
        value: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            value = getattr(value, part)
    except Exception:
        return None
    return value if isinstance(value, builtins.type) else None


def from_json(data: Any, leaf: Callable[[dict], Any]) -> tuple[TreeDef, list]:
    """(treedef, leaf entries) of the manifest form; ``leaf(entry)`` reads a leaf entry (or returns
    None for an entry that is a container)."""
    entries: list = []

    def convert(node: dict) -> TreeDef:
        kind = node["kind"]
        if kind == "static" and node.get("value") is None:
            return NONE
        if kind in ("tuple", "list"):
            return TreeDef(kind, tuple(convert(item) for item in node["items"]))
        if kind in ("dict", "namedtuple", "dataclass"):
            keys = tuple(node["items"])
            children = tuple(convert(item) for item in node["items"].values())
            if kind != "dict":
                rebuilt = import_type(node["type"])
                if rebuilt is not None and (kind != "namedtuple" or tuple(getattr(rebuilt, "_fields", ())) == keys):
                    return TreeDef(kind, children, keys, rebuilt)
            return TreeDef("dict", children, keys)
        entries.append(leaf(node))
        return LEAF

    return convert(data), entries


# ------------------------------------------------------------------ a function's return value
@dataclass(frozen=True)
class Template:
    """A jitted function's return structure: its treedef, and per leaf ``("out", i)`` (the i-th
    output of the program) or ``("static", value)`` (a Python value returned as it is)."""

    treedef: TreeDef
    slots: tuple[tuple[str, Any], ...]

    def __post_init__(self) -> None:
        # ``rebuild`` is picked once per template: the hot path calls it on every call.
        object.__setattr__(self, "rebuild", self._rebuilder())

    def _rebuilder(self) -> Callable[[Sequence], Any]:
        """The function from the program's outputs to the return value."""
        slots = self.slots
        if self.treedef.kind == "leaf":
            kind, value = slots[0]
            return (lambda results: results[value]) if kind == "out" else (lambda results: value)
        if (self.treedef.kind == "tuple" and all(child.kind == "leaf" for child in self.treedef.children)
                and list(slots) == [("out", i) for i in range(len(slots))]):
            return tuple  # a flat tuple of every output in order (``return loss, w.grad``)
        return _build_function(self.treedef, slots)

    def to_json(self) -> Any:
        return to_json(self.treedef, lambda i: {"kind": self.slots[i][0], "value": self.slots[i][1]})

    @staticmethod
    def from_json(data: Any) -> "Template":
        treedef, slots = from_json(data, lambda entry: (entry["kind"], entry["value"]))
        return Template(treedef, tuple(slots))


def _build_function(treedef: TreeDef, slots: Sequence[tuple[str, Any]]) -> Callable[[Sequence], Any]:
    """``rebuild`` as one generated expression (``({k0: r[0], k1: r[1]}, [r[2], s0])``): the hot path
    builds the return value without walking the treedef. Keys, types and static values are
    constants of the function's namespace, never written into its text."""
    namespace: dict[str, Any] = {}
    leaves = iter(slots)

    def constant(value: Any) -> str:
        name = f"c{len(namespace)}"
        namespace[name] = value
        return name

    def expression(node: TreeDef) -> str:
        kind = node.kind
        if kind == "leaf":
            slot, value = next(leaves)
            return f"r[{int(value)}]" if slot == "out" else constant(value)
        if kind == "none":
            return "None"
        items = [expression(child) for child in node.children]
        if kind == "tuple":
            return "(" + "".join(item + ", " for item in items) + ")"
        if kind == "list":
            return "[" + ", ".join(items) + "]"
        if kind == "dict":
            return "{" + ", ".join(f"{constant(key)}: {item}" for key, item in zip(node.keys, items)) + "}"
        if kind == "namedtuple":
            return f"{constant(node.type)}(" + ", ".join(items) + ")"
        if kind == "dataclass":
            return f"{constant(node.type)}(**{{" + ", ".join(
                f"{constant(key)}: {item}" for key, item in zip(node.keys, items)) + "})"
        raise AssertionError(f"unknown treedef kind {kind}")

    source = f"def rebuild(r):\n    return {expression(treedef)}\n"
    exec(compile(source, "<bendc rebuild>", "exec"), namespace)
    return namespace["rebuild"]
