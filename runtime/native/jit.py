"""Native kernels: LLVM compiles of translated functions (runtime/native/translate.py), cached,
signed and loaded without numba's pipeline.

A generated kernel module's njit functions that Python code calls (``kernel``, or the njit body a
Python wrapper calls) become :class:`NativeFunction` objects when the module is imported
(runtime/artifact.py ``load_module``). Each specialization (numba's type of every argument: dtype,
rank, layout) is translated to LLVM IR, optimized as numba optimizes (the O3 pipeline with loop
vectorization, no SLP; the host CPU's features, no fastmath), except that loops are not interleaved
(``_Llvm.compile``), and compiled to an object file, which is loaded into one MCJIT engine per
process and called through ctypes. The object file is cached
beside numba's files of the same module (``kernels/__pycache__``, or an artifact's ``numba/``
folder: runtime/machine.py), named by what determines it (module, function, signature, translator,
host CPU) and signed like numba's (an HMAC ``.sig``; an artifact's by its manifest's sha256), so a
second process loads it instead of compiling.

A function the translator does not cover (``Unsupported``) is numba's, as before: the object is a
thin front that hands every call to numba's dispatcher. ``BENDC_NATIVE=0`` keeps every function
numba's. ``BENDC_NATIVE_CHECK=1`` runs numba beside every native call and raises on the first bit
that differs (the translator's test mode).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from runtime.native import blas
from runtime.native import translate as _translate
from runtime.native.translate import NONE_ARG, ArrayArg, ModuleTranslator
from runtime.native.types import BOOL, FLOAT32, FLOAT64, INT64, SCALARS, Array, Scalar, Unsupported, scalar_of

NATIVE_SUFFIX = ".native.o"
# Called with (module, function) after each native compile or load from the cache, as numba's
# ``numba:compile`` event is: bendc/progress.py counts them.
COMPILE_LISTENERS: list[Callable[[str, str], None]] = []


def enabled() -> bool:
    return os.environ.get("BENDC_NATIVE", "1") != "0"


def _environment_lookup(name: str) -> Callable[[], Any]:
    """A function returning ``name``'s current value in os.environ in its stored form (or None),
    read on every call: os.environ's own mapping (``_data``, what ``os.environ[...] = ...`` and
    monkeypatch.setenv update) keyed as os.environ keys it, ~0.05 us against ~0.7 us for
    ``os.environ.get`` (its key and value codecs). Every native call asks whether it is checked:
    153 calls a step of the transformer were ~0.1 ms (2%). Where that mapping is missing, the
    plain lookup."""
    data, encode = getattr(os.environ, "_data", None), getattr(os.environ, "encodekey", None)
    if not isinstance(data, dict) or encode is None:
        return lambda: os.environ.get(name)
    key = encode(name)
    return functools.partial(data.get, key)


_CHECK_VALUE = _environment_lookup("BENDC_NATIVE_CHECK")
_CHECK_ON = {"1", os.environ.encodevalue("1") if hasattr(os.environ, "encodevalue") else "1"}


def checking() -> bool:
    """BENDC_NATIVE_CHECK=1, as the environment says now."""
    return _CHECK_VALUE() in _CHECK_ON


def same_bits(native: np.ndarray, reference: np.ndarray) -> bool:
    """BENDC_NATIVE_CHECK's comparison: every element's bytes equal, except that a NaN matches any
    NaN. IEEE 754 leaves the sign and payload of an operation's NaN result unspecified where an
    operand is NaN (x86 returns the first NaN operand's; LLVM may fold or commute ``x * nan``
    differently in two compiles of the same source), so no two compilers promise them; +0.0 and
    -0.0 still differ."""
    a, b = np.ascontiguousarray(native).reshape(-1), np.ascontiguousarray(reference).reshape(-1)
    if native.shape != reference.shape or a.dtype != b.dtype:
        return False
    if a.size == 0:
        return True
    equal = (a.view(np.uint8).reshape(a.size, -1) == b.view(np.uint8).reshape(b.size, -1)).all(1)
    if equal.all():
        return True
    return a.dtype.kind in "fc" and bool((equal | (np.isnan(a) & np.isnan(b))).all())


class NativeError(Exception):
    """A native kernel failed a check numba would have raised for (a reshape of the wrong size)."""


# ------------------------------------------------------------------ numpy's struct, measured
@functools.lru_cache(maxsize=None)
def numpy_offsets() -> dict[str, int]:
    """Byte offsets of PyArrayObject's and PyArray_Descr's fields, found by reading real objects
    (numpy's ABI fixes them; measuring them keeps a different Python build honest)."""
    def words(obj: Any, count: int = 16) -> list[int]:
        raw = ctypes.string_at(id(obj), count * 8)
        return [int.from_bytes(raw[k * 8:(k + 1) * 8], "little") for k in range(count)]

    def int32s(obj: Any, count: int = 32) -> list[int]:
        raw = ctypes.string_at(id(obj), count * 4)
        return [int.from_bytes(raw[k * 4:(k + 1) * 4], "little", signed=True) for k in range(count)]

    a = np.empty((3, 5), np.float32)
    b = np.empty((2, 3, 7), np.int64)[:, ::2]
    found: dict[str, int] = {}
    wa, wb = words(a), words(b)
    found["ob_type"] = next(8 * k for k in range(4) if wa[k] == id(np.ndarray) and wb[k] == id(np.ndarray))
    found["data"] = next(8 * k for k in range(16) if wa[k] == a.ctypes.data and wb[k] == b.ctypes.data)
    found["descr"] = next(8 * k for k in range(16) if wa[k] == id(a.dtype) and wb[k] == id(b.dtype))
    ia, ib = int32s(a), int32s(b)
    found["nd"] = next(4 * k for k in range(32) if ia[k] == 2 and ib[k] == 3 and 4 * k > found["data"])

    def pointer_to(values: Sequence[int], obj: Any, ws: list[int]) -> int | None:
        for k in range(16):
            address = ws[k]
            if address < 4096 or 8 * k <= found["nd"]:
                continue
            try:
                raw = ctypes.string_at(address, 8 * len(values))
            except Exception:  # noqa: BLE001
                continue
            if [int.from_bytes(raw[i * 8:(i + 1) * 8], "little", signed=True) for i in range(len(values))] == \
                    list(values):
                return 8 * k
        return None

    found["dimensions"] = pointer_to(a.shape, a, wa)
    found["strides"] = pointer_to(a.strides, a, wa)
    if pointer_to(b.shape, b, wb) != found["dimensions"] or pointer_to(b.strides, b, wb) != found["strides"]:
        raise RuntimeError("numpy's array struct could not be measured")
    flags_a, flags_b = a.flags.num, b.flags.num
    found["flags"] = next(4 * k for k in range(32) if ia[k] == flags_a and ib[k] == flags_b
                          and 4 * k > found["descr"])
    descr_ints = [int32s(np.dtype(t), 16) for t in ("float32", "int64", "bool", "float64", "int32")]
    nums = [np.dtype(t).num for t in ("float32", "int64", "bool", "float64", "int32")]
    found["type_num"] = next(4 * k for k in range(4, 16) if all(d[k] == n for d, n in zip(descr_ints, nums)))
    return found


# ------------------------------------------------------------------ LLVM
_LOCK = threading.RLock()


class _Llvm:
    """The process's LLVM state: the target machine, one MCJIT engine all objects load into."""

    def __init__(self) -> None:
        import llvmlite.binding as llvm

        self.llvm = llvm
        try:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
        except RuntimeError:  # numba initialized them already
            pass
        target = llvm.Target.from_default_triple()
        self.triple = llvm.get_process_triple()
        self.cpu = os.environ.get("NUMBA_CPU_NAME") or llvm.get_host_cpu_name()
        features = os.environ.get("NUMBA_CPU_FEATURES")
        if features is None:
            try:
                features = llvm.get_host_cpu_features().flatten()
            except RuntimeError:
                features = ""
        self.features = features
        self.target = target
        # LLVM keeps loops to 256-bit vectors on AVX-512 CPUs unless a function prefers 512: without
        # reassociation a vector's lanes are independent elements, so the width changes speed only.
        self.vector_width = 512 if "+avx512f" in features.split(",") else 0
        self.local = threading.local()  # a target machine per thread that compiles
        self.machine = self._machine()
        self.data_layout = str(self.machine.target_data)
        # The ndarray type object every entry compares its arguments' types with.
        self._ndarray = ctypes.c_void_p(id(np.ndarray))
        llvm.add_symbol("bendc_ndarray_type", ctypes.addressof(self._ndarray))
        self._none = ctypes.c_void_p(id(None))  # what an argument compiled as None must be
        llvm.add_symbol("bendc_none", ctypes.addressof(self._none))
        self._type_error = ctypes.c_void_p(id(TypeError))  # what a fast entry raises for a wrong count
        llvm.add_symbol("bendc_type_error", ctypes.addressof(self._type_error))
        from numba import _helperlib

        for name, address in _helperlib.c_helpers.items():  # numba's BLAS wrappers (np.dot), as numba adds them
            llvm.add_symbol(f"numba_{name}", address)
        # np.dot's float32 product (translate.py _sgemm64): runtime/native/blas.py's ILP64 sgemm, and
        # whether it may run inside the pool (1) or at one thread only (0)
        chosen = blas.sgemm()
        self.sgemm64 = ctypes.c_int64(chosen.address if chosen.ilp64 else 0)
        self.sgemm64_any_thread = ctypes.c_int64(int(chosen.any_thread))
        llvm.add_symbol("bendc_sgemm64", ctypes.addressof(self.sgemm64))
        llvm.add_symbol("bendc_sgemm64_any_thread", ctypes.addressof(self.sgemm64_any_thread))
        self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), self.machine)

    def _machine(self) -> Any:
        machine = getattr(self.local, "machine", None)
        if machine is None:
            machine = self.target.create_target_machine(cpu=self.cpu, features=self.features, opt=3, reloc="static",
                                                        codemodel="jitdefault", jit=True)
            self.local.machine = machine
        return machine

    @property
    def fingerprint(self) -> str:
        import llvmlite

        return f"{llvmlite.__version__}|{self.triple}|{self.cpu}|{self.features}"

    def compile(self, text: str) -> bytes:
        """Optimize (numba's pipeline: O3, loop vectorization, no SLP; and no interleaving) and compile to
        an object file."""
        llvm = self.llvm
        machine = self._machine()
        if self.vector_width:
            text = _prefer_vector_width(text, self.vector_width)
        text = interleaved(text, self.vector_width)
        module = llvm.parse_assembly(text)
        module.triple = self.triple
        module.data_layout = self.data_layout
        module.verify()
        options = llvm.create_pipeline_tuning_options(speed_level=3)
        options.loop_vectorization = True
        options.slp_vectorization = False
        # No interleaving: LLVM would run a 512-bit loop 4 vectors (64 floats) an iteration and
        # leave shorter trip counts to a 256-bit epilogue and a scalar remainder. bendc's rows are
        # mostly 16 to 512 floats (a fused small attention head's rows of 16, 32, 48 or 64 went
        # through 128-bit and 256-bit epilogues); without interleaving every multiple of 16 runs
        # in 512-bit vectors. The bits are the same (no reassociation either way). Measured as the
        # fastest of 30 steps, in alternating processes (3 each, 1 thread): gpt 43.5/44.8/42.6 ms
        # against 44.2/45.3/47.2, transformer 7.6/7.7/9.6 against 8.4/8.3/8.1, gpt_small
        # 9.9/9.9/9.9 against 10.1/10.5/10.5; mlp, cnn and mnist_cnn within this machine's noise.
        options.loop_interleaving = False
        builder = llvm.create_pass_builder(machine, options)
        builder.getModulePassManager().run(module, builder)
        dump = os.environ.get("BENDC_NATIVE_DUMP")
        if dump:  # the IR before and after optimization, and the assembly (to read what LLVM made of it)
            os.makedirs(dump, exist_ok=True)
            name = hashlib.sha256(text.encode()).hexdigest()[:12]
            for suffix, content in ((".ll", text), (".opt.ll", str(module)), (".s", machine.emit_assembly(module))):
                with open(os.path.join(dump, name + suffix), "w") as stream:
                    stream.write(content)
        return machine.emit_object(module)

    def load(self, data: bytes, symbol: str) -> int:
        with _LOCK:
            self.engine.add_object_file(self.llvm.ObjectFileRef.from_data(data))
            self.engine.finalize_object()
            return self.engine.get_function_address(symbol)

    def address(self, symbol: str) -> int:
        with _LOCK:
            return self.engine.get_function_address(symbol)


