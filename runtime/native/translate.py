"""Generated numba kernels as LLVM IR, without numba: the native translator.

bendc's CPU kernels are numba source (bendc/codegen/cpu.py and the ops' lowerings): ``@njit``
functions of loops over ``range``, scalar float32/float64/integer arithmetic, array elements,
``np.float32(...)`` casts, ``math.*`` calls and helpers of the same module. numba compiles such a
function in 0.1-0.5 s, ~85% of it in its own Python passes (typing, IR rewrites, lowering, the
CPython wrapper) and the rest in LLVM; this module types and lowers that subset of Python straight
to LLVM IR text (~1-5 ms), which llvmlite then optimizes and compiles (runtime/native/jit.py: ~10-20
ms a kernel). The semantics are numba's, operation by operation (runtime/native/types.py for the
typing rules; the lowering of each operation below mirrors numba/cpython/numbers.py, mathimpl.py and
builtins.py): the same casts, the same IEEE operations in the same order, Python's floor division
and modulo, numba's negative-index wraparound, the same libm functions and LLVM intrinsics. So a
translated kernel computes the bits numba's would (tests/native/ run both on every kernel they
translate and compare them bit for bit).

Anything outside the subset raises :class:`Unsupported`, and that function stays numba's: a
``prange`` loop, slices, exceptions, BLAS calls, object arithmetic. Nothing is guessed.

A translated entry function takes, for each array argument, the numpy array object itself
(``PyArrayObject*``, from ctypes' ``py_object``) and reads its data pointer, shape and strides from
numpy's struct (offsets measured at import: runtime/native/jit.py); it first checks that the object
is an ndarray of the dtype, rank and layout it was compiled for and returns 1 otherwise (the caller
then picks or compiles another specialization). Every function returns an i32 status: 0, or one of
the ``STATUS_*`` codes below.
"""
from __future__ import annotations

import ast
import hashlib
import math
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from runtime.native.types import (BOOL, FLOAT32, FLOAT64, INT8, INT16, INT32, INT64, INTP, MATH_UNARY, NONE, SCALARS,
                                  UINT8, UINT16, UINT32, UINT64, Array, DType, Function, Scalar, Tuple, Unsupported,
                                  arithmetic, bitwise, inversion, negation, power, promote, scalar_of, shift,
                                  true_division, unify)

# A generated module that binds INTERLEAVE_CONSTANT to a count (``NATIVE_INTERLEAVE = 4``) asks its
# innermost loops that call the kit's math (templates/cpu_math.py: exp, erf, gelu, ...) to run that
# many vectors an iteration: the translator marks each such loop with INTERLEAVE_METADATA, which
# runtime/native/jit.py turns into LLVM's interleave count for the host (``interleaved``). Such a body
# is one long chain of dependent operations (gelu's forward: a division, 10 FMAs of a polynomial, an
# exp); independent chains side by side keep the core's pipes busy where one leaves them waiting.
# Each element's operations and their order are unchanged, so are the bits. bendc/codegen/cpu.py
# writes it into the kernels it renders (4; 2 in the attention's templates, whose rows are 16-64
# lanes long: a wider iteration left them to scalar remainders).
INTERLEAVE_CONSTANT = "NATIVE_INTERLEAVE"
INTERLEAVE_METADATA = "bendc.interleave.count"

STATUS_OK = 0
STATUS_SIGNATURE = 1       # an argument is not what the entry was compiled for
STATUS_NOT_CONTIGUOUS = 2  # reshape of an array that is not C-contiguous at run time
STATUS_RESHAPE = 3         # reshape to another element count
STATUS_MEMORY = 4          # np.zeros / np.empty could not allocate
STATUS_ZERO_DIVISION = 5   # division by zero under the python error model (numba raises ZeroDivisionError)
STATUS_INDEX = 6           # a tuple index out of range (numba raises IndexError)
STATUS_BROADCAST = 7       # an array stored into a slice it does not broadcast onto (ValueError)
STATUS_DOT_SHAPES = 8      # np.dot of incompatible shapes (ValueError)
STATUS_BLAS = 9            # a BLAS size beyond a C int, or numba's BLAS wrapper failed

MODULE_CONSTANTS = {"inf": math.inf, "nan": math.nan, "pi": math.pi, "e": math.e}  # np.* and math.*
NUMPY_DTYPES = {"float32": FLOAT32, "float64": FLOAT64, "int8": INT8, "int16": INT16, "int32": INT32,
                "int64": INT64, "uint8": UINT8, "uint16": UINT16, "uint32": UINT32, "uint64": UINT64,
                "bool_": BOOL, "intp": INT64}


# ------------------------------------------------------------------ values
@dataclass
class Scal:
    """A scalar: its type and LLVM operand (a register or a constant); ``const``: its Python value
    where it is a literal (folded casts of literals keep their exact bits)."""

    type: Scalar
    ref: str
    const: Any = None


@dataclass
class Arr:
    """An array: data pointer, shape and strides (i64 operands), layout "C" (C-contiguous: the
    strides follow from the shape) or "A" (any strides)."""

    type: Array
    layout: str
    data: str
    shape: list
    strides: list


@dataclass
class Tup:
    items: list

    @property
    def type(self) -> Tuple:
        return Tuple(tuple(item.type for item in self.items))


@dataclass
class Obj:
    """A value that is not data: a module (``np``, ``math``), a dtype, a callable."""

    what: Any

    @property
    def type(self) -> Any:
        return self.what


class Unknown:
    """A value whose type the inference has not reached yet (typing passes only)."""

    type = None


UNKNOWN = Unknown()


def float_literal(value: float, scalar: Scalar) -> str:
    """An LLVM float constant with exact bits: hex of the double (float32 values are exact doubles)."""
    if scalar == FLOAT32:
        value = float(np.float32(value))
    return "0x" + struct.pack(">d", float(value)).hex().upper()


def literal(value: Any, scalar: Scalar) -> Scal:
    """A constant of ``scalar`` type holding ``value`` (cast as numpy casts it)."""
    if scalar.kind == "f":
        with np.errstate(all="ignore"):
            folded = scalar.dtype.type(value)
        return Scal(scalar, float_literal(float(folded), scalar), folded)
    if scalar == BOOL:
        truth = bool(value)
        return Scal(BOOL, "true" if truth else "false", truth)
    number = int(value)
    bits = scalar.bits
    number &= (1 << bits) - 1
    if scalar.signed and number >= 1 << (bits - 1):
        number -= 1 << bits
    return Scal(scalar, str(number), scalar.dtype.type(number))


# ------------------------------------------------------------------ text of one function
class Body:
    """The instructions of one LLVM function, in basic blocks."""

    def __init__(self, dry: bool) -> None:
        self.dry = dry
        self.lines: list[str] = []
        self.allocas: list[str] = []
        self.count = 0
        self.terminated = False

    def tmp(self, hint: str = "t") -> str:
        self.count += 1
        return f"%{hint}{self.count}"

    def label(self, hint: str) -> str:
        self.count += 1
        return f"{hint}{self.count}"

    def emit(self, line: str) -> None:
        if not self.dry and not self.terminated:
            self.lines.append("  " + line)

    def value(self, text: str, hint: str = "t") -> str:
        name = self.tmp(hint)
        self.emit(f"{name} = {text}")
        return name

    def start(self, label: str) -> None:
        if not self.dry:
            self.lines.append(f"{label}:")
        self.terminated = False

    def branch(self, label: str, loop: str = "") -> None:
        """An unconditional branch to ``label``; ``loop``: the ``!llvm.loop`` metadata of a latch."""
        self.emit(f"br label %{label}" + (f", !llvm.loop {loop}" if loop else ""))
        self.terminated = True

    def cbranch(self, condition: str, yes: str, no: str) -> None:
        self.emit(f"br i1 {condition}, label %{yes}, label %{no}")
        self.terminated = True

    def slot(self, llvm_type: str, hint: str = "v") -> str:
        name = self.tmp(hint)
        self.allocas.append(f"  {name} = alloca {llvm_type}")
        return name


# ------------------------------------------------------------------ the module
@dataclass
class Compiled:
    """A translated function: its LLVM name, argument and return types."""

    name: str
    args: tuple
    returns: Any
    statuses: bool = True


@dataclass
class Translation:
    """The LLVM module of one entry function and the helpers it calls."""

    ir: str
    entry: str
    args: tuple


class ModuleTranslator:
    """The njit functions of one generated module (its source), translated on demand."""

    def __init__(self, source: str, numba_functions: set[str], offsets: dict[str, int], symbol_prefix: str,
                 vector_width: int = 512) -> None:
        self.vector_width = vector_width  # the host's loops' vectors in bits (jit.py _Llvm): rows_fma_blocks
        self.tree = ast.parse(source)
        self.defs = {node.name: node for node in self.tree.body if isinstance(node, ast.FunctionDef)}
        self.intrinsics = _module_intrinsics(self.tree)
        self.numba_functions = numba_functions
        self.globals = _module_constants(self.tree)
        self.offsets = offsets
        self.prefix = symbol_prefix
        self.functions: dict[tuple, Compiled] = {}
        self.bodies: list[str] = []
        self.declarations: dict[str, str] = {}
        self.metadata: list[str] = []
        self.in_progress: set[tuple] = set()
        self.tasks: set[str] = set()
        self.nonneg_params: dict[str, frozenset[str]] = {}  # outlined prange bodies' (nonneg_names)

    def declare(self, name: str, text: str) -> None:
        self.declarations.setdefault(name, text)

    def loop_metadata(self, count: int) -> str:
        """A loop's ``!llvm.loop`` metadata asking ``count`` vectors an iteration (INTERLEAVE_CONSTANT):
        jit.py turns it into LLVM's interleave count for the host (``interleaved``)."""
        number = len(self.metadata)
        self.metadata.append(f"!{number} = distinct !{{!{number}, !{number + 1}}}")
        self.metadata.append(f"!{number + 1} = !{{!\"{INTERLEAVE_METADATA}\", i32 {count}}}")
        return f"!{number}"

    def function(self, name: str, args: tuple) -> Compiled:
        """The internal function ``name`` specialized for ``args`` (translated once)."""
        key = (name, args)
        if key in self.functions:
            return self.functions[key]
        if key in self.in_progress:
            raise Unsupported(f"recursion in {name}")
        if name not in self.defs or name not in self.numba_functions:
            raise Unsupported(f"{name} is not an njit function of the module")
        self.in_progress.add(key)
        try:
            translator = FunctionTranslator(self, self.defs[name], args, f"{self.prefix}.{name}.{len(self.functions)}")
            compiled = translator.translate()
        finally:
            self.in_progress.discard(key)
        self.functions[key] = compiled
        return compiled

    def task(self, compiled: Compiled, struct: str, fields: list[str]) -> str:
        """A gufunc-shaped task for bendc_parallel_for (runtime/native/pool.py) running ``compiled``
        (an outlined prange body) over its chunk: first = args[0] as an integer (the launch passes
        the chunk's start as a null-based pointer), count = dims[0]; the captured values are read
        from the context ``data``; a failed status is stored into its first word."""
        name = f"{compiled.name}.task"
        if name in self.tasks:
            return name
        self.tasks.add(name)
        lines = [f"define internal void @\"{name}\"(ptr %args, ptr %dims, ptr %steps, ptr %data) {{", "entry:",
                 "  %first.p = load ptr, ptr %args", "  %first = ptrtoint ptr %first.p to i64",
                 "  %count = load i64, ptr %dims", "  %last = add i64 %first, %count"]
        values = []
        for number, type_ in enumerate(fields[1:], start=1):
            lines.append(f"  %f{number}.p = getelementptr {struct}, ptr %data, i32 0, i32 {number}")
            lines.append(f"  %f{number} = load {type_}, ptr %f{number}.p")
            values.append(f"{type_} %f{number}")
        values += ["i64 %first", "i64 %last"]
        lines.append(f"  %status = call i32 @\"{compiled.name}\"({', '.join(values)})")
        lines += ["  %failed = icmp ne i32 %status, 0", "  br i1 %failed, label %bad, label %good", "bad:",
                  f"  %s.p = getelementptr {struct}, ptr %data, i32 0, i32 0", "  store i32 %status, ptr %s.p",
                  "  br label %good", "good:", "  ret void", "}"]
        self.bodies.append("\n".join(lines) + "\n")
        return name

    def _fastcall(self, symbol: str, count: int) -> str:
        """``<symbol>.fast``: the entry as a CPython METH_FASTCALL function, (self, args, nargs) ->
        None (a new reference) where the entry returns 0, else the status as a Python int; NULL with
        TypeError for another argument count. A builtin function object over it (runtime/native/jit.py)
        costs a launch list ~0.05 us a call, against ~0.8 us through ctypes."""
        for name, text in (("Py_IncRef", "declare void @Py_IncRef(ptr)"),
                           ("PyLong_FromLong", "declare ptr @PyLong_FromLong(i64)"),
                           ("PyErr_SetString", "declare void @PyErr_SetString(ptr, ptr)"),
                           ("bendc_type_error", "@bendc_type_error = external global ptr")):
            self.declare(name, text)
        message = f"{symbol}: takes {count} arrays"
        constant = f"@\"{symbol}.message\""
        data = message.encode() + b"\0"
        self.bodies.append(f"{constant} = private unnamed_addr constant [{len(data)} x i8] c\"" +
                           "".join(f"\\{b:02X}" for b in data) + "\"\n")
        lines = [f"define ptr @\"{symbol}.fast\"(ptr %self, ptr %args, i64 %nargs) {{", "entry:",
                 f"  %right = icmp eq i64 %nargs, {count}", "  br i1 %right, label %call, label %wrong", "call:"]
        arguments = []
        for number in range(count):
            lines.append(f"  %p{number} = getelementptr ptr, ptr %args, i64 {number}")
            lines.append(f"  %a{number} = load ptr, ptr %p{number}")
            arguments.append(f"ptr %a{number}")
        lines += [f"  %status = call i32 @\"{symbol}\"({', '.join(arguments)})",
                  "  %ok = icmp eq i32 %status, 0", "  br i1 %ok, label %none, label %failed", "none:",
                  "  %none.p = load ptr, ptr @bendc_none", "  call void @Py_IncRef(ptr %none.p)",
                  "  ret ptr %none.p", "failed:", "  %wide = sext i32 %status to i64",
                  "  %code = call ptr @PyLong_FromLong(i64 %wide)", "  ret ptr %code", "wrong:",
                  "  %type = load ptr, ptr @bendc_type_error",
                  f"  call void @PyErr_SetString(ptr %type, ptr {constant})", "  ret ptr null", "}"]
        return "\n".join(lines) + "\n"

    def entry(self, name: str, args: tuple) -> Translation:
        """An exported entry function for ``args`` (arrays read from numpy objects, see the module
        docstring) and the module text holding it."""
        inner = self.function(name, args)
        if inner.returns != NONE:
            raise Unsupported(f"{name} returns a value to Python (a native entry returns its status)")
        symbol = f"{self.prefix}.{name}.entry"
        offsets = self.offsets
        body = Body(dry=False)
        params, call_args = [], []
        for number, arg in enumerate(args):
            if isinstance(arg, ArrayArg) or arg == NONE_ARG:
                params.append(f"ptr %a{number}")
            elif isinstance(arg, Scalar):
                params.append(f"{arg.memory} %a{number}")
            else:
                raise Unsupported(f"an entry argument of type {arg}")
        fail = "fail"
        body.start("entry")
        # Each object's type is checked before any other field of it is read.
        for number, arg in enumerate(args):
            if arg == NONE_ARG:  # compiled for None: the object must be None
                none = body.value("load ptr, ptr @bendc_none")
                checked = body.label("none")
                body.cbranch(body.value(f"icmp eq ptr %a{number}, {none}"), checked, fail)
                body.start(checked)
                continue
            if not isinstance(arg, ArrayArg):
                continue
            obj = f"%a{number}"

            def field(name: str, type_: str, base: str = obj) -> str:
                where = body.value(f"getelementptr i8, ptr {base}, i64 {offsets[name]}")
                return body.value(f"load {type_}, ptr {where}")

            typed = body.label("typed")
            expected = body.value("load ptr, ptr @bendc_ndarray_type")
            body.cbranch(body.value(f"icmp eq ptr {field('ob_type', 'ptr')}, {expected}"), typed, fail)
            body.start(typed)
            good = [body.value(f"icmp eq i32 {field('nd', 'i32')}, {arg.ndim}")]
            descr = field("descr", "ptr")
            good.append(body.value(f"icmp eq i32 {field('type_num', 'i32', descr)}, {arg.type_num}"))
            flags = field("flags", "i32")
            contiguous = body.value(f"and i32 {flags}, 1")  # NPY_ARRAY_C_CONTIGUOUS
            # compiled for layout "A" (any strides): taken only where the array is not C-contiguous
            good.append(body.value(f"icmp {'ne' if arg.layout == 'C' else 'eq'} i32 {contiguous}, 0"))
            aligned = body.value(f"and i32 {flags}, 256")  # NPY_ARRAY_ALIGNED
            good.append(body.value(f"icmp ne i32 {aligned}, 0"))
            all_good = good[0]
            for condition in good[1:]:
                all_good = body.value(f"and i1 {all_good}, {condition}")
            checked = body.label("checked")
            body.cbranch(all_good, checked, fail)
            body.start(checked)
        for number, arg in enumerate(args):
            if arg == NONE_ARG:
                continue
            if isinstance(arg, Scalar):
                if arg == BOOL:
                    call_args.append(("i1", body.value(f"icmp ne i8 %a{number}, 0")))
                else:
                    call_args.append((arg.llvm, f"%a{number}"))
                continue
            obj = f"%a{number}"
            where = body.value(f"getelementptr i8, ptr {obj}, i64 {offsets['data']}")
            call_args.append(("ptr", body.value(f"load ptr, ptr {where}")))
            where = body.value(f"getelementptr i8, ptr {obj}, i64 {offsets['dimensions']}")
            dims = body.value(f"load ptr, ptr {where}")
            for axis in range(arg.ndim):
                element = body.value(f"getelementptr i64, ptr {dims}, i64 {axis}")
                call_args.append(("i64", body.value(f"load i64, ptr {element}")))
            if arg.layout != "C":
                where = body.value(f"getelementptr i8, ptr {obj}, i64 {offsets['strides']}")
                strides = body.value(f"load ptr, ptr {where}")
                for axis in range(arg.ndim):
                    element = body.value(f"getelementptr i64, ptr {strides}, i64 {axis}")
                    call_args.append(("i64", body.value(f"load i64, ptr {element}")))
        status = body.value(f"call i32 @\"{inner.name}\"({', '.join(f'{t} {v}' for t, v in call_args)})")
        body.emit(f"ret i32 {status}")
        body.terminated = True
        body.start(fail)
        body.emit(f"ret i32 {STATUS_SIGNATURE}")
        entry_text = f"define i32 @\"{symbol}\"({', '.join(params)}) {{\n" + "\n".join(body.lines) + "\n}\n"
        if all(isinstance(a, ArrayArg) or a == NONE_ARG for a in args):
            entry_text += self._fastcall(symbol, len(args))
        header = ["@bendc_ndarray_type = external global ptr", "@bendc_none = external global ptr"]
        header += sorted(self.declarations.values())
        text = "\n".join(header) + "\n\n" + "\n".join(self.bodies) + "\n" + entry_text
        text += "".join(line + "\n" for line in self.metadata)
        return Translation(text, symbol, args)


