"""Every key of the configuration reaches the part that uses it: each key is set to a non-default value, the
parts are built the way `streamcorr run` builds them (EngineConfig.from_config, the daemon's factory tables,
its HTTP listener, setup_logging), and the value is read back from the part. A key added to the schema without
a probe here fails `test_every_key_has_a_probe`."""

from __future__ import annotations

import asyncio
import logging
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import numpy as np
import pytest
import torch
from pydantic import BaseModel

from streamcorr.config import Config, MqttSourceConfig, ZmqSourceConfig, parse_config
from streamcorr.daemon.parts import COMPUTE
from streamcorr.daemon.service import Daemon
from streamcorr.engine.core import Engine
from streamcorr.engine.settings import EngineConfig
from streamcorr.estimate.estimator import Estimator
from streamcorr.logutil import RepeatLimitFilter, setup_logging
from tests.brokers import free_port

TLS = {"ca_file": "/nonexistent/ca.pem", "cert_file": "/nonexistent/c.pem", "key_file": "/nonexistent/k.pem",
       "insecure": True}  # fmt: skip
MQTT = {"host": "broker.invalid", "port": 18830, "client_id": "probe-id", "username": "probe-user",
        "password": "probe-pass", "tls": TLS, "qos": 1, "keepalive_s": 45, "reconnect_min_s": 0.7,
        "reconnect_max_s": 9.0, "timeout_s": 4.0}  # fmt: skip
PAYLOAD = {"format": "json", "channel_template": "{topic[1]}.{key}", "time_field": "ts", "time_unit": "ms",
           "max_payload_bytes": 4096, "max_samples_per_message": 77, "max_topic_bytes": 99}  # fmt: skip


SOURCE_PORT = free_port()  # the bound ZeroMQ source: a free port, so parallel test workers never collide


def _config(tmp: Path) -> dict[str, Any]:
    # fmt: off
    return {
        "version": 1,
        "sources": [
            {"type": "mqtt", **MQTT, **PAYLOAD, "topics": ["probe/#"], "queue_size": 123, "queue_bytes": 1 << 17,
             "receive_buffer_bytes": 1 << 21},
            {"type": "zmq", **PAYLOAD, "endpoint": f"tcp://127.0.0.1:{SOURCE_PORT}", "mode": "pull", "bind": True,
             "topics": ["p"], "rcvhwm": 321},
        ],
        "channels": {"names": ["a", "b", "c"], "auto_add": False, "rate_hz": 20.0, "max_staleness_s": 0.2,
                     "max_channels": 17, "auto_pairs_per_hop": 9, "max_future_s": 2.5, "max_name_bytes": 100,
                     "retire_after_s": 45.0, "reanchor_after_s": 7.5},
        "window": {"samples": 64, "hop_s": 0.5, "min_coverage": 0.5, "skip_stale_hops": False,
                   "repeated_rows": "keep"},
        "pairs": {"mode": "groups", "groups": ["a"], "groups_with": ["c"], "max_per_hop": 5},
        "screening": {"mode": "on", "max_age_s": 33.0, "hop_budget": 0.5},
        "estimator": {"device": "cpu", "amp": True, "compile": True, "batch_size": 7, "threads": 1,
                      "weights": "infonet-v1", "refine_high_mi": False, "prewhiten": "ar"},
        "compute": {"backend": "ray", "address": "auto", "workers": 3, "device": "cuda", "cpus_per_worker": 0.5,
                    "tile_pairs": 100, "max_in_flight": 3, "hop_timeout_s": 2.0, "start_timeout_s": 30.0},
        "changes": {"false_alarm_rate": 0.01, "min_effect": 0.2, "persist": 3, "delta": 0.3, "rel_delta": 0.5,
                    "fast": False, "fast_window": 512,
                    "false_alarms_per_hour": 3.0, "significance": "iid", "surrogates": 7},
        "lags": {"max_s": 0.35, "refresh_s": 3.0, "max_pairs_per_hop": 17},
        "outputs": {
            "zmq": {"endpoint": "tcp://127.0.0.1:15556", "bind": False, "snapshot_endpoint": "tcp://127.0.0.1:15557",
                    "prefix": "pz", "top_k": 4, "threshold": 0.3, "max_queue_bytes": 1 << 20},
            "mqtt": {**MQTT, "prefix": "pm", "retain_snapshot": False, "queue_size": 55, "top_k": 6,
                     "threshold": 0.4},
            "record": {"directory": str(tmp / "rec"), "rotate_s": 30.0, "max_bytes": 1 << 20, "top_k": 3},
            "status_interval_s": 2.0,
        },
        "http": {"enabled": True, "host": "localhost", "port": 0, "web": True, "web_max_queue_bytes": 3 << 20,
                 "max_connections": 7, "header_timeout_s": 3.0, "snapshot_stale_s": 42.0, "pair_metrics_top_k": 3,
                 "pair_metrics_listed": 5},
        "logging": {"level": "WARNING", "format": "text", "max_repeats_per_10s": 5},
    }
    # fmt: on


