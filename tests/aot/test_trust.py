"""Artifacts and cache entries are code: signed with the user's key, refused when others could
have written them, and nothing in them imported or unpickled before it checks out (runtime/trust.py).

The suite's key is a temporary one (tests/conftest.py sets BENDC_KEY_FILE for the whole run).
Tampering here is what an attacker who can write the folder would do: change a file and write
matching hashes, so only the signature tells.
"""
from __future__ import annotations

import builtins
import importlib.util
import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import bendc
import runtime
from bendc import cli
from runtime import trust
from runtime.artifact import ArtifactInvalid, ArtifactUntrusted, content_hash, file_hash, read_manifest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
import cache_worker  # noqa: E402
from test_aot import cache_dir  # noqa: E402,F401 - the module's private BENDC_CACHE_DIR (autouse)

WORKER = str(ROOT / "tests" / "cache_worker.py")
SHAPES = "x=f32[16,12] y=f32[16,4] w1=f32[24,12]:leaf b1=f32[24]:leaf w2=f32[4,24]:leaf"


def compile_to(out: Path, *extra: str) -> None:
    assert cli.main(["compile", f"{WORKER}:step", "--shapes", SHAPES, "--target", "cpu", "-o", str(out),
                     *extra]) == 0


@pytest.fixture(scope="module")
def compiled(tmp_path_factory, cache_dir) -> Path:
    out = tmp_path_factory.mktemp("build") / "step"
    compile_to(out)
    return out


@pytest.fixture
def artifact(compiled, tmp_path) -> Path:
    copy = tmp_path / "step"
    shutil.copytree(compiled, copy)
    return copy


def run(*args: str) -> int:
    return cli.main(["run", *args])


def error_line(capsys) -> str:
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("bendc: error: "), lines
    return lines[0]


def rehash(folder: Path, key: bytes | None = None) -> None:
    """Record every file's current sha256 and the manifest's content hash, as an attacker can;
    ``key``: sign it too (with a key of their own), else drop the signature."""
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    for name in manifest["files"]:
        manifest["files"][name] = file_hash(str(folder / name))
    manifest["content_hash"] = content_hash(manifest)
    manifest.pop("signature", None)
    if key is not None:
        manifest["signature"] = trust.sign(manifest["content_hash"], key)
    path.write_text(json.dumps(manifest, indent=1))


def foreign_key(tmp_path: Path) -> bytes:
    return trust.load_key(str(tmp_path / "theirs" / "key"))


def plant_import_canary(folder: Path, canary: Path) -> None:
    """Each kernel module writes ``canary`` when it is imported."""
    for kernel in (folder / "kernels").glob("k_*.py"):
        kernel.write_text(f"open({str(canary)!r}, 'w').close()\n" + kernel.read_text())


class Canary:
    """Unpickling this writes its file: what a malicious numba cache file would do."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return builtins.open, (self.path, "w")


def plant_pickle_canary(files: list[Path], canary: Path) -> None:
    assert files
    payload = pickle.dumps(Canary(canary))
    for path in files:
        path.write_bytes(payload)


def signed_inputs() -> dict[str, np.ndarray]:
    return dict(zip(("x", "y", "w1", "b1", "w2"), cache_worker.inputs()))


# ------------------------------------------------------------------ artifacts
def test_a_built_artifact_is_signed_with_the_users_key(compiled) -> None:
    manifest = read_manifest(str(compiled))
    assert manifest["signature"] == trust.sign(manifest["content_hash"], trust.load_key())


@pytest.mark.parametrize("signer", ["unsigned", "foreign key"])
def test_a_tampered_rehashed_artifact_is_refused_before_import(artifact, tmp_path, capsys, signer) -> None:
    canary = tmp_path / "imported"
    plant_import_canary(artifact, canary)
    rehash(artifact, foreign_key(tmp_path) if signer == "foreign key" else None)
    assert run(str(artifact), "--random-inputs") == 1
    line = error_line(capsys)
    why = "it is not signed" if signer == "unsigned" else "it is signed with another key"
    assert f"is not trusted: {why}" in line
    assert f"bendc run --trust {artifact}" in line and "runtime.load(path, trust=True)" in line
    with pytest.raises(ArtifactUntrusted, match=why):
        runtime.load(str(artifact))
    assert not canary.exists()


def test_a_resigned_signature_over_other_contents_is_refused(artifact, capsys) -> None:
    """The user's own signature copied onto changed contents (re-hashed) does not match."""
    signature = read_manifest(str(artifact))["signature"]
    (artifact / "report.txt").write_text("changed")
    rehash(artifact)
    path = artifact / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["signature"] = signature
    path.write_text(json.dumps(manifest))
    assert run(str(artifact), "--random-inputs") == 1
    assert "its signature does not match its contents" in error_line(capsys)


