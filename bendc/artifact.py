"""Writing artifacts (the format lives in runtime/artifact.py, which reads them).

Everything is written into a temporary folder beside the destination and
renamed into place, so an interrupted build leaves nothing that a reader
trusts (a killed writer's temporary folder is removed by a later write once
it is old). Concurrent writers of one destination are safe: each renames a
complete folder, and one that finds the destination taken keeps what is
there when it is the same artifact (or, for the cache, any valid one that
this user's key signed). Every manifest is signed (runtime/trust.py): with
this user's key, or the key file that ``bendc compile --sign-with`` names.
"""
from __future__ import annotations

import errno
import functools
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
from typing import Any

import numba
import numpy as np

from bendc.codegen.plan import KernelPlan
from bendc.ir.graph import Graph
from bendc.ir.types import dtype_name
from bendc.ops import OPS
from bendc.ops.base import indexed_size
from bendc.version import __version__
from runtime.files import STALE_SECONDS, sweep_stale
from runtime.artifact import (FORMAT_VERSION, KIND, MANIFEST, ArtifactInvalid, content_hash, file_hash,
                              is_signed_by, read_manifest, user_key)
from runtime.trust import load_key, sign



@functools.lru_cache(maxsize=None)
def compiler_fingerprint() -> str:
    """A hash of bendc's own source (compiler and runtime): a changed compiler is a new cache key."""
    digest = hashlib.sha256()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for package in ("bendc", "runtime"):
        for folder, _, names in sorted(os.walk(os.path.join(root, package))):
            for name in sorted(n for n in names if n.endswith(".py")):
                with open(os.path.join(folder, name), "rb") as stream:
                    digest.update(name.encode() + stream.read())
    return digest.hexdigest()[:16]


def versions() -> dict[str, str]:
    return {"bendc": __version__, "numba": numba.__version__, "numpy": np.__version__}


def template_to_json(template: Any) -> Any:
    """The return structure's manifest form (bendc.tree.Template.to_json; runtime/artifact.py reads it)."""
    return template.to_json()


def write_artifact(folder: str, *, function: str, target: str, inputs: list[dict], leaves: list[str],
                   template: Any, plan: KernelPlan, stages: dict[str, str], report: str, tape: str,
                   extra: dict[str, Any] | None = None, files: dict[str, str | bytes] | None = None,
                   replace: bool = True, key_file: str | None = None,
                   constants: dict[str, np.ndarray] | None = None) -> None:
    """Write a complete artifact to ``folder`` atomically.

    An artifact already at ``folder`` is replaced (``replace``, as ``bendc
    compile`` does) unless it is this same one; with ``replace=False`` (a
    cache entry, which another process may be writing or reading too) any
    valid artifact there is kept and only a damaged one is replaced (or one this user's key did
    not sign). The manifest is signed with this user's key, or the key in ``key_file``.
    ``constants``: the lifted constants by parameter name, in parameter order (``constants/<name>.npy``).
    """
    key = user_key() if key_file is None else load_key(key_file, create=False)
    parent = os.path.dirname(os.path.abspath(folder)) or "."
    os.makedirs(parent, exist_ok=True)
    sweep_stale_folders(parent)
    staging = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(folder)}.tmp-")
    try:
        extra_files = files or {}
        files = {}

        def put(name: str, data: str | bytes) -> None:
            path = os.path.join(staging, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as stream:
                stream.write(data.encode() if isinstance(data, str) else data)
            files[name] = file_hash(path)

        for step in plan.steps:
            put(f"kernels/{step.module}.py", step.source)
        for index, (stage, text) in enumerate(stages.items()):
            put(f"ir/{index:02d}-{stage}.ir", text)
        put("plan.json", json.dumps(plan.to_json(), indent=1))
        put("report.txt", report)
        put("tape.txt", tape)
        for name, data in extra_files.items():  # e.g. PTX and cubin per cuda kernel
            put(name, data)
        constant_specs = []
        for name, array in (constants or {}).items():  # runtime/artifact.py read_constants
            stream = io.BytesIO()
            np.save(stream, np.ascontiguousarray(array), allow_pickle=False)
            put(f"constants/{name}.npy", stream.getvalue())
            constant_specs.append({"name": name, "file": f"constants/{name}.npy", "dtype": dtype_name(array.dtype),
                                   "shape": list(array.shape)})
        outputs = [{"dtype": plan.values[o][0], "shape": list(plan.values[o][1])} for o in plan.outputs]
        manifest = {
            "kind": KIND, "format": FORMAT_VERSION, "versions": versions(), "target": target,
            "function": function, "inputs": inputs, "leaves": leaves, "outputs": outputs,
            "template": template_to_json(template), "stages": list(stages), "files": files, **(extra or {}),
        }
        if constant_specs:
            manifest["constants"] = constant_specs
        manifest = json.loads(json.dumps(manifest))  # as a reader will see it (e.g. dict keys as strings)
        manifest["content_hash"] = content_hash(manifest)
        manifest["signature"] = sign(manifest["content_hash"], key)
        with open(os.path.join(staging, MANIFEST), "w", encoding="utf-8") as stream:
            json.dump(manifest, stream, indent=1)
        _move_into_place(staging, folder, manifest["signature"], replace, key)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone unless this write lost to another


def _move_into_place(staging: str, folder: str, ours: dict, replace: bool, key: bytes) -> None:
    """Rename ``staging`` (signed ``ours``) to ``folder``; what is at ``folder`` meanwhile is kept
    (the same artifact with the same signature, or, not ``replace``, any valid one ``key`` signed)
    or retired."""
    parent = os.path.dirname(os.path.abspath(folder))
    for _ in range(100):  # each round another writer got in between; bounded all the same
        try:
            os.rename(staging, folder)  # atomic; fails where a folder with files is
            return
        except OSError as error:
            if error.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                raise
        try:
            theirs = read_manifest(folder, trust=True)  # its signature is compared below
        except ArtifactInvalid:
            theirs = None  # damaged or half-retired: replace it
        except OSError:
            continue  # changing under us: look again
        if theirs is not None and (theirs.get("signature") == ours or (not replace and is_signed_by(theirs, key))):
            return  # the same artifact (or, for a cache entry, an equally good one) is in place
        retired = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(folder)}.old-")
        try:
            os.rename(folder, os.path.join(retired, "old"))
        except FileNotFoundError:
            pass  # another writer retired it first
        finally:
            shutil.rmtree(retired, ignore_errors=True)
    raise OSError(f"could not move {staging} to {folder}: other processes keep writing it")


