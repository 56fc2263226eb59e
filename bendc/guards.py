"""Guards: the torch module state a trace read, checked before the trace is reused.

``bendc.functional_call`` runs a module's forward at trace time, and what that forward read from
the module tree is baked into the trace: every submodule's ``training`` flag, the instance
attributes it read (a dropout's ``p``, a norm's ``eps``, a user's flag, a config dataclass), the
shape of the tree and which parameters are tied (by identity), the buffers it was not given (by
identity and version), the hooks. :func:`watch` records one forward and returns a
:class:`ModuleGuard`; bendc/function.py reuses a trace only while its guards hold and traces again
otherwise (switching back reuses the first trace). The guard's values are part of the signature
(``step.signatures()``, the reason ``BENDC_LOG=recompiles`` logs).

Reads are seen by giving each module of the tree, for the forward only, a subclass of its own
class whose ``__getattribute__`` notes the names read (``Linear`` stays ``Linear`` by name and
isinstance). What can be guarded, compared with ``==`` against a snapshot taken before the forward:
None, bool, int, float, complex, str, bytes, enums, classes, functions and methods (by identity),
torch dtypes and devices, tuples, lists, dicts and sets of these (by value), dataclasses and other
plain objects whose fields are these (by value, ``type`` included), torch tensors (by identity and
in-place version), numpy arrays (by value). A forward that reads any other kind of attribute is
refused with a BendcError naming the attribute: its value would be baked into the trace unseen.
"""
from __future__ import annotations

import enum
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from bendc.errors import UnsupportedError, user_location

_DEPTH = 6  # nesting of containers and objects a snapshot follows
_PLAIN = (type(None), bool, int, float, complex, str, bytes, type(Ellipsis), range, slice)
_CALLABLE = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.BuiltinMethodType,
             types.ModuleType, type)
_INTERNAL_READERS = ("torch/nn/modules/module.py",)  # nn.Module's own __dict__ lookups are not reads


class Unguardable(Exception):
    """A value read in forward that no snapshot can stand for (internal: becomes a BendcError)."""


# ------------------------------------------------------------------ snapshots
@dataclass(eq=False)
class _ObjectSnapshot:
    """A plain object's class and fields; equal to an object of that class with equal fields."""

    cls: type
    fields: dict

    def __eq__(self, other: Any) -> bool:
        return type(other) is self.cls and self.fields == getattr(other, "__dict__", None)

    def __repr__(self) -> str:
        return f"{self.cls.__name__}({', '.join(f'{k}={v!r}' for k, v in self.fields.items())})"


@dataclass(eq=False)
class _TensorSnapshot:
    """A torch tensor by identity and in-place version (``_version`` counts in-place writes)."""

    ref: Callable[[], Any]
    version: int
    text: str

    def __eq__(self, other: Any) -> bool:
        return other is self.ref() and other._version == self.version

    def __repr__(self) -> str:
        return self.text


@dataclass(eq=False)
class _ArraySnapshot:
    """A numpy array by value (dtype, shape and contents)."""

    copy: np.ndarray

    def __eq__(self, other: Any) -> bool:
        return (type(other) is np.ndarray and other.dtype == self.copy.dtype and other.shape == self.copy.shape
                and bool(np.array_equal(other, self.copy, equal_nan=other.dtype.kind in "fc")))

    def __repr__(self) -> str:
        return f"ndarray {self.copy.dtype}{list(self.copy.shape)}"


def _is_torch_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "_version") and hasattr(value, "shape")


