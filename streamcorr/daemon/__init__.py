"""The daemon: ``service`` builds the parts a configuration names (``parts`` maps each type to its factory) and
runs them; ``observe`` serves /metrics, /livez, /readyz and /healthz from what the service exposes; ``systemd``
reports readiness to the service manager.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

_LAZY = {
    "Daemon": "service",
}
__all__ = ["Daemon"]

if TYPE_CHECKING:
    from .service import Daemon

__getattr__ = lazy_getattr(__name__, __package__, _LAZY)
