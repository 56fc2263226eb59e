"""Matrix products on bendc's thread pool: ``matmul(a, b, out)``, out = a @ b.

The sgemm is runtime/native/blas.py's choice. With MKL (sequential, ``BENDC_BLAS``) a float32
product runs on it at every thread count: one call at one thread (no launch), one call a block of
the output above one. Without it, at numba's thread count above 1 the product runs as scipy's
OpenBLAS calls, one per block, held to one thread (``pool.one_blas_thread``), and at one thread as
one call of numpy's OpenBLAS sgemm (numpy's own thread count; np.matmul's bits: numpy's matmul
calls the same sgemm, and its gemv and syrk cases, a row or column vector and a matrix times its own
transpose, are declined to numpy; ~1-2 us a product less than np.matmul's ufunc call). Blocks are
dealt over bendc's pool (runtime/native/pool.py): the step's products and its other parallel kernels
then share one pool. numpy's OpenBLAS keeps its own threads, which
after a call spin for a long time and take the cores from the pool's workers (measured: the
transformer's attention kernels gained nothing at 2 threads beside them); numpy's OpenBLAS has one
global thread count, so it cannot run one thread inside the pool and the user's own count outside
it.

``bendc_matmul`` is a CPython builtin (METH_FASTCALL) compiled from the LLVM IR below: it reads
the three arrays' fields itself (~0.3 us a call against ~7 us for the same work in Python). It
takes float32 matrices whose rows or columns are adjacent (row-major, or a transposed view, any
leading stride: transposes are BLAS flags, not copies) and an output with adjacent columns; for
anything else (and numpy's gemv and syrk cases at one thread without MKL) it returns 1 and
:func:`matmul` calls numpy. The
output is cut along its rows (along its columns when it has fewer rows than columns) into one
block a thread, or, where K is long beside both (``K_CUT_RATIO``: a weight's gradient x^T g over a
batch's rows), K is cut: each thread's sgemm multiplies its block of K into the output (the first)
or a partial product (the others: a scratch the runtime keeps, at most ``K_CUT_SCRATCH_BYTES``,
one product at a time), then the output's rows add the partials in block order over the pool.
The sgemm's integers are 32-bit (scipy's) or 64-bit (MKL's ``sgemm_64``).
Bits: the same at one thread count, call after call; another count may change the last bits of
a product (a thin block can take another sgemm kernel than the whole product: OpenBLAS's (1000,
600) @ (600, 2) does).

Measured (2-vCPU machine, 2 threads, products alone, us): 256x64x192 numpy at one thread 53,
numpy at two 34, the pool 37; 256x64x64 20 / 13 / 9.5; 1024x512x128 1081 / 567 / 548. In a
step the pool's win is that numpy's OpenBLAS threads stay asleep instead of spinning beside the
pool's workers.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np

_STATE: dict[str, Any] = {}
_LOCK = threading.Lock()
# Cut a product over the threads from this many multiply-adds a thread (~4 us of sgemm): below it
# the caller makes one sgemm call, with no launch.
CUT_FROM = 1 << 18
# Cut K instead (each thread multiplies its own rows of K, the partial products are then added in
# block order) where K is at least this many times the output's longer side: a weight's gradient
# over a batch's rows, whose rows the pool's threads wrote (runtime/native/pool.py: each thread the
# same rows of every loop). Alone after a kernel that wrote the operands on the pool, 2 threads:
# (64 x 512) @ (512 x 192) 101-114 -> 75-82 us, (128 x 1024) @ (1024 x 384) 546-548 -> 401; (512 x
# 256) @ (256 x 512) 489-497 against 536-542 cut along K (not cut: K is half the side).
K_CUT_RATIO = 2
# ... and where its partials fit in this many bytes (the scratch is kept for the process's life)
K_CUT_SCRATCH_BYTES = 1 << 24
NPY_FLOAT32 = np.dtype(np.float32).num


def _layout(tag: str, code: int, unit: str, count: str, lead_count: str, lead: str, otherwise: str) -> str:
    """bendc_operand's test for one layout: the ``unit`` stride is one float (or ``count`` is 1),
    and ld, the ``lead`` stride in floats (``count`` where ``lead_count`` is 1), is at least
    ``count``: return (code, ld), else go to ``otherwise``."""
    return "\n".join([
        f"{tag}:", f"  %{tag}.unit = icmp eq i64 %{unit}, 4", f"  %{tag}.one = icmp eq i64 %{count}, 1",
        f"  %{tag}.try = or i1 %{tag}.unit, %{tag}.one", f"  br i1 %{tag}.try, label %{tag}.check, label %{otherwise}",
        f"{tag}.check:", f"  %{tag}.single = icmp sle i64 %{lead_count}, 1", f"  %{tag}.ld.0 = sdiv i64 %{lead}, 4",
        f"  %{tag}.ld = select i1 %{tag}.single, i64 %{count}, i64 %{tag}.ld.0",
        f"  %{tag}.rem = srem i64 %{lead}, 4", f"  %{tag}.whole = icmp eq i64 %{tag}.rem, 0",
        f"  %{tag}.wide = icmp sge i64 %{tag}.ld, %{count}", f"  %{tag}.pos = icmp sge i64 %{tag}.ld, 1",
        f"  %{tag}.ok.1 = and i1 %{tag}.whole, %{tag}.wide", f"  %{tag}.ok = and i1 %{tag}.ok.1, %{tag}.pos",
        f"  br i1 %{tag}.ok, label %{tag}.yes, label %{otherwise}",
        f"{tag}.yes:", f"  %{tag}.r.0 = insertvalue {{ i64, i64 }} undef, i64 {code}, 0",
        f"  %{tag}.r = insertvalue {{ i64, i64 }} %{tag}.r.0, i64 %{tag}.ld, 1", f"  ret {{ i64, i64 }} %{tag}.r"])


def ir(offsets: dict[str, int]) -> str:
    """The products' LLVM IR: the block task, ``bendc_gemm`` over the pool and the builtin's entry."""
    def field(obj: str, name: str, type_: str, tag: str) -> list[str]:
        return [f"  %{tag}.p = getelementptr i8, ptr {obj}, i64 {offsets[name]}",
                f"  %{tag} = load {type_}, ptr %{tag}.p"]

    lines = []
    for x in ("a", "b", "c"):  # each object: an ndarray of 2 dimensions, float32, aligned
        lines += [f"check.{x}:"] + field(f"%{x}", "ob_type", "ptr", f"{x}.type") + [
            f"  %{x}.is = icmp eq ptr %{x}.type, %ndarray",
            f"  br i1 %{x}.is, label %fields.{x}, label %decline",
            f"fields.{x}:"] + field(f"%{x}", "nd", "i32", f"{x}.nd") + field(f"%{x}", "descr", "ptr", f"{x}.descr") \
            + field(f"%{x}.descr", "type_num", "i32", f"{x}.num") + field(f"%{x}", "flags", "i32", f"{x}.flags") + [
            f"  %{x}.two = icmp eq i32 %{x}.nd, 2",
            f"  %{x}.f32 = icmp eq i32 %{x}.num, {NPY_FLOAT32}",
            f"  %{x}.al = and i32 %{x}.flags, 256",
            f"  %{x}.aligned = icmp ne i32 %{x}.al, 0",
            f"  %{x}.ok.1 = and i1 %{x}.two, %{x}.f32",
            f"  %{x}.ok = and i1 %{x}.ok.1, %{x}.aligned",
            f"  br i1 %{x}.ok, label %read.{x}, label %decline",
            f"read.{x}:"] + field(f"%{x}", "data", "ptr", f"{x}.data") \
            + field(f"%{x}", "dimensions", "ptr", f"{x}.dims") + field(f"%{x}", "strides", "ptr", f"{x}.strides") + [
            f"  %{x}.d0 = load i64, ptr %{x}.dims",
            f"  %{x}.d1.p = getelementptr i64, ptr %{x}.dims, i64 1",
            f"  %{x}.d1 = load i64, ptr %{x}.d1.p",
            f"  %{x}.s0 = load i64, ptr %{x}.strides",
            f"  %{x}.s1.p = getelementptr i64, ptr %{x}.strides, i64 1",
            f"  %{x}.s1 = load i64, ptr %{x}.s1.p",
            f"  br label %{'check.' + chr(ord(x) + 1) if x != 'c' else 'shapes'}"]
    checks = "\n".join(lines)
    sizes = ("m", "n", "k", "lda", "ldb", "ldc")  # sgemm's integers, by address: 64-bit (ILP64) or 32-bit
    wide_sizes = "".join(f"  store i64 %{x}, ptr %{x}.a\n" for x in sizes)
    narrow_sizes = "".join(f"  %{x}.32 = trunc i64 %{x} to i32\n  store i32 %{x}.32, ptr %{x}.a\n" for x in sizes)
    return f"""
