"""The native translator against numba: the same source compiled both ways gives the same bits.

Each function below is written as bendc's generated kernels are written (njit, loops over range,
typed constants, math calls, helpers of the module). The module is loaded as a kernel module is
(runtime/artifact.py load_module), so its entry functions are NativeFunction objects; each is run
natively and through numba's own dispatcher on copies of the same inputs (special values
included: signed zeros, infinities, NaN, denormals, integer extremes), and every output array must
match bit for bit. Functions outside the translator's subset must stay numba's and still run.
"""
from __future__ import annotations

import os
import re
import sys
import textwrap

import numpy as np
import pytest

from runtime.artifact import load_module, module_name
from runtime.native import jit
from runtime.native.jit import NativeFunction

HEADER = '''"""bendc kernel test module"""
import math

import numpy as np
from numba import njit, prange

SCALE = 3
'''

SOURCE = HEADER + textwrap.dedent('''
    @njit(cache=True, error_model="numpy", no_cpython_wrapper=True, no_cfunc_wrapper=True)
    def helper_scale(x, k):
        """a helper returning a value"""
        y = x * np.float32(k)
        if y > np.float32(1.0e30):
            return np.float32(np.inf)
        return y

    @njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
    def float_ops(a, b, out):
        for i in range(out.shape[0]):
            x = a[i]
            y = b[i]
            out[i, 0] = x + y
            out[i, 1] = x - y
            out[i, 2] = x * y
            out[i, 3] = x / y
            out[i, 4] = x // y
            out[i, 5] = x % y
            out[i, 6] = -x
            out[i, 7] = abs(y)
            out[i, 8] = min(x, y)
            out[i, 9] = max(x, y)
            out[i, 10] = np.float32(1.0) if x < y else (np.float32(2.0) if x == y else np.float32(3.0))
            out[i, 11] = np.float32(x != y) + np.float32(x >= y) * np.float32(2.0)
            out[i, 12] = np.float32(np.float64(x) * np.float64(y) + 0.1)
            out[i, 13] = x * 2
            out[i, 14] = x ** 2 + y ** 3
            out[i, 15] = helper_scale(x, SCALE)
            out[i, 16] = math.sqrt(abs(x))
            out[i, 17] = np.float32(x).view(np.int32) >> np.int32(3)
            out[i, 18] = np.float32(math.isnan(x)) + np.float32(math.isinf(y)) + np.float32(math.isfinite(x))
            out[i, 19] = x if not (x > y and y > np.float32(0.0)) else y
            out[i, 20] = x ** y
            out[i, 21] = float(x) // 0.5

    @njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
    def math_ops(a, out):
        for i in range(a.shape[0]):
            x = a[i]
            out[i, 0] = math.exp(x)
            out[i, 1] = math.log(x)
            out[i, 2] = math.log1p(x)
            out[i, 3] = math.expm1(x)
            out[i, 4] = math.sin(x)
            out[i, 5] = math.cos(x)
            out[i, 6] = math.tan(x)
            out[i, 7] = math.tanh(x)
            out[i, 8] = math.erf(x)
            out[i, 9] = math.erfc(x)
            out[i, 10] = math.atan(x)
            out[i, 11] = math.asin(x)
            out[i, 12] = math.acos(x)
            out[i, 13] = math.sinh(x)
            out[i, 14] = math.cosh(x)
            out[i, 15] = math.log2(x)
            out[i, 16] = math.log10(x)
            out[i, 17] = math.exp2(x)
            out[i, 18] = math.floor(x) if math.isfinite(x) else x
            out[i, 19] = math.ceil(x) if math.isfinite(x) else x
            out[i, 20] = math.trunc(x) if math.isfinite(x) else x
            out[i, 21] = math.copysign(np.float32(1.5), x)
            out[i, 22] = math.atan2(x, np.float32(0.5))
            out[i, 23] = math.pow(x, np.float32(1.5))

    @njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
    def int_ops(a, b, out):
        for i in range(a.shape[0]):
            x = a[i]
            y = b[i]
            out[i, 0] = x + y
            out[i, 1] = x - y
            out[i, 2] = x * y
            out[i, 3] = x // y
            out[i, 4] = x % y
            out[i, 5] = -x
            out[i, 6] = abs(x)
            out[i, 7] = min(x, y)
            out[i, 8] = max(x, y)
            out[i, 9] = x & y
            out[i, 10] = x | y
            out[i, 11] = x ^ y
            out[i, 12] = x >> 3
            out[i, 13] = (x << 2) + ~y
            out[i, 14] = np.int64(x < y) + np.int64(x == y) * 2
            out[i, 15] = np.int64(np.float32(x) / np.float32(3.0))

    @njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
    def philox_like(seed, out):
        low = np.uint64(0xFFFFFFFF)
        shift = np.uint64(32)
        for i in range(out.shape[0]):
            c0 = np.uint64(i) & low
            c1 = np.uint64(seed[0]) >> shift
            k0 = np.uint64(seed[0]) & low
            for _ in range(10):
                p0 = np.uint64(0xD2511F53) * c0
                c0, c1 = (p0 >> shift) ^ c1 ^ k0, p0 & low
                k0 = (k0 + np.uint64(0x9E3779B9)) & low
            out[i] = np.float32(c0 >> np.uint64(8)) * np.float32(5.9604645e-08)

    @njit(parallel=False, cache=True, error_model="numpy", no_cfunc_wrapper=True)
    def lanes_and_partials(in0, out0, out1):
        a0 = np.zeros(out1.shape, np.float64)
        for i0 in range(in0.shape[0]):
            s_0 = s_1 = s_2 = s_3 = np.float64(0.0)
            for i1_block in range(in0.shape[1] // 4):
                i1 = 4 * i1_block + 0
                s_0 += np.float64(in0[i0, i1])
                i1 = 4 * i1_block + 1
                s_1 += np.float64(in0[i0, i1])
                i1 = 4 * i1_block + 2
                s_2 += np.float64(in0[i0, i1])
                i1 = 4 * i1_block + 3
                s_3 += np.float64(in0[i0, i1])
            for i1 in range(in0.shape[1] // 4 * 4, in0.shape[1]):
                s_0 += np.float64(in0[i0, i1])
            out0[i0] = np.float32((s_0 + s_1) + (s_2 + s_3))
            for i1 in range(in0.shape[1]):
                a0[i1] += np.float64(in0[i0, i1])
        z0 = out1.reshape(out1.size)
        w0 = a0.reshape(a0.size)
        for q in range(z0.size):
            z0[q] = np.float32(w0[q])

    @njit(parallel=False, cache=True, error_model="numpy", no_cfunc_wrapper=True)
    def collapsed(in0_full, in1, out0_full):
        in0 = in0_full.reshape((in0_full.shape[0] * in0_full.shape[1],))
        out0 = out0_full.reshape((out0_full.shape[0] * out0_full.shape[1],))
        r1 = in1[()]
        for i0 in range(out0.shape[0]):
            out0[i0] = in0[i0] * r1 + (np.float32(1.0), np.float32(0.5), np.float32(0.25))[i0 % 3]

    @njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
    def strided(a, out):
        for i in range(a.shape[0]):
            for j in range(a.shape[1]):
                out[i, j] = a[i, j] + a[-1 - i, j]

    @njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
    def scratch_in_loop(a, bias, out):
        rows, width = a.shape
        for r in range(rows):
            scratch = np.empty(width, np.float32)
            for c in range(width):
                scratch[c] = a[r, c] * np.float32(2.0)
            total = np.float32(0.0)
            c = 0
            while c < width:
                if scratch[c] < np.float32(0.0):
                    c += 1
                    continue
                total += scratch[c]
                if total > np.float32(100.0):
                    break
                c += 1
            out[r] = total if bias is None else total + bias[r]

    @njit(cache=True, error_model="python", no_cfunc_wrapper=True)
    def python_errors(a, b, out):
        for i in range(a.shape[0]):
            out[i] = a[i] // b[i]

    @njit(parallel=True, cache=True, error_model="numpy", no_cfunc_wrapper=True)
    def parallel_rows(a, scale, out, partial):
        rows = a.shape[0]
        for chunk in prange(4):
            for r in range(chunk * rows // 4, (chunk + 1) * rows // 4):
                total = np.float64(0.0)
                for c in range(a.shape[1]):
                    v = a[r, c] * scale[0]
                    out[r, c] = v
                    total += np.float64(v)
                partial[chunk] += total

    @njit(cache=True, no_cfunc_wrapper=True)
    def deal(item, t):
        other = t - 1 - item
        if other == item:
            return item, -1
        return item, other

    @njit(cache=True, no_cfunc_wrapper=True)
    def row_sums(row, out):
        for j in range(row.shape[0]):
            out[0] += row[j]

    @njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
    def slices_and_pairs(a, out, padded):
        t = a.shape[0]
        for item in range((t + 1) // 2):
            cells = np.empty(t + 1, np.float32)
            offset = 0
            for i in deal(item, t):
                if i < 0:
                    continue
                row = cells[offset:offset + i + 1]
                for j in range(i + 1):
                    row[j] = a[i, j]
                row_sums(row, out[i])
                offset += i + 1
        padded[1:-1, 2:] = a[:, :-2]
        padded[0, ::2] = np.float32(7.0)
        padded[-1] = a[0, :]
        out[::-1, 1] = a[:, -1]

    @njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
    def products(a, b, out, square, vector, column, single, rows):
        m = a.shape[0]
        first = np.dot(a, b.T)                  # C x F: a transposed operand
        for i in range(m):
            for j in range(first.shape[1]):
                out[i, j] = first[i, j]
        np.dot(a[:rows].T, a[:rows], square)    # F x C into C
        np.dot(a[:1], b.T, vector)              # a row vector times a matrix: gemv
        tile = np.full((a.shape[1], 2), np.float32(0.5))
        np.dot(a, tile[:, ::2], column)         # a strided operand (A: copied first), a column: gemv
        scratch = np.zeros((m, m), np.float32)
        np.dot(a, a.T, scratch)
        for i in range(m):
            out[i, -1] = scratch[i, i]
        np.dot(a[:1], a[1:2].T, single)         # vector . vector: dot

    @njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
    def chunked_and_wrapped(a, shift, out):
        t = a.shape[0]
        for c in range(t):
            first = (c // 4) * 4
            for chunk in range(first, t, 4):
                for j in range(4):
                    out[c, chunk + j] += a[c, chunk + j] * np.float32(2.0)
        for c in range(t):
            back = t - 1 - c
            out[c, back - t] += np.float32(1.0)   # negative: wraps to column t-1-c
            out[c, shift] += np.float32(3.0)      # a parameter: may be negative
        k = 0
        while k < t:
            out[k, k] += np.float32(5.0)
            k += 1

    @njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
    def strided_rows(x, out):
        for i in range(x.shape[0]):
            for j in range(x.shape[1]):
                out[i, j] = x[i, j] * np.float32(2.0)

    @njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
    def bump(a, out):
        for i in range(a.shape[0]):
            out[i] = a[i] + np.float32(1.0)

    @njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
    def running_stop(x, out):
        rows, width = x.shape
        wo = width - 2   # a difference: may be negative, but not inside range(wo)'s body
        for r in range(rows):
            for ow in range(wo):
                out[r * wo + ow] = x[r, ow + 2]

    @njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
    def running_stop_wraps(x, start, out):
        rows, width = x.shape
        wo = width - 2
        for r in range(rows):
            for ow in range(start, wo):      # a start that may be negative: so may wo be
                out[r * wo + ow] += x[r, ow + 2]
        for r in range(rows):
            for ow in range(wo):
                out[r * wo + ow] += np.float32(1.0)
                wo = wo - 1                  # the stop reassigned in the body

    @njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
    def not_native(a, out):
        for i in range(a.shape[0]):
            out[i] = a[i:i + 1].sum()

    @njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
    def rebound(x, out):
        for r in range(x.shape[0]):
            mean = np.float64(x[r, 0]) / 3.0
            out[r, 0] = np.float32(mean)
        for r in range(x.shape[0]):
            mean = np.float32(x[r, 1])
            out[r, 1] = (x[r, 2] - mean) * np.float32(0.1)

    @njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
    def selects(x, g, n, out):
        for i in range(x.shape[0]):
            r = x[i]
            s = g[i]
            c = r <= np.float32(0.0)
            out[i, 0] = np.float32(0.0) if c else s
            out[i, 1] = s if r > s else r
            out[i, 2] = -1.0 if r != r else s
            out[i, 3] = np.float32(1) if c else 2
            k = i if r < s else n
            out[i, 4] = k
            out[i, 5] = np.float32(-0.0) if c else np.float32(0.0)
            out[i, 6] = (s if c else r) + (r if c else s)
            out[i, 7] = g[i + 1] if i + 1 < g.shape[0] else np.float32(5.0)

    @njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
    def relu_backward(x, g, out, sums):
        total = np.float64(0.0)
        for i in range(out.shape[0]):
            r0 = x[i]
            v0 = (r0 <= np.float32(0.0))
            r1 = g[i]
            v1 = (np.float32(0.0) if v0 else r1)
            total += np.float64(v1)
            out[i] = v1
        sums[0] = np.float32(total)
''')