def _copies_keeping_aliases(args: Sequence[Any]) -> list:
    """Copies of the array arguments that alias each other as the arguments do (an output written
    over a donated input, views of one buffer): each C-contiguous base array copied once and the
    arguments viewed into its copy at the same offsets and strides; other arrays copied alone."""
    bases: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    copies = []
    for a in args:
        if not isinstance(a, np.ndarray):
            copies.append(a)
            continue
        base = a
        while isinstance(base.base, np.ndarray):
            base = base.base
        if not base.flags.c_contiguous or base.dtype.hasobject:
            copies.append(np.array(a, copy=True))
            continue
        if id(base) not in bases:
            bases[id(base)] = (base, np.array(base, copy=True))
        original, copy = bases[id(base)]
        offset = a.__array_interface__["data"][0] - original.__array_interface__["data"][0]
        copies.append(np.ndarray(a.shape, a.dtype, buffer=copy.reshape(-1).view(np.uint8), offset=offset,
                                 strides=a.strides))
    return copies


class _MethodDef(ctypes.Structure):
    """CPython's PyMethodDef."""

    _fields_ = [("ml_name", ctypes.c_char_p), ("ml_meth", ctypes.c_void_p), ("ml_flags", ctypes.c_int),
                ("ml_doc", ctypes.c_char_p)]


