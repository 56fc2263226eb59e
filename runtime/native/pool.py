"""bendc's thread pool for the native kernels' ``prange`` loops: ``bendc_parallel_for``.

A native kernel's ``prange`` loop (runtime/native/translate.py) calls ``bendc_parallel_for`` with
numba's ``numba_parallel_for`` arguments: a gufunc-shaped task, ``args[0]`` the first index as a
pointer, ``dims[0]`` the count, the captured values in ``data``, and numba's thread count. Numba's
workqueue layer makes the caller wait on a condition while its workers wake from theirs (66-75 us
a launch on the 2-vCPU machine, and 3-4x slower kernels inside a step at 2 threads, measured in
stop 40); its OpenMP layer spins but collapses beside PyTorch's OpenMP runtime. This pool:

- The caller works: it publishes the loop, then claims chunks itself beside the workers, so n
  threads take n - 1 workers. A launch finds the loop's chunks claimed by whoever is awake; a
  worker that wakes late finds nothing left and goes back to waiting.
- Chunks are claimed one at a time from one atomic word (the loop's chunk count, the caller's
  claims so far, the workers' claims so far): a loop is cut into ``SPLIT`` chunks a thread (whole
  ranges of indices, at most the count), so a thread that the machine slows down holds up at most
  one chunk. The loop's iterations are independent (the translator refuses reductions), so the cut
  changes no value.
- The caller claims from the first chunk up, the workers from the last chunk down, until they
  meet: at 2 threads the caller runs the leading rows of every loop and the worker the trailing
  ones, so a kernel finds the rows the previous one wrote in its own core's cache (claimed in one
  order by whoever came first, a step's rows moved between the cores' caches from kernel to
  kernel). gpt_small at 2 threads 4.21-4.42 -> 3.93-4.01 ms a step, transformer 4.25-4.54 ->
  4.02-4.12, cnn 1.43-1.57 -> 1.39-1.46 (alternating runs; 8 chunks a thread against 4: within
  noise, and as good as 16).
- Workers spin ``BENDC_POOL_SPIN_US`` microseconds (``SPIN_MICROSECONDS``) after their last
  chunk, yielding their core every few microseconds, then sleep on a futex; a launch wakes them
  only when one sleeps. The caller never waits for a sleeping worker: it takes the chunks itself.
- One loop at a time: a launch that finds the pool busy (another Python thread's kernel, or a
  ``prange`` inside a task) runs its loop serially in its own thread.
- After ``fork`` the child starts its own workers on its first launch.

Why a claim is safe: the caller writes the loop's fields, zeroes the done count, then stores the
word (release); a thread claims with one fetch-add (acquire) and reads the fields only when the
index it got is below the word's chunk count. Such a chunk is not done, so the caller, which
waits for every chunk before it returns (and before it writes the next loop's fields), is still
in this loop: the fields are this loop's. A thread that comes late adds past the count (or onto
the next loop's word, a claim of that loop, as good as any).

Linux only (futex); elsewhere, or when the user set ``NUMBA_THREADING_LAYER``, the symbol is
numba's own ``numba_parallel_for``.
"""
from __future__ import annotations

import ctypes
import os
import platform
import threading
from typing import Any

SPLIT = 8          # chunks a thread
SPIN_MICROSECONDS = 500  # a worker spins this long after its last chunk (BENDC_POOL_SPIN_US overrides)
MAX_WORKERS = 255  # workers started at most (threads - 1)
SYMBOL = "bendc_parallel_for"
# The claim word: the caller's claims so far (bits 0-23), the workers' (24-47), the loop's chunk
# count (48-63: at most (MAX_WORKERS + 1) * SPLIT)
BACK_SHIFT = 24
CHUNKS_SHIFT = 48
COUNT_MASK = (1 << BACK_SHIFT) - 1
_FUTEX = {"x86_64": 202, "aarch64": 98}  # SYS_futex
_PAUSE = {"x86_64": ("call void @llvm.x86.sse2.pause()", "declare void @llvm.x86.sse2.pause()"),
          "aarch64": ("call void @llvm.aarch64.hint(i32 1)", "declare void @llvm.aarch64.hint(i32)")}