SPECIAL_F32 = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 7.0, 1e-40, -1e-40, 1e30, -1e30, 3.4e38, np.inf,
                        -np.inf, np.nan, 2.0, 0.1, -0.3, 100.0, 1e-7, -7.0, 0.75, 1.5], np.float32)


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    name = module_name(SOURCE)
    folder = tmp_path_factory.mktemp("native")
    path = os.path.join(folder, f"{name}.py")
    with open(path, "w") as stream:
        stream.write(SOURCE)
    return load_module(path, name)


def dumped_module(source: str, tmp_path, monkeypatch):
    """``source`` loaded as a generated module from tmp_path, its native compiles' IR and assembly
    dumped to tmp_path / "dump" (BENDC_NATIVE_DUMP)."""
    name = module_name(source)
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    monkeypatch.setenv("BENDC_NATIVE_DUMP", str(tmp_path / "dump"))
    return load_module(str(path), name)


def both(function: NativeFunction, *args) -> tuple[list, list]:
    """Run ``function`` natively and by numba on copies of ``args``: the arrays after each. A
    read-only array (an input) is passed as it is, strides and all."""
    assert isinstance(function, NativeFunction)

    def copy(a):
        return np.array(a, copy=True) if isinstance(a, np.ndarray) and a.flags.writeable else a

    native, reference = [copy(a) for a in args], [copy(a) for a in args]
    function(*native)
    assert all(record.native for record in function.compiles.values()), \
        {str(k): v.reason for k, v in function.compiles.items()}
    function.dispatcher(*reference)
    return native, reference


