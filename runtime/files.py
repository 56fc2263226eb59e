"""The one atomic file write: a temporary name in the destination's folder, then a rename."""
from __future__ import annotations

import os
import tempfile
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
