"""Graph -> graph passes, each named, each verified, each dumpable."""
from __future__ import annotations

from bendc.passes.manager import Pass, PassContext, Pipeline, default_passes, get_pass, PASSES
from bendc.passes import dce, cse, canonicalize, fusion, attention, bucket  # noqa: F401  (registers)

__all__ = ["Pass", "PassContext", "Pipeline", "default_passes", "get_pass", "PASSES"]