NONE_ARG = "None"  # an argument that is None (numba compiles it away: ``if x is None`` is decided)


@dataclass(frozen=True)
class ArrayArg(Array):
    """An array argument of an entry: the dtype, rank, layout and numpy type number it is compiled for."""

    layout: str = "C"
    type_num: int = 0


# The numba intrinsics a generated module may define (templates/cpu_math.py), by name: the LLVM
# intrinsic each call becomes. Only a def decorated with the template's own intrinsic decorator counts.
INTRINSICS = {"bendc_fma": "fma"}


def _module_intrinsics(tree: ast.Module) -> dict[str, str]:
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in INTRINSICS and any(
                isinstance(d, ast.Name) and d.id == "bendc_intrinsic" for d in node.decorator_list):
            found[node.name] = INTRINSICS[node.name]
    return found


def function_digest(node: ast.FunctionDef) -> str:
    """A function's statements, docstring and decorators aside, as a hash (what VECTOR_HELPERS checks)."""
    body = node.body[1:] if node.body and isinstance(node.body[0], ast.Expr) and \
        isinstance(node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str) else node.body
    text = ast.dump(ast.Module(body=list(body), type_ignores=[])) + ast.dump(node.args)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# bendc_lanes8's statements in bendc/kernels/templates/lanes.py (tests/native/test_translate.py
# checks that the template still hashes to this): a module function of that name with other
# statements is translated as written.
LANES8_DIGEST = "8a5ce3deb2b8fc4e"


def _lanes8_vector(module: "ModuleTranslator", generic: Compiled, args: list) -> Compiled | None:
    """bendc_lanes8 (bendc/kernels/templates/lanes.py) over a contiguous float32/float64 row as one
    ``<8 x double>`` add a block of 8 cells: vector lane l is the function's lane l, the same adds
    in the same order, then the rest into lane 0. Any other argument types (or a range outside the
    row, where numba's indexing would wrap), or a function of that name that is not the template's,
    take the translated body. None: not this form."""
    values, *numbers = args
    if function_digest(module.defs["bendc_lanes8"]) != LANES8_DIGEST:
        return None
    if not (isinstance(values, Arr) and values.type.ndim == 1 and values.layout == "C"
            and values.type.dtype in (FLOAT32, FLOAT64) and len(numbers) == 10
            and all(isinstance(n, Scal) and n.type == INT64 for n in numbers[:2])
            and all(isinstance(n, Scal) and n.type == FLOAT64 for n in numbers[2:])
            and generic.returns == Tuple((FLOAT64,) * 8)):
        return None
    name = f"{generic.name}.vector"
    returns = generic.returns.llvm
    if name not in module.declarations:
        element = values.type.dtype.llvm
        lanes = [f"%s{k}" for k in range(8)]
        params = ", ".join(["ptr %data", "i64 %len", "i64 %start", "i64 %stop"]
                           + [f"double {s}" for s in lanes] + ["ptr %status.out"])
        lines = [f"define internal {returns} @\"{name}\"({params}) alwaysinline {{", "entry:",
                 "  %ok.start = icmp sge i64 %start, 0", "  %ok.order = icmp sle i64 %start, %stop",
                 "  %ok.stop = icmp sle i64 %stop, %len", "  %ok.two = and i1 %ok.start, %ok.order",
                 "  %ok = and i1 %ok.two, %ok.stop", "  br i1 %ok, label %fast, label %slow", "slow:",
                 f"  %generic = call {returns} @\"{generic.name}\"({params})", f"  ret {returns} %generic",
                 "fast:", "  %n = sub i64 %stop, %start", "  %blocks = lshr i64 %n, 3"]
        previous = "undef"
        for k in range(8):
            lines.append(f"  %in{k} = insertelement <8 x double> {previous}, double %s{k}, i32 {k}")
            previous = f"%in{k}"
        vector_load = ["  %x = load <8 x float>, ptr %p, align 4", "  %w = fpext <8 x float> %x to <8 x double>"] \
            if element == "float" else ["  %w = load <8 x double>, ptr %p, align 8"]
        scalar_load = ["  %y = load float, ptr %q, align 4", "  %yw = fpext float %y to double"] \
            if element == "float" else ["  %yw = load double, ptr %q, align 8"]
        lines += ["  %any = icmp ugt i64 %blocks, 0", "  br i1 %any, label %loop, label %after", "loop:",
                  "  %b = phi i64 [0, %fast], [%b.next, %loop]",
                  "  %acc = phi <8 x double> [%in7, %fast], [%acc.next, %loop]",
                  "  %b8 = shl i64 %b, 3", "  %c = add i64 %start, %b8",
                  f"  %p = getelementptr {element}, ptr %data, i64 %c"] + vector_load + [
                  "  %acc.next = fadd <8 x double> %acc, %w", "  %b.next = add i64 %b, 1",
                  "  %more = icmp ult i64 %b.next, %blocks", "  br i1 %more, label %loop, label %after", "after:",
                  "  %lanes = phi <8 x double> [%in7, %fast], [%acc.next, %loop]"]
        lines += [f"  %e{k} = extractelement <8 x double> %lanes, i32 {k}" for k in range(8)]
        lines += ["  %whole = shl i64 %blocks, 3", "  %rest = add i64 %start, %whole",
                  "  %has = icmp slt i64 %rest, %stop", "  br i1 %has, label %tail, label %done", "tail:",
                  "  %t = phi i64 [%rest, %after], [%t.next, %tail]",
                  "  %l0 = phi double [%e0, %after], [%l0.next, %tail]",
                  f"  %q = getelementptr {element}, ptr %data, i64 %t"] + scalar_load + [
                  "  %l0.next = fadd double %l0, %yw", "  %t.next = add i64 %t, 1",
                  "  %more.t = icmp slt i64 %t.next, %stop", "  br i1 %more.t, label %tail, label %done", "done:",
                  "  %lane0 = phi double [%e0, %after], [%l0.next, %tail]"]
        packed = "undef"
        for k in range(8):
            lines.append(f"  %out{k} = insertvalue {returns} {packed}, double {'%lane0' if k == 0 else f'%e{k}'}, {k}")
            packed = f"%out{k}"
        lines += ["  store i32 0, ptr %status.out", f"  ret {returns} %out7", "}"]
        module.declare(name, "\n".join(lines) + "\n")
    return Compiled(name, generic.args, generic.returns, generic.statuses)


# bendc_rows_fma's statements in bendc/kernels/templates/products.py (tests/native/test_translate.py
# checks the digest, as for bendc_lanes8).
ROWS_FMA_DIGEST = "f0fa6988978f46ed"
# _rows_fma_vector's register blocks: (dest rows, the widest rows they take, their lane steps). A
# block holds rows x vectors accumulators of 16 lanes. With AVX-512's 32 registers of 16 lanes, 16
# of them keep both FMA ports busy through an FMA's latency (4 cycles): 16 x 1 for rows of 16 lanes
# or fewer, 8 x 2 below 64, 4 x 4 from 64; narrower steps finish a row, the last one masked; rows
# left over go one at a time. Elsewhere (AVX2: 16 registers of 8 lanes, a 16-lane vector is two)
# 16 accumulators would need 32 registers: 4 x 1 (8 registers of accumulators beside the 2 of a
# source's lanes and a weight's broadcast). Measured on a 2-vCPU AMD EPYC (Zen 3), 1 thread, causal
# attention fwd+bwd at T=64 (the fused heads): B=8 H=4 D=16 1.21 -> 0.62-0.65 ms, B=16 H=4 D=32
# 3.57 -> 1.83; of 4 x 1, 4 x 1 to 16 lanes then 2 x 2, 8 x 1 to 16 lanes then 4 x 1, and 2 x 2,
# the first two were fastest, within noise of each other (a block's rows share a 16-row chunk).
ROWS_FMA_BLOCKS = ((16, 16, ("one", "tail")), (8, 63, ("pair", "one", "tail")),
                   (4, None, ("quad", "pair", "one", "tail")), (1, None, ("quad", "pair", "one", "tail")))
ROWS_FMA_BLOCKS_NARROW = ((4, None, ("one", "tail")), (1, None, ("one", "tail")))


def rows_fma_blocks(vector_width: int) -> tuple:
    """_rows_fma_vector's blocks for a host whose loops run ``vector_width``-bit vectors."""
    return ROWS_FMA_BLOCKS if vector_width >= 512 else ROWS_FMA_BLOCKS_NARROW


_STEP_VECTORS = {"quad": 4, "pair": 2, "one": 1, "tail": 1}
_VEC = "<16 x float>"


def _rows_fma_vector(module: "ModuleTranslator", generic: Compiled, args: list) -> Compiled | None:
    """bendc_rows_fma (bendc/kernels/templates/products.py) as a register-blocked product for float32
    dest, weights and sources (any strides: dest's and the sources' rows must have contiguous lanes
    at run time): a block of dest rows by 16-lane vectors (ROWS_FMA_BLOCKS) stays in registers while
    its sources go by, each cell's FMAs in the template's order. The causal modes move a row block's
    first lane (1) or bound its sources (2: [0, min(count, chunk + 16)); 3: [chunk, count)); a block's
    rows share their chunk. ``lo`` off a chunk, lanes or sources out of bounds, or other types take
    the translated body."""
    if function_digest(module.defs["bendc_rows_fma"]) != ROWS_FMA_DIGEST:
        return None
    if len(args) != 9 or generic.returns != NONE:
        return None
    dest, weights, down, sources, *numbers, fresh = args
    if not (all(isinstance(a, Arr) and a.type.ndim == 2 and a.type.dtype == FLOAT32 for a in (dest, weights, sources))
            and all(isinstance(flag, Scal) and flag.type in (INT64, BOOL) for flag in (down, fresh))
            and all(isinstance(n, Scal) and n.type == INT64 for n in numbers)):
        return None
    name = f"{generic.name}.vector"
    if name not in module.declarations:
        module.declare("llvm.fma.v16f32", f"declare {_VEC} @llvm.fma.v16f32({_VEC}, {_VEC}, {_VEC})")
        module.declare("llvm.masked.load.v16f32.p0",
                       f"declare {_VEC} @llvm.masked.load.v16f32.p0(ptr, i32, <16 x i1>, {_VEC})")
        module.declare("llvm.masked.store.v16f32.p0",
                       f"declare void @llvm.masked.store.v16f32.p0({_VEC}, ptr, i32, <16 x i1>)")
        table = rows_fma_blocks(module.vector_width)
        blocks = {(rows, _STEP_VECTORS[step], step == "tail") for rows, _, steps in table for step in steps}
        for rows, vectors, masked in sorted(blocks):
            block = f"{name}.b{rows}x{vectors}{'m' if masked else ''}"
            module.declare(block, _rows_fma_block(block, rows, vectors, masked))
        module.declare(name, _rows_fma_function(name, generic.name, [a.layout for a in (dest, weights, sources)],
                                                down.type, fresh.type, table))
    return Compiled(name, generic.args, generic.returns, generic.statuses)


def _rows_fma_function(name: str, generic: str, layouts: list[str], down_type: Scalar, fresh_type: Scalar,
                       table: tuple) -> str:
    """The row and lane loops of _rows_fma_vector, calling its blocks (``table``: rows_fma_blocks)."""
    params, lines = [], [f"define internal i32 @\"{name}\"(PARAMS) alwaysinline {{", "entry:"]
    inner = []  # the run-time checks that a row's lanes are contiguous
    for array, layout in zip("dws", layouts):
        params += [f"ptr %{array}", f"i64 %{array}0", f"i64 %{array}1"]
        if layout == "C":
            lines += [f"  %{array}t0 = shl i64 %{array}1, 2", f"  %{array}t1 = add i64 0, 4"]
        else:
            params += [f"i64 %{array}t0", f"i64 %{array}t1"]
            if array != "w":
                inner.append(f"icmp eq i64 %{array}t1, 4")
        if array == "w":
            params.append(f"{down_type.llvm} %down.in")
    params += ["i64 %count", "i64 %lo", "i64 %hi", "i64 %causal", f"{fresh_type.llvm} %fresh.in"]
    lines[0] = lines[0].replace("PARAMS", ", ".join(params))
    lines += [f"  %down = icmp ne {down_type.llvm} %down.in, 0", f"  %fresh = icmp ne {fresh_type.llvm} %fresh.in, 0",
              "  %wj = select i1 %down, i64 %wt1, i64 %wt0", "  %ws = select i1 %down, i64 %wt0, i64 %wt1",
              "  %wrows = select i1 %down, i64 %w1, i64 %w0", "  %wsources = select i1 %down, i64 %w0, i64 %w1",
              "  %lo.rest = and i64 %lo, 15", "  %lanes = sub i64 %hi, %lo"]
    checks = inner + ["icmp sge i64 %lo, 0", "icmp eq i64 %lo.rest, 0", "icmp sle i64 %hi, %d1",
                      "icmp sle i64 %hi, %s1", "icmp sge i64 %count, 0", "icmp sle i64 %count, %s0",
                      "icmp sle i64 %count, %wsources", "icmp sle i64 %d0, %wrows"]
    previous = "true"
    for number, check in enumerate(checks):
        lines += [f"  %ok{number} = {check}", f"  %all{number} = and i1 {previous}, %ok{number}"]
        previous = f"%all{number}"
    sizes = [rows for rows, _, _ in table]
    lines += [f"  br i1 {previous}, label %fast, label %slow", "slow:",
              f"  %generic = call i32 @\"{generic}\"({', '.join(params)})", "  ret i32 %generic", "fast:",
              "  %m1 = icmp eq i64 %causal, 1", "  %m2 = icmp eq i64 %causal, 2", "  %m3 = icmp eq i64 %causal, 3",
              "  br label %rows", "rows:",
              "  %j = phi i64 [0, %fast], " + ", ".join(f"[%j.next.r{rows}, %r{rows}.done]" for rows in sizes),
              "  %j.more = icmp slt i64 %j, %d0", f"  br i1 %j.more, label %pick{sizes[0]}, label %exit"]
    for (rows, widest, _), smaller in zip(table, sizes[1:]):
        lines += [f"pick{rows}:", f"  %j.end{rows} = add i64 %j, {rows}", f"  %j.fits{rows} = icmp sle i64 %j.end{rows}, %d0"]
        wanted = f"%j.fits{rows}"
        if widest is not None:
            lines += [f"  %j.narrow{rows} = icmp sle i64 %lanes, {widest}",
                      f"  %j.takes{rows} = and i1 %j.fits{rows}, %j.narrow{rows}"]
            wanted = f"%j.takes{rows}"
        lines.append(f"  br i1 {wanted}, label %r{rows}.entry, label %pick{smaller}")
    lines += [f"pick1:", "  br label %r1.entry"]
    for rows, _, steps in table:
        p = f"r{rows}"
        lines += [f"{p}.entry:", f"  %{p}.chunk = and i64 %j, -16", f"  %{p}.later = icmp sgt i64 %{p}.chunk, %lo",
                  f"  %{p}.later1 = and i1 %m1, %{p}.later", f"  %{p}.start = select i1 %{p}.later1, i64 %{p}.chunk, i64 %lo",
                  f"  %{p}.end = add i64 %{p}.chunk, 16", f"  %{p}.short = icmp slt i64 %{p}.end, %count",
                  f"  %{p}.upto = select i1 %{p}.short, i64 %{p}.end, i64 %count",
                  f"  %{p}.a = select i1 %m3, i64 %{p}.chunk, i64 0", f"  %{p}.b = select i1 %m2, i64 %{p}.upto, i64 %count",
                  f"  %{p}.doff = mul i64 %j, %dt0", f"  %{p}.drow = getelementptr i8, ptr %d, i64 %{p}.doff",
                  f"  %{p}.woff = mul i64 %j, %wj", f"  %{p}.wrow = getelementptr i8, ptr %w, i64 %{p}.woff",
                  f"  br label %{p}.lanes", f"{p}.lanes:",
                  f"  %{p}.v = phi i64 [%{p}.start, %{p}.entry], "
                  + ", ".join(f"[%{p}.v.{step}, %{p}.{step}]" for step in steps if step != "tail")]
        checks = [step for step in steps if step != "tail"]
        for number, step in enumerate(checks):
            following = f"%{p}.check.{checks[number + 1]}" if number + 1 < len(checks) else f"%{p}.partial"
            lines += [f"  %{p}.v.{step}.end = add i64 %{p}.v, {16 * _STEP_VECTORS[step]}",
                      f"  %{p}.{step}.fits = icmp sle i64 %{p}.v.{step}.end, %hi",
                      f"  br i1 %{p}.{step}.fits, label %{p}.{step}, label {following}"]
            if number + 1 < len(checks):
                lines.append(f"{p}.check.{checks[number + 1]}:")
        lines += [f"{p}.partial:", f"  %{p}.rest = icmp slt i64 %{p}.v, %hi",
                  f"  br i1 %{p}.rest, label %{p}.tail, label %{p}.done"]
        for step in steps:
            q = f"{p}.{step}"
            vectors = _STEP_VECTORS[step]
            lines += [f"{q}:"]
            extra = ""
            if step == "tail":  # lanes [v, hi) of 16
                lines += [f"  %{q}.n = sub i64 %hi, %{p}.v", f"  %{q}.n1 = insertelement <16 x i64> undef, i64 %{q}.n, i32 0",
                          f"  %{q}.ns = shufflevector <16 x i64> %{q}.n1, <16 x i64> undef, <16 x i32> zeroinitializer",
                          f"  %{q}.mask = icmp ult <16 x i64> <{', '.join(f'i64 {i}' for i in range(16))}>, %{q}.ns"]
                extra = f", <16 x i1> %{q}.mask"
            lines += [f"  %{q}.bytes = shl i64 %{p}.v, 2", f"  %{q}.dp = getelementptr i8, ptr %{p}.drow, i64 %{q}.bytes",
                      f"  %{q}.sp = getelementptr i8, ptr %s, i64 %{q}.bytes",
                      f"  call void @\"{name}.b{rows}x{vectors}{'m' if step == 'tail' else ''}\"(ptr %{q}.dp, i64 %dt0, "
                      f"ptr %{p}.wrow, i64 %wj, i64 %ws, ptr %{q}.sp, i64 %st0, i1 %fresh, i64 %{p}.a, i64 %{p}.b{extra})"]
            if step == "tail":
                lines.append(f"  br label %{p}.done")
            else:
                lines += [f"  %{p}.v.{step} = add i64 %{p}.v, {16 * vectors}", f"  br label %{p}.lanes"]
        lines += [f"{p}.done:", f"  %j.next.{p} = add i64 %j, {rows}", "  br label %rows"]
    lines += ["exit:", "  ret i32 0", "}"]
    return "\n".join(lines) + "\n"


