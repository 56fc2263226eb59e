"""bendc.jit: the jitted function: binding arguments to a signature, the fast path, introspection.

The first call per signature compiles through the driver (bendc/compile.py); later calls reuse it.

A signature is the parameters' shapes and dtypes, the leaves, the values of
static Python scalars, and the target.
"""
from __future__ import annotations

import functools
import inspect
import os
import re
import warnings
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from bendc import logs, tree
from bendc.compile import Executable, Progress, Request, compile_step, cuda_status
from bendc.errors import BendcError, SignatureError, UnsupportedError, user_location
from bendc.ir.types import TensorType, dtype_name
from bendc.passes import Pipeline, default_passes
from bendc.trace import Tensor
from bendc import torch_bridge  # noqa: F401  (registers the torch-function handler; imports no torch)
from runtime.cuda import as_device_array, is_device_array
from runtime.cuda_graph import device_input, is_torch_cuda
from runtime.dtypes import DTYPES

TARGETS = ("auto", "cpu", "cuda", "reference")
# cuda where numba-cuda imports and a GPU is usable, or under numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1).
IMPLEMENTED_TARGETS = ("reference", "cpu") + (("cuda",) if cuda_status() else ())
DEFAULT_RECOMPILE_LIMIT = 8  # like torch.compile's recompile_limit
LOGGER = logs.LOGGER


class RecompileWarning(UserWarning):
    """A jitted function compiled for more signatures than its recompile_limit."""


def _logging_recompiles() -> bool:
    """BENDC_LOG names "recompiles" (bendc/logs.py): each recompile is logged at INFO level."""
    return logs.enabled("recompiles")


def _describe_spec(spec: tuple) -> str:
    if spec[0] == "array":
        return f"{spec[1]}[{','.join(map(str, spec[2]))}]"
    if spec[0] == "dynamic":
        return "dynamic f32[]"
    if spec[0] == "alias":
        return f"the array of {spec[1]}"
    return f"static {spec[2]!r}"


def _recompile_reason(old: dict[str, str], new: dict[str, str]) -> str:
    """Which parameters changed, old -> new (the first few)."""
    changes = []
    for path in new:
        if path not in old:
            changes.append(f"{path}: new ({new[path]})")
        elif old[path] != new[path]:
            changes.append(f"{path}: {old[path]} -> {new[path]}")
    changes += [f"{path}: gone (was {old[path]})" for path in old if path not in new]
    if not changes:
        return "the same parameters and module values (leaves, target, or a module's structure or hooks changed)"
    return "; ".join(changes[:6]) + (f"; and {len(changes) - 6} more" if len(changes) > 6 else "")


def _input_name(name: str, path: str, whole: bool, taken: set[str]) -> str:
    """The graph parameter name of an array leaf: the parameter's own name, or its path made an
    identifier (``params['h.0.w']`` -> ``params_h_0_w``), unique among the call's inputs."""
    if whole:
        flat = name
    else:
        flat = re.sub(r"\W+", "_", path.replace("']", "").replace("]", "")).strip("_") or name
    unique, number = flat, 1
    while unique in taken:
        number += 1
        unique = f"{flat}_{number}"
    taken.add(unique)
    return unique


@dataclass
class Binding:
    """One call's arguments: flat array inputs (graph parameter name, array), the leaves and
    donations among them, static values of scalar parameters, how to rebuild each parameter
    (treedef, per leaf ("input", name) or ("static", value)), and the signature key."""

    arrays: list[tuple[str, Any]] = field(default_factory=list)
    leaves: list[str] = field(default_factory=list)
    donate: list[str] = field(default_factory=list)
    static: dict[str, Any] = field(default_factory=dict)
    parameters: dict[str, tuple[Any, tuple]] = field(default_factory=dict)
    described: dict[str, str] = field(default_factory=dict)
    key_parts: list[tuple] = field(default_factory=list)
    key: tuple = ()
    # (id of an array, leaf or not) -> (its input name, its first path): one array object under two
    # paths is one input (one leaf: tied weights); constants and leaves are never merged.
    seen: dict[tuple[int, bool], tuple[str, str]] = field(default_factory=dict)

    def arguments(self, tensors: dict[str, Any]) -> dict[str, Any]:
        """The function's arguments with the traced tensors in place of the array inputs."""
        return {name: tree.unflatten(treedef, [tensors[value] if kind == "input" else value
                                               for kind, value in sources])
                for name, (treedef, sources) in self.parameters.items()}


