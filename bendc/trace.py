"""Tracing: Tensor proxies turn a Python function's calls into tape entries.

The tape is the forward graph in creation order: leaves, constants and ops,
each tagged with the user's file:line. ``backward()`` records a request and
``.grad`` reads a gradient slot (a ``grad`` placeholder node); the autodiff
stage turns both into ordinary backward nodes.

PyTorch's rules hold: an op whose operands are all constants is a constant;
a constant operand is frozen and the backward does no work for it.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import numbers
import sys
from typing import Any, Iterator, Sequence

import numpy as np

from bendc.builder import Builder
from bendc.errors import GradientError, ShapeError, UnsupportedAttributeError, UnsupportedError, user_location
from bendc.ir.graph import Graph
from bendc.ir.printer import format_node
from bendc.ir.types import DTYPES, TensorType
from bendc.ops.base import f32_value
from bendc.ops import OPS
from bendc.ops.base import METHODS
from bendc.reductions import ReductionMethods  # max/min/amax/amin/argmax/argmin/var/std/logsumexp/cumsum
from bendc.tensor_ops import ACTIVE_TRACER, TensorOps  # comparisons, casts, selection, powers, shape methods
from bendc.indexing import MaskedSelection, getitem, in_place, setitem  # x[key], x[key] = value, x += y
from bendc.tensor_math import MathMethods, as_dtype, normalize_dim as _normalize_dim  # nan_to_num, round(decimals=), any/all, ... (issue 22)
from bendc.sort_scatter import SortScatterMethods  # prod/cumprod/flip/sort/argsort/topk/scatter* (issue 22)

_ACTIVE: list["Tracer"] = []
# The handler of torch functions called on traced tensors (bendc.torch_bridge.torch_function, which
# registers itself: the bridge reads bendc.functional, which reads this module).
TORCH_FUNCTION: list[Any] = []
# A context manager factory for the torch function mode active while tracing (bendc.torch_bridge's
# CreationMode): torch functions called without a traced operand reach it.
TORCH_MODE: list[Any] = []
# Where each torch tensor made during a trace by a function bendc does not trace came from
# (id -> (user location, torch name)), so that refusing it names the line that made it.
TORCH_ORIGINS: dict[int, tuple[Any, str]] = {}
# torch.Tensor methods that bendc traces, by name (bendc.torch_bridge fills it): x.add(y), x.index_select(...)
TORCH_METHODS: dict[str, Any] = {}


def active_tracer(op: str) -> "Tracer":
    """The tracer of the jitted function being traced, or a clear error."""
    if not _ACTIVE:
        raise UnsupportedError("called outside a bendc.jit function; bendc ops work on traced tensors only",
                               loc=user_location(), op=op)
    return _ACTIVE[-1]


ACTIVE_TRACER.append(active_tracer)  # the creation functions of bendc/tensor_ops.py ask it


class Tracer:
    """Records one traced call: the graph, gradient-requiring values, and
    the backward requests per leaf since its last zero_grad."""

    def __init__(self, name: str, data_parallel: bool = False, target: str = "cpu") -> None:
        self.graph = Graph(name)
        self.target = target  # the jit target: where Tensor.device says the data lives
        self.data_parallel = data_parallel  # every .grad read is the gradient's mean over the ranks
        self.builder = Builder(self.graph)
        self.requires_grad: set[int] = set()
        self.leaves: set[int] = set()
        self.slots: dict[int, list[int]] = {}  # leaf -> backward roots since its last zero_grad
        self.module_guards: list[Any] = []  # what functional_call's forwards read (bendc/guards.py)
        self.fn: Any = None  # the traced function
        # Values an in-place write (x[key] = value) left stale: views PyTorch would have updated, which
        # bendc's out-of-place write cannot; using one is an error naming the write (bendc/indexing.py).
        self.stale: dict[int, str] = {}
        self.splits = 0  # split/chunk calls traced: each one's pieces carry its number (tensor_ops.split)

    def add_module_guard(self, guard: Any) -> None:
        """Keep a forward's ModuleGuard, merged into an earlier one of the same module tree."""
        if not any(earlier.merge(guard) for earlier in self.module_guards):
            self.module_guards.append(guard)

    @contextlib.contextmanager
    def active(self) -> Iterator["Tracer"]:
        """This tracer records the calls made inside; where torch is loaded, torch's creation functions
        called without a traced operand (torch.arange(t), torch.zeros(...)) trace too (TORCH_MODE)."""
        _ACTIVE.append(self)
        try:
            with (TORCH_MODE[0]() if TORCH_MODE and "torch" in sys.modules else contextlib.nullcontext()):
                yield self
        finally:
            _ACTIVE.pop()

    # ------------------------------------------------------------- values
    def param(self, name: str, type: TensorType, leaf: bool) -> "Tensor":
        node = self.graph.add("param", (), {"name": name, "leaf": leaf, "dtype": type.dtype,
                                            "shape": type.shape}, type)
        if leaf:
            self.leaves.add(node.id)
            self.requires_grad.add(node.id)
            self.slots[node.id] = []
        return Tensor(self, node.id)

    def array_constant(self, values: np.ndarray, dtype: str) -> "Tensor":
        """A constant of the graph holding ``values`` (any shape) as ``dtype``: a ``literal`` of up to
        LITERAL_LIMIT values (fused into the kernels that read it), else a lifted constant."""
        from bendc.ops.creation import LITERAL_LIMIT

        values = np.asarray(values)
        if values.size > LITERAL_LIMIT:
            return self.lifted_constant(values, dtype)
        flat = values.reshape(-1)
        if dtype == "f32":
            converted = tuple(f32_value(float(v)) for v in flat.astype(np.float32))
        elif dtype == "bool":
            converted = tuple(bool(v) for v in flat)
        else:
            converted = tuple(int(v) for v in flat)
        return self.emit("literal", (), shape=tuple(int(d) for d in values.shape), dtype=dtype, values=converted)

    def lifted_constant(self, values: np.ndarray, dtype: str) -> "Tensor":
        """A constant too large to write into the IR (a ``literal`` holds at most LITERAL_LIMIT values: a
        captured causal mask): a parameter of the step marked ``const=<hash of its values>``, whose array
        the graph keeps (``graph.constants``) and every program passes after the caller's inputs, as
        torch.compile lifts constants. The same values twice in one trace are one parameter."""
        array = np.array(values, dtype=DTYPES[dtype], order="C", copy=True)  # not a view of a torch tensor
        digest = hashlib.sha256(f"{dtype}{array.shape}".encode() + array.tobytes()).hexdigest()[:16]
        for id in self.graph.constant_params():
            if self.graph.node(id).attr["const"] == digest:
                return Tensor(self, id)
        taken = {self.graph.node(p).attr["name"] for p in self.graph.params}
        number = len(self.graph.constant_params())
        while f"_tensor_constant{number}" in taken:
            number += 1
        name = f"_tensor_constant{number}"
        type = TensorType(dtype, tuple(int(d) for d in array.shape))
        node = self.graph.add("param", (), {"name": name, "leaf": False, "dtype": dtype, "shape": type.shape,
                                            "const": digest}, type)
        array.setflags(write=False)  # shared by every call of the program
        self.graph.constants[name] = array
        return Tensor(self, node.id)

    @contextlib.contextmanager
    def at_user_line(self, op: str) -> Iterator[Builder]:
        """Tag nodes made inside with the user's current line and op name."""
        builder = self.builder
        outer = (builder.loc, builder.user_op)
        if builder.user_op is None:  # the outermost user-facing op names the line
            builder.loc, builder.user_op = user_location(), op
        try:
            yield builder
        finally:
            builder.loc, builder.user_op = outer

    def emit(self, op: str, inputs: Sequence[int], /, **attrs: Any) -> "Tensor":  # /: an attr may be named op
        """One node; it requires grad where an operand does and the op is differentiable."""
        for operand in inputs:
            if operand in self.stale:
                raise UnsupportedError(self.stale[operand], loc=self.builder.loc or user_location(),
                                       op=self.builder.user_op or op)
        id = self.builder.emit(op, inputs, **attrs)
        if OPS[op].differentiable and any(i in self.requires_grad for i in inputs):
            if self.graph.node(id).type.is_float:
                self.requires_grad.add(id)
        return Tensor(self, id)

    def const(self, value: float) -> "Tensor":
        return self.emit("const", (), value=float(np.float32(value)))

    def int_const(self, value: int, dtype: str = "i64") -> "Tensor":
        """A 0-d integer constant (an iota of step 0)."""
        return self.emit("iota", (), shape=(), dim=0, start=int(value), step=0, dtype=dtype)

    def value(self, operand: Any, op: str) -> "Tensor":
        """A tensor operand, or a Python scalar made a float32 constant."""
        if isinstance(operand, Tensor):
            if operand.tracer is not self:
                raise UnsupportedError("a tensor from another trace was used here", loc=self.builder.loc, op=op)
            return operand
        if isinstance(operand, (bool, numbers.Real)) and not isinstance(operand, np.ndarray):
            return self.const(float(operand))
        if type(operand).__module__.startswith("torch") and hasattr(operand, "shape"):
            if operand.shape == ():
                return self.const(float(operand.item()))  # a 0-d torch constant (torch.tensor(2.0))
            return torch_constant(self, operand, op)
        if isinstance(operand, MaskedSelection):
            operand.refuse(op)
        raise UnsupportedError(
            f"operand of type {type(operand).__name__} is not supported; pass arrays as parameters "
            "of the jitted function and use Python scalars for constants", loc=self.builder.loc, op=op)

    # ------------------------------------------------------------- autograd
    def backward(self, root: "Tensor", seed: Any) -> None:
        with self.at_user_line("backward") as builder:
            type = root.type
            if root.id not in self.requires_grad:
                raise GradientError(f"the tensor {type} does not require grad: no leaf reaches it "
                                    "(name the parameters in jit(leaves=...))", loc=builder.loc, op="backward")
            if seed is None:
                if type.numel != 1:
                    raise GradientError(f"backward() of a non-scalar {type} needs a seed: "
                                        "pass backward(gradient) with the output's shape",
                                        loc=builder.loc, op="backward")
                target = root if type.ndim == 0 else root.reshape(())
            else:
                seed = self.value(seed, "backward")
                if seed.shape != type.shape:
                    raise ShapeError(f"the seed {seed.type} must have the output's shape {type}",
                                     loc=builder.loc, op="backward")
                if seed.id in self.requires_grad:
                    raise GradientError("the seed of backward() must not require grad",
                                        loc=builder.loc, op="backward")
                # d sum(y * seed) / dy is seed exactly (1 * seed), so the rest is PyTorch's
                # backward with gradient=seed.
                target = (root * seed).sum()
        for leaf in self.reached_leaves(target.id):
            self.slots[leaf].append(target.id)

    def reached_leaves(self, root: int) -> set[int]:
        """Leaves with a path to ``root`` through values that require grad."""
        reached, stack, seen = set(), [root], {root}
        while stack:
            node = self.graph.node(stack.pop())
            if node.id in self.leaves:
                reached.add(node.id)
            for operand in node.inputs:
                if operand in self.requires_grad and operand not in seen:
                    seen.add(operand)
                    stack.append(operand)
        return reached

    def grad_of(self, tensor: "Tensor") -> "Tensor | None":
        with self.at_user_line("grad") as builder:
            if tensor.id not in self.leaves:
                what = "a constant" if tensor.id not in self.requires_grad else "a non-leaf tensor"
                raise GradientError(f".grad of {what} {tensor.type}: only leaves named in "
                                    "jit(leaves=...) keep gradients", loc=builder.loc, op="grad")
            roots = self.slots[tensor.id]
            if not roots:
                return None
            grad = self.emit("grad", (tensor.id, *roots))
            if self.data_parallel:  # reduced where the gradient is final: after its last contribution
                return self.emit("all_reduce", (grad.id,), op="mean", group="world")
            return grad

    def zero_grad(self, tensors: Sequence["Tensor"]) -> None:
        for tensor in tensors:
            if not isinstance(tensor, Tensor) or tensor.id not in self.leaves:
                what = f"a non-leaf tensor {tensor.type}" if isinstance(tensor, Tensor) else type_name(tensor)
                raise GradientError(f"zero_grad takes leaves named in jit(leaves=...), got {what}",
                                    loc=user_location(), op="zero_grad")
            self.slots[tensor.id] = []

    def tape(self) -> str:
        """The tape, one entry a line, in creation order."""
        lines = []
        for id in sorted(self.graph.order()):
            node = self.graph.node(id)
            kind = "leaf" if id in self.leaves else ("op" if id in self.requires_grad else "constant")
            if node.op == "param" and id not in self.leaves:
                kind = "constant"
            lines.append(f"{kind:<8} {format_node(self.graph, node)}")
        return "\n".join(lines) + "\n"