def assert_same_bits(native: list, reference: list) -> None:
    for number, (a, b) in enumerate(zip(native, reference)):
        if isinstance(a, np.ndarray):
            same = np.ascontiguousarray(a).view(np.uint8) == np.ascontiguousarray(b).view(np.uint8)
            assert same.all(), f"argument {number}: native {a[~same.reshape(a.shape[:1] + (-1,)).all(-1)]!r} " \
                               f"numba {b[~same.reshape(b.shape[:1] + (-1,)).all(-1)]!r}"


def pairs_f32() -> tuple[np.ndarray, np.ndarray]:
    a = np.repeat(SPECIAL_F32, SPECIAL_F32.size)
    b = np.tile(SPECIAL_F32, SPECIAL_F32.size)
    return a, b


def test_float_arithmetic_and_helpers_give_numbas_bits(module):
    a, b = pairs_f32()
    out = np.zeros((a.size, 22), np.float32)
    assert_same_bits(*both(module.float_ops, a, b, out))


def test_math_functions_give_numbas_bits(module):
    a = np.concatenate([SPECIAL_F32, np.linspace(-20, 20, 301, dtype=np.float32)])
    out = np.zeros((a.size, 24), np.float32)
    with np.errstate(all="ignore"):
        assert_same_bits(*both(module.math_ops, a, out))


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_integer_arithmetic_gives_numbas_bits(module, dtype):
    info = np.iinfo(dtype)
    values = np.array([0, 1, -1, 2, -2, 3, -7, 7, 100, -100, info.max, info.min, info.max - 1, info.min + 1], dtype)
    a, b = np.repeat(values, values.size), np.tile(values, values.size)
    out = np.zeros((a.size, 16), np.int64)
    assert_same_bits(*both(module.int_ops, a, b, out))


def test_uint64_arithmetic_gives_numbas_bits(module):
    out = np.zeros(64, np.float32)
    assert_same_bits(*both(module.philox_like, np.array([0x123456789ABCDEF], np.int64), out))


def test_lane_sums_partials_and_reshapes(module):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 11)).astype(np.float32)
    assert_same_bits(*both(module.lanes_and_partials, x, np.zeros(5, np.float32), np.zeros(11, np.float32)))
    x = rng.standard_normal((2, 3)).astype(np.float32)
    assert_same_bits(*both(module.collapsed, x, np.array(1.5, np.float32), np.zeros((2, 3), np.float32)))


def test_strided_views_and_negative_indices(module):
    x = np.arange(48, dtype=np.float32).reshape(6, 8)
    view = x[::2, ::3]  # not contiguous: the 'A' specialization
    view.flags.writeable = False
    assert not view.flags.c_contiguous and not view.flags.writeable
    assert_same_bits(*both(module.strided, view, np.zeros((3, 3), np.float32)))
    assert_same_bits(*both(module.strided, x, np.zeros((6, 8), np.float32)))
    assert len(module.strided.native_overloads) == 2


