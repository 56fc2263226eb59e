"""Progress of cold compiles: numba's compile events and native compiles, counted; a line on stderr
when it is a terminal.

numba compiles a kernel when it is first called, so what a cold first call
(or ``bendc compile``, whose trial run compiles every kernel) spends its time
on is numba's ``numba:compile`` events. :class:`CompileWatch` counts the functions of
bendc's generated kernel modules (kernels and their helpers) that numba
compiles while it is active, and, once a second has passed and only when
``stream`` is a terminal, redraws one line: ``bendc: compiling kernels
12/57, 3.4 s`` (of the functions not compiled yet when the plan was bound). Elsewhere (pipes, files, tests) it
prints nothing; the counts are there for ``bendc compile``'s summary.
"""
from __future__ import annotations

import sys
import time
from typing import Any, TextIO

DELAY_SECONDS = 1.0
_ACTIVE: list["CompileWatch"] = []


def expect(total: int) -> None:
    """The number of kernels the active watch (if any) should expect to compile."""
    for watch in _ACTIVE:
        watch.total += total


def compiled_elsewhere(count: int) -> None:
    """``count`` kernel functions were compiled in a worker process (bendc/codegen/compile_pool.py),
    whose numba events this process does not see."""
    for watch in _ACTIVE:
        watch.functions += count
        watch.draw()


class CompileWatch:
    """A numba event listener (registered as a virtual subclass of numba.core.event.Listener when
    entered, so that importing this module does not import numba)."""

    def __init__(self, stream: TextIO | None = None, delay: float = DELAY_SECONDS) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.interactive = bool(getattr(self.stream, "isatty", lambda: False)())
        self.delay = delay
        self.functions = 0  # bendc kernel-module functions numba compiled (kernels and helpers)
        self.total = 0
        self.start = time.perf_counter()
        self.drawn = False

    def on_start(self, data: Any) -> None:
        pass

    def notify(self, data: Any) -> None:
        if getattr(data, "is_end", False):
            self.on_end(data)

    def on_end(self, data: Any) -> None:
        dispatcher = (data.data or {}).get("dispatcher") if hasattr(data, "data") else None
        function = getattr(dispatcher, "py_func", None)
        if function is None or not str(getattr(function, "__module__", "")).startswith("bendc_kernel_"):
            return
        self.functions += 1
        self.draw()

    def draw(self) -> None:
        elapsed = time.perf_counter() - self.start
        if not self.interactive or elapsed < self.delay:
            return
        of = f"/{self.total}" if self.total >= self.functions else ""
        self.stream.write(f"\rbendc: compiling kernels {self.functions}{of}, {elapsed:.1f} s\x1b[K")
        self.stream.flush()
        self.drawn = True

    def native_compiled(self, module: str, function: str) -> None:
        """A kernel function compiled natively (runtime/native: no numba event)."""
        self.functions += 1
        self.draw()

    def __enter__(self) -> "CompileWatch":
        from numba.core import event

        from runtime.native.jit import COMPILE_LISTENERS

        event.Listener.register(CompileWatch)
        event.register("numba:compile", self)
        COMPILE_LISTENERS.append(self.native_compiled)
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        from numba.core import event

        from runtime.native.jit import COMPILE_LISTENERS

        event.unregister("numba:compile", self)
        if self.native_compiled in COMPILE_LISTENERS:
            COMPILE_LISTENERS.remove(self.native_compiled)
        _ACTIVE.remove(self)
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()


def compile_watch(target: str) -> Any:
    """A CompileWatch for a target that compiles with numba; nothing for the reference interpreter."""
    if target == "reference":
        import contextlib

        return contextlib.nullcontext()
    return CompileWatch()