def _rows_fma_block(name: str, rows: int, vectors: int, masked: bool) -> str:
    """``rows`` dest rows by ``vectors`` 16-lane vectors from %d (rows %ds bytes apart; ``masked``:
    one vector, the lanes of %mask only): the accumulators loaded (zeros where %fresh), then for
    each source s in [a, b) in order acc[i][k] = fma(w(i, s), sources[s, lanes k], acc[i][k])
    (w(i, s) at %w + i %wj + s %ws bytes, sources[s] at %s + s %ss), stored back."""
    params = ["ptr %d", "i64 %ds", "ptr %w", "i64 %wj", "i64 %ws", "ptr %s", "i64 %ss", "i1 %fresh", "i64 %a", "i64 %b"]
    params += ["<16 x i1> %mask"] if masked else []
    lines = [f"define internal void @\"{name}\"({', '.join(params)}) alwaysinline {{", "entry:"]

    def load(out, pointer):
        if masked:
            return [f"  {out} = call {_VEC} @llvm.masked.load.v16f32.p0(ptr {pointer}, i32 4, <16 x i1> %mask, "
                    f"{_VEC} zeroinitializer)"]
        return [f"  {out} = load {_VEC}, ptr {pointer}, align 4"]

    cells = [(i, k) for i in range(rows) for k in range(vectors)]
    for i in range(rows):
        lines += [f"  %drow{i}.off = mul i64 %ds, {i}", f"  %drow{i} = getelementptr i8, ptr %d, i64 %drow{i}.off",
                  f"  %wrow{i}.off = mul i64 %wj, {i}", f"  %wrow{i} = getelementptr i8, ptr %w, i64 %wrow{i}.off"]
        for k in range(vectors):
            lines += [f"  %dp{i}.{k} = getelementptr i8, ptr %drow{i}, i64 {64 * k}"] + load(f"%held{i}.{k}", f"%dp{i}.{k}")
            lines.append(f"  %acc{i}.{k} = select i1 %fresh, {_VEC} zeroinitializer, {_VEC} %held{i}.{k}")
    lines += ["  %go = icmp slt i64 %a, %b", "  br i1 %go, label %loop, label %exit", "loop:",
              "  %s.i = phi i64 [%a, %entry], [%s.next, %loop]"]
    lines += [f"  %in{i}.{k} = phi {_VEC} [%acc{i}.{k}, %entry], [%new{i}.{k}, %loop]" for i, k in cells]
    lines += ["  %soff = mul i64 %s.i, %ss", "  %woff = mul i64 %s.i, %ws"]
    for k in range(vectors):
        lines += [f"  %xo{k} = add i64 %soff, {64 * k}", f"  %xp{k} = getelementptr i8, ptr %s, i64 %xo{k}"]
        lines += load(f"%x{k}", f"%xp{k}")
    for i in range(rows):
        lines += [f"  %wp{i} = getelementptr i8, ptr %wrow{i}, i64 %woff", f"  %w{i} = load float, ptr %wp{i}, align 4",
                  f"  %wi{i} = insertelement {_VEC} undef, float %w{i}, i32 0",
                  f"  %wb{i} = shufflevector {_VEC} %wi{i}, {_VEC} undef, <16 x i32> zeroinitializer"]
    lines += [f"  %new{i}.{k} = call {_VEC} @llvm.fma.v16f32({_VEC} %wb{i}, {_VEC} %x{k}, {_VEC} %in{i}.{k})"
              for i, k in cells]
    lines += ["  %s.next = add i64 %s.i, 1", "  %more = icmp slt i64 %s.next, %b",
              "  br i1 %more, label %loop, label %exit", "exit:"]
    lines += [f"  %out{i}.{k} = phi {_VEC} [%acc{i}.{k}, %entry], [%new{i}.{k}, %loop]" for i, k in cells]
    for i, k in cells:
        if masked:
            lines.append(f"  call void @llvm.masked.store.v16f32.p0({_VEC} %out{i}.{k}, ptr %dp{i}.{k}, i32 4, <16 x i1> %mask)")
        else:
            lines.append(f"  store {_VEC} %out{i}.{k}, ptr %dp{i}.{k}, align 4")
    lines += ["  ret void", "}"]
    return "\n".join(lines) + "\n"


# Module helpers the translator emits as vector code for the argument types it covers (the body
# otherwise), by name: generated modules copy them from bendc/kernels/templates.
VECTOR_HELPERS = {"bendc_lanes8": _lanes8_vector, "bendc_rows_fma": _rows_fma_vector}


def _module_constants(tree: ast.Module) -> dict[str, Any]:
    """Module-level names bound to literal numbers (``X = 3``): numba freezes globals as constants."""
    constants = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, (int, float, bool)):
                constants[node.targets[0].id] = node.value.value
    return constants


_RANGE = object()   # an assignment by a range()/prange() loop: see _nonneg
_SHAPE = object()   # an item of an array's shape


