"""The one exception family raised by streamcorr."""

from __future__ import annotations


class StreamcorrError(Exception):
    """Base class of every error streamcorr raises on purpose."""


class ConfigError(StreamcorrError):
    """A configuration value is missing, malformed or out of range."""


class InputError(StreamcorrError, ValueError):
    """Data handed to the library has the wrong shape, length or values."""


class ModelLoadError(StreamcorrError):
    """Model weights are missing, corrupt, or do not match the architecture."""


class SubscriberTimeout(StreamcorrError, TimeoutError):
    """A Subscriber iterator's ``timeout_s`` passed without a message (``stream``: "snapshot", "event" or
    "status"). A ``TimeoutError``, as from ``queue.Queue.get(timeout=...)`` or ``asyncio.timeout``; an
    iterator given ``quiet_s`` instead ends without one."""

    def __init__(self, message: str, *, stream: str, timeout_s: float) -> None:
        super().__init__(message)
        self.stream = stream
        self.timeout_s = timeout_s


class PublisherOffline(SubscriberTimeout):
    """The publisher went offline (its live status says so: a clean stop, or the broker's last will) while an
    iterator with ``timeout_s`` waited: raised at once rather than after the timeout, once every message sent
    before it has been yielded. A :class:`SubscriberTimeout`, so a handler of that catches it too."""