# Temporary folders of write_artifact and discard_artifact: .NAME.tmp-XXXXXXXX (mkdtemp's suffix).
_TEMPORARY = re.compile(r"^\..+\.(tmp|old|bad)-[A-Za-z0-9_]{8}$")


def sweep_stale_folders(parent: str, older_than: float = STALE_SECONDS) -> None:
    """Remove the temporary folders that killed writers left in ``parent`` once they are old."""
    sweep_stale(parent, lambda name: _TEMPORARY.match(name) is not None, older_than)


def discard_artifact(folder: str) -> bool:
    """Remove a damaged artifact (a cache entry) unless a valid one has taken its place meanwhile.

    Returns False, removing nothing, when ``folder`` now holds a valid
    artifact (another process replaced it while it was read). The folder is
    renamed away first, so other readers see it whole or not at all.
    """
    try:
        read_manifest(folder)
        return False
    except (ArtifactInvalid, OSError):
        pass
    parent = os.path.dirname(os.path.abspath(folder))
    trash = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(folder)}.bad-")
    try:
        os.rename(folder, os.path.join(trash, "bad"))
    except OSError:
        pass  # already gone
    shutil.rmtree(trash, ignore_errors=True)
    return True


def index_bounds(graph: Graph) -> dict[str, int]:
    """For each integer parameter used as indices, the size its values must stay below.

    An index read by gather/index_select (or scattered by scatter_add/index_add) must lie in
    [0, size of the indexed dimension); through reshapes, permutes and expands the values are
    the parameter's own. Where several ops use one parameter, the smallest size holds.
    """
    bounds: dict[str, int] = {}
    for id in graph.params:
        param = graph.node(id)
        if not param.type.is_index:
            continue
        sizes = _indexed_sizes(graph, id)
        if sizes:
            bounds[param.attr["name"]] = min(sizes)
    return bounds


def _indexed_sizes(graph: Graph, value: int) -> list[int]:
    """Sizes of the dimensions that ``value`` (or a view of it) indexes."""
    sizes = []
    for user in graph.users(value):
        node = graph.node(user)
        opdef = OPS[node.op]
        if opdef.lowering.kind == "layout" and node.inputs[0] == value:  # a view holds the same values
            sizes.extend(_indexed_sizes(graph, user))
        elif opdef.index_operand is not None and node.inputs[opdef.index_operand] == value:
            sizes.append(indexed_size(graph, node))
    return sizes
