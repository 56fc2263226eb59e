"""Matrix products on the pool (runtime/native/products.py) at 2 and 3 threads.

A child process (numba reads NUMBA_NUM_THREADS at import) checks ``bendc_matmul`` for every
layout the builtin takes (row-major, transposed, wider leading strides; outputs with wider rows),
row and column cuts, blocks of one row or column: every element within 1e-5 of the float64
product (the output starts as NaN, so an element no block wrote fails), the same bits on a second
call, and the same bits as one whole-matrix sgemm of the same library (scipy's OpenBLAS) where the
blocks are large. (Where a block is thin, OpenBLAS may take another kernel for it than for the
whole product: (1000, 600) @ (600, 2) differs from the whole product in the last bits. So products
give the same bits at one thread count, not across counts.) Every other operand is declined
(nothing written) and ``matmul`` then gives numpy's product, or numpy's error.
"""
from __future__ import annotations

import sys
import textwrap

import pytest

from conftest import child_report

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the pool is Linux's (futex); elsewhere numba's")

CHILD = textwrap.dedent('''
    import json
    import numba
    import numpy as np
    from scipy.linalg import blas
    from runtime.native import pool, products

    rng = np.random.default_rng(0)
    fast = products._fast()
    report = {"own": fast is not None, "differ": [], "far": [], "declined": []}
    shapes = [(5, 3, 7), (256, 64, 192), (64, 256, 256), (256, 64, 64), (128, 256, 64), (1, 8, 9), (9, 8, 1),
              (300, 1, 5), (1000, 70, 33), (33, 70, 1000), (2, 600, 1000), (1000, 600, 2), (700, 300, 3)]


    def layouts(x):
        rows, columns = x.shape
        return {"C": x, "F": np.asfortranarray(x), "rows apart": np.pad(x, ((0, 0), (0, 3)))[:, :columns],
                "columns apart": np.pad(x.T, ((0, 0), (0, 5)))[:, :rows].T}


    for m, k, n in shapes:
        a0 = rng.standard_normal((m, k)).astype(np.float32)
        b0 = rng.standard_normal((k, n)).astype(np.float32)
        exact = a0.astype(np.float64) @ b0.astype(np.float64)
        whole = blas.sgemm(1.0, a0, b0)
        for an, a in layouts(a0).items():
            for bn, b in layouts(b0).items():
                for out in (np.full((m, n), np.nan, np.float32), np.full((m, n + 2), np.nan, np.float32)[:, :n]):
                    status = fast(a, b, out)
                    again = np.full_like(out, np.nan)
                    fast(a, b, again)
                    large = min(m, n) >= 64
                    if status is not None or not np.array_equal(out, again) or \
                            (large and not np.array_equal(out, whole)):
                        report["differ"].append([m, k, n, an, bn, status])
                    if not (np.abs(out - exact) <= 1e-5 * max(1.0, np.abs(exact).max())).all():
                        report["far"].append([m, k, n, an, bn])
    a, b = np.ones((4, 3), np.float32), np.ones((3, 5), np.float32)
    declined = {"float64": (a.astype(np.float64), b.astype(np.float64), np.zeros((4, 5))),
                "strided both ways": (np.ones((4, 6), np.float32)[:, ::2], b, np.zeros((4, 5), np.float32)),
                "shapes": (a, np.ones((4, 5), np.float32), np.zeros((4, 5), np.float32)),
                "out rows adjacent": (a, b, np.zeros((5, 4), np.float32).T),
                "empty": (np.ones((4, 0), np.float32), np.ones((0, 5), np.float32), np.zeros((4, 5), np.float32)),
                "three dimensions": (np.ones((2, 4, 3), np.float32), b, np.zeros((2, 4, 5), np.float32)),
                "a list": ([[1.0]], np.ones((1, 1), np.float32), np.zeros((1, 1), np.float32))}
    for name, (x, y, out) in declined.items():
        before = np.array(out, copy=True)
        status = fast(x, y, out)
        if status != 1 or not np.array_equal(out, before):
            report["declined"].append(name)
        try:
            expected = np.matmul(x, y)
        except ValueError:  # products.matmul raises numpy's error
            try:
                products.matmul(x, y, out)
                report["declined"].append(name + " (no error)")
            except ValueError:
                pass
            continue
        products.matmul(x, y, out)
        if not np.array_equal(out, expected):
            report["declined"].append(name + " (numpy)")
    report["counts"] = pool.counts()
    numba.set_num_threads(1)  # one thread: numpy's product (the builtin declines)
    report["one thread"] = fast(a, b, np.zeros((4, 5), np.float32))
    print(json.dumps(report))
''')


@pytest.mark.parametrize("threads", ["2", "3"])
def test_products_on_the_pool_are_right_and_repeat_their_bits(tmp_path, threads):
    report = child_report(CHILD, threads=threads)
    assert report["own"]
    assert report["differ"] == [] and report["far"] == []
    assert report["declined"] == []
    assert report["counts"]["launches"] > 0
    assert report["one thread"] == 1