_LOCK = threading.Lock()
_INSTALLED: dict[str, Any] = {}


def supported() -> bool:
    return platform.system() == "Linux" and platform.machine() in _FUTEX


def uses_own_pool() -> bool:
    """Whether prange loops run on this pool (the default) or on numba's threading layer (the user
    chose one with ``NUMBA_THREADING_LAYER``, or the platform has no futex); once the pool is
    installed, what it was installed as."""
    if "own" in _INSTALLED:
        return bool(_INSTALLED["own"])
    return supported() and "NUMBA_THREADING_LAYER" not in os.environ


def spin_nanoseconds() -> int:
    text = os.environ.get("BENDC_POOL_SPIN_US", str(SPIN_MICROSECONDS))
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"BENDC_POOL_SPIN_US must be a whole number of microseconds (0 or more), not {text!r}")
    return value * 1000


def ir() -> str:
    """The pool's LLVM IR (one module: its globals, the workers, ``bendc_parallel_for``)."""
    machine = platform.machine()
    futex, (pause, pause_declaration) = _FUTEX[machine], _PAUSE[machine]
    return f"""
%timespec = type {{ i64, i64 }}

@bendc_pool_word = internal global i64 0, align 64
@bendc_pool_done = internal global i64 0, align 64
@bendc_pool_gen = internal global i32 0, align 64
@bendc_pool_sleepers = internal global i32 0, align 64
@bendc_pool_busy = internal global i32 0, align 64
@bendc_pool_started = internal global i32 0, align 64
@bendc_pool_workers = internal global i32 0
@bendc_pool_task = internal global ptr null
@bendc_pool_first = internal global i64 0
@bendc_pool_total = internal global i64 0
@bendc_pool_chunk = internal global i64 0
@bendc_pool_data = internal global ptr null
@bendc_pool_steps = internal global ptr null
@bendc_pool_spin = global i64 {spin_nanoseconds()}
@bendc_pool_launches = global i64 0
@bendc_pool_serial = global i64 0
@bendc_pool_helped = global i64 0

declare i64 @syscall(i64, ...)
declare i32 @pthread_create(ptr, ptr, ptr, ptr)
declare i32 @pthread_detach(i64)
declare i32 @clock_gettime(i32, ptr)
declare i32 @sched_yield()
{pause_declaration}

define internal i64 @bendc_pool_now() {{
entry:
  %t = alloca %timespec
  call i32 @clock_gettime(i32 1, ptr %t)
  %s.p = getelementptr %timespec, ptr %t, i32 0, i32 0
  %s = load i64, ptr %s.p
  %n.p = getelementptr %timespec, ptr %t, i32 0, i32 1
  %n = load i64, ptr %n.p
  %ns = mul i64 %s, 1000000000
  %now = add i64 %ns, %n
  ret i64 %now
}}

; the chunk a claim took: the word before the claim's add (front claims, back claims, chunks),
; the caller's claims (helper 0) counting from the first chunk, the workers' from the last; -1: none left
define i64 @bendc_pool_claim(i64 %word, i64 %helper) {{
entry:
  %back = icmp ne i64 %helper, 0
  %front.n = and i64 %word, {COUNT_MASK}
  %back.s = lshr i64 %word, {BACK_SHIFT}
  %back.n = and i64 %back.s, {COUNT_MASK}
  %chunks = lshr i64 %word, {CHUNKS_SHIFT}
  %taken = add i64 %front.n, %back.n
  %open = icmp ult i64 %taken, %chunks
  %last = sub i64 %chunks, 1
  %from.back = sub i64 %last, %back.n
  %index = select i1 %back, i64 %from.back, i64 %front.n
  %claimed = select i1 %open, i64 %index, i64 -1
  ret i64 %claimed
}}

; claims chunks of the published loop and runs them until none is left
define internal void @bendc_pool_run(i64 %helper) {{
entry:
  %args = alloca ptr
  %dims = alloca i64
  br label %claim
claim:
  %back = icmp ne i64 %helper, 0
  %step = select i1 %back, i64 {1 << BACK_SHIFT}, i64 1
  %word = atomicrmw add ptr @bendc_pool_word, i64 %step acq_rel
  %index = call i64 @bendc_pool_claim(i64 %word, i64 %helper)
  %open = icmp sge i64 %index, 0
  br i1 %open, label %run, label %out
run:
  %task = load ptr, ptr @bendc_pool_task
  %first = load i64, ptr @bendc_pool_first
  %total = load i64, ptr @bendc_pool_total
  %chunk = load i64, ptr @bendc_pool_chunk
  %data = load ptr, ptr @bendc_pool_data
  %steps = load ptr, ptr @bendc_pool_steps
  %start = mul i64 %index, %chunk
  %left = sub i64 %total, %start
  %short = icmp ult i64 %left, %chunk
  %count = select i1 %short, i64 %left, i64 %chunk
  %at = add i64 %first, %start
  %at.p = inttoptr i64 %at to ptr
  store ptr %at.p, ptr %args
  store i64 %count, ptr %dims
  call void %task(ptr %args, ptr %dims, ptr %steps, ptr %data)
  atomicrmw add ptr @bendc_pool_helped, i64 %helper monotonic
  atomicrmw add ptr @bendc_pool_done, i64 1 release
  br label %claim
out:
  ret void
}}

define internal ptr @bendc_pool_worker(ptr %arg) {{
entry:
  %seen.a = alloca i32
  %number.i = ptrtoint ptr %arg to i64
  %number = trunc i64 %number.i to i32
  %g0 = load atomic i32, ptr @bendc_pool_gen acquire, align 4
  store i32 %g0, ptr %seen.a
  br label %work
work:
  %limit = load atomic i32, ptr @bendc_pool_workers monotonic, align 4
  %takes = icmp slt i32 %number, %limit
  br i1 %takes, label %do, label %wait
do:
  call void @bendc_pool_run(i64 1)
  br label %wait
wait:
  %seen = load i32, ptr %seen.a
  %t0 = call i64 @bendc_pool_now()
  %spin = load atomic i64, ptr @bendc_pool_spin monotonic, align 8
  br label %poll
poll:
  %i = phi i64 [ 0, %wait ], [ %i1, %again ]
  %g = load atomic i32, ptr @bendc_pool_gen acquire, align 4
  %new = icmp ne i32 %g, %seen
  br i1 %new, label %woke, label %pause
pause:
  {pause}
  %i1 = add i64 %i, 1
  %low = and i64 %i1, 63
  %look = icmp eq i64 %low, 0
  br i1 %look, label %clock, label %again
clock:
  %t = call i64 @bendc_pool_now()
  %spent = sub i64 %t, %t0
  %over = icmp sge i64 %spent, %spin
  br i1 %over, label %sleep, label %yield
yield:
  call i32 @sched_yield()
  br label %again
again:
  br label %poll
sleep:
  atomicrmw add ptr @bendc_pool_sleepers, i32 1 seq_cst
  br label %check
check:
  %g2 = load atomic i32, ptr @bendc_pool_gen seq_cst, align 4
  %same = icmp eq i32 %g2, %seen
  br i1 %same, label %futex, label %awake
futex:
  %seen64 = zext i32 %seen to i64
  call i64 (i64, ...) @syscall(i64 {futex}, ptr @bendc_pool_gen, i64 128, i64 %seen64, ptr null)
  br label %check
awake:
  atomicrmw sub ptr @bendc_pool_sleepers, i32 1 seq_cst
  store i32 %g2, ptr %seen.a
  br label %work
woke:
  store i32 %g, ptr %seen.a
  br label %work
}}

; in a forked child (os.register_at_fork): no workers, nothing in flight
define void @bendc_pool_child() {{
entry:
  store i32 0, ptr @bendc_pool_started
  store i32 0, ptr @bendc_pool_workers
  store i32 0, ptr @bendc_pool_sleepers
  store i32 0, ptr @bendc_pool_busy
  ret void
}}

define void @{SYMBOL}(ptr %task, ptr %args, ptr %dims, ptr %steps, ptr %data, i64 %unused0, i64 %unused1,
                      i32 %threads) {{
entry:
  %tid = alloca i64
  %total = load i64, ptr %dims
  %few = icmp sle i32 %threads, 1
  %one = icmp sle i64 %total, 1
  %alone = or i1 %few, %one
  br i1 %alone, label %serial, label %lock
serial:
  call void %task(ptr %args, ptr %dims, ptr %steps, ptr %data)
  ret void
lock:
  %pair = cmpxchg ptr @bendc_pool_busy, i32 0, i32 1 acquire monotonic
  %got = extractvalue {{ i32, i1 }} %pair, 1
  br i1 %got, label %start, label %taken
taken:
  atomicrmw add ptr @bendc_pool_serial, i64 1 monotonic
  br label %serial
start:
  atomicrmw add ptr @bendc_pool_launches, i64 1 monotonic
  %want.0 = sub i32 %threads, 1
  %cap = icmp sgt i32 %want.0, {MAX_WORKERS}
  %want = select i1 %cap, i32 {MAX_WORKERS}, i32 %want.0
  br label %spawn
spawn:
  %have = load i32, ptr @bendc_pool_started
  %need = icmp slt i32 %have, %want
  br i1 %need, label %create, label %publish
create:
  %have.64 = zext i32 %have to i64
  %number = inttoptr i64 %have.64 to ptr
  %rc = call i32 @pthread_create(ptr %tid, ptr null, ptr @bendc_pool_worker, ptr %number)
  %ok = icmp eq i32 %rc, 0
  br i1 %ok, label %created, label %publish
created:
  %thread = load i64, ptr %tid
  call i32 @pthread_detach(i64 %thread)
  %have.1 = add i32 %have, 1
  store i32 %have.1, ptr @bendc_pool_started
  br label %spawn
publish:
  %started = load i32, ptr @bendc_pool_started
  %fewer = icmp slt i32 %started, %want
  %workers = select i1 %fewer, i32 %started, i32 %want
  store atomic i32 %workers, ptr @bendc_pool_workers monotonic, align 4
  %workers.64 = zext i32 %workers to i64
  %team = add i64 %workers.64, 1
  %parts = mul i64 %team, {SPLIT}
  %enough = icmp ult i64 %total, %parts
  %cut = select i1 %enough, i64 %total, i64 %parts
  %cut.1 = sub i64 %cut, 1
  %round = add i64 %total, %cut.1
  %chunk = udiv i64 %round, %cut
  %chunk.1 = sub i64 %chunk, 1
  %round.2 = add i64 %total, %chunk.1
  %chunks = udiv i64 %round.2, %chunk
  %first.p = load ptr, ptr %args
  %first = ptrtoint ptr %first.p to i64
  store ptr %task, ptr @bendc_pool_task
  store i64 %first, ptr @bendc_pool_first
  store i64 %total, ptr @bendc_pool_total
  store i64 %chunk, ptr @bendc_pool_chunk
  store ptr %data, ptr @bendc_pool_data
  store ptr %steps, ptr @bendc_pool_steps
  store atomic i64 0, ptr @bendc_pool_done monotonic, align 8
  %word = shl i64 %chunks, {CHUNKS_SHIFT}
  store atomic i64 %word, ptr @bendc_pool_word release, align 8
  atomicrmw add ptr @bendc_pool_gen, i32 1 seq_cst
  %sleeping = load atomic i32, ptr @bendc_pool_sleepers seq_cst, align 4
  %any = icmp sgt i32 %sleeping, 0
  br i1 %any, label %wake, label %own
wake:
  call i64 (i64, ...) @syscall(i64 {futex}, ptr @bendc_pool_gen, i64 129, i64 2147483647)
  br label %own
own:
  call void @bendc_pool_run(i64 0)
  br label %finish
finish:
  %j = phi i64 [ 0, %own ], [ %j1, %back ]
  %done = load atomic i64, ptr @bendc_pool_done acquire, align 8
  %all = icmp eq i64 %done, %chunks
  br i1 %all, label %end, label %pausing
pausing:
  {pause}
  %j1 = add i64 %j, 1
  %lowj = and i64 %j1, 1023
  %yields = icmp eq i64 %lowj, 0
  br i1 %yields, label %give, label %back
give:
  call i32 @sched_yield()
  br label %back
back:
  br label %finish
end:
  store atomic i32 0, ptr @bendc_pool_busy release, align 4
  ret void
}}
"""