declare i32 @get_num_threads()
declare void @bendc_parallel_for(ptr, ptr, ptr, ptr, ptr, i64, i64, i32)
declare ptr @PyEval_SaveThread()
declare void @PyEval_RestoreThread(ptr)
declare void @Py_IncRef(ptr)
declare ptr @PyLong_FromLong(i64)
@bendc_ndarray_type = external global ptr
@bendc_none = external global ptr
@bendc_sgemm = global i64 0
@bendc_sgemm_ilp64 = global i64 0
@bendc_sgemm_one_thread = global i64 0
; the sgemm at one thread (one call, no launch): MKL's, or numpy's OpenBLAS (its own thread count)
@bendc_sgemm_single = global i64 0
@bendc_sgemm_single_ilp64 = global i64 0
@bendc_sgemm_single_numpys = global i64 0  ; 1: it is numpy's, whose gemv and syrk cases stay numpy's
; the K cut's partial products (runtime-owned, grown with realloc; one product at a time holds it)
@bendc_scratch = internal global ptr null
@bendc_scratch_bytes = internal global i64 0
@bendc_scratch_busy = internal global i32 0
declare ptr @realloc(ptr, i64)

; the context, i64 words: 0 status, 1 sgemm, 2 transa, 3 transb, 4 M, 5 N, 6 K, 7 A, 8 lda, 9 B,
; 10 ldb, 11 C, 12 ldc, 13 which (0: N is cut, 1: M, 2: K), 14 units (N, M or K), 15 blocks, 16-18 the
; bytes A, B and C advance a unit, 19 ilp64 (1: sgemm's integers are 64-bit), 20 the partials (K
; cut: block j > 0 writes its product to partial j - 1, M x N with ldc M), 21-22 the sum's units (the
; rows of the row-major output, N) and blocks. C = op(A) op(B), column-major (BLAS's sgemm).
define internal i64 @bendc_word(ptr %ctx, i64 %n) alwaysinline {{
entry:
  %p = getelementptr i64, ptr %ctx, i64 %n
  %v = load i64, ptr %p
  ret i64 %v
}}

; the first unit of block ``block`` when ``units`` units are dealt in ``blocks`` blocks (block ``blocks`` is the end)
define internal i64 @bendc_unit_at(i64 %block, i64 %units, i64 %blocks) alwaysinline {{
entry:
  %scaled = mul i64 %block, %units
  %unit = udiv i64 %scaled, %blocks
  ret i64 %unit
}}

; bendc's sgemm (context word 1) of op(A) op(B) into C: M x N of K, the transposes, lda, ldb and the
; integers' width from the context, C's leading dimension given
define internal void @bendc_sgemm_call(ptr %ctx, i64 %m, i64 %n, i64 %k, ptr %a, ptr %b, ptr %c, i64 %ldc) {{
entry:
  %ta = alloca i8
  %tb = alloca i8
  %m.a = alloca i64
  %n.a = alloca i64
  %k.a = alloca i64
  %lda.a = alloca i64
  %ldb.a = alloca i64
  %ldc.a = alloca i64
  %alpha = alloca float
  %beta = alloca float
  %sgemm.i = call i64 @bendc_word(ptr %ctx, i64 1)
  %sgemm = inttoptr i64 %sgemm.i to ptr
  %transa = call i64 @bendc_word(ptr %ctx, i64 2)
  %transb = call i64 @bendc_word(ptr %ctx, i64 3)
  %lda = call i64 @bendc_word(ptr %ctx, i64 8)
  %ldb = call i64 @bendc_word(ptr %ctx, i64 10)
  %ta.8 = trunc i64 %transa to i8
  store i8 %ta.8, ptr %ta
  %tb.8 = trunc i64 %transb to i8
  store i8 %tb.8, ptr %tb
  %ilp64 = call i64 @bendc_word(ptr %ctx, i64 19)
  %wide = icmp ne i64 %ilp64, 0
  br i1 %wide, label %int64, label %int32
int64:
{wide_sizes}  br label %sizes
int32:
{narrow_sizes}  br label %sizes
sizes:
  store float 1.0, ptr %alpha
  store float 0.0, ptr %beta
  call void %sgemm(ptr %ta, ptr %tb, ptr %m.a, ptr %n.a, ptr %k.a, ptr %alpha, ptr %a, ptr %lda.a, ptr %b,
                   ptr %ldb.a, ptr %beta, ptr %c, ptr %ldc.a)
  ret void
}}

; blocks first .. last - 1 of a K cut: block j multiplies K's units [j K / blocks, (j + 1) K / blocks)
; into C (j = 0) or its partial (M x N, ldc M)
define internal void @bendc_gemm_k_blocks(ptr %ctx, i64 %first, i64 %last) {{
entry:
  %m = call i64 @bendc_word(ptr %ctx, i64 4)
  %n = call i64 @bendc_word(ptr %ctx, i64 5)
  %units = call i64 @bendc_word(ptr %ctx, i64 14)
  %blocks = call i64 @bendc_word(ptr %ctx, i64 15)
  %a.i = call i64 @bendc_word(ptr %ctx, i64 7)
  %b.i = call i64 @bendc_word(ptr %ctx, i64 9)
  %c.i = call i64 @bendc_word(ptr %ctx, i64 11)
  %ldc = call i64 @bendc_word(ptr %ctx, i64 12)
  %a.step = call i64 @bendc_word(ptr %ctx, i64 16)
  %b.step = call i64 @bendc_word(ptr %ctx, i64 17)
  %partials = call i64 @bendc_word(ptr %ctx, i64 20)
  %mn = mul i64 %m, %n
  %partial.bytes = mul i64 %mn, 4
  %any = icmp ult i64 %first, %last
  br i1 %any, label %block, label %out
block:
  %j = phi i64 [ %first, %entry ], [ %j.1, %block ]
  %k0 = call i64 @bendc_unit_at(i64 %j, i64 %units, i64 %blocks)
  %j.1 = add i64 %j, 1
  %k1 = call i64 @bendc_unit_at(i64 %j.1, i64 %units, i64 %blocks)
  %k = sub i64 %k1, %k0
  %a.off = mul i64 %k0, %a.step
  %a.at = add i64 %a.i, %a.off
  %a = inttoptr i64 %a.at to ptr
  %b.off = mul i64 %k0, %b.step
  %b.at = add i64 %b.i, %b.off
  %b = inttoptr i64 %b.at to ptr
  %own = icmp eq i64 %j, 0
  %p.j = sub i64 %j, 1
  %p.off = mul i64 %p.j, %partial.bytes
  %p.at = add i64 %partials, %p.off
  %c.at = select i1 %own, i64 %c.i, i64 %p.at
  %c = inttoptr i64 %c.at to ptr
  %ldc.j = select i1 %own, i64 %ldc, i64 %m
  call void @bendc_sgemm_call(ptr %ctx, i64 %m, i64 %n, i64 %k, ptr %a, ptr %b, ptr %c, i64 %ldc.j)
  %more = icmp ult i64 %j.1, %last
  br i1 %more, label %block, label %out
out:
  ret void
}}

; the K cut's sum: rows [u0, u1) of the row-major output (N rows of M, row stride ldc) each adds the
; partials in block order, C = ((P0 + P1) + P2) + ...
define internal void @bendc_gemm_sum_task(ptr %args, ptr %dims, ptr %steps, ptr %ctx) {{
entry:
  %first.p = load ptr, ptr %args
  %first = ptrtoint ptr %first.p to i64
  %count = load i64, ptr %dims
  %last = add i64 %first, %count
  %units = call i64 @bendc_word(ptr %ctx, i64 21)
  %blocks = call i64 @bendc_word(ptr %ctx, i64 22)
  %u0 = call i64 @bendc_unit_at(i64 %first, i64 %units, i64 %blocks)
  %u1 = call i64 @bendc_unit_at(i64 %last, i64 %units, i64 %blocks)
  %m = call i64 @bendc_word(ptr %ctx, i64 4)
  %n = call i64 @bendc_word(ptr %ctx, i64 5)
  %c.i = call i64 @bendc_word(ptr %ctx, i64 11)
  %ldc = call i64 @bendc_word(ptr %ctx, i64 12)
  %parts = call i64 @bendc_word(ptr %ctx, i64 15)
  %partials.i = call i64 @bendc_word(ptr %ctx, i64 20)
  %c0 = inttoptr i64 %c.i to ptr
  %p0 = inttoptr i64 %partials.i to ptr
  %mn = mul i64 %m, %n
  %rows = icmp ult i64 %u0, %u1
  %some = icmp ugt i64 %parts, 1
  %go = and i1 %rows, %some
  br i1 %go, label %part, label %out
part:
  %j = phi i64 [ 1, %entry ], [ %j.1, %part.next ]
  %p.j = sub i64 %j, 1
  %p.skip = mul i64 %p.j, %mn
  br label %row
row:
  %r = phi i64 [ %u0, %part ], [ %r.1, %row.next ]
  %c.row.off = mul i64 %r, %ldc
  %c.row = getelementptr float, ptr %c0, i64 %c.row.off
  %p.row.off.0 = mul i64 %r, %m
  %p.row.off = add i64 %p.row.off.0, %p.skip
  %p.row = getelementptr float, ptr %p0, i64 %p.row.off
  br label %cell
cell:
  %i = phi i64 [ 0, %row ], [ %i.1, %cell ]
  %c.at = getelementptr float, ptr %c.row, i64 %i
  %p.at = getelementptr float, ptr %p.row, i64 %i
  %c.v = load float, ptr %c.at
  %p.v = load float, ptr %p.at
  %sum = fadd float %c.v, %p.v
  store float %sum, ptr %c.at
  %i.1 = add i64 %i, 1
  %cells = icmp ult i64 %i.1, %m
  br i1 %cells, label %cell, label %row.next
row.next:
  %r.1 = add i64 %r, 1
  %more.rows = icmp ult i64 %r.1, %u1
  br i1 %more.rows, label %row, label %part.next
part.next:
  %j.1 = add i64 %j, 1
  %more.parts = icmp ult i64 %j.1, %parts
  br i1 %more.parts, label %part, label %out
out:
  ret void
}}

define internal void @bendc_gemm_task(ptr %args, ptr %dims, ptr %steps, ptr %ctx) {{
entry:
  %first.p = load ptr, ptr %args
  %first = ptrtoint ptr %first.p to i64
  %count = load i64, ptr %dims
  %last = add i64 %first, %count
  %units = call i64 @bendc_word(ptr %ctx, i64 14)
  %blocks = call i64 @bendc_word(ptr %ctx, i64 15)
  %u0 = call i64 @bendc_unit_at(i64 %first, i64 %units, i64 %blocks)
  %u1 = call i64 @bendc_unit_at(i64 %last, i64 %units, i64 %blocks)
  %size = sub i64 %u1, %u0
  %empty = icmp eq i64 %size, 0
  %which.0 = call i64 @bendc_word(ptr %ctx, i64 13)
  %cuts.k = icmp eq i64 %which.0, 2
  br i1 %cuts.k, label %kcut, label %cut
kcut:  ; each block of K its own sgemm call (a chunk can hold several blocks: a busy pool runs them all)
  call void @bendc_gemm_k_blocks(ptr %ctx, i64 %first, i64 %last)
  br label %out
cut:
  br i1 %empty, label %out, label %call
call:
  %m = call i64 @bendc_word(ptr %ctx, i64 4)
  %n = call i64 @bendc_word(ptr %ctx, i64 5)
  %k = call i64 @bendc_word(ptr %ctx, i64 6)
  %a.i = call i64 @bendc_word(ptr %ctx, i64 7)
  %b.i = call i64 @bendc_word(ptr %ctx, i64 9)
  %c.i = call i64 @bendc_word(ptr %ctx, i64 11)
  %ldc = call i64 @bendc_word(ptr %ctx, i64 12)
  %which = call i64 @bendc_word(ptr %ctx, i64 13)
  %a.step = call i64 @bendc_word(ptr %ctx, i64 16)
  %b.step = call i64 @bendc_word(ptr %ctx, i64 17)
  %c.step = call i64 @bendc_word(ptr %ctx, i64 18)
  %a.off = mul i64 %u0, %a.step
  %a.at = add i64 %a.i, %a.off
  %a = inttoptr i64 %a.at to ptr
  %b.off = mul i64 %u0, %b.step
  %b.at = add i64 %b.i, %b.off
  %b = inttoptr i64 %b.at to ptr
  %c.off = mul i64 %u0, %c.step
  %c.at = add i64 %c.i, %c.off
  %c = inttoptr i64 %c.at to ptr
  %cuts.m = icmp eq i64 %which, 1
  %m.1 = select i1 %cuts.m, i64 %size, i64 %m
  %n.1 = select i1 %cuts.m, i64 %n, i64 %size
  call void @bendc_sgemm_call(ptr %ctx, i64 %m.1, i64 %n.1, i64 %k, ptr %a, ptr %b, ptr %c, i64 %ldc)
  br label %out
out:
  ret void
}}

; (trans, ld) of an operand (rows x columns, strides in bytes) read by a column-major BLAS as the
; transpose of its row-major self: 'N' (78) with ld its row stride where its columns are adjacent,
; 'T' (84) with ld its column stride where its rows are; trans 0 for another layout
define internal {{ i64, i64 }} @bendc_operand(i64 %rows, i64 %columns, i64 %row, i64 %column) {{
entry:
  br label %n
{_layout("n", 78, "column", "columns", "rows", "row", "t")}
{_layout("t", 84, "row", "rows", "columns", "column", "no")}
no:
  ret {{ i64, i64 }} zeroinitializer
}}

; bendc_matmul(a, b, out): None where it computed out = a @ b on the pool, else 1 (nothing written)
define ptr @bendc_matmul_fast(ptr %self, ptr %args, i64 %nargs) {{
entry:
  %ctx = alloca [23 x i64]
  %pargs = alloca ptr
  %pdims = alloca i64
  %psteps = alloca i64
  %three = icmp eq i64 %nargs, 3
  br i1 %three, label %unpack, label %decline
unpack:
  %a = load ptr, ptr %args
  %b.p = getelementptr ptr, ptr %args, i64 1
  %b = load ptr, ptr %b.p
  %c.p = getelementptr ptr, ptr %args, i64 2
  %c = load ptr, ptr %c.p
  %ndarray = load ptr, ptr @bendc_ndarray_type
  br label %check.a
{checks}
shapes:
  %threads = call i32 @get_num_threads()
  %many = icmp sgt i32 %threads, 1
  %same.k = icmp eq i64 %a.d1, %b.d0
  %same.m = icmp eq i64 %c.d0, %a.d0
  %same.n = icmp eq i64 %c.d1, %b.d1
  %ok.1 = and i1 %same.k, %same.m
  %ok.2 = and i1 %ok.1, %same.n
  %one.ok.w = load i64, ptr @bendc_sgemm_one_thread
  %one.ok.0 = icmp ne i64 %one.ok.w, 0
  ; at one thread on numpy's OpenBLAS numpy's own cases stay numpy's, for its bits: a row or column
  ; vector (its gemv) and a product of one matrix's data with itself (its syrk, where A @ A^T)
  %vec.m = icmp eq i64 %a.d0, 1
  %vec.n = icmp eq i64 %b.d1, 1
  %vec = or i1 %vec.m, %vec.n
  %same.data = icmp eq ptr %a.data, %b.data
  %numpys.0 = or i1 %vec, %same.data
  %numpys.w = load i64, ptr @bendc_sgemm_single_numpys
  %numpys.on = icmp ne i64 %numpys.w, 0
  %numpys = and i1 %numpys.0, %numpys.on
  %gemm = xor i1 %numpys, true
  %one.ok = and i1 %one.ok.0, %gemm
  %threads.ok = or i1 %many, %one.ok
  %ok.3 = and i1 %ok.2, %threads.ok
  %m.pos = icmp sgt i64 %a.d0, 0
  %k.pos = icmp sgt i64 %a.d1, 0
  %n.pos = icmp sgt i64 %b.d1, 0
  %m.int = icmp slt i64 %a.d0, 2147483648
  %k.int = icmp slt i64 %a.d1, 2147483648
  %n.int = icmp slt i64 %b.d1, 2147483648
  %ok.4 = and i1 %ok.3, %m.pos
  %ok.5 = and i1 %ok.4, %k.pos
  %ok.6 = and i1 %ok.5, %n.pos
  %ok.7 = and i1 %ok.6, %m.int
  %ok.8 = and i1 %ok.7, %k.int
  %ok.9 = and i1 %ok.8, %n.int
  br i1 %ok.9, label %layouts, label %decline
layouts:
  %m = add i64 %a.d0, 0
  %k = add i64 %a.d1, 0
  %n = add i64 %b.d1, 0
  %out.unit = icmp eq i64 %c.s1, 4
  %out.rem = srem i64 %c.s0, 4
  %out.whole = icmp eq i64 %out.rem, 0
  %out.ld.0 = sdiv i64 %c.s0, 4
  %out.m1 = icmp eq i64 %m, 1
  %c.ld = select i1 %out.m1, i64 %n, i64 %out.ld.0
  %out.wide = icmp sge i64 %c.ld, %n
  %out.ok.1 = and i1 %out.unit, %out.whole
  %out.ok = and i1 %out.ok.1, %out.wide
  %left = call {{ i64, i64 }} @bendc_operand(i64 %k, i64 %n, i64 %b.s0, i64 %b.s1)
  %right = call {{ i64, i64 }} @bendc_operand(i64 %m, i64 %k, i64 %a.s0, i64 %a.s1)
  %transa = extractvalue {{ i64, i64 }} %left, 0
  %lda = extractvalue {{ i64, i64 }} %left, 1
  %transb = extractvalue {{ i64, i64 }} %right, 0
  %ldb = extractvalue {{ i64, i64 }} %right, 1
  %l.ok = icmp ne i64 %transa, 0
  %r.ok = icmp ne i64 %transb, 0
  %lr.ok = and i1 %l.ok, %r.ok
  %all.ok = and i1 %lr.ok, %out.ok
  br i1 %all.ok, label %plan, label %decline
plan:
  %threads.64 = sext i32 %threads to i64
  %mn = mul i64 %m, %n
  %mnk = mul i64 %mn, %k
  %enough.at = mul i64 %threads.64, {CUT_FROM}
  %enough = icmp sge i64 %mnk, %enough.at
  %blocks.0 = select i1 %enough, i64 %threads.64, i64 1
  %by.rows = icmp sge i64 %m, %n
  %which.0 = select i1 %by.rows, i64 0, i64 1
  %units.0 = select i1 %by.rows, i64 %m, i64 %n
  %few = icmp ult i64 %units.0, %blocks.0
  %blocks.1 = select i1 %few, i64 %units.0, i64 %blocks.0
  %step.a.0 = select i1 %by.rows, i64 0, i64 %b.s1
  %step.b.0 = select i1 %by.rows, i64 %a.s0, i64 0
  %step.c = select i1 %by.rows, i64 %c.s0, i64 4
  ; K at least {K_CUT_RATIO}x the output's longer side (a weight's gradient over a batch's rows): K is cut,
  ; each thread's sgemm reads its own rows of both operands, and the partials are added
  %wider = select i1 %by.rows, i64 %m, i64 %n
  %k.need = mul i64 %wider, {K_CUT_RATIO}
  %long.k = icmp sge i64 %k, %k.need
  %shared = icmp sgt i64 %blocks.0, 1
  %few.k = icmp ult i64 %k, %blocks.0
  %k.blocks = select i1 %few.k, i64 %k, i64 %blocks.0
  %k.parts = sub i64 %k.blocks, 1
  %part.cells = mul i64 %k.parts, %mn
  %need = mul i64 %part.cells, 4
  %fits = icmp ule i64 %need, {K_CUT_SCRATCH_BYTES}
  %want.k.0 = and i1 %long.k, %shared
  %want.k = and i1 %want.k.0, %fits
  br i1 %want.k, label %scratch, label %whole
scratch:
  %held = cmpxchg ptr @bendc_scratch_busy, i32 0, i32 1 acquire monotonic
  %got = extractvalue {{ i32, i1 }} %held, 1
  br i1 %got, label %size, label %whole
size:
  %have = load i64, ptr @bendc_scratch_bytes
  %short = icmp ugt i64 %need, %have
  br i1 %short, label %grow, label %ready
grow:
  %old = load ptr, ptr @bendc_scratch
  %new = call ptr @realloc(ptr %old, i64 %need)
  %failed = icmp eq ptr %new, null
  br i1 %failed, label %let.go, label %grown
grown:
  store ptr %new, ptr @bendc_scratch
  store i64 %need, ptr @bendc_scratch_bytes
  br label %ready
let.go:
  store atomic i32 0, ptr @bendc_scratch_busy release, align 4
  br label %whole
ready:
  %partials.r = load ptr, ptr @bendc_scratch
  br label %cut.chosen
whole:
  br label %cut.chosen
cut.chosen:
  %k.cut = phi i1 [ true, %ready ], [ false, %whole ]
  %k.blocks.p = phi i64 [ %k.blocks, %ready ], [ 1, %whole ]
  %partials.p = phi ptr [ %partials.r, %ready ], [ null, %whole ]
  %which = select i1 %k.cut, i64 2, i64 %which.0
  %units = select i1 %k.cut, i64 %k, i64 %units.0
  %blocks = select i1 %k.cut, i64 %k.blocks.p, i64 %blocks.1
  %step.a = select i1 %k.cut, i64 %b.s0, i64 %step.a.0
  %step.b = select i1 %k.cut, i64 %a.s1, i64 %step.b.0
  %partials = ptrtoint ptr %partials.p to i64
  %few.rows = icmp ult i64 %m, %threads.64
  %sum.blocks = select i1 %few.rows, i64 %m, i64 %threads.64
  %sgemm.many = load i64, ptr @bendc_sgemm
  %ilp64.many = load i64, ptr @bendc_sgemm_ilp64
  %sgemm.one = load i64, ptr @bendc_sgemm_single
  %ilp64.one = load i64, ptr @bendc_sgemm_single_ilp64
  %sgemm = select i1 %many, i64 %sgemm.many, i64 %sgemm.one
  %ilp64 = select i1 %many, i64 %ilp64.many, i64 %ilp64.one
  %a.i = ptrtoint ptr %a.data to i64
  %b.i = ptrtoint ptr %b.data to i64
  %c.i = ptrtoint ptr %c.data to i64
  store i64 0, ptr %ctx
""" + "".join(f"  %w{i}.p = getelementptr i64, ptr %ctx, i64 {i}\n  store i64 {value}, ptr %w{i}.p\n"
              for i, value in enumerate(["%sgemm", "%transa", "%transb", "%n", "%m", "%k", "%b.i", "%lda", "%a.i",
                                         "%ldb", "%c.i", "%c.ld", "%which", "%units", "%blocks", "%step.a",
                                         "%step.b", "%step.c", "%ilp64", "%partials", "%m", "%sum.blocks"],
                                        start=1)) + f"""
  store ptr null, ptr %pargs
  store i64 %blocks, ptr %pdims
  store i64 1, ptr %psteps
  %thread = call ptr @PyEval_SaveThread()
  %alone = icmp eq i64 %blocks, 1
  br i1 %alone, label %direct, label %pooled
direct:  ; one block: the caller's own sgemm call, no launch
  call void @bendc_gemm_task(ptr %pargs, ptr %pdims, ptr %psteps, ptr %ctx)
  br label %done
pooled:
  call void @bendc_parallel_for(ptr @bendc_gemm_task, ptr %pargs, ptr %pdims, ptr %psteps, ptr %ctx, i64 0,
                                i64 1, i32 %threads)
  br i1 %k.cut, label %sum, label %done
sum:  ; the partials added into C, its rows over the pool, then the partials given back
  store i64 %sum.blocks, ptr %pdims
  call void @bendc_parallel_for(ptr @bendc_gemm_sum_task, ptr %pargs, ptr %pdims, ptr %psteps, ptr %ctx, i64 0,
                                i64 1, i32 %threads)
  store atomic i32 0, ptr @bendc_scratch_busy release, align 4
  br label %done
done:
  call void @PyEval_RestoreThread(ptr %thread)
  %none = load ptr, ptr @bendc_none
  call void @Py_IncRef(ptr %none)
  ret ptr %none
decline:
  %one = call ptr @PyLong_FromLong(i64 1)
  ret ptr %one
}}
"""


def _fast() -> Callable[..., Any] | None:
    """The builtin (None where prange loops run on numba's layer: the user chose one)."""
    if "fast" not in _STATE:
        with _LOCK:
            if "fast" not in _STATE:
                from numba import _helperlib

                from runtime.native import blas, pool
                from runtime.native.jit import _builtin_function, llvm_state, numpy_offsets

                state = llvm_state()
                pool.install(state)
                fast = None
                if pool.uses_own_pool():
                    state.load(state.compile(ir(numpy_offsets())), "bendc_matmul_fast")
                    chosen = blas.sgemm()
                    if chosen.address and chosen.any_thread:  # MKL: at any thread count
                        sgemm, ilp64 = chosen.address, chosen.ilp64
                    else:  # scipy's OpenBLAS (LP64), above one thread; numpy's OpenBLAS at one
                        sgemm = _helperlib._import_cython_function("scipy.linalg.cython_blas", "sgemm")
                        ilp64 = False
                    pool.global_int64("bendc_sgemm").value = sgemm
                    pool.global_int64("bendc_sgemm_ilp64").value = int(ilp64)
                    pool.global_int64("bendc_sgemm_single").value = chosen.address
                    pool.global_int64("bendc_sgemm_single_ilp64").value = int(chosen.ilp64)
                    pool.global_int64("bendc_sgemm_single_numpys").value = int(not chosen.any_thread)
                    pool.global_int64("bendc_sgemm_one_thread").value = int(chosen.address != 0)
                    fast = _builtin_function(state.address("bendc_matmul_fast"), "bendc_matmul")
                _STATE["fast"] = fast
    return _STATE["fast"]


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out = a @ b (matrices): bendc's sgemm (float32 operands with adjacent rows or columns; on the
    pool at numba's thread count above 1, and at one with MKL), else numpy's."""
    fast = _STATE["fast"] if "fast" in _STATE else _fast()
    if fast is None or fast(a, b, out) is not None:
        np.matmul(a, b, out=out)