def test_indices_that_cannot_be_negative_skip_the_wraparound_and_the_rest_keep_it(module):
    """Names bound only to non-negative expressions (loop counters from a non-negative start, shape
    items, sums, products and floor quotients of such) index without numba's wraparound select,
    which lets LLVM vectorize ``a[c, chunk + j]``; a name that can be negative (a difference, a
    parameter) still wraps, as numba does."""
    import ast

    from runtime.native.translate import nonneg_names

    tree = ast.parse(SOURCE)
    function = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "chunked_and_wrapped")
    names, bound = nonneg_names(function, {"SCALE": 3})
    assert names == {"t", "c", "first", "chunk", "j", "k"}, names
    assert {"back", "shift", "a", "out"} <= bound - names
    a = np.arange(64, dtype=np.float32).reshape(8, 8)
    native, reference = both(module.chunked_and_wrapped, a, -2, np.zeros((8, 8), np.float32))
    assert_same_bits(native, reference)
    expected = np.where(np.arange(8)[None, :] >= (np.arange(8)[:, None] // 4) * 4, a * 2, 0)
    expected[np.arange(8), 7 - np.arange(8)] += 1   # t - 1 - c - t wrapped
    expected[:, -2] += 3
    expected[np.arange(8), np.arange(8)] += 5
    assert np.array_equal(native[2], expected)


def test_a_range_stop_is_positive_inside_its_loop(module, tmp_path, monkeypatch):
    """Inside ``for i in range(start, stop)`` with a non-negative start, start <= i < stop: the stop
    name is positive there, so ``r * wo + ow`` (im2col's column, wo a difference) indexes without
    the wraparound select (which made the store a masked scatter: conv2d's im2col ran 4x slower
    than numba's). A start that may be negative, or a stop the body reassigns, keeps the select;
    numba's bits in every case, wrapped indices included."""
    monkeypatch.setenv("BENDC_NATIVE_DUMP", str(tmp_path))
    x = np.arange(5 * 7, dtype=np.float32).reshape(5, 7)
    native, reference = both(module.running_stop, x, np.zeros(5 * 5, np.float32))
    assert_same_bits(native, reference)
    assert np.array_equal(native[1], x[:, 2:].reshape(-1))
    for start in (-3, 0, 2):
        assert_same_bits(*both(module.running_stop_wraps, x, start, np.zeros(5 * 5, np.float32)))

    def wraps(name: str) -> int:
        """The wraparound compares (``icmp slt i64 %index, 0``) in the function's IR before LLVM."""
        texts = [p.read_text() for p in tmp_path.glob("*.ll") if not p.name.endswith(".opt.ll")]
        (text,) = [t for t in texts if f".{name}.0\"(" in t]
        function = text.split(f".{name}.0\"(", 1)[1].split("\ndefine ", 1)[0]
        return len(re.findall(r"icmp slt i64 %[\w.]+, 0\n", function))

    assert wraps("running_stop") == 0
    # every index of out (read and written by +=, in both loops) and x[r, ow + 2] from a start < 0
    assert wraps("running_stop_wraps") == 5


def test_arrays_of_any_strides_are_indexed_in_elements(module, tmp_path, monkeypatch):
    """An array whose strides are known only at run time (layout A: a slice of columns, a
    transposed view) is indexed in elements, ``getelementptr float, ptr, i64 i * (stride / 4)``:
    LLVM's vectorizer versions the loop on that element stride being 1 (in bytes it checked for a
    one-byte stride, never true, and gathered every element). numba's bits for unit, wider and
    negative strides; a C-contiguous array keeps its constant byte strides."""
    monkeypatch.setenv("BENDC_NATIVE_DUMP", str(tmp_path))
    big = np.arange(6 * 20, dtype=np.float32).reshape(6, 20)
    for view in (big[:, 1:17], big[:, ::2], big[::-1, 18:2:-1], big.T[:5]):
        assert not view.flags.c_contiguous
        native, reference = both(module.strided_rows, view, np.zeros(view.shape, np.float32))
        assert_same_bits(native, reference)
        assert np.array_equal(native[1], view * 2)
    texts = [p.read_text() for p in tmp_path.glob("*.ll") if not p.name.endswith(".opt.ll")]
    functions = [t.split(".strided_rows.0\"(", 1)[1].split("\ndefine ", 1)[0] for t in texts
                 if ".strided_rows.0\"(" in t]
    assert functions and all("getelementptr float, ptr" in function for function in functions)


def test_conditional_expressions_of_names_and_numbers_are_selects(module, tmp_path, monkeypatch):
    """``a if c else b`` whose sides are names or numbers reads both and selects (no effect, cannot
    raise): a branch let LLVM sink an array load into one side, and a relu's backward ran at one
    mispredicted branch per element; a side that reads an array (``g[i + 1]``, past the end on the
    last element) keeps its branch, so only the chosen side runs. numba's bits either way, NaN
    conditions, signed zeros and mixed types included."""
    import ast

    from runtime.native.translate import _operand_only

    def side(text: str) -> bool:
        return _operand_only(ast.parse(text, mode="eval").body)

    assert all(side(t) for t in ("s", "2", "-1.0", "np.float32(0.0)", "np.float32(-0.0)", "np.int64(-3)", "True"))
    assert not any(side(t) for t in ("g[i]", "math.exp(r)", "r + s", "np.float32(r)", "f(0)", "'text'"))
    a, b = pairs_f32()
    monkeypatch.setenv("BENDC_NATIVE_DUMP", str(tmp_path))
    native, reference = both(module.selects, a, b, np.int64(-4), np.zeros((a.size, 8), np.float32))
    assert_same_bits(native, reference)
    native, reference = both(module.relu_backward, a, b, np.zeros(a.size, np.float32), np.zeros(1, np.float32))
    assert_same_bits(native, reference)
    (path,) = [p for p in tmp_path.glob("*.opt.ll") if "relu_backward" in p.read_text()]
    loop = path.read_text()
    assert "select" in loop and "ifx.else" not in loop, "relu's backward is a select, not a branch"


def test_the_native_check_matches_any_nan_and_nothing_else() -> None:
    """BENDC_NATIVE_CHECK compares bytes, except that a NaN matches any NaN (IEEE 754 leaves an
    operation's NaN sign and payload unspecified: pow(-2, x) * -nan gave -nan natively and +nan by
    numba); a signed zero, a number against a NaN, a shape or a dtype still differ."""
    from runtime.native.jit import same_bits

    x = np.array([1.0, -0.0, np.nan, 3.0], np.float32)
    y = x.copy()
    y[2] = -y[2]
    assert same_bits(x, y) and same_bits(x.reshape(2, 2), y.reshape(2, 2))
    assert same_bits(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32))
    z = x.copy()
    z[1] = 0.0
    assert not same_bits(x, z)
    z = x.copy()
    z[2] = 0.0
    assert not same_bits(x, z) and not same_bits(x, x.reshape(2, 2)) and not same_bits(x, x.astype(np.float64))
    assert same_bits(np.array([5, -1], np.int64), np.array([5, -1], np.int64))
    assert not same_bits(np.array([5, -1], np.int64), np.array([5, 1], np.int64))


def test_arrays_made_in_loops_while_break_continue_and_none(module):
    x = np.random.default_rng(1).standard_normal((7, 30)).astype(np.float32) * 20
    assert_same_bits(*both(module.scratch_in_loop, x, None, np.zeros(7, np.float32)))
    assert_same_bits(*both(module.scratch_in_loop, x, np.arange(7, dtype=np.float32), np.zeros(7, np.float32)))


def test_the_python_error_model_raises_zero_division_as_numba(module):
    a = np.array([5.0, -3.0], np.float32)
    out = np.zeros(2, np.float32)
    native, reference = both(module.python_errors, a, np.array([2.0, 0.5], np.float32), out)
    assert_same_bits(native, reference)
    with pytest.raises(ZeroDivisionError):
        module.python_errors(a, np.array([2.0, 0.0], np.float32), out)
    with pytest.raises(ZeroDivisionError):
        module.python_errors.dispatcher(a, np.array([2.0, 0.0], np.float32), out)


def test_prange_runs_on_the_pool_with_numbas_bits(module):
    x = np.random.default_rng(2).standard_normal((37, 19)).astype(np.float32)
    native, reference = both(module.parallel_rows, x, np.array([1.5], np.float32), np.zeros((37, 19), np.float32),
                             np.zeros(4, np.float64))
    assert_same_bits(native, reference)


def test_tuples_from_helpers_loops_over_them_slices_and_slice_assignment(module):
    a = np.arange(49, dtype=np.float32).reshape(7, 7) - 11  # square: row i reads i + 1 columns
    assert_same_bits(*both(module.slices_and_pairs, a, np.zeros((7, 2), np.float32), np.zeros((9, 7), np.float32)))


def test_blas_products_transposes_and_full_give_numbas_bits(module):
    rng = np.random.default_rng(4)
    a = rng.standard_normal((6, 5)).astype(np.float32)
    b = rng.standard_normal((4, 5)).astype(np.float32)
    assert_same_bits(*both(module.products, a, b, np.zeros((6, 8), np.float32), np.zeros((5, 5), np.float32),
                           np.zeros((1, 4), np.float32), np.zeros((6, 1), np.float32), np.zeros((1, 1), np.float32),
                           3))


def test_float32_products_call_bendcs_sgemm_where_it_may_run(module):
    """A float32 matrix product (np.dot's gemm case) calls bendc's sgemm (``@bendc_sgemm64``,
    runtime/native/blas.py) with numba_xxgemm's operands: at numba's thread count 1 always, above
    it only where that sgemm may run inside the pool (``@bendc_sgemm64_any_thread``: MKL
    sequential, not numpy's OpenBLAS), else numba's. Here through a recording stand-in that
    forwards to numpy's OpenBLAS: numba's bits all the same. Vector products (gemv, dot) stay
    numba's."""
    import ctypes

    import numba

    from runtime.native import blas
    from runtime.native.jit import llvm_state

    openblas = blas._numpy_openblas()
    assert openblas is not None and openblas.ilp64, "numpy's wheel bundles OpenBLAS (numpy.libs): its sgemm is found"
    sgemm = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 13, ctypes.c_int64, ctypes.c_int64)  # Fortran's, ILP64
    forward = sgemm(openblas.address)
    calls = []

    def record(*args):
        calls.append(tuple(ctypes.c_int64.from_address(args[i]).value for i in (2, 3, 4)))
        forward(*args)

    stand_in = sgemm(record)
    state = llvm_state()
    rng = np.random.default_rng(3)
    a = rng.standard_normal((6, 5)).astype(np.float32)
    b = rng.standard_normal((4, 5)).astype(np.float32)

    def run():
        return both(module.products, a, b, np.zeros((6, 8), np.float32), np.zeros((5, 5), np.float32),
                    np.zeros((1, 4), np.float32), np.zeros((6, 1), np.float32), np.zeros((1, 1), np.float32), 3)

    before = numba.get_num_threads()
    saved = state.sgemm64.value, state.sgemm64_any_thread.value
    state.sgemm64.value = ctypes.cast(stand_in, ctypes.c_void_p).value
    state.sgemm64_any_thread.value = 0
    try:
        numba.set_num_threads(1)
        native, reference = run()
        assert_same_bits(native, reference)
        products = [(4, 6, 5), (5, 5, 3), (6, 6, 5)]  # (n, m, k) as numba's call_xxgemm orders them
        assert calls == products
        if numba.config.NUMBA_NUM_THREADS > 1:
            numba.set_num_threads(2)
            assert_same_bits(*run())
            assert calls == products, "more than one thread, an sgemm for one thread only: numba's"
            state.sgemm64_any_thread.value = 1
            assert_same_bits(*run())
            assert calls == products * 2, "an sgemm that may run in the pool: called at two threads too"
    finally:
        state.sgemm64.value, state.sgemm64_any_thread.value = saved
        numba.set_num_threads(before)