def _json_value(value: Any) -> Any:
    """A static value as the manifest records it: JSON scalars, lists of them, else its repr."""
    if isinstance(value, (bool, int, float, str, type(None))):
        return value
    if isinstance(value, (tuple, list)):
        return [_json_value(item) for item in value]
    return repr(value)


def _parameters_json(signature: inspect.Signature, types: Sequence[tuple[str, TensorType]],
                     static: dict[str, Any], binding: Binding | None) -> dict[str, Any]:
    """Each parameter's structure for the manifest (runtime.load and ``bendc run`` take it): the
    pytree's JSON form (bendc.tree.to_json) with leaves ``{"kind": "input", "value": input name}`` or
    ``{"kind": "static", "value": value}``, in parameter order."""
    if binding is not None:
        return {name: tree.to_json(treedef, lambda i, sources=sources: {
                    "kind": sources[i][0], "value": sources[i][1] if sources[i][0] == "input"
                    else _json_value(sources[i][1])})
                for name, (treedef, sources) in binding.parameters.items()}
    typed = {name for name, _ in types}
    return {name: {"kind": "input", "value": name} if name in typed else {"kind": "static",
                                                                            "value": _json_value(static[name])}
            for name in signature.parameters if name in typed or name in static}


def resolve_target(target: str) -> str:
    """'auto' is cuda where a GPU is usable (not the simulator), else cpu."""
    if target not in TARGETS:
        raise UnsupportedError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}",
                               loc=user_location(), op="jit")
    if target == "auto":
        return "cuda" if "cuda" in IMPLEMENTED_TARGETS and cuda_status() == "gpu" else "cpu"
    if target == "cuda" and target not in IMPLEMENTED_TARGETS:
        raise UnsupportedError("target 'cuda' needs the numba-cuda package (pip install 'bendc[cuda]') and a "
                               "usable GPU, or NUMBA_ENABLE_CUDASIM=1 for numba's CUDA simulator; "
                               "use target='cpu'", loc=user_location(), op="jit")
    if target not in IMPLEMENTED_TARGETS:
        raise UnsupportedError(f"target {target!r} is not built yet; use target='cpu' or target='reference'",
                               loc=user_location(), op="jit")
    return target


# ------------------------------------------------------------------ inputs
def _c_order(array: np.ndarray) -> np.ndarray:
    """A C-contiguous array; unlike np.ascontiguousarray, a 0-d array stays 0-d."""
    return np.asarray(array, order="C")


def to_array(value: Any, name: str) -> np.ndarray:
    """A host numpy array from numpy, __array__, __dlpack__ or device-array inputs."""
    if isinstance(value, np.ndarray):
        return _c_order(value)
    if hasattr(value, "detach"):  # torch tensors (requires_grad ones refuse export otherwise)
        value = value.detach()
    if hasattr(value, "__dlpack__") and getattr(value, "device", None) is not None \
            and str(getattr(value, "device")) != "cpu" and hasattr(value, "cpu"):
        value = value.cpu()
    if hasattr(value, "__array__"):
        try:
            return _c_order(np.asarray(value))
        except TypeError as error:  # torch's bfloat16 has no numpy dtype: a TypeError, not a BendcError
            dtype = getattr(value, "dtype", type(value).__name__)
            raise SignatureError(f"parameter {name!r} has dtype {dtype} ({error}); bendc takes float32 data "
                                 "and int64/int32 indices (use .float())", loc=user_location(), op="call") from None
    if hasattr(value, "__dlpack__"):
        return _c_order(np.from_dlpack(value))
    if hasattr(value, "copy_to_host"):
        return _c_order(value.copy_to_host())
    raise SignatureError(f"parameter {name!r}: cannot read an array from {type(value).__name__}",
                         loc=user_location(), op="call")


def _device_leaf(value: Any, path: str) -> Any:
    """A device input as the cuda runtimes take it, in place: a torch CUDA tensor (detached: torch
    exports no tensor that requires grad; the cubin runtime reads its ``data_ptr()`` and runs on
    torch's stream), an array with a numpy ``dtype`` and ``shape`` (numba's, the cubin runtime's
    outputs), else numba's view of its ``__cuda_array_interface__``."""
    if is_torch_cuda(value):
        value = value.detach()
        try:
            device_input(value)
        except ValueError as error:
            raise SignatureError(f"parameter {path!r}: {error}", loc=user_location(), op="call") from None
        return value
    if isinstance(getattr(value, "dtype", None), np.dtype) and hasattr(value, "shape"):
        return value
    return as_device_array(value)


