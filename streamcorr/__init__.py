"""streamcorr: real-time mutual information between sensor streams, by InfoNet.

Importing the package is cheap: torch and numba load on first use of the API.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import ConfigError, InputError, ModelLoadError, StreamcorrError

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "Estimator",
    "InputError",
    "ModelLoadError",
    "StreamcorrError",
    "estimate_mi",
    "estimate_mi_batch",
    "sliced_mi",
]

_LAZY = {"Estimator", "estimate_mi", "estimate_mi_batch", "sliced_mi"}

if TYPE_CHECKING:
    from .estimator import Estimator, estimate_mi, estimate_mi_batch, sliced_mi


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import estimator

        return getattr(estimator, name)
    raise AttributeError(f"module 'streamcorr' has no attribute {name!r}")
