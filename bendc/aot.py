"""Machine code for cpu artifacts: every kernel compiled at ``bendc compile`` time.

The built program runs once on random inputs of the recorded shapes (index
inputs within their bounds), which compiles every kernel, and its helpers,
for exactly the types the runtime will call it with (or loads it from the
kernel cache, where numba saved it). numba's cache then holds an entry per
function for this CPU; those entries (the data files, and an index holding
just them) become the artifact's ``numba/`` files, which runtime/machine.py
reads in place. Chosen over an object file built through llvmlite because
numba's own loader then rebuilds the dispatchers (parallel kernels, their
gufunc wrappers and helper linking included) with no code of ours to keep in
step with numba, and a CPU or numba mismatch falls back to compiling.
"""
from __future__ import annotations

import io
import pickle
from typing import Any, Callable, Sequence

import numba
from numba.core.serialize import dumps

from bendc.codegen.cache import kernel_path
from bendc.codegen.plan import KernelPlan
from runtime.artifact import load_module
from runtime.cli import random_inputs
from runtime.machine import MACHINE_FOLDER, compile_counts, dispatchers, host_machine
from runtime.native.jit import NativeFunction


def machine_code(run: Callable[[Sequence[Any]], Any], plan: KernelPlan, cache_dir: str,
                 inputs: list[dict]) -> tuple[dict[str, bytes], dict[str, str], list[str]]:
    """(artifact files: ``numba/...`` and the kernel sources they were compiled from, the machine
    they are for, report lines) of a built cpu plan."""
    modules = {step.module: load_module(kernel_path(cache_dir, step.module), step.module) for step in plan.steps}
    before = compile_counts(modules.values())
    notes = []
    try:
        run(random_inputs({"inputs": inputs}, 0))
    except Exception as error:  # noqa: BLE001 - a check failing on random values: not a build error
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        notes.append(f"the trial run stopped ({first}): kernels after that one are compiled at the first run")
    after = compile_counts(modules.values())
    host = host_machine()
    magic = (host["triple"], host["cpu"], host["features"])
    # numba stamps its index with the source's content hash: the artifact holds the very files compiled
    # (the kernel cache keeps one file per structural hash, whose comments may be another program's).
    files: dict[str, bytes] = {}
    for module in modules:
        with open(kernel_path(cache_dir, module), "rb") as stream:
            files[f"kernels/{module}.py"] = stream.read()
    stored = 0
    for dispatcher in dispatchers(modules.values()):
        if isinstance(dispatcher, NativeFunction):  # native objects (runtime/native/jit.py), by name
            objects = dispatcher.object_files()
            for name, data in objects.items():
                files[f"{MACHINE_FOLDER}/{name}"] = data
            stored += bool(objects)
            dispatcher = dispatcher.dispatcher  # and numba's files, where numba compiled some
        cache_file = getattr(getattr(dispatcher, "_cache", None), "_cache_file", None)
        if cache_file is None:
            continue
        overloads = {}
        for key, name in cache_file._load_index().items():
            if key[1] != magic:
                continue
            data = cache_file._bendc_verified(cache_file._data_path(name))  # its .sig checked (runtime/artifact.py)
            if data is None:
                continue  # removed meanwhile (or not signed): that function is compiled at the first run
            files[f"{MACHINE_FOLDER}/{name}"] = data
            overloads[key] = name
        if overloads:
            files[f"{MACHINE_FOLDER}/{cache_file._index_name}"] = _index_bytes(cache_file._source_stamp, overloads)
            stored += 1
    notes.append(f"machine code for {host['cpu']}: {stored} functions stored "
                 f"({after['compiled'] - before['compiled']} compiled now, the rest from the kernel cache)")
    return files, host, notes


def _index_bytes(stamp: Any, overloads: dict) -> bytes:
    """A numba cache index holding ``overloads`` (as numba's IndexDataCacheFile._save_index writes it)."""
    stream = io.BytesIO()
    pickle.dump(numba.__version__, stream, protocol=-1)
    stream.write(dumps((stamp, overloads)))
    return stream.getvalue()


def donated_feeds(plan: KernelPlan, graph: Any) -> dict[str, int]:
    """The manifest's ``feeds`` (input name -> output slot) of the outputs written over a donated
    parameter: the updated parameter that ``bendc run --feed-outputs`` gives the next step."""
    feeds = {}
    for output, param in plan.donations.items():
        if output in plan.outputs:
            feeds[graph.node(param).attr["name"]] = plan.outputs.index(output)
    return feeds