@pytest.fixture(scope="module")
def compiled_by_numba(tmp_path_factory, cache_dir) -> Path:
    """The artifact with numba's machine code (BENDC_NATIVE=0: pickled cache files), built in a
    process of its own (this one holds the native kernels already)."""
    out = tmp_path_factory.mktemp("build-numba") / "step"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BENDC_NATIVE": "0",
           "BENDC_CACHE_DIR": str(tmp_path_factory.mktemp("numba-cache"))}
    done = subprocess.run([sys.executable, "-m", "bendc", "compile", f"{WORKER}:step", "--shapes", SHAPES,
                           "--target", "cpu", "-o", str(out)], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.mark.parametrize("signer", ["unsigned", "foreign key"])
@pytest.mark.parametrize("machine_code", ["native", "numba"])
def test_machine_code_in_a_rehashed_artifact_is_never_loaded(request, tmp_path, capsys, signer, machine_code) -> None:
    """A pickle planted in numba's cache files is never unpickled, and a native object file (machine
    code, written over with the same payload) never loaded: the artifact is refused first."""
    built = request.getfixturevalue("compiled" if machine_code == "native" else "compiled_by_numba")
    artifact = tmp_path / "step"
    shutil.copytree(built, artifact)
    canary = tmp_path / "unpickled"
    files = sorted((artifact / "numba").glob("*.native.o" if machine_code == "native" else "*.nb[ic]"))
    plant_pickle_canary(files, canary)
    rehash(artifact, foreign_key(tmp_path) if signer == "foreign key" else None)
    code = run(str(artifact), "--random-inputs")
    assert not canary.exists()
    assert code == 1 and "is not trusted" in error_line(capsys)


def test_a_changed_native_object_in_a_signed_artifact_is_refused(artifact, capsys) -> None:
    """Without rehashing: the object's sha256 no longer matches the signed manifest."""
    (target,) = sorted((artifact / "numba").glob("*.native.o"))[:1]
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte of its code or tables, flipped
    target.write_bytes(bytes(data))
    assert run(str(artifact), "--random-inputs") == 1
    assert "was changed since it was built" in error_line(capsys)


def plant_bytecode_canary(folder: Path, canary: Path) -> None:
    """A ``__pycache__/*.pyc`` beside each kernel, stamped with the kernel's own time and size (as
    Python checks it), whose code writes ``canary``: no manifest lists it."""
    from importlib._bootstrap_external import _code_to_timestamp_pyc

    for kernel in (folder / "kernels").glob("k_*.py"):
        source = kernel.read_text()
        code = compile(f"open({str(canary)!r}, 'w').close()\n" + source, str(kernel), "exec")
        status = kernel.stat()
        pyc = Path(importlib.util.cache_from_source(str(kernel)))
        pyc.parent.mkdir(exist_ok=True)
        pyc.write_bytes(_code_to_timestamp_pyc(code, int(status.st_mtime), status.st_size))


def test_python_bytecode_beside_a_signed_artifacts_kernels_is_never_run(artifact, tmp_path, capsys) -> None:
    canary = tmp_path / "bytecode ran"
    plant_bytecode_canary(artifact, canary)
    assert run(str(artifact), "--random-inputs") == 0  # signed, and run from its verified sources
    assert not canary.exists()


def test_trust_accepts_an_unsigned_artifact_deliberately(artifact, tmp_path, capsys) -> None:
    (artifact / "report.txt").write_text("a report edited by hand\n")
    rehash(artifact)
    assert run(str(artifact), "--random-inputs") == 1
    capsys.readouterr()
    assert run("--trust", str(artifact), "--random-inputs") == 0
    assert "ran step (cpu)" in capsys.readouterr().out
    program = runtime.load(str(artifact), trust=True)
    got = program(**signed_inputs())
    want = bendc.jit(cache_worker.step, leaves=cache_worker.LEAVES, target="reference")(*cache_worker.inputs())
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # trust skips the signature, never the hashes
    (artifact / "report.txt").write_text("changed after the hashes")
    assert run("--trust", str(artifact), "--random-inputs") == 1
    assert "report.txt was changed since it was built" in error_line(capsys)


def test_a_team_key_signs_for_runtimes_given_it(tmp_path, monkeypatch, capsys) -> None:
    team = tmp_path / "team.key"
    team.write_text(bytes(range(32)).hex() + "\n")
    team.chmod(0o600)
    out = tmp_path / "team-build"
    compile_to(out, "--sign-with", str(team))
    capsys.readouterr()
    assert run(str(out), "--random-inputs") == 1  # this user's own key did not sign it
    assert "signed with another key" in error_line(capsys)
    monkeypatch.setenv("BENDC_KEY_FILE", str(team))
    assert run(str(out), "--random-inputs") == 0
    assert "ran step (cpu)" in capsys.readouterr().out
    team.chmod(0o640)  # a team key readable by the group could sign for it
    assert run(str(out), "--random-inputs") == 1
    assert f"chmod 600 {team}" in error_line(capsys)


def test_sign_with_a_loose_key_file_is_refused(tmp_path, capsys) -> None:
    team = tmp_path / "team.key"
    team.write_text(bytes(range(32)).hex() + "\n")
    team.chmod(0o660)
    assert cli.main(["compile", f"{WORKER}:step", "--shapes", SHAPES, "--target", "cpu",
                     "-o", str(tmp_path / "out"), "--sign-with", str(team)]) == 1
    assert "has mode 0660: group or others can read or write it" in error_line(capsys)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ permissions
def test_a_group_writable_key_file_is_refused(artifact, tmp_path, monkeypatch, capsys) -> None:
    key = tmp_path / "keys" / "key"
    monkeypatch.setenv("BENDC_KEY_FILE", str(key))
    trust.load_key()  # made on first use, 0600 in a 0700 folder
    assert oct(key.stat().st_mode & 0o777) == oct(0o600) and oct(key.parent.stat().st_mode & 0o777) == oct(0o700)
    key.chmod(0o620)
    assert run(str(artifact), "--random-inputs") == 1
    assert f"the signing key {key} has mode 0620" in error_line(capsys)
    step = bendc.jit(cache_worker.step, leaves=cache_worker.LEAVES, target="cpu", cache_dir=str(tmp_path / "cache"))
    with pytest.raises(bendc.ArtifactError, match=f"chmod 600 {key}"):
        step(*cache_worker.inputs())
    key.chmod(0o600)
    key.parent.chmod(0o777)  # others could put their own key in its place
    with pytest.raises(trust.InsecurePath, match="the key's folder .* chmod go-w"):
        trust.load_key()


@pytest.mark.parametrize("where", ["root", "kernels", "another owner"])
def test_a_world_writable_cache_folder_is_refused(tmp_path, where) -> None:
    if where == "another owner" and os.getuid() != 0:
        pytest.skip("giving a folder to another user takes root")
    cache = tmp_path / "cache"
    step = bendc.jit(cache_worker.step, leaves=cache_worker.LEAVES, target="cpu", cache_dir=str(cache))
    step(*cache_worker.inputs())
    loose = cache / "kernels" if where == "kernels" else cache
    again = bendc.jit(cache_worker.step, leaves=cache_worker.LEAVES, target="cpu", cache_dir=str(cache))
    if where == "another owner":
        os.chown(loose, 12345, -1)
        with pytest.raises(bendc.ArtifactError, match=f"cache folder {loose} is owned by another user"):
            again(*cache_worker.inputs())
        os.chown(loose, 0, -1)
    else:
        loose.chmod(0o777)
        with pytest.raises(bendc.ArtifactError, match=f"mode 0777: group or others can write it.*chmod go-w {loose}"):
            again(*cache_worker.inputs())
        loose.chmod(0o700)
    again(*cache_worker.inputs())


def test_a_new_cache_folder_is_private(tmp_path) -> None:
    cache = tmp_path / "new" / "cache"
    step = bendc.jit(cache_worker.step, leaves=cache_worker.LEAVES, target="cpu", cache_dir=str(cache))
    old = os.umask(0o002)  # a umask that would make group-writable folders
    try:
        step(*cache_worker.inputs())
    finally:
        os.umask(old)
    for folder in (cache, *(cache / name for name in trust.MADE_FOLDERS)):
        assert folder.stat().st_mode & 0o077 == 0, folder


# ------------------------------------------------------------------ the jit's cache
def worker(cache: Path, **environment: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **environment}
    done = subprocess.run([sys.executable, WORKER, str(cache), "--verify"], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_pickle_planted_in_the_kernel_cache_is_never_unpickled(tmp_path) -> None:
    """numba's cache files (BENDC_NATIVE=0: every kernel numba's) under a pickle that would write
    a file when unpickled: their .sig no longer matches, so they are compiled again, never read."""
    cache = tmp_path / "cache"
    assert worker(cache, BENDC_NATIVE="0").splitlines()[-1] == "ok compiled"
    numba_files = sorted((cache / "kernels" / "__pycache__").glob("*.nb[ic]"))
    canary = tmp_path / "unpickled"
    plant_pickle_canary(numba_files, canary)  # their .sig files no longer match
    shutil.rmtree(cache / "programs")  # the program is built again over the same kernel files
    out = worker(cache, BENDC_NATIVE="0")
    assert not canary.exists()
    assert out.splitlines()[-1] == "ok compiled"  # and verified against the reference
    assert all(Path(f"{path}.sig").exists() for path in numba_files)  # rewritten, signed
    assert worker(cache, BENDC_NATIVE="0").splitlines()[-1] == "ok cache"


def test_an_object_planted_in_the_kernel_cache_is_never_loaded(tmp_path) -> None:
    """Native object files written over by someone else (their .sig no longer matches) are
    compiled again and re-signed, never loaded; a signed one is loaded by the next process."""
    cache = tmp_path / "cache"
    assert worker(cache).splitlines()[-1] == "ok compiled"
    objects = sorted((cache / "kernels" / "__pycache__").glob("*.native.o"))
    assert objects and all(Path(f"{path}.sig").exists() for path in objects)
    planted = {path: b"\x7fELF not what bendc compiled" for path in objects}
    for path, data in planted.items():
        path.write_bytes(data)
    shutil.rmtree(cache / "programs")
    assert worker(cache).splitlines()[-1] == "ok compiled"  # compiled again, verified against the reference
    assert all(path.read_bytes() != planted[path] for path in objects)  # rewritten
    assert worker(cache).splitlines()[-1] == "ok cache"


@pytest.mark.parametrize("signer", ["unsigned", "foreign key"])
def test_a_rehashed_cache_entry_is_discarded_and_rebuilt(tmp_path, signer) -> None:
    cache = tmp_path / "cache"
    assert worker(cache).splitlines()[-1] == "ok compiled"
    (entry,) = (cache / "programs").iterdir()
    canary = tmp_path / "imported"
    plant_import_canary(entry, canary)
    for kernel in (cache / "kernels").glob("k_*.py"):
        kernel.unlink()  # so the entry's own (planted) copies would be the ones imported
    rehash(entry, foreign_key(tmp_path) if signer == "foreign key" else None)
    out = worker(cache)
    assert not canary.exists()
    assert "discarded a cache entry that your key did not sign" in out and out.splitlines()[-1] == "ok compiled"
    assert worker(cache).splitlines()[-1] == "ok cache"  # the rebuilt entry is signed


# ------------------------------------------------------------------ the key
KEY_RACER = r"""
import os, sys, time
sys.path.insert(0, sys.argv[2])
from runtime.trust import key_id, load_key
while not os.path.exists(sys.argv[1]):
    time.sleep(0.0005)
print(key_id(load_key()))
"""


def test_processes_racing_to_make_the_key_end_with_one(tmp_path) -> None:
    for round in range(3):
        key = tmp_path / f"config{round}" / "bendc" / "key"
        barrier = tmp_path / f"go{round}"
        env = {**os.environ, "BENDC_KEY_FILE": str(key)}
        racers = [subprocess.Popen([sys.executable, "-c", KEY_RACER, str(barrier), str(ROOT)], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        time.sleep(0.5)  # both are waiting, imports done
        barrier.touch()
        ids = []
        for racer in racers:
            out, err = racer.communicate(timeout=60)
            assert racer.returncode == 0, err
            ids.append(out.strip())
        assert ids[0] == ids[1] == trust.key_id(trust.load_key(str(key)))
        assert sorted(os.listdir(key.parent)) == ["key"]  # no temporaries left


def test_run_help_says_an_artifact_is_code(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "An artifact is code, like a wheel" in text and "load only what you built or trust" in text
    assert "--trust" in text
    with pytest.raises(SystemExit):
        cli.main(["compile", "--help"])
    assert "--sign-with KEYFILE" in capsys.readouterr().out
