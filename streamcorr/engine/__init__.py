"""The engine: samples in, snapshots and change events out, one hop at a time.

``buffers`` holds each channel's ring buffer; ``intake`` admits samples and aligns channels on the clock (the
tallies in ``counters``); ``scheduler`` chooses the pairs a hop estimates; ``screen`` is the cheap all-pairs
statistic; ``matrix`` is the
published MI matrix; ``changes`` detects changes against each pair's null; ``settings`` turns the configuration
into the engine's; ``core`` runs the hop (align -> rank -> select, with the screen -> estimate -> judge ->
publish) over one ``hop`` record; ``fast`` reports changes within seconds beside it (decouplings by a CUSUM on
per-sample evidence, couplings by ``sentinel`` on short windows). Only ``core`` touches the event loop; the rest is
synchronous.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

_LAZY = {
    "Engine": "core",
    "EngineConfig": "settings",
    "Snapshot": "matrix",
    "ChangeEvent": "changes",
    "ChangeDetector": "changes",
    "PairSelection": "scheduler",
    "RingBuffer": "buffers",
}
__all__ = ["ChangeDetector", "ChangeEvent", "Engine", "EngineConfig", "PairSelection", "RingBuffer", "Snapshot"]

if TYPE_CHECKING:
    from .buffers import RingBuffer
    from .changes import ChangeDetector, ChangeEvent
    from .core import Engine
    from .matrix import Snapshot
    from .scheduler import PairSelection
    from .settings import EngineConfig

__getattr__ = lazy_getattr(__name__, __package__, _LAZY)