def _keys(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Leaf keys of a config model; sections (models, optional models, lists of a union) recurse."""
    for name, f in model.model_fields.items():
        ann = f.annotation
        inner = [a for a in get_args(ann) if isinstance(a, type) and issubclass(a, BaseModel)]
        if model is Config and name == "sources":  # a list of a tagged union: each type's keys
            for sub, kind in ((MqttSourceConfig, "mqtt"), (ZmqSourceConfig, "zmq")):
                yield from _keys(sub, f"{prefix}sources.{kind}.")
        elif isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from _keys(ann, f"{prefix}{name}.")
        elif get_origin(ann) in (Union, types.UnionType) and inner:
            for sub in inner:
                yield from _keys(sub, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}"


class Parts:
    """Everything `streamcorr run` builds from one config, built once for the probes."""

    def __init__(self, tmp: Path) -> None:
        self.raw = _config(tmp)
        self.cfg = parse_config(self.raw)
        self.ec = EngineConfig.from_config(self.cfg)
        threads = torch.get_num_threads()
        try:
            self.est = Estimator(**self.ec.estimator)
            self.threads = torch.get_num_threads()
        finally:
            torch.set_num_threads(threads)  # estimator.threads sets the process's torch threads
        self.engine = Engine(EngineConfig(**{**vars(self.ec), "estimator": {}}))  # compile off: no 15 s build
        self.daemon = Daemon(self.cfg)
        self.mqtt_src, self.zmq_src = (src for _, src in self.daemon.sources)
        outs = {g.name: g.sink for g in self.daemon.outputs}
        self.zmq_out, self.mqtt_out, self.record, self.web = outs["zmq"], outs["mqtt"], outs["record"], outs["web"]
        from streamcorr.compute.ray import RayEvaluator

        self.ray = RayEvaluator(self.cfg.compute, self.ec.estimator, hop_s=0.5)  # not started: its settings only

        async def http() -> tuple[str | None, Any]:
            await self.daemon._start_http()
            url, guard = self.daemon.http_url, self.daemon.http_guard
            await self.daemon._stop_http()
            return url, guard

        self.http_url, self.guard = asyncio.run(http())
        root = logging.getLogger()
        saved = root.handlers[:], root.level
        try:
            setup_logging(self.cfg.logging)
            self.log_level, self.log_handler = root.level, root.handlers[0]
        finally:
            root.handlers[:], _ = saved[0], root.setLevel(saved[1])


def _digest(est: Estimator) -> str:
    return est.fingerprint.split("-", 1)[0]  # the weights' part of the fingerprint


def _pair_gauges(p: Parts, why: str) -> int:
    """How many streamcorr_pair_mi series with label why= the daemon's config exports for a 10-channel snapshot
    whose pairs (mode list) name 8 pairs of it."""
    from streamcorr.daemon.observe import _pair_metrics
    from streamcorr.engine.matrix import Snapshot

    names = tuple(f"c{k}" for k in range(10))
    listed = [[names[k], names[k + 1]] for k in range(8)]
    cfg = parse_config({**p.raw, "pairs": {"mode": "list", "pairs": listed}})
    mi = np.random.default_rng(174).uniform(0.0, 1.0, (10, 10))
    mi = (mi + mi.T) / 2
    snap = Snapshot(1, 0, 0, names, mi, np.zeros((10, 10)), np.ones((10, 10)))
    family = next(iter(_pair_metrics(snap, cfg)))
    return sum(1 for sample in family.samples if sample.labels["why"] == why)


def _conn(part: Callable[[Parts], Any], key: str) -> Callable[[Parts], Any]:
    def get(p: Parts) -> Any:
        settings = part(p).settings
        return getattr(settings.tls, key.removeprefix("tls.")) if key.startswith("tls.") else getattr(settings, key)

    return get


def _probes() -> dict[str, Callable[[Parts], Any]]:
    """config key -> what the part built from it holds."""
    pr: dict[str, Callable[[Parts], Any]] = {
        "version": lambda p: p.cfg.version,  # the schema version: the parser's own
        "channels.names": lambda p: p.engine.channels,
        "channels.auto_add": lambda p: p.engine.intake.cfg.auto_add_channels,
        "channels.rate_hz": lambda p: 1e9 / p.engine.resampler.period_ns,
        "channels.max_staleness_s": lambda p: p.engine.resampler.max_staleness_ns / 1e9,
        "channels.max_channels": lambda p: p.engine.intake.cfg.max_channels,
        "channels.auto_pairs_per_hop": lambda p: p.engine.cfg.auto_pairs_per_hop,
        "channels.max_future_s": lambda p: p.engine.intake.cfg.max_future_s,
        "channels.max_name_bytes": lambda p: (p.engine.intake.cfg.max_name_bytes, p.zmq_src.decoder.max_name_bytes),
        "channels.retire_after_s": lambda p: p.engine.intake.retire_ns / 1e9,
        "channels.reanchor_after_s": lambda p: p.engine.intake.reanchor_ns / 1e9,
        "window.samples": lambda p: (p.engine.calibration.window_len, p.engine.screener.window_len),
        "window.hop_s": lambda p: p.engine.screener.hop_s,
        "window.hop_samples": lambda p: (
            EngineConfig.from_config(parse_config({**p.raw, "window": {"hop_samples": 7}})).hop_samples
        ),
        "window.min_coverage": lambda p: p.engine.cfg.min_coverage,
        "window.skip_stale_hops": lambda p: p.engine.cfg.skip_stale_hops,
        "pairs.mode": lambda p: p.engine._pairs.tolist(),
        "pairs.groups": lambda p: p.engine._pairs.tolist(),
        "pairs.groups_with": lambda p: p.engine._pairs.tolist(),
        "pairs.pairs": lambda p: (
            EngineConfig.from_config(parse_config({**p.raw, "pairs": {"mode": "list", "pairs": [["c", "b"]]}}))
            .pairs.resolve(["a", "b", "c"])
            .tolist()
        ),
        "pairs.max_per_hop": lambda p: p.engine.screener.max_pairs_per_hop,
        "screening.mode": lambda p: p.engine.screener.mode,
        "screening.max_age_s": lambda p: p.engine.screener.max_age_s,
        "screening.hop_budget": lambda p: p.engine.screener.hop_budget,
        "estimator.device": lambda p: p.est.device.type,
        "estimator.amp": lambda p: p.est.amp,
        "estimator.compile": lambda p: p.est.compiled,
        "estimator.batch_size": lambda p: p.est.batch_size,
        "estimator.refine_high_mi": lambda p: p.est.refine_high_mi,
        "estimator.prewhiten": lambda p: p.est.prewhiten,
        "estimator.threads": lambda p: p.threads,
        "estimator.weights": lambda p: _digest(p.est) == _digest(Estimator("infonet-v1")) != _digest(Estimator()),
        "compute.backend": lambda p: COMPUTE[p.cfg.compute.backend] is not None,
        "changes.false_alarm_rate": lambda p: p.engine.detector.alpha,
        "changes.false_alarms_per_hour": lambda p: p.engine.cfg.false_alarms_per_hour,  # overridden by the above
        "changes.significance": lambda p: p.engine.cfg.significance,
        "changes.surrogates": lambda p: p.engine.surrogates.n_surrogates,
        "window.repeated_rows": lambda p: p.engine.cfg.repeated_rows,
        "changes.min_effect": lambda p: (p.engine.screener.min_effect, p.engine._scheduler.min_effect),
        "changes.persist": lambda p: p.engine.detector.persist,
        "changes.delta": lambda p: p.engine.detector.delta,
        "changes.rel_delta": lambda p: p.engine.detector.rel_delta,
        "changes.fast": lambda p: p.engine.fast is not None,  # off: no fast path at all
        "changes.fast_window": lambda p: p.engine.cfg.fast_window,  # the sentinel's length derives from it
        "lags.max_s": lambda p: p.engine.lags.max_lag / p.engine.cfg.rate_hz,  # samples of the clock
        "lags.refresh_s": lambda p: p.engine.lags.refresh_ns / 1e9,
        "lags.max_pairs_per_hop": lambda p: p.engine.lags.max_pairs,
        "outputs.record.directory": lambda p: str(p.record.dir),
        "outputs.status_interval_s": lambda p: p.daemon.status_interval_s,
        "http.enabled": lambda p: p.http_url is not None,
        "http.host": lambda p: p.http_url is not None and "//localhost:" in p.http_url,
        "http.port": lambda p: p.http_url is not None and not p.http_url.endswith(":9108"),
        "http.web": lambda p: p.web is not None and p.daemon.web is p.web,
        "http.web_max_queue_bytes": lambda p: p.web.max_queue_bytes,
        "http.max_connections": lambda p: p.guard.max_connections,
        "http.header_timeout_s": lambda p: p.guard.header_timeout_s,
        "http.snapshot_stale_s": lambda p: p.daemon.snapshot_stale_s,
        "logging.level": lambda p: logging.getLevelName(p.log_level),
        "logging.format": lambda p: "text" if type(p.log_handler.formatter) is logging.Formatter else "json",
        "logging.max_repeats_per_10s": lambda p: next(
            f.max_per_window for f in p.log_handler.filters if isinstance(f, RepeatLimitFilter)
        ),
    }
    for key in ("address", "workers", "device", "cpus_per_worker", "tile_pairs", "max_in_flight", "start_timeout_s"):
        pr[f"compute.{key}"] = lambda p, k=key: getattr(p.ray.settings, k)
    pr["compute.hop_timeout_s"] = lambda p: p.ray.hop_timeout_s
    for key in ("endpoint", "bind", "snapshot_endpoint", "prefix", "top_k", "threshold", "max_queue_bytes"):
        pr[f"outputs.zmq.{key}"] = lambda p, k=key: getattr(p.zmq_out, k)
    for key in ("prefix", "retain_snapshot", "queue_size", "top_k", "threshold"):
        pr[f"outputs.mqtt.{key}"] = lambda p, k=key: getattr(p.mqtt_out, k)
    for key in ("rotate_s", "max_bytes", "top_k"):
        pr[f"outputs.record.{key}"] = lambda p, k=key: getattr(p.record, k)
    for key in [*MQTT, *(f"tls.{k}" for k in TLS)]:
        if key != "tls":
            pr[f"outputs.mqtt.{key}"] = _conn(lambda p: p.mqtt_out, key)
            pr[f"sources.mqtt.{key}"] = _conn(lambda p: p.mqtt_src, key)
    for key in PAYLOAD:
        pr[f"sources.mqtt.{key}"] = lambda p, k=key: getattr(p.mqtt_src.decoder.settings, k)
        pr[f"sources.zmq.{key}"] = lambda p, k=key: getattr(p.zmq_src.decoder.settings, k)
    for key in ("topics", "queue_size", "queue_bytes", "receive_buffer_bytes"):
        pr[f"sources.mqtt.{key}"] = lambda p, k=key: getattr(p.mqtt_src, k)
    for key in ("endpoint", "mode", "bind", "topics", "rcvhwm"):
        pr[f"sources.zmq.{key}"] = lambda p, k=key: getattr(p.zmq_src, k)
    pr["sources.mqtt.type"] = lambda p: type(p.mqtt_src).__name__
    pr["sources.zmq.type"] = lambda p: type(p.zmq_src).__name__
    # read at scrape time by streamcorr.daemon.observe: count the pair gauges it exports for a 10-channel snapshot
    pr["http.pair_metrics_top_k"] = lambda p: _pair_gauges(p, "top")
    pr["http.pair_metrics_listed"] = lambda p: _pair_gauges(p, "listed")
    return pr


# what each probe must read back, where it is not the configured value itself
EXPECTED: dict[str, Any] = {
    "channels.max_name_bytes": (100, 100),
    "window.samples": (64, 64),
    "window.hop_s": 0.5,
    "window.hop_samples": 7,
    "pairs.mode": [[0, 2]],
    "pairs.groups": [[0, 2]],
    "pairs.groups_with": [[0, 2]],
    "pairs.pairs": [[1, 2]],
    "estimator.weights": True,
    "compute.backend": True,
    "changes.min_effect": (0.2, 0.2),
    "http.enabled": True,
    "http.host": True,
    "http.port": True,
    "http.web": True,
    "sources.mqtt.type": "MqttSource",
    "sources.zmq.type": "ZmqSource",
}


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> Parts:
    import os

    cache = tmp_path_factory.mktemp("cache")
    old = os.environ.get("STREAMCORR_CACHE_DIR")
    os.environ["STREAMCORR_CACHE_DIR"] = str(cache)  # the probe's own calibration, measured once (window 64)
    try:
        return Parts(tmp_path_factory.mktemp("wiring"))
    finally:
        if old is None:
            os.environ.pop("STREAMCORR_CACHE_DIR", None)
        else:
            os.environ["STREAMCORR_CACHE_DIR"] = old


def test_every_key_has_a_probe():
    """Every leaf key of the schema is probed here, and every probe names a key of the schema."""
    keys = set(_keys(Config))
    probes = set(_probes())
    assert not keys - probes, f"config keys nobody checks reach their part: {sorted(keys - probes)}"
    assert not probes - keys, f"probes for keys the schema lacks: {sorted(probes - keys)}"


def _configured(raw: dict[str, Any], key: str) -> Any:
    parts = key.split(".")
    if parts[0] == "sources":
        node: Any = next(s for s in raw["sources"] if s["type"] == parts[1])
        parts = parts[2:]
    else:
        node = raw
    for part in parts:
        node = node[part]
    return node


@pytest.mark.parametrize("key", sorted(_probes()))
def test_the_key_reaches_its_part(parts, key):
    """The value set in the config is the value the part holds (not the default)."""
    want = EXPECTED[key] if key in EXPECTED else _configured(parts.raw, key)
    got = _probes()[key](parts)
    if isinstance(want, list) and want and isinstance(want[0], str):
        got = list(got)
    assert got == want, f"{key}: configured {want!r}, the part holds {got!r}"
