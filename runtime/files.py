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
