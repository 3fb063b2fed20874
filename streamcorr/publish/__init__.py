"""Live MI matrix state, change detection, the message envelope, sinks and the subscriber client.

Transport-bound names (sinks, Subscriber) load on first use, so importing the engine pulls in neither
pyzmq nor aiomqtt.
"""

from typing import TYPE_CHECKING, Any

from .changes import ChangeDetector, ChangeEvent, NullCalibration
from .snapshot import MatrixState, Snapshot

if TYPE_CHECKING:
    from .envelope import EnvelopeError, Message, Status, decode, decode_message
    from .mqtt_sink import MqttPublisher
    from .sinks import forward
    from .subscriber import Subscriber
    from .web import WebView
    from .zmq_sink import ZmqPublisher

_LAZY = {
    "EnvelopeError": "envelope",
    "Message": "envelope",
    "Status": "envelope",
    "decode": "envelope",
    "decode_message": "envelope",
    "MqttPublisher": "mqtt_sink",
    "ZmqPublisher": "zmq_sink",
    "forward": "sinks",
    "Subscriber": "subscriber",
    "WebView": "web",
}

__all__ = [
    "ChangeDetector",
    "ChangeEvent",
    "EnvelopeError",
    "MatrixState",
    "Message",
    "MqttPublisher",
    "NullCalibration",
    "Snapshot",
    "Status",
    "Subscriber",
    "WebView",
    "ZmqPublisher",
    "decode",
    "decode_message",
    "forward",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
