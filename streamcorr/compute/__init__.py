"""Where pair estimates run: ``local`` (in this process, with the hop's cancellation) or ``ray`` (tiles of pairs
on Ray actors, each holding the model once). Both satisfy ``local.PairEvaluator``; the engine calls only that.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

_LAZY = {
    "PairEvaluator": "local",
    "LocalEvaluator": "local",
    "EngineStopping": "local",
}
__all__ = ["EngineStopping", "LocalEvaluator", "PairEvaluator"]

if TYPE_CHECKING:
    from .local import EngineStopping, LocalEvaluator, PairEvaluator

__getattr__ = lazy_getattr(__name__, __package__, _LAZY)