METH_FASTCALL = 0x0080
_DEFINITIONS: list[_MethodDef] = []  # kept alive as long as the process: the functions point at them


def _builtin_function(address: int, name: str) -> Any:
    """A CPython builtin function over a METH_FASTCALL entry (translate.ModuleTranslator._fastcall)."""
    definition = _MethodDef(name.encode(), address, METH_FASTCALL, None)
    _DEFINITIONS.append(definition)
    new = ctypes.pythonapi.PyCFunction_NewEx
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return new(ctypes.addressof(definition), None, None)


_STATE: list[_Llvm] = []


def llvm_state() -> _Llvm:
    """The process's LLVM state, made once (by whichever thread asks first)."""
    if not _STATE:
        with _LOCK:
            if not _STATE:
                _STATE.append(_Llvm())
    return _STATE[0]


def interleaved(text: str, vector_width: int) -> str:
    """``text`` with each loop the translator marked (translate.py INTERLEAVE_CONSTANT: an innermost
    loop calling the kit's float32 math, the count its module asks) given LLVM's interleave count:
    the asked count where vectors are 256 bits wide or narrower, 1 (none) on AVX-512, where the loops
    run 512-bit vectors (``vector_width``) and no interleaving was measured fastest (``compile``;
    interleaving these loops alone has not been measured there). Measured on a 2-vCPU AMD EPYC (Zen 3,
    AVX2), 1 thread: gelu's forward over 1024 x 512 floats 1.00 -> 0.65 ms at 4 vectors an iteration
    (0.85 at 2), e^x 0.39 -> 0.29 ms."""
    import re

    def count(match: re.Match) -> str:
        asked = int(match.group(1))
        return f'!{{!"llvm.loop.interleave.count", i32 {1 if vector_width >= 512 else asked}}}'
    return re.sub(r'!\{!"' + re.escape(_translate.INTERLEAVE_METADATA) + r'", i32 (\d+)\}', count, text)