def test_what_the_translator_does_not_cover_stays_numbas(module):
    """Slices and array methods are numba's: the function says why, and runs all the same."""
    out = np.zeros(4, np.float32)
    module.not_native(np.ones(4, np.float32), out)
    assert (out == 1).all()
    (record,) = module.not_native.compiles.values()
    assert not record.native and "array method sum" in record.reason


def test_a_name_holding_float32_and_float64_stays_numbas(module):
    """numba types each binding of a name on its own where no read sees both (SSA): mean is float64
    in the first loop and float32 in the second, whose arithmetic is then float32. One type a name
    (float64) would compute the second loop in float64: other bits. The translator refuses it."""
    x = np.random.default_rng(4).standard_normal((40, 3)).astype(np.float32)
    out = np.zeros((40, 2), np.float32)
    module.rebound(x, out)
    assert_same_bits(out[:, 1], (x[:, 2] - x[:, 1]) * np.float32(0.1))
    (record,) = module.rebound.compiles.values()
    assert not record.native and "mean holds both float64 and float32" in record.reason


def test_a_wrong_argument_is_refused_not_read(module):
    """The entry checks each object's type, rank, dtype and layout before reading it."""
    out = np.zeros((3, 3), np.float32)
    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    module.strided(x, out)  # compiles the C specialization
    entry = next(function for signature, function in module.strided.native_overloads.items()
                 if signature[0].layout == "C")
    assert entry(x, out) == 0
    assert entry([1, 2, 3], out) == 1              # not an ndarray
    assert entry(x.astype(np.float64), out) == 1   # another dtype
    assert entry(x.reshape(9), out) == 1           # another rank
    assert entry(x.T, out) == 1                    # another layout


def test_launch_lists_call_a_builtin_function_over_the_entry(module):
    """The launcher of an all-array entry is a CPython builtin (METH_FASTCALL): None on success, the
    entry's status as an int otherwise, TypeError for a wrong argument count."""
    if jit.checking():
        pytest.skip("BENDC_NATIVE_CHECK=1 routes every call through the checking wrapper")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    scale, out = np.array(2.0, np.float32), np.zeros((2, 3), np.float32)
    module.collapsed(x, scale, out)
    launcher = module.collapsed.launcher
    assert type(launcher).__name__ == "builtin_function_or_method"
    assert launcher(x, scale, out) is None and (out[0] == x[0] * 2 + np.array([1, 0.5, 0.25], np.float32)).all()
    assert launcher(x.astype(np.float64), scale, out) == 1  # another dtype: the caller retries through the function
    with pytest.raises(TypeError, match="takes 3 arrays"):
        launcher(x, scale)
    refs = sys.getrefcount(None)
    for _ in range(1000):
        launcher(x, scale, out)
    assert abs(sys.getrefcount(None) - refs) < 10  # None returned with its reference


def test_objects_are_cached_and_signed(module, tmp_path):
    """A second process would load the object: here, a fresh NativeFunction over the same module
    finds it in the cache (signed), and a tampered object is compiled again, not loaded."""
    function = module.strided
    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    function(x, np.zeros((3, 3), np.float32))  # compiled and cached here where no test before called it so
    fresh = NativeFunction(function.dispatcher, function.module_name, function.source, function.source_path,
                           function.numba_functions)
    fresh(x, np.zeros((3, 3), np.float32))
    assert any(record.cached for record in fresh.compiles.values())
    folder = os.path.join(os.path.dirname(function.source_path), "__pycache__")
    objects = [name for name in os.listdir(folder) if name.endswith(jit.NATIVE_SUFFIX) and ".strided." in name]
    assert objects and all(os.path.exists(os.path.join(folder, name + ".sig")) for name in objects)
    for name in objects:
        with open(os.path.join(folder, name), "r+b") as stream:
            stream.seek(100)
            stream.write(b"\x90\x90\x90\x90")
    tampered = NativeFunction(function.dispatcher, function.module_name, function.source, function.source_path,
                              function.numba_functions)
    tampered(x, np.zeros((3, 3), np.float32))
    assert not any(record.cached for record in tampered.compiles.values())


def _float32_nearest(exact) -> np.float32:
    """The float32 nearest a Fraction (ties to even): the correctly rounded result."""
    from fractions import Fraction

    guess = np.float32(float(exact))
    candidates = [guess, np.nextafter(guess, np.float32(np.inf)), np.nextafter(guess, np.float32(-np.inf))]
    finite = [c for c in candidates if np.isfinite(c)]
    best = min(finite, key=lambda c: (abs(Fraction(float(c)) - exact), int(np.float32(c).view(np.int32)) & 1))
    return np.float32(best)