def snapshot(value: Any, on_death: Callable, depth: int = 0) -> Any:
    """What a value is compared against later (``current == snapshot``): the value itself where it
    is immutable, a copy of a container, a field-wise snapshot of a plain object; Unguardable else."""
    if depth > _DEPTH:
        raise Unguardable("nested too deeply")
    kind = type(value)
    if kind in _PLAIN or isinstance(value, (enum.Enum, *_CALLABLE)):
        return value
    module = kind.__module__
    if module.startswith("torch") and kind.__name__ in ("dtype", "device", "memory_format", "layout"):
        return value
    if kind is tuple or (kind.__name__ == "Size" and module.startswith("torch")):
        return tuple(snapshot(item, on_death, depth + 1) for item in value)
    if issubclass(kind, tuple) and hasattr(kind, "_fields"):  # a named tuple
        return kind(*(snapshot(item, on_death, depth + 1) for item in value))
    if kind in (list, set, frozenset):
        return kind(snapshot(item, on_death, depth + 1) for item in value)
    if kind is dict or (kind.__name__ == "OrderedDict" and module == "collections"):
        return kind((key, snapshot(item, on_death, depth + 1)) for key, item in value.items())
    if _is_torch_tensor(value):
        return _TensorSnapshot(weakref.ref(value, on_death), value._version,
                               f"tensor {str(value.dtype).removeprefix('torch.')}{list(value.shape)}")
    if kind is np.ndarray:
        return _ArraySnapshot(value.copy())
    if _is_module(value):
        return value  # an unregistered module: by identity (nn.Module has no __eq__)
    fields = getattr(value, "__dict__", None)
    if isinstance(fields, dict) and not hasattr(kind, "__slots__"):
        return _ObjectSnapshot(kind, {key: snapshot(item, on_death, depth + 1) for key, item in fields.items()})
    raise Unguardable(f"a {kind.__module__}.{kind.__qualname__}")


def _is_module(value: Any) -> bool:
    return any(c.__name__ == "Module" and c.__module__ == "torch.nn.modules.module" for c in type(value).__mro__)


# ------------------------------------------------------------------ watching a forward
_WATCHED: dict[int, set[str]] = {}  # id(module) -> names read while a forward is watched
_RECORDING: dict[type, type] = {}   # a module class -> its reading subclass


def _recording_class(cls: type) -> type:
    """``cls`` with a ``__getattribute__`` that notes each name read on watched instances."""
    sub = _RECORDING.get(cls)
    if sub is not None:
        return sub
    base_get = cls.__getattribute__

    def __getattribute__(self, name, _get=base_get):
        names = _WATCHED.get(id(self))
        if names is not None:
            if name == "__dict__":
                import sys

                caller = sys._getframe(1).f_code.co_filename.replace("\\", "/")
                if not caller.endswith(_INTERNAL_READERS):
                    names.add(name)
            else:
                names.add(name)
        return _get(self, name)

    sub = type(cls.__name__, (cls,), {"__getattribute__": __getattribute__, "__module__": cls.__module__,
                                      "__qualname__": cls.__qualname__, "_bendc_recording_of": cls})
    _RECORDING[cls] = sub
    return sub


@dataclass
class _Record:
    """One module of the tree: what its next calls must find as the watched forward found it."""

    path: str                        # in the root module ("" for the root)
    ref: Callable[[], Any]
    cls: type
    names: tuple[str, ...]           # "training" and the instance attributes the forward read
    values: tuple                    # their snapshots, compared with ==
    modules: tuple[tuple[str, int], ...]
    parameters: tuple[tuple[str, int], ...]
    buffers: tuple[tuple[str, int], ...]
    versions: tuple[tuple[Any, int], ...]  # (weakref, _version) of the buffers the call did not give


def _ids(table: dict, on_death: Callable, keep: list) -> tuple[tuple[str, int], ...]:
    """(name, id) of a module's _modules/_parameters/_buffers values; weak references kept in
    ``keep`` invalidate the guard when one dies (so that an id cannot be reused unseen)."""
    for value in table.values():
        if value is not None:
            keep.append(weakref.ref(value, on_death))
    return tuple((name, id(value)) for name, value in table.items())