def _prefer_vector_width(text: str, width: int) -> str:
    """Every function defined in ``text`` marked "prefer-vector-width"=width."""
    import re

    marked = re.sub(r"^(define .*\))\s*\{\s*$", r"\1 #901 {", text, flags=re.M)
    return marked + f'\nattributes #901 = {{ "prefer-vector-width"="{width}" }}\n'


@functools.lru_cache(maxsize=None)
def translator_version() -> str:
    """A hash of the translator's own source: a changed translator never loads an older object."""
    digest = hashlib.sha256()
    folder = os.path.dirname(os.path.abspath(__file__))
    for name in ("types.py", "translate.py", "jit.py"):
        with open(os.path.join(folder, name), "rb") as stream:
            digest.update(stream.read())
    return digest.hexdigest()[:16]


# ------------------------------------------------------------------ signatures
def native_type(numba_type: Any) -> Any:
    """The translator's type for numba's type of an argument (None: not one it compiles)."""
    from numba.core import types as nt

    if isinstance(numba_type, nt.Array):
        if not numba_type.aligned or numba_type.layout not in ("C", "A", "F"):
            return None
        try:
            dtype = scalar_of(numba_type.dtype.name if numba_type.dtype != nt.boolean else "bool")
        except Unsupported:
            return None
        layout = "C" if numba_type.layout == "C" else "A"
        return ArrayArg(dtype, numba_type.ndim, layout, np.dtype(dtype.name).num)
    if isinstance(numba_type, nt.NoneType):
        return NONE_ARG
    if isinstance(numba_type, nt.Boolean):
        return BOOL
    if isinstance(numba_type, (nt.Integer, nt.Float)):
        return SCALARS.get(numba_type.name)
    return None


