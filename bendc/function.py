"""bendc.jit: the jitted function: binding arguments to a signature, the fast path, introspection.

The first call per signature compiles through the driver (bendc/compile.py); later calls reuse it.

A signature is the parameters' shapes and dtypes, the leaves, the values of
static Python scalars, and the target.
"""
from __future__ import annotations

import functools
import inspect
import os
from typing import Any, Callable, Sequence

import numpy as np

from bendc.compile import Executable, Progress, Request, compile_step, cuda_status, unflatten_result
from bendc.errors import BendcError, SignatureError, UnsupportedError, user_location
from bendc.ir.types import TensorType, dtype_name
from bendc.passes import Pipeline, default_passes
from bendc.trace import Tensor
from runtime.cuda import as_device_array, is_device_array

TARGETS = ("auto", "cpu", "cuda", "reference")
# cuda where numba-cuda imports and a GPU is usable, or under numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1).
IMPLEMENTED_TARGETS = ("reference", "cpu") + (("cuda",) if cuda_status() else ())
STATIC_TYPES = (bool, int, float)


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
        return _c_order(np.asarray(value))
    if hasattr(value, "__dlpack__"):
        return _c_order(np.from_dlpack(value))
    if hasattr(value, "copy_to_host"):
        return _c_order(value.copy_to_host())
    raise SignatureError(f"parameter {name!r}: cannot read an array from {type(value).__name__}",
                         loc=user_location(), op="call")


def is_array_like(value: Any) -> bool:
    return isinstance(value, np.ndarray) or any(
        hasattr(value, attr) for attr in ("__array__", "__dlpack__", "__cuda_array_interface__"))


