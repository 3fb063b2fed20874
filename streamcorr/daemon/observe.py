"""What the daemon tells about itself: Prometheus /metrics, the status message's counters, and three health
endpoints for an orchestrator.

Every ledger entry of every part (sources, engine, compute backend, outputs, HTTP listener) is read at
scrape time from the part's own counters, so nothing is counted twice; /metrics and the status message
carry the same entries.

Health, from the weakest claim to the strongest:

* ``/livez`` (liveness): 200 whenever it answers at all (its handler runs on the event loop, so an answer
  proves the loop turns), through start-up and calibration; 503 only when a part has stopped for good and
  only a restart helps (the engine's evaluation task or the forwarder to the outputs ended while running);
* ``/readyz`` (readiness): 200 once the model is loaded, the change detector's calibration measured, the
  engine running and every source "listening" or "connected"; otherwise 503 naming why (a broker that does
  not answer, "starting", "stopping");
* ``/healthz`` (detail): 200 only while every part does its job, 503 naming each problem; a bound ZeroMQ
  socket that no sender has connected to yet is "listening" there, not a problem (a sender that stops shows
  as ``last_input_age_s``).

A source's state: "connected" (MQTT: connected and subscribed; ZeroMQ: a peer connected), "listening" (a
bound ZeroMQ socket without a sender: ready to receive), or "not connected".
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..compute.local import COUNTER_HELP, GAUGES, PairEvaluator
from ..config import Config, MqttSourceConfig
from ..counters import flat_counters
from ..engine.matrix import Snapshot
from ..ingest.source import Source
from ..publish.sinks import SinkCounters, SinkGuard
from ..transport.http import HttpGuard
from . import series

if TYPE_CHECKING:
    from ..engine.core import Engine

__all__ = [
    "DaemonMetrics",
    "DaemonView",
    "health",
    "liveness",
    "output_problem",
    "queue_depths",
    "readiness",
    "source_state",
    "status_counters",
]

log = logging.getLogger("streamcorr.daemon.service")


class DaemonView(Protocol):
    """What the endpoints read from the running service (streamcorr.daemon.service.Daemon provides it)."""

    cfg: Config
    sources: list[tuple[str, Source]]
    outputs: list[SinkGuard]
    http_guard: HttpGuard | None
    phase: str  # starting -> running -> stopping
    phase_detail: str
    started_wall: float
    first_input_wall: float | None
    last_input_wall: float | None
    publish_lag_s: float

    @property
    def engine_or_none(self) -> Engine | None: ...
    @property
    def forwarder_stopped(self) -> bool: ...
    @property
    def hop_s(self) -> float: ...
    @property
    def snapshot_stale_s(self) -> float: ...


_SINK_FIELDS = frozenset(f.name for f in dataclasses.fields(SinkCounters))


def output_ledger(c: SinkCounters) -> dict[str, float]:
    """An output's own ledger entries: ``extra``, and the numeric fields a subclass of SinkCounters adds."""
    own = {k: v for k, v in flat_counters(c).items() if k not in _SINK_FIELDS and "." not in k}
    return {**{k: float(v) for k, v in c.extra.items()}, **own}


def queue_depths(d: DaemonView) -> dict[str, int]:
    """Items waiting now in every bounded queue: the engine's subscriber queues, sources' and outputs'."""
    depths = {}
    engine = d.engine_or_none
    if engine is not None:
        depths.update(engine.queue_depths())
    for name, src in d.sources:
        depths[name] = src.queue_depth
    for guard in d.outputs:
        depths[f"output_{guard.name}"] = guard.sink.queue_depth
    return depths


def _pair_metrics(snap: Snapshot, cfg: Config) -> Iterator[Any]:
    """Per-pair gauges for Grafana and alert rules: the ``http.pair_metrics_top_k`` strongest pairs of the newest
    snapshot and the first ``http.pair_metrics_listed`` pairs of ``pairs.pairs``; at most 1,100 label sets (a, b),
    so a large matrix cannot flood Prometheus. A pair that leaves the top k leaves the exposition (its series goes
    stale). Each pair has one ``why``: "listed" wins over "top". ``streamcorr_pair_dependent`` is the change
    detector's verdict (1/0), present once the pair has had a network estimate (the detector judges those only)."""
    names = list(snap.channels)
    index = {n: k for k, n in enumerate(names)}
    chosen: dict[tuple[int, int], str] = {}
    listed = cfg.pairs.pairs[: cfg.http.pair_metrics_listed] if cfg.pairs.mode == "list" else []
    for a, b in listed:
        if a in index and b in index:
            i, j = sorted((index[a], index[b]))
            chosen[(i, j)] = "listed"
    for i, j, _ in snap.top_pairs(cfg.http.pair_metrics_top_k):
        chosen.setdefault((i, j), "top")
    mi_g = GaugeMetricFamily("streamcorr_pair_mi", "MI of a pair in the newest snapshot, nats (top k and listed)",
                             labels=["a", "b", "why"])  # fmt: skip
    age_g = GaugeMetricFamily("streamcorr_pair_age_seconds", "Stream seconds since the pair's value was computed",
                              labels=["a", "b", "why"])  # fmt: skip
    dep_g = GaugeMetricFamily("streamcorr_pair_dependent", "1 while the change detector holds the pair dependent",
                              labels=["a", "b", "why"])  # fmt: skip
    judged = snap.network_age_s if snap.network_age_s is not None else snap.age_s  # the detector sees these only
    for (i, j), why in chosen.items():
        labels = [names[i], names[j], why]
        mi_g.add_metric(labels, float(snap.mi[i, j]))
        age_g.add_metric(labels, float(snap.age_s[i, j]))
        if snap.dependent is not None and math.isfinite(judged[i, j]):
            dep_g.add_metric(labels, float(snap.dependent[i, j]))
    yield from (mi_g, age_g) if snap.dependent is None else (mi_g, age_g, dep_g)  # None: no verdicts published


