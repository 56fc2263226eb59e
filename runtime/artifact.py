"""Artifacts: a compiled step on disk, shared by `bendc compile` and the cache.

A folder with ``manifest.json`` (format version, versions, target, input and
output specs, the output structure, and the sha256 of every file),
``plan.json`` (launch list and buffer plan), ``kernels/<module>.py``, the IR
after every stage under ``ir/``, ``report.txt`` and ``tape.txt``. The
manifest's ``content_hash`` is the sha256 of the rest of the manifest, so it
covers every file too. Loading checks the format version, the content hash,
every file's hash and that the folder holds nothing else (numba's
``__pycache__`` aside) before anything runs, and refuses a changed,
truncated or foreign artifact.

Format 2 added ``content_hash`` and, on integer inputs used as indices,
``index_bound`` (values must lie in [0, index_bound)). Format 3 added, on cpu
builds, the kernels' machine code: ``numba/*.nbi`` and ``numba/*.nbc`` (numba's
cache files, listed and hashed like the rest) and ``machine``, the CPU they were
compiled for (runtime/machine.py); the runtime reads them in place and never
writes into the folder. Format 4 records, on cuda builds, each launch's entry
symbol, cubin, arguments and parameters, and each source step's constant
(``value``), so that runtime/cuda_graph.py runs the cubins without numba. Format 5
added ``signature``: an HMAC of the content hash under the builder's key
(runtime/trust.py), outside the content hash; loading refuses an unsigned or
foreign-signed artifact unless told to trust it (``trust=True``: hashes only). Format 6
added ``constants``: the lifted constants (large tensors the traced function captured), each a
``constants/<name>.npy`` file hashed like the rest, passed after the caller's inputs.

An artifact is code (kernel modules the runtime imports, numba cache files numba
unpickles): nothing in it is imported or unpickled before its hashes and
signature check out, and numba's cache files are checked again, against the
verified manifest or their ``.sig`` files, as numba reads them.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import os
import pickle
import sys
from typing import Any, Callable, Iterator, Mapping, Sequence

try:
    import fcntl
except ImportError:  # not POSIX: numba's cache index is updated without a lock
    fcntl = None

import numpy as np

from runtime.cuda import numba_cuda_installed
from runtime.dtypes import DTYPES

from runtime.cpu import CpuProgram, KernelError
from runtime.cuda_graph import OUTPUT_CONTRACTS
from runtime.files import default_cache_dir
from runtime.machine import (MACHINE_FOLDER, ArtifactCacheLocator, describe_machine, host_machine, place_cache,
                             same_machine, seal)
from runtime.trust import (SIGNATURE_SUFFIX, InsecurePath, file_mac, file_mac_matches, load_key, private_cache,
                           signature_problem)

FORMAT_VERSION = 7
# What each format added: the refusal of an older artifact says what it lacks.
FORMAT_CHANGES = {
    2: "content hashes and index bounds",
    3: "the cpu kernels' machine code",
    4: "the cuda launches' entry symbols and parameter layouts and the constants' values, for the cubin runtime",
    5: "a signature",
    6: "the lifted constants (constants/*.npy)",
    7: "the cuda steps' argument windows (plan.json: a view's kernels no longer hold its offset)",
}
KIND = "bendc-artifact"
MANIFEST = "manifest.json"
# Fields every manifest has; a manifest without one is foreign or damaged.
REQUIRED_FIELDS = ("target", "function", "inputs", "outputs", "template", "stages", "files", "content_hash")
# Fields outside the content hash: the hash itself and the signature over it.
UNHASHED_FIELDS = ("content_hash", "signature")
# Folders the runtime itself may add (numba's cache of the compiled kernels).
IGNORED_FOLDERS = ("__pycache__",)
_LOADED: dict[str, Any] = {}


class ArtifactInvalid(Exception):
    """The artifact cannot be trusted or run; the message says why."""


class ArtifactUntrusted(ArtifactInvalid):
    """An artifact whose hashes hold but that this user's key did not sign (or a key file or cache
    folder that others could write): the message says how to accept it deliberately; ``problem``
    is what is wrong with the signature, in a few words."""

    def __init__(self, message: str, problem: str = "") -> None:
        super().__init__(message)
        self.problem = problem or message


class InputsInvalid(ArtifactInvalid):
    """Inputs that do not match the parameters the artifact was built for."""


def file_hash(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def content_hash(manifest: dict) -> str:
    """The sha256 of the manifest without its own ``content_hash`` and ``signature`` (it lists every
    file's hash)."""
    body = {key: value for key, value in manifest.items() if key not in UNHASHED_FIELDS}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def read_manifest(folder: str, trust: bool = False) -> dict:
    """The manifest after checking its kind, format, content hash, signature (this user's key,
    :func:`check_signature`; skipped where ``trust``) and every file."""
    manifest = _read_manifest_json(folder)
    _check_header(folder, manifest)
    if not trust:
        check_signature(folder, manifest)
    _check_files(folder, manifest["files"])
    _check_no_unknown_files(folder, manifest["files"])
    if "plan.json" not in manifest["files"]:
        raise ArtifactInvalid(f"{folder}: the manifest lists no plan.json")
    return manifest


def _read_manifest_json(folder: str) -> dict:
    if not os.path.isdir(folder):
        raise ArtifactInvalid(f"{folder} is not a bendc artifact (no such folder)")
    path = os.path.join(folder, MANIFEST)
    if not os.path.isfile(path):
        raise ArtifactInvalid(f"{folder} is not a bendc artifact (no {MANIFEST})")
    try:
        with open(path, encoding="utf-8") as stream:
            manifest = json.load(stream)
    except (OSError, ValueError) as error:
        raise ArtifactInvalid(f"{path} is not readable JSON ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("kind") != KIND:
        raise ArtifactInvalid(f"{folder} is not a bendc artifact ({MANIFEST} is of another kind)")
    return manifest


def is_artifact(folder: str) -> bool:
    """Whether ``folder`` holds a bendc manifest (valid or not): what `bendc compile` may replace."""
    try:
        _read_manifest_json(folder)
    except ArtifactInvalid:
        return False
    return True


def _check_header(folder: str, manifest: dict) -> None:
    """Format version, required fields and the manifest's own content hash."""
    found = manifest.get("format")
    if found != FORMAT_VERSION:
        lacks = [FORMAT_CHANGES[k] for k in sorted(FORMAT_CHANGES) if isinstance(found, int) and k > found]
        why = f" (it lacks {'; '.join(lacks)})" if lacks else ""
        raise ArtifactInvalid(f"{folder} has artifact format {found!r}; this runtime reads "
                              f"format {FORMAT_VERSION}{why}: rebuild it with this bendc")
    missing = [name for name in REQUIRED_FIELDS if name not in manifest]
    if missing:
        raise ArtifactInvalid(f"{folder}: {MANIFEST} lacks {', '.join(missing)} (damaged or foreign artifact)")
    if not isinstance(manifest["files"], dict):
        raise ArtifactInvalid(f"{folder}: {MANIFEST} has no file list (damaged or foreign artifact)")
    if content_hash(manifest) != manifest["content_hash"]:
        raise ArtifactInvalid(f"{folder}: {MANIFEST} was changed since it was built (content hash differs)")


def user_key() -> bytes:
    """This user's signing key (runtime/trust.py), or ArtifactUntrusted when its file is unsafe."""
    try:
        return load_key()
    except InsecurePath as error:
        raise ArtifactUntrusted(str(error)) from None


def check_signature(folder: str, manifest: dict, key: bytes | None = None) -> None:
    """ArtifactUntrusted unless ``key`` (default: this user's) signed the manifest's content hash."""
    problem = signature_problem(manifest.get("signature"), manifest["content_hash"], key or user_key())
    if problem is not None:
        raise ArtifactUntrusted(
            f"{folder} is not trusted: {problem}. An artifact is code, like a wheel: load only what you built or "
            f"trust. To accept this one deliberately: bendc run --trust {folder}, or runtime.load(path, trust=True) "
            "(hashes are still checked); for a team's artifacts set BENDC_KEY_FILE to the key they sign with",
            problem)


def is_signed_by(manifest: dict, key: bytes) -> bool:
    return signature_problem(manifest.get("signature"), manifest["content_hash"], key) is None


def _check_files(folder: str, files: dict[str, str]) -> None:
    """Every listed file is inside the folder, present, and has its recorded sha256."""
    for name, expected in files.items():
        if os.path.isabs(name) or ".." in name.split("/") or name == MANIFEST:
            raise ArtifactInvalid(f"{folder}: the manifest lists a file outside the artifact: {name!r}")
        file = os.path.join(folder, name)
        if not os.path.isfile(file):
            raise ArtifactInvalid(f"{folder}: {name} is missing (truncated artifact)")
        if file_hash(file) != expected:
            raise ArtifactInvalid(f"{folder}: {name} was changed since it was built (content hash differs)")


def _check_no_unknown_files(folder: str, files: dict[str, str]) -> None:
    """Nothing but the listed files (and numba's caches) lies in the folder."""
    for root, folders, names in os.walk(folder):
        folders[:] = sorted(f for f in folders if f not in IGNORED_FOLDERS)
        for name in sorted(names):
            relative = os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/")
            if relative != MANIFEST and relative not in files:
                raise ArtifactInvalid(f"{folder}: {relative} is not in the manifest (foreign file)")


def strip_comments(source: str) -> str:
    """The structural part of a kernel module's source: docstring header and comments removed
    (kernels that differ only there share one module file)."""
    lines = source.split('"""', 2)[-1].splitlines() if source.startswith('"""') else source.splitlines()
    return "\n".join(line.split("  #", 1)[0].rstrip() for line in lines)


def module_name(source: str) -> str:
    """The name of a kernel module: ``k_`` and the hash of its structural source."""
    return "k_" + hashlib.sha256(strip_comments(source).encode()).hexdigest()[:24]


def is_module_file(path: str, module: str) -> bool:
    """Whether ``path`` holds a complete kernel module named ``module`` (by its structural hash):
    the kernel folder is shared by programs, and a damaged file there must never be imported."""
    try:
        with open(path, "rb") as stream:
            source = stream.read().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    return module_name(source) == module


def load_module(path: str, module: str, sha256: str | None = None) -> Any:
    """Import a generated module from its file (once per process and path).

    The source is read once and run from those bytes after they check out: their structural hash
    is ``module`` (and their sha256 is ``sha256``, a verified manifest's, where given), so a file
    changed after it was verified is never run, and neither is Python's cached bytecode: a
    ``__pycache__/*.pyc`` beside the file, which no manifest lists, is never read.
    """
    key = os.path.abspath(path)
    if key not in _LOADED:
        with open(path, "rb") as stream:
            source = stream.read()
        if (sha256 is not None and hashlib.sha256(source).hexdigest() != sha256) or \
                module_name(source.decode("utf-8", errors="replace")) != module:
            raise ArtifactInvalid(f"{path} changed after it was verified (its hash differs): not imported")
        name = f"bendc_kernel_{module}"
        spec = importlib.util.spec_from_file_location(name, path)
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[name] = loaded
        exec(compile(source, path, "exec"), vars(loaded))  # noqa: S102 - the verified bytes
        for value in vars(loaded).values():
            _harden_numba_cache(value)
            seal(value)
        from runtime.native.jit import nativize

        nativize(loaded, source.decode("utf-8"), path, module)
        _LOADED[key] = loaded
    return _LOADED[key]


@contextlib.contextmanager
def _locked(path: str, shared: bool = False) -> Iterator[None]:
    if fcntl is None:
        yield
        return
    with open(path, "a") as stream:
        fcntl.flock(stream, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(stream, fcntl.LOCK_UN)


def _harden_numba_cache(dispatcher: Any) -> None:
    """Make numba's on-disk cache of one ``cache=True`` function safe to read and to share.

    numba unpickles its index (.nbi) and data (.nbc) files as it finds them: whoever can write one
    runs code in the next process that compiles the function. Here every file is read once, as
    bytes, and unpickled only when it checks out: in an artifact's verified ``numba/`` folder
    against the sha256 its manifest records (runtime/machine.py ``place_cache``); anywhere else
    (bendc's cache, a folder numba's own locators chose) against its ``.sig`` file, an HMAC under
    this user's key that the hardened save writes. A file that fails, or is damaged (truncated,
    garbled), reads as absent: the function is compiled again and the files rewritten (and
    signed). numba writes each file under a temporary name and renames it; saving here holds a
    lock on the index (two processes saving at once would each rewrite it from what they read
    before: one's entry lost, two signatures given one data file) and loading a shared one.
    A numba whose cache file object differs from the one known here gets no cache at all.
    """
    cache = getattr(dispatcher, "_cache", None)
    cache_file = getattr(cache, "_cache_file", None)
    if cache_file is None or getattr(cache_file, "_bendc_hardened", False):
        return
    names = ("_load_index", "_load_data", "save", "load", "_save_index", "_save_data", "_index_path",
             "_source_stamp", "_version", "_data_path", "_dump", "_open_for_write")
    if not all(hasattr(cache_file, name) for name in names):
        from numba.core.caching import NullCache

        dispatcher._cache = NullCache()  # another numba: nothing it reads could be checked first
        return
    locator = getattr(getattr(cache, "_impl", None), "locator", None)
    expected = locator.expected if isinstance(locator, ArtifactCacheLocator) else None
    save, load = cache_file.save, cache_file.load

    def verified(path: str) -> bytes | None:
        """The file's bytes when they check out (see above), else None."""
        try:
            with open(path, "rb") as stream:
                data = stream.read()
        except OSError:
            return None
        name = os.path.basename(path)
        if expected is not None:
            return data if expected.get(name) == hashlib.sha256(data).hexdigest() else None
        try:
            with open(path + SIGNATURE_SUFFIX, encoding="ascii") as stream:
                recorded = stream.read()
        except (OSError, UnicodeDecodeError):
            return None
        return data if file_mac_matches(name, data, user_key(), recorded) else None

    def verified_index() -> dict:
        data = verified(cache_file._index_path)
        if data is None:
            return {}
        try:
            stream = io.BytesIO(data)
            if pickle.load(stream) != cache_file._version:
                return {}
            stamp, overloads = pickle.loads(stream.read())
        except Exception:  # noqa: BLE001 - garbled: no entries
            return {}
        return overloads if stamp == cache_file._source_stamp else {}

    def verified_data(name: str) -> Any:
        data = verified(cache_file._data_path(name))
        if data is None:  # numba's load() reads an OSError as a miss
            raise OSError(f"numba cache file {name} is missing, damaged or not signed")
        try:
            return pickle.loads(data)
        except Exception as error:  # noqa: BLE001
            raise OSError(f"damaged numba cache file {name}: {error}") from error

    def write_signed(path: str, data: bytes) -> None:
        with cache_file._open_for_write(path) as stream:
            stream.write(data)
        if expected is None:
            mac = file_mac(os.path.basename(path), data, user_key())
            with cache_file._open_for_write(path + SIGNATURE_SUFFIX) as stream:
                stream.write(mac.encode())

    def signed_index(overloads: dict) -> None:
        stream = io.BytesIO()
        pickle.dump(cache_file._version, stream, protocol=-1)
        stream.write(cache_file._dump((cache_file._source_stamp, overloads)))
        write_signed(cache_file._index_path, stream.getvalue())

    def signed_data(name: str, data: Any) -> None:
        write_signed(cache_file._data_path(name), cache_file._dump(data))

    def locked_save(key: Any, data: Any) -> None:
        with _locked(cache_file._index_path + ".lock"):
            save(key, data)

    def locked_load(key: Any) -> Any:
        if expected is not None:  # a verified artifact folder: read-only, never written
            return load(key)
        try:
            with _locked(cache_file._index_path + ".lock", shared=True):
                return load(key)
        except OSError:  # the folder is not writable (no lock file): read without one
            return load(key)

    cache_file._load_index = verified_index
    cache_file._load_data = verified_data
    cache_file._save_index = signed_index
    cache_file._save_data = signed_data
    cache_file._bendc_verified = verified
    cache_file.save = locked_save
    cache_file.load = locked_load
    cache_file._bendc_hardened = True


def load_kernel(path: str, module: str) -> Callable:
    """Import ``kernel`` from a generated module file (once per process and path)."""
    return load_module(path, module).kernel


def read_plan(folder: str, manifest: dict) -> dict:
    """plan.json of a verified artifact, after checking that its kernels are the listed ones."""
    try:
        with open(os.path.join(folder, "plan.json"), encoding="utf-8") as stream:
            plan = json.load(stream)
        used = {f"kernels/{step['module']}.py" for step in plan["steps"]}
    except (ValueError, KeyError, TypeError):
        raise ArtifactInvalid(f"{folder}: plan.json is not a kernel plan (foreign artifact)") from None
    listed = {name for name in manifest["files"] if name.startswith("kernels/")}
    unlisted = sorted(used - listed)
    if unlisted:
        raise ArtifactInvalid(f"{folder}: plan.json runs {unlisted[0]}, which the manifest does not list")
    unused = sorted(listed - used)
    if unused:
        raise ArtifactInvalid(f"{folder}: {unused[0]} is not a kernel of plan.json (foreign file)")
    return plan


class LiftedConstants:
    """A bound program whose last parameters are lifted constants (large tensors the traced function
    captured: a causal mask), held here and passed after the caller's inputs: ``run(inputs)``,
    ``run_steps``, ``time_steps`` and ``time_launch_list`` take the inputs alone. Everything else is the
    program's."""

    STEPPED = ("run_steps", "time_steps", "time_launch_list")

    def __init__(self, program: Any, constants: Sequence[np.ndarray]) -> None:
        self.bound = program  # (not ``program``: a CpuProgram's own attribute, its launch list)
        self.constants = list(constants)

    def run(self, inputs: Sequence[Any]) -> list:
        return self.bound.run([*inputs, *self.constants])

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.bound, name)
        if name in self.STEPPED:
            return lambda inputs, *args, **kwargs: attribute([*inputs, *self.constants], *args, **kwargs)
        return attribute


def with_constants(program: Any, constants: Sequence[np.ndarray]) -> Any:
    """``program`` passing ``constants`` after the caller's inputs (itself where there are none)."""
    return LiftedConstants(program, constants) if constants else program


def read_constants(folder: str, manifest: dict) -> list[np.ndarray]:
    """The lifted constants of a verified artifact (its ``constants/*.npy`` files, hashed like the
    others), in parameter order, each checked against the dtype and shape the manifest records."""
    arrays = []
    for spec in manifest.get("constants", []):
        name = spec.get("file", "")
        if name not in manifest["files"]:
            raise ArtifactInvalid(f"{folder}: the constant {spec.get('name')!r} is not a listed file")
        try:
            array = np.load(os.path.join(folder, name), allow_pickle=False)
        except (OSError, ValueError) as error:
            raise ArtifactInvalid(f"{folder}: {name} is not a numpy array ({error})") from None
        if array.dtype != DTYPES.get(spec.get("dtype")) or list(array.shape) != list(spec.get("shape", ())):
            raise ArtifactInvalid(f"{folder}: {name} holds {array.dtype}{list(array.shape)}, the manifest "
                                  f"records {spec.get('dtype')}{spec.get('shape')}")
        array.setflags(write=False)
        arrays.append(array)
    return arrays


def load_program(folder: str, kernel_dir: str | None = None, cuda_runtime: str | None = None,
                 outputs: str = "copy", trust: bool = False) -> tuple[dict, dict, CpuProgram]:
    """(manifest, plan, bound program) of a verified artifact.

    ``kernel_dir`` may name a folder of the same kernel modules (named by
    structural hash) whose compiled code numba has already cached; a module
    there is imported only when its source has the hash of its name, else the
    artifact's own copy is. ``cuda_runtime`` and ``outputs``: see
    :func:`_load_cuda_program`. ``trust``: accept an artifact this user's key did not sign (its
    hashes are checked all the same).
    """
    manifest = read_manifest(folder, trust)
    constants = read_constants(folder, manifest)
    if manifest["target"] == "cuda":
        plan, program = _load_cuda_program(folder, manifest, cuda_runtime, outputs)
        return manifest, plan, with_constants(program, constants)
    if manifest["target"] != "cpu":
        raise ArtifactInvalid(f"{folder} was built for target {manifest['target']!r}; this runtime runs cpu")
    plan = read_plan(folder, manifest)
    home = machine_code_home(folder, manifest)
    kernels, modules = {}, {}
    for step in plan["steps"]:
        name = f"kernels/{step['module']}.py"
        path, sha256 = os.path.join(folder, name), manifest["files"][name]  # verified against the manifest
        if home is not None:
            place_cache(path, *home)
        elif kernel_dir is not None:
            shared = os.path.join(kernel_dir, f"{step['module']}.py")
            if os.path.abspath(shared) in _LOADED or is_module_file(shared, step["module"]):
                path, sha256 = shared, None  # checked by its structural hash
        modules[step["module"]] = load_module(path, step["module"], sha256)
        kernels[step["name"]] = modules[step["module"]].kernel
    program = CpuProgram(plan, kernels)
    program.modules = list(modules.values())
    return manifest, plan, with_constants(program, constants)


def machine_code_home(folder: str, manifest: dict) -> tuple[str, bool, dict[str, str] | None] | None:
    """(folder of numba's cache files for the artifact's kernels, read-only, their sha256 by name
    or None), None for an artifact without machine code: the artifact's own ``numba/`` (read-only,
    each file checked against the verified manifest as numba reads it) when this is the CPU it was
    built for, else a folder of bendc's cache outside it (files signed with this user's key), which
    the kernels are compiled into once (and a note on stderr says so)."""
    recorded = manifest.get("machine")
    if recorded is None:
        return None
    host = host_machine()
    if same_machine(recorded, host):
        prefix = MACHINE_FOLDER + "/"
        expected = {name[len(prefix):]: digest for name, digest in manifest["files"].items() if name.startswith(prefix)}
        return os.path.join(folder, MACHINE_FOLDER), True, expected
    try:
        private_cache(default_cache_dir())
    except InsecurePath as error:
        raise ArtifactUntrusted(str(error)) from None
    outside = os.path.join(default_cache_dir(), "aot", manifest["content_hash"][:24])
    print(f"bendc: note: {folder} holds machine code for {describe_machine(recorded)}; this CPU is "
          f"{describe_machine(host)}" + (" with other features" if recorded.get("cpu") == host["cpu"] else "")
          + f": its kernels are compiled for this CPU into {outside}", file=sys.stderr, flush=True)
    return outside, False, None


CUDA_RUNTIMES = ("auto", "graph", "eager", "numba")


def _load_cuda_program(folder: str, manifest: dict, cuda_runtime: str | None = None,
                       outputs: str = "copy") -> tuple[dict, Any]:
    """(plan, bound program) of a cuda artifact.

    ``cuda_runtime`` (default ``$BENDC_CUDA_RUNTIME``, else ``auto``): ``graph`` or ``eager``
    run the artifact's cubins through cuda.core (runtime/cuda_graph.py: one CUDA graph per
    step, or the same launches one by one), with ``outputs`` "copy" (default: each call's
    outputs are fresh) or "static" (overwritten by the next call); ``numba`` JIT-compiles the
    artifact's kernel sources with numba-cuda (runtime/cuda.py; under numba's CUDA simulator,
    the only choice). ``auto`` is ``graph`` on a GPU of the artifact's architecture, else
    ``numba`` (a note says so when a GPU of another architecture is present).
    """
    plan = read_plan(folder, manifest)
    choice = cuda_runtime or os.environ.get("BENDC_CUDA_RUNTIME") or "auto"
    if choice not in CUDA_RUNTIMES:
        raise ArtifactInvalid(f"cuda runtime {choice!r}: expected one of {', '.join(CUDA_RUNTIMES)}")
    if outputs not in OUTPUT_CONTRACTS:
        raise ArtifactInvalid(f"outputs {outputs!r}: expected one of {', '.join(OUTPUT_CONTRACTS)}")
    arch = manifest.get("arch", "sm_90")
    if choice == "auto" and os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        from runtime.cuda_graph import device_arch

        found = device_arch()
        if found == arch:
            choice = "graph"
        elif found is not None:
            print(f"bendc: note: {folder} holds cubins for {arch}; this GPU is {found}: its kernels are "
                  "compiled by numba-cuda at the first run", file=sys.stderr, flush=True)
    if choice in ("graph", "eager"):
        from runtime.cuda_graph import CaptureError, CubinMismatch, load_cubin_program

        try:
            return plan, load_cubin_program(folder, plan, choice, outputs)
        except CubinMismatch as error:
            raise ArtifactInvalid(f"{folder}: {error}") from None
        except (KernelError, CaptureError):
            raise  # a hoisted step's index check, a failed capture: each names its kernel
        except Exception as error:  # noqa: BLE001 - no cuda.core, no driver, no device: named below
            first = str(error).splitlines()[0] if str(error) else ""
            raise ArtifactInvalid(f"{folder} was built for cuda ({arch}): its cubin runtime needs cuda.core and "
                                  f"a usable NVIDIA GPU: {type(error).__name__}: {first}") from None
    if not numba_cuda_installed():
        raise ArtifactInvalid(f"{folder} was built for cuda: running it needs numba-cuda (pip install "
                              "'numba-cuda[cu13]') and an NVIDIA GPU")
    try:
        from runtime.cuda import CudaProgram

        modules = {step["name"]: load_module(os.path.join(folder, "kernels", f"{step['module']}.py"),
                                             step["module"]) for step in plan["steps"]}
        return plan, CudaProgram(plan, modules)
    except Exception as error:  # no driver or no device
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ArtifactInvalid(f"{folder} was built for cuda ({manifest.get('arch', 'sm_90')}) and needs a "
                              f"usable NVIDIA GPU: {first}") from None


def on_host(value: Any) -> Any:
    """A cuda runtime's device array copied to the host; host arrays as they are."""
    return value.copy_to_host() if hasattr(value, "copy_to_host") else value


def unflatten_outputs(template: dict, outputs: list) -> Any:
    """The function's return value from the flat outputs (out0, out1, ...) and the manifest's template
    (bendc/artifact.py writes it); named tuples and dataclasses come back as dicts of their fields
    (the runtime imports no user code)."""
    kind = template["kind"]
    if kind == "out":
        return outputs[template["value"]]
    if kind == "static":
        return template["value"]
    if kind in ("dict", "namedtuple", "dataclass"):
        return {key: unflatten_outputs(item, outputs) for key, item in template["items"].items()}
    items = [unflatten_outputs(item, outputs) for item in template["items"]]
    return tuple(items) if kind == "tuple" else items


# ------------------------------------------------------------------ pytree parameters
def has_structure(manifest: dict) -> bool:
    """Whether some parameter of the artifact is a pytree (the manifest's ``parameters``: each
    parameter's structure, leaves ``{"kind": "input", "value": input name}`` or static values)."""
    return any(not (tree.get("kind") == "input" and tree.get("value") == name)
               for name, tree in manifest.get("parameters", {}).items() if tree.get("kind") != "static")


def flatten_inputs(parameters: dict, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Input name -> array from the arguments by parameter name, each read through its recorded
    structure (dicts by key, lists and tuples by position, named tuples and dataclasses by field
    or as dicts of their fields); a static leaf given must have its recorded value."""
    flat: dict[str, Any] = {}

    def walk(node: dict, value: Any, path: str) -> None:
        kind = node["kind"]
        if kind == "input":
            flat[node["value"]] = value
        elif kind == "static":
            if value is not _ABSENT and not _same_static(value, node["value"]):
                raise InputsInvalid(f"{path} was fixed to {node['value']!r} when the artifact was compiled "
                                    f"(got {value!r})")
        elif kind in ("dict", "namedtuple", "dataclass"):
            items = node["items"]
            if isinstance(value, Mapping):
                missing = [key for key in items if key not in value]
                unknown = [key for key in value if key not in items]
                if unknown:
                    raise InputsInvalid(f"{path} has no entry {unknown[0]!r}; it takes {list(items)}")
                if missing and any(_takes_input(items[key]) for key in missing):
                    raise InputsInvalid(f"{path} lacks {missing[0]!r}; it takes {list(items)}")
                get = lambda key: value.get(key, _ABSENT)  # noqa: E731
            elif kind != "dict" and all(hasattr(value, key) for key in items):
                get = lambda key: getattr(value, key)  # noqa: E731
            else:
                raise InputsInvalid(f"{path} must be a dict of {list(items)}, got {type(value).__name__}")
            for key, item in items.items():
                walk(item, get(key), f"{path}[{key!r}]")
        else:
            items = node["items"]
            if not isinstance(value, (list, tuple)) or len(value) != len(items):
                raise InputsInvalid(f"{path} must be a {kind} of {len(items)} items, got "
                                    f"{type(value).__name__}" + (f" of {len(value)}" if isinstance(value, (list, tuple))
                                                                 else ""))
            for index, item in enumerate(items):
                walk(item, value[index], f"{path}[{index}]")

    for name, node in parameters.items():
        if name not in arguments:
            if _takes_input(node):
                raise InputsInvalid(f"missing parameter {name!r}; the artifact takes {', '.join(parameters)}")
            continue
        walk(node, arguments[name], name)
    return flat


_ABSENT = object()


def _takes_input(node: dict) -> bool:
    if node["kind"] == "input":
        return True
    items = node.get("items", ())
    return any(_takes_input(item) for item in (items.values() if isinstance(items, dict) else items))


def _same_static(value: Any, recorded: Any) -> bool:
    if isinstance(value, tuple):
        value = list(value)
    try:
        return bool(value == recorded)
    except Exception:
        return False


def input_paths(manifest: dict) -> dict[str, str]:
    """Input name -> its dotted path in the parameters (``params.w1``, ``batch.0``), as a SPEC names it."""
    paths: dict[str, str] = {}

    def walk(node: dict, path: str) -> None:
        if node["kind"] == "input":
            paths[node["value"]] = path
        items = node.get("items", ())
        for key, item in (items.items() if isinstance(items, dict) else enumerate(items)):
            walk(item, f"{path}.{key}")

    for name, node in manifest.get("parameters", {}).items():
        walk(node, name)
    return paths


def check_feeds(manifest: dict, feeds: Mapping[str, int]) -> dict[str, int]:
    """Feeds (input name -> output slot: that output becomes the input of the next step) that name
    an input and an output of the same dtype and shape, or InputsInvalid."""
    specs = {spec["name"]: spec for spec in manifest["inputs"]}
    checked = {}
    for name, index in feeds.items():
        if name not in specs:
            raise InputsInvalid(f"feed out{index}={name}: no input {name!r}; the artifact takes {', '.join(specs)}")
        if not 0 <= int(index) < len(manifest["outputs"]):
            raise InputsInvalid(f"feed out{index}={name}: the artifact has outputs out0..out{len(manifest['outputs']) - 1}")
        output, spec = manifest["outputs"][int(index)], specs[name]
        if output["dtype"] != spec["dtype"] or list(output["shape"]) != list(spec["shape"]):
            raise InputsInvalid(f"feed out{index}={name}: out{index} is {type_text(output)} but {name} is "
                                f"{type_text(spec)}")
        checked[name] = int(index)
    return checked


def parse_feeds(text: str) -> dict[str, int]:
    """``out1=w1,out2=b1`` (or ``w1=out1``) -> {"w1": 1, "b1": 2}, or InputsInvalid."""
    feeds = {}
    for pair in filter(None, (part.strip() for part in text.replace(" ", ",").split(","))):
        left, equals, right = pair.partition("=")
        if left.startswith("out") and left[3:].isdigit():
            output, name = left, right
        else:
            name, output = left, right
        if not equals or not name.isidentifier() or not (output.startswith("out") and output[3:].isdigit()):
            raise InputsInvalid(f"feed {pair!r}: write OUT=INPUT, e.g. out1=w1")
        feeds[name] = int(output[3:])
    return feeds


def read_stages(folder: str, manifest: dict) -> dict[str, str]:
    """The IR text after every stage, by stage name."""
    stages = {}
    for index, stage in enumerate(manifest["stages"]):
        with open(os.path.join(folder, "ir", f"{index:02d}-{stage}.ir"), encoding="utf-8") as stream:
            stages[stage] = stream.read()
    return stages


def read_text(folder: str, name: str) -> str:
    with open(os.path.join(folder, name), encoding="utf-8") as stream:
        return stream.read()


def type_text(spec: dict) -> str:
    """``f32[64,784]`` for an input or output spec of the manifest."""
    return f"{spec['dtype']}[{','.join(map(str, spec['shape']))}]"


def check_inputs(manifest: dict, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Inputs in parameter order, each of the recorded dtype and shape, or InputsInvalid."""
    specs = manifest["inputs"]
    if len(inputs) != len(specs):
        raise InputsInvalid(f"expected {len(specs)} inputs ({', '.join(s['name'] for s in specs)}), "
                            f"got {len(inputs)}")
    checked = []
    for spec, array in zip(specs, inputs):
        if manifest["target"] == "cuda" and _checked_device_input(spec, array):
            checked.append(array)  # a device array of the right type: the cuda runtime copies from it
            continue
        array = np.asarray(array, order="C")  # keeps a 0-d array 0-d
        want = np.dtype(DTYPES[spec["dtype"]])
        if array.dtype != want or tuple(array.shape) != tuple(spec["shape"]):
            raise InputsInvalid(f"input {spec['name']!r} must be {type_text(spec)}, "
                                f"got {array.dtype}{list(array.shape)}")
        checked.append(array)
    return checked


def _checked_device_input(spec: dict, array: Any) -> bool:
    """Whether ``array`` is a device array (a torch CUDA tensor, ``__cuda_array_interface__``);
    InputsInvalid when it is one of another dtype or shape, or strided."""
    from runtime.cuda_graph import device_input

    try:
        found = device_input(array)
    except ValueError as error:
        raise InputsInvalid(f"input {spec['name']!r}: {error}") from None
    if found is None:
        return False
    if found[1] != spec["dtype"] or list(found[2]) != list(spec["shape"]):
        raise InputsInvalid(f"input {spec['name']!r} must be {type_text(spec)}, got a device array "
                            f"{found[1]}{list(found[2])}")
    return True


def inputs_by_name(manifest: dict, arrays: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Inputs named by parameter (e.g. from an .npz) in parameter order, checked. An input of a pytree
    parameter may be named by its dotted path too (``params.w1`` for input ``params_w1``)."""
    names = [spec["name"] for spec in manifest["inputs"]]
    by_path = {path: name for name, path in input_paths(manifest).items() if path != name}
    arrays = {by_path.get(key, key) if key not in names else key: value for key, value in arrays.items()}
    missing = [name for name in names if name not in arrays]
    if missing:
        raise InputsInvalid(f"missing input{'s' if len(missing) > 1 else ''} {', '.join(missing)}; "
                            f"the artifact takes {', '.join(names)}")
    unknown = sorted(name for name in arrays if name not in names)
    if unknown:
        raise InputsInvalid(f"unknown input{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                            f"the artifact takes {', '.join(names)}")
    return check_inputs(manifest, [arrays[name] for name in names])