def one_blas_thread() -> None:
    """scipy's OpenBLAS (which numba's np.dot and runtime/native/products.py call) runs one
    thread: its calls come from the pool's threads, and its own threads would take the same cores
    (a product past OpenBLAS's threading threshold, 64 x 64 x 128, measured 35x slower at D=128
    inside prange). numpy's OpenBLAS is another library and keeps its threads for the user's numpy."""
    if _INSTALLED.get("one_thread"):
        return
    import glob

    import scipy

    for path in glob.glob(os.path.join(os.path.dirname(scipy.__file__) + ".libs", "libscipy_openblas*.so")):
        setter = getattr(ctypes.CDLL(path), "scipy_openblas_set_num_threads", None)
        if setter is not None:
            setter(1)
    _INSTALLED["one_thread"] = True


def install(state: Any) -> int:
    """Compile and load the pool into the process's LLVM state once and bind ``bendc_parallel_for``
    (to numba's ``numba_parallel_for`` where :func:`uses_own_pool` says no); its address."""
    if SYMBOL in _INSTALLED:
        return _INSTALLED[SYMBOL]
    with _LOCK:
        if SYMBOL in _INSTALLED:
            return _INSTALLED[SYMBOL]
        from numba.np.ufunc.parallel import _launch_threads

        _launch_threads()  # get_num_threads, and numba_parallel_for for the user's layer
        llvm = state.llvm
        own = uses_own_pool()
        one_blas_thread()
        if own:
            address = state.load(state.compile(ir()), SYMBOL)
            _INSTALLED["state"] = state
            child = ctypes.CFUNCTYPE(None)(state.address("bendc_pool_child"))
            _INSTALLED["child"] = child  # kept alive: called in every forked child
            os.register_at_fork(after_in_child=child)
        else:
            address = llvm.address_of_symbol("numba_parallel_for")
        llvm.add_symbol(SYMBOL, address)
        _INSTALLED["own"] = own
        _INSTALLED[SYMBOL] = address
        return address


