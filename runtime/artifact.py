"""Artifacts: a compiled step on disk, shared by `bendc compile` and the cache.

A folder with ``manifest.json`` (format version, versions, target, input and
output specs, the output structure, and the sha256 of every file),
``plan.json`` (launch list and buffer plan), ``kernels/<module>.py``, the IR
after every stage under ``ir/``, and ``report.txt``. Loading checks the
format version and every content hash first and refuses a changed,
truncated or foreign artifact.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from typing import Any, Callable

import numpy as np

from runtime.cpu import CpuProgram

FORMAT_VERSION = 1
_LOADED: dict[str, Any] = {}


class ArtifactInvalid(Exception):
    """The artifact cannot be trusted or run; the message says why."""


def file_hash(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(folder: str) -> dict:
    """The manifest after checking the format and every file's hash."""
    path = os.path.join(folder, "manifest.json")
    if not os.path.isfile(path):
        raise ArtifactInvalid(f"{folder} is not a bendc artifact (no manifest.json)")
    try:
        with open(path, encoding="utf-8") as stream:
            manifest = json.load(stream)
    except (OSError, ValueError) as error:
        raise ArtifactInvalid(f"{path} is not readable JSON ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("kind") != "bendc-artifact":
        raise ArtifactInvalid(f"{folder} is not a bendc artifact")
    if manifest.get("format") != FORMAT_VERSION:
        raise ArtifactInvalid(f"{folder} has artifact format {manifest.get('format')!r}; this runtime reads "
                              f"format {FORMAT_VERSION}: rebuild it with this bendc")
    for name, expected in manifest.get("files", {}).items():
        file = os.path.join(folder, name)
        if not os.path.isfile(file):
            raise ArtifactInvalid(f"{folder}: {name} is missing (truncated artifact)")
        if file_hash(file) != expected:
            raise ArtifactInvalid(f"{folder}: {name} was changed since it was built (content hash differs)")
    if "plan.json" not in manifest.get("files", {}):
        raise ArtifactInvalid(f"{folder}: the manifest lists no plan.json")
    return manifest


def load_module(path: str, module: str) -> Any:
    """Import a generated module from its file (once per process and path)."""
    key = os.path.abspath(path)
    if key not in _LOADED:
        name = f"bendc_kernel_{module}"
        spec = importlib.util.spec_from_file_location(name, path)
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[name] = loaded
        spec.loader.exec_module(loaded)
        _LOADED[key] = loaded
    return _LOADED[key]


def load_kernel(path: str, module: str) -> Callable:
    """Import ``kernel`` from a generated module file (once per process and path)."""
    return load_module(path, module).kernel


def load_program(folder: str, kernel_dir: str | None = None) -> tuple[dict, dict, CpuProgram]:
    """(manifest, plan, bound program) of a verified cpu artifact.

    ``kernel_dir`` may name a folder of the same kernel modules (named by
    structural hash) whose compiled code numba has already cached.
    """
    manifest = read_manifest(folder)
    if manifest.get("target") != "cpu":
        raise ArtifactInvalid(f"{folder} was built for target {manifest.get('target')!r}; this runtime runs cpu")
    with open(os.path.join(folder, "plan.json"), encoding="utf-8") as stream:
        plan = json.load(stream)
    kernels = {}
    for step in plan["steps"]:
        path = os.path.join(folder, "kernels", f"{step['module']}.py")
        if kernel_dir is not None and os.path.isfile(os.path.join(kernel_dir, f"{step['module']}.py")):
            path = os.path.join(kernel_dir, f"{step['module']}.py")
        kernels[step["name"]] = load_kernel(path, step["module"])
    return manifest, plan, CpuProgram(plan, kernels)


def check_inputs(manifest: dict, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Inputs in parameter order, each of the recorded dtype and shape, or ArtifactInvalid."""
    specs = manifest["inputs"]
    if len(inputs) != len(specs):
        raise ArtifactInvalid(f"expected {len(specs)} inputs ({', '.join(s['name'] for s in specs)}), "
                              f"got {len(inputs)}")
    checked = []
    for spec, array in zip(specs, inputs):
        array = np.ascontiguousarray(array)
        want = np.dtype({"f32": np.float32, "i64": np.int64, "i32": np.int32}[spec["dtype"]])
        if array.dtype != want or tuple(array.shape) != tuple(spec["shape"]):
            raise ArtifactInvalid(f"input {spec['name']!r} must be {spec['dtype']}[{','.join(map(str, spec['shape']))}]"
                                  f", got {array.dtype}{list(array.shape)}")
        checked.append(array)
    return checked