class DaemonMetrics(Collector):
    """Reads the live counters at scrape time, so nothing is counted twice."""

    def __init__(self, daemon: DaemonView) -> None:
        self.d = daemon
        # the standard process_* series (resident memory, CPU seconds, open files), read from /proc at scrape time
        self._process = ProcessCollector(registry=None)

    def collect(self) -> Iterator[Any]:
        yield from self._process.collect()
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
            for reason, k in {**c.drops, "queue_full": c.queue_full}.items():
                drops.add_metric([f"decode:{name}", reason], k)
            connected.add_metric([name], float(src.connected))
            for field, n in flat_counters(c).items():
                if field in series.INGEST:
                    if (fam := ledger.get(field)) is None:
                        fam = ledger[field] = CounterMetricFamily(*series.INGEST[field], labels=["source"])
                    fam.add_metric([name], n)
        engine = d.engine_or_none
        if engine is not None:
            for reason, n in engine.sample_drops().items():
                drops.add_metric(["engine", reason], n)
        yield from (ingested, drops, msgs, connected, *ledger.values())
        if engine is not None:
            ec = engine.counters
            yield GaugeMetricFamily("streamcorr_channels", "Channels in the matrix", value=len(engine.channels))
            heard = "Channels with a buffer: in the matrix, or joining it at the next hop (the first: a window in)"
            yield GaugeMetricFamily("streamcorr_channels_heard", heard, value=len(engine.intake.channels))
            lost = CounterMetricFamily(
                "streamcorr_engine_dropped", "Engine outputs and pairs lost, by kind", labels=["kind"]
            )
            for field, x in flat_counters(ec).items():
                if field in series.ENGINE_LOST:
                    lost.add_metric([field], x)
                elif field in series.ENGINE:
                    yield CounterMetricFamily(*series.ENGINE[field], value=x)
            yield lost
            stages = CounterMetricFamily("streamcorr_stage_seconds", "Time spent per engine stage", labels=["stage"])
            for stage, sec in ec.stage_s.items():
                stages.add_metric([stage], sec)
            yield stages
            paths = CounterMetricFamily(
                "streamcorr_engine_path", "Fast-path, lag-search and significance counts", labels=["path", "count"]
            )
            for path, part in (("fast", engine.fast), ("lags", engine.lags), ("significance", engine.mixed)):
                for key, x in ({} if part is None else part.counts).items():
                    paths.add_metric([path, key], x)
            yield paths
            yield from _compute_metrics(engine.compute, d.cfg.compute.backend)
            if engine.latest is not None:
                yield from _pair_metrics(engine.latest, d.cfg)
        depth = GaugeMetricFamily("streamcorr_queue_depth", "Items waiting in bounded queues", labels=["queue"])
        for name, n in queue_depths(d).items():
            depth.add_metric([name], n)
        yield depth
        yield from self._outputs()
        yield from _timing_metrics(d)
        yield GaugeMetricFamily("streamcorr_up", "1 when /healthz answers 200", value=float(health(d)[0] == 200))
        yield GaugeMetricFamily("streamcorr_ready", "1 when /readyz answers 200", value=float(readiness(d)[0] == 200))

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
            alive.add_metric([guard.name], float(output_problem(d, guard) is None))
        yield from (sent, dropped, errors, conn, alive)
        for guard in d.outputs:  # each output's own ledger (record: files; web: clients), by the output's name
            for field, v in output_ledger(guard.sink.counters).items():
                if field in series.OUTPUT:
                    family = GaugeMetricFamily if field in series.OUTPUT_GAUGES else CounterMetricFamily
                    suffix, about = series.OUTPUT[field]
                    yield family(f"streamcorr_{guard.name}_{suffix}", f"outputs.{guard.name}: {about}", value=v)
        if d.http_guard is not None:
            g = d.http_guard.counters()
            yield GaugeMetricFamily("streamcorr_http_connections", "HTTP connections open now", value=g["open"])
            yield CounterMetricFamily(
                "streamcorr_http_connections_rejected", "Over http.max_connections", value=g["rejected"]
            )
            yield CounterMetricFamily(
                "streamcorr_http_header_timeouts", "Closed after http.header_timeout_s", value=g["header_timeouts"]
            )