def test_bendc_fma_rounds_once_natively_and_by_numba(tmp_path):
    """templates/cpu_math.py's bendc_fma is llvm.fma.f32 both ways: a * b + c rounded once (the
    correctly rounded value of the exact sum), never a multiply and an add."""
    from fractions import Fraction

    from bendc.kernels.cpu_kit import math_prelude

    source = HEADER + math_prelude() + textwrap.dedent('''
        @njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
        def fused(a, b, c, out):
            for i in range(out.shape[0]):
                out[i] = bendc_fma(a[i], b[i], c[i])
    ''')
    name = module_name(source)
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    fused = load_module(str(path), name).fused
    rng = np.random.default_rng(7)
    a, b, c = (rng.standard_normal(2000).astype(np.float32) * np.float32(2.0) ** rng.integers(-20, 20, 2000)
               .astype(np.float32) for _ in range(3))
    near = np.float32(1.0 + 2.0 ** -12)  # near * near = 1 + 2^-11 + 2^-24: a tie, rounded to 1 + 2^-11
    a[:3], b[:3], c[:3] = near, near, [-(1.0 + 2.0 ** -11), 0.0, np.inf]
    c[3:5] = -a[3:5] * b[3:5]  # the product's rounding error, which only a fused sum keeps
    native, reference = both(fused, a, b, c, np.zeros(a.size, np.float32))
    assert_same_bits(native, reference)
    out = native[3]
    assert out[0] == np.float32(2.0 ** -24) and np.float32(near * near + c[0]) == 0.0
    assert out[1] == np.float32(1.0 + 2.0 ** -11) and out[2] == np.inf
    exact = [_float32_nearest(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))
             for x, y, z in zip(a[3:], b[3:], c[3:])]
    assert np.array_equal(out[3:].view(np.int32), np.array(exact, np.float32).view(np.int32))


def _lanes_in_order(values: np.ndarray, start: int, stop: int, lanes: list[float]) -> list[float]:
    """bendc_lanes8's contract in Python floats: whole blocks of 8 from start lane by lane, the rest into lane 0."""
    lanes = list(lanes)
    blocks = (stop - start) // 8
    for cell in range(start, start + 8 * blocks):
        lanes[(cell - start) % 8] += float(values[cell])
    for cell in range(start + 8 * blocks, stop):
        lanes[0] += float(values[cell])
    return lanes


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bendc_lanes8_is_one_vector_add_a_block_with_numbas_bits(tmp_path, monkeypatch, dtype):
    """templates/lanes.py's bendc_lanes8 over a contiguous row is one <8 x double> add a block
    natively (runtime/native/translate.py _lanes8_vector), and gives numba's bits and the lane
    order cpu_kit's unrolled lanes use: cells start + 8b + l into lane l, the rest into lane 0,
    lanes carried in from the caller. Values of 1e30 and -1e30 beside small ones make any other
    order or grouping visible; a negative start (numba's wraparound) takes the translated body."""
    from bendc.kernels.cpu_kit import lane_row_sums
    from bendc.kernels.templates import helper_functions

    body = textwrap.dedent('''
        @njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
        def lanes(x, starts, stops, out):
            for r in range(x.shape[0]):
                s0, s1, s2, s3, s4, s5, s6, s7 = bendc_lanes8(x[r], starts[r], stops[r], 0.5, -0.0, 1.0, 0.0,
                                                               0.0, 0.0, 0.0, -3.0)
                out[r, 0], out[r, 1], out[r, 2], out[r, 3] = s0, s1, s2, s3
                out[r, 4], out[r, 5], out[r, 6], out[r, 7] = s4, s5, s6, s7
    ''')
    source = HEADER + helper_functions(body, "cpu") + body + f"# {np.dtype(dtype)} rows\n"
    name = module_name(source)
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    monkeypatch.setenv("BENDC_NATIVE_DUMP", str(tmp_path / "dump"))
    lanes = load_module(str(path), name).lanes
    rng = np.random.default_rng(3)
    columns = 45
    x = (rng.standard_normal((12, columns)) * 10.0 ** rng.integers(-8, 8, (12, columns))).astype(dtype)
    x[:, 3::7] = 1e30
    x[:, 5::11] = -1e30
    x[1, 9], x[2, 17], x[3, 40] = np.inf, np.nan, -np.inf
    starts = np.array([0, 0, 3, 5, 0, 44, 7, 45, 1, 0, -4, 2], np.int64)
    stops = np.array([45, 40, 45, 20, 7, 45, 7, 45, 9, 8, 3, 44], np.int64)
    native, reference = both(lanes, x, starts, stops, np.zeros((12, 8), np.float64))
    assert_same_bits(native, reference)
    out = native[3]
    for r in range(12):
        if starts[r] < 0:
            continue  # numba's wraparound: checked against numba above
        expected = _lanes_in_order(x[r], starts[r], stops[r], [0.5, -0.0, 1.0, 0.0, 0.0, 0.0, 0.0, -3.0])
        assert np.array_equal(out[r], np.array(expected), equal_nan=True), r
        assert np.copysign(1.0, out[r, 1]) == np.copysign(1.0, expected[1])
    plain, _ = both(lanes, x, np.zeros(12, np.int64), np.full(12, columns, np.int64), np.zeros((12, 8)))
    tree = plain[3]
    tree[:, 0] -= 0.5
    tree[:, 2] -= 1.0
    tree[:, 7] += 3.0
    wide = x.astype(np.float64)
    finite = np.isfinite(wide).all(axis=1)
    assert finite.sum() >= 9
    totals = ((tree[:, 0] + tree[:, 1]) + (tree[:, 2] + tree[:, 3])) + ((tree[:, 4] + tree[:, 5]) + (tree[:, 6] + tree[:, 7]))
    assert np.array_equal(totals[finite], lane_row_sums(wide)[finite]) or not finite.any()
    optimized = "".join(p.read_text() for p in (tmp_path / "dump").glob("*.opt.ll"))
    assert "fadd <8 x double>" in optimized, "the lanes are one vector add a block"


def test_only_the_templates_bendc_lanes8_becomes_vector_code(tmp_path):
    """The translator's vector form stands for templates/lanes.py's statements (LANES8_DIGEST); a
    module function of the same name with other statements is translated as written."""
    import ast

    from bendc.kernels.templates import helper_functions, template_text
    from runtime.native.translate import LANES8_DIGEST, function_digest

    (template,) = [n for n in ast.parse(template_text("lanes.py")).body if isinstance(n, ast.FunctionDef)]
    assert function_digest(template) == LANES8_DIGEST, "lanes.py changed: update the translator's vector form"
    body = textwrap.dedent('''
        @njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
        def lanes(x, out):
            s0, s1, s2, s3, s4, s5, s6, s7 = bendc_lanes8(x, 0, x.shape[0], 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
            out[0], out[1], out[7] = s0, s1, s7
    ''')
    changed = helper_functions(body, "cpu").replace("s1 += np.float64(values[c + 1])", "s1 -= np.float64(values[c + 1])")
    assert "s1 -= " in changed
    source = HEADER + changed + body
    name = module_name(source)
    (tmp_path / f"{name}.py").write_text(source)
    x = np.arange(1.0, 18.0, dtype=np.float32)
    native, reference = both(load_module(str(tmp_path / f"{name}.py"), name).lanes, x, np.zeros(8))
    assert_same_bits(native, reference)
    assert native[1][1] == -(2.0 + 10.0) and native[1][0] == 1.0 + 9.0 + 17.0


