"""The error hierarchy: every user mistake is a BendcError naming the user's line.

Messages read ``file:line: op: what is wrong (shapes) -- what to do``. The
location is the innermost frame outside the bendc package, i.e. the user's own
call, found by :func:`user_location`.
"""
from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_SKIPPED_FILES = {os.path.abspath(contextlib.__file__)}


@dataclass(frozen=True)
class SourceLoc:
    """A user's source location: full path and line number."""

    path: str
    line: int

    @property
    def short(self) -> str:
        """``basename:line``: what printed IR shows (stable across checkouts)."""
        return f"{os.path.basename(self.path)}:{self.line}"

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"

    def source_line(self) -> str:
        """The text of the line, stripped, or '' when the file cannot be read."""
        try:
            with open(self.path, encoding="utf-8") as handle:
                for number, text in enumerate(handle, start=1):
                    if number == self.line:
                        return text.strip()
        except OSError:
            pass
        return ""


_TORCH_DIR: list[str] = []  # torch's package folder, once torch is imported (its modules call bendc's ops)


def _torch_dir() -> str | None:
    if not _TORCH_DIR:
        torch = sys.modules.get("torch")
        if torch is None or not getattr(torch, "__file__", None):
            return None
        _TORCH_DIR.append(os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)
    return _TORCH_DIR[0]


def user_location() -> SourceLoc | None:
    """The innermost stack frame that is neither bendc's own code nor torch's (an nn.Module's
    forward calling torch.nn.functional names the user's call of the module)."""
    frame = sys._getframe(1)
    torch_dir = _torch_dir()
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(_PACKAGE_DIR + os.sep) and path not in _SKIPPED_FILES and not (
                torch_dir is not None and path.startswith(torch_dir)):
            return SourceLoc(frame.f_code.co_filename, frame.f_lineno)
        frame = frame.f_back
    return None


class BendcError(Exception):
    """Base of every error bendc raises for a user mistake."""

    def __init__(self, message: str, *, loc: SourceLoc | None = None, op: str | None = None):
        self.loc = loc
        self.op = op
        self.detail = message
        parts = []
        if loc is not None:
            parts.append(f"{loc}:")
        if op is not None:
            parts.append(f"{op}:")
        parts.append(message)
        text = " ".join(parts)
        if loc is not None:
            line = loc.source_line()
            if line:
                text += f"\n    {line}"
        super().__init__(text)


class ShapeError(BendcError):
    """Operand shapes that the op cannot combine."""


class UnsupportedError(BendcError):
    """An op, dtype, argument or target that bendc does not support."""


class UnsupportedAttributeError(UnsupportedError, AttributeError):
    """A Tensor method or attribute that bendc does not have (also an AttributeError,
    so ``hasattr`` keeps working)."""


class GradientError(BendcError):
    """A misuse of backward() or .grad."""


class SignatureError(BendcError):
    """Wrong argument count, shape or dtype when calling a jitted function."""


class RuntimeCheckError(BendcError):
    """A value check that fails while running (e.g. an index out of range)."""


class ArtifactError(BendcError):
    """A corrupt, truncated, changed or foreign artifact or cache entry."""


class DistributedError(BendcError):
    """A collective that cannot complete: another rank died, raised, is stuck, or runs another program."""


class InternalError(BendcError):
    """A bug in bendc: names the pass or kernel that failed and prints the IR around it, with the
    user's source lines (``# file:line`` on each IR line), so that it can be reported."""

    def __init__(self, message: str, *, loc: SourceLoc | None = None, op: str | None = None,
                 context: str = "") -> None:
        self.context = context
        super().__init__(message, loc=loc, op=op)
        tail = "\n  the IR around it:\n" + "\n".join("    " + line for line in context.splitlines()) if context else ""
        self.args = (self.args[0] + tail + "\n  (a bug in bendc: please report it with this message)",)


def format_shapes(*types) -> str:
    """``f32[2,3], f32[3]`` for error messages."""
    return ", ".join(str(t) for t in types)
