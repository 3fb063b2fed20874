"""`streamcorr run config.yaml`: sources -> engine -> sinks, with /metrics, /healthz and the optional web view.

Shutdown (SIGTERM, SIGINT or `stop()`): ingest stops first, windows already due
are evaluated (for at most ``SHUTDOWN_FLUSH_S``; a hop still running then is
abandoned at its next model batch), the last snapshot and an "offline" status are
published (each sink gets at most ``SHUTDOWN_SINK_S``), then the listeners close.
A source or sink losing its broker reconnects by itself; the daemon never exits for that.

Start-up: HTTP comes up first and ``/healthz`` answers "starting" (503) while the engine is
prepared in a worker thread (the model, and on the first start with a window setting the change
detector's null calibration, logged with its expected duration); Ctrl-C or SIGTERM then stops at
once. ``/healthz`` is 200 only while every part does its job: engine running, every source
connected, snapshots fresh while input flows, every output alive; otherwise 503 with the problems
named. Every ledger entry (ingest, engine, outputs, web view, HTTP listener) is a Prometheus series
and a key of the status message's counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import json
import logging
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .cache import cache_dir_text
from .changes import ChangeEvent
from .compute import COUNTER_HELP, GAUGES, PairEvaluator, build_evaluator
from .config import Config, MqttConnection, Payload
from .engine import Engine, EngineConfig
from .errors import ConfigError, StreamcorrError
from .estimator import Estimator
from .http_guard import HttpGuard
from .ingest.mqtt import MqttSettings, MqttTls
from .logutil import RateLimitedLog, RepeatLimitFilter
from .matrix import Snapshot
from .publish.sinks import forward
from .scheduler import PairSelection

log = logging.getLogger("streamcorr.daemon")

__all__ = ["Daemon", "engine_config", "exposed_listeners", "setup_logging"]

SHUTDOWN_FLUSH_S = 5.0  # longest a shutdown waits for windows already due
SHUTDOWN_SINK_S = 5.0  # longest a shutdown waits for one sink's last snapshot and goodbye
_LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def engine_config(cfg: Config) -> EngineConfig:
    p = cfg.pairs
    if p.mode == "list":
        pairs = PairSelection(all=False, pairs=tuple((a, b) for a, b in p.pairs))
    elif p.mode == "groups":
        pairs = PairSelection(all=False, groups=tuple(p.groups), groups_with=tuple(p.groups_with))
    else:
        pairs = PairSelection()
    est: dict[str, Any] = {
        "device": cfg.estimator.device,
        "batch_size": cfg.estimator.batch_size,
        "amp": cfg.estimator.amp,
        "compile": cfg.estimator.compile,
    }
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
        screening=cfg.screening.mode,
        max_age_s=cfg.screening.max_age_s,
        hop_budget=cfg.screening.hop_budget,
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


def setup_logging(level: str = "INFO", fmt: str = "json", max_repeats_per_10s: int = 20) -> None:
    """Log lines on stderr, JSON or text; any one message template at most ``max_repeats_per_10s`` times per
    10 s (the rest counted in the next line), so no flood of errors can fill a disk."""
    handler = logging.StreamHandler()
    handler.setFormatter(
        _JsonFormatter() if fmt == "json" else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    handler.addFilter(RepeatLimitFilter(max_repeats_per_10s))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


_LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost", "lo"})


def _is_loopback(host: str) -> bool:
    h = host.strip().strip("[]").lower()
    if h in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:  # "*", "0.0.0.0"-like names, a hostname or an interface: assume reachable
        return False


def _tcp_host(endpoint: str) -> str | None:
    """The host part of a tcp:// endpoint (``*``, an address, an interface name); None for ipc/inproc."""
    if not endpoint.startswith("tcp://"):
        return None
    return endpoint[len("tcp://") :].rsplit(":", 1)[0]


