"""Pair tiles on Ray actors: the ``ray`` compute backend (``pip install -e ".[ray]"``).

Per hop:

1. pool upkeep: workers whose model finished loading join (a worker added later takes tiles from the next
   hop on); a worker found dead is counted lost, killed, and replaced (with backoff if replacements fail);
2. (u, constant) goes into Ray's object store once: workers on one node share one copy;
3. the pairs are cut, in order, into tiles of ``tile_pairs`` (fewer, down to 32, when a hop has too few
   pairs to give every worker ``max_in_flight`` tiles); a tile goes to the least busy ready worker,
   which holds at most ``max_in_flight`` tiles, queued or running, across hops: work in flight is bounded;
4. results are merged as they come back, until the hop's deadline (``hop_timeout_s``, default one hop).
   A tile whose worker died, or that raised, is retried once on another worker, first in line; with no worker
   ready (the only one died), the hop waits, within its deadline, for the replacement to load;
5. at the deadline, tiles not back are abandoned (cancelled where still queued; a running one keeps its
   worker's slot until it ends, and its late result is dropped): their cells are NaN, counted stale.

Nothing waits without a bound and no cell gets a value from another window or another model (each worker's
weights fingerprint must equal the head's). Each worker loads the model once (``Estimator`` on its own
device), so for the same device results equal the local backend's (tests/compute/test_compute_ray.py: within 1e-6).
Counters (``counters()``) are exported on ``/metrics`` as ``streamcorr_compute_*``.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import Compute
from ..errors import ConfigError
from ..estimate.estimator import Estimator
from ..logutil import RateLimitedLog
from .local import COUNTER_HELP

log = logging.getLogger("streamcorr.compute.ray")

__all__ = ["RayEvaluator", "TileWorker"]

MIN_TILE_PAIRS = 32  # a small hop is spread over the workers, but not in tiles smaller than this
MAX_ATTEMPTS = 2  # per tile and hop: the first try, then one retry on another worker
RESPAWN_BACKOFF_MAX_S = 60.0  # replacements for workers that fail to start are tried at most this rarely


class TileWorker:
    """One Ray actor: loads the model once on its device, then evaluates tiles of pairs of a hop's ranks."""

    def __init__(self, estimator: Mapping[str, Any], threads: int) -> None:
        import numba

        numba.set_num_threads(max(1, min(threads, getattr(numba.config, "NUMBA_NUM_THREADS", 1))))
        self.est = Estimator(**{"threads": threads, **estimator})

    def ready(self) -> dict[str, Any]:
        """Called once the model is loaded: who this worker is and which weights it holds."""
        import ray

        return {"fingerprint": self.est.fingerprint, "node": ray.util.get_node_ip_address(), "pid": os.getpid()}

    def estimate(
        self, shared: tuple[np.ndarray, np.ndarray], iu: np.ndarray, iv: np.ndarray
    ) -> tuple[np.ndarray, float]:
        """MI (P,) of one tile and the seconds it took; ``shared`` is the hop's (u (C, T), constant (C,))."""
        t0 = time.perf_counter()
        u, constant = shared
        mi = self.est.estimate_ranks(np.array(u), iu, iv, constant)  # a writable copy of the shared read-only u
        return mi, time.perf_counter() - t0


@dataclass(eq=False)
class _Worker:
    actor: Any
    info: dict[str, Any] = field(default_factory=dict)
    outstanding: set[Any] = field(default_factory=set)  # refs queued or running on it, this hop's or abandoned
    tiles: int = 0  # tiles merged from it


@dataclass
class _Tile:
    start: int
    stop: int
    attempts: int = 0


def _quiet_sigterm_note(record: logging.LogRecord) -> bool:
    """Drops Ray's note that it set no SIGTERM handler off the main thread: that is the intent here."""
    return not str(record.msg).startswith("SIGTERM handler is not set")


def _weights_id(fingerprint: str) -> str:
    return fingerprint.split("-", 1)[0]  # the weights digest; the rest names the device and precision


