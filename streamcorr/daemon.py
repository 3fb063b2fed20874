"""`streamcorr run config.yaml`: sources -> engine -> sinks, with /metrics, /healthz and the optional web view.

Shutdown (SIGTERM, SIGINT or `stop()`): ingest stops first, windows already due
are evaluated (for at most ``SHUTDOWN_FLUSH_S``; a hop still running then is
abandoned at its next model batch), the last snapshot and an "offline" status are
published, then the listeners close. A source or sink losing its broker reconnects by itself;
the daemon never exits for that.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import signal
import time
from collections.abc import Iterator, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .config import Config, MqttConnection, Payload
from .engine import Engine, EngineConfig
from .estimator import Estimator
from .ingest.mqtt import MqttSettings, MqttTls
from .publish.changes import ChangeEvent
from .publish.sinks import forward
from .publish.snapshot import Snapshot
from .scheduler import PairSelection

log = logging.getLogger("streamcorr.daemon")

__all__ = ["Daemon", "engine_config", "setup_logging"]

SHUTDOWN_FLUSH_S = 5.0  # longest a shutdown waits for windows already due
_LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def engine_config(cfg: Config) -> EngineConfig:
    p = cfg.pairs
    if p.mode == "list":
        pairs = PairSelection(all=False, pairs=tuple((a, b) for a, b in p.pairs))
    elif p.mode == "groups":
        pairs = PairSelection(all=False, groups=tuple(p.groups), groups_with=tuple(p.groups_with))
    else:
        pairs = PairSelection()
    est: dict[str, Any] = {"device": cfg.estimator.device, "batch_size": cfg.estimator.batch_size}
    if cfg.estimator.threads is not None:
        est["threads"] = cfg.estimator.threads
    if cfg.estimator.weights is not None:
        est["weights"] = cfg.estimator.weights
    return EngineConfig(
        channels=list(cfg.channels.names),
        rate_hz=cfg.channels.rate_hz,
        window_len=cfg.window.samples,
        hop_samples=cfg.hop_samples(),
        max_staleness_s=cfg.channels.max_staleness_s,
        pairs=pairs,
        max_pairs_per_hop=p.max_per_hop,
        min_coverage=cfg.window.min_coverage,
        false_alarm_rate=cfg.changes.false_alarm_rate,
        min_effect=cfg.changes.min_effect,
        persist=cfg.changes.persist,
        delta=cfg.changes.delta,
        rel_delta=cfg.changes.rel_delta,
        auto_add_channels=cfg.channels.auto_add,
        max_channels=cfg.channels.max_channels,
        auto_pairs_per_hop=cfg.channels.auto_pairs_per_hop,
        max_future_s=cfg.channels.max_future_s,
        max_name_bytes=cfg.channels.max_name_bytes,
        skip_stale_hops=cfg.window.skip_stale_hops,
        estimator=est,
    )


def mqtt_settings(c: MqttConnection) -> MqttSettings:
    """The connection keys of an MQTT source or output (the schema uses MqttSettings' names)."""
    tls = MqttTls(**c.tls.model_dump()) if c.tls else None
    return MqttSettings(**c.model_dump(include=set(MqttConnection.model_fields) - {"tls"}), tls=tls)


def _decoder(p: Payload, max_name_bytes: int) -> Any:
    from .ingest.payload import PayloadDecoder

    return PayloadDecoder(**p.model_dump(include=set(Payload.model_fields)), max_name_bytes=max_name_bytes)


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"t": round(record.created, 3), "level": record.levelname, "logger": record.name}
        out["msg"] = record.getMessage()
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(level: str = "INFO", fmt: str = "json") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(
        _JsonFormatter() if fmt == "json" else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


class _Metrics(Collector):
    """Reads the live counters at scrape time, so nothing is counted twice."""

    def __init__(self, daemon: Daemon) -> None:
        self.d = daemon

    def collect(self) -> Iterator[Any]:
        d = self.d
        ingested = CounterMetricFamily("streamcorr_samples_ingested", "Samples handed to the engine", labels=["source"])
        drops = CounterMetricFamily(
            "streamcorr_samples_dropped", "Samples dropped, by stage and reason", labels=["stage", "reason"]
        )
        msgs = CounterMetricFamily("streamcorr_messages_received", "Messages received", labels=["source"])
        connected = GaugeMetricFamily(
            "streamcorr_source_connected", "1 while the source holds its connection", labels=["source"]
        )
        for name, src in d.sources:
            c = src.counters
            ingested.add_metric([name], c.samples_handed)
            msgs.add_metric([name], c.messages)
            for reason, n in {**c.drops, "queue_full": c.queue_full}.items():
                drops.add_metric([f"decode:{name}", reason], n)
            connected.add_metric([name], float(src.connected))
        for reason, n in d.engine.sample_drops().items():
            drops.add_metric(["engine", reason], n)
        yield from (ingested, drops, msgs, connected)
        ec = d.engine.counters
        yield CounterMetricFamily("streamcorr_hops", "Windows evaluated", value=ec.hops)
        yield CounterMetricFamily(
            "streamcorr_hops_skipped", "Hops superseded because compute was behind", value=ec.hops_skipped
        )
        yield CounterMetricFamily("streamcorr_pairs_evaluated", "Pair estimates made", value=ec.pairs_evaluated)
        yield GaugeMetricFamily("streamcorr_channels", "Channels in the matrix", value=len(d.engine.channels))
        depth = GaugeMetricFamily("streamcorr_queue_depth", "Items waiting in bounded queues", labels=["queue"])
        for name, n in d.queue_depths().items():
            depth.add_metric([name], n)
        yield depth
        stages = CounterMetricFamily("streamcorr_stage_seconds", "Time spent per engine stage", labels=["stage"])
        for stage, s in ec.stage_s.items():
            stages.add_metric([stage], s)
        yield stages


class _LocalOutputs:
    """The daemon's own consumers of the engine's output, fed by `forward` like any sink: the hop-latency
    histogram, the publish-lag gauge and the optional web view."""

    def __init__(self, daemon: Daemon) -> None:
        self.d = daemon

    async def publish_snapshot(self, snap: Snapshot) -> None:
        d = self.d
        d.hop_seconds.observe(d.engine.counters.last_hop_s)
        d.publish_lag_s = max(0.0, time.time() - snap.wall_ns / 1e9)  # after every sink above has it
        if d.web is not None:
            d.web.publish_snapshot(snap)

    async def publish_event(self, ev: ChangeEvent) -> None:
        if self.d.web is not None:
            self.d.web.publish_event(ev)

    async def publish_status(self, state: str, counters: Mapping[str, float | int]) -> None:
        if self.d.web is not None:
            self.d.web.publish_stats(dict(counters))


class Daemon:
    """The long-running service behind `streamcorr run`. `await Daemon(cfg).run()` until `stop()` or a signal."""

    def __init__(self, cfg: Config, *, estimator: Estimator | None = None) -> None:
        self.cfg = cfg
        self.engine = Engine(engine_config(cfg), estimator)
        self.sources: list[tuple[str, Any]] = []
        self.sinks: list[Any] = []
        self.web: Any = None
        self.registry = CollectorRegistry()
        self.registry.register(_Metrics(self))
        self.hop_seconds = Histogram(
            "streamcorr_hop_seconds", "Compute time of one hop (align, ranks, model, publish)",
            buckets=_LATENCY_BUCKETS_S, registry=self.registry,
        )  # fmt: skip
        self.publish_lag_s = 0.0
        Gauge(
            "streamcorr_publish_lag_seconds", "Wall time from a snapshot to every sink having it",
            registry=self.registry,
        ).set_function(lambda: self.publish_lag_s)  # fmt: skip
        self.started_wall = time.time()
        self.http_url: str | None = None
        self._stop = asyncio.Event()
        self.failure: BaseException | None = None  # why a source stopped for good (bad endpoint, say)
        self._runner: web.AppRunner | None = None
        self._build_sources()
        self._build_sinks()

    # -- construction ------------------------------------------------------------------------------
    def _build_sources(self) -> None:
        for k, s in enumerate(self.cfg.sources):
            if s.type == "mqtt":
                from .ingest.mqtt import MqttSource

                src: Any = MqttSource(
                    settings=mqtt_settings(s),
                    topics=list(s.topics),
                    decoder=_decoder(s, self.cfg.channels.max_name_bytes),
                    sink=self.engine.push,
                    queue_size=s.queue_size,
                    queue_bytes=s.queue_bytes,
                )
            else:
                from .ingest.zmq import ZmqSource

                src = ZmqSource(
                    endpoint=s.endpoint,
                    mode=s.mode,
                    bind=s.bind,
                    topics=list(s.topics),
                    decoder=_decoder(s, self.cfg.channels.max_name_bytes),
                    sink=self.engine.push,
                    rcvhwm=s.rcvhwm,
                )
            self.sources.append((f"{s.type}{k}", src))

    def _build_sinks(self) -> None:
        out = self.cfg.outputs
        if out.zmq is not None:
            from .publish.sinks import ZmqPublisher

            z = out.zmq
            self.sinks.append(
                ZmqPublisher(
                    endpoint=z.endpoint,
                    bind=z.bind,
                    snapshot_endpoint=z.snapshot_endpoint,
                    prefix=z.prefix,
                    top_k=z.top_k,
                    threshold=z.threshold,
                )
            )
        if out.mqtt is not None:
            from .publish.sinks import MqttPublisher

            m = out.mqtt
            self.sinks.append(
                MqttPublisher(
                    settings=mqtt_settings(m),
                    prefix=m.prefix,
                    retain_snapshot=m.retain_snapshot,
                    queue_size=m.queue_size,
                    top_k=m.top_k,
                    threshold=m.threshold,
                )
            )
        if self.cfg.http.web:
            from .publish.web import WebView

            self.web = WebView(table_fn=self.engine.pair_table)

    # -- state for metrics and status ---------------------------------------------------------------
    def queue_depths(self) -> dict[str, int]:
        depths = {}
        for k, q in enumerate(self.engine._snap_queues):
            depths[f"engine_snapshots_{k}"] = q.qsize()
        for k, q in enumerate(self.engine._event_queues):
            depths[f"engine_events_{k}"] = q.qsize()
        for name, src in self.sources:
            if hasattr(src, "queue_depth"):  # MQTT; ZeroMQ's queue lives inside libzmq
                depths[name] = src.queue_depth
        for sink in self.sinks:
            if hasattr(sink, "pending"):  # the MQTT outbox
                depths[f"sink_{type(sink).__name__}"] = sink.pending
        return depths

    def status(self) -> dict[str, float]:
        ec = self.engine.counters
        out: dict[str, float] = {
            "uptime_s": round(time.time() - self.started_wall, 3),
            "channels": len(self.engine.channels),
            "hops": ec.hops,
            "hops_skipped": ec.hops_skipped,
            "pairs_evaluated": ec.pairs_evaluated,
            "publish_lag_s": round(self.publish_lag_s, 4),
        }
        for name, src in self.sources:
            c = src.counters
            out[f"{name}.messages"] = c.messages
            out[f"{name}.samples_handed"] = c.samples_handed
            out[f"{name}.dropped"] = c.dropped + c.queue_full
            out[f"{name}.connects"] = c.connects
            out[f"{name}.disconnects"] = c.disconnects
        for reason, n in self.engine.sample_drops().items():
            out[f"engine.dropped.{reason}"] = n
        return out

    def healthy(self) -> tuple[bool, dict[str, Any]]:
        engine_ok = self.engine._task is not None and not self.engine._task.done()
        latest = self.engine.latest
        body = {
            "engine_running": engine_ok,
            "sources_connected": {n: bool(s.connected) for n, s in self.sources},
            "last_snapshot_seq": latest.seq if latest else None,
            "last_snapshot_age_s": round(time.time() - latest.wall_ns / 1e9, 3) if latest else None,
        }
        return engine_ok, body

    # -- HTTP ---------------------------------------------------------------------------------------
    async def _start_http(self) -> None:
        h = self.cfg.http
        if not h.enabled:
            return

        async def metrics(_req: web.Request) -> web.Response:
            body = generate_latest(self.registry)
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

        async def health(_req: web.Request) -> web.Response:
            ok, body = self.healthy()
            return web.json_response({"status": "ok" if ok else "down", **body}, status=200 if ok else 503)

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/healthz", health)
        if self.web is not None:
            self.web.attach(app)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, h.host, h.port)
        await site.start()
        port = self._runner.addresses[0][1] if self._runner.addresses else h.port
        self.http_url = f"http://{h.host}:{port}"
        log.info("http listening on %s (/metrics, /healthz%s)", self.http_url, ", / live view" if self.web else "")

    # -- main loop ----------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask a running daemon to shut down gracefully (safe from a signal handler)."""
        self._stop.set()

    async def run(self, *, install_signals: bool = True) -> None:
        loop = asyncio.get_running_loop()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
        await self._start_http()
        sink_tasks = []
        for sink in self.sinks:
            if hasattr(sink, "start"):  # ZeroMQ: binds now; MQTT: run() holds the connection
                await sink.start()
            else:
                sink_tasks.append(asyncio.create_task(sink.run(), name=f"sink-{type(sink).__name__}"))
        if self.web is not None and self._runner is None:
            await self.web.start()
        await self.engine.start()
        forwarder = asyncio.create_task(
            forward(
                self.engine, *self.sinks, _LocalOutputs(self),
                status_interval_s=self.cfg.outputs.status_interval_s, status=self.status,
            )
        )  # fmt: skip
        ingest = [asyncio.create_task(src.run(), name=f"source-{name}") for name, src in self.sources]
        for (name, _), task in zip(self.sources, ingest, strict=True):
            task.add_done_callback(functools.partial(self._source_done, name))
        log.info("running: %d source(s), %d sink(s)", len(self.sources), len(self.sinks))
        try:
            await self._stop.wait()
        finally:
            log.info("shutting down: stopping ingest")
            await _cancel(ingest)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.engine.flush(), timeout=SHUTDOWN_FLUSH_S)
            await asyncio.sleep(0.05)  # let the forwarder hand the last snapshot to the sinks
            await _cancel([forwarder])
            await self.engine.stop(timeout_s=SHUTDOWN_FLUSH_S)
            for sink in self.sinks:  # the last snapshot again, then "offline" (retained on MQTT)
                try:
                    if self.engine.latest is not None:
                        await sink.publish_snapshot(self.engine.latest)
                    await (sink.stop() if hasattr(sink, "stop") else sink.close())
                except Exception:
                    log.exception("sink %s failed to close cleanly", type(sink).__name__)
            await _cancel(sink_tasks)
            if self.web is not None and self._runner is None:
                await self.web.stop()
            if self._runner is not None:
                await self._runner.cleanup()
            if install_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            log.info("stopped")
        if self.failure is not None:
            raise self.failure

    def _source_done(self, name: str, task: asyncio.Task[Any]) -> None:
        # sources retry broker loss themselves; one that returns or raises cannot go on (a port in use, say)
        if task.cancelled() or self._stop.is_set():
            return
        exc = task.exception()
        log.error("source %s stopped: %s; shutting down", name, exc or "returned")
        self.failure = exc or RuntimeError(f"source {name} stopped")
        self._stop.set()


async def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t