def _rows_fma_expected(dest, weights, down, sources, count, lo, hi, causal, fresh) -> np.ndarray:
    """bendc_rows_fma's contract in float64 (templates/products.py), written from its docstring: the lanes
    and sources each causal mode keeps, from zeros where fresh; other cells as they were."""
    out = dest.astype(np.float64)
    for j in range(dest.shape[0]):
        chunk = j // 16 * 16
        for r in range(max(lo, chunk) if causal == 1 else lo, hi):
            total = 0.0 if fresh else out[j, r]
            for s in range(count):
                if (causal == 2 and s >= chunk + 16) or (causal == 3 and s < chunk):
                    continue
                total += float(weights[s, j] if down else weights[j, s]) * float(sources[s, r])
            out[j, r] = total
    return out


@pytest.mark.parametrize("vector_width", [512, 256])
def test_bendc_rows_fma_is_register_blocked_with_numbas_bits(tmp_path, monkeypatch, vector_width):
    """templates/products.py's bendc_rows_fma is a register-blocked vector product natively
    (runtime/native/translate.py _rows_fma_vector: on AVX-512 blocks of 16 x 1, 8 x 2, 4 x 4 and
    single rows, elsewhere 4 x 1 and single rows; a masked last vector) and gives numba's bits for
    every causal mode, both weight orders, fresh or accumulating, rows and lanes off the blocks,
    strided views (dest and sources with contiguous lanes, weights transposed); lo off a chunk and
    sources with strided lanes take the body. The values span 2^-20..2^20, so any other order of a
    cell's FMAs shows in the bits; the float64 contract checks what the two compute. Both block
    tables run on any host (``vector_width`` given to the translator as the host's would be)."""
    from bendc.kernels.cpu_kit import math_prelude
    from bendc.kernels.templates import helper_functions
    from runtime.native.translate import rows_fma_blocks

    monkeypatch.setattr(jit.llvm_state(), "vector_width", vector_width)

    body = textwrap.dedent('''
        @njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
        def product(dest, weights, down, sources, count, lo, hi, causal, fresh):
            bendc_rows_fma(dest, weights, down, sources, count, lo, hi, causal, fresh)


        @njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
        def product_of_views(dest, weights, down, sources, count, lo, hi, causal, fresh, columns, strided):
            if strided:
                bendc_rows_fma(dest[:, :columns], weights.T, down, sources[:, ::2], count, lo, hi, causal, fresh)
            else:
                bendc_rows_fma(dest[:, :columns], weights.T, down, sources[:, :columns], count, lo, hi, causal, fresh)
    ''')
    module = dumped_module(HEADER + math_prelude() + helper_functions(body, "cpu") + body, tmp_path, monkeypatch)
    rng = np.random.default_rng(11)

    def values(*shape):
        return (rng.standard_normal(shape) * 2.0 ** rng.integers(-20, 20, shape)).astype(np.float32)

    cases = [(rows, lanes, count, lo) for rows, lanes, count, lo in
             [(64, 64, 32, 0), (13, 37, 40, 0), (24, 16, 64, 0), (5, 20, 7, 16), (1, 48, 16, 0), (9, 64, 0, 32),
              (17, 33, 17, 0), (64, 70, 64, 3), (40, 100, 24, 0), (35, 16, 33, 0)]]
    for rows, lanes, count, lo in cases:
        for causal in range(4):
            for down in (0, 1):
                fresh = bool((rows + causal + down) % 2)
                hi = lanes - 2 if causal == 0 and lanes > 40 else lanes
                dest = values(rows, lanes)
                weights = values(count, rows) if down else values(rows, count)
                sources = values(max(count, 1), lanes)
                args = (dest, weights, down, sources, count, lo, hi, causal, fresh)
                native, reference = both(module.product, *args)
                assert_same_bits(native, reference)
                expected = _rows_fma_expected(*args)
                scale = np.abs(expected).max() + 1.0
                assert np.allclose(native[0], expected, rtol=1e-4, atol=1e-5 * scale), (rows, lanes, count, lo, causal, down)
                wide = np.concatenate([dest, values(rows, 5)], axis=1)
                for strided in (False, True):
                    spread = np.repeat(sources, 2, axis=1) if strided else np.concatenate([sources, sources], axis=1)
                    native, reference = both(module.product_of_views, wide, np.ascontiguousarray(weights.T), down,
                                             spread, count, lo, hi, causal, fresh, lanes, strided)
                    assert_same_bits(native, reference)
                    assert np.allclose(native[0][:, :lanes], expected, rtol=1e-4, atol=1e-5 * scale)
                    assert np.array_equal(native[0][:, lanes:], wide[:, lanes:])
    translated = "".join(p.read_text() for p in (tmp_path / "dump").glob("*.ll") if ".opt." not in p.name)
    optimized = "".join(p.read_text() for p in (tmp_path / "dump").glob("*.opt.ll"))
    assert "@llvm.fma.v16f32" in optimized and "@llvm.masked.store.v16f32" in optimized
    blocks = set(re.findall(r'\.vector\.b(\d+)x(\d+)m?" *\(', translated))
    expected = {(str(rows), str({"quad": 4, "pair": 2}.get(step, 1))) for rows, _, steps in rows_fma_blocks(vector_width)
                for step in steps}
    assert blocks == expected, (vector_width, blocks)


def test_only_the_templates_bendc_rows_fma_becomes_vector_code():
    """The translator's vector form stands for templates/products.py's statements (ROWS_FMA_DIGEST)."""
    import ast

    from bendc.kernels.templates import template_text
    from runtime.native.translate import ROWS_FMA_DIGEST, function_digest

    (template,) = [n for n in ast.parse(template_text("products.py")).body if isinstance(n, ast.FunctionDef)]
    assert function_digest(template) == ROWS_FMA_DIGEST, "products.py changed: update the translator's vector form"


def test_checking_follows_the_environment_at_every_call(monkeypatch):
    """jit.checking() reads os.environ's own mapping at each call (not the value at import): a test
    or a user setting BENDC_NATIVE_CHECK in the process turns the check on and off."""
    monkeypatch.delenv("BENDC_NATIVE_CHECK", raising=False)
    assert not jit.checking()
    monkeypatch.setenv("BENDC_NATIVE_CHECK", "1")
    assert jit.checking()
    monkeypatch.setenv("BENDC_NATIVE_CHECK", "0")
    assert not jit.checking()
    os.environ["BENDC_NATIVE_CHECK"] = "1"
    assert jit.checking()