def _array_type(array: Any) -> tuple[np.dtype, tuple[int, ...]]:
    """(numpy dtype, shape) of a bound input (a torch CUDA tensor's from its torch dtype)."""
    if is_torch_cuda(array):
        _, dtype, shape = device_input(array)
        return np.dtype(DTYPES[dtype]), shape
    return array.dtype, tuple(array.shape)


def is_array_like(value: Any) -> bool:
    return isinstance(value, np.ndarray) or any(
        hasattr(value, attr) for attr in ("__array__", "__dlpack__", "__cuda_array_interface__"))


_DICT, _LIST, _TUPLE, _NONE, _OTHER = (object() for _ in range(5))  # _fast_items' container marks


def _fast_items(items: Iterable, dynamics: Iterable[bool], seens: Iterable[dict[int, int]], inputs: list,
                part: list) -> bool:
    """Values for the fast call path (a call's arguments, a container's children), each with its
    ``dynamic`` flag and its ``seen`` table (id of an array -> its input position): each value's
    tokens appended to ``part``: a container's mark and size (a dict's keys) then its children's
    tokens in flatten's order; a leaf's spec (dtype and shape, ``("alias", i)`` for an array seen
    before, a scalar's type and value, or its type alone where dynamic). Marks and sizes say the
    structure as a TreeDef would, without building one, and make each value's tokens
    self-delimiting. Each new array is appended to ``inputs``. False where a leaf is none of those
    or an array is not C-contiguous (the call is then bound). Named tuples, dataclasses and
    container subclasses go through tree.flatten."""
    for value, dynamic, seen in zip(items, dynamics, seens):
        kind = type(value)
        if kind is np.ndarray:
            if not value.flags.c_contiguous:
                return False
            first = seen.get(id(value))
            if first is None:
                seen[id(value)] = len(inputs)
                part.append((value.dtype.char, value.shape))
                inputs.append(value)
            else:
                part.append(("alias", first))
        elif kind is dict:
            part.append((_DICT, tuple(value)))
            if not _fast_items(value.values(), repeat(dynamic), repeat(seen), inputs, part):
                return False
        elif kind is list or kind is tuple:
            part.append((_LIST if kind is list else _TUPLE, len(value)))
            if not _fast_items(value, repeat(dynamic), repeat(seen), inputs, part):
                return False
        elif value is None:
            part.append(_NONE)
        elif dynamic and (kind is float or kind is int):
            part.append((kind,))
            inputs.append(np.array(value, np.float32))
        elif kind is float or kind is int or kind is bool or kind is str:
            part.append((kind, value))
        else:  # a container only tree.flatten knows (a named tuple, a dataclass, a subclass), else a leaf
            leaves, treedef = tree.flatten(value)
            if treedef is tree.LEAF:
                return False  # the fast path takes no such leaf (a dataclass type, a numpy scalar, ...)
            part.append((_OTHER, treedef))
            if not _fast_items(leaves, repeat(dynamic), repeat(seen), inputs, part):
                return False
    return True