def _timing_metrics(d: DaemonView) -> Iterator[Any]:
    """What alert rules compare ages and latencies with: the hop and /healthz's staleness bound (from the config),
    the wall times of the newest snapshot and of the newest input (absent until there is one)."""
    latest = d.engine_or_none.latest if d.engine_or_none is not None else None
    for name, about, value in (
        ("streamcorr_hop_interval_seconds", "Stream seconds between hops (window.hop_*)", d.hop_s),
        ("streamcorr_snapshot_stale_threshold_seconds", "/healthz: input flowing, no snapshot this long (http."
         "snapshot_stale_s)", d.snapshot_stale_s),
        ("streamcorr_last_snapshot_timestamp_seconds", "Wall time the newest snapshot was made",
         None if latest is None else latest.wall_ns / 1e9),
        ("streamcorr_last_input_timestamp_seconds", "Wall time samples last arrived", d.last_input_wall),
    ):  # fmt: skip
        if value is not None:
            yield GaugeMetricFamily(name, about, value=value)


def _compute_metrics(ev: PairEvaluator, backend: str) -> Iterator[Any]:
    """streamcorr_compute_<name> for each counter of the compute backend (streamcorr.compute.local.COUNTER_HELP)."""
    for name, value in ev.counters().items():
        family = GaugeMetricFamily if name in GAUGES else CounterMetricFamily
        fam = family(f"streamcorr_compute_{name}", COUNTER_HELP.get(name, f"Compute: {name}"), labels=["backend"])
        fam.add_metric([backend], value)
        yield fam


# engine counters named in the status message at the top level (the others as engine.<name>)
_ENGINE_SHOWN = frozenset(
    {"hops", "hops_skipped", "pairs_evaluated", "last_hop_s", "channels_retired", "channels_reanchored"}
)


def status_counters(d: DaemonView) -> dict[str, float]:
    """The status message's counters: every ledger entry of /metrics, flat (``mqtt0.seq_gaps``,
    ``output.mqtt.dropped.snapshot``, ``output.web.events_dropped``, ``http.header_timeouts``, ...)."""
    out: dict[str, float] = {
        "uptime_s": round(time.time() - d.started_wall, 3),
        "publish_lag_s": round(d.publish_lag_s, 4),
        "healthy": float(health(d)[0] == 200),
    }
    engine = d.engine_or_none
    if engine is not None:
        ec = engine.counters
        out.update(channels=len(engine.channels), hops=ec.hops, hops_skipped=ec.hops_skipped,
                   pairs_evaluated=ec.pairs_evaluated, channels_retired=ec.channels_retired,
                   channels_reanchored=ec.channels_reanchored, last_hop_s=round(ec.last_hop_s, 4))  # fmt: skip
        drops = engine.sample_drops()
        for field, n in flat_counters(ec).items():
            if field not in {*_ENGINE_SHOWN, *drops} and "." not in field:
                out[f"engine.{field}"] = n
        out.update({f"engine.dropped.{reason}": n for reason, n in drops.items()})
        out.update({f"compute.{k}": v for k, v in engine.compute.counters().items()})
    for name, src in d.sources:
        c = src.counters
        for field, n in flat_counters(c).items():
            out[f"{name}.{field.replace('drops.', 'dropped.')}"] = n
        out[f"{name}.dropped"] = c.dropped + c.queue_full
        out[f"{name}.connected"] = float(src.connected)
    for guard in d.outputs:
        sc = guard.sink.counters
        for kind, per_stream in (("sent", sc.sent), ("dropped", sc.dropped), ("errors", guard.errors)):
            out.update({f"output.{guard.name}.{kind}.{stream}": n for stream, n in per_stream.items()})
        for event in ("connects", "disconnects", "connect_failures"):
            out[f"output.{guard.name}.{event}"] = getattr(sc, event)
        out.update({f"output.{guard.name}.{k}": v for k, v in output_ledger(sc).items()})
    if d.http_guard is not None:
        out.update({f"http.{k}": v for k, v in d.http_guard.counters().items()})
    return out