def _operand_only(node: ast.expr) -> bool:
    """A name, a number, or a number cast (``np.float32(0.0)``, ``-1.0``): an expression whose reading
    has no effect and cannot raise (the sides a conditional expression may read both of)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _operand_only(node.operand)
    if isinstance(node, ast.Call):
        func = node.func
        return (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "np"
                and func.attr in _NUMBER_CASTS and len(node.args) == 1 and not node.keywords
                and isinstance(node.args[0], (ast.Constant, ast.UnaryOp)) and _operand_only(node.args[0]))
    return isinstance(node, ast.Name) or (isinstance(node, ast.Constant) and
                                          isinstance(node.value, (bool, int, float)))


_NUMBER_CASTS = frozenset({"float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool_"})


def nonneg_names(function: ast.FunctionDef, constants: dict[str, Any],
                 known: frozenset[str] = frozenset()) -> tuple[set[str], set[str]]:
    """(names, bound): ``bound`` the names ``function`` binds (its parameters included), ``names``
    those of them whose every binding is a non-negative integer expression (the
    greatest such set: a counter that only grows stays in it). ``known``: parameters known to be
    non-negative (an outlined prange body's bounds); other parameters may be anything. Indexing
    with such a name needs no negative-index wraparound (numba's select on every index, which
    keeps LLVM from vectorizing loops over ``a[i + j]``): an index that cannot be negative reads the
    same element either way, so the bits are numba's."""
    bindings: dict[str, list] = {}

    def bind(target: ast.expr, value: Any) -> None:
        if isinstance(target, ast.Name):
            bindings.setdefault(target.id, []).append(value)
        elif isinstance(target, (ast.Tuple, ast.List)):
            if isinstance(value, ast.Tuple) and len(value.elts) == len(target.elts):
                for element, item in zip(target.elts, value.elts):
                    bind(element, item)
            else:
                shape = isinstance(value, ast.Attribute) and value.attr == "shape"
                for element in target.elts:
                    bind(element, _SHAPE if shape else None)

    for arg in function.args.args:
        bindings.setdefault(arg.arg, []).append(_SHAPE if arg.arg in known else None)
    for node in ast.walk(function):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                bind(target, node.value)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and isinstance(node.target, ast.Name):
            value = ast.BinOp(ast.Name(node.target.id, ast.Load()), node.op, node.value) \
                if isinstance(node, ast.AugAssign) else node.value
            bind(node.target, value)
        elif isinstance(node, ast.NamedExpr):
            bind(node.target, node.value)
        elif isinstance(node, ast.For):
            iterated = node.iter
            ranged = isinstance(iterated, ast.Call) and isinstance(iterated.func, ast.Name) and \
                iterated.func.id in ("range", "prange") and not iterated.keywords
            bind(node.target, (_RANGE, iterated.args) if ranged and isinstance(node.target, ast.Name) else None)
    names = set(bindings)
    changed = True
    while changed:
        changed = False
        for name in sorted(names):
            if not all(_nonneg(value, names, bindings, constants) for value in bindings[name]):
                names.discard(name)
                changed = True
    return names, set(bindings)


def _nonneg(value: Any, names: set[str], bindings: dict, constants: dict[str, Any]) -> bool:
    """Whether an expression is a non-negative integer when ``names`` hold non-negative integers."""
    def positive_step(step: ast.expr) -> bool:
        number = step.value if isinstance(step, ast.Constant) else \
            constants.get(step.id) if isinstance(step, ast.Name) and step.id not in bindings else None
        return isinstance(number, int) and not isinstance(number, bool) and number > 0

    def check(node: Any) -> bool:
        if node is _SHAPE:
            return True
        if node is None:
            return False
        if isinstance(node, tuple) and node and node[0] is _RANGE:
            args = node[1]
            if len(args) == 1:
                return True
            return len(args) in (2, 3) and check(args[0]) and (len(args) == 2 or positive_step(args[2]))
        if isinstance(node, ast.Constant):
            return isinstance(node.value, int) and node.value >= 0
        if isinstance(node, ast.Name):
            if node.id in bindings:
                return node.id in names
            number = constants.get(node.id)
            return isinstance(number, int) and number >= 0
        if isinstance(node, ast.BinOp):
            return isinstance(node.op, (ast.Add, ast.Mult, ast.FloorDiv, ast.Mod)) and \
                check(node.left) and check(node.right)
        if isinstance(node, ast.IfExp):
            return check(node.body) and check(node.orelse)
        if isinstance(node, ast.Subscript):
            return isinstance(node.value, ast.Attribute) and node.value.attr == "shape"
        if isinstance(node, ast.Attribute):
            return node.attr in ("size", "ndim")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
            if node.func.id == "len":
                return True
            if node.func.id == "min":
                return bool(node.args) and all(check(a) for a in node.args)
            if node.func.id == "max":
                return any(check(a) for a in node.args)
        return False

    return check(value)


# ------------------------------------------------------------------ one function
def _calls_math(node: ast.For, defs: dict) -> bool:
    """Whether ``node`` is an innermost loop whose body calls math.* or one of the module's own
    functions that run no loop (the kit's float32 math, templates/cpu_math.py), and no function
    that runs one (a loop over a call of the attention's per-head kernel is not innermost)."""
    inner = [n for stmt in node.body for n in ast.walk(stmt)]
    if any(isinstance(n, (ast.For, ast.While)) for n in inner):
        return False
    calls = [n.func for n in inner if isinstance(n, ast.Call)]
    called = [f.id for f in calls if isinstance(f, ast.Name) and f.id in defs]
    if not all(_loop_free(name, defs, set()) for name in called):
        return False
    return bool(called) or any(isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "math"
                               for f in calls)


def _loop_free(name: str, defs: dict, seen: set[str]) -> bool:
    """Whether the module function ``name`` and the module functions it calls run no loop."""
    if name in seen:
        return True
    seen.add(name)
    nodes = list(ast.walk(defs[name]))
    if any(isinstance(n, (ast.For, ast.While)) for n in nodes):
        return False
    return all(_loop_free(n.func.id, defs, seen) for n in nodes
               if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in defs)


class _Loop:
    def __init__(self, cont: str, done: str) -> None:
        self.cont, self.done = cont, done


class FunctionTranslator:
    """One njit function for one signature: types inferred to a fixed point (dry passes), then emitted."""

    MAX_PASSES = 8

    def __init__(self, module: ModuleTranslator, node: ast.FunctionDef, args: tuple, name: str) -> None:
        self.module = module
        self.node = node
        self.args = args
        self.name = name
        self.decorator = _decorator_options(node)
        if self.decorator.get("fastmath"):
            raise Unsupported(f"{node.name} asks for fastmath")
        self.python_errors = self.decorator.get("error_model", "python") != "numpy"
        if len(node.args.args) != len(args) or node.args.vararg or node.args.kwarg or node.args.kwonlyargs:
            raise Unsupported(f"{node.name} takes {len(node.args.args)} arguments, called with {len(args)}")
        self.types: dict[str, Any] = {}
        self.returns: Any = None
        self.nonneg, bound = nonneg_names(node, module.globals, module.nonneg_params.get(node.name, frozenset()))
        self.bound = dict.fromkeys(bound)  # the function's own names, for _nonneg
        self.running: list[str] = []  # the stop names of the range() loops whose body is being lowered: _for

    # ---------------------------------------------------------------- driver
    def translate(self) -> Compiled:
        for _ in range(self.MAX_PASSES):
            before = (dict(self.types), self.returns)
            self._run(dry=True)
            if (self.types, self.returns) == before:
                break
        else:
            raise Unsupported(f"the types of {self.node.name} do not settle")
        returns = self.returns if self.returns is not None else NONE
        compiled = Compiled(self.name, self.args, returns)
        self.module.functions[(self.node.name, self.args)] = compiled  # a recursive call finds it
        self._run(dry=False)
        return compiled

    def _run(self, dry: bool) -> None:
        self.body = Body(dry)
        self.dry = dry
        self.scope: dict[str, Any] = {}   # name -> Scal slot (str pointer) or bound Arr/Tup/Obj
        self.slots: dict[str, str] = {}
        self.loops: list[_Loop] = []
        self.nesting = 0
        self.nested_names: list[list[str]] = []
        self._owned_holders: list[str] = []
        self.private: set[str] = set()    # names a prange body assigned: not readable after it
        self.exit = "exit"
        body = self.body
        params = []
        for number, (arg, type_) in enumerate(zip(self.node.args.args, self.args)):
            name = arg.arg
            if isinstance(type_, Array):
                data = f"%p{number}"
                shape = [Scal(INTP, f"%p{number}.s{k}") for k in range(type_.ndim)]
                layout = getattr(type_, "layout", "C")
                params.append(f"ptr noalias {data}" if False else f"ptr {data}")
                params += [f"i64 {s.ref}" for s in shape]
                if layout == "C":
                    strides = None
                else:
                    strides = [Scal(INTP, f"%p{number}.t{k}") for k in range(type_.ndim)]
                    params += [f"i64 {s.ref}" for s in strides]
                self.scope[name] = ("array", Array(type_.dtype, type_.ndim), layout, data, shape, strides)
            elif type_ == NONE_ARG:
                self.scope[name] = ("none", Obj(None))  # a compile-time None: no parameter
            elif isinstance(type_, Scalar):
                params.append(f"{type_.llvm} %p{number}")
                self.types[name] = unify(self.types.get(name), type_)
                self.scope[name] = ("param", Scal(type_, f"%p{number}"))
            else:
                raise Unsupported(f"argument {name} of type {type_}")
        body.start("entry")
        self.return_slot = None
        if not dry and self.returns not in (None, NONE):
            self.return_slot = body.slot(self.returns.llvm, "ret")
        self.status_slot = body.slot("i32", "status")
        body.emit(f"store i32 0, ptr {self.status_slot}")
        # scalar parameters live in slots like every other variable (they may be reassigned)
        for name, bound in list(self.scope.items()):
            if bound[0] == "param":
                value = bound[1]
                slot = self._slot_for(name)
                body.emit(f"store {self._llvm(self.types[name])} {self._cast(value, self.types[name]).ref}, ptr {slot}")
                self.scope[name] = ("slot",)
            elif bound[0] == "none":
                self.scope[name] = ("value", bound[1])
            else:
                self.scope[name] = ("value", self._array_from_params(bound))
        self._block(self.node.body)
        if not body.terminated:
            if self.returns not in (None, NONE) and not dry:
                raise Unsupported(f"{self.node.name} can end without returning a value")
            body.branch(self.exit)
        body.start(self.exit)
        for holder in self._owned_holders:
            pointer = body.value(f"load ptr, ptr {holder}")
            body.emit(f"call void @free(ptr {pointer})")
        status = body.value(f"load i32, ptr {self.status_slot}")
        if self.returns in (None, NONE):
            body.emit(f"ret i32 {status}")
            signature = "i32"
        else:
            # a helper returning a value reports its status through its last argument
            result = body.value(f"load {self.returns.llvm}, ptr {self.return_slot}") if not dry else "0"
            body.emit(f"store i32 {status}, ptr %status.out")
            body.emit(f"ret {self.returns.llvm} {result}")
            params.append("ptr %status.out")
            signature = self.returns.llvm
        body.terminated = True
        if not dry:
            lines = body.lines[:1] + body.allocas + body.lines[1:]
            self.module.bodies.append(
                f"define internal {signature} @\"{self.name}\"({', '.join(params)}) {{\n" + "\n".join(lines) + "\n}\n")

    def _array_from_params(self, bound) -> Arr:
        _, type_, layout, data, shape, strides = bound
        if strides is None:
            strides = self._c_strides(shape, type_.dtype.size)
        return Arr(type_, layout, data, shape, strides)

    def _c_strides(self, shape: list, itemsize: int) -> list:
        """C-contiguous strides of ``shape`` (in bytes)."""
        strides = []
        running = literal(itemsize, INTP)
        for size in reversed(shape):
            strides.append(running)
            running = self._int_op("mul", running, size)
        return list(reversed(strides))

    # ---------------------------------------------------------------- helpers
    def _llvm(self, type_) -> str:
        return type_.llvm

    def _slot_for(self, name: str) -> str:
        if name not in self.slots:
            type_ = self.types.get(name)
            if type_ is None:
                raise Unsupported(f"the type of {name} is unknown")
            self.slots[name] = self.body.slot(type_.llvm, "v")
        return self.slots[name]

    def fail(self, message: str) -> Unsupported:
        return Unsupported(f"{self.node.name}, line {getattr(self, 'line', '?')}: {message}")

    # ---------------------------------------------------------------- statements
    def _nested(self, statements: Sequence[ast.stmt]) -> None:
        """The body of a loop or branch: arrays and tuples bound in it are not seen after it (their
        registers would not dominate the code that follows)."""
        self.nesting += 1
        self.nested_names.append([])
        try:
            self._block(statements)
        finally:
            for name in self.nested_names.pop():
                self.scope.pop(name, None)
            self.nesting -= 1

    def _block(self, statements: Sequence[ast.stmt]) -> None:
        for statement in statements:
            if self.body.terminated:
                return  # after a return / break / continue: unreachable
            self.line = getattr(statement, "lineno", "?")
            self._statement(statement)

    def _statement(self, node: ast.stmt) -> None:
        if isinstance(node, ast.Expr):
            if isinstance(node.value, ast.Constant):
                return  # a docstring
            self._expr(node.value)
        elif isinstance(node, ast.Assign):
            value = self._expr(node.value)
            for target in node.targets:
                self._assign(target, value)
        elif isinstance(node, ast.AugAssign):
            current = self._expr(_load(node.target))
            value = self._binop(node.op, current, self._expr(node.value))
            self._assign(node.target, value)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            self._assign(node.target, self._expr(node.value))
        elif isinstance(node, ast.For):
            self._for(node)
        elif isinstance(node, ast.While):
            self._while(node)
        elif isinstance(node, ast.If):
            self._if(node)
        elif isinstance(node, ast.Return):
            self._return(node)
        elif isinstance(node, ast.Pass):
            return
        elif isinstance(node, ast.Break):
            if not self.loops:
                raise self.fail("break outside a loop")
            self.body.branch(self.loops[-1].done)
        elif isinstance(node, ast.Continue):
            if not self.loops:
                raise self.fail("continue outside a loop")
            self.body.branch(self.loops[-1].cont)
        else:
            raise self.fail(f"statement {type(node).__name__}")

    def _assign(self, target: ast.expr, value: Any) -> None:
        if isinstance(target, ast.Name):
            name = target.id
            if value is UNKNOWN:
                return
            if isinstance(value, Scal):
                held = self.types.get(name)
                if held is not None and held.kind == value.type.kind == "f" and held.bits != value.type.bits:
                    # numba types each binding that reaches no common read on its own (SSA): a float32
                    # value computed under a name that elsewhere holds a float64 stays float32 there,
                    # where one type per name would compute it in float64 (other bits)
                    raise self.fail(f"{name} holds both {held} and {value.type}")
                self.types[name] = unify(held, value.type)
                if self.dry:
                    self.scope[name] = ("slot",)
                    return
                slot = self._slot_for(name)
                self.body.emit(f"store {self.types[name].llvm} {self._cast(value, self.types[name]).ref}, ptr {slot}")
                self.scope[name] = ("slot",)
                return
            if name in self.types:
                raise self.fail(f"{name} holds both a number and an array or tuple")
            # An array or tuple is a name for registers: bound in program order; one bound inside a
            # loop or branch is forgotten after it (_nested), so no read can see registers that do
            # not dominate it (reading it there is refused as an unknown name).
            self.scope[name] = ("value", value)
            if self.nesting:
                self.nested_names[-1].append(name)
            return
        if isinstance(target, ast.Tuple):
            if isinstance(value, Tup) and len(value.items) == len(target.elts):
                for element, item in zip(target.elts, value.items):
                    self._assign(element, item)
                return
            if value is UNKNOWN:
                for element in target.elts:
                    self._assign(element, UNKNOWN)
                return
            raise self.fail("unpacking a value that is not a tuple of the same length")
        if isinstance(target, ast.Subscript):
            array = self._expr(target.value)
            if value is UNKNOWN or array is UNKNOWN:
                return
            if not isinstance(array, Arr):
                raise self.fail("item assignment to a value that is not an array")
            if _has_slice(target.slice):
                self._fill(self._view(array, target.slice), value)
                return
            pointer, remaining = self._element(array, target.slice)
            if remaining:
                self._fill(remaining_array(array, pointer, array.type.ndim - len(remaining)), value)
                return
            if not isinstance(value, Scal):
                raise self.fail("an array stored into an array element")
            self._store(array.type.dtype, pointer, value)
            return
        raise self.fail(f"assignment to {type(target).__name__}")

    def _return(self, node: ast.Return) -> None:
        if node.value is None:
            if self.returns not in (None, NONE):
                raise self.fail("a bare return in a function that returns a value")
            self.returns = NONE
            self.body.branch(self.exit)
            return
        value = self._expr(node.value)
        if value is UNKNOWN:
            self.body.branch(self.exit)
            return
        if self.returns == NONE:
            raise self.fail("returns both a value and nothing")
        if isinstance(value, Tup) and value.items and all(isinstance(item, Scal) for item in value.items):
            self.returns = unify(self.returns, value.type)
            if not self.dry:
                if not isinstance(self.returns, Tuple):
                    raise self.fail("returns both a number and a tuple")
                packed = "undef"
                for number, (item, type_) in enumerate(zip(value.items, self.returns.items)):
                    packed = self.body.value(f"insertvalue {self.returns.llvm} {packed}, {type_.llvm} "
                                             f"{self._cast(item, type_).ref}, {number}")
                self.body.emit(f"store {self.returns.llvm} {packed}, ptr {self.return_slot}")
            self.body.branch(self.exit)
            return
        if not isinstance(value, Scal):
            raise self.fail("returning something other than a number or a tuple of numbers")
        self.returns = unify(self.returns, value.type)
        if not self.dry:
            self.body.emit(f"store {self.returns.llvm} {self._cast(value, self.returns).ref}, ptr {self.return_slot}")
        self.body.branch(self.exit)

    def _for(self, node: ast.For) -> None:
        if node.orelse:
            raise self.fail("for ... else")
        call = node.iter
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in ("range", "prange")
                and not call.keywords and 1 <= len(call.args) <= 3):
            return self._for_tuple(node)
        if not isinstance(node.target, ast.Name):
            raise self.fail("a for loop target that is not a name")
        if call.func.id == "prange" and not self.node.name.startswith("__prange_"):
            return self._prange(node)  # (a prange inside an outlined body runs serially, as numba runs it)
        bounds = [self._expr(a) for a in call.args]
        if any(b is UNKNOWN for b in bounds):
            bounds = [literal(0, INTP)] * len(bounds)
        for bound in bounds:
            if not (isinstance(bound, Scal) and bound.type.is_int):
                raise self.fail("range() of a value that is not an integer")
        bounds = [self._cast(b, INTP) for b in bounds]
        if len(bounds) == 1:
            start, stop, step = literal(0, INTP), bounds[0], literal(1, INTP)
        elif len(bounds) == 2:
            (start, stop), step = bounds, literal(1, INTP)
        else:
            start, stop, step = bounds
            if step.const is not None and int(step.const) == 0:
                raise self.fail("range() with step 0")
        body = self.body
        name = node.target.id
        self.types[name] = unify(self.types.get(name), INTP)
        slot = self._slot_for(name) if not self.dry else None
        self.scope[name] = ("slot",)
        before = body.label("for.pre")
        header, inner, latch, done = body.label("for.head"), body.label("for.body"), body.label("for.latch"), \
            body.label("for.end")
        body.branch(before)
        body.start(before)
        body.branch(header)
        body.start(header)
        index = body.tmp("i")
        following = body.tmp("inext")
        body.emit(f"{index} = phi i64 [{start.ref}, %{before}], [{following}, %{latch}]")
        if step.const is not None:
            predicate = "slt" if int(step.const) > 0 else "sgt"
            going = body.value(f"icmp {predicate} i64 {index}, {stop.ref}")
        else:
            up = body.value(f"icmp sgt i64 {step.ref}, 0")
            below = body.value(f"icmp slt i64 {index}, {stop.ref}")
            above = body.value(f"icmp sgt i64 {index}, {stop.ref}")
            going = body.value(f"select i1 {up}, i1 {below}, i1 {above}")
        body.cbranch(going, inner, done)
        body.start(inner)
        if slot is not None:
            body.emit(f"store i64 {index}, ptr {slot}")
        self.loops.append(_Loop(latch, done))
        running = self._running_stop(call, node.body)
        self.running += running
        self._nested(node.body)
        del self.running[len(self.running) - len(running):]
        self.loops.pop()
        if not body.terminated:
            body.branch(latch)
        body.start(latch)
        body.emit(f"{following} = add i64 {index}, {step.ref}")
        count = self.module.globals.get(INTERLEAVE_CONSTANT)
        marked = isinstance(count, int) and count > 1 and not self.dry and _calls_math(node, self.module.defs)
        body.branch(header, self.module.loop_metadata(count) if marked else "")
        body.start(done)

    def _for_tuple(self, node: ast.For) -> None:
        """``for x in t`` over a tuple of numbers: the body once per item (numba iterates a tuple of
        one type the same way, item by item); ``continue`` goes to the next item, ``break`` after them."""
        items = self._expr(node.iter)
        if items is UNKNOWN:
            return
        if not isinstance(items, Tup) or not all(isinstance(item, Scal) for item in items.items):
            raise self.fail("a for loop over something other than range() or a tuple of numbers")
        if not isinstance(node.target, ast.Name):
            raise self.fail("a for loop target that is not a name")
        body = self.body
        done = body.label("tfor.end")
        for item in items.items:
            following = body.label("tfor.next")
            self._assign(node.target, item)
            self.loops.append(_Loop(following, done))
            self._nested(node.body)
            self.loops.pop()
            if not body.terminated:
                body.branch(following)
            body.start(following)
        body.branch(done)
        body.start(done)

    def _prange(self, node: ast.For) -> None:
        """``for i in prange(start, stop)``: the body outlined into a function of its own (run over
        [first, last) by the pool's threads, the caller among them, a chunk at a time:
        ``bendc_parallel_for``, runtime/native/pool.py, with numba_parallel_for's arguments). The
        names the body reads from this function are passed by value; the names it assigns are private to each thread
        (numba's parfor semantics) and not seen after the loop; a name both read from outside and
        assigned in the body (a reduction) is refused, as is a step other than 1."""
        call = node.iter
        if len(call.args) == 3:
            raise self.fail("prange with a step")
        assigned = _assigned_names(node.body) | {node.target.id}
        read = _read_names(node.body)
        captured = sorted(name for name in read - assigned if name in self.scope)
        reductions = sorted(name for name in (read & assigned) - {node.target.id}
                            if name in self.scope and not _assigned_before_read(node.body, name))
        if reductions:
            raise self.fail(f"a prange loop reducing into {', '.join(reductions)}")
        bounds = [self._expr(a) for a in call.args]
        if any(b is UNKNOWN for b in bounds):
            bounds = [literal(0, INTP)] * len(bounds)
        for bound in bounds:
            if not (isinstance(bound, Scal) and bound.type.is_int):
                raise self.fail("prange() of a value that is not an integer")
        bounds = [self._cast(b, INTP) for b in bounds]
        start, stop = (literal(0, INTP), bounds[0]) if len(bounds) == 1 else bounds
        values = {name: self._e_Name(ast.Name(name, ast.Load())) for name in captured}
        if any(v is UNKNOWN for v in values.values()):
            self.private.update(assigned)
            return
        for name, value in values.items():
            if not isinstance(value, (Scal, Arr)) and not (isinstance(value, Obj) and value.what is None):
                raise self.fail(f"a prange loop reading {name}, which is not a number or an array")
        # the outlined body: def __prange_L(captured..., first, last): for i in range(first, last): body
        outlined_name = f"__prange_{node.lineno}_{node.col_offset}"
        arguments = ast.arguments(posonlyargs=[], args=[ast.arg(n) for n in captured + ["first__", "last__"]],
                                  vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[])
        loop = ast.For(target=ast.Name(node.target.id, ast.Store()),
                       iter=ast.Call(ast.Name("range", ast.Load()),
                                     [ast.Name("first__", ast.Load()), ast.Name("last__", ast.Load())], []),
                       body=node.body, orelse=[], lineno=node.lineno, col_offset=node.col_offset)
        decorator = ast.Call(ast.Name("njit", ast.Load()), [],
                             [ast.keyword("error_model", ast.Constant("python" if self.python_errors else "numpy"))])
        outlined = ast.FunctionDef(outlined_name, arguments, [loop], [decorator], None, lineno=node.lineno,
                                   col_offset=node.col_offset)
        ast.fix_missing_locations(outlined)
        self.module.defs[outlined_name] = outlined
        start_node = call.args[0] if len(call.args) == 2 else ast.Constant(0)
        bounds_known = {"first__", "last__"} if _nonneg(start_node, self.nonneg, self.bound,
                                                         self.module.globals) else set()
        self.module.nonneg_params[outlined_name] = frozenset(
            {name for name in captured if name in self.nonneg} | bounds_known)
        self.module.numba_functions = set(self.module.numba_functions) | {outlined_name}
        types = []
        for name in captured:
            value = values[name]
            if isinstance(value, Scal):
                types.append(value.type)
            elif isinstance(value, Arr):
                types.append(ArrayArg(value.type.dtype, value.type.ndim, value.layout, 0))
            else:
                types.append(NONE_ARG)
        types += [INTP, INTP]
        compiled = self.module.function(outlined_name, tuple(types))
        self.private.update(assigned)
        if self.dry:
            return
        # the context every thread reads: a status word, then the captured values
        fields, stores = ["i32"], []
        for name, type_ in zip(captured, types[:-2]):
            value = values[name]
            if isinstance(value, Scal):
                fields.append(type_.llvm)
                stores.append((type_.llvm, self._cast(value, type_).ref))
            elif isinstance(value, Arr):
                fields.append("ptr")
                stores.append(("ptr", value.data))
                for size in value.shape:
                    fields.append("i64")
                    stores.append(("i64", size.ref))
                if value.layout != "C":
                    for stride in value.strides:
                        fields.append("i64")
                        stores.append(("i64", stride.ref))
        struct = "{" + ", ".join(fields) + "}"
        task = self.module.task(compiled, struct, fields)
        body = self.body
        self.module.declare("get_num_threads", "declare i32 @get_num_threads()")
        threads = body.value("call i32 @get_num_threads()")
        # One thread: the body runs here, over the whole range, with no launch at all.
        serial, launch, finished = body.label("prange.serial"), body.label("prange.launch"), body.label("prange.end")
        body.cbranch(body.value(f"icmp sle i32 {threads}, 1"), serial, launch)
        body.start(serial)
        arguments = [f"{type_} {ref}" for type_, ref in stores] + [f"i64 {start.ref}", f"i64 {stop.ref}"]
        self._check_status(body.value(f"call i32 @\"{compiled.name}\"({', '.join(arguments)})"))
        body.branch(finished)
        body.start(launch)
        context = body.slot(struct, "pctx")
        body.emit(f"store i32 0, ptr " + body.value(f"getelementptr {struct}, ptr {context}, i32 0, i32 0"))
        for number, (type_, ref) in enumerate(stores, start=1):
            where = body.value(f"getelementptr {struct}, ptr {context}, i32 0, i32 {number}")
            body.emit(f"store {type_} {ref}, ptr {where}")
        total = body.value(f"sub i64 {stop.ref}, {start.ref}")
        positive = body.value(f"icmp sgt i64 {total}, 0")
        count = body.value(f"select i1 {positive}, i64 {total}, i64 0")
        go, done = body.label("prange.go"), body.label("prange.done")
        body.cbranch(positive, go, done)
        body.start(go)
        args = body.slot("ptr", "pargs")
        body.emit(f"store ptr " + body.value(f"inttoptr i64 {start.ref} to ptr") + f", ptr {args}")
        dims = body.slot("i64", "pdims")
        body.emit(f"store i64 {count}, ptr {dims}")
        steps = body.slot("i64", "psteps")
        body.emit(f"store i64 1, ptr {steps}")
        self.module.declare("bendc_parallel_for",
                            "declare void @bendc_parallel_for(ptr, ptr, ptr, ptr, ptr, i64, i64, i32)")
        # the GIL released while the threads run (as numba's parallel gufunc wrapper does): a thread
        # that needs it (numba's BLAS wrappers take it once to find scipy's functions) must not wait
        # on this one
        self.module.declare("PyGILState_Ensure", "declare i32 @PyGILState_Ensure()")
        self.module.declare("PyGILState_Release", "declare void @PyGILState_Release(i32)")
        self.module.declare("PyEval_SaveThread", "declare ptr @PyEval_SaveThread()")
        self.module.declare("PyEval_RestoreThread", "declare void @PyEval_RestoreThread(ptr)")
        gil = body.value("call i32 @PyGILState_Ensure()")
        thread = body.value("call ptr @PyEval_SaveThread()")
        body.emit(f"call void @bendc_parallel_for(ptr @\"{task}\", ptr {args}, ptr {dims}, ptr {steps}, "
                  f"ptr {context}, i64 0, i64 1, i32 {threads})")
        body.emit(f"call void @PyEval_RestoreThread(ptr {thread})")
        body.emit(f"call void @PyGILState_Release(i32 {gil})")
        status = body.value(f"load i32, ptr " + body.value(f"getelementptr {struct}, ptr {context}, i32 0, i32 0"))
        self._check_status(status)
        body.branch(done)
        body.start(done)
        body.branch(finished)
        body.start(finished)

    def _while(self, node: ast.While) -> None:
        if node.orelse:
            raise self.fail("while ... else")
        body = self.body
        header, inner, done = body.label("while.head"), body.label("while.body"), body.label("while.end")
        body.branch(header)
        body.start(header)
        condition = self._truth(self._expr(node.test))
        body.cbranch(condition, inner, done)
        body.start(inner)
        self.loops.append(_Loop(header, done))
        self._nested(node.body)
        self.loops.pop()
        if not body.terminated:
            body.branch(header)
        body.start(done)

    def _if(self, node: ast.If) -> None:
        body = self.body
        condition = self._expr(node.test)
        if isinstance(condition, Scal) and condition.const is not None:
            # a condition known when compiling (``x is None``): only its side is translated (numba
            # prunes the other, which may not even type)
            self._nested(node.body if bool(condition.const) else node.orelse)
            return
        yes, no, done = body.label("if.then"), body.label("if.else"), body.label("if.end")
        body.cbranch(self._truth(condition), yes, no)
        body.start(yes)
        self._nested(node.body)
        if not body.terminated:
            body.branch(done)
        body.start(no)
        self._nested(node.orelse)
        if not body.terminated:
            body.branch(done)
        body.start(done)

    # ---------------------------------------------------------------- expressions
    def _expr(self, node: ast.expr) -> Any:
        method = getattr(self, f"_e_{type(node).__name__}", None)
        if method is None:
            raise self.fail(f"expression {type(node).__name__}")
        return method(node)

    def _e_Constant(self, node: ast.Constant) -> Any:
        value = node.value
        if isinstance(value, bool):
            return literal(value, BOOL)
        if isinstance(value, int):
            if not -(1 << 63) <= value < (1 << 63):
                raise self.fail("an integer literal beyond int64")
            return literal(value, INT64)
        if isinstance(value, float):
            return literal(value, FLOAT64)
        if value is None:
            return Obj(None)
        raise self.fail(f"literal {value!r}")

    def _e_Name(self, node: ast.Name) -> Any:
        name = node.id
        bound = self.scope.get(name)
        if bound is not None:
            if bound[0] == "slot":
                type_ = self.types.get(name)
                if type_ is None:
                    return UNKNOWN
                if self.dry:
                    return Scal(type_, "undef")
                return Scal(type_, self.body.value(f"load {type_.llvm}, ptr {self._slot_for(name)}"))
            return bound[1]
        if name in self.private:
            raise self.fail(f"{name} is read after the prange loop that assigns it")
        if name in self.types:  # assigned later in a loop, read here first
            return UNKNOWN if self.dry else self._e_Name_late(name)
        if name in ("np", "numpy"):
            return Obj("np")
        if name == "math":
            return Obj("math")
        if name in ("range", "prange", "abs", "min", "max", "float", "int", "bool", "len"):
            return Obj(Function(name))
        if name in self.module.globals:
            value = self.module.globals[name]
            return self._e_Constant(ast.Constant(value))
        if name in self.module.intrinsics:
            return Obj(Function("intrinsic:" + self.module.intrinsics[name]))
        if name in self.module.defs:
            return Obj(Function("helper:" + name))
        if self.dry:
            return UNKNOWN
        raise self.fail(f"unknown name {name}")

    def _e_Name_late(self, name: str) -> Any:
        type_ = self.types[name]
        return Scal(type_, self.body.value(f"load {type_.llvm}, ptr {self._slot_for(name)}"))

    def _e_Attribute(self, node: ast.Attribute) -> Any:
        base = self._expr(node.value)
        attr = node.attr
        if base is UNKNOWN:
            return UNKNOWN
        if isinstance(base, Obj):
            if base.what in ("np", "math"):
                if base.what == "np" and attr in NUMPY_DTYPES:
                    return Obj(DType(NUMPY_DTYPES[attr]))
                if attr in MODULE_CONSTANTS:
                    return literal(MODULE_CONSTANTS[attr], FLOAT64)
                return Obj(Function(f"{base.what}.{attr}"))
            raise self.fail(f"attribute {attr} of {base.what}")
        if isinstance(base, Arr):
            if attr == "shape":
                return Tup(list(base.shape))
            if attr == "strides":
                return Tup(list(base.strides))
            if attr == "size":
                return self._size(base.shape)
            if attr == "ndim":
                return literal(base.type.ndim, INTP)
            if attr == "T":  # the reversed axes: C <-> F (numba's transpose)
                layout = {"C": "F", "F": "C"}.get(base.layout, "A")
                return Arr(base.type, layout, base.data, base.shape[::-1], base.strides[::-1])
            if attr in ("reshape", "view", "astype", "copy", "fill", "sum", "min", "max"):
                return Obj(("method", attr, base))
            raise self.fail(f"array attribute {attr}")
        if isinstance(base, Scal):
            if attr == "view":
                return Obj(("method", "view", base))
            raise self.fail(f"attribute {attr} of a number")
        raise self.fail(f"attribute {attr}")

    def _e_Tuple(self, node: ast.Tuple) -> Any:
        items = [self._expr(e) for e in node.elts]
        if any(i is UNKNOWN for i in items):
            return UNKNOWN
        return Tup(items)

    def _e_UnaryOp(self, node: ast.UnaryOp) -> Any:
        value = self._expr(node.operand)
        if value is UNKNOWN:
            return UNKNOWN
        if not isinstance(value, Scal):
            raise self.fail("a unary operation on a value that is not a number")
        body = self.body
        if isinstance(node.op, ast.UAdd):
            return value if value.type != BOOL else self._cast(value, INT64)
        if isinstance(node.op, ast.Not):
            truth = self._truth(value)
            return Scal(BOOL, body.value(f"xor i1 {truth}, true"))
        if isinstance(node.op, ast.USub):
            result = negation(value.type)
            if value.const is not None and value.type in (INT64, FLOAT64, FLOAT32):  # a literal: folded
                return literal(-value.const, result)
            if result.kind == "f":
                # numba: fsub -0.0, x (mathimpl.negate_real)
                return Scal(result, body.value(f"fsub {result.llvm} {float_literal(-0.0, result)}, {value.ref}"))
            if value.type == BOOL:  # numba's bool_negate_impl: widen, then negate
                operand = self._cast(value, result)
                return Scal(result, body.value(f"sub {result.llvm} 0, {operand.ref}"))
            # numba's int_negate_impl: negate in the operand's own type, then widen
            negated = Scal(value.type, body.value(f"sub {value.type.llvm} 0, {value.ref}"))
            return self._cast(negated, result)
        if isinstance(node.op, ast.Invert):
            result = inversion(value.type)
            if result == BOOL:
                return Scal(BOOL, body.value(f"xor i1 {value.ref}, true"))
            # numba's int_invert_impl: invert in the operand's own type, then widen
            inverted = Scal(value.type, body.value(f"xor {value.type.llvm} {value.ref}, -1"))
            return self._cast(inverted, result)
        raise self.fail(f"unary {type(node.op).__name__}")

    def _e_BinOp(self, node: ast.BinOp) -> Any:
        left = self._expr(node.left)
        right = self._expr(node.right)
        if isinstance(node.op, ast.Add) and isinstance(left, Tup) and isinstance(right, Tup):
            return Tup(left.items + right.items)
        if isinstance(node.op, ast.Pow) and isinstance(left, Scal) and isinstance(node.right, ast.Constant) \
                and isinstance(node.right.value, int) and not isinstance(node.right.value, bool):
            return self._static_power(left, node.right.value)
        return self._binop(node.op, left, right)

    def _binop(self, op: ast.operator, left: Any, right: Any) -> Any:
        if left is UNKNOWN or right is UNKNOWN:
            return UNKNOWN
        if not (isinstance(left, Scal) and isinstance(right, Scal)):
            raise self.fail(f"{type(op).__name__} of values that are not numbers")
        body = self.body
        a, b = left.type, right.type
        if isinstance(op, (ast.Add, ast.Sub, ast.Mult)):
            result = arithmetic(a, b)
            x, y = self._cast(left, result), self._cast(right, result)
            if result.kind == "f":
                instruction = {ast.Add: "fadd", ast.Sub: "fsub", ast.Mult: "fmul"}[type(op)]
            else:
                instruction = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul"}[type(op)]
            return Scal(result, body.value(f"{instruction} {result.llvm} {x.ref}, {y.ref}"))
        if isinstance(op, ast.Div):
            result = true_division(a, b)
            x, y = self._cast(left, result), self._cast(right, result)
            self._zero_check(y)
            return Scal(result, body.value(f"fdiv {result.llvm} {x.ref}, {y.ref}"))
        if isinstance(op, (ast.FloorDiv, ast.Mod)):
            result = arithmetic(a, b)
            x, y = self._cast(left, result), self._cast(right, result)
            self._zero_check(y)
            if result.kind == "f":
                return self._float_divmod(x, y, floor=isinstance(op, ast.FloorDiv))
            return self._int_divmod(x, y, floor=isinstance(op, ast.FloorDiv))
        if isinstance(op, ast.Pow):
            result = power(a, b)
            if result.kind == "f" and b.kind == "f":
                x, y = self._cast(left, result), self._cast(right, result)
                return self._call_intrinsic("pow", result, [x, y])
            if result.kind == "f":
                return self._int_exponent_power(self._cast(left, result), self._cast(right, INT64))
            raise self.fail("** of integers by a variable exponent")
        if isinstance(op, (ast.BitAnd, ast.BitOr, ast.BitXor)):
            result = bitwise(a, b)
            x, y = self._cast(left, result), self._cast(right, result)
            instruction = {ast.BitAnd: "and", ast.BitOr: "or", ast.BitXor: "xor"}[type(op)]
            return Scal(result, body.value(f"{instruction} {result.llvm} {x.ref}, {y.ref}"))
        if isinstance(op, (ast.LShift, ast.RShift)):
            result = shift(a, b)
            x, y = self._cast(left, result), self._cast(right, result)
            if isinstance(op, ast.LShift):
                instruction = "shl"
            else:
                instruction = "ashr" if result.signed else "lshr"
            return Scal(result, body.value(f"{instruction} {result.llvm} {x.ref}, {y.ref}"))
        raise self.fail(f"operator {type(op).__name__}")

    def _static_power(self, base: Scal, exponent: int) -> Scal:
        """``x ** n`` with a literal n: numba's static_power_impl (unrolled squarings)."""
        if base.type.kind == "f":
            result = base.type
        else:
            result = INT64 if base.type.signed else UINT64
        if abs(exponent) > 0x10000:
            raise self.fail("a literal exponent beyond 65536")
        if exponent < 0 and result.kind != "f":
            raise self.fail("an integer to a negative literal power")
        value = self._cast(base, result)
        body = self.body
        mul = "fmul" if result.kind == "f" else "mul"
        res = literal(1, result)
        n = abs(exponent)
        while n != 0:
            if n & 1:
                res = Scal(result, body.value(f"{mul} {result.llvm} {res.ref}, {value.ref}"))
            n >>= 1
            value = Scal(result, body.value(f"{mul} {result.llvm} {value.ref}, {value.ref}"))
        if exponent < 0:
            res = Scal(result, body.value(f"fdiv {result.llvm} {literal(1.0, result).ref}, {res.ref}"))
        return res

    def _int_exponent_power(self, base: Scal, exponent: Scal) -> Scal:
        """``x ** n`` of a float by an integer variable: numba's int_power (squaring loop; 1/r for n < 0;
        beyond 0x10000, math.pow)."""
        raise self.fail("** of a float by an integer variable")

    def _float_divmod(self, x: Scal, y: Scal, floor: bool) -> Scal:
        """Python's float // and % as numba lowers them (real_floordiv_impl, real_mod_impl,
        real_divmod_func_body: CPython's float_divmod)."""
        body = self.body
        t = x.type
        ty = t.llvm
        zero, nzero, one, half = (float_literal(v, t) for v in (0.0, -0.0, 1.0, 0.5))
        result = body.slot(ty, "fdm")
        is_zero = body.value(f"fcmp oeq {ty} {y.ref}, {zero}")
        if_zero, if_not, done = body.label("fdm.zero"), body.label("fdm.nonzero"), body.label("fdm.end")
        body.cbranch(is_zero, if_zero, if_not)
        body.start(if_zero)
        quick = body.value(f"{'fdiv' if floor else 'frem'} {ty} {x.ref}, {y.ref}")
        body.emit(f"store {ty} {quick}, ptr {result}")
        body.branch(done)
        body.start(if_not)
        mod = body.value(f"frem {ty} {x.ref}, {y.ref}")
        div = body.value(f"fdiv {ty} " + body.value(f"fsub {ty} {x.ref}, {mod}") + f", {y.ref}")
        pmod, pdiv = body.slot(ty, "pmod"), body.slot(ty, "pdiv")
        body.emit(f"store {ty} {mod}, ptr {pmod}")
        body.emit(f"store {ty} {div}, ptr {pdiv}")
        mod_true = body.value(f"fcmp une {ty} {mod}, {zero}")
        wx_ltz = body.value(f"fcmp olt {ty} {y.ref}, {zero}")
        mod_ltz = body.value(f"fcmp olt {ty} {mod}, {zero}")
        nonzero_mod, zero_mod, after = body.label("fdm.modnz"), body.label("fdm.modz"), body.label("fdm.modend")
        body.cbranch(mod_true, nonzero_mod, zero_mod)
        body.start(nonzero_mod)
        differ = body.value(f"icmp ne i1 {wx_ltz}, {mod_ltz}")
        fix, nofix = body.label("fdm.fix"), body.label("fdm.nofix")
        body.cbranch(differ, fix, nofix)
        body.start(fix)
        body.emit(f"store {ty} " + body.value(f"fsub {ty} {div}, {one}") + f", ptr {pdiv}")
        body.emit(f"store {ty} " + body.value(f"fadd {ty} {mod}, {y.ref}") + f", ptr {pmod}")
        body.branch(nofix)
        body.start(nofix)
        body.branch(after)
        body.start(zero_mod)
        signed_zero = body.value(f"select i1 {wx_ltz}, {ty} {nzero}, {ty} {zero}")
        body.emit(f"store {ty} {signed_zero}, ptr {pmod}")
        body.branch(after)
        body.start(after)
        div2 = body.value(f"load {ty}, ptr {pdiv}")
        div_true = body.value(f"fcmp one {ty} {div2}, {zero}")
        pfloor = body.slot(ty, "pfloor")
        snap, zero_div, snapped = body.label("fdm.snap"), body.label("fdm.zdiv"), body.label("fdm.snapped")
        body.cbranch(div_true, snap, zero_div)
        body.start(snap)
        floored = self._call_extern("floor", t, [Scal(t, div2)]).ref
        diff = body.value(f"fsub {ty} {div2}, {floored}")
        incr = body.value(f"fadd {ty} {floored}, {one}")
        over = body.value(f"fcmp ogt {ty} {diff}, {half}")
        body.emit(f"store {ty} " + body.value(f"select i1 {over}, {ty} {incr}, {ty} {floored}") + f", ptr {pfloor}")
        body.branch(snapped)
        body.start(zero_div)
        squared = body.value(f"fmul {ty} {div2}, {div2}")
        body.emit(f"store {ty} {squared}, ptr {pdiv}")
        signed = body.value(f"fdiv {ty} " + body.value(f"fmul {ty} {squared}, {x.ref}") + f", {y.ref}")
        body.emit(f"store {ty} {signed}, ptr {pfloor}")
        body.branch(snapped)
        body.start(snapped)
        answer = body.value(f"load {ty}, ptr {pfloor if floor else pmod}")
        body.emit(f"store {ty} {answer}, ptr {result}")
        body.branch(done)
        body.start(done)
        return Scal(t, body.value(f"load {ty}, ptr {result}"))

    def _int_divmod(self, x: Scal, y: Scal, floor: bool) -> Scal:
        """Python's integer // and % as numba lowers them (_int_divmod_impl, int_divmod_signed): 0 for a
        zero divisor (the numpy error model), 0 for MIN // -1."""
        body = self.body
        t = x.type
        ty = t.llvm
        result = body.slot(ty, "idm")
        body.emit(f"store {ty} 0, ptr {result}")
        nonzero = body.value(f"icmp ne {ty} {y.ref}, 0")
        work, done = body.label("idm.work"), body.label("idm.end")
        if t.signed:
            minimum = -(1 << (t.bits - 1))
            overflow = body.value("and i1 " + body.value(f"icmp eq {ty} {x.ref}, {minimum}") + ", "
                                  + body.value(f"icmp eq {ty} {y.ref}, -1"))
            go = body.value(f"and i1 {nonzero}, " + body.value(f"xor i1 {overflow}, true"))
        else:
            go = nonzero
        body.cbranch(go, work, done)
        body.start(work)
        if t.signed:
            quotient = body.value(f"sdiv {ty} {x.ref}, {y.ref}")
            remainder = body.value(f"srem {ty} {x.ref}, {y.ref}")
            signs_differ = body.value(f"icmp slt {ty} " + body.value(f"xor {ty} {y.ref}, {remainder}") + ", 0")
            remainder_true = body.value(f"icmp ne {ty} {remainder}, 0")
            adjust = body.value(f"and i1 {remainder_true}, {signs_differ}")
            if floor:
                fixed = body.value(f"sub {ty} {quotient}, 1")
                answer = body.value(f"select i1 {adjust}, {ty} {fixed}, {ty} {quotient}")
            else:
                fixed = body.value(f"add {ty} {remainder}, {y.ref}")
                answer = body.value(f"select i1 {adjust}, {ty} {fixed}, {ty} {remainder}")
        else:
            answer = body.value(f"{'udiv' if floor else 'urem'} {ty} {x.ref}, {y.ref}")
        body.emit(f"store {ty} {answer}, ptr {result}")
        body.branch(done)
        body.start(done)
        return Scal(t, body.value(f"load {ty}, ptr {result}"))

    def _e_Compare(self, node: ast.Compare) -> Any:
        if len(node.ops) != 1:
            raise self.fail("a chained comparison")
        left = self._expr(node.left)
        right = self._expr(node.comparators[0])
        if left is UNKNOWN or right is UNKNOWN:
            return UNKNOWN
        if isinstance(node.ops[0], (ast.Is, ast.IsNot)):
            # only None is compared by identity here: decided at compile time, as numba decides it
            if not ((isinstance(left, Obj) and left.what is None) or (isinstance(right, Obj) and right.what is None)):
                raise self.fail("an identity comparison that is not with None")
            same = (isinstance(left, Obj) and left.what is None) and (isinstance(right, Obj) and right.what is None)
            return literal(same if isinstance(node.ops[0], ast.Is) else not same, BOOL)
        return self._compare(node.ops[0], left, right)

    def _compare(self, op: ast.cmpop, left: Any, right: Any) -> Scal:
        if not (isinstance(left, Scal) and isinstance(right, Scal)):
            raise self.fail("a comparison of values that are not numbers")
        common = promote(left.type, right.type)
        x, y = self._cast(left, common), self._cast(right, common)
        body = self.body
        kind = type(op)
        if common.kind == "f":
            predicate = {ast.Lt: "olt", ast.LtE: "ole", ast.Gt: "ogt", ast.GtE: "oge", ast.Eq: "oeq",
                         ast.NotEq: "une"}.get(kind)
            if predicate is None:
                raise self.fail(f"comparison {kind.__name__}")
            return Scal(BOOL, body.value(f"fcmp {predicate} {common.llvm} {x.ref}, {y.ref}"))
        signed = common.signed
        predicate = {ast.Lt: "slt" if signed else "ult", ast.LtE: "sle" if signed else "ule",
                     ast.Gt: "sgt" if signed else "ugt", ast.GtE: "sge" if signed else "uge",
                     ast.Eq: "eq", ast.NotEq: "ne"}.get(kind)
        if predicate is None:
            raise self.fail(f"comparison {kind.__name__}")
        if common == BOOL:  # numba compares booleans as unsigned integers
            predicate = {"slt": "ult", "sle": "ule", "sgt": "ugt", "sge": "uge"}.get(predicate, predicate)
        return Scal(BOOL, body.value(f"icmp {predicate} {common.llvm} {x.ref}, {y.ref}"))

    def _e_BoolOp(self, node: ast.BoolOp) -> Any:
        """``a and b`` / ``a or b`` of booleans, short-circuit (other operand types are refused: Python
        would return an operand, not a bool)."""
        values = []
        body = self.body
        is_and = isinstance(node.op, ast.And)
        result = body.slot("i1", "bool") if not self.dry else None
        done = body.label("bool.end")
        for number, operand in enumerate(node.values):
            value = self._expr(operand)
            if value is UNKNOWN:
                values.append(UNKNOWN)
                continue
            if not (isinstance(value, Scal) and value.type == BOOL):
                raise self.fail("and / or of values that are not booleans")
            values.append(value)
            if result is not None:
                body.emit(f"store i1 {value.ref}, ptr {result}")
            if number < len(node.values) - 1:
                following = body.label("bool.next")
                if is_and:
                    body.cbranch(value.ref, following, done)
                else:
                    body.cbranch(value.ref, done, following)
                body.start(following)
        body.branch(done)
        body.start(done)
        if any(v is UNKNOWN for v in values):
            return UNKNOWN
        if self.dry:
            return Scal(BOOL, "undef")
        return Scal(BOOL, body.value(f"load i1, ptr {result}"))

    def _e_IfExp(self, node: ast.IfExp) -> Any:
        """``a if c else b``: branches (only the chosen side runs), the result unified as numba does."""
        condition = self._expr(node.test)
        if isinstance(condition, Scal) and condition.const is not None:
            return self._expr(node.body if bool(condition.const) else node.orelse)
        body = self.body
        yes, no, done = body.label("ifx.then"), body.label("ifx.else"), body.label("ifx.end")
        truth = self._truth(condition) if condition is not UNKNOWN else "undef"
        # type both sides first (dry): the slot needs the unified type
        saved = (self.body, self.dry)
        self.body, self.dry = Body(dry=True), True
        self.body.count = saved[0].count
        try:
            first = self._expr(node.body)
            second = self._expr(node.orelse)
        finally:
            count = self.body.count
            self.body, self.dry = saved
            self.body.count = count
        if first is UNKNOWN or second is UNKNOWN or condition is UNKNOWN:
            return UNKNOWN
        if not (isinstance(first, Scal) and isinstance(second, Scal)):
            raise self.fail("a conditional expression of values that are not numbers")
        common = unify(first.type, second.type)
        if self.dry:
            return Scal(common, "undef")
        if _operand_only(node.body) and _operand_only(node.orelse):
            # Both sides are names or constants: reading them has no effect and cannot fail, so both
            # are read and one is selected, as a branch would. A branch let LLVM sink a side's array
            # load into it, and a load it cannot speculate kept the select, and so the loop's
            # vectorization or a cmov, from forming: a relu's backward (where(x <= 0, 0, g)) ran at
            # a mispredicted branch per element, ten times slower on random signs.
            chosen = self._cast(self._expr(node.body), common), self._cast(self._expr(node.orelse), common)
            return Scal(common, body.value(f"select i1 {truth}, {common.llvm} {chosen[0].ref}, "
                                           f"{common.llvm} {chosen[1].ref}"))
        result = body.slot(common.llvm, "ifx")
        body.cbranch(truth, yes, no)
        body.start(yes)
        value = self._cast(self._expr(node.body), common)
        body.emit(f"store {common.llvm} {value.ref}, ptr {result}")
        body.branch(done)
        body.start(no)
        value = self._cast(self._expr(node.orelse), common)
        body.emit(f"store {common.llvm} {value.ref}, ptr {result}")
        body.branch(done)
        body.start(done)
        return Scal(common, body.value(f"load {common.llvm}, ptr {result}"))

    def _e_Subscript(self, node: ast.Subscript) -> Any:
        base = self._expr(node.value)
        if base is UNKNOWN:
            return UNKNOWN
        if isinstance(base, Tup):
            index = node.slice
            if isinstance(index, ast.Constant) and isinstance(index.value, int):
                try:
                    return base.items[index.value]
                except IndexError:
                    raise self.fail("a tuple index out of range") from None
            if isinstance(index, ast.UnaryOp) and isinstance(index.op, ast.USub) and \
                    isinstance(index.operand, ast.Constant):
                return base.items[-index.operand.value]
            return self._tuple_item(base, self._expr(index))
        if not isinstance(base, Arr):
            raise self.fail("indexing a value that is not an array or tuple")
        if _has_slice(node.slice):
            return self._view(base, node.slice)
        pointer, remaining = self._element(base, node.slice)
        if remaining is not None and remaining:
            return remaining_array(base, pointer, len(base.shape) - len(remaining))
        return self._load(base.type.dtype, pointer)

    def _view(self, array: Arr, index_node: ast.expr) -> Arr:
        """Basic indexing with slices (numba's basic_indexing): integers pick, slices narrow
        (Python's slice.indices: defaults, negative bounds from the end, clamped), missing trailing
        dimensions are kept. The layout is numba's: C stays C while every index but an unstrided
        innermost slice is an integer."""
        elements = list(index_node.elts) if isinstance(index_node, ast.Tuple) else [index_node]
        if len(elements) > array.type.ndim:
            raise self.fail("more indices than dimensions")
        body = self.body
        offset = literal(0, INTP)
        shape, strides, kinds = [], [], []
        for axis, element in enumerate(elements):
            size, stride = array.shape[axis], array.strides[axis]
            if isinstance(element, ast.Slice):
                start, length, step = self._slice(element, size)
                offset = self._int_op("add", offset, self._int_op("mul", start, stride))
                shape.append(length)
                strides.append(self._int_op("mul", stride, step))
                kinds.append("strided" if element.step is not None else "slice")
                continue
            index = self._expr(element)
            if index is UNKNOWN:
                return Arr(Array(array.type.dtype, 0), "A", "undef", [], [])
            if not (isinstance(index, Scal) and index.type.is_int):
                raise self.fail("an index that is not an integer or a slice")
            position = self._cast(index, INTP)
            if index.type.signed and not (position.const is not None and int(position.const) >= 0) and \
                    not self._never_negative(elements, axis):
                negative = body.value(f"icmp slt i64 {position.ref}, 0")
                wrapped = body.value(f"add i64 {position.ref}, {size.ref}")
                position = Scal(INTP, body.value(f"select i1 {negative}, i64 {wrapped}, i64 {position.ref}"))
            offset = self._int_op("add", offset, self._int_op("mul", position, stride))
            kinds.append("integer")
        rest = range(len(elements), array.type.ndim)
        shape += [array.shape[axis] for axis in rest]
        strides += [array.strides[axis] for axis in rest]
        layout = _index_layout(array.layout, kinds, array.type.ndim)
        pointer = array.data if offset.const is not None and int(offset.const) == 0 else \
            body.value(f"getelementptr i8, ptr {array.data}, i64 {offset.ref}")
        return Arr(Array(array.type.dtype, len(shape)), layout, pointer, shape, strides)

    def _slice(self, node: ast.Slice, size: Scal) -> tuple[Scal, Scal, Scal]:
        """(start, length, step) of ``lower:upper:step`` over a dimension of ``size`` (numba's
        fix_slice and get_slice_length: CPython's PySlice_GetIndicesEx)."""
        def bound(expression):
            if expression is None:
                return None
            value = self._expr(expression)
            if isinstance(value, Obj) and value.what is None:
                return None
            if value is UNKNOWN:
                return literal(0, INTP)
            if not (isinstance(value, Scal) and value.type.is_int):
                raise self.fail("a slice bound that is not an integer")
            return self._cast(value, INTP)

        lower, upper, step = bound(node.lower), bound(node.upper), bound(node.step)
        if step is None:
            step = literal(1, INTP)
        if step.const is None:
            raise self.fail("a slice whose step is not a constant")
        stride = int(step.const)
        if stride == 0:
            raise self.fail("a slice with step 0")
        body = self.body

        def fixed(value: Scal | None, default_up: Scal, default_down: Scal) -> Scal:
            if value is None:
                return default_up if stride > 0 else default_down
            if value.const is not None and int(value.const) >= 0 and size.const is not None:
                n = int(size.const)
                v = int(value.const)
                return literal(min(v, n) if stride > 0 else min(v, n - 1), INTP)
            # negative: from the end; then clamped to [0, n] (step > 0) or [-1, n - 1] (step < 0)
            negative = body.value(f"icmp slt i64 {value.ref}, 0")
            shifted = body.value(f"add i64 {value.ref}, {size.ref}")
            value = body.value(f"select i1 {negative}, i64 {shifted}, i64 {value.ref}")
            low, high = (literal(0, INTP), size) if stride > 0 else \
                (literal(-1, INTP), self._int_op("sub", size, literal(1, INTP)))
            below = body.value(f"icmp slt i64 {value}, {low.ref}")
            value = body.value(f"select i1 {below}, i64 {low.ref}, i64 {value}")
            above = body.value(f"icmp sgt i64 {value}, {high.ref}")
            return Scal(INTP, body.value(f"select i1 {above}, i64 {high.ref}, i64 {value}"))

        start = fixed(lower, literal(0, INTP), self._int_op("sub", size, literal(1, INTP)))
        stop = fixed(upper, size, literal(-1, INTP))
        # length: max(0, ceil((stop - start) / step))
        if stride > 0:
            span = self._int_op("sub", stop, start)
            if stride != 1:
                span = Scal(INTP, body.value(f"sdiv i64 " + body.value(f"add i64 {span.ref}, {stride - 1}")
                                             + f", {stride}"))
        else:
            span = self._int_op("sub", start, stop)
            span = Scal(INTP, body.value(f"sdiv i64 " + body.value(f"add i64 {span.ref}, {-stride - 1}")
                                         + f", {-stride}"))
        if span.const is not None:
            length = literal(max(0, int(span.const)), INTP)
        else:
            positive = body.value(f"icmp sgt i64 {span.ref}, 0")
            length = Scal(INTP, body.value(f"select i1 {positive}, i64 {span.ref}, i64 0"))
        return start, length, step

    def _fill(self, target: Arr, value: Any) -> None:
        """``view[...] = value``: a number into every element, or an array broadcast onto the view
        (numba's setitem of a slice: the value's dimensions, aligned on the right, must each equal
        the view's or be 1, else ValueError), element by element in C order."""
        if self.dry:
            return
        if isinstance(value, Scal):
            source = None
        elif isinstance(value, Arr):
            source = value
            if source.type.ndim > target.type.ndim:
                raise self.fail("an array of more dimensions stored into a slice")
        else:
            raise self.fail("storing something other than a number or an array into a slice")
        body = self.body
        ndim = target.type.ndim
        if source is not None:
            lead = ndim - source.type.ndim
            for axis in range(source.type.ndim):
                have, want = source.shape[axis], target.shape[lead + axis]
                ok = body.value("or i1 " + body.value(f"icmp eq i64 {have.ref}, {want.ref}") + ", "
                                + body.value(f"icmp eq i64 {have.ref}, 1"))
                bad, good = body.label("fill.bad"), body.label("fill.ok")
                body.cbranch(ok, good, bad)
                body.start(bad)
                body.emit(f"store i32 {STATUS_BROADCAST}, ptr {self.status_slot}")
                body.branch(self.exit)
                body.start(good)
        indices: list[str] = []
        exits = []
        for axis in range(ndim):
            before, header, inner, done = (body.label(f"fill{axis}.{part}") for part in ("pre", "head", "body", "end"))
            index, following = body.tmp("fi"), body.tmp("fn")
            body.branch(before)
            body.start(before)
            body.branch(header)
            body.start(header)
            latch = body.label(f"fill{axis}.latch")
            body.emit(f"{index} = phi i64 [0, %{before}], [{following}, %{latch}]")
            body.cbranch(body.value(f"icmp slt i64 {index}, {target.shape[axis].ref}"), inner, done)
            body.start(inner)
            indices.append(index)
            exits.append((latch, index, following, header, done))
        offset = literal(0, INTP)
        for axis, index in enumerate(indices):
            offset = self._int_op("add", offset, self._int_op("mul", Scal(INTP, index), target.strides[axis]))
        pointer = body.value(f"getelementptr i8, ptr {target.data}, i64 {offset.ref}")
        if source is None:
            element = value
        else:
            lead = ndim - source.type.ndim
            where = literal(0, INTP)
            for axis in range(source.type.ndim):
                one = body.value(f"icmp eq i64 {source.shape[axis].ref}, 1")
                position = Scal(INTP, body.value(f"select i1 {one}, i64 0, i64 {indices[lead + axis]}"))
                where = self._int_op("add", where, self._int_op("mul", position, source.strides[axis]))
            element = self._load(source.type.dtype, body.value(f"getelementptr i8, ptr {source.data}, i64 {where.ref}"))
        self._store(target.type.dtype, pointer, element)
        for latch, index, following, header, done in reversed(exits):
            body.branch(latch)
            body.start(latch)
            body.emit(f"{following} = add i64 {index}, 1")
            body.branch(header)
            body.start(done)

    def _tuple_item(self, tuple_: Tup, index: Any) -> Any:
        """``t[i]`` of a tuple of numbers by a variable index (numba's getitem of a UniTuple: the
        items unified, negative indices from the end, IndexError beyond)."""
        if index is UNKNOWN:
            return UNKNOWN
        if not (isinstance(index, Scal) and index.type.is_int):
            raise self.fail("a tuple indexed by something other than an integer")
        items = tuple_.items
        if not items or not all(isinstance(item, Scal) for item in items):
            raise self.fail("a tuple of values that are not numbers, indexed by a variable")
        common = items[0].type
        for item in items[1:]:
            common = unify(common, item.type)
        if self.dry:
            return Scal(common, "undef")
        body = self.body
        count = len(items)
        table = body.slot(f"[{count} x {common.llvm}]", "tuple")
        for number, item in enumerate(items):
            where = body.value(f"getelementptr [{count} x {common.llvm}], ptr {table}, i64 0, i64 {number}")
            body.emit(f"store {common.llvm} {self._cast(item, common).ref}, ptr {where}")
        position = self._cast(index, INTP)
        if index.type.signed:
            negative = body.value(f"icmp slt i64 {position.ref}, 0")
            wrapped = body.value(f"add i64 {position.ref}, {count}")
            position = Scal(INTP, body.value(f"select i1 {negative}, i64 {wrapped}, i64 {position.ref}"))
        inside = body.value(f"icmp ult i64 {position.ref}, {count}")
        bad, good = body.label("tuple.bad"), body.label("tuple.ok")
        body.cbranch(inside, good, bad)
        body.start(bad)
        body.emit(f"store i32 {STATUS_INDEX}, ptr {self.status_slot}")
        body.branch(self.exit)
        body.start(good)
        where = body.value(f"getelementptr [{count} x {common.llvm}], ptr {table}, i64 0, i64 {position.ref}")
        return Scal(common, body.value(f"load {common.llvm}, ptr {where}"))

    def _zero_check(self, divisor: Scal) -> None:
        """The python error model: a zero divisor leaves with STATUS_ZERO_DIVISION (numba raises
        ZeroDivisionError); the numpy model computes inf / nan (floats) or 0 (integers) instead."""
        if not self.python_errors or self.dry:
            return
        body = self.body
        if divisor.type.kind == "f":
            zero = body.value(f"fcmp oeq {divisor.type.llvm} {divisor.ref}, {float_literal(0.0, divisor.type)}")
        else:
            zero = body.value(f"icmp eq {divisor.type.llvm} {divisor.ref}, 0")
        bad, good = body.label("div.zero"), body.label("div.ok")
        body.cbranch(zero, bad, good)
        body.start(bad)
        body.emit(f"store i32 {STATUS_ZERO_DIVISION}, ptr {self.status_slot}")
        body.branch(self.exit)
        body.start(good)

    def _element(self, array: Arr, index_node: ast.expr) -> tuple[str, list | None]:
        """The address of ``array[index]`` (and, for fewer indices than dimensions, the dimensions
        left: a subarray)."""
        index_nodes = list(index_node.elts) if isinstance(index_node, ast.Tuple) else [index_node]
        indices = [self._expr(e) for e in index_nodes]
        if len(indices) == 1 and isinstance(indices[0], Tup):
            indices = indices[0].items
            index_nodes = []
        if any(i is UNKNOWN for i in indices):
            if self.dry:
                return "undef", ([] if len(indices) >= array.type.ndim else list(range(array.type.ndim - len(indices))))
            raise self.fail("an index of unknown type")
        if len(indices) > array.type.ndim:
            raise self.fail("more indices than dimensions")
        body = self.body
        offset: Scal | None = None
        size = array.type.dtype.size
        strides = array.strides[:len(indices)]
        elements = size > 1 and any(stride.const is None for stride in strides) and \
            all(stride.const is None or int(stride.const) % size == 0 for stride in strides)
        for axis, index in enumerate(indices):
            if not (isinstance(index, Scal) and index.type.is_int):
                raise self.fail("an index that is not an integer (slices and arrays are numba's)")
            position = self._cast(index, INTP)
            if index.type.signed and not (position.const is not None and int(position.const) >= 0) and \
                    not self._never_negative(index_nodes, axis):
                negative = body.value(f"icmp slt i64 {position.ref}, 0")
                wrapped = body.value(f"add i64 {position.ref}, {array.shape[axis].ref}")
                position = Scal(INTP, body.value(f"select i1 {negative}, i64 {wrapped}, i64 {position.ref}"))
            stride = self._element_stride(array.strides[axis], size) if elements else array.strides[axis]
            term = self._int_op("mul", position, stride)
            offset = term if offset is None else self._int_op("add", offset, term)
        if offset is None:
            pointer = array.data
        elif offset.const is not None and int(offset.const) == 0:
            pointer = array.data
        elif elements:
            pointer = body.value(f"getelementptr {array.type.dtype.memory}, ptr {array.data}, i64 {offset.ref}")
        else:
            pointer = body.value(f"getelementptr i8, ptr {array.data}, i64 {offset.ref}")
        remaining = list(range(len(indices), array.type.ndim))
        return pointer, remaining

    def _element_stride(self, stride: Scal, size: int) -> Scal:
        """A byte stride in elements of ``size`` bytes. An array with a stride only known at run time
        is indexed in elements (``getelementptr float, ptr, i64 i * (stride / 4)``), not bytes: LLVM's
        loop vectorizer then checks that element stride for 1 and runs unit strides through vector
        loads; in bytes it checked for a stride of one byte, never true, and read every strided view
        (attention's heads, concat's parts) through gathers. Exact: each entry takes only aligned
        arrays (numpy's ALIGNED: every stride of an axis longer than 1 a multiple of the element's
        alignment, its size on the 64-bit platforms bendc runs on) and the views made inside keep
        multiples; an axis of length 1 is indexed at 0 whatever its stride. A constant stride that
        is not a multiple keeps the array in bytes (_element)."""
        if stride.const is not None:
            return literal(int(stride.const) // size, INTP)
        return Scal(INTP, self.body.value(f"sdiv i64 {stride.ref}, {size}"))

    def _running_stop(self, call: ast.Call, statements: list) -> list[str]:
        """[stop] for ``range(stop)``, ``range(start, stop)`` or ``range(start, stop, step > 0)``
        with a non-negative start and a name ``stop`` the loop's body does not assign: inside the
        body start <= i < stop, so stop is positive there (``oh * wo + ow`` with wo a size computed by
        subtraction indexes without the wraparound select); else []."""
        args = call.args
        stop = args[0] if len(args) == 1 else args[1]
        if not isinstance(stop, ast.Name) or stop.id not in self.bound or stop.id in _assigned_names(statements):
            return []
        if len(args) > 1 and not self._nonneg_here(args[0]):
            return []
        if len(args) == 3 and not (isinstance(args[2], ast.Constant) and isinstance(args[2].value, int)
                                   and not isinstance(args[2].value, bool) and args[2].value > 0):
            return []
        return [stop.id]

    def _nonneg_here(self, node: ast.expr) -> bool:
        """Whether an expression cannot be negative here: nonneg_names, and the stops of the range()
        loops around (_running_stop)."""
        names = self.nonneg | set(self.running) if self.running else self.nonneg
        return _nonneg(node, names, self.bound, self.module.globals)

    def _never_negative(self, index_nodes: list, axis: int) -> bool:
        """Whether the index expression of ``axis`` cannot be negative (_nonneg_here): then numba's
        wraparound select is left out."""
        if axis >= len(index_nodes):
            return False
        return self._nonneg_here(index_nodes[axis])

    def _load(self, dtype: Scalar, pointer: str) -> Scal:
        if self.dry:
            return Scal(dtype, "undef")
        body = self.body
        raw = body.value(f"load {dtype.memory}, ptr {pointer}, align {dtype.size}")
        if dtype == BOOL:
            return Scal(BOOL, body.value(f"icmp ne i8 {raw}, 0"))
        return Scal(dtype, raw)

    def _store(self, dtype: Scalar, pointer: str, value: Scal) -> None:
        if self.dry:
            return
        stored = self._cast(value, dtype)
        ref = stored.ref
        if dtype == BOOL:
            ref = self.body.value(f"zext i1 {ref} to i8")
        self.body.emit(f"store {dtype.memory} {ref}, ptr {pointer}, align {dtype.size}")

    def _e_Call(self, node: ast.Call) -> Any:
        function = self._expr(node.func)
        if function is UNKNOWN:
            return UNKNOWN
        if node.keywords and not (isinstance(function, Obj) and isinstance(function.what, Function)
                                  and function.what.name in ("np.zeros", "np.empty", "np.full")):
            raise self.fail("a call with keyword arguments")
        if not isinstance(function, Obj):
            raise self.fail("calling a value that is not a function")
        what = function.what
        if isinstance(what, tuple) and what[0] == "method":
            return self._method(what[1], what[2], node.args)
        args = [self._expr(a) for a in node.args]
        if any(a is UNKNOWN for a in args):
            if isinstance(what, Function) and what.name.startswith("helper:"):
                return self._helper_unknown(what.name[7:], args)
            return UNKNOWN
        if isinstance(what, DType):
            return self._convert(args, what.scalar)
        if not isinstance(what, Function):
            raise self.fail(f"calling {what}")
        name = what.name
        if name.startswith("helper:"):
            return self._helper(name[7:], args)
        if name == "intrinsic:fma":
            if len(args) != 3 or not all(isinstance(a, Scal) and a.type == FLOAT32 for a in args):
                raise self.fail("bendc_fma of values that are not three float32 numbers")
            return self._call_intrinsic("fma", FLOAT32, args)
        if name == "float":
            return self._convert(args, FLOAT64)
        if name == "int":
            return self._convert(args, INT64)
        if name == "bool":
            if len(args) != 1 or not isinstance(args[0], Scal):
                raise self.fail("bool() of a value that is not a number")
            return Scal(BOOL, self._truth(args[0]))
        if name in ("abs", "np.abs", "np.absolute"):
            return self._abs(args)
        if name in ("min", "max"):
            return self._min_max(name, args)
        if name == "len":
            if len(args) == 1 and isinstance(args[0], Arr):
                return args[0].shape[0]
            if len(args) == 1 and isinstance(args[0], Tup):
                return literal(len(args[0].items), INTP)
            raise self.fail("len() of a value that is not an array")
        if name in ("np.zeros", "np.empty"):
            return self._allocate(node, args, zero=name == "np.zeros")
        if name == "np.full":
            return self._full(node, args)
        if name == "np.dot":
            return self._dot(args)
        if name.startswith("math."):
            return self._math(name[5:], args)
        if name in ("np.isnan", "np.isinf", "np.isfinite") and len(args) == 1 and isinstance(args[0], Scal) \
                and args[0].type.kind == "f":
            return self._math(name[3:], args)
        raise self.fail(f"call of {name}")

    def _helper(self, name: str, args: list) -> Any:
        types = []
        for arg in args:
            if isinstance(arg, Scal):
                types.append(arg.type)
            elif isinstance(arg, Arr):
                types.append(ArrayArg(arg.type.dtype, arg.type.ndim, arg.layout, 0))
            elif isinstance(arg, Obj) and arg.what is None:
                types.append(NONE_ARG)
            else:
                raise self.fail(f"passing {type(arg).__name__} to {name}")
        compiled = self.module.function(name, tuple(types))
        if name in VECTOR_HELPERS and not self.dry:
            compiled = VECTOR_HELPERS[name](self.module, compiled, args) or compiled
        body = self.body
        pieces = []
        for arg, type_ in zip(args, types):
            if type_ == NONE_ARG:
                continue
            if isinstance(arg, Scal):
                pieces.append(f"{type_.llvm} {arg.ref}")
            else:
                pieces.append(f"ptr {arg.data}")
                pieces += [f"i64 {s.ref}" for s in arg.shape]
                if arg.layout != "C":
                    pieces += [f"i64 {s.ref}" for s in arg.strides]
        if compiled.returns == NONE:
            status = body.value(f"call i32 @\"{compiled.name}\"({', '.join(pieces)})")
            self._check_status(status)
            return Obj(None)
        if self.dry:
            if isinstance(compiled.returns, Tuple):
                return Tup([Scal(item, "undef") for item in compiled.returns.items])
            return Scal(compiled.returns, "undef")
        status_slot = body.slot("i32", "hst")
        value = body.value(f"call {compiled.returns.llvm} @\"{compiled.name}\"({', '.join(pieces + [f'ptr {status_slot}'])})")
        self._check_status(body.value(f"load i32, ptr {status_slot}"))
        if isinstance(compiled.returns, Tuple):
            return Tup([Scal(item, body.value(f"extractvalue {compiled.returns.llvm} {value}, {number}"))
                        for number, item in enumerate(compiled.returns.items)])
        return Scal(compiled.returns, value)

    def _helper_unknown(self, name: str, args: list) -> Any:
        return UNKNOWN

    def _check_status(self, status: str) -> None:
        """Leave the function with a callee's failed status."""
        if self.dry:
            return
        body = self.body
        failed = body.value(f"icmp ne i32 {status}, 0")
        bad, good = body.label("status.bad"), body.label("status.ok")
        body.cbranch(failed, bad, good)
        body.start(bad)
        body.emit(f"store i32 {status}, ptr {self.status_slot}")
        body.branch(self.exit)
        body.start(good)

    def _convert(self, args: list, to: Scalar) -> Scal:
        if len(args) != 1 or not isinstance(args[0], Scal):
            raise self.fail(f"{to}() of a value that is not one number")
        return self._cast(args[0], to)

    def _abs(self, args: list) -> Scal:
        if len(args) != 1 or not isinstance(args[0], Scal):
            raise self.fail("abs() of a value that is not a number")
        value = args[0]
        if value.type.kind == "f":
            return self._call_intrinsic("fabs", value.type, [value])
        body = self.body
        if value.type == BOOL:
            value = self._cast(value, INT8)
        if not value.type.signed:
            return value
        negative = body.value(f"icmp slt {value.type.llvm} {value.ref}, 0")
        negated = body.value(f"sub {value.type.llvm} 0, {value.ref}")
        return Scal(value.type, body.value(f"select i1 {negative}, {value.type.llvm} {negated}, "
                                           f"{value.type.llvm} {value.ref}"))

    def _min_max(self, name: str, args: list) -> Scal:
        """builtins min/max of numbers (numba's do_minmax: Python's algorithm, NaN operands included)."""
        if len(args) == 1 and isinstance(args[0], Tup):
            args = args[0].items
        if len(args) < 2 or not all(isinstance(a, Scal) for a in args):
            raise self.fail(f"{name}() of values that are not numbers")
        accumulator = args[0]
        for value in args[1:]:
            common = promote(accumulator.type, value.type)
            acc = self._cast(accumulator, common)
            v = self._cast(value, common)
            pred = self._compare(ast.Gt() if name == "max" else ast.Lt(), v, acc)
            accumulator = Scal(common, self.body.value(f"select i1 {pred.ref}, {common.llvm} {v.ref}, "
                                                        f"{common.llvm} {acc.ref}"))
        return accumulator

    def _math(self, name: str, args: list) -> Scal:
        body = self.body
        if not args or not all(isinstance(a, Scal) for a in args):
            raise self.fail(f"math.{name} of values that are not numbers")
        if name in ("isnan", "isinf", "isfinite"):
            (value,) = args
            if value.type.kind != "f":
                return literal(name == "isfinite", BOOL)
            ty = value.type.llvm
            if name == "isnan":
                return Scal(BOOL, body.value(f"fcmp uno {ty} {value.ref}, {value.ref}"))
            if name == "isinf":
                positive = body.value(f"fcmp oeq {ty} {value.ref}, {float_literal(math.inf, value.type)}")
                negative = body.value(f"fcmp oeq {ty} {value.ref}, {float_literal(-math.inf, value.type)}")
                return Scal(BOOL, body.value(f"or i1 {positive}, {negative}"))
            difference = body.value(f"fsub {ty} {value.ref}, {value.ref}")
            return Scal(BOOL, body.value(f"fcmp ord {ty} {difference}, {difference}"))
        if name in MATH_UNARY:
            if len(args) != 1:
                raise self.fail(f"math.{name} takes one argument")
            how, base, int_result = MATH_UNARY[name]
            value = args[0]
            kind = value.type if value.type.kind == "f" else FLOAT64
            value = self._cast(value, kind)
            if how == "intrinsic":
                result = self._call_intrinsic(base, kind, [value])
            else:
                result = self._call_extern(base, kind, [value])
            return self._cast(result, INT64) if int_result else result
        if name in ("copysign", "atan2", "pow"):
            if len(args) != 2:
                raise self.fail(f"math.{name} takes two arguments")
            a, b = args
            if name == "pow":
                if a.type.kind == "f" and b.type.kind == "f":
                    common = promote(a.type, b.type)
                    return self._call_intrinsic("pow", common, [self._cast(a, common), self._cast(b, common)])
                raise self.fail("math.pow of integers")
            if a.type.kind != "f" or b.type.kind != "f":
                raise self.fail(f"math.{name} of integers")
            common = promote(a.type, b.type)
            a, b = self._cast(a, common), self._cast(b, common)
            if name == "copysign":
                return self._call_intrinsic("copysign", common, [a, b])
            return self._call_extern("atan2", common, [a, b])
        raise self.fail(f"math.{name}")

    def _call_intrinsic(self, name: str, type_: Scalar, args: list) -> Scal:
        suffix = "f32" if type_ == FLOAT32 else "f64"
        symbol = f"llvm.{name}.{suffix}"
        params = ", ".join([type_.llvm] * len(args))
        self.module.declare(symbol, f"declare {type_.llvm} @{symbol}({params})")
        value = self.body.value(f"call {type_.llvm} @{symbol}({', '.join(f'{type_.llvm} {a.ref}' for a in args)})")
        return Scal(type_, value)

    def _call_extern(self, name: str, type_: Scalar, args: list) -> Scal:
        symbol = f"{name}f" if type_ == FLOAT32 else name
        params = ", ".join([type_.llvm] * len(args))
        # numba's cgutils.insert_pure_function: readnone nounwind
        self.module.declare(symbol, f"declare {type_.llvm} @{symbol}({params}) nounwind memory(none)")
        value = self.body.value(f"call {type_.llvm} @{symbol}({', '.join(f'{type_.llvm} {a.ref}' for a in args)})")
        return Scal(type_, value)

    def _method(self, method: str, base: Any, arg_nodes: list) -> Any:
        args = [self._expr(a) for a in arg_nodes]
        if any(a is UNKNOWN for a in args):
            return UNKNOWN
        if isinstance(base, Scal):
            if method == "view" and len(args) == 1 and isinstance(args[0], Obj) and isinstance(args[0].what, DType):
                to = args[0].what.scalar
                if to.size != base.type.size or to == BOOL or base.type == BOOL:
                    raise self.fail("a scalar view as a type of another size")
                if to == base.type:
                    return base
                return Scal(to, self.body.value(f"bitcast {base.type.llvm} {base.ref} to {to.llvm}"))
            raise self.fail(f"method {method} of a number")
        if method == "reshape":
            return self._reshape(base, args)
        raise self.fail(f"array method {method}")

    def _reshape(self, array: Arr, args: list) -> Arr:
        if len(args) == 1 and isinstance(args[0], Tup):
            shape = args[0].items
        else:
            shape = args
        if not shape or not all(isinstance(s, Scal) and s.type.is_int for s in shape):
            raise self.fail("reshape to a shape that is not integers")
        if array.layout != "C":
            raise self.fail("reshape of an array that may not be contiguous (numba refuses it)")
        shape = [self._cast(s, INTP) for s in shape]
        if any(s.const is not None and int(s.const) == -1 for s in shape):
            raise self.fail("reshape with -1")
        new_size = self._size(shape)
        old_size = self._size(array.shape)
        if not self.dry:
            body = self.body
            same = body.value(f"icmp eq i64 {new_size.ref}, {old_size.ref}")
            bad, good = body.label("reshape.bad"), body.label("reshape.ok")
            body.cbranch(same, good, bad)
            body.start(bad)
            body.emit(f"store i32 {STATUS_RESHAPE}, ptr {self.status_slot}")
            body.branch(self.exit)
            body.start(good)
        return Arr(Array(array.type.dtype, len(shape)), "C", array.data, shape,
                   self._c_strides(shape, array.type.dtype.size))

    def _full(self, node: ast.Call, args: list) -> Arr:
        """np.full(shape, value, dtype): an allocation, then the value cast into every element
        (numba's full: dtype default from the value's type)."""
        if node.keywords:
            if len(node.keywords) != 1 or node.keywords[0].arg != "dtype" or len(args) != 2:
                raise self.fail("np.full keywords other than dtype")
            args = args + [self._expr(node.keywords[0].value)]
        if len(args) not in (2, 3) or not isinstance(args[1], Scal):
            raise self.fail("np.full with other than a shape, a number and a dtype")
        dtype = args[2] if len(args) == 3 else Obj(DType(args[1].type if args[1].type != BOOL else BOOL))
        array = self._allocate(node, [args[0], dtype], zero=False, keywords=False)
        self._fill(array, args[1])
        return array

    def _contiguous(self, array: Arr) -> Arr:
        """numba's make_contiguous: an array typed neither C nor F is copied into a new C array."""
        if array.layout in ("C", "F"):
            return array
        copy = self._allocate(None, [Tup(list(array.shape)), Obj(DType(array.type.dtype))], zero=False,
                              keywords=False)
        self._fill(copy, array)
        return copy

    def _dot(self, args: list) -> Arr | None:
        """np.dot of two matrices (into ``out`` when given): numba's dot_2_mm / dot_3_mm, calling
        numba's own BLAS wrappers (numba_xxgemm, numba_xxgemv, numba_xxdot: scipy's BLAS) with the
        same operands, transposes and leading dimensions, so the products are numba's bit for bit;
        except a float32 matrix product, which calls bendc's sgemm with them where it may run
        (_sgemm64: numpy's OpenBLAS gives numba's bits, MKL its own)."""
        if len(args) not in (2, 3) or not all(isinstance(a, Arr) for a in args):
            raise self.fail("np.dot of values that are not arrays")
        a, b = args[0], args[1]
        if a.type.ndim != 2 or b.type.ndim != 2 or (len(args) == 3 and args[2].type.ndim != 2):
            raise self.fail("np.dot of other than two matrices")
        dtypes = {x.type.dtype for x in args}
        if len(dtypes) != 1 or a.type.dtype not in (FLOAT32, FLOAT64):
            raise self.fail("np.dot of other than float32 or float64 matrices of one dtype")
        dtype = a.type.dtype
        a, b = self._contiguous(a), self._contiguous(b)
        m, k = a.shape
        _, n = b.shape
        body = self.body
        if len(args) == 2:
            out = self._allocate(None, [Tup([m, n]), Obj(DType(dtype))], zero=False, keywords=False)
        else:
            out = args[2]
            if out.layout != "C":
                raise self.fail("np.dot into an array not typed C-contiguous (numba refuses it)")
        if self.dry:
            return out if len(args) == 2 else None
        # check_args: k == b's rows, out's shape (m, n)
        same = body.value("and i1 " + body.value(f"icmp eq i64 {k.ref}, {b.shape[0].ref}") + ", "
                          + body.value("and i1 " + body.value(f"icmp eq i64 {out.shape[0].ref}, {m.ref}") + ", "
                                       + body.value(f"icmp eq i64 {out.shape[1].ref}, {n.ref}")))
        self._leave_unless(same, STATUS_DOT_SHAPES)
        limit = (1 << 31) - 1
        for size in (m, k, n):
            self._leave_unless(body.value(f"icmp sle i64 {size.ref}, {limit}"), STATUS_BLAS)
        kind = ord("s" if dtype == FLOAT32 else "d")
        ty = dtype.llvm
        empty = body.value("or i1 " + body.value(f"icmp eq i64 {k.ref}, 0") + ", " + body.value(
            "or i1 " + body.value(f"icmp eq i64 {m.ref}, 0") + ", " + body.value(f"icmp eq i64 {n.ref}, 0")))
        zero_it, work, done = body.label("dot.zero"), body.label("dot.work"), body.label("dot.done")
        body.cbranch(empty, zero_it, work)
        body.start(zero_it)
        self._fill(out, literal(0, dtype))
        body.branch(done)
        body.start(work)
        alpha, beta = body.slot(ty, "alpha"), body.slot(ty, "beta")
        body.emit(f"store {ty} {float_literal(1.0, dtype)}, ptr {alpha}")
        body.emit(f"store {ty} {float_literal(0.0, dtype)}, ptr {beta}")
        for name, signature in (("xxgemm", "i8, i8, i8, i64, i64, i64, ptr, ptr, i64, ptr, i64, ptr, ptr, i64"),
                                ("xxgemv", "i8, i8, i64, i64, ptr, ptr, i64, ptr, ptr, ptr"),
                                ("xxdot", "i8, i8, i64, ptr, ptr, ptr")):
            self.module.declare(f"numba_{name}", f"declare i32 @numba_{name}({signature})")
        right_vector = body.value(f"icmp eq i64 {n.ref}, 1")
        left_vector = body.value(f"icmp eq i64 {m.ref}, 1")
        vv, mv, vm, mm = (body.label(f"dot.{x}") for x in ("vv", "mv", "vm", "mm"))
        r_vec, r_mat = body.label("dot.rvec"), body.label("dot.rmat")
        body.cbranch(right_vector, r_vec, r_mat)
        statuses = []
        body.start(r_vec)
        body.cbranch(left_vector, vv, mv)
        body.start(vv)  # V * V
        statuses.append((vv, body.value(f"call i32 @numba_xxdot(i8 {kind}, i8 0, i64 {k.ref}, ptr {a.data}, "
                                        f"ptr {b.data}, ptr {out.data})")))
        vv_end = body.label("dot.vvend")
        body.branch(vv_end)
        body.start(vv_end)
        statuses[-1] = (vv_end, statuses[-1][1])
        body.branch(done + ".blas")
        body.start(mv)  # M * V: a is the matrix
        statuses.append((mv, self._gemv(kind, a, b.data, out.data, a.layout == out.layout, alpha, beta)))
        body.branch(done + ".blas")
        body.start(r_mat)
        body.cbranch(left_vector, vm, mm)
        body.start(vm)  # V * M: b is the matrix
        statuses.append((vm, self._gemv(kind, b, a.data, out.data, b.layout != out.layout, alpha, beta)))
        body.branch(done + ".blas")
        body.start(mm)  # M * M: numba's call_xxgemm (computing out^T = b^T a^T, column-major)
        def parameters(x: Arr):
            return ("110" if x.layout == out.layout else "116",  # 'n' / 't'
                    (x.shape[1] if x.layout == "C" else x.shape[0]).ref, x.data)
        transa, lda, data_a = parameters(b)
        transb, ldb, data_b = parameters(a)
        ldc = (out.shape[1] if out.layout == "C" else out.shape[0]).ref
        if dtype == FLOAT32:  # bendc's sgemm (runtime/native/blas.py) where it may run, else numba's
            called, mm = self._sgemm64(done + ".blas", (transa, transb), (n.ref, m.ref, k.ref), alpha, beta,
                                       (data_a, lda), (data_b, ldb), (out.data, ldc))
            statuses.append((called, "0"))
        statuses.append((mm, body.value(
            f"call i32 @numba_xxgemm(i8 {kind}, i8 {transa}, i8 {transb}, i64 {n.ref}, i64 {m.ref}, i64 {k.ref}, "
            f"ptr {alpha}, ptr {data_a}, i64 {lda}, ptr {data_b}, i64 {ldb}, ptr {beta}, ptr {out.data}, i64 {ldc})")))
        body.branch(done + ".blas")
        body.start(done + ".blas")
        status = body.value("phi i32 " + ", ".join(f"[{value}, %{label}]" for label, value in statuses))
        self._leave_unless(body.value(f"icmp eq i32 {status}, 0"), STATUS_BLAS)
        body.branch(done)
        body.start(done)
        return out if len(args) == 2 else None

    def _sgemm64(self, finish: str, transposes: tuple, sizes: tuple, alpha: str, beta: str, a: tuple, b: tuple,
                 c: tuple) -> tuple[str, str]:
        """Where bendc's sgemm was found (``@bendc_sgemm64``, its address or 0: runtime/native/blas.py,
        MKL's or numpy's OpenBLAS, ILP64) and may run here (``@bendc_sgemm64_any_thread``, or
        numba's thread count is 1), call it with the operands numba_xxgemm would take (Fortran's
        sgemm: every argument by address, 64-bit integers) and go to ``finish``; else go on in a new
        block (numba's call: scipy's OpenBLAS, held to one thread inside the pool). Returns (the
        calling block, the new block, where the body now is). numpy's OpenBLAS is numba's (scipy's)
        one release later: the same kernels, the same bits (600 random shapes compared), ~20% faster
        on conv2d's per-sample (64, 288) @ (288, 576); MKL (sequential) ~1.2-1.3x faster again, on
        its own bits, and the same library at any thread count."""
        body = self.body
        self.module.declare("bendc_sgemm64", "@bendc_sgemm64 = external global i64")
        self.module.declare("bendc_sgemm64_any_thread", "@bendc_sgemm64_any_thread = external global i64")
        self.module.declare("get_num_threads", "declare i32 @get_num_threads()")
        address = body.value("load i64, ptr @bendc_sgemm64")
        found = body.value(f"icmp ne i64 {address}, 0")
        anywhere = body.value("load i64, ptr @bendc_sgemm64_any_thread")
        threads = body.value("call i32 @get_num_threads()")
        one = body.value(f"icmp eq i32 {threads}, 1")
        pooled = body.value(f"icmp ne i64 {anywhere}, 0")
        here = body.value(f"or i1 {one}, {pooled}")
        call, otherwise = body.label("dot.sgemm"), body.label("dot.sgemm.no")
        body.cbranch(body.value(f"and i1 {found}, {here}"), call, otherwise)
        body.start(call)
        characters = []
        for code in transposes:
            slot = body.slot("i8", "trans")
            body.emit(f"store i8 {code}, ptr {slot}")
            characters.append(slot)
        integers = []
        for value in sizes + (a[1], b[1], c[1]):
            slot = body.slot("i64", "blas")
            body.emit(f"store i64 {value}, ptr {slot}")
            integers.append(slot)
        (m, n, k, lda, ldb, ldc) = integers
        function = body.value(f"inttoptr i64 {address} to ptr")
        body.emit(f"call void {function}(ptr {characters[0]}, ptr {characters[1]}, ptr {m}, ptr {n}, ptr {k}, "
                  f"ptr {alpha}, ptr {a[0]}, ptr {lda}, ptr {b[0]}, ptr {ldb}, ptr {beta}, ptr {c[0]}, ptr {ldc}, "
                  f"i64 1, i64 1)")  # (the characters' lengths, as gfortran passes them)
        body.branch(finish)
        body.start(otherwise)
        return call, otherwise

    def _gemv(self, kind: int, matrix: Arr, vector: str, out: str, transpose: bool, alpha: str, beta: str) -> str:
        """numba's call_xxgemv."""
        if matrix.layout == "F":
            m, n = matrix.shape
            lda = matrix.shape[0]
        else:
            n, m = matrix.shape
            lda = matrix.shape[1]
        trans = ord("t") if transpose else ord("n")
        return self.body.value(f"call i32 @numba_xxgemv(i8 {kind}, i8 {trans}, i64 {m.ref}, i64 {n.ref}, ptr {alpha}, "
                               f"ptr {matrix.data}, i64 {lda.ref}, ptr {vector}, ptr {beta}, ptr {out})")

    def _leave_unless(self, condition: str, status: int) -> None:
        """Leave the function with ``status`` where ``condition`` (an i1) is false."""
        body = self.body
        bad, good = body.label("check.bad"), body.label("check.ok")
        body.cbranch(condition, good, bad)
        body.start(bad)
        body.emit(f"store i32 {status}, ptr {self.status_slot}")
        body.branch(self.exit)
        body.start(good)

    def _allocate(self, node: ast.Call | None, args: list, zero: bool, keywords: bool = True) -> Arr:
        if keywords and node is not None and node.keywords:
            if len(node.keywords) != 1 or node.keywords[0].arg != "dtype" or len(args) != 1:
                raise self.fail("np.zeros / np.empty keywords other than dtype")
            args = args + [self._expr(node.keywords[0].value)]
        if not 1 <= len(args) <= 2:
            raise self.fail("np.zeros / np.empty with other than a shape and a dtype")
        shape_value = args[0]
        shape = shape_value.items if isinstance(shape_value, Tup) else [shape_value]
        if not all(isinstance(s, Scal) and s.type.is_int for s in shape):
            raise self.fail("an allocation whose shape is not integers")
        dtype = FLOAT64
        if len(args) == 2:
            if not (isinstance(args[1], Obj) and isinstance(args[1].what, DType)):
                raise self.fail("an allocation whose dtype is not a numpy type")
            dtype = args[1].what.scalar
        shape = [self._cast(s, INTP) for s in shape]
        size = self._size(shape)
        body = self.body
        if self.dry:
            return Arr(Array(dtype, len(shape)), "C", "undef", shape, self._c_strides(shape, dtype.size))
        nbytes = self._int_op("mul", size, literal(dtype.size, INTP))
        at_least_one = body.value(f"select i1 " + body.value(f"icmp sgt i64 {nbytes.ref}, 0") +
                                  f", i64 {nbytes.ref}, i64 1")
        # One holder per allocation site: in a loop, the array of the previous iteration is freed
        # when the next is made (the name it was bound to is rebound, as numba's reference count
        # would free it), the last one at the function's exit.
        self.module.declare("free", "declare void @free(ptr) nounwind")
        holder = body.slot("ptr", "owned")
        body.allocas.append(f"  store ptr null, ptr {holder}")
        self._owned_holders.append(holder)
        previous = body.value(f"load ptr, ptr {holder}")
        body.emit(f"call void @free(ptr {previous})")
        body.emit(f"store ptr null, ptr {holder}")
        if zero:
            self.module.declare("calloc", "declare noalias ptr @calloc(i64, i64) nounwind")
            pointer = body.value(f"call ptr @calloc(i64 {at_least_one}, i64 1)")
        else:
            self.module.declare("malloc", "declare noalias ptr @malloc(i64) nounwind")
            pointer = body.value(f"call ptr @malloc(i64 {at_least_one})")
        failed = body.value(f"icmp eq ptr {pointer}, null")
        bad, good = body.label("alloc.bad"), body.label("alloc.ok")
        body.cbranch(failed, bad, good)
        body.start(bad)
        body.emit(f"store i32 {STATUS_MEMORY}, ptr {self.status_slot}")
        body.branch(self.exit)
        body.start(good)
        body.emit(f"store ptr {pointer}, ptr {holder}")
        return Arr(Array(dtype, len(shape)), "C", pointer, shape, self._c_strides(shape, dtype.size))

    # ---------------------------------------------------------------- arithmetic helpers
    def _size(self, shape: list) -> Scal:
        size = literal(1, INTP)
        for dim in shape:
            size = self._int_op("mul", size, self._cast(dim, INTP))
        return size

    def _int_op(self, op: str, a: Scal, b: Scal) -> Scal:
        """i64 arithmetic of sizes and offsets, folded when both are constants."""
        if a.const is not None and b.const is not None:
            x, y = int(a.const), int(b.const)
            return literal({"mul": x * y, "add": x + y, "sub": x - y}[op], INTP)
        if op == "mul":
            if a.const is not None and int(a.const) == 1:
                return b
            if b.const is not None and int(b.const) == 1:
                return a
        if op == "add":
            if a.const is not None and int(a.const) == 0:
                return b
            if b.const is not None and int(b.const) == 0:
                return a
        return Scal(INTP, self.body.value(f"{op} i64 {a.ref}, {b.ref}"))

    def _truth(self, value: Any) -> str:
        """An i1: the value's truth as Python (numba) sees it."""
        if not isinstance(value, Scal):
            raise self.fail("the truth of a value that is not a number")
        if value.type == BOOL:
            return value.ref
        body = self.body
        if value.type.kind == "f":
            return body.value(f"fcmp une {value.type.llvm} {value.ref}, {float_literal(0.0, value.type)}")
        return body.value(f"icmp ne {value.type.llvm} {value.ref}, 0")

    def _cast(self, value: Scal, to: Scalar) -> Scal:
        """numba's context.cast between number types (numba/core/base.py, numbers.py)."""
        source = value.type
        if source == to:
            return value
        if value.const is not None:
            if to == BOOL:
                return literal(bool(value.const), BOOL)
            if source.kind == "f" and to.kind != "f":
                if not math.isfinite(float(value.const)):
                    pass  # LLVM's poison for out-of-range conversions: computed below
                else:
                    return literal(int(float(value.const)), to) if _fits(int(float(value.const)), to) else \
                        self._cast(Scal(source, value.ref), to)
            elif source.kind != "f" or to.kind == "f":
                return literal(value.const if source.kind == "f" else int(value.const), to)
        body = self.body
        if to == BOOL:
            return Scal(BOOL, self._truth(value))
        if source.kind == "f" and to.kind == "f":
            op = "fpext" if to.bits > source.bits else "fptrunc"
            return Scal(to, body.value(f"{op} {source.llvm} {value.ref} to {to.llvm}"))
        if source.kind == "f":
            op = "fptosi" if to.signed else "fptoui"
            return Scal(to, body.value(f"{op} {source.llvm} {value.ref} to {to.llvm}"))
        if to.kind == "f":
            op = "sitofp" if source.kind == "i" else "uitofp"
            return Scal(to, body.value(f"{op} {source.llvm} {value.ref} to {to.llvm}"))
        # integer to integer
        from_bits = 1 if source == BOOL else source.bits
        if to.bits == from_bits:
            return Scal(to, value.ref)
        if to.bits < from_bits:
            return Scal(to, body.value(f"trunc {source.llvm} {value.ref} to {to.llvm}"))
        op = "sext" if source.kind == "i" else "zext"
        return Scal(to, body.value(f"{op} {source.llvm} {value.ref} to {to.llvm}"))


def _fits(number: int, to: Scalar) -> bool:
    if to.kind == "u":
        return 0 <= number < (1 << to.bits)
    if to.kind == "i":
        return -(1 << (to.bits - 1)) <= number < (1 << (to.bits - 1))
    return True


def remaining_array(array: Arr, pointer: str, used: int) -> Arr:
    """The subarray ``array[i, j]`` of the dimensions after the first ``used`` (layout: numba's rule)."""
    layout = _index_layout(array.layout, ["integer"] * used, array.type.ndim)
    return Arr(Array(array.type.dtype, array.type.ndim - used), layout, pointer, array.shape[used:],
               array.strides[used:])


def _same_kind(a: Any, b: Any) -> bool:
    return type(a) is type(b)


def _load(target: ast.expr) -> ast.expr:
    """The expression reading an assignment target (for ``x += y``)."""
    copy = ast.parse(ast.unparse(target), mode="eval").body
    return copy


def _decorator_options(node: ast.FunctionDef) -> dict:
    """The keyword options of an ``@njit(...)`` decorator (literals only)."""
    for decorator in node.decorator_list:
        if isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Name) and decorator.func.id == "njit":
            options = {}
            for keyword in decorator.keywords:
                if isinstance(keyword.value, ast.Constant):
                    options[keyword.arg] = keyword.value.value
            return options
        if isinstance(decorator, ast.Name) and decorator.id == "njit":
            return {}
    raise Unsupported(f"{node.name} is not an @njit function")