def render_check(guard: "ModuleGuard") -> tuple[str, dict[str, Any]]:
    """The text of ``check()`` for a guard, and the constants it names: per module, its class, the
    values read (snapshots on the left of ``!=``: their ``__eq__`` is asked first, an array's would
    broadcast), each table's size, names and identities (ids are sound: a weak reference marks the
    guard dead before an id can be reused), the versions of buffers not given; then torch's global
    hooks. A module whose state lost a name raises KeyError: a change too."""
    constants: dict[str, Any] = {"dead": guard.dead, "hook_tables": guard.hook_tables, "hooks": guard.hooks}
    lines = ["def check():", "    if dead[0]:", "        return False", "    try:"]
    for number, record in enumerate(guard.records):
        constants[f"ref{number}"], constants[f"cls{number}"] = record.ref, record.cls
        constants[f"values{number}"] = record.values
        read = ", ".join(f"state[{name!r}]" for name in record.names)
        lines += [f"        # {guard.name}{'.' + record.path if record.path else ''}",
                  f"        module = ref{number}()",
                  "        state = module.__dict__",
                  f"        if module.__class__ is not cls{number} or values{number} != ({read},):",
                  "            return False"]
        for table, entries in (("_modules", record.modules), ("_parameters", record.parameters),
                               ("_buffers", record.buffers)):
            lines.append(f"        table = state[{table!r}]")
            tests = [f"len(table) != {len(entries)}"]
            if table == "_modules" and entries:  # the order of submodules is the order they run
                tests.append(f"tuple(table) != {tuple(name for name, _ in entries)!r}")
            tests += [f"id(table[{name!r}]) != {ident}" for name, ident in entries]
            lines += [f"        if {' or '.join(tests)}:", "            return False"]
        for index, (ref, version) in enumerate(record.versions):
            constants[f"buffer{number}_{index}"] = ref
            lines += [f"        if buffer{number}_{index}()._version != {version}:", "            return False"]
    lines += ["    except KeyError:", "        return False", "    return hook_tables == hooks", ""]
    return "\n".join(lines), constants


@dataclass(eq=False)
class ModuleGuard:
    """What one traced ``functional_call`` read from a module tree; ``check()`` on later calls."""

    name: str
    records: list[_Record]
    hooks: tuple                 # snapshots of torch's global module hooks
    hook_tables: tuple = ()      # those hook tables themselves (torch changes them in place)
    keep: list = field(default_factory=list)
    dead: list = field(default_factory=lambda: [False])
    _checker: Callable[[], bool] | None = None

    def check(self) -> bool:
        """True while every module of the tree is as the trace found it."""
        return self.checker()()

    def checker(self) -> Callable[[], bool]:
        """The check as one generated function (it runs on every call of the step, so each
        value, name and identity is a constant in its text: bendc/guards.py render_check)."""
        if self._checker is None:
            source, constants = render_check(self)
            namespace = dict(constants)
            exec(compile(source, f"<bendc guard of {self.name}>", "exec"), namespace)
            self._checker = namespace["check"]
        return self._checker

    def describe(self) -> dict[str, str]:
        """Each guarded value by its path (``model.1.training`` -> ``True``), for signatures()."""
        described: dict[str, str] = {}
        for record in self.records:
            path = self._path(record.path)
            for name, value in zip(record.names, record.values):
                if not (name.startswith("_") and isinstance(value, dict) and not value):  # no hooks: checked, not shown
                    described[f"{path}.{name}"] = repr(value)
            for ref, version in record.versions:
                buffer = next((name for name, ident in record.buffers if ident == id(ref())), "?")
                described[f"{path}.{buffer}"] = f"buffer version {version}"
        tied: dict[int, list[str]] = {}
        for record in self.records:
            for name, ident in record.parameters + record.buffers:
                if ident != id(None):
                    tied.setdefault(ident, []).append(self._path(f"{record.path}.{name}".lstrip(".")))
        for paths in tied.values():
            if len(paths) > 1:
                described[f"{paths[0]} (tied)"] = ", ".join(paths[1:])
        return described

    def merge(self, other: "ModuleGuard") -> bool:
        """Take in what another forward of the same tree read (a second functional_call on it in one
        trace); False where the trees differ (then both guards are kept)."""
        if [(r.path, r.ref(), r.modules, r.parameters, r.buffers) for r in self.records] != \
                [(r.path, r.ref(), r.modules, r.parameters, r.buffers) for r in other.records]:
            return False
        for index, (mine, theirs) in enumerate(zip(self.records, other.records)):
            extra = [(n, v) for n, v in zip(theirs.names, theirs.values) if n not in mine.names]
            if extra:
                names, values = zip(*extra)
                self.records[index] = _Record(mine.path, mine.ref, mine.cls, mine.names + names,
                                              mine.values + values, mine.modules, mine.parameters, mine.buffers,
                                              mine.versions)
        self.keep += other.keep
        self._checker = None
        return True

    def _path(self, path: str) -> str:
        return f"{self.name}.{path}" if path else self.name