def exposed_listeners(cfg: Config) -> list[str]:
    """One line per socket this configuration opens beyond loopback, naming the key and what it exposes."""
    out = []
    fix = "set it to 127.0.0.1 unless other hosts must reach it (README: Security and limits)"
    h = cfg.http
    if h.enabled and not _is_loopback(h.host):
        what = "/metrics, /healthz" + (" and the web view" if h.web else "")
        out.append(f"http.host {h.host!r} serves {what} on port {h.port} to every host that can reach it: {fix}")
    z = cfg.outputs.zmq
    if z is not None:
        host = _tcp_host(z.endpoint)
        if z.bind and host is not None and not _is_loopback(host):
            out.append(f"outputs.zmq.endpoint {z.endpoint!r} publishes snapshots and events beyond loopback: {fix}")
        host = _tcp_host(z.snapshot_endpoint) if z.snapshot_endpoint else None
        if host is not None and not _is_loopback(host):
            out.append(f"outputs.zmq.snapshot_endpoint {z.snapshot_endpoint!r} answers anyone who asks: {fix}")
    for k, src in enumerate(cfg.sources):
        if src.type == "zmq" and src.bind:
            host = _tcp_host(src.endpoint)
            if host is not None and not _is_loopback(host):
                out.append(f"sources.{k}.endpoint {src.endpoint!r} accepts samples from any host: {fix}")
    return out


def _numbers(obj: object) -> dict[str, int | float]:
    """The numeric attributes of a counters object (dataclass or plain), dicts of numbers flattened."""
    out: dict[str, int | float] = {}
    items = obj.items() if isinstance(obj, Mapping) else vars(obj).items()
    for name, value in items:
        if name.startswith("_") or isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            out[name] = value
        elif isinstance(value, Mapping):
            for k, v in value.items():
                if isinstance(v, int | float) and not isinstance(v, bool):
                    out[f"{name}.{k}"] = v
    return out


class _SinkGuard:
    """Wraps one output for `forward`: counts what it raised per stream, so a failing output is visible in
    /metrics, the status counters and /healthz, and re-raises for `forward` to log (rate-limited)."""

    def __init__(self, name: str, sink: Any) -> None:
        self.name, self.sink = name, sink
        self.errors: dict[str, int] = {"snapshot": 0, "event": 0, "status": 0}
        self.last_snapshot_failed = False

    async def publish_snapshot(self, snap: Snapshot) -> None:
        try:
            await self.sink.publish_snapshot(snap)
        except Exception:
            self.errors["snapshot"] += 1
            self.last_snapshot_failed = True
            raise
        self.last_snapshot_failed = False

    async def publish_event(self, ev: ChangeEvent) -> None:
        try:
            await self.sink.publish_event(ev)
        except Exception:
            self.errors["event"] += 1
            raise

    async def publish_status(self, state: str, counters: Mapping[str, float | int]) -> None:
        try:
            await self.sink.publish_status(state, counters)
        except Exception:
            self.errors["status"] += 1
            raise


