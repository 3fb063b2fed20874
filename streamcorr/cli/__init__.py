"""The command line: ``streamcorr run|check|demo|replay|report|...``. ``main(argv)`` returns the exit status, so
every command is testable without a subprocess; ``replay`` holds the replay and report commands, ``commands`` the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

_LAZY = {
    "main": "commands",
}
__all__ = ["main"]

if TYPE_CHECKING:
    from .commands import main

__getattr__ = lazy_getattr(__name__, __package__, _LAZY)
