"""Artifacts and cache entries are code: who signed them, and who can write where they lie.

An artifact (and every entry of bendc's on-disk cache) holds generated Python that the runtime
imports and numba's cache files, which numba reads with ``pickle``: loading one runs it, like
installing a wheel. The manifest's content hashes catch damage but not malice (whoever writes the
files can write matching hashes), so each manifest is also signed:

- a per-user key: 32 random bytes (hex) in ``$BENDC_KEY_FILE``, else
  ``($XDG_CONFIG_HOME or ~/.config)/bendc/key``, created on first use (mode 0600 in a 0700
  folder; written under a temporary name and linked into place, so processes racing to create it
  end with one key that all of them use);
- ``signature`` in the manifest: HMAC-SHA256 under that key of the content hash (which covers
  every file's sha256), with the key's id, so a refusal can say "another key";
- numba's cache files in bendc's cache folders get a ``.sig`` file beside them (an HMAC of the
  file's name and bytes), checked before numba unpickles a byte (runtime/artifact.py).

And, as ssh does for its keys, a key file or cache folder that another user owns, or that group or
others can write (or, for the key, read), is refused with the command that fixes it. Only the
standard library is used (hmac, hashlib, secrets): the runtime stays importable alone.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import tempfile
from typing import Any

KEY_BYTES = 32
KEY_NAME = "key"
# What an artifact signature's HMAC covers: this label, then the manifest's content hash.
SIGNED_LABEL = b"bendc-artifact-signature-v1\0"
FILE_LABEL = b"bendc-cache-file-v1\0"
SIGNATURE_SUFFIX = ".sig"
# Cache sub-folders bendc and numba write into: made (0700) when missing, then checked.
MADE_FOLDERS = ("kernels", "kernels/__pycache__", "programs", "aot")
# Checked when they exist (bendc/codegen/cubins.py makes it 0700 where it writes a cubin).
CHECKED_FOLDERS = (*MADE_FOLDERS, "cubins")
_KEYS: dict[str, tuple[tuple[int, int, int], bytes]] = {}  # key file -> (its stat, the key)


class InsecurePath(Exception):
    """A key file or cache folder that others could write (or read, for a key): names the fix."""


def key_file() -> str:
    """Where the signing key lives: $BENDC_KEY_FILE, else ($XDG_CONFIG_HOME or ~/.config)/bendc/key."""
    configured = os.environ.get("BENDC_KEY_FILE")
    if configured:
        return os.path.abspath(configured)
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "bendc", KEY_NAME)


def load_key(path: str | None = None, create: bool = True) -> bytes:
    """The key in ``path`` (default :func:`key_file`), made on first use where ``create``; its file
    and folder are checked as ssh checks a private key (InsecurePath)."""
    path = os.path.abspath(path or key_file())
    if create and not os.path.exists(path):
        _create_key(path)
    check_private(os.path.dirname(path), "the key's folder", sticky_ok=True)
    try:
        status = os.stat(path)
    except FileNotFoundError:
        raise InsecurePath(f"no signing key at {path} (BENDC_KEY_FILE names a file that is not there)") from None
    check_private(path, "the signing key", secret=True, status=status)
    stamp = (status.st_ino, status.st_mtime_ns, status.st_size)
    known = _KEYS.get(path)
    if known is not None and known[0] == stamp:
        return known[1]
    with open(path, encoding="ascii", errors="replace") as stream:
        text = stream.read().strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 16:
        raise InsecurePath(f"{path} is not a bendc key (expected {2 * KEY_BYTES} hex digits); remove it "
                           "and a new one is made, or point BENDC_KEY_FILE at your team's key")
    _KEYS[path] = (stamp, key)
    return key


def _create_key(path: str) -> None:
    """Write a new key to ``path`` unless one appears there first (another process's: kept)."""
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=".key.tmp-")  # O_EXCL, mode 0600
    try:
        with os.fdopen(handle, "w", encoding="ascii") as stream:
            stream.write(secrets.token_hex(KEY_BYTES) + "\n")
            stream.flush()
            os.fsync(stream.fileno())
        try:
            os.link(temporary, path)  # atomic, and only where no key is: a racing process's stays
        except FileExistsError:
            pass
    finally:
        os.unlink(temporary)


def key_id(key: bytes) -> str:
    """A short public name of a key (a hash of it), recorded with each signature."""
    return hashlib.sha256(b"bendc-key-id\0" + key).hexdigest()[:16]


def sign(content_hash: str, key: bytes) -> dict[str, str]:
    """The manifest's ``signature`` of an artifact with this content hash."""
    digest = hmac.new(key, SIGNED_LABEL + content_hash.encode(), hashlib.sha256).hexdigest()
    return {"hmac_sha256": digest, "key_id": key_id(key)}


def signature_problem(signature: Any, content_hash: str, key: bytes) -> str | None:
    """None when ``signature`` is this key's over ``content_hash``, else what is wrong with it."""
    if signature is None:
        return "it is not signed"
    if not isinstance(signature, dict) or not isinstance(signature.get("hmac_sha256"), str):
        return "its signature is not one bendc writes"
    expected = sign(content_hash, key)
    if hmac.compare_digest(signature["hmac_sha256"], expected["hmac_sha256"]):
        return None
    if signature.get("key_id") != expected["key_id"]:
        return f"it is signed with another key (id {signature.get('key_id')}; yours is {expected['key_id']})"
    return "its signature does not match its contents (re-hashed after it was signed)"


def file_mac(name: str, data: bytes, key: bytes) -> str:
    """The HMAC of one cache file (its name and bytes): what its ``.sig`` file holds."""
    return hmac.new(key, FILE_LABEL + name.encode() + b"\0" + data, hashlib.sha256).hexdigest()


def file_mac_matches(name: str, data: bytes, key: bytes, recorded: str) -> bool:
    return hmac.compare_digest(recorded.strip(), file_mac(name, data, key))


# ------------------------------------------------------------------ permissions
def check_private(path: str, what: str, *, secret: bool = False, sticky_ok: bool = False,
                  status: os.stat_result | None = None) -> None:
    """InsecurePath unless ``path`` is owned by this user (or root) and not writable by group or
    others (``secret``: not readable by them either; ``sticky_ok``: a sticky folder such as /tmp,
    where others cannot replace what is ours, is fine)."""
    if not hasattr(os, "getuid"):
        return  # not POSIX: no owners and modes to check
    status = status or os.stat(path)
    mode = stat.S_IMODE(status.st_mode)
    if status.st_uid not in (os.getuid(), 0):
        raise InsecurePath(f"{what} {path} is owned by another user (uid {status.st_uid}): bendc will not run "
                           f"code from there; use a folder of your own")
    loose = 0o077 if secret else 0o022
    if mode & loose and not (sticky_ok and mode & stat.S_ISVTX):
        fix = "chmod 600" if secret else "chmod go-w"
        others = "group or others can read or write it" if secret else "group or others can write it"
        raise InsecurePath(f"{what} {path} has mode {mode:04o}: {others}, and so could make bendc run their "
                           f"code; fix it with: {fix} {path}")


def private_cache(folder: str) -> None:
    """Check the cache folder and its sub-folders (InsecurePath), making those that are missing
    with mode 0700 first (so that neither bendc nor numba makes one with the umask's mode)."""
    for name in ("", *CHECKED_FOLDERS):
        path = os.path.join(folder, name) if name else folder
        if not os.path.isdir(path):
            if name not in ("", *MADE_FOLDERS):
                continue
            os.makedirs(path, mode=0o700, exist_ok=True)
        check_private(path, "the bendc cache folder")