class JitFunction:
    """The callable that ``bendc.jit`` returns."""

    def __init__(self, fn: Callable, *, leaves: Sequence[str], target: str, cache_dir: str | None,
                 passes: Sequence[Any] | None, donate: Sequence[str] = (), dynamic: Sequence[str] = (),
                 recompile_limit: int = DEFAULT_RECOMPILE_LIMIT, check: str | None = None,
                 data_parallel: bool | str = False, bucket_mb: float | None = None) -> None:
        functools.update_wrapper(self, fn)
        if check is None and os.environ.get("BENDC_CHECK", "") not in ("", "0"):
            check = "reference"
        if check not in (None, "reference"):
            raise SignatureError(f"check={check!r}: the self-check compares against 'reference' (or None)",
                                 loc=user_location(), op="jit")
        self.check = check  # "reference": the first call of each signature runs bendc/check.py
        self._checked: set[tuple] = set()
        self.fn = fn
        self.signature = inspect.signature(fn)
        self.leaves = self._parameter_names(leaves, "leaves")
        self.donate = self._parameter_names(donate, "donate")
        self.dynamic = self._parameter_names(dynamic, "dynamic")
        self.recompile_limit = recompile_limit
        self._signatures: list[dict[str, str]] = []
        self.target = target
        self.resolved_target = resolve_target(target)
        self.cache_dir = cache_dir
        self.passes = list(passes) if passes is not None else default_passes()
        if isinstance(data_parallel, str) and data_parallel != "sharded":
            raise SignatureError(f"data_parallel={data_parallel!r}: False, True or 'sharded' (ZeRO-1: "
                                 "bendc.optim's updates sharded over the ranks)", loc=user_location(), op="jit")
        self.data_parallel = "sharded" if data_parallel == "sharded" else bool(data_parallel)
        if self.data_parallel or bucket_mb is not None:
            from bendc.distributed import bucket_pass

            named = [getattr(p, "name", p) for p in self.passes]
            self.passes = [p for p, name in zip(self.passes, named) if not str(name).startswith("bucket")]
            self.passes.append(bucket_pass(bucket_mb))
        Pipeline(self.passes)  # unknown pass names fail here, at decoration
        # signature key -> its executables, one per module state its trace read (bendc/guards.py)
        self._cache: dict[tuple, list[Executable]] = {}
        self._fast: dict[tuple, list[Executable]] = {}
        plain = all(p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                    for p in self.signature.parameters.values())
        self._positional = len(self.signature.parameters) if plain else -1
        # what a call that leaves out trailing parameters passes for them (empty: required), and the
        # parameters a call may name
        self._defaults = tuple(p.default for p in self.signature.parameters.values())
        self._names = tuple(self.signature.parameters)
        self._keywords = frozenset(name for name, p in self.signature.parameters.items()
                                   if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD)
        self._dynamic_flags = tuple(name in self.dynamic for name in self._names)  # per parameter, in order
        self._leaf_flags = tuple(name in self.leaves for name in self._names)
        self._last: Executable | None = None

    def _parameter_names(self, names: Sequence[str] | str, option: str) -> tuple[str, ...]:
        """``names`` as a tuple, each a parameter of the function, or a SignatureError."""
        names = (names,) if isinstance(names, str) else tuple(names)
        unknown = [name for name in names if name not in self.signature.parameters]
        if unknown:
            raise SignatureError(f"{option} {unknown} are not parameters of {self.fn.__name__}"
                                 f"{self.signature}", loc=user_location(), op="jit")
        return names

    # ------------------------------------------------------------- calling
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fast = self._fast_key(args, kwargs) if self.check is None else None
        if fast is not None:
            key, inputs = fast
            for executable in self._fast.get(key, ()):  # the hot path: positional arrays, scalars, pytrees
                if executable.guard is None or executable.guard():  # the modules it read are as they were
                    self._last = executable
                    return executable.template.rebuild(executable.run(inputs))
        binding = self._bind(args, kwargs)
        variants = self._cache.setdefault(binding.key, [])
        executable = next((e for e in variants if e.guard is None or e.guard()), None)
        if executable is None:  # a cold call: progress on a terminal while numba compiles (bendc/progress.py)
            from bendc.progress import compile_watch

            types = [(name, TensorType(dtype_name(_array_type(array)[0]), _array_type(array)[1]))
                     for name, array in binding.arrays]
            with compile_watch(self.resolved_target):
                executable = self._compile(types, binding.static, binding=binding)
                variants.append(executable)
                self._note_signature(binding, executable)
                return self._run(executable, binding, fast)
        return self._run(executable, binding, fast)

    def _run(self, executable: Executable, binding: "Binding", fast: tuple | None) -> Any:
        if fast is not None:
            known = self._fast.setdefault(fast[0], [])
            if not any(entry is executable for entry in known):
                known.append(executable)
        self._last = executable
        inputs = [value for _, value in binding.arrays]
        if self.check is not None and (binding.key, id(executable)) not in self._checked:
            from bendc.check import checked_run

            results = checked_run(executable.run, executable.graph, inputs)
            self._checked.add((binding.key, id(executable)))
        else:
            results = executable.run(inputs)
        return executable.template.rebuild(results)

    def _fast_key(self, args: tuple, kwargs: dict) -> tuple[tuple, list] | None:
        """(a signature key, the array inputs in order) computed without binding, for calls with
        every parameter given (positionally, by name, or left to its default) as a C-contiguous
        numpy array, a Python scalar or string, or a pytree of them; None otherwise (the call is
        bound). The key is the positional call's: named and default values fill the parameters
        after the positional ones, as binding fills them."""
        if not 0 <= len(args) <= self._positional:
            return None
        if len(args) < self._positional:
            if not kwargs.keys() <= self._keywords:
                return None  # binding says what is wrong (an unknown name, a positional-only one)
            rest = tuple(kwargs.get(name, default) for name, default in
                         zip(self._names[len(args):], self._defaults[len(args):]))
            given = sum(name in kwargs for name in self._names[len(args):])
            if any(value is inspect.Parameter.empty for value in rest) or given != len(kwargs):
                return None  # a required parameter missing, or one given twice
            args = tuple(args) + rest
        elif kwargs:
            return None
        key: list = []
        inputs: list = []
        seen_leaves: dict[int, int] = {}  # id of an array -> its input position (one object, one input)
        seen_constants: dict[int, int] = {}
        seens = [seen_leaves if leaf else seen_constants for leaf in self._leaf_flags]
        if not _fast_items(args, self._dynamic_flags, seens, inputs, key):
            return None  # binding explains what the fast path does not take
        return tuple(key), inputs

    def _bind(self, args, kwargs) -> "Binding":
        """The call's arguments as flat array inputs, a signature key and the rebuild of each parameter."""
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as error:
            raise SignatureError(f"{self.fn.__name__}{self.signature}: {error}",
                                 loc=user_location(), op="call") from None
        bound.apply_defaults()
        binding = Binding()
        taken: set[str] = set()
        for name, value in bound.arguments.items():
            kind = self.signature.parameters[name].kind
            if kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                raise SignatureError(f"*args and **kwargs parameters ({name}) are not supported",
                                     loc=user_location(), op="call")
            if is_array_like(value) and not isinstance(value, np.generic):
                leaves, treedef = [value], tree.LEAF
            else:
                leaves, treedef = tree.flatten(value)
            paths = treedef.paths(name)
            sources: list[tuple[str, Any]] = []
            specs: list[tuple] = []
            for path, leaf in zip(paths, leaves):
                source, spec = self._bind_leaf(name, path, leaf, treedef is tree.LEAF, binding, taken)
                sources.append(source)
                specs.append(spec)
                binding.described[path] = _describe_spec(spec)
            if treedef is not tree.LEAF:
                binding.described[f"{name} (structure)"] = treedef.describe()
            elif sources[0][0] == "static":
                binding.static[name] = sources[0][1]
            binding.parameters[name] = (treedef, tuple(sources))
            binding.key_parts.append((name, treedef, tuple(specs)))
        binding.key = (tuple(binding.key_parts), self.leaves, self.resolved_target)
        return binding

    def _bind_leaf(self, name: str, path: str, value: Any, whole: bool, binding: "Binding",
                   taken: set[str]) -> tuple[tuple[str, Any], tuple]:
        """One leaf of parameter ``name``: an array input, a dynamic scalar (a 0-d float32 input) or a
        static value; returns (its source for the trace, its part of the signature key)."""
        leaf = name in self.leaves
        if is_array_like(value) and not isinstance(value, np.generic):
            first = binding.seen.get((id(value), leaf))
            if first is not None:  # the same array object again (tied weights): the same input
                return ("input", first[0]), ("alias", first[1])
            if self.resolved_target == "cuda" and (is_torch_cuda(value) or is_device_array(value)):
                array = _device_leaf(value, path)  # stays on the device: no copy
            else:
                array = to_array(value, path)
            kind, shape = _array_type(array)
            dtype = dtype_name(kind)
            if dtype not in ("f32", "i64", "i32"):
                hint = " (use .astype(np.float32))" if kind.kind == "f" else ""
                raise SignatureError(f"parameter {path!r} has dtype {kind}; bendc takes float32 "
                                     f"data and int64/int32 indices{hint}", loc=user_location(), op="call")
            if leaf and dtype != "f32":
                raise SignatureError(f"leaf {path!r} must be float32, got {kind}",
                                     loc=user_location(), op="call")
            flat = _input_name(name, path, whole, taken)
            binding.seen[(id(value), leaf)] = (flat, path)
            binding.arrays.append((flat, array))
            if leaf:
                binding.leaves.append(flat)
            if name in self.donate:
                binding.donate.append(flat)
            return ("input", flat), ("array", dtype, shape)
        if isinstance(value, np.generic):
            value = value.item()
        if leaf:
            raise SignatureError(f"leaf {path!r} must be an array, got {type(value).__name__}",
                                 loc=user_location(), op="call")
        if name in self.dynamic and isinstance(value, (int, float)) and not isinstance(value, bool):
            flat = _input_name(name, path, whole, taken)
            binding.arrays.append((flat, np.array(value, np.float32)))
            return ("input", flat), ("dynamic",)
        try:
            hash(value)
        except TypeError:
            raise SignatureError(f"parameter {path!r}: a {type(value).__name__} is neither an array nor a "
                                 "hashable static value (static values are part of the signature)",
                                 loc=user_location(), op="call") from None
        return ("static", value), ("static", type(value).__name__, value)

    def _note_signature(self, binding: "Binding", executable: Executable) -> None:
        """Record a new signature (the parameters, and the module state its trace read); log why it
        recompiles (BENDC_LOG=recompiles) and warn past the limit."""
        previous = self._signatures[-1] if self._signatures else None
        described = dict(binding.described)
        for guard in executable.guards:
            described.update(guard.describe())
        self._signatures.append(described)
        if previous is not None and _logging_recompiles():
            LOGGER.info("recompiling %s (signature %d): %s", self.fn.__name__, len(self._signatures),
                        _recompile_reason(previous, described))
        if len(self._signatures) == self.recompile_limit + 1:
            message = (f"{self.fn.__name__} has been compiled for {len(self._signatures)} signatures, past its "
                       f"recompile_limit of {self.recompile_limit}; last change: "
                       f"{_recompile_reason(previous or {}, described)}. Mark changing Python scalars "
                       "jit(dynamic=(...)) or pass them as 0-d arrays; see step.signatures()")
            LOGGER.warning(message)
            warnings.warn(message, RecompileWarning, stacklevel=3)

    def signatures(self) -> list[dict[str, str]]:
        """The signatures compiled by calls, in order: each a dict of parameter path -> its type
        (``f32[32,64]``), ``dynamic f32[]``, its static value or ``the array of <path>`` (one array
        object under two paths), and the module state its trace read through functional_call
        (``model.1.training`` -> ``True``, ``model.1.p`` -> ``0.5``, ``model.wte.weight (tied)``)."""
        return [dict(signature) for signature in self._signatures]

    # ------------------------------------------------------------- compiling
    def lower(self, shapes: str | dict[str, Any], **static: Any) -> Executable:
        """Trace and compile for a signature given as a SPEC without running it.

        ``shapes`` is a SPEC string (``x=f32[64,784] w=f32[10,784]:leaf``, pytree
        parameters by dotted path: ``params.w=f32[10,784]:leaf``, bendc/spec.py) or a
        dict of name -> TensorType or SPEC type text, or name -> a pytree of them
        (``{"params": {"w": "f32[10,784]"}, "batch": ("f32[64,784]", "i64[64]")}``);
        Python scalars go in ``static`` (defaults apply). Introspection then shows
        this signature.
        """
        self._last = self._compile_lowered(shapes, static)
        return self._last

    def export(self, folder: str, shapes: str | dict[str, Any], static: dict[str, Any] | None = None,
               progress: Progress | None = None, *, target: str | None = None, arch: str = "sm_90",
               sign_with: str | None = None) -> Executable:
        """Compile for a SPEC (as :meth:`lower`) and write the artifact folder (``bendc compile``).

        The build is always fresh: the on-disk program cache is neither read
        nor written. ``folder`` appears complete or not at all (an old one is
        replaced). ``progress(number, count, kernel)`` is called per kernel.
        ``target="cuda"`` builds PTX and cubin for ``arch`` (numba-cuda, no GPU needed).
        The manifest is signed with this user's key, or with the key in the file ``sign_with``
        (a team's: runtimes given it by ``BENDC_KEY_FILE`` accept the artifact).
        """
        if target != "cuda" and self.resolved_target == "reference":
            raise UnsupportedError("target 'reference' interprets the IR and has no artifact; use target='cpu'",
                                   loc=user_location(), op="compile")
        extra = {"artifact": folder, "progress": progress, "sign_with": sign_with}
        if target == "cuda":
            extra["cuda_arch"] = arch
        self._last = self._compile_lowered(shapes, static or {}, **extra)
        return self._last

    def _compile_lowered(self, shapes: str | dict[str, Any], static: dict[str, Any], **extra: Any) -> Executable:
        binding = self._example_binding(shapes, static)
        if binding is not None:
            types = [(name, TensorType(dtype_name(array.dtype), tuple(array.shape))) for name, array in binding.arrays]
            return self._compile(types, binding.static, binding=binding, **extra)
        types, static = self._lowering_signature(shapes, static)
        return self._compile(types, static, **extra)

    def _example_binding(self, shapes: str | dict[str, Any], static: dict[str, Any]) -> Binding | None:
        """For shapes given as pytrees of types (a dict, or a SPEC with dotted pytree entries): the
        binding of zero arrays of those types (None for a flat SPEC or a flat dict of types)."""
        from bendc.spec import is_tree_spec, spec_shapes

        if not is_tree_spec(shapes):
            return None
        if isinstance(shapes, str):
            shapes, marked = spec_shapes(shapes)
            unmarked = [name for name in marked if name not in self.leaves]
            if unmarked:
                raise SignatureError(f"{unmarked[0]!r} is marked :leaf but the function's leaves are {self.leaves}",
                                     loc=user_location(), op="lower")

        def example(leaf: Any) -> Any:
            if isinstance(leaf, str):
                leaf = TensorType.parse(leaf.removesuffix(":leaf"))
            if isinstance(leaf, TensorType):
                return np.zeros(leaf.shape, DTYPES[leaf.dtype])
            return leaf

        unknown = [name for name in list(shapes) + list(static) if name not in self.signature.parameters]
        if unknown:
            raise SignatureError(f"{unknown} are not parameters of {self.fn.__name__}{self.signature}",
                                 loc=user_location(), op="lower")
        arguments = {name: tree.map(example, value) for name, value in shapes.items()}
        return self._bind((), {**arguments, **static})

    def _lowering_signature(self, shapes: str | dict[str, Any],
                            static: dict[str, Any]) -> tuple[list[tuple[str, TensorType]], dict[str, Any]]:
        """(parameter types in order, static values) of a SPEC and the given static values."""
        from bendc.spec import parse_spec

        specs = parse_spec(shapes) if isinstance(shapes, str) else {
            name: (t if isinstance(t, TensorType) else TensorType.parse(t), name in self.leaves)
            for name, t in shapes.items()}
        for name, (_, leaf) in specs.items():
            if name not in self.signature.parameters:
                raise SignatureError(f"{name!r} is not a parameter of {self.fn.__name__}{self.signature}",
                                     loc=user_location(), op="lower")
            if leaf and name not in self.leaves:
                raise SignatureError(f"{name!r} is marked :leaf but the function's leaves are {self.leaves}",
                                     loc=user_location(), op="lower")
        for name in static:
            if name not in self.signature.parameters or name in specs:
                raise SignatureError(f"static value {name!r} is not a scalar parameter of "
                                     f"{self.fn.__name__}{self.signature}", loc=user_location(), op="lower")
        defaults = {name: p.default for name, p in self.signature.parameters.items()
                    if p.default is not inspect.Parameter.empty and name not in specs}
        static = {**defaults, **static}
        missing = [name for name in self.signature.parameters if name not in specs and name not in static]
        if missing:
            raise SignatureError(f"no shape or value given for {missing}", loc=user_location(), op="lower")
        types = [(name, specs[name][0]) for name in self.signature.parameters if name in specs]
        return types, {k: v for k, v in static.items() if k not in specs}

    def _compile(self, types: list[tuple[str, TensorType]], static: dict[str, Any], artifact: str | None = None,
                 progress: Progress | None = None, cuda_arch: str | None = None,
                 binding: Binding | None = None, sign_with: str | None = None) -> Executable:
        """Trace, differentiate, run the passes and build; ``artifact``: write it there, cache unused.
        ``binding``: a call's pytrees and dynamic scalars (leaves and donations by input name)."""
        leaves, donate = self.leaves, self.donate
        if binding is not None:
            leaves, donate = tuple(binding.leaves), tuple(binding.donate)
        return compile_step(Request(self.fn, tuple(self.signature.parameters), tuple(types), dict(static),
                                    leaves, donate, tuple(self.passes), self.resolved_target,
                                    self.cache_dir, artifact, progress, cuda_arch,
                                    binding.arguments if binding is not None else None,
                                    data_parallel=self.data_parallel,
                                    structure=_parameters_json(self.signature, types, static, binding),
                                    sign_with=sign_with))

    # ------------------------------------------------------------- introspection
    def _executable(self) -> Executable:
        if self._last is None:
            raise BendcError(f"{self.fn.__name__} has not been called yet: call it once to trace a signature",
                             loc=user_location(), op="introspection")
        return self._last

    def ir(self, stage: str = "final") -> str:
        """The printed IR after ``stage`` for the last signature traced."""
        stages = self._executable().stages
        if stage not in stages:
            raise BendcError(f"no stage {stage!r}; stages are {', '.join(stages)}", loc=user_location(), op="ir")
        return stages[stage]

    def stages(self) -> list[str]:
        return list(self._executable().stages)

    def tape(self) -> str:
        """The tape of the last trace, one entry a line."""
        return self._executable().tape

    def kernels(self) -> dict[str, str]:
        """Generated kernel sources by kernel name (none on the reference target)."""
        return dict(self._executable().kernels)

    def stats(self) -> dict[str, int]:
        """Kernel launches and bytes moved per call, temporaries planned vs naive (cpu target)."""
        return dict(self._executable().stats)

    def report(self) -> str:
        """The compile report: pass decisions with their reasons."""
        return self._executable().report

    def profile(self, *args: Any, runs: int = 10, **kwargs: Any):
        """Where a call's time goes, per kernel, over ``runs`` calls (bendc/profile.py): a table
        that prints, with ``.rows`` (kernel, source_lines, calls, total_ms, mean_ms, share, ...)
        and ``.chrome(path)``. cpu target."""
        from bendc.profile import profile_executable

        self(*args, **kwargs)  # compiles (or finds) the signature
        binding = self._bind(args, kwargs)
        return profile_executable(self.fn.__name__, self._executable(), [value for _, value in binding.arrays], runs)


