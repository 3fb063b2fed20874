"""`streamcorr run config.yaml`: sources -> engine -> sinks, with /metrics, /livez, /readyz, /healthz and the
optional web view.

Shutdown (SIGTERM, SIGINT or `stop()`): ingest stops first, windows already due
are evaluated (for at most ``SHUTDOWN_FLUSH_S``; a hop still running then is
abandoned at its next model batch), the last snapshot and an "offline" status are
published (each sink gets at most ``SHUTDOWN_SINK_S``), then the listeners close.
A source or sink losing its broker reconnects by itself; the daemon never exits for that.

Start-up: HTTP comes up first; ``/livez`` answers 200, ``/readyz`` and ``/healthz`` "starting" (503) while
the engine is prepared in a worker thread (the model, and on the first start with a window setting the
change detector's null calibration, logged with its expected duration); Ctrl-C or SIGTERM then stops at
once. What each health endpoint claims is in :mod:`streamcorr.daemon.observe`. Under a systemd ``Type=notify``
unit (examples/streamcorr.service) the daemon says READY=1 once running, extends the start timeout while
it prepares the engine, pings the watchdog from the event loop, and says STOPPING=1 at shutdown. Every
ledger entry (ingest, engine, outputs, web view, HTTP listener) is a Prometheus series and a key of the
status message's counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, Histogram, generate_latest

from ..cache import cache_dir_text
from ..compute.local import PairEvaluator
from ..config import Config, MqttConnection, MqttSourceConfig
from ..engine.changes import ChangeEvent, calibration_eta_s, calibration_origin, null_windows
from ..engine.core import Engine
from ..engine.matrix import Snapshot
from ..engine.settings import EngineConfig
from ..errors import ConfigError, StreamcorrError
from ..estimate.estimator import Estimator
from ..ingest.source import Source
from ..logutil import RateLimitedLog
from ..publish.sinks import Sink, SinkGuard, forward, return_free_memory
from ..transport.http import HttpGuard
from .exposure import warn_exposed
from .observe import DaemonMetrics, health, liveness, readiness, status_counters
from .parts import COMPUTE, OUTPUTS, SOURCES
from .systemd import SystemdNotifier

log = logging.getLogger("streamcorr.daemon.service")

__all__ = ["Daemon"]

SHUTDOWN_FLUSH_S = 5.0  # longest a shutdown waits for windows already due
SHUTDOWN_SINK_S = 5.0  # longest a shutdown waits for one sink's last snapshot and goodbye
HEAP_TRIM_EVERY_S = 60.0  # free heap pages handed back this often (the estimator keeps freed buffers for speed)
_LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _DaemonGauges:
    """The daemon's own consumer of the engine's output, fed by `forward` after every output: the hop-latency
    histogram and the publish-lag gauge."""

    def __init__(self, daemon: Daemon) -> None:
        self.d = daemon

    async def publish_snapshot(self, snap: Snapshot) -> None:
        d = self.d
        d.hop_seconds.observe(d.engine.counters.last_hop_s)
        d.publish_lag_s = max(0.0, time.time() - snap.wall_ns / 1e9)  # after every output has it

    async def publish_event(self, ev: ChangeEvent) -> None:
        pass

    async def publish_status(self, state: str, counters: Mapping[str, float | int]) -> None:
        pass


class Daemon:
    """The long-running service behind `streamcorr run`. `await Daemon(cfg).run()` until `stop()` or a signal."""

    def __init__(self, cfg: Config, *, estimator: Estimator | None = None) -> None:
        self.cfg = cfg
        self._estimator = estimator
        self._engine: Engine | None = None  # built by run(), in a worker thread (null calibration)
        self._compute: PairEvaluator | None = None  # compute.backend ray: its workers, started with the engine
        self.http_guard: HttpGuard | None = None
        self.registry = CollectorRegistry()
        self.registry.register(DaemonMetrics(self))
        self.hop_seconds = Histogram("streamcorr_hop_seconds", "Compute time of one hop (align, ranks, model, publish)",
                                     buckets=_LATENCY_BUCKETS_S, registry=self.registry)  # fmt: skip
        self.publish_lag_s = 0.0
        Gauge(
            "streamcorr_publish_lag_seconds", "Wall time from a snapshot to every sink having it",
            registry=self.registry,
        ).set_function(lambda: self.publish_lag_s)  # fmt: skip
        self.started_wall = time.time()
        self.http_url: str | None = None
        self.notify = SystemdNotifier()
        self.phase = "starting"  # starting -> running -> stopping
        self.phase_detail = "loading the model"
        self._stop = asyncio.Event()
        self.failure: BaseException | None = None  # why a source stopped for good (bad endpoint, say)
        self._runner: web.AppRunner | None = None
        self._forwarder: asyncio.Task[None] | None = None
        self._input_seen = 0  # samples handed by all sources, as of the last watch tick
        self.first_input_wall: float | None = None
        self.last_input_wall: float | None = None
        self._warn = RateLimitedLog(log)
        self._setup_thread: threading.Thread | None = None
        self.sources: list[tuple[str, Source]] = [
            (f"{s.type}{k}", SOURCES[s.type](s, self.decoder(s, k), self.push)) for k, s in enumerate(cfg.sources)
        ]
        self.outputs = [SinkGuard(name, make(section)) for name, make in OUTPUTS.items()
                        if (section := getattr(cfg.outputs, name)) is not None]  # fmt: skip
        self.web: Any = None
        if cfg.http.web:
            from ..publish.web import WebView

            self.web = WebView(table_fn=self._pair_table, lag_fn=self._pair_lag,
                               max_queue_bytes=cfg.http.web_max_queue_bytes)  # fmt: skip
            self.outputs.append(SinkGuard("web", self.web))

    @property
    def engine(self) -> Engine:
        """The engine; it exists once run() has prepared it (``phase`` is then no longer "starting")."""
        if self._engine is None:
            raise RuntimeError("the daemon's engine is not ready yet: run() prepares it")
        return self._engine

    @property
    def engine_or_none(self) -> Engine | None:
        return self._engine

    @property
    def sinks(self) -> list[Sink]:
        return [g.sink for g in self.outputs]

    def push(self, channel: str, t: Any, values: Any) -> int:
        """Where sources hand their samples: the engine (Engine.push)."""
        return self.engine.push(channel, t, values)

    def decoder(self, payload: Any, index: int) -> Any:
        """Source number index's payload decoder: its section's payload keys, and the channel-name rule's bound."""
        from ..ingest.payload import source_decoder

        return source_decoder(payload, index, max_name_bytes=self.cfg.channels.max_name_bytes)

    @property
    def setup_abandoned(self) -> bool:
        """True after run() returned while the engine was still being prepared (stopped during a first-start
        calibration): its thread cannot be interrupted, so a process should end with ``os._exit``."""
        return self._engine is None and self._setup_thread is not None and self._setup_thread.is_alive()

    def _pair_table(self, a: str, b: str) -> Any:
        return self.engine.pair_table(a, b)

    def _pair_lag(self, a: str, b: str) -> Any:  # /api/pair's lag curve; None: lags off, or not searched yet
        curve = None if self._engine is None or self._engine.lags is None else self._engine.lags.curve(a, b)
        return None if curve is None else curve.as_dict()

    # -- state for metrics, status and health (streamcorr.daemon.observe) ----------------------------------
    def status(self) -> dict[str, float]:
        """The status message's counters: every ledger entry of /metrics, flat."""
        return status_counters(self)

    def health(self) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body) of /healthz."""
        return health(self)

    @property
    def status_interval_s(self) -> float:  # outputs.status_interval_s: how often each output gets "online"
        return self.cfg.outputs.status_interval_s

    @property
    def forwarder_stopped(self) -> bool:
        return self._forwarder is not None and self._forwarder.done()

    @property
    def hop_s(self) -> float:
        return self.cfg.hop_samples() / self.cfg.channels.rate_hz

    @property
    def snapshot_stale_s(self) -> float:
        """Input flowing but no new snapshot for this long means the engine is stuck (http.snapshot_stale_s)."""
        return self.cfg.http.snapshot_stale_s or max(10.0, 3 * self.hop_s)

    async def _watch(self) -> None:
        """Notes when input last arrived (for /healthz), tells the user which key to fix, or what to start,
        while an MQTT broker refuses the connection, and returns the heap's free pages every HEAP_TRIM_EVERY_S."""
        hints = RateLimitedLog(log, interval_s=60.0)
        trimmed = time.monotonic()
        while True:
            if time.monotonic() - trimmed >= HEAP_TRIM_EVERY_S:
                trimmed = time.monotonic()
                await asyncio.to_thread(return_free_memory)
            total = sum(src.counters.samples_handed for _, src in self.sources)
            if total != self._input_seen:
                now = time.time()
                self._input_seen = total
                self.last_input_wall = now
                if self.first_input_wall is None:
                    self.first_input_wall = now
            for key, conn, counters in self._mqtt_parts():
                if counters.connect_failures and not counters.connects:  # never connected yet
                    hints.warning(
                        key, "%s: no MQTT broker answers at %s:%d (%d attempts, still retrying): start one "
                        "(`mosquitto -d`, or `systemctl start mosquitto`), or fix %s.host / %s.port",
                        key, conn.host, conn.port, counters.connect_failures, key, key,
                    )  # fmt: skip
            await asyncio.sleep(0.25)

    def _mqtt_parts(self) -> Iterator[tuple[str, MqttConnection, Any]]:
        """(config key, connection settings, counters) of every MQTT source and output."""
        for k, (_, src) in enumerate(self.sources):
            if isinstance(section := self.cfg.sources[k], MqttSourceConfig):
                yield f"sources.{k}", section, src.counters
        for guard in self.outputs:
            if guard.name == "mqtt" and self.cfg.outputs.mqtt is not None:
                yield "outputs.mqtt", self.cfg.outputs.mqtt, guard.sink.counters

    # -- HTTP ---------------------------------------------------------------------------------------
    async def _start_http(self) -> None:
        h = self.cfg.http
        if not h.enabled:
            return

        async def metrics(_req: web.Request) -> web.Response:
            body = generate_latest(self.registry)
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

        def answer(probe: Callable[[], tuple[int, dict[str, Any]]]) -> Callable[[web.Request], Awaitable[Any]]:
            async def handler(_req: web.Request) -> web.Response:  # on the event loop: an answer proves it turns
                code, body = probe()
                return web.json_response(body, status=code)

            return handler

        self.http_guard = HttpGuard(max_connections=h.max_connections, header_timeout_s=h.header_timeout_s)
        app = web.Application(middlewares=[self.http_guard.middleware])
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/livez", answer(lambda: liveness(self)))
        app.router.add_get("/readyz", answer(lambda: readiness(self)))
        app.router.add_get("/healthz", answer(self.health))
        if self.web is not None:
            self.web.attach(app)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        try:
            port = await self.http_guard.listen(self._runner.server, h.host, h.port)  # type: ignore[arg-type]
        except OSError as exc:
            await self._runner.cleanup()
            self._runner = None
            in_use = exc.errno == errno.EADDRINUSE
            why = "the port is in use (another streamcorr?)" if in_use else exc.strerror or str(exc)
            msg = f"http.port: cannot listen on {h.host}:{h.port}: {why}; pick another port (0: any free one)"
            raise ConfigError(msg) from None
        host = f"[{h.host}]" if ":" in h.host else h.host
        self.http_url = f"http://{host}:{port}"
        web_note = ", / live view" if self.web else ""
        log.info("http listening on %s (/metrics, /livez, /readyz, /healthz%s)", self.http_url, web_note)

    async def _stop_http(self) -> None:
        if self._runner is not None:  # first: web view clients get a proper close frame
            await self._runner.cleanup()
            self._runner = None
        if self.http_guard is not None:  # then the listener, and any connection still open
            await self.http_guard.close()

    # -- start-up -----------------------------------------------------------------------------------
    async def _prepare_engine(self) -> bool:
        """Build the engine in a worker thread while HTTP answers "starting"; False if stopped meanwhile."""
        if self._engine is not None:
            return True
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Engine] = loop.create_future()
        ec = EngineConfig.from_config(self.cfg)

        def deliver(engine: Engine | None, exc: BaseException | None) -> None:
            if done.done():
                return
            if exc is not None:
                done.set_exception(exc)
            else:
                done.set_result(engine)  # type: ignore[arg-type]

        stage = ["compute"]  # what the setup thread does: "compute" (Ray), "model", then "measure" if it must

        def build() -> None:
            try:
                hop_s = ec.hop_samples / ec.rate_hz  # the Ray backend's default deadline per hop
                start = COMPUTE[self.cfg.compute.backend]
                self._compute = start(self.cfg.compute, ec.estimator, hop_s) if start else None
                stage[0] = "model"
                est = Estimator(**dict(ec.estimator)) if self._estimator is None else self._estimator
                # the null table of the model's fingerprint: measured on a first start, else a shipped or cached file
                if calibration_origin(est.fingerprint, ec.window_len) == "measure":
                    stage[0] = "measure"
                engine = Engine(ec, est, compute=self._compute)
            except BaseException as exc:  # delivered to run(), which reports it
                loop.call_soon_threadsafe(deliver, None, exc)
            else:
                loop.call_soon_threadsafe(deliver, engine, None)

        # a daemon thread: Ctrl-C during a first-start calibration must not wait for it to finish
        self._setup_thread = threading.Thread(target=build, name="streamcorr-engine-setup", daemon=True)
        self._setup_thread.start()
        stop: asyncio.Future[Any] = asyncio.ensure_future(self._stop.wait())
        t0 = time.monotonic()
        told = False
        try:
            while True:
                waiting: set[asyncio.Future[Any]] = {done, stop}
                await asyncio.wait(waiting, timeout=15.0 if told else 2.0, return_when=asyncio.FIRST_COMPLETED)
                self.notify.extend_start(60.0, self.phase_detail)  # still preparing, and the loop turns
                if done.done():
                    self._engine = done.result()
                    if told:
                        log.info("engine ready after %.0f s; the calibration is cached for next time",
                                 time.monotonic() - t0)  # fmt: skip
                    return True
                if stop.done():
                    log.info("stopped while preparing the engine (%.0f s in); nothing was published",
                             time.monotonic() - t0)  # fmt: skip
                    return False
                if stage[0] != "measure":  # Ray logs when its workers are ready; the null table comes from a file
                    self.phase_detail = {"compute": "starting the compute backend: Ray workers loading the model",
                                         "model": "loading the model"}[stage[0]]  # fmt: skip
                    continue
                if not told:
                    told = True
                    self.phase_detail = (
                        f"first start with window {ec.window_len}: measuring the change detector's null calibration"
                    )
                    log.info(
                        "first start with window.samples=%d: measuring the change detector's null calibration "
                        "(the model on %s pairs of independent smooth and white signals, once per window length; "
                        "about %s on this CPU, "
                        "then cached in %s); /healthz says \"starting\" meanwhile, Ctrl-C stops",
                        ec.window_len, f"{null_windows():,}",
                        _duration(calibration_eta_s(ec.window_len)), cache_dir_text(),
                    )  # fmt: skip
                else:
                    log.info("still measuring the null calibration (%.0f s so far)", time.monotonic() - t0)
        finally:
            stop.cancel()

    # -- main loop ----------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask a running daemon to shut down gracefully (safe from a signal handler)."""
        self._stop.set()

    async def run(self, *, install_signals: bool = True) -> None:
        loop = asyncio.get_running_loop()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
        watchdog = asyncio.create_task(self.notify.watchdog(), name="systemd-watchdog")
        try:
            warn_exposed(self.cfg, log)
            await self._start_http()
            if await self._prepare_engine():
                await self._serve()
        finally:
            self.phase, self.phase_detail = "stopping", "shutting down"
            self.notify.stopping()
            await _cancel([watchdog])  # a slow shutdown is bounded by TimeoutStopSec, not the watchdog
            await self._close_compute()
            await self._stop_http()
            if install_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            log.info("stopped")
        if self.failure is not None:
            raise self.failure

    async def _close_compute(self) -> None:
        """Release the compute backend's workers, and shut down the Ray instance it started (after the engine)."""
        if self._compute is None:
            return
        try:
            await asyncio.wait_for(asyncio.to_thread(self._compute.close), timeout=SHUTDOWN_SINK_S)
        except TimeoutError:
            log.warning("the compute backend did not close within %.0f s", SHUTDOWN_SINK_S)
        except Exception:
            log.exception("the compute backend failed to close cleanly")

    async def _serve(self) -> None:
        engine = self.engine
        for guard in self.outputs:  # ZeroMQ binds now; MQTT connects in the background; web: served by HTTP
            try:
                await guard.sink.start()
            except StreamcorrError as exc:  # a port in use, say: name the key to change
                raise ConfigError(f"outputs.{guard.name}: {exc}") from None
        await engine.start()
        self._forwarder = asyncio.create_task(
            forward(
                engine, *self.outputs, _DaemonGauges(self),
                status_interval_s=self.status_interval_s, status=self.status,
            )
        )  # fmt: skip
        ingest = [asyncio.create_task(src.run(), name=f"source-{name}") for name, src in self.sources]
        for (name, _), task in zip(self.sources, ingest, strict=True):
            task.add_done_callback(functools.partial(self._source_done, name))
        watch = asyncio.create_task(self._watch())
        self.phase = "running"
        self.notify.ready(f"running: {len(self.sources)} source(s), {len(self.outputs)} output(s)")
        log.info("running: %d source(s), %d output(s)", len(self.sources), len(self.outputs))
        try:
            await self._stop.wait()
        finally:
            self.phase, self.phase_detail = "stopping", "shutting down"
            log.info("shutting down: stopping ingest")
            await _cancel([*ingest, watch])
            with contextlib.suppress(Exception):  # due windows, then the forwarder hands them to the outputs
                await asyncio.wait_for(engine.flush(), timeout=SHUTDOWN_FLUSH_S)
                await asyncio.wait_for(engine.drained(), timeout=SHUTDOWN_SINK_S)
            await _cancel([self._forwarder])
            await engine.stop(timeout_s=SHUTDOWN_FLUSH_S)
            for guard in self.outputs:  # the last snapshot if not yet sent, then "offline" (retained on MQTT)
                try:
                    await asyncio.wait_for(self._goodbye(guard, engine.latest), timeout=SHUTDOWN_SINK_S)
                except TimeoutError:
                    log.warning("output %s did not close within %.0f s", guard.name, SHUTDOWN_SINK_S)
                except Exception:
                    log.exception("output %s failed to close cleanly", guard.name)

    @staticmethod
    async def _goodbye(guard: SinkGuard, latest: Snapshot | None) -> None:
        if (latest := guard.unsent(latest)) is not None:
            with contextlib.suppress(StreamcorrError):  # unencodable: counted by the sink; the goodbye still goes
                await guard.sink.publish_snapshot(latest)
        await guard.sink.stop()

    def _source_done(self, name: str, task: asyncio.Task[Any]) -> None:
        # sources retry broker loss themselves; one that returns or raises cannot go on (a port in use, say)
        if task.cancelled() or self._stop.is_set():
            return
        exc = task.exception()
        log.error("source %s stopped: %s; shutting down", name, exc or "returned")
        key = f"sources.{[n for n, _ in self.sources].index(name)}"
        self.failure = ConfigError(f"{key}: {exc}") if isinstance(exc, StreamcorrError) else exc
        self.failure = self.failure or RuntimeError(f"{key} ({name}) stopped")
        self._stop.set()


def _duration(s: float) -> str:
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min"


async def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t
