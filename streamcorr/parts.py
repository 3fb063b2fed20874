"""What the daemon runs, built from the config: sources and outputs from their sections (type -> factory
tables; a section is its part's settings), the compute backend, and the guard that counts an output's
failures so they show in /metrics, the status message and /healthz.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .changes import ChangeEvent
from .compute import PairEvaluator
from .config import Compute, MqttSourceConfig, Outputs, ZmqSourceConfig
from .ingest.source import Source
from .matrix import Snapshot
from .publish.sinks import Sink

if TYPE_CHECKING:
    from .daemon import Daemon

__all__ = ["COMPUTE", "OUTPUTS", "SOURCES", "SinkGuard"]


class SinkGuard:
    """Wraps one output for `forward`: counts what it raised per stream, so a failing output is visible in
    /metrics, the status counters and /healthz, and re-raises for `forward` to log (rate-limited)."""

    def __init__(self, name: str, sink: Sink) -> None:
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


def _mqtt_source(s: MqttSourceConfig, d: Daemon) -> Source:
    from .ingest.mqtt import MqttSource

    return MqttSource(settings=s, topics=list(s.topics), decoder=d.decoder(s), sink=d.push,
                      queue_size=s.queue_size, queue_bytes=s.queue_bytes)  # fmt: skip


def _zmq_source(s: ZmqSourceConfig, d: Daemon) -> Source:
    from .ingest.zmq import ZmqSource

    return ZmqSource(endpoint=s.endpoint, mode=s.mode, bind=s.bind, topics=list(s.topics), rcvhwm=s.rcvhwm,
                     decoder=d.decoder(s), sink=d.push)  # fmt: skip


def _zmq_output(z: Any, d: Daemon) -> Sink:
    from .publish.zmq_sink import ZmqPublisher

    return ZmqPublisher(**z.model_dump())


def _mqtt_output(m: Any, d: Daemon) -> Sink:
    from .publish.mqtt_sink import MqttPublisher

    return MqttPublisher(settings=m, prefix=m.prefix, retain_snapshot=m.retain_snapshot, queue_size=m.queue_size,
                         top_k=m.top_k, threshold=m.threshold)  # fmt: skip


def _record_output(r: Any, d: Daemon) -> Sink:
    from .publish.record import ParquetRecorder

    return ParquetRecorder(**r.model_dump())


def _ray_compute(c: Compute, estimator: Mapping[str, Any], hop_s: float) -> PairEvaluator:
    from .compute_ray import RayEvaluator

    ev = RayEvaluator(c, estimator, hop_s)
    ev.start()
    return ev


SOURCES: dict[str, Callable[[Any, Daemon], Source]] = {"mqtt": _mqtt_source, "zmq": _zmq_source}
OUTPUTS: dict[str, Callable[[Any, Daemon], Sink]] = {"zmq": _zmq_output, "mqtt": _mqtt_output,
                                                      "record": _record_output}  # fmt: skip
# compute.backend -> the started backend; None: the engine's own estimator, in the hop's thread
COMPUTE: dict[str, Callable[[Compute, Mapping[str, Any], float], PairEvaluator] | None] = {
    "local": None,
    "ray": _ray_compute,
}
assert set(OUTPUTS) == set(Outputs.model_fields) - {"status_interval_s"}, "every output section has a factory"