class JitFunction:
    """The callable that ``bendc.jit`` returns."""

    def __init__(self, fn: Callable, *, leaves: Sequence[str], target: str, cache_dir: str | None,
                 passes: Sequence[Any] | None, donate: Sequence[str] = (), check: str | None = None) -> None:
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
        self.target = target
        self.resolved_target = resolve_target(target)
        self.cache_dir = cache_dir
        self.passes = list(passes) if passes is not None else default_passes()
        Pipeline(self.passes)  # unknown pass names fail here, at decoration
        self._cache: dict[tuple, Executable] = {}
        self._fast: dict[tuple, tuple[Executable, list[int]]] = {}
        plain = all(p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                    for p in self.signature.parameters.values())
        self._positional = len(self.signature.parameters) if plain else -1
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
        hit = self._fast.get(fast) if fast is not None else None
        if hit is not None:  # the hot path: positional numpy arrays and scalars of a known signature
            executable, positions = hit
            self._last = executable
            return unflatten_result(executable.template, executable.run([args[i] for i in positions]))
        arrays, key, static = self._bind(args, kwargs)
        executable = self._cache.get(key)
        if executable is None:  # a cold call: progress on a terminal while numba compiles (bendc/progress.py)
            from bendc.progress import compile_watch

            with compile_watch(self.resolved_target):
                types = [(name, TensorType(dtype_name(array.dtype), tuple(array.shape))) for name, array in arrays]
                executable = self._compile(types, static)
                self._cache[key] = executable
                return self._run(executable, key, fast, arrays)
        return self._run(executable, key, fast, arrays)

    def _run(self, executable: Executable, key: tuple, fast: tuple | None, arrays: list) -> Any:
        if fast is not None:
            names = list(self.signature.parameters)
            self._fast[fast] = (executable, [names.index(name) for name, _ in arrays])
        self._last = executable
        if self.check is not None and key not in self._checked:
            from bendc.check import checked_run

            results = checked_run(executable.run, executable.graph, [value for _, value in arrays])
            self._checked.add(key)
        else:
            results = executable.run([value for _, value in arrays])
        return unflatten_result(executable.template, results)

    def _fast_key(self, args: tuple, kwargs: dict) -> tuple | None:
        """A signature key computed without binding, for calls with every parameter given
        positionally as a C-contiguous numpy array or a Python scalar; None otherwise."""
        if kwargs or len(args) != self._positional:
            return None
        key = []
        for value in args:
            kind = type(value)
            if kind is np.ndarray:
                if not value.flags.c_contiguous:
                    return None
                key.append((value.dtype.char, value.shape))
            elif kind is int or kind is float or kind is bool:
                key.append((kind, value))
            else:
                return None
        return tuple(key)

    def _bind(self, args, kwargs):
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as error:
            raise SignatureError(f"{self.fn.__name__}{self.signature}: {error}",
                                 loc=user_location(), op="call") from None
        bound.apply_defaults()
        arrays: list[tuple[str, np.ndarray]] = []
        static: dict[str, Any] = {}
        key: list = []
        for name, value in bound.arguments.items():
            kind = self.signature.parameters[name].kind
            if kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                raise SignatureError(f"*args and **kwargs parameters ({name}) are not supported",
                                     loc=user_location(), op="call")
            if is_array_like(value) and not isinstance(value, np.generic):
                if self.resolved_target == "cuda" and is_device_array(value):
                    array = as_device_array(value)  # stays on the device: no copy
                else:
                    array = to_array(value, name)
                dtype = dtype_name(array.dtype)
                if dtype not in ("f32", "i64", "i32"):
                    hint = " (use .astype(np.float32))" if array.dtype.kind == "f" else ""
                    raise SignatureError(f"parameter {name!r} has dtype {array.dtype}; bendc takes float32 "
                                         f"data and int64/int32 indices{hint}", loc=user_location(), op="call")
                if name in self.leaves and dtype != "f32":
                    raise SignatureError(f"leaf {name!r} must be float32, got {array.dtype}",
                                         loc=user_location(), op="call")
                arrays.append((name, array))
                key.append((name, dtype, array.shape))
            elif isinstance(value, STATIC_TYPES + (np.generic,)) or value is None:
                if name in self.leaves:
                    raise SignatureError(f"leaf {name!r} must be an array, got {type(value).__name__}",
                                         loc=user_location(), op="call")
                if isinstance(value, np.generic):
                    value = value.item()
                static[name] = value
                key.append((name, type(value).__name__, value))
            else:
                raise SignatureError(f"parameter {name!r}: {type(value).__name__} is not supported (arrays "
                                     "and Python scalars only)", loc=user_location(), op="call")
        return arrays, (tuple(key), self.leaves, self.resolved_target), static

    # ------------------------------------------------------------- compiling
    def lower(self, shapes: str | dict[str, Any], **static: Any) -> Executable:
        """Trace and compile for a signature given as a SPEC without running it.

        ``shapes`` is a SPEC string (``x=f32[64,784] w=f32[10,784]:leaf``) or a
        dict of name -> TensorType or SPEC type text; Python scalars go in
        ``static`` (defaults apply). Introspection then shows this signature.
        """
        types, static = self._lowering_signature(shapes, static)
        self._last = self._compile(types, static)
        return self._last

    def export(self, folder: str, shapes: str | dict[str, Any], static: dict[str, Any] | None = None,
               progress: Progress | None = None, *, target: str | None = None, arch: str = "sm_90") -> Executable:
        """Compile for a SPEC (as :meth:`lower`) and write the artifact folder (``bendc compile``).

        The build is always fresh: the on-disk program cache is neither read
        nor written. ``folder`` appears complete or not at all (an old one is
        replaced). ``progress(number, count, kernel)`` is called per kernel.
        ``target="cuda"`` builds PTX and cubin for ``arch`` (numba-cuda, no GPU needed).
        """
        if target == "cuda":
            types, static = self._lowering_signature(shapes, static or {})
            self._last = self._compile(types, static, artifact=folder, progress=progress, cuda_arch=arch)
            return self._last
        if self.resolved_target == "reference":
            raise UnsupportedError("target 'reference' interprets the IR and has no artifact; use target='cpu'",
                                   loc=user_location(), op="compile")
        types, static = self._lowering_signature(shapes, static or {})
        self._last = self._compile(types, static, artifact=folder, progress=progress)
        return self._last

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
                 progress: Progress | None = None, cuda_arch: str | None = None) -> Executable:
        """Trace, differentiate, run the passes and build; ``artifact``: write it there, cache unused."""
        return compile_step(Request(self.fn, tuple(self.signature.parameters), tuple(types), dict(static),
                                    self.leaves, self.donate, tuple(self.passes), self.resolved_target,
                                    self.cache_dir, artifact, progress, cuda_arch))

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
        arrays, _, _ = self._bind(args, kwargs)
        return profile_executable(self.fn.__name__, self._executable(), [value for _, value in arrays], runs)


def jit(fn: Callable | None = None, *, leaves: Sequence[str] = (), target: str = "auto",
        cache_dir: str | None = None, passes: Sequence[Any] | None = None, donate: Sequence[str] = (),
        check: str | None = None):
    """Compile a PyTorch-style training step; works as ``@jit`` and ``@jit(...)``.

    ``donate`` names array parameters whose memory the caller gives up: on the
    cpu target an updated value of the same shape (an optimizer step's new
    parameter) may be written over them in place and returned. ``check="reference"`` (or
    BENDC_CHECK=1) runs the first call of each signature beside the reference interpreter and
    names the first kernel whose outputs leave the tolerance (bendc/check.py).
    """
    def wrap(function: Callable) -> JitFunction:
        return JitFunction(function, leaves=leaves, target=target, cache_dir=cache_dir, passes=passes,
                           donate=donate, check=check)

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