def output_problem(d: DaemonView, guard: SinkGuard) -> str | None:
    """Why this output is not publishing now (None: it is)."""
    if d.forwarder_stopped:
        return "the forwarder to the outputs stopped"
    if d.phase == "running" and (why := guard.sink.problem()) is not None:
        return f"output {guard.name}: {why}"
    if guard.last_snapshot_failed:
        return f"output {guard.name} failed to publish the last snapshot"
    return None


def health(d: DaemonView) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body) of /healthz: 200 only when every part does its job; the body names each part."""
    now = time.time()
    engine = d.engine_or_none
    latest = engine.latest if engine is not None else None
    engine_ok = engine is not None and engine.running
    output_problems = {g.name: output_problem(d, g) for g in d.outputs}
    body: dict[str, Any] = {
        "status": "ok",
        "problems": [],
        "engine_running": engine_ok,
        "sources_connected": {n: bool(s.connected) for n, s in d.sources},
        "sources": {n: source_state(s) for n, s in d.sources},
        "outputs_alive": {name: why is None for name, why in output_problems.items()},
        "last_snapshot_seq": latest.seq if latest else None,
        "last_snapshot_age_s": round(now - latest.wall_ns / 1e9, 3) if latest else None,
        "hop_s": d.hop_s,
        "snapshot_stale_s": d.snapshot_stale_s,
        "last_input_age_s": None if d.last_input_wall is None else round(now - d.last_input_wall, 3),
    }
    if d.phase != "running":
        body["status"] = d.phase
        body["problems"] = [d.phase_detail]
        body["uptime_s"] = round(now - d.started_wall, 1)
        return 503, body
    problems: list[str] = body["problems"]
    if not engine_ok:
        problems.append("engine not running")
    problems += [f"source {n} not connected" for n, state in body["sources"].items() if state == "not connected"]
    problems += [why for why in output_problems.values() if why is not None]
    stale = d.snapshot_stale_s
    flowing = d.last_input_wall is not None and now - d.last_input_wall < stale
    if flowing and latest is not None and now - latest.wall_ns / 1e9 > stale:
        problems.append(f"input flowing but no snapshot for {now - latest.wall_ns / 1e9:.0f} s (> {stale:g} s)")
    elif flowing and latest is None and d.first_input_wall is not None and engine is not None:
        window_s = engine.cfg.window_len / engine.cfg.rate_hz
        if now - d.first_input_wall > window_s + stale:
            problems.append(f"input flowing for {now - d.first_input_wall:.0f} s but no snapshot yet")
    if problems:
        body["status"] = "degraded"
        return 503, body
    return 200, body


def source_state(src: Source) -> str:
    """The source's state: "connected", "listening" (bound, no sender yet) or "not connected" (module docstring)."""
    if src.connected:
        return "connected"
    bound = getattr(src, "ready", None)  # ZmqSource: set once its socket is bound or connected
    if getattr(src, "bind", False) and isinstance(bound, asyncio.Event) and bound.is_set():
        return "listening"
    return "not connected"


def _why_not_ready(d: DaemonView, k: int, name: str, src: Source) -> str:
    """Why source k is not ready, in the words an operator acts on: its config key and the peer it waits for."""
    section = d.cfg.sources[k]
    key = f"source {name} (sources.{k})"
    if isinstance(section, MqttSourceConfig):
        if failures := src.counters.connect_failures:
            return f"{key}: no MQTT broker answers at {section.host}:{section.port} ({failures} attempts, retrying)"
        return f"{key}: connecting to the MQTT broker at {section.host}:{section.port}"
    if getattr(section, "bind", False):
        return f"{key}: not bound to {section.endpoint} yet"
    return f"{key}: no peer at {section.endpoint} yet (ZeroMQ connects when one listens there)"


def readiness(d: DaemonView) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body) of /readyz: 200 when the daemon can take input (see the module docstring)."""
    states = {name: source_state(src) for name, src in d.sources}
    problems: list[str] = []
    if d.phase != "running":
        problems.append(f"{d.phase}: {d.phase_detail}")
    else:
        engine = d.engine_or_none
        if engine is None or not engine.running:
            problems.append("engine not running")
        problems += [_why_not_ready(d, k, name, src) for k, (name, src) in enumerate(d.sources)
                     if states[name] == "not connected"]  # fmt: skip
    body = {"status": "not ready" if problems else "ready", "problems": problems, "sources": states}
    return (503 if problems else 200), body


def liveness(d: DaemonView) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body) of /livez: 503 only when a part stopped for good (see the module docstring)."""
    dead: list[str] = []
    if d.phase == "running":
        engine = d.engine_or_none
        if engine is not None and not engine.running:
            dead.append("the engine's evaluation task ended")
        if d.forwarder_stopped:
            dead.append("the forwarder to the outputs stopped")
    body = {"status": "dead" if dead else "alive", "problems": dead, "phase": d.phase,
            "uptime_s": round(time.time() - d.started_wall, 1)}  # fmt: skip
    return (503 if dead else 200), body
