"""Where measured calibrations are cached on disk: ``STREAMCORR_CACHE_DIR``, default ``~/.cache/streamcorr``.

A cache entry is deterministic (weights, device and setting in its name), so a read-only home only costs
the next start the measurement again.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "STREAMCORR_CACHE_DIR"


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "streamcorr")


def cache_dir_text() -> str:
    """The cache directory as the user would write it (for log lines)."""
    return os.environ.get(CACHE_ENV) or "~/.cache/streamcorr"