def _pair_metrics(snap: Snapshot, cfg: Config) -> Iterator[Any]:
    """Per-pair gauges for Grafana: the ``http.pair_metrics_top_k`` strongest pairs of the newest snapshot and the
    first ``http.pair_metrics_listed`` pairs of ``pairs.pairs``; at most 1,100 label sets (a, b), so a large
    matrix cannot flood Prometheus. A pair that leaves the top k leaves the exposition (its series goes stale)."""
    names = list(snap.channels)
    index = {n: k for k, n in enumerate(names)}
    chosen: dict[tuple[int, int], str] = {}
    listed = cfg.pairs.pairs[: cfg.http.pair_metrics_listed] if cfg.pairs.mode == "list" else []
    for a, b in listed:
        if a in index and b in index:
            i, j = sorted((index[a], index[b]))
            chosen[(i, j)] = "listed"
    k = cfg.http.pair_metrics_top_k
    if k and len(names) > 1:
        iu, ju = np.triu_indices(len(names), 1)
        mi = np.nan_to_num(snap.mi[iu, ju], nan=-np.inf)
        for n in np.argsort(-mi, kind="stable")[:k]:
            if np.isfinite(mi[n]):
                chosen.setdefault((int(iu[n]), int(ju[n])), "top")
    mi_g = GaugeMetricFamily("streamcorr_pair_mi", "MI of a pair in the newest snapshot, nats (top k and listed)",
                             labels=["a", "b", "why"])  # fmt: skip
    age_g = GaugeMetricFamily("streamcorr_pair_age_seconds", "Stream seconds since the pair's value was computed",
                              labels=["a", "b", "why"])  # fmt: skip
    for (i, j), why in chosen.items():
        mi_g.add_metric([names[i], names[j], why], float(snap.mi[i, j]))
        age_g.add_metric([names[i], names[j], why], float(snap.age_s[i, j]))
    yield from (mi_g, age_g)


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
        ledger: dict[str, CounterMetricFamily] = {}  # every other numeric ingest counter, one series per source
        for name, src in d.sources:
            c = src.counters
            ingested.add_metric([name], c.samples_handed)
            msgs.add_metric([name], c.messages)
            for reason, n in {**c.drops, "queue_full": c.queue_full}.items():
                drops.add_metric([f"decode:{name}", reason], n)
            connected.add_metric([name], float(src.connected))
            for field, n in _numbers(c).items():
                if field in _INGEST_SHOWN or "." in field:
                    continue
                fam = ledger.get(field)
                if fam is None:
                    fam = ledger[field] = CounterMetricFamily(
                        f"streamcorr_source_{field}", _INGEST_HELP.get(field, f"Ingest ledger: {field}"),
                        labels=["source"],
                    )  # fmt: skip
                fam.add_metric([name], n)
        engine = d._engine
        if engine is not None:
            for reason, n in engine.sample_drops().items():
                drops.add_metric(["engine", reason], n)
        yield from (ingested, drops, msgs, connected, *ledger.values())
        if engine is not None:
            ec = engine.counters
            yield CounterMetricFamily("streamcorr_hops", "Windows evaluated", value=ec.hops)
            yield CounterMetricFamily(
                "streamcorr_hops_skipped", "Hops superseded because compute was behind", value=ec.hops_skipped
            )
            yield CounterMetricFamily("streamcorr_pairs_evaluated", "Pair estimates made", value=ec.pairs_evaluated)
            yield GaugeMetricFamily("streamcorr_channels", "Channels in the matrix", value=len(engine.channels))
            lost = CounterMetricFamily(
                "streamcorr_engine_dropped", "Engine outputs and pairs lost, by kind", labels=["kind"]
            )
            shown = {*_ENGINE_SHOWN, *engine.sample_drops()}
            for field, n in _numbers(ec).items():
                if field.endswith("_dropped") or field == "pairs_low_coverage":
                    lost.add_metric([field], n)
                elif field not in shown and "." not in field:  # any other engine counter, by its own name
                    yield CounterMetricFamily(f"streamcorr_engine_{field}", f"Engine: {field}", value=n)
            yield lost
            stages = CounterMetricFamily("streamcorr_stage_seconds", "Time spent per engine stage", labels=["stage"])
            for stage, sec in ec.stage_s.items():
                stages.add_metric([stage], sec)
            yield stages
            yield from _compute_metrics(engine.compute, d.cfg.compute.backend)
            if engine.latest is not None:
                yield from _pair_metrics(engine.latest, d.cfg)
        depth = GaugeMetricFamily("streamcorr_queue_depth", "Items waiting in bounded queues", labels=["queue"])
        for name, n in d.queue_depths().items():
            depth.add_metric([name], n)
        yield depth
        yield from self._outputs()
        yield GaugeMetricFamily("streamcorr_up", "1 when /healthz answers 200", value=float(d.health()[0] == 200))

    def _outputs(self) -> Iterator[Any]:
        d = self.d
        sent = CounterMetricFamily("streamcorr_output_sent", "Messages an output sent", labels=["output", "stream"])
        dropped = CounterMetricFamily(
            "streamcorr_output_dropped", "Messages an output dropped (superseded, queue full, closed, unencodable)",
            labels=["output", "stream"],
        )  # fmt: skip
        errors = CounterMetricFamily(
            "streamcorr_output_errors", "Messages an output raised on (not published)", labels=["output", "stream"]
        )
        conn = CounterMetricFamily(
            "streamcorr_output_connections", "Output connection events (MQTT)", labels=["output", "event"]
        )
        alive = GaugeMetricFamily("streamcorr_output_alive", "1 while the output can publish", labels=["output"])
        for guard in d.outputs:
            c = guard.sink.counters
            for stream, n in c.sent.items():
                sent.add_metric([guard.name, stream], n)
            for stream, n in c.dropped.items():
                dropped.add_metric([guard.name, stream], n)
            for stream, n in guard.errors.items():
                errors.add_metric([guard.name, stream], n)
            for event in ("connects", "disconnects", "connect_failures"):
                conn.add_metric([guard.name, event], getattr(c, event))
            alive.add_metric([guard.name], float(d.output_problem(guard) is None))
        yield from (sent, dropped, errors, conn, alive)
        for guard in d.outputs:  # outputs.record: its files, and what the disk cap deleted
            if hasattr(guard.sink, "ledger"):
                for field, n in guard.sink.ledger().items():
                    yield GaugeMetricFamily(f"streamcorr_record_{field}", f"outputs.record: {field}", value=n)
        if d.web is not None:
            for field, n in d.web.counters_dict().items():
                if field == "clients":
                    yield GaugeMetricFamily("streamcorr_web_clients", "Web view clients connected now", value=n)
                else:
                    yield CounterMetricFamily(f"streamcorr_web_{field}", f"Web view: {field}", value=n)
        if d.http_guard is not None:
            g = d.http_guard.counters()
            yield GaugeMetricFamily("streamcorr_http_connections", "HTTP connections open now", value=g["open"])
            yield CounterMetricFamily(
                "streamcorr_http_connections_rejected", "Over http.max_connections", value=g["rejected"]
            )
            yield CounterMetricFamily(
                "streamcorr_http_header_timeouts", "Closed after http.header_timeout_s", value=g["header_timeouts"]
            )