def jit(fn: Callable | None = None, *, leaves: Sequence[str] = (), target: str = "auto",
        cache_dir: str | None = None, passes: Sequence[Any] | None = None, donate: Sequence[str] = (),
        dynamic: Sequence[str] = (), recompile_limit: int = DEFAULT_RECOMPILE_LIMIT, check: str | None = None,
        data_parallel: bool | str = False, bucket_mb: float | None = None):
    """Compile a PyTorch-style training step; works as ``@jit`` and ``@jit(...)``.

    Parameters may be arrays, Python scalars and other hashable values (static: a new value is a
    new signature) or pytrees of them (bendc.tree). ``leaves`` names the parameters whose arrays
    take gradients (every array inside a pytree parameter). ``dynamic`` names parameters whose
    Python numbers are traced 0-d float32 values instead of static ones (a learning rate).
    Past ``recompile_limit`` signatures a RecompileWarning fires; ``BENDC_LOG=recompiles`` logs
    every recompile and its reason (logger "bendc"). One array object under two paths of the
    arguments is one input (tied weights: one leaf). A step that runs a torch module through
    ``bendc.functional_call`` traces again when the module state its trace read changes (training
    flags, attributes, ties, buffers: bendc/guards.py), one trace per state.

    ``donate`` names array parameters whose memory the caller gives up: on the
    cpu target an updated value of the same shape (an optimizer step's new
    parameter) may be written over them in place and returned; on cuda (the
    cubin runtime) over the parameter's device buffer, returned resident, so that
    feeding it back copies nothing (runtime/cuda_graph.py). ``target="cuda"`` runs
    cubins built for the present GPU where it can, else numba-cuda's JIT;
    ``BENDC_CUDA_RUNTIME`` chooses (bendc/cuda_jit.py). ``check="reference"`` (or
    BENDC_CHECK=1) runs the first call of each signature beside the reference interpreter and
    names the first kernel whose outputs leave the tolerance (bendc/check.py).

    ``data_parallel=True`` makes every ``.grad`` read the mean of the gradient over the ranks of
    ``mpiexec -n N`` (an ``all_reduce`` op where the gradient is final; bendc.distributed), the
    all-reduces bucketed by the ``bucket`` pass into messages of up to ``bucket_mb`` MB (25, as
    DistributedDataParallel) and overlapped with the rest of the backward.
    ``data_parallel="sharded"`` also shards ``bendc.optim``'s updates (ZeRO-1): each rank updates
    its shard of every parameter with its shard of the optimizer state (``bendc.optim.init_*(params,
    sharded=True)``), between a reduce-scatter of the gradients and an all-gather of the parameters.
    """
    def wrap(function: Callable) -> JitFunction:
        return JitFunction(function, leaves=leaves, target=target, cache_dir=cache_dir, passes=passes,
                           donate=donate, dynamic=dynamic, recompile_limit=recompile_limit, check=check,
                           data_parallel=data_parallel, bucket_mb=bucket_mb)

    if fn is not None:
        return wrap(fn)
    return wrap


def zero_grad(*leaves: Tensor) -> None:
    """Empty the gradient slots of leaves (PyTorch's zero_grad(set_to_none=True))."""
    from bendc.trace import active_tracer

    if not leaves:
        return
    tracer = leaves[0].tracer if isinstance(leaves[0], Tensor) else active_tracer("zero_grad")
    tracer.zero_grad(leaves)
