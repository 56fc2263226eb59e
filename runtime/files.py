"""The one atomic file write: a temporary name in the destination's folder, then a rename."""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import BinaryIO, Callable


def atomic_write(path: str, data: str | bytes | Callable[[BinaryIO], None]) -> None:
    """Write ``data`` (text, bytes, or a function writing into a binary stream) to ``path``: readers
    see the old file or the whole new one, never a part. The folder must exist or is made."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=".tmp-")
    try:
        with os.fdopen(handle, "wb") as stream:
            if callable(data):
                data(stream)
            else:
                stream.write(data.encode() if isinstance(data, str) else data)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def default_cache_dir() -> str:
    """bendc's on-disk cache: $BENDC_CACHE_DIR, else $XDG_CACHE_HOME/bendc or ~/.cache/bendc."""
    configured = os.environ.get("BENDC_CACHE_DIR")
    if configured:
        return configured
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "bendc")


# Temporaries older than this are left by a killed process (a write takes milliseconds).
STALE_SECONDS = 3600


def sweep_stale(folder: str, matches: Callable[[str], bool], older_than: float = STALE_SECONDS) -> None:
    """Remove the files and folders in ``folder`` whose names match and that are older than
    ``older_than`` seconds: temporaries killed writers left (never read by anyone; a recent one may
    be another process's write in progress and is left alone)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    now = time.time()
    for name in names:
        if not matches(name):
            continue
        path = os.path.join(folder, name)
        try:
            if now - os.lstat(path).st_mtime <= older_than or os.path.islink(path):
                continue
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
        except OSError:
            pass  # gone already, or not ours to remove