def _compute_metrics(ev: PairEvaluator, backend: str) -> Iterator[Any]:
    """streamcorr_compute_<name> for each counter of the compute backend (streamcorr.compute.COUNTER_HELP)."""
    for name, value in ev.counters().items():
        family = GaugeMetricFamily if name in GAUGES else CounterMetricFamily
        fam = family(f"streamcorr_compute_{name}", COUNTER_HELP.get(name, f"Compute: {name}"), labels=["backend"])
        fam.add_metric([backend], value)
        yield fam


# engine counters with their own series (or in the drops by reason); others become streamcorr_engine_<name>
_ENGINE_SHOWN = frozenset({"hops", "hops_skipped", "pairs_evaluated", "last_hop_s"})
# ingest counters with their own series above; all other numeric ones become streamcorr_source_<name>
_INGEST_SHOWN = frozenset({"messages", "samples_handed", "queue_full", "dropped", "samples_rejected"})
_INGEST_HELP = {
    "samples_decoded": "Samples decoded from messages",
    "samples_accepted": "Samples the engine accepted",
    "sink_errors": "Engine calls that raised (their samples handed, not accepted)",
    "seq_gaps": "Messages missing by the payloads' seq numbers (lost before reaching streamcorr)",
    "seq_resets": "Times a payload seq went back (a publisher restart)",
    "connects": "Connections made",
    "disconnects": "Connections lost",
    "connect_failures": "Connection attempts that failed",
}


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
            self.d.web.publish_stats(_web_summary(counters))


def _web_summary(counters: Mapping[str, float | int]) -> dict[str, float | int | str]:
    """The web page's status line: the headline numbers and the losses summed (/metrics has each one)."""
    headline = ("channels", "hops", "hops_skipped", "pairs_evaluated", "publish_lag_s")
    out: dict[str, float | int | str] = {k: counters[k] for k in headline if k in counters}
    out["healthy"] = "yes" if counters.get("healthy") else "no"
    sources = {k.split(".", 1)[0] for k in counters if k.endswith(".samples_handed")}
    out["samples_dropped"] = sum(counters.get(f"{s}.dropped", 0) for s in sources) + sum(
        v for k, v in counters.items() if k.startswith("engine.dropped.")
    )
    out["messages_lost"] = sum(counters.get(f"{s}.seq_gaps", 0) for s in sources)
    out["output_errors"] = sum(v for k, v in counters.items() if k.startswith("output.") and ".errors." in k)
    return out