class RayEvaluator:
    """Pair tiles on Ray actors (see the module docstring for the per-hop contract).

    ``settings`` is the config's ``compute`` section; ``estimator`` the Estimator keyword arguments (the
    device is the workers' own, ``settings.device``); ``hop_s`` the default deadline of one hop.
    """

    def __init__(self, settings: Compute, estimator: Mapping[str, Any], hop_s: float) -> None:
        self.settings = settings
        self.est_kwargs = {**estimator, "device": settings.device}
        self.threads = max(1, math.ceil(settings.cpus_per_worker))
        self.hop_timeout_s = settings.hop_timeout_s or hop_s
        self.weights_id: str | None = None  # the head's, set at start
        self._ray: Any = None
        self._remote: Any = None
        self._owns_ray = False
        self._target = settings.workers
        self._ready: list[_Worker] = []
        self._joining: dict[Any, Any] = {}  # ready() ref -> actor
        self._abandoned: set[Any] = set()  # refs of tiles given up at a deadline, until they end
        self._owner: dict[Any, _Worker] = {}  # tile ref -> its worker
        self._respawn_at = 0.0
        self._failures_in_row = 0
        self._last_failure = ""  # why the newest worker failed to start
        self._closing = threading.Event()
        self._released = threading.Event()  # set after ray.shutdown: the thread that started Ray may end
        self._keeper: threading.Thread | None = None
        self._lock = threading.Lock()  # estimate() and close() from different threads
        self._started = False
        self._log = RateLimitedLog(log)
        self._counts: dict[str, float] = dict.fromkeys(COUNTER_HELP, 0)

    # -- pool ---------------------------------------------------------------------------------------
    def start(self) -> None:
        """Connect to (or start) Ray and start the workers; waits until all are ready or start_timeout_s has
        passed with at least one ready. Raises ConfigError when Ray is missing or no worker starts."""
        if self._started:
            return
        # Ray's C++ failure-signal handler would also catch the caller's SIGTERM: it dumps a stack, tears the
        # driver down under the caller's feet, and the process then aborts at exit (seen: exit 134). Ray reads
        # this when it is imported; processes of a local instance inherit it.
        os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
        try:
            import ray
        except ImportError:
            msg = 'compute.backend is "ray" but Ray is not installed: pip install -e ".[ray]" (or "ray>=2.60,<3")'
            raise ConfigError(msg) from None
        self._ray = ray
        s = self.settings
        if not ray.is_initialized():
            self._init_ray(s.address or "local")  # None: a new local instance, whatever RAY_ADDRESS says
            self._owns_ray = True
        self.weights_id = _weights_id(Estimator(**{**self.est_kwargs, "device": "cpu"}).fingerprint)
        gpus = 1.0 if s.device == "cuda" else 0.0
        self._remote = ray.remote(TileWorker).options(num_cpus=s.cpus_per_worker, num_gpus=gpus, max_restarts=0)
        for _ in range(self._target):
            self._spawn()
        self._started = True
        deadline = time.monotonic() + s.start_timeout_s
        while self._joining and time.monotonic() < deadline and not self._closing.is_set():
            ray.wait(list(self._joining), num_returns=1, timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            self._upkeep(respawn=False)
        if not self._ready:
            self.close()
            msg = (
                f"compute: no Ray worker became ready within compute.start_timeout_s={s.start_timeout_s:g} s "
                f"(each needs {s.cpus_per_worker:g} CPU{' and 1 GPU' if gpus else ''}; see `ray status` and "
                "the worker logs); lower compute.cpus_per_worker, use compute.device: cpu, or add nodes"
            )
            if self._last_failure:
                msg += f"; the last worker {self._last_failure}"
            raise ConfigError(msg)
        if self._joining:
            log.warning("ray: %d of %d workers ready after %.0f s; the others join when they are",
                        len(self._ready), self._target, s.start_timeout_s)  # fmt: skip
        where = "a local Ray instance" if self._owns_ray and not s.address else f"Ray at {s.address or 'this driver'}"
        log.info("ray: %d workers ready on %s (%s, gcs %s)", len(self._ready), where, s.device,
                 ray.get_runtime_context().gcs_address)  # fmt: skip

    def _init_ray(self, address: str) -> None:
        """ray.init in a thread of its own that lives until close(): Ray ties the local instance's processes to
        the thread that started them (PR_SET_PDEATHSIG), so a short-lived caller thread would take them down
        with it. The thread is not the main one, so Ray also leaves the caller's SIGTERM handling alone."""
        started = threading.Event()
        failure: list[BaseException] = []

        def hold() -> None:
            try:
                self._ray.init(address=address, include_dashboard=False, log_to_driver=False, namespace="streamcorr")
            except BaseException as exc:  # reported by start() in the caller's thread
                failure.append(exc)
                return
            finally:
                started.set()
            self._released.wait()

        logging.getLogger("ray._private.worker").addFilter(_quiet_sigterm_note)
        self._keeper = threading.Thread(target=hold, name="streamcorr-ray", daemon=True)
        self._keeper.start()
        started.wait()
        if failure:
            msg = f"compute.address: cannot connect to Ray at {address!r}: {failure[0]}; start one (ray start --head)"
            raise ConfigError(msg) from failure[0]

    def add_workers(self, n: int = 1) -> None:
        """Ask for n more workers; each takes tiles from the first hop after its model has loaded."""
        with self._lock:
            self._target += n
            for _ in range(n):
                self._spawn()

    def _spawn(self) -> None:
        actor = self._remote.remote(self.est_kwargs, self.threads)
        self._joining[actor.ready.remote()] = actor

    def _lose(self, w: _Worker, why: str) -> None:
        if w not in self._ready:
            return
        self._ready.remove(w)
        self._counts["workers_lost"] += 1
        self._log(logging.WARNING, "lost", "ray: lost worker %s (%s); its tiles go to the others", w.info, why)
        self._kill(w.actor)
        if not self._closing.is_set() and time.monotonic() >= self._respawn_at:
            self._spawn()  # the replacement loads meanwhile and takes tiles from a later hop

    def _kill(self, actor: Any) -> None:
        try:
            self._ray.kill(actor)
        except Exception as exc:  # already gone, or the cluster is: nothing to release
            log.debug("ray.kill: %s", exc)

    def _upkeep(self, respawn: bool = True) -> None:
        """Workers that finished loading join; refs abandoned at earlier deadlines are reaped (their workers'
        slots free again, a dead one is counted lost); missing workers are replaced."""
        ray = self._ray
        if self._joining:
            done, _ = ray.wait(list(self._joining), num_returns=len(self._joining), timeout=0)
            for ref in done:
                actor = self._joining.pop(ref)
                try:
                    info = ray.get(ref)
                except Exception as exc:
                    self._start_failed(actor, f"failed to start: {str(exc)[:500]}")
                    continue
                if _weights_id(info["fingerprint"]) != self.weights_id:
                    self._start_failed(actor, f"holds other weights ({info['fingerprint']}); install the same model")
                    continue
                self._ready.append(_Worker(actor, info))
                self._counts["workers_joined"] += 1
                self._failures_in_row = 0
        if self._abandoned:
            done, _ = ray.wait(list(self._abandoned), num_returns=len(self._abandoned), timeout=0)
            for ref in done:
                self._reap(ref)
        missing = self._target - len(self._ready) - len(self._joining)
        if respawn and missing > 0 and time.monotonic() >= self._respawn_at:
            for _ in range(missing):
                self._spawn()

    def _reap(self, ref: Any) -> None:
        """A tile abandoned at an earlier deadline has ended: its worker's slot is free (or the worker is lost)."""
        self._abandoned.discard(ref)
        w = self._owner.pop(ref)
        w.outstanding.discard(ref)
        try:
            self._ray.get(ref)
        except self._ray.exceptions.RayActorError as exc:
            self._lose(w, type(exc).__name__)
        except Exception as exc:  # cancelled while queued, or it raised: its result was dropped anyway
            log.debug("abandoned tile: %s", type(exc).__name__)

    def _start_failed(self, actor: Any, why: str) -> None:
        self._counts["worker_start_failures"] += 1
        self._last_failure = why
        self._failures_in_row += 1
        self._respawn_at = time.monotonic() + min(RESPAWN_BACKOFF_MAX_S, 2.0**self._failures_in_row)
        self._log(logging.ERROR, "start_failed", "ray: a worker %s", why)
        self._kill(actor)

    # -- one hop ------------------------------------------------------------------------------------
    def estimate(self, u: np.ndarray, iu: np.ndarray, iv: np.ndarray, constant: np.ndarray) -> np.ndarray:
        """MI (P,) of pairs (iu[p], iv[p]) of rows of u (C, T), NaN where a tile did not come back by the
        hop's deadline. Tiles are cut in the order given (the engine's: stalest first)."""
        if not self._started:
            raise RuntimeError("RayEvaluator.start() must be called before estimate()")
        with self._lock:
            return self._estimate(u, iu, iv, constant)

    def _estimate(self, u: np.ndarray, iu: np.ndarray, iv: np.ndarray, constant: np.ndarray) -> np.ndarray:
        c = self._counts
        t_start = time.perf_counter()
        deadline = time.monotonic() + self.hop_timeout_s
        iu = np.ascontiguousarray(iu, dtype=np.int64)
        iv = np.ascontiguousarray(iv, dtype=np.int64)
        c["hops"] += 1
        c["pairs"] += len(iu)
        if not len(iu) or self._closing.is_set():
            c["cells_stale_last_hop"] = len(iu)
            c["cells_stale"] += len(iu)
            return np.full(len(iu), np.nan)
        self._upkeep()
        u = np.ascontiguousarray(u, dtype=np.float64)
        constant = np.ascontiguousarray(constant, dtype=bool)
        hop = _Hop(self, self._ray.put((u, constant)), iu, iv, self._tile_step(len(iu)))
        c["object_store_bytes"] += u.nbytes + constant.nbytes
        busy_s = (hop.t_waited - t_start) + hop.run(deadline)  # set-up, then the hop's time not spent waiting
        out = hop.out
        stale = int(np.isnan(out).sum())
        c["cells_stale"] += stale
        c["cells_stale_last_hop"] = stale
        c["pairs_done"] += len(out) - stale
        if stale:
            msg = "ray: %d of %d pairs not back within %.2f s (%d workers ready); they keep their previous value"
            self._log(logging.WARNING, "stale", msg, stale, len(out), self.hop_timeout_s, len(self._ready))
        c["schedule_seconds"] += busy_s
        c["seconds"] += time.perf_counter() - t_start
        return out

    def _tile_step(self, pairs: int) -> int:
        """At most tile_pairs, and small enough that every ready worker gets max_in_flight tiles of a small hop."""
        fill = math.ceil(pairs / (max(1, len(self._ready)) * self.settings.max_in_flight))
        return min(self.settings.tile_pairs, max(MIN_TILE_PAIRS, fill))

    # -- state --------------------------------------------------------------------------------------
    def counters(self) -> dict[str, float]:
        out = dict(self._counts)
        out["workers"] = len(self._ready)
        out["workers_joining"] = len(self._joining)
        return out

    def tiles_by_worker(self) -> dict[int, int]:
        """Tiles merged so far per ready worker, by its process id."""
        return {int(w.info.get("pid", -1)): w.tiles for w in self._ready}

    def in_flight(self) -> int:
        """Tiles queued or running on ready workers now (this hop's and those abandoned at a deadline)."""
        return sum(len(w.outstanding) for w in self._ready)

    def worker_handles(self) -> list[Any]:
        """The Ray actor handles of the ready workers (fault-injection tests kill one)."""
        return [w.actor for w in self._ready]

    def close(self) -> None:
        """Kill the workers; shut Ray down if this evaluator started it (else only leave the workers)."""
        self._closing.set()
        with self._lock:
            if self._ray is None:
                return
            for w in self._ready:
                self._kill(w.actor)
            for actor in self._joining.values():
                self._kill(actor)
            self._ready.clear()
            self._joining.clear()
            if self._owns_ray:
                self._ray.shutdown()
                log.info("ray: the local instance is shut down")
            self._ray = None
            self._released.set()


class _Hop:
    """One hop's tiles on the pool: queued, in flight (ref -> tile) and merged into ``out`` (NaN: not back)."""

    def __init__(self, ev: RayEvaluator, shared: Any, iu: np.ndarray, iv: np.ndarray, step: int) -> None:
        self.ev, self.shared, self.iu, self.iv = ev, shared, iu, iv
        self.out = np.full(len(iu), np.nan)
        self.queue = deque(_Tile(s, min(s + step, len(iu))) for s in range(0, len(iu), step))
        self.pending: dict[Any, _Tile] = {}
        self.t_waited = time.perf_counter()  # when the last wait ended

    def run(self, deadline: float) -> float:
        """Submit, merge and resubmit until every tile is back or the deadline passes (then abandon the rest);
        returns the head's busy seconds (not waiting)."""
        ev, ray = self.ev, self.ev._ray
        busy_s = 0.0
        self.submit()
        while (self.pending or self.queue) and not ev._closing.is_set():
            remaining = deadline - time.monotonic()
            # what can free a slot: this hop's tiles, those an earlier deadline left running, and a worker
            # still loading (the replacement of a lost one) when none is ready
            waitable = [*self.pending, *(r for r in ev._abandoned if ev._owner[r] in ev._ready)]
            if not ev._ready:
                waitable += list(ev._joining)
            if remaining <= 0 or not waitable:  # no worker left to wait for: the rest is stale
                break
            busy_s += time.perf_counter() - self.t_waited
            ready, _ = ray.wait(waitable, num_returns=1, timeout=min(remaining, 0.25))
            self.t_waited = time.perf_counter()
            if ready:
                ready, _ = ray.wait(waitable, num_returns=len(waitable), timeout=0)
                for ref in ready:
                    if ref in self.pending:
                        self.settle(ref)
                    elif ref in ev._abandoned:
                        ev._reap(ref)
                if any(ref in ev._joining for ref in ready):
                    ev._upkeep(respawn=False)
                self.submit()
        self.abandon()
        return busy_s + time.perf_counter() - self.t_waited

    def submit(self) -> None:
        """Hand queued tiles to the least busy ready workers, each up to max_in_flight."""
        ev = self.ev
        while self.queue:
            free = [w for w in ev._ready if len(w.outstanding) < ev.settings.max_in_flight]
            if not free:
                return
            w = min(free, key=lambda w: len(w.outstanding))
            tile = self.queue.popleft()
            tile.attempts += 1
            ref = w.actor.estimate.remote(self.shared, self.iu[tile.start : tile.stop], self.iv[tile.start : tile.stop])
            self.pending[ref] = tile
            ev._owner[ref] = w
            w.outstanding.add(ref)
            ev._counts["tiles"] += 1

    def settle(self, ref: Any) -> None:
        """Merge a tile that came back, or retry it (its worker died, it raised, its answer was malformed)."""
        ev, c = self.ev, self.ev._counts
        tile, w = self.pending.pop(ref), ev._owner.pop(ref)
        w.outstanding.discard(ref)
        try:
            mi, worker_s = ev._ray.get(ref)
        except ev._ray.exceptions.RayActorError as exc:
            ev._lose(w, type(exc).__name__)
            self.retry(tile)
        except Exception as exc:
            c["tile_errors"] += 1
            ev._log(logging.ERROR, "tile_error", "ray: a tile raised on worker %s: %s", w.info, str(exc)[:500])
            self.retry(tile)
        else:
            if np.shape(mi) != (tile.stop - tile.start,):  # never a wrong cell: a malformed answer is a failure
                c["tile_errors"] += 1
                self.retry(tile)
                return
            self.out[tile.start : tile.stop] = mi
            c["worker_seconds"] += worker_s
            w.tiles += 1

    def retry(self, tile: _Tile) -> None:
        if tile.attempts < MAX_ATTEMPTS:
            self.queue.appendleft(tile)  # its pairs are the stalest of those left
            self.ev._counts["tiles_retried"] += 1

    def abandon(self) -> None:
        """The deadline passed: cancel what is queued; what runs keeps its worker's slot until it ends."""
        ev = self.ev
        for ref in self.pending:
            try:
                ev._ray.cancel(ref)
            except Exception as exc:
                log.debug("ray.cancel: %s", exc)
            ev._abandoned.add(ref)
        ev._counts["tiles_late"] += len(self.pending)
