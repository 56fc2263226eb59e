"""BENDC_LOG: topics of the ``bendc`` logger, comma-separated like TORCH_LOGS.

- ``recompiles``: each recompile of a jitted function and its reason (bendc/function.py);
- ``compile``: a cold compile's profile: bendc's stages, then every kernel numba compiled with its
  time by phase, slowest first, and where it was compiled (bendc/codegen/compile_pool.py).

A named topic logs at INFO level through a stderr handler added once where the logger has none.
"""
from __future__ import annotations

import logging
import os

LOGGER = logging.getLogger("bendc")


def enabled(topic: str) -> bool:
    """Whether BENDC_LOG names ``topic``; sets up the logger's handler and level when it does."""
    if topic not in os.environ.get("BENDC_LOG", "").replace(" ", "").split(","):
        return False
    if not LOGGER.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[bendc] %(message)s"))
        LOGGER.addHandler(handler)
    if LOGGER.getEffectiveLevel() > logging.INFO:
        LOGGER.setLevel(logging.INFO)
    return True
