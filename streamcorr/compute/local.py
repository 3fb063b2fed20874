"""Pair MI in this process: the ``PairEvaluator`` protocol every compute backend meets, the local backend, and the
hop's cancellation (``stoppable``, ``EngineStopping``).

The engine hands every hop's network work to one ``PairEvaluator``: the window's shared copula values
u (C, T), the pairs (iu, iv) to evaluate (stalest first) and the constant-row mask (C,). It gets back MI
(P,) in nats, NaN for a pair whose result did not come back in time; the engine leaves such a cell's
previous value in place, so its age keeps growing, and the scheduler offers it first on the next hop.

``LocalEvaluator`` is the engine's own estimator. The other backend, ``ray`` (``pip install -e ".[ray]"``),
evaluates tiles of the pairs on Ray actors: :mod:`streamcorr.compute.ray`. Counters (``counters()``) are
exported on ``/metrics`` as ``streamcorr_compute_*``.

>>> from streamcorr.estimate.estimator import Estimator
>>> ev = LocalEvaluator(Estimator())
>>> rng = np.random.default_rng(0)
>>> u = (np.argsort(np.argsort(rng.standard_normal((3, 64)), axis=1), axis=1) + 0.5) / 64
>>> ev.estimate(u, np.array([0, 1]), np.array([1, 2]), np.zeros(3, bool)).shape
(2,)
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from typing import Protocol

import numpy as np

from ..estimate.estimator import Estimator

log = logging.getLogger("streamcorr.compute.local")

__all__ = ["COUNTER_HELP", "GAUGES", "EngineStopping", "LocalEvaluator", "PairEvaluator", "stoppable"]

COUNTER_HELP = {
    "pairs": "Pairs handed to the compute backend",
    "pairs_done": "Pairs whose MI came back in time",
    "seconds": "Seconds the backend spent on hops (local: the model; ray: the whole gather)",
    "hops": "Hops handed to the compute backend",
    "tiles": "Tiles submitted to Ray workers (retries included)",
    "tiles_retried": "Tiles resubmitted after their worker was lost or the tile raised",
    "tiles_late": "Tiles abandoned at the hop deadline (cancelled if queued; late results dropped)",
    "tile_errors": "Tiles that raised on a worker (not a lost worker)",
    "cells_stale": "Pair cells left at their previous value because their tile did not come back in time",
    "workers_joined": "Ray workers that loaded the model and joined the pool",
    "workers_lost": "Ray workers found dead or unreachable (their tiles retried or left stale)",
    "worker_start_failures": "Ray workers that failed to start or load a matching model",
    "object_store_bytes": "Bytes put into Ray's object store (the ranks, once per hop)",
    "schedule_seconds": "Head time spent putting ranks, submitting tiles and merging results (not waiting)",
    "worker_seconds": "Seconds workers spent inside tiles whose results were merged",
    "workers": "Ray workers ready now",
    "workers_joining": "Ray workers starting (loading the model)",
    "cells_stale_last_hop": "Pair cells of the newest hop left stale",
}
GAUGES = frozenset({"workers", "workers_joining", "cells_stale_last_hop"})  # the others are counters


_STOP_CHUNK = 2048  # pairs per histogram pass while a stop request is watched for
# on CUDA each call uploads the ranks and builds every channel's bin weights once: 2,048 pairs a call would
# leave the device idle; 262,144 pairs take about 0.13 s on an H200 (bench/results/gpu_path_nvidia-h200.md)
_STOP_CHUNK_CUDA = 2**18


class EngineStopping(Exception):
    """Raised inside a hop when ``Engine.stop`` asks it to end early."""


def stoppable(est: Estimator, stopping: threading.Event) -> Estimator:
    """The engine's handle on its estimator: a shallow copy (the same model and settings; its own hook, so each
    engine has its own stop flag) that raises EngineStopping before its next network batch once ``stopping``
    is set."""

    def check() -> None:
        if stopping.is_set():
            raise EngineStopping("engine stopping")

    view = copy.copy(est)
    view.between_batches = check
    return view


class PairEvaluator(Protocol):
    """What the engine calls once per hop for the network's pairs. Shapes: u (C, T), iu, iv (P,), constant (C,)."""

    def start(self) -> None:
        """Acquire workers; idempotent. Raises ConfigError, naming the key to fix, when none can start."""

    def estimate(self, u: np.ndarray, iu: np.ndarray, iv: np.ndarray, constant: np.ndarray) -> np.ndarray:
        """MI (P,) in nats of rows (iu[p], iv[p]) of u; NaN where a result did not come back in time."""
        ...

    def counters(self) -> dict[str, float]:
        """Live counters by name (``COUNTER_HELP``; names in ``GAUGES`` are levels, the rest only grow)."""
        ...

    def close(self) -> None:
        """Release the workers (and a Ray instance this evaluator started); idempotent."""


class LocalEvaluator:
    """The engine's own estimator, in the hop's thread (histograms + network on its device)."""

    def __init__(self, est: Estimator, stopping: threading.Event | None = None) -> None:
        self.est = est
        self._stopping = stopping
        self._counts = {"hops": 0, "pairs": 0, "pairs_done": 0, "seconds": 0.0}

    def start(self) -> None:
        return None

    def estimate(self, u: np.ndarray, iu: np.ndarray, iv: np.ndarray, constant: np.ndarray) -> np.ndarray:
        t0 = time.perf_counter()
        parts = []
        step = _STOP_CHUNK_CUDA if self.est.device.type == "cuda" else _STOP_CHUNK
        for k in range(0, len(iu), step):  # a stop is honoured between chunks of the histogram stage too
            if self._stopping is not None and self._stopping.is_set():
                raise EngineStopping("engine stopping")
            parts.append(self.est.estimate_ranks(u, iu[k : k + step], iv[k : k + step], constant))
        mi = np.concatenate(parts) if parts else np.zeros(0)
        c = self._counts
        c["hops"] += 1
        c["pairs"] += len(iu)
        c["pairs_done"] += len(iu)
        c["seconds"] += time.perf_counter() - t0
        return mi

    def counters(self) -> dict[str, float]:
        return dict(self._counts)

    def close(self) -> None:
        return None