def _ctypes_of(arg: Any) -> Any:
    if isinstance(arg, ArrayArg) or arg == NONE_ARG:
        return ctypes.py_object
    return {"float32": ctypes.c_float, "float64": ctypes.c_double, "bool": ctypes.c_int8, "int8": ctypes.c_int8,
            "int16": ctypes.c_int16, "int32": ctypes.c_int32, "int64": ctypes.c_int64, "uint8": ctypes.c_uint8,
            "uint16": ctypes.c_uint16, "uint32": ctypes.c_uint32, "uint64": ctypes.c_uint64}[arg.name]


# ------------------------------------------------------------------ the function object
@dataclass
class _Stats:
    """numba's dispatcher stats, summed over the native and the numba compiles (compile_counts)."""

    cache_hits: Counter = field(default_factory=Counter)
    cache_misses: Counter = field(default_factory=Counter)


@dataclass
class NativeCompile:
    """What compiling one specialization took (the compile profile)."""

    translate: float = 0.0
    llvm: float = 0.0
    load: float = 0.0
    cached: bool = False
    native: bool = True
    reason: str = ""


class NativeFunction:
    """An njit function of a generated module, compiled natively where the translator can (see the
    module docstring), else by numba. Called as the numba dispatcher would be."""

    def __init__(self, dispatcher: Any, module_name: str, source: str, source_path: str,
                 numba_functions: set[str]) -> None:
        self.dispatcher = dispatcher
        self.py_func = dispatcher.py_func
        self.__name__ = self.py_func.__name__
        self.__qualname__ = self.py_func.__qualname__
        self.__module__ = self.py_func.__module__
        self.targetoptions = dict(getattr(dispatcher, "targetoptions", {}))
        self.module_name = module_name
        self.source = source
        self.source_path = source_path
        self.numba_functions = numba_functions
        self.fast: Callable | None = None         # the first native specialization's ctypes function
        self.specializations: dict[tuple, Any] = {}  # numba signature -> ctypes function, or None (numba's)
        self.native_overloads: dict[tuple, Any] = {}
        self._native_stats = _Stats()
        self.compiles: dict[tuple, NativeCompile] = {}
        self.objects: dict[tuple, str] = {}  # signature -> its object file's name in the cache
        self.fastcalls: dict[tuple, Any] = {}  # signature -> a builtin function over its entry (arrays only)

    def __repr__(self) -> str:
        return f"<native {self.module_name}.{self.__name__}>"

    # numba's dispatcher surface that bendc reads (compile_pool, machine.compile_counts)
    @property
    def overloads(self) -> dict:
        return {**self.dispatcher.overloads, **self.native_overloads}

    @property
    def signatures(self) -> list:
        return list(self.overloads)

    @property
    def stats(self) -> _Stats:
        numba_stats = self.dispatcher.stats
        return _Stats(Counter(numba_stats.cache_hits) + self._native_stats.cache_hits,
                      Counter(numba_stats.cache_misses) + self._native_stats.cache_misses)

    def get_metadata(self, signature: tuple) -> dict:
        return self.dispatcher.get_metadata(signature)

    @property
    def launcher(self) -> Callable:
        """What a launch list calls: the native entry itself where one is compiled, as a builtin
        function (None, or a status: a code :meth:`status_error` explains) or through ctypes (0 or a
        status), else this object (None)."""
        if self.fast is not None and not checking():
            first = next(signature for signature, function in self.native_overloads.items() if function is self.fast)
            return self.fastcalls.get(first, self.fast)
        return self

    # ---------------------------------------------------------------- calls
    def __call__(self, *args: Any) -> Any:
        fast = self.fast
        if fast is not None and not checking():
            try:
                status = fast(*args)
            except (TypeError, ctypes.ArgumentError):
                status = _translate.STATUS_SIGNATURE
            if status == 0:
                return None
            if status != _translate.STATUS_SIGNATURE:
                raise self.status_error(status)
        return self._slow(args)

    def _slow(self, args: Sequence[Any]) -> Any:
        from numba.core.typing.typeof import Purpose, typeof

        try:
            signature = tuple(typeof(arg, Purpose.argument) for arg in args)
        except ValueError:
            return self.dispatcher(*args)
        function = self.specializations.get(signature, "missing")
        if function == "missing":
            self.compile(signature)
            function = self.specializations[signature]
        if function is None:
            return self.dispatcher(*args)
        if checking():
            return self._checked(function, args)
        status = function(*args)
        if status == _translate.STATUS_SIGNATURE:  # numba's types and the entry's checks disagree
            return self.dispatcher(*args)
        if status != 0:
            raise self.status_error(status)
        return None

    def _checked(self, function: Callable, args: Sequence[Any]) -> None:
        """BENDC_NATIVE_CHECK: run numba on copies of the arguments too, and compare every array."""
        copies = _copies_keeping_aliases(args)
        state = llvm_state()  # np.dot as numba calls it (scipy's OpenBLAS): MKL's bits are another sgemm's
        sgemm, state.sgemm64.value = state.sgemm64.value, 0
        try:
            status = function(*args)
        finally:
            state.sgemm64.value = sgemm
        if status != 0:
            raise self.status_error(status)
        self.dispatcher(*copies)
        for number, (native, reference) in enumerate(zip(args, copies)):
            if isinstance(native, np.ndarray) and not same_bits(native, reference):
                raise AssertionError(f"native {self.module_name}.{self.__name__}: argument {number} differs from "
                                     f"numba's ({self.source_path})")

    def status_error(self, status: int) -> Exception:
        if status == _translate.STATUS_ZERO_DIVISION:
            return ZeroDivisionError(f"division by zero ({self.module_name}.{self.__name__})")
        if status == _translate.STATUS_INDEX:
            return IndexError(f"tuple index out of range ({self.module_name}.{self.__name__})")
        if status == _translate.STATUS_DOT_SHAPES:
            return ValueError(f"incompatible array sizes for np.dot ({self.module_name}.{self.__name__})")
        if status == _translate.STATUS_BLAS:
            return OverflowError(f"a BLAS size beyond a C int, or BLAS failed ({self.module_name}.{self.__name__})")
        if status == _translate.STATUS_BROADCAST:
            return ValueError(f"cannot assign slice from input of different size ({self.module_name}.{self.__name__})")
        messages = {_translate.STATUS_NOT_CONTIGUOUS: "reshape of an array that is not contiguous",
                    _translate.STATUS_RESHAPE: "cannot reshape array: the total size must be unchanged",
                    _translate.STATUS_MEMORY: "out of memory"}
        return NativeError(f"{self.module_name}.{self.__name__}: {messages.get(status, f'status {status}')}")

    def object_files(self) -> dict[str, bytes]:
        """The object files of the native specializations this process compiled or loaded, by
        name, as the cache holds them (checked again): what an artifact carries (bendc/aot.py)."""
        cache = _object_cache(self.source_path)
        files = {}
        for name in self.objects.values():
            data = cache.read(name) if cache is not None else None
            if data is not None:
                files[name] = data
        return files

    # ---------------------------------------------------------------- compiles
    def compile_native(self, signature: tuple) -> bool:
        """Compile (or load) the native specialization for numba's ``signature`` only: False where the
        translator does not cover it (then :meth:`compile` leaves it to numba without trying again)."""
        signature = tuple(signature)
        if signature in self.specializations:
            return self.specializations[signature] is not None
        if signature in self.compiles:  # tried: not native
            return False
        args = tuple(native_type(t) for t in signature)
        record = NativeCompile()
        self.compiles[signature] = record
        function = None
        if any(a is None for a in args):
            record.reason = "argument types " + ", ".join(str(t) for t, a in zip(signature, args) if a is None)
        elif not enabled():
            record.reason = "BENDC_NATIVE=0"
        else:
            try:
                function = self._native(signature, args, record)
            except Unsupported as why:
                record.reason = str(why)
        record.native = function is not None
        if function is not None:
            self.native_overloads[signature] = function
            self.specializations[signature] = function
            if self.fast is None:
                self.fast = function
        self._log(record)
        return function is not None

    def compile(self, signature: tuple) -> bool:
        """Compile (or load) the specialization for numba's ``signature``: natively where the
        translator can, else by numba. True where it is native."""
        signature = tuple(signature)
        if signature in self.specializations:
            return self.specializations[signature] is not None
        if self.compile_native(signature):
            return True
        self.dispatcher.compile(signature)
        self.specializations[signature] = None
        return False

    def _log(self, record: NativeCompile) -> None:
        log = os.environ.get("BENDC_NATIVE_LOG")
        if log:  # one line a compile: which functions the translator covers, and why not the others
            with open(log, "a") as stream:
                stream.write(f"{'native' if record.native else 'numba'}\t{self.module_name}.{self.__name__}"
                             f"\t{record.translate + record.llvm:.4f}\t{record.reason}\n")

    def _native(self, signature: tuple, args: tuple, record: NativeCompile) -> Callable:
        state = llvm_state()
        symbol_prefix = f"bendc.{self.module_name}"
        key_text = "|".join([translator_version(), self.module_name, self.__name__, repr(args), state.fingerprint,
                             repr(sorted(numpy_offsets().items())), str(state.vector_width)])
        key = hashlib.sha256(key_text.encode()).hexdigest()[:20]
        symbol = f"{symbol_prefix}.{self.__name__}.{key}.entry"
        cache = _object_cache(self.source_path)
        name = f"{self.module_name}.{self.__name__}.{key}{NATIVE_SUFFIX}"
        start = time.perf_counter()
        data = cache.read(name) if cache is not None else None
        if data is None:
            translator = ModuleTranslator(self.source, self.numba_functions, numpy_offsets(),
                                          f"{symbol_prefix}.{key}", vector_width=state.vector_width)
            translation = translator.entry(self.__name__, args)
            text = translation.ir.replace(f'@"{translation.entry}', f'@"{symbol}')  # the entry and its .fast
            record.translate = time.perf_counter() - start
            start = time.perf_counter()
            data = state.compile(text)
            record.llvm = time.perf_counter() - start
            if cache is not None:
                cache.write(name, data)
            self._native_stats.cache_misses[signature] += 1
        else:
            record.cached = True
            self._native_stats.cache_hits[signature] += 1
        self.objects[signature] = name
        for listener in list(COMPILE_LISTENERS):
            listener(self.module_name, self.__name__)
        if "prange" in self.source or "np.dot" in self.source:  # the pool (runtime/native/pool.py) first, and
            # numba's threading layer (get_num_threads: np.dot asks it)
            from runtime.native import pool

            pool.install(state)
        start = time.perf_counter()
        address = state.load(data, symbol)
        record.load = time.perf_counter() - start
        if not address:
            raise Unsupported(f"the object of {self.__name__} has no entry {symbol}")
        prototype = ctypes.PYFUNCTYPE(ctypes.c_int, *[_ctypes_of(a) for a in args])
        function = prototype(address)
        if all(isinstance(a, ArrayArg) or a == NONE_ARG for a in args):
            fast = state.address(f"{symbol}.fast")
            if fast:
                self.fastcalls[signature] = _builtin_function(fast, f"{self.__name__}")
        return function