def global_int64(name: str) -> Any:
    """The int64 global ``name`` of an object loaded into the pool's engine (the pool's counters,
    runtime/native/products.py's sgemm address), None before :func:`install` loaded the pool."""
    state = _INSTALLED.get("state")
    if state is None:
        return None
    address = state.engine.get_global_value_address(name)
    return ctypes.c_int64.from_address(address) if address else None


def claimed(word: int, helper: int) -> int:
    """The chunk a claim took that found ``word`` (before its add) in the claim word: the pool's own
    ``bendc_pool_claim`` (the caller's claims, helper 0, count from the first chunk; the workers'
    from the last), -1 where none was left; None before :func:`install` loaded the pool."""
    state = _INSTALLED.get("state")
    if state is None:
        return None
    function = _INSTALLED.get("claim")
    if function is None:
        function = _INSTALLED["claim"] = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)(
            state.address("bendc_pool_claim"))
    return function(word, helper)


def counts() -> dict[str, int]:
    """Launches the pool ran in parallel, launches it ran serially because it was busy, and chunks
    its workers ran (the caller ran the others); zeros before a native prange kernel loaded it."""
    names = {"launches": "bendc_pool_launches", "serial": "bendc_pool_serial", "helped": "bendc_pool_helped"}
    values = {key: global_int64(name) for key, name in names.items()}
    return {key: value.value if value is not None else 0 for key, value in values.items()}
