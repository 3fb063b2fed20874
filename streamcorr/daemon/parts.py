"""What the daemon runs, built from the config: sources and outputs from their sections (type -> factory
tables; a section is its part's settings) and the compute backend. A source's factory gets its section, its
payload decoder and the function it hands samples to; an output's, its section.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..compute.local import PairEvaluator
from ..config import Compute, MqttSourceConfig, Outputs, ZmqSourceConfig
from ..ingest.source import Source
from ..publish.sinks import Sink

__all__ = ["COMPUTE", "OUTPUTS", "SOURCES", "Push"]

Push = Callable[[str, Any, Any], int]  # (channel, stamps, values) -> samples taken: Engine.push


def _mqtt_source(s: MqttSourceConfig, decoder: Any, push: Push) -> Source:
    from ..ingest.mqtt import MqttSource

    return MqttSource(settings=s, topics=list(s.topics), decoder=decoder, sink=push,
                      queue_size=s.queue_size, queue_bytes=s.queue_bytes,
                      receive_buffer_bytes=s.receive_buffer_bytes)  # fmt: skip


def _zmq_source(s: ZmqSourceConfig, decoder: Any, push: Push) -> Source:
    from ..ingest.zmq import ZmqSource

    return ZmqSource(endpoint=s.endpoint, mode=s.mode, bind=s.bind, topics=list(s.topics), rcvhwm=s.rcvhwm,
                     decoder=decoder, sink=push)  # fmt: skip


def _zmq_output(z: Any) -> Sink:
    from ..publish.zmq_sink import ZmqPublisher

    return ZmqPublisher(**z.model_dump())


def _mqtt_output(m: Any) -> Sink:
    from ..publish.mqtt_sink import MqttPublisher

    return MqttPublisher(settings=m, prefix=m.prefix, retain_snapshot=m.retain_snapshot, queue_size=m.queue_size,
                         top_k=m.top_k, threshold=m.threshold)  # fmt: skip


def _record_output(r: Any) -> Sink:
    from ..publish.record import ParquetRecorder

    return ParquetRecorder(**r.model_dump())


def _ray_compute(c: Compute, estimator: Mapping[str, Any], hop_s: float) -> PairEvaluator:
    from ..compute.ray import RayEvaluator

    ev = RayEvaluator(c, estimator, hop_s)
    ev.start()
    return ev


SOURCES: dict[str, Callable[[Any, Any, Push], Source]] = {"mqtt": _mqtt_source, "zmq": _zmq_source}
OUTPUTS: dict[str, Callable[[Any], Sink]] = {"zmq": _zmq_output, "mqtt": _mqtt_output,
                                                      "record": _record_output}  # fmt: skip
# compute.backend -> the started backend; None: the engine's own estimator, in the hop's thread
COMPUTE: dict[str, Callable[[Compute, Mapping[str, Any], float], PairEvaluator] | None] = {
    "local": None,
    "ray": _ray_compute,
}
assert set(OUTPUTS) == set(Outputs.model_fields) - {"status_interval_s"}, "every output section has a factory"