# ------------------------------------------------------------------ the object cache
class _ObjectCache:
    """Object files beside numba's cache files of a kernel module, signed as numba's are."""

    def __init__(self, folder: str, readonly: bool, expected: dict[str, str] | None) -> None:
        self.folder, self.readonly, self.expected = folder, readonly, expected

    def read(self, name: str) -> bytes | None:
        path = os.path.join(self.folder, name)
        try:
            with open(path, "rb") as stream:
                data = stream.read()
        except OSError:
            return None
        if self.expected is not None:
            return data if self.expected.get(name) == hashlib.sha256(data).hexdigest() else None
        from runtime.trust import SIGNATURE_SUFFIX, InsecurePath, file_mac_matches, load_key

        try:
            with open(path + SIGNATURE_SUFFIX, encoding="ascii") as stream:
                recorded = stream.read()
        except (OSError, UnicodeDecodeError):
            return None
        try:
            key = load_key()
        except InsecurePath:  # an unsafe key file: nothing signed with it is trusted
            return None
        return data if file_mac_matches(name, data, key, recorded) else None

    def write(self, name: str, data: bytes) -> None:
        if self.readonly:
            return
        from runtime.files import atomic_write
        from runtime.trust import SIGNATURE_SUFFIX, InsecurePath, file_mac, load_key

        path = os.path.join(self.folder, name)
        try:
            atomic_write(path, data)
            if self.expected is None:
                atomic_write(path + SIGNATURE_SUFFIX, file_mac(name, data, load_key()).encode())
        except (OSError, InsecurePath):  # a folder we cannot write: the object lives in this process only
            pass


