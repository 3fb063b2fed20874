"""streamcorr: real-time mutual information between sensor streams, by InfoNet.

Importing the package is cheap: torch and numba load on first use of the API.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_getattr
from .errors import ConfigError, InputError, ModelLoadError, StreamcorrError

__version__ = "0.1.0"

# public name -> submodule that defines it, imported on first access (PEP 562)
_LAZY = {
    "Estimator": "estimate.estimator",
    "estimate_mi": "estimate.estimator",
    "estimate_mi_batch": "estimate.estimator",
    "sliced_mi": "estimate.estimator",
    "Engine": "engine.core",
    "EngineConfig": "engine.settings",
    "Snapshot": "engine.matrix",
    "ChangeEvent": "engine.changes",
    "Subscriber": "publish.subscriber",
    "load_config": "config",
}

__all__ = [
    "ChangeEvent",
    "ConfigError",
    "Engine",
    "EngineConfig",
    "Estimator",
    "InputError",
    "ModelLoadError",
    "Snapshot",
    "StreamcorrError",
    "Subscriber",
    "estimate_mi",
    "estimate_mi_batch",
    "load_config",
    "sliced_mi",
]

if TYPE_CHECKING:
    from .config import load_config
    from .engine.changes import ChangeEvent
    from .engine.core import Engine
    from .engine.matrix import Snapshot
    from .engine.settings import EngineConfig
    from .estimate.estimator import Estimator, estimate_mi, estimate_mi_batch, sliced_mi
    from .publish.subscriber import Subscriber


__getattr__ = lazy_getattr(__name__, __package__, _LAZY)