def test_the_native_check_keeps_arguments_that_alias_each_other_aliased(module, monkeypatch):
    """BENDC_NATIVE_CHECK runs numba on copies: arguments that share memory (an output written over
    a donated input, two views of one buffer) share it in the copies too, so an in-place kernel is
    compared with numba's in-place run (copied apart, numba's input kept its old values and every
    donated optimizer step "differed"); a wrong native result still fails."""
    monkeypatch.setenv("BENDC_NATIVE_CHECK", "1")
    a = np.arange(8, dtype=np.float32)
    module.bump(a, a)                        # in place: both runs add 1 to the same buffer
    assert np.array_equal(a, np.arange(8, dtype=np.float32) + 1)
    buffer = np.arange(12, dtype=np.float32)
    module.bump(buffer[:6], buffer[6:])      # two views of one buffer, at their offsets
    assert np.array_equal(buffer[6:], np.arange(6, dtype=np.float32) + 1)
    copies = jit._copies_keeping_aliases([buffer[6:], buffer[::2], 3, buffer[1:5].reshape(2, 2)])
    assert np.shares_memory(copies[0], copies[1]) and not np.shares_memory(copies[0], buffer)
    assert all(np.array_equal(c, o) and c.strides == o.strides
               for c, o in zip(copies, [buffer[6:], buffer[::2], None, buffer[1:5].reshape(2, 2)]) if o is not None)

    def wrong(a, out):  # a native result that is not numba's
        out[:] = a + np.float32(2.0)
        return 0

    a = np.arange(8, dtype=np.float32)
    with pytest.raises(AssertionError, match="argument 0 differs"):
        module.bump._checked(wrong, [a, a])


INTERLEAVED_BODY = '''

@njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
def twice(x):
    return x * np.float32(2.0) + np.float32(1.0)


@njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
def row_twice(row):
    for c in range(row.shape[0]):  # no call: not marked
        row[c] = row[c] * np.float32(2.0)


@njit(cache=True, error_model="numpy", no_cfunc_wrapper=True)
def kernel(x, out, rows):
    for i in range(x.shape[0]):  # a loop calling the module's function: marked
        out[i] = twice(x[i])
    for i in range(x.shape[0]):  # arithmetic only: not marked
        out[i] += x[i]
    for r in range(rows.shape[0]):  # holds a loop: not marked; the loop inside is
        for c in range(rows.shape[1]):
            rows[r, c] = math.exp(rows[r, c])
    for r in range(rows.shape[0]):  # calls a function that loops: not innermost, not marked
        row_twice(rows[r])
'''


@pytest.mark.parametrize("vector_width,asked", [(256, None), (256, 4), (512, 4)])
def test_loops_calling_the_kits_math_are_interleaved_where_the_module_asks(tmp_path, monkeypatch, vector_width, asked):
    """A module binding NATIVE_INTERLEAVE (bendc/codegen/cpu.py writes it where a kernel calls the
    kit's math) gets LLVM's interleave count on each innermost loop that calls a module function or
    math.*: the count asked where vectors are 256 bits wide, 1 on AVX-512 (runtime/native/jit.py
    ``interleaved``); other loops and other modules carry no loop metadata. The bits are numba's."""
    from runtime.native.translate import INTERLEAVE_CONSTANT

    monkeypatch.setattr(jit.llvm_state(), "vector_width", vector_width)
    source = HEADER + (f"\n{INTERLEAVE_CONSTANT} = {asked}\n" if asked else "") + INTERLEAVED_BODY
    module = dumped_module(source, tmp_path, monkeypatch)
    rng = np.random.default_rng(3)
    x = rng.standard_normal(203).astype(np.float32)
    rows = rng.standard_normal((5, 77)).astype(np.float32)
    native, reference = both(module.kernel, x, np.zeros_like(x), rows)
    assert_same_bits(native, reference)
    translated = "".join(p.read_text() for p in (tmp_path / "dump").glob("*.ll") if ".opt." not in p.name)
    marked = re.findall(r"br label %\S+, !llvm.loop (!\d+)", translated)
    counts = re.findall(r'!\{!"llvm.loop.interleave.count", i32 (\d+)\}', translated)
    if asked is None:
        assert marked == [] and counts == []
    else:
        assert len(marked) == 2, translated  # the first loop and the loop inside the last
        assert counts == [str(asked if vector_width < 512 else 1)] * 2


@pytest.mark.parametrize("size", ["small", "whole heads", "tiles"])
def test_the_cpu_kernels_that_call_the_kits_math_ask_for_interleaving(size):
    """bendc/codegen/cpu.py: a kernel calling the kit's math binds NATIVE_INTERLEAVE (4; 2 in the
    attention's whole heads, whose rows are short; 4 in its tiles) where its largest tensor has
    INTERLEAVE_FROM cells (bendc/kernels/cpu_policy.py), none below; one calling no math never does."""
    import bendc
    import bendc.functional as F
    from bendc.codegen.cpu import ATTENTION_INTERLEAVE, MATH_INTERLEAVE, TILED_ATTENTION_INTERLEAVE
    from bendc.kernels.cpu_policy import INTERLEAVE_FROM
    from bendc.ops.attention.layout import SMALL_HEAD
    from runtime.native.translate import INTERLEAVE_CONSTANT

    def step(q, k, v, x):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return (o.sum() + F.gelu(x).sum() + (x * 3.0).sum())

    rng = np.random.default_rng(0)
    large = size != "small"
    heads, length = {"small": (2, 8), "whole heads": (4, SMALL_HEAD), "tiles": (2, 2 * SMALL_HEAD)}[size]
    depth = INTERLEAVE_FROM // (heads * length) if large else 4
    q, k, v = (rng.standard_normal((1, heads, length, depth)).astype(np.float32) for _ in range(3))
    x = rng.standard_normal((INTERLEAVE_FROM // 128, 128) if large else (4, 6)).astype(np.float32)
    assert min(q.size, x.size) >= INTERLEAVE_FROM if large else max(q.size, x.size) < INTERLEAVE_FROM
    jitted = bendc.jit(step, target="cpu")
    jitted(q, k, v, x)
    asking = {name: (re.findall(rf"^{INTERLEAVE_CONSTANT} = (\d+)$", source, re.M) or [None])[0]
              for name, source in jitted.kernels().items()}
    kit = {name: "bendc_exp(" in source or "bendc_gelu(" in source for name, source in jitted.kernels().items()}
    attention = {name for name in asking if "attention" in name}
    gelu = [name for name in asking if kit[name] and name not in attention]
    assert attention and gelu, asking
    attention_count = TILED_ATTENTION_INTERLEAVE if size == "tiles" else ATTENTION_INTERLEAVE
    want_attention, want_gelu = (str(attention_count), str(MATH_INTERLEAVE)) if large else (None, None)
    assert all(asking[name] == want_attention for name in attention), asking
    assert all(asking[name] == want_gelu for name in gelu), asking
    assert all(asking[name] is None for name in asking if not kit[name]), asking