def _object_cache(source_path: str) -> _ObjectCache | None:
    """Where a kernel module's objects live: its registered machine-code folder (an artifact's,
    runtime/machine.py), else ``__pycache__`` beside the module (numba's default folder)."""
    from runtime.machine import home_of

    home = home_of(source_path)
    if home is not None:
        folder, readonly, expected = home
        if not readonly:
            os.makedirs(folder, exist_ok=True)
        return _ObjectCache(folder, readonly, expected)
    folder = os.path.join(os.path.dirname(os.path.abspath(source_path)), "__pycache__")
    return _ObjectCache(folder, False, None)


# ------------------------------------------------------------------ modules
def entry_functions(source_tree: Any, numba_names: set[str]) -> set[str]:
    """The njit functions no other njit function of the module calls: those Python code calls."""
    import ast

    called: set[str] = set()
    for node in source_tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in numba_names:
            for inner in ast.walk(node):
                if isinstance(inner, ast.Name) and inner.id in numba_names and inner.id != node.name:
                    called.add(inner.id)
    return numba_names - called


def nativize(module: Any, source: str, path: str, module_name: str) -> None:
    """Replace the module's entry njit functions by NativeFunction objects (see the module docstring)."""
    if not enabled():
        return
    import ast

    from numba.core.registry import CPUDispatcher

    numba_names = {name for name, value in vars(module).items()
                   if isinstance(value, CPUDispatcher) and getattr(value.py_func, "__module__", None) == module.__name__}
    if not numba_names:
        return
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return
    for name in entry_functions(tree, numba_names):
        dispatcher = getattr(module, name)
        setattr(module, name, NativeFunction(dispatcher, module_name, source, path, numba_names))


def _uses_prange(tree: Any, name: str) -> bool:
    import ast

    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return any(isinstance(n, ast.Name) and n.id == "prange" for n in ast.walk(node))
    return False