class Tensor(ReductionMethods, TensorOps, MathMethods, SortScatterMethods):
    """A traced value: arithmetic on it records nodes (PyTorch semantics). Reductions beyond sum come
    from :class:`bendc.reductions.ReductionMethods`; comparisons, casts, selection, powers and shape
    methods from :class:`bendc.tensor_ops.TensorOps`."""

    __array_priority__ = 1000  # numpy scalars on the left defer to Tensor's reflected ops

    def __init__(self, tracer: Tracer, id: int) -> None:
        self.tracer = tracer
        self.id = id

    # ------------------------------------------------------------- facts
    @property
    def type(self) -> TensorType:
        return self.tracer.graph.node(self.id).type

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def ndim(self) -> int:
        return self.type.ndim

    @property
    def dtype(self) -> Any:
        """PyTorch's dtype of the values (``torch.float32``, ``torch.int64``, ``torch.int32``,
        ``torch.bool``; numpy's where torch is not loaded): what ``x.dtype == torch.float32``,
        ``dtype=x.dtype``, ``x.to(y.dtype)`` and ``torch.finfo(x.dtype)`` expect. bendc's own code
        reads the IR's name, ``x.type.dtype`` ("f32", "i64", "i32", "bool")."""
        torch = sys.modules.get("torch")
        if torch is not None:
            return {"f32": torch.float32, "i64": torch.int64, "i32": torch.int32, "bool": torch.bool}[self.type.dtype]
        return DTYPES[self.type.dtype]

    def is_floating_point(self) -> bool:
        return self.type.is_float

    @property
    def requires_grad(self) -> bool:
        return self.id in self.tracer.requires_grad

    @property
    def device(self) -> Any:
        """Where the jit target puts the data: ``torch.device("cuda", 0)`` on the cuda target, else
        ``torch.device("cpu")`` (where torch is not loaded, "cuda:0" or "cpu"): an object creation
        functions and ``to()`` take back (``torch.arange(t, device=x.device)``). bendc ignores devices
        inside a traced function: the jit target places the data."""
        cuda = self.tracer.target == "cuda"
        if "torch" in sys.modules:
            return sys.modules["torch"].device("cuda", 0) if cuda else sys.modules["torch"].device("cpu")
        return "cuda:0" if cuda else "cpu"

    @property
    def is_cuda(self) -> bool:
        return self.tracer.target == "cuda"

    def size(self, dim: int | None = None):
        if dim is None:
            return self.shape
        return self.shape[_normalize_dim(dim, self.ndim, "size", user_location())]

    def dim(self) -> int:
        return self.ndim

    def numel(self) -> int:
        return self.type.numel

    def __len__(self) -> int:
        if self.ndim == 0:
            raise UnsupportedError("len() of a 0-d tensor", loc=user_location(), op="len")
        return self.shape[0]

    def __iter__(self) -> Iterator["Tensor"]:
        """Rows along dim 0, as PyTorch iterates (without it, Python's fallback would index past the end)."""
        if self.ndim == 0:
            raise UnsupportedError("iteration over a 0-d tensor", loc=user_location(), op="iter")
        return iter([self[i] for i in range(self.shape[0])])

    def __repr__(self) -> str:
        return f"Tensor(%{self.id}: {self.type})"

    def __bool__(self) -> bool:
        node = self.tracer.graph.node(self.id)
        symbol = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}.get(node.op)
        what = str(self.type)
        if symbol is not None:  # `if x.sum() > 0:` names the comparison
            left, right = (self.tracer.graph.node(i).type for i in node.inputs)
            what += f" (the comparison {left} {symbol} {right})"
        raise UnsupportedError(f"the truth value of traced tensor {what} is not known while tracing "
                               "(data-dependent control flow is not supported)", loc=user_location(), op="bool")

    __hash__ = object.__hash__  # tensors are hashed by identity

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if name in METHODS:  # an op that declares its Tensor method in its op file
            return functools.partial(self._registry_method, METHODS[name])
        if name in TORCH_METHODS:  # a torch.Tensor method bendc traces (bendc/torch_bridge.py's table)
            return functools.partial(TORCH_METHODS[name], self)
        raise UnsupportedAttributeError(f"Tensor.{name} is not supported by bendc (see API.md for the tensor "
                                        "methods it traces)", loc=user_location(), op=name)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        """torch.*, torch.nn.functional.* and torch.Tensor methods on traced tensors trace into
        bendc's ops: bendc/torch_bridge.py registers the handler (bendc.function imports it)."""
        if not TORCH_FUNCTION:
            raise UnsupportedError("torch functions on traced tensors need bendc.torch_bridge (import bendc.jit)",
                                   loc=user_location(), op=getattr(func, "__name__", "torch"))
        return TORCH_FUNCTION[0](func, tuple(args), dict(kwargs or {}))

    def __array__(self, *args, **kwargs):
        raise UnsupportedError(f"a traced tensor {self.type} cannot become a numpy array inside a jitted "
                               "function; return it instead", loc=user_location(), op="__array__")

    # ------------------------------------------------------------- arithmetic
    def _binary(self, op: str, other: Any, reflected: bool = False, user_op: str | None = None) -> Tensor:
        """PyTorch's arithmetic and promotion: two integer operands (a Python int takes the tensor's dtype)
        give an integer + - * (int_add, ...); an integer operand with a float one, and true division, are
        float32; a bool operand is float32."""
        with self.tracer.at_user_line(user_op or op):
            number_is_bool = isinstance(other, (bool, np.bool_))
            if self.type.is_index and op in ("add", "sub", "mul") and _is_int(other):
                other = self.tracer.int_const(int(other), self.type.dtype)
            other = self.tracer.value(other, user_op or op)
            a, b = (other, self) if reflected else (self, other)
            if a.type.is_index and b.type.is_index and op in ("add", "sub", "mul"):
                return self.tracer.emit(f"int_{op}", (a.id, b.id))
            a, b = self._promoted(a, b, user_op or op, number_is_bool)  # a bool operand is float32 (PyTorch's)
            if a.type.is_index or b.type.is_index:  # an integer with a float operand, or a true division
                a, b = a._as_float(), b._as_float()
            return self.tracer.emit(op, (a.id, b.id))

    def _by_divisor(self, op: str, divisor: Any, symbol: str, reflected: bool = False) -> Tensor:
        """``//`` and ``%``: of float operands (a float tensor, or an integer tensor with a float number or
        tensor) torch's float floor_divide / remainder (bendc/ops/math_ops.py); of an integer tensor by a
        positive Python int the integer ops; other integer operands are refused."""
        float_op = {"floordiv": "floor_divide", "remainder": "remainder"}[op]
        divisor_is_float = (isinstance(divisor, Tensor) and divisor.type.is_float) or (
            isinstance(divisor, (float, np.floating)) and not isinstance(divisor, bool))
        if self.type.is_float or divisor_is_float:
            return self._binary(float_op, divisor, reflected=reflected, user_op=float_op)
        with self.tracer.at_user_line(op) as builder:
            if reflected or not self.type.is_index or not _is_int(divisor) or int(divisor) <= 0:
                what = type_name(divisor) if not isinstance(divisor, (int, np.integer)) else repr(divisor)
                raise UnsupportedError(f"{self.type} {symbol} {what}: bendc computes {symbol} of float "
                                       "operands, and of an integer tensor by a positive Python int", loc=builder.loc, op=op)
            return self.tracer.emit(f"int_{op}", (self.id,), divisor=int(divisor))

    def __floordiv__(self, other): return self._by_divisor("floordiv", other, "//")
    def __mod__(self, other): return self._by_divisor("remainder", other, "%")
    def __rfloordiv__(self, other): return self._by_divisor("floordiv", other, "//", reflected=True)
    def __rmod__(self, other): return self._by_divisor("remainder", other, "%", reflected=True)

    def __add__(self, other): return self._binary("add", other)
    def __radd__(self, other): return self._binary("add", other, reflected=True)
    def __sub__(self, other): return self._binary("sub", other)
    def __rsub__(self, other): return self._binary("sub", other, reflected=True)
    def __mul__(self, other): return self._binary("mul", other)
    def __rmul__(self, other): return self._binary("mul", other, reflected=True)
    def __truediv__(self, other): return self._binary("div", other)

    def __rtruediv__(self, other):
        # PyTorch computes scalar / tensor as tensor.reciprocal() * scalar.
        with self.tracer.at_user_line("div"):
            reciprocal = self.tracer.emit("reciprocal", (self._as_float().id,))
            return reciprocal._binary("mul", other, user_op="div")

    def __neg__(self):
        with self.tracer.at_user_line("neg"):
            if self.type.is_index:
                return self.tracer.emit("int_sub", (self.tracer.int_const(0, self.type.dtype).id, self.id))
            return self.tracer.emit("neg", (self.id,))

    def __pos__(self):
        return self

    def __matmul__(self, other): return matmul(self, other)
    def __rmatmul__(self, other): return matmul(other, self)

    def _registry_method(self, op: str, *others: Any) -> Tensor:
        """``x.<method>(*others)`` of an op that declares its method (OpDef.method): the op on x and
        the others (tensors or Python scalars)."""
        with self.tracer.at_user_line(op):
            operands = [self] + [self.tracer.value(other, op) for other in others]
            return self.tracer.emit(op, tuple(operand.id for operand in operands))

    # ------------------------------------------------------------- elementwise
    def _unary(self, op: str, **attrs) -> Tensor:
        with self.tracer.at_user_line(op):
            return self.tracer.emit(op, (self.id,), **attrs)

    def exp(self): return self._unary("exp")
    def log(self): return self._unary("log")
    def tanh(self): return self._unary("tanh")
    def relu(self): return self._unary("relu")
    def sigmoid(self): return self._unary("sigmoid")
    def sqrt(self): return self._unary("sqrt")

    def _row(self, op: str, dim: int) -> Tensor:
        with self.tracer.at_user_line(op) as builder:
            dim = _normalize_dim(dim, self.ndim, op, builder.loc)
            if self.ndim == 0:  # PyTorch takes a 0-d tensor as one row of one element
                return self.reshape(1)._unary(op, dim=0).reshape(())
            return self._unary(op, dim=dim)

    def softmax(self, dim: int) -> Tensor:
        return self._row("softmax", dim)

    def log_softmax(self, dim: int) -> Tensor:
        return self._row("log_softmax", dim)

    # ------------------------------------------------------------- reductions
    def _dims(self, dim, op: str, loc) -> tuple[int, ...]:
        if dim is None:
            return tuple(range(self.ndim))
        dims = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
        dims = tuple(int(d) if isinstance(d, np.integer) else d for d in dims)
        if not dims:  # PyTorch: an empty dim list (sum(dim=())) reduces every dim
            return tuple(range(self.ndim))
        normalized = [_normalize_dim(d, self.ndim, op, loc) for d in dims]
        if len(set(normalized)) != len(normalized):
            raise ShapeError(f"dim {dim} repeats a dimension of {self.type}", loc=loc, op=op)
        if self.ndim == 0:
            return ()  # PyTorch: dim 0 (or -1) of a 0-d tensor reduces nothing
        return tuple(sorted(normalized))

    def sum(self, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
        if dtype is not None:  # bendc/tensor_math.py: float32 only, cast before the sum as torch does
            return as_dtype(self, dtype, "sum").sum(dim, keepdim)
        with self.tracer.at_user_line("sum") as builder:
            dims = self._dims(dim, "sum", builder.loc)
            # an integer or bool tensor sums to int64, as torch's ((pred == y).sum(): a count)
            return self.tracer.emit("sum" if self.type.is_float else "int_sum", (self.id,), dims=dims,
                                    keepdim=bool(keepdim))

    def mean(self, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
        if dtype is not None:
            return as_dtype(self, dtype, "mean").mean(dim, keepdim)
        with self.tracer.at_user_line("mean") as builder:
            dims = self._dims(dim, "mean", builder.loc)
            count = 1
            for d in dims:
                count *= self.shape[d]
            total = self.tracer.emit("sum", (self.id,), dims=dims, keepdim=bool(keepdim))
            # PyTorch's CPU mean is sum(...).div_(count).
            return total / float(count)

    # ------------------------------------------------------------- layout
    def reshape(self, *shape) -> Tensor:
        with self.tracer.at_user_line("reshape") as builder:
            if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
                shape = tuple(shape[0])
            shape = _resolve_reshape(self.type, tuple(shape), builder.loc)
            if shape == self.shape:
                return self
            return self.tracer.emit("reshape", (self.id,), shape=shape)

    def view(self, *shape) -> Tensor:
        return self.reshape(*shape)

    def permute(self, *dims) -> Tensor:
        with self.tracer.at_user_line("permute") as builder:
            if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
                dims = tuple(dims[0])
            if len(dims) != self.ndim:
                raise ShapeError(f"permute{tuple(dims)} needs {self.ndim} dims for {self.type}",
                                 loc=builder.loc, op="permute")
            perm = tuple(_normalize_dim(d, self.ndim, "permute", builder.loc) for d in dims)
            if perm == tuple(range(self.ndim)):
                return self
            return self.tracer.emit("permute", (self.id,), perm=perm)

    def transpose(self, dim0: int, dim1: int) -> Tensor:
        with self.tracer.at_user_line("transpose") as builder:
            perm = list(range(self.ndim))
            a = _normalize_dim(dim0, self.ndim, "transpose", builder.loc)
            b = _normalize_dim(dim1, self.ndim, "transpose", builder.loc)
            perm[a], perm[b] = perm[b], perm[a]
            return self.permute(*perm)

    @property
    def T(self) -> Tensor:
        with self.tracer.at_user_line("T"):
            return self.permute(*reversed(range(self.ndim)))

    def unsqueeze(self, dim: int) -> Tensor:
        with self.tracer.at_user_line("unsqueeze") as builder:
            position = _normalize_dim(dim, self.ndim + 1, "unsqueeze", builder.loc)
            shape = self.shape[:position] + (1,) + self.shape[position:]
            return self.tracer.emit("reshape", (self.id,), shape=shape)

    def __getitem__(self, key) -> Tensor:
        """PyTorch's indexing (bendc/indexing.py): ints, slices (a negative step reverses, as numpy's),
        None, ellipses, lists and integer tensors (advanced indexing, negative values counted from the
        end), and bool masks, whose data-dependent result feeds a reduction (MaskedSelection)."""
        return self._index(key)

    def _index(self, key, **attrs) -> Tensor:
        """``self[key]`` with ``attrs`` on its index node (a split's piece number: TensorOps.split)."""
        with self.tracer.at_user_line("index") as builder:
            return getitem(self, key, builder.loc, **attrs)

    def __setitem__(self, key, value) -> None:
        """``x[key] = value`` as an out-of-place index_put: x names the new tensor afterwards (gradients
        reach the old x where it was kept and value where it was written)."""
        with self.tracer.at_user_line("index_put") as builder:
            self.id = setitem(self, key, value, builder.loc).id

    # ---- in-place ops: the out-of-place value, then x names it (bendc/indexing.py in_place). Python's
    # augmented assignment calls these (x += y is in place in PyTorch: every name of x, and its views,
    # see it); without them Python would rebind only the name written.
    def _in_place(self, what: str, compute) -> Tensor:
        with self.tracer.at_user_line(what) as builder:
            return in_place(self, compute(), builder.loc, what)

    def __iadd__(self, other): return self._in_place("+=", lambda: self + other)
    def __isub__(self, other): return self._in_place("-=", lambda: self - other)
    def __imul__(self, other): return self._in_place("*=", lambda: self * other)
    def __itruediv__(self, other): return self._in_place("/=", lambda: self / other)
    def __ifloordiv__(self, other): return self._in_place("//=", lambda: self // other)
    def __imod__(self, other): return self._in_place("%=", lambda: self % other)
    def __ipow__(self, other): return self._in_place("**=", lambda: self ** other)

    def fill_(self, value: Any) -> Tensor:
        """x.fill_(value): every element ``value`` (a number or a 0-d tensor), in x's dtype."""
        return self._in_place("fill_", lambda: self._spread(value, "fill_"))

    def zero_(self) -> Tensor:
        return self._in_place("zero_", lambda: self._spread(0, "zero_"))

    def copy_(self, src: Any, non_blocking: bool = False) -> Tensor:
        """x.copy_(src): src broadcast to x's shape and cast to x's dtype (PyTorch's copy casts)."""
        return self._in_place("copy_", lambda: self._spread(src, "copy_"))

    def _spread(self, value: Any, op: str) -> Tensor:
        """``value`` cast to this tensor's dtype and broadcast to its shape, as a value of its own
        (not a view of ``value``: a later write into this tensor leaves ``value`` alone)."""
        value = self.tracer.value(value, op)
        if value.type.dtype != self.type.dtype:
            value = {"f32": value.float, "i64": value.long, "i32": value.int}.get(self.type.dtype, lambda: value != 0)()
        if tuple(value.shape) != tuple(self.shape):
            value = value.expand(*self.shape)
        return value.clone()

    def clone(self, memory_format: Any = None) -> Tensor:
        """A copy: the same values, not a view (x * 1.0, exact for every float, -0.0 and NaN included)."""
        with self.tracer.at_user_line("clone"):
            if not self.type.is_float:
                return self.tracer.emit("int_mul", (self.id, self.tracer.int_const(1, self.type.dtype).id)) \
                    if self.type.is_index else self
            return self.tracer.emit("mul", (self.id, self.tracer.const(1.0).id))

    # ------------------------------------------------------------- autograd
    def backward(self, gradient=None) -> None:
        self.tracer.backward(self, gradient)

    @property
    def grad(self) -> Tensor | None:
        return self.tracer.grad_of(self)


# PyTorch's in-place forms of these methods (x.add_(y, alpha=2), x.clamp_(0, 1), x.masked_fill_(m, v)):
# the method's out-of-place value, then x names it (Tensor._in_place).
IN_PLACE_METHODS = ("add", "sub", "mul", "div", "pow", "neg", "abs", "clamp", "clamp_min", "clamp_max",
                    "masked_fill", "lerp", "relu", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "sin", "cos",
                    "floor", "ceil", "round", "trunc", "nan_to_num", "reciprocal", "square")


def _in_place_method(name: str):
    def method(self, *args: Any, **kwargs: Any) -> Tensor:
        return self._in_place(f"{name}_", lambda: getattr(self, name)(*args, **kwargs))

    method.__name__ = method.__qualname__ = f"{name}_"
    method.__doc__ = f"x.{name}_(...): x.{name}(...) in place (PyTorch's in-place rules; bendc/indexing.py in_place)."
    return method


for _name in IN_PLACE_METHODS:
    setattr(Tensor, f"{_name}_", _in_place_method(_name))


# ----------------------------------------------------------------- helpers
def _resolve_reshape(type: TensorType, shape: tuple, loc) -> tuple[int, ...]:
    if any(not isinstance(d, (int, np.integer)) for d in shape):
        raise ShapeError(f"reshape sizes must be ints, got {shape}", loc=loc, op="reshape")
    shape = tuple(int(d) for d in shape)
    if shape.count(-1) > 1 or any(d < -1 for d in shape):
        raise ShapeError(f"invalid shape {shape} for {type}", loc=loc, op="reshape")
    if -1 in shape:
        known = 1
        for d in shape:
            if d != -1:
                known *= d
        if known == 0 or type.numel % known:
            raise ShapeError(f"shape {shape} is invalid for {type} ({type.numel} elements)", loc=loc, op="reshape")
        shape = tuple(type.numel // known if d == -1 else d for d in shape)
    count = 1
    for d in shape:
        count *= d
    if count != type.numel:
        raise ShapeError(f"shape {shape} is invalid for {type} ({type.numel} elements)", loc=loc, op="reshape")
    return shape


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


_CONSTANT_DTYPES = {"float32": "f32", "float64": "f32", "float16": "f32", "bfloat16": "f32", "int64": "i64",
                    "int32": "i32", "bool": "bool"}


# torch functions whose results differ from call to call (random, or uninitialised): frozen as a constant,
# the trace would repeat one draw
_UNREPEATABLE = ("rand", "normal", "bernoulli", "multinomial", "poisson", "dropout", "uniform", "exponential",
                 "cauchy", "geometric", "empty", "random")


def unrepeatable(name: str) -> bool:
    """Whether the torch function of this qualified name gives new values on each call."""
    return any(word in name.rpartition(".")[2] for word in _UNREPEATABLE)


def torch_constant(tracer: "Tracer", operand: Any, op: str) -> "Tensor":
    """A torch tensor the traced function captured (a closure variable, a module attribute that is not a
    buffer: a causal mask made in __init__) as a constant of the graph, its values at trace time (float
    tensors as float32; one made during the trace from such tensors by a torch function,
    ``self.mask[:, :, :T, :T] == 0``, too): a ``literal`` of up to LITERAL_LIMIT values, else a lifted
    constant (Tracer.lifted_constant). Refused, naming the line: a tensor a random torch function made
    during the trace (torch.randn: one draw would be frozen; the line that made it is named), dtypes
    bendc lacks."""
    origin = TORCH_ORIGINS.get(id(operand))
    if origin is not None and not unrepeatable(origin[1]):
        origin = None  # made from captured tensors by a deterministic torch function (a slice of a mask)
    dtype = _CONSTANT_DTYPES.get(str(operand.dtype).removeprefix("torch."))
    if origin is not None or dtype is None:
        why = (f"; it was made by {origin[1]} at {origin[0]}, which bendc does not trace" if origin is not None
               else f": its dtype {str(operand.dtype).removeprefix('torch.')} is not one bendc has")
        raise UnsupportedError(
            f"a torch tensor of shape {list(operand.shape)} is not supported as an operand of {op}{why}. Make it "
            "inside the function with a function bendc traces (torch.arange, zeros, ones, full, eye, linspace, "
            "tensor, *_like), register it as a buffer and pass it in bendc.functional_call's dict, or pass it as "
            "an array parameter of the jitted function", loc=user_location(), op=op)
    values = operand.detach().cpu()
    if dtype == "f32":
        values = values.float()
    with tracer.at_user_line(op):
        return tracer.array_constant(values.numpy(), dtype)


def type_name(value: Any) -> str:
    return "Tensor" if isinstance(value, Tensor) else type(value).__name__


def matmul(a: Any, b: Any) -> Tensor:
    """torch.matmul: 1-D promotion, batched products, broadcast batch dims."""
    tracer = a.tracer if isinstance(a, Tensor) else active_tracer("matmul")
    with tracer.at_user_line("matmul") as builder:
        a = tracer.value(a, "matmul")
        b = tracer.value(b, "matmul")
        if a.ndim == 0 or b.ndim == 0:
            raise ShapeError(f"both arguments need at least 1 dimension, got {a.type} and {b.type}",
                             loc=builder.loc, op="matmul")
        left = a.reshape(1, a.shape[0]) if a.ndim == 1 else a
        right = b.reshape(b.shape[0], 1) if b.ndim == 1 else b
        result = tracer.emit("matmul", (left.id, right.id))
        shape = result.shape
        if b.ndim == 1:
            shape = shape[:-1]
        if a.ndim == 1:
            shape = shape[:-2] + shape[-1:] if b.ndim > 1 else shape[:-1]
        return result.reshape(*shape) if shape != result.shape else result