def _global_hooks() -> tuple:
    """torch's global module hook tables (registering a hook adds to them in place)."""
    from torch.nn.modules import module

    return tuple(getattr(module, name) for name in (
        "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
        "_global_backward_pre_hooks", "_global_forward_hooks_always_called"))


class watch:
    """``with watch(root, name, given) as watched:`` around one forward of ``root``; afterwards
    ``watched.guard`` is its ModuleGuard (``given``: the parameter and buffer names the call gave)."""

    def __init__(self, root: Any, name: str, given: set[str]) -> None:
        self.root, self.name, self.given = root, name, given
        self.guard: ModuleGuard | None = None

    def __enter__(self) -> "watch":
        self.modules = [(path, module) for path, module in self.root.named_modules()]
        self.before = {id(module): dict(module.__dict__) for _, module in self.modules}
        for state in self.before.values():  # the tables themselves: functional_call swaps their values
            for table in ("_parameters", "_buffers", "_modules"):
                state[table] = dict(state[table])
        self.hooks = tuple(dict(table) for table in _global_hooks())
        self.swapped: list[tuple[Any, type]] = []
        self.mine: list[int] = []  # the modules this watch notes reads of (not those an outer one does)
        for _, module in self.modules:
            if id(module) in _WATCHED:  # a module already watched (a nested functional_call): one watcher
                continue
            _WATCHED[id(module)] = set()
            self.mine.append(id(module))
            cls = module.__class__
            try:
                module.__class__ = _recording_class(cls)
            except TypeError:  # a class whose layout forbids it: every attribute counts as read
                _WATCHED[id(module)].add("__dict__")
                continue
            self.swapped.append((module, cls))
        return self

    def __exit__(self, kind, error, traceback) -> None:
        reads = {ident: _WATCHED.pop(ident) for ident in self.mine}
        for module, cls in reversed(self.swapped):
            module.__class__ = cls
        if kind is None:
            self.guard = self._guard(reads)

    def _guard(self, reads: dict[int, set[str]]) -> ModuleGuard:
        guard = ModuleGuard(self.name, [], self.hooks, _global_hooks())
        dead = guard.dead

        def on_death(_ref: Any, dead: list = dead) -> None:
            dead[0] = True

        for path, module in self.modules:
            before = self.before[id(module)]
            cls = module.__class__.__dict__.get("_bendc_recording_of", module.__class__)  # an outer watch's
            read = reads.get(id(module), set())
            everything = "__dict__" in read
            names = ["training"] + [name for name in before if name != "training" and (
                name in read or everything) and not name.startswith(("_parameters", "_buffers", "_modules"))]
            values = []
            for name in names:
                try:
                    values.append(snapshot(before[name], on_death))
                except Unguardable as why:
                    full = ".".join(part for part in (self.name, path, name) if part)
                    raise UnsupportedError(
                        f"the forward of {type(module).__name__} read {full}, {why}, which bendc "
                        "cannot guard: its value is baked into the trace and a later change would go unseen. "
                        "Make it a bool/int/float/str, a tuple/list/dict of them or a dataclass of them, or "
                        "register a tensor as a buffer and pass it in the parameter dict",
                        loc=user_location(), op="functional_call") from None
            versions = []
            for name, buffer in before["_buffers"].items():
                full = f"{path}.{name}" if path else name
                if buffer is not None and full not in self.given:
                    versions.append((weakref.ref(buffer, on_death), buffer._version))
            guard.records.append(_Record(
                path, weakref.ref(module, on_death), cls,
                tuple(names), tuple(values), _ids(before["_modules"], on_death, guard.keep),
                _ids(before["_parameters"], on_death, guard.keep), _ids(before["_buffers"], on_death, guard.keep),
                tuple(versions)))
        return guard


def root_name(fn: Callable, module: Any) -> str:
    """The name the traced function knows ``module`` by (a global or a closure variable), else its class."""
    code = getattr(fn, "__code__", None)
    if code is not None:
        for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or ()):
            try:
                if cell.cell_contents is module:
                    return name
            except ValueError:
                continue
        for name in code.co_names:
            if getattr(fn, "__globals__", {}).get(name) is module:
                return name
    return type(module).__name__