class Daemon:
    """The long-running service behind `streamcorr run`. `await Daemon(cfg).run()` until `stop()` or a signal."""

    def __init__(self, cfg: Config, *, estimator: Estimator | None = None) -> None:
        self.cfg = cfg
        self._estimator = estimator
        self._engine: Engine | None = None  # built by run(), in a worker thread (null calibration)
        self._compute: PairEvaluator | None = None  # compute.backend ray: its workers, started with the engine
        self.sources: list[tuple[str, Any]] = []
        self.sinks: list[Any] = []
        self.outputs: list[_SinkGuard] = []
        self.web: Any = None
        self.http_guard: HttpGuard | None = None
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
        self.phase = "starting"  # starting -> running -> stopping
        self.phase_detail = "loading the model"
        self._stop = asyncio.Event()
        self.failure: BaseException | None = None  # why a source stopped for good (bad endpoint, say)
        self._runner: web.AppRunner | None = None
        self._forwarder: asyncio.Task[None] | None = None
        self._sink_tasks: dict[int, asyncio.Task[Any]] = {}  # id(sink) -> its run() task (MQTT)
        self._input_seen = 0  # samples handed by all sources, as of the last watch tick
        self._first_input_wall: float | None = None
        self._last_input_wall: float | None = None
        self._warn = RateLimitedLog(log)
        self._setup_thread: threading.Thread | None = None
        self._build_sources()
        self._build_sinks()

    @property
    def engine(self) -> Engine:
        """The engine; it exists once run() has prepared it (``phase`` is then no longer "starting")."""
        if self._engine is None:
            raise RuntimeError("the daemon's engine is not ready yet: run() prepares it")
        return self._engine

    def _push(self, channel: str, t: Any, values: Any) -> int:
        return self.engine.push(channel, t, values)

    @property
    def setup_abandoned(self) -> bool:
        """True after run() returned while the engine was still being prepared (stopped during a first-start
        calibration): its thread cannot be interrupted, so a process should end with ``os._exit``."""
        return self._engine is None and self._setup_thread is not None and self._setup_thread.is_alive()

    def _pair_table(self, a: str, b: str) -> Any:
        return self.engine.pair_table(a, b)

    # -- construction ------------------------------------------------------------------------------
    def _build_sources(self) -> None:
        for k, s in enumerate(self.cfg.sources):
            if s.type == "mqtt":
                from .ingest.mqtt import MqttSource

                src: Any = MqttSource(
                    settings=mqtt_settings(s),
                    topics=list(s.topics),
                    decoder=_decoder(s, self.cfg.channels.max_name_bytes),
                    sink=self._push,
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
                    sink=self._push,
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
            self.outputs.append(_SinkGuard("zmq", self.sinks[-1]))
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
            self.outputs.append(_SinkGuard("mqtt", self.sinks[-1]))
        if out.record is not None:
            from .publish.record import ParquetRecorder

            r = out.record
            rec = ParquetRecorder(directory=r.directory, rotate_s=r.rotate_s, max_bytes=r.max_bytes, top_k=r.top_k)
            self.sinks.append(rec)
            self.outputs.append(_SinkGuard("record", rec))
        if self.cfg.http.web:
            from .publish.web import WebView

            self.web = WebView(table_fn=self._pair_table)

    # -- state for metrics, status and health -------------------------------------------------------
    def queue_depths(self) -> dict[str, int]:
        depths = {}
        if self._engine is not None:
            for k, q in enumerate(self._engine._snap_queues):
                depths[f"engine_snapshots_{k}"] = q.qsize()
            for k, q in enumerate(self._engine._event_queues):
                depths[f"engine_events_{k}"] = q.qsize()
        for name, src in self.sources:
            if hasattr(src, "queue_depth"):  # MQTT; ZeroMQ's queue lives inside libzmq
                depths[name] = src.queue_depth
        for sink in self.sinks:
            if hasattr(sink, "pending"):  # the MQTT outbox
                depths[f"sink_{type(sink).__name__}"] = sink.pending
        return depths

    def status(self) -> dict[str, float]:
        """The status message's counters: every ledger entry of /metrics, flat (``mqtt0.seq_gaps``,
        ``output.mqtt.dropped.snapshot``, ``web.events_dropped``, ``http.header_timeouts``, ...)."""
        out: dict[str, float] = {
            "uptime_s": round(time.time() - self.started_wall, 3),
            "publish_lag_s": round(self.publish_lag_s, 4),
            "healthy": float(self.health()[0] == 200),
        }
        if self._engine is not None:
            ec = self._engine.counters
            out.update(channels=len(self._engine.channels), hops=ec.hops, hops_skipped=ec.hops_skipped,
                       pairs_evaluated=ec.pairs_evaluated)  # fmt: skip
            for field, n in _numbers(ec).items():
                if field not in {*_ENGINE_SHOWN, *self._engine.sample_drops()} and "." not in field:
                    out[f"engine.{field}"] = n
            for reason, n in self._engine.sample_drops().items():
                out[f"engine.dropped.{reason}"] = n
            out.update({f"compute.{k}": v for k, v in self._engine.compute.counters().items()})
        for name, src in self.sources:
            c = src.counters
            for field, n in _numbers(c).items():
                out[f"{name}.{field.replace('drops.', 'dropped.')}"] = n
            out[f"{name}.dropped"] = c.dropped + c.queue_full
            out[f"{name}.connected"] = float(src.connected)
        for guard in self.outputs:
            c = guard.sink.counters
            for kind, per_stream in (("sent", c.sent), ("dropped", c.dropped), ("errors", guard.errors)):
                for stream, n in per_stream.items():
                    out[f"output.{guard.name}.{kind}.{stream}"] = n
            for event in ("connects", "disconnects", "connect_failures"):
                out[f"output.{guard.name}.{event}"] = getattr(c, event)
            if hasattr(guard.sink, "ledger"):
                out.update({f"output.{guard.name}.{k}": v for k, v in guard.sink.ledger().items()})
        if self.web is not None:
            out.update({f"web.{k}": v for k, v in self.web.counters_dict().items()})
        if self.http_guard is not None:
            out.update({f"http.{k}": v for k, v in self.http_guard.counters().items()})
        return out

    @property
    def hop_s(self) -> float:
        return self.cfg.hop_samples() / self.cfg.channels.rate_hz

    @property
    def snapshot_stale_s(self) -> float:
        """Input flowing but no new snapshot for this long means the engine is stuck (http.snapshot_stale_s)."""
        return self.cfg.http.snapshot_stale_s or max(10.0, 3 * self.hop_s)

    def output_problem(self, guard: _SinkGuard) -> str | None:
        """Why this output is not publishing now (None: it is)."""
        task = self._sink_tasks.get(id(guard.sink))
        if task is not None and task.done():
            return f"output {guard.name} stopped"
        if self._forwarder is not None and self._forwarder.done():
            return "the forwarder to the outputs stopped"
        if hasattr(guard.sink, "connected") and self.phase == "running" and not guard.sink.connected:
            return f"output {guard.name} not connected"
        if guard.last_snapshot_failed:
            return f"output {guard.name} failed to publish the last snapshot"
        return None

    def health(self) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body) of /healthz: 200 only when every part does its job; the body names each part."""
        now = time.time()
        engine = self._engine
        latest = engine.latest if engine is not None else None
        engine_ok = engine is not None and engine._task is not None and not engine._task.done()
        body: dict[str, Any] = {
            "status": "ok",
            "problems": [],
            "engine_running": engine_ok,
            "sources_connected": {n: bool(s.connected) for n, s in self.sources},
            "outputs_alive": {g.name: self.output_problem(g) is None for g in self.outputs},
            "last_snapshot_seq": latest.seq if latest else None,
            "last_snapshot_age_s": round(now - latest.wall_ns / 1e9, 3) if latest else None,
            "hop_s": self.hop_s,
            "snapshot_stale_s": self.snapshot_stale_s,
            "last_input_age_s": None if self._last_input_wall is None else round(now - self._last_input_wall, 3),
        }
        if self.phase != "running":
            body["status"] = self.phase
            body["problems"] = [self.phase_detail]
            body["uptime_s"] = round(now - self.started_wall, 1)
            return 503, body
        problems: list[str] = body["problems"]
        if not engine_ok:
            problems.append("engine not running")
        problems += [f"source {n} not connected" for n, ok in body["sources_connected"].items() if not ok]
        problems += [p for g in self.outputs if (p := self.output_problem(g)) is not None]
        stale = self.snapshot_stale_s
        flowing = self._last_input_wall is not None and now - self._last_input_wall < stale
        if flowing and latest is not None and now - latest.wall_ns / 1e9 > stale:
            problems.append(f"input flowing but no snapshot for {now - latest.wall_ns / 1e9:.0f} s (> {stale:g} s)")
        elif flowing and latest is None and self._first_input_wall is not None and engine is not None:
            window_s = engine.cfg.window_len / engine.cfg.rate_hz
            if now - self._first_input_wall > window_s + stale:
                problems.append(f"input flowing for {now - self._first_input_wall:.0f} s but no snapshot yet")
        if problems:
            body["status"] = "degraded"
            return 503, body
        return 200, body

    def healthy(self) -> tuple[bool, dict[str, Any]]:
        code, body = self.health()
        return code == 200, body

    async def _watch(self) -> None:
        """Notes when input last arrived (for /healthz), and tells the user which key to fix, or what to
        start, while an MQTT broker refuses the connection."""
        hints = RateLimitedLog(log, interval_s=60.0)
        while True:
            total = sum(src.counters.samples_handed for _, src in self.sources)
            if total != self._input_seen:
                now = time.time()
                self._input_seen = total
                self._last_input_wall = now
                if self._first_input_wall is None:
                    self._first_input_wall = now
            for key, part in self._mqtt_parts():
                if not part.connected and part.counters.connect_failures and not part.counters.connects:
                    st = part.settings
                    hints.warning(
                        key, "%s: no MQTT broker answers at %s:%d (%d attempts, still retrying): start one "
                        "(`mosquitto -d`, or `systemctl start mosquitto`), or fix %s.host / %s.port",
                        key, st.host, st.port, part.counters.connect_failures, key, key,
                    )  # fmt: skip
            await asyncio.sleep(0.25)

    def _mqtt_parts(self) -> Iterator[tuple[str, Any]]:
        """(config key, part) of every MQTT source and output."""
        for k, (_, src) in enumerate(self.sources):
            if self.cfg.sources[k].type == "mqtt":
                yield f"sources.{k}", src
        for guard in self.outputs:
            if guard.name == "mqtt":
                yield "outputs.mqtt", guard.sink

    # -- HTTP ---------------------------------------------------------------------------------------
    async def _start_http(self) -> None:
        h = self.cfg.http
        if not h.enabled:
            return

        async def metrics(_req: web.Request) -> web.Response:
            body = generate_latest(self.registry)
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

        async def health(_req: web.Request) -> web.Response:
            code, body = self.health()
            return web.json_response(body, status=code)

        self.http_guard = HttpGuard(max_connections=h.max_connections, header_timeout_s=h.header_timeout_s)
        app = web.Application(middlewares=[self.http_guard.middleware])
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/healthz", health)
        if self.web is not None:
            self.web.attach(app)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        try:
            port = await self.http_guard.listen(self._runner.server, h.host, h.port)  # type: ignore[arg-type]
        except OSError as exc:
            await self._runner.cleanup()
            self._runner = None
            why = "the port is in use (another streamcorr?)" if exc.errno == 98 else exc.strerror or str(exc)
            msg = f"http.port: cannot listen on {h.host}:{h.port}: {why}; pick another port (0: any free one)"
            raise ConfigError(msg) from None
        host = f"[{h.host}]" if ":" in h.host else h.host
        self.http_url = f"http://{host}:{port}"
        log.info("http listening on %s (/metrics, /healthz%s)", self.http_url, ", / live view" if self.web else "")

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
        ec = engine_config(self.cfg)

        def deliver(engine: Engine | None, exc: BaseException | None) -> None:
            if done.done():
                return
            if exc is not None:
                done.set_exception(exc)
            else:
                done.set_result(engine)  # type: ignore[arg-type]

        compute_starting = threading.Event()  # set while Ray connects and its workers load the model

        def build() -> None:
            try:
                hop_s = ec.hop_samples / ec.rate_hz  # the Ray backend's default deadline per hop
                compute_starting.set()
                self._compute = build_evaluator(self.cfg.compute, ec.estimator, hop_s)
                compute_starting.clear()
                engine = Engine(ec, self._estimator, compute=self._compute)
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
                if compute_starting.is_set():  # not the calibration (yet): Ray logs when its workers are ready
                    self.phase_detail = "starting the compute backend: Ray workers loading the model"
                    continue
                if not told:
                    told = True
                    self.phase_detail = (
                        f"first start with window {ec.window_len}: measuring the change detector's null calibration"
                    )
                    log.info(
                        "first start with window.samples=%d: measuring the change detector's null calibration "
                        "(the model on %s windows of independent noise, once per setting; about %s on this CPU, "
                        "then cached in %s); /healthz says \"starting\" meanwhile, Ctrl-C stops",
                        ec.window_len, f"{_null_windows(ec.false_alarm_rate):,}",
                        _duration(calibration_eta_s(ec.window_len, ec.false_alarm_rate)), cache_dir_text(),
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
        try:
            for line in exposed_listeners(self.cfg):
                log.warning("listening beyond loopback: %s", line)
            await self._start_http()
            if await self._prepare_engine():
                await self._serve()
        finally:
            self.phase, self.phase_detail = "stopping", "shutting down"
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
        for guard in self.outputs:
            sink = guard.sink
            if hasattr(sink, "start"):  # ZeroMQ: binds now; MQTT: run() holds the connection
                try:
                    await sink.start()
                except StreamcorrError as exc:  # a port in use, say: name the key to change
                    raise ConfigError(f"outputs.{guard.name}: {exc}") from None
            else:
                task = asyncio.create_task(sink.run(), name=f"sink-{type(sink).__name__}")
                task.add_done_callback(functools.partial(self._sink_done, type(sink).__name__))
                self._sink_tasks[id(sink)] = task
        if self.web is not None and self._runner is None:
            await self.web.start()
        await engine.start()
        self._forwarder = asyncio.create_task(
            forward(
                engine, *self.outputs, _LocalOutputs(self),
                status_interval_s=self.cfg.outputs.status_interval_s, status=self.status,
            )
        )  # fmt: skip
        ingest = [asyncio.create_task(src.run(), name=f"source-{name}") for name, src in self.sources]
        for (name, _), task in zip(self.sources, ingest, strict=True):
            task.add_done_callback(functools.partial(self._source_done, name))
        watch = asyncio.create_task(self._watch())
        self.phase = "running"
        log.info("running: %d source(s), %d sink(s)", len(self.sources), len(self.sinks))
        try:
            await self._stop.wait()
        finally:
            self.phase, self.phase_detail = "stopping", "shutting down"
            log.info("shutting down: stopping ingest")
            await _cancel([*ingest, watch])
            with contextlib.suppress(Exception):
                await asyncio.wait_for(engine.flush(), timeout=SHUTDOWN_FLUSH_S)
            await asyncio.sleep(0.05)  # let the forwarder hand the last snapshot to the sinks
            await _cancel([self._forwarder])
            await engine.stop(timeout_s=SHUTDOWN_FLUSH_S)
            for sink in self.sinks:  # the last snapshot again, then "offline" (retained on MQTT)
                try:
                    await asyncio.wait_for(self._goodbye(sink, engine.latest), timeout=SHUTDOWN_SINK_S)
                except TimeoutError:
                    log.warning("sink %s did not close within %.0f s", type(sink).__name__, SHUTDOWN_SINK_S)
                except Exception:
                    log.exception("sink %s failed to close cleanly", type(sink).__name__)
            await _cancel(list(self._sink_tasks.values()))
            if self.web is not None and self._runner is None:
                await self.web.stop()

    @staticmethod
    async def _goodbye(sink: Any, latest: Snapshot | None) -> None:
        if latest is not None:
            with contextlib.suppress(StreamcorrError):  # unencodable: counted by the sink; the goodbye still goes
                await sink.publish_snapshot(latest)
        await (sink.stop() if hasattr(sink, "stop") else sink.close())

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

    def _sink_done(self, name: str, task: asyncio.Task[Any]) -> None:
        # an output's run() only ends at close(); ending before is a bug that /healthz reports from now on
        if task.cancelled() or self._stop.is_set():
            return
        exc = task.exception()
        log.error("output %s stopped: %r; /healthz reports it", name, exc, exc_info=exc)


def _null_windows(false_alarm_rate: float) -> int:
    # NullCalibration.measure's default sample size: about 10 null estimates beyond the quantile
    return int(min(20_000, max(2_000, 10 / false_alarm_rate)))


def calibration_eta_s(window_len: int, false_alarm_rate: float) -> float:
    """Expected seconds of a first-start null calibration on a small CPU (the progress line says it)."""
    # measured on a busy 2-core CPU: about 0.6 ms per window plus 4 us per window sample (512: 27 s, 1024: 48 s)
    return (6e-4 + 4e-6 * window_len) * _null_windows(false_alarm_rate)


def _duration(s: float) -> str:
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min"


async def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t
