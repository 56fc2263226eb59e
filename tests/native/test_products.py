"""Matrix products on the pool (runtime/native/products.py) at 2 and 3 threads.

A child process (numba reads NUMBA_NUM_THREADS at import) checks ``bendc_matmul`` for every
layout the builtin takes (row-major, transposed, wider leading strides; outputs with wider rows),
row, column and K cuts (a long K, a weight's gradient: each thread's block of K by one call, the
partials added in block order), blocks of one row or column: every element within 1e-5 of the float64
product (the output starts as NaN, so an element no block wrote fails), the same bits on a second
call, and the same bits as one whole-matrix sgemm of the same library (MKL where
``BENDC_BLAS=mkl``, else scipy's OpenBLAS) where the blocks are large and the library's own products
of half the rows or columns give its whole product's bits on this CPU (OpenBLAS on an AMD EPYC Zen 3
does not, for any of these shapes), or as the same library's blocks of K added in order where K is
cut. (Where a block is thin, OpenBLAS may take another kernel for it than for the
whole product: (1000, 600) @ (600, 2) differs from the whole product in the last bits. So products
give the same bits at one thread count, not across counts.) Every other operand is declined
(nothing written) and ``matmul`` then gives numpy's product, or numpy's error. At one thread the
builtin makes one call, no launch: MKL's, or numpy's OpenBLAS with numpy's own bits (numpy's matmul
calls the same sgemm; its gemv and syrk cases, a row or column vector and a matrix times its own
transpose, are declined to numpy).
"""
from __future__ import annotations

import sys
import textwrap

import pytest

from conftest import child_report
from runtime.native import blas

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the pool is Linux's (futex); elsewhere numba's")

CHILD = textwrap.dedent('''
    import json
    import numba
    import numpy as np
    from scipy.linalg import blas as scipy_blas
    from runtime.native import blas, pool, products

    rng = np.random.default_rng(0)
    fast = products._fast()
    chosen = blas.sgemm()
    report = {"own": fast is not None, "differ": [], "far": [], "declined": [], "blas": chosen.name}
    def whole_product(a, b):  # the library's one call as the pool calls it (out^T = b^T a^T): MKL's or scipy's
        return chosen.matmul(a, b) if chosen.any_thread else scipy_blas.sgemm(1.0, b.T, a.T).T


    threads = numba.get_num_threads()


    def k_cut(a, b):
        """Whether the builtin cuts K: K long beside the output's sides, work enough for every thread."""
        (m, k), n = a.shape, b.shape[1]
        parts = min(threads, k) - 1
        return (k >= products.K_CUT_RATIO * max(m, n) and m * n * k >= threads * products.CUT_FROM
                and parts * m * n * 4 <= products.K_CUT_SCRATCH_BYTES)


    def blocks_product(a, b):
        """A K cut's product: each thread's block of K by one call, added in block order."""
        k = a.shape[1]
        parts = min(threads, k)
        total = None
        for j in range(parts):
            k0, k1 = j * k // parts, (j + 1) * k // parts
            part = whole_product(a[:, k0:k1], b[k0:k1])
            total = part if total is None else total + part
        return total

    shapes = [(5, 3, 7), (256, 64, 192), (64, 256, 256), (256, 64, 64), (128, 256, 64), (1, 8, 9), (9, 8, 1),
              (300, 1, 5), (1000, 70, 33), (33, 70, 1000), (2, 600, 1000), (1000, 600, 2), (700, 300, 3),
              (64, 512, 192), (192, 600, 33), (3, 40000, 7)]
    report["k cuts"] = []


    def layouts(x):
        rows, columns = x.shape
        return {"C": x, "F": np.asfortranarray(x), "rows apart": np.pad(x, ((0, 0), (0, 3)))[:, :columns],
                "columns apart": np.pad(x.T, ((0, 0), (0, 5)))[:, :rows].T}


    report["size dependent"] = []
    for m, k, n in shapes:
        a0 = rng.standard_normal((m, k)).astype(np.float32)
        b0 = rng.standard_normal((k, n)).astype(np.float32)
        exact = a0.astype(np.float64) @ b0.astype(np.float64)
        whole = whole_product(a0, b0)
        # Whether the library's own products of half the rows and half the columns give the whole
        # product's bits on this CPU: OpenBLAS takes other kernels for some sizes on some CPUs (an AMD
        # EPYC Zen 3: every shape below), and then no block of it is comparable bit for bit
        halves = (m < 2 or np.array_equal(whole_product(a0[:m // 2], b0), whole[:m // 2])) and \
            (n < 2 or np.array_equal(whole_product(a0, np.ascontiguousarray(b0[:, :n // 2])), whole[:, :n // 2]))
        if not halves:
            report["size dependent"].append([m, k, n])
        for an, a in layouts(a0).items():
            for bn, b in layouts(b0).items():
                for out in (np.full((m, n), np.nan, np.float32), np.full((m, n + 2), np.nan, np.float32)[:, :n]):
                    status = fast(a, b, out)
                    again = np.full_like(out, np.nan)
                    fast(a, b, again)
                    cut = k_cut(a, b)
                    if cut:
                        report["k cuts"].append([m, k, n, an, bn])
                    reference = blocks_product(a0, b0) if cut else whole
                    # thin: the layout may pick another kernel; a K cut's reference makes the pool's own calls
                    large = min(m, n) >= 32 if cut else (min(m, n) >= 64 and halves)
                    if status is not None or not np.array_equal(out, again) or \
                            (large and not np.array_equal(out, reference)):
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
    numba.set_num_threads(1)  # one thread: MKL's product, or numpy's OpenBLAS with np.matmul's bits
    report["one thread"] = fast(a, b, np.zeros((4, 5), np.float32))
    report["one thread same"], report["one thread declined"] = [], []
    for m, k, n in ((300, 70, 90), (512, 64, 65), (33, 17, 5), (128, 600, 64)):
        a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
        for x in (a, a.T.copy().T, np.pad(a, ((0, 0), (0, 3)))[:, :k]):
            for y in (b, b.T.copy().T):
                out = np.full((m, n), np.nan, np.float32)
                status = fast(x, y, out)
                # numpy's sgemm: np.matmul's bits in every layout; MKL's where both are row-major (its
                # reference copies them so; its transposed kernels may differ in the last bits)
                if chosen.any_thread and (x is not a or y is not b):
                    exact = x.astype(np.float64) @ y.astype(np.float64)
                    close = np.abs(out - exact).max() <= 1e-5 * max(1.0, np.abs(exact).max())
                    report["one thread same"].append(status is None and bool(close))
                    continue
                want = whole_product(x, y) if chosen.any_thread else np.matmul(x, y)
                report["one thread same"].append(status is None and bool(np.array_equal(out, want)))
    a = rng.standard_normal((40, 30)).astype(np.float32)
    for name, (x, y) in {"row": (a[:1], a.T), "column": (a, a[:1].T), "itself": (a, a.T)}.items():
        out = np.zeros((x.shape[0], y.shape[1]), np.float32)
        if fast(x, y, out) != 1 or out.any():
            report["one thread declined"].append(name)
    print(json.dumps(report))
''')