def _assigned_names(statements: Sequence[ast.stmt]) -> set[str]:
    names = set()
    for statement in statements:
        for node in ast.walk(statement):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return names


def _read_names(statements: Sequence[ast.stmt]) -> set[str]:
    names = set()
    for statement in statements:
        for node in ast.walk(statement):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                names.add(node.id)
            if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
    return names


def _assigned_before_read(statements: Sequence[ast.stmt], name: str) -> bool:
    """Whether the first statement of ``statements`` (at the top level) that mentions ``name``
    assigns it without reading it: then every iteration defines it before any use (a private)."""
    for statement in statements:
        stores = any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store)
                     for n in ast.walk(statement))
        loads = name in _read_names([statement])
        if isinstance(statement, ast.Assign) and stores and not loads:
            return True
        if stores or loads:
            return False
    return False


def _index_layout(layout: str, kinds: list[str], ndim: int) -> str:
    """numba's layout of ``a[indices]`` (arraydecl.get_array_index_type, no ellipsis): integers and
    an unstrided slice as the innermost index given keep C (from the left) or F (all indices given,
    read from the right) contiguity; anything else is A."""
    def keeps(kind: str, innermost: bool) -> bool:
        return kind == "integer" or (innermost and kind == "slice")

    def contiguous(indices: list[str]) -> bool:
        return all(keeps(k, False) for k in indices[:-1]) and (not indices or keeps(indices[-1], True))

    if layout == "C":
        return "C" if contiguous(kinds) else "A"
    if layout == "F":
        return "F" if len(kinds) == ndim and contiguous(kinds[::-1]) else "A"
    return layout


def _has_slice(index: ast.expr) -> bool:
    elements = index.elts if isinstance(index, ast.Tuple) else [index]
    return any(isinstance(element, ast.Slice) for element in elements)


def _has_prange(node: ast.FunctionDef) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "prange" for n in ast.walk(node))