@pytest.mark.parametrize("threads,library", [("2", "openblas"), ("3", "openblas"), ("2", "mkl"), ("3", "mkl")])
def test_products_on_the_pool_are_right_and_repeat_their_bits(tmp_path, threads, library):
    if library == "mkl" and blas.mkl_library() is None:
        pytest.skip("MKL is not installed (the mkl extra)")
    report = child_report(CHILD, threads=threads, BENDC_BLAS=library)
    assert report["blas"].startswith("MKL" if library == "mkl" else "numpy's OpenBLAS"), report["blas"]
    assert report["own"]
    assert report["differ"] == [] and report["far"] == []
    # every layout of (128, 256, 64), (64, 512, 192), (192, 600, 33), (3, 40000, 7): K cut
    assert {tuple(cut[:3]) for cut in report["k cuts"]} == {(128, 256, 64), (64, 512, 192), (192, 600, 33),
                                                           (3, 40000, 7)}
    assert len(report["k cuts"]) == 4 * 16 * 2  # 4 layouts of a, 4 of b, 2 outputs
    assert report["declined"] == []
    assert report["counts"]["launches"] > 0
    assert report["one thread"] is None, "one thread: one call of MKL's or numpy's sgemm"
    assert all(report["one thread same"]), [i for i, same in enumerate(report["one thread same"]) if not same]
    # numpy's OpenBLAS declines numpy's gemv and syrk cases (numpy's bits); MKL takes them
    assert report["one thread declined"] == ([] if library == "openblas" else ["row", "column", "itself"])


K_CUT_THREADS = textwrap.dedent('''
    import json, threading
    import numpy as np
    from runtime.native import products

    fast = products._fast()
    rng = np.random.default_rng(0)
    cases = []
    for m, k, n in ((64, 512, 192), (96, 1024, 128), (128, 600, 64)):  # each cut along K
        a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
        cases.append((a, b, a.astype(np.float64) @ b.astype(np.float64)))
    wrong = []


    def work(seed):
        order = np.random.default_rng(seed)
        for _ in range(300):
            a, b, exact = cases[order.integers(len(cases))]
            out = np.full((a.shape[0], b.shape[1]), np.nan, np.float32)
            fast(a, b, out)
            if not (np.abs(out - exact) <= 1e-5 * np.abs(exact).max()).all():
                wrong.append(seed)


    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps({"wrong": len(wrong)}))
''')


def test_k_cuts_from_three_python_threads_at_once_keep_their_partials_apart(tmp_path):
    """Three Python threads multiplying products that cut K: one holds the partials' scratch at a
    time, the others cut their products along the output meanwhile; every product right."""
    assert child_report(K_CUT_THREADS, threads="2")["wrong"] == 0
