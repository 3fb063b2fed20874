"""Rate-limited logging for bad input and flapping connections: one line per kind, not one per message; distinct
facts (a new channel, each with its own name) one line each, summarised only under a flood."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import Logging

__all__ = ["DISTINCT", "RateLimitedLog", "RepeatLimitFilter", "broker_hint", "setup_logging"]

# ``extra=DISTINCT`` on a log call: its every message is a fact of its own (a channel's name in it), so
# RepeatLimitFilter limits repeats of the same text, not of the template
DISTINCT = {"distinct": True}


@dataclass
class _Flood:
    """Distinct facts of one key in the current window: how many were logged, and those held back."""

    start: float
    logged: int = 0
    held: int = 0
    names: list[str] = field(default_factory=list)  # the first held messages, for the summary
    level: int = logging.INFO


class RateLimitedLog:
    """Logs the first message per key, then at most one per ``interval_s`` with a count of those held back.

    >>> import logging
    >>> rl = RateLimitedLog(logging.getLogger("doctest"), interval_s=60)
    >>> [rl(logging.INFO, "k", "hello") for _ in range(3)]
    [True, False, False]
    """

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._state: dict[str, tuple[float, int]] = {}  # key -> (last logged, suppressed since)
        self._floods: dict[str, _Flood] = {}  # each(): per key
        self._lock = threading.Lock()  # each() may be called from several threads, flush() from a timer
        self._timer: threading.Timer | None = None

    def __call__(self, level: int, key: str, msg: str, *args: object, exc_info: bool = False) -> bool:
        now = time.monotonic()
        last, held = self._state.get(key, (-math.inf, 0))
        if now - last < self.interval_s:
            self._state[key] = (last, held + 1)
            return False
        if len(self._state) > 1024:  # keys are meant to be few (reasons); never let them grow without bound
            self._state.clear()
        self._state[key] = (now, 0)
        if held:
            msg += " (%d similar messages suppressed)"
            args = (*args, held)
        self.logger.log(level, msg, *args, exc_info=exc_info)
        return True

    def warning(self, key: str, msg: str, *args: object) -> bool:
        return self(logging.WARNING, key, msg, *args)

    def each(self, level: int, key: str, msg: str, *args: object, burst: int = 20) -> bool:
        """Log a distinct fact (a new channel: its name in ``args``), never as a repeat of its template: up to
        ``burst`` per ``interval_s`` for ``key`` get a line each (marked DISTINCT for RepeatLimitFilter); under
        a flood the rest are held back, and within ``interval_s`` one line gives their count and the first
        ``burst`` of them (a timer calls :meth:`flush`).

        >>> import logging
        >>> rl = RateLimitedLog(logging.getLogger("doctest"), interval_s=60)
        >>> [rl.each(logging.INFO, "new", "new channel %r", name, burst=2) for name in "abcd"]
        [True, True, False, False]
        >>> rl.flush()  # logs "new: 2 more held back in a flood of 0 s: new channel 'c'; new channel 'd'"
        1
        """
        now = time.monotonic()
        with self._lock:
            flood = self._floods.get(key)
            if flood is not None and now - flood.start >= self.interval_s:
                self._summarise(key)
                flood = None
            if flood is None:
                if len(self._floods) > 1024:  # keys are meant to be few (kinds of fact)
                    self._floods.clear()
                flood = self._floods[key] = _Flood(now, level=level)
            if flood.logged < burst:
                flood.logged += 1
                self.logger.log(level, msg, *args, extra=DISTINCT)
                return True
            flood.held += 1
            if len(flood.names) < burst:
                flood.names.append(msg % args if args else msg)
            if self._timer is None:  # one summary within interval_s, even if nothing else is logged
                self._timer = threading.Timer(max(0.0, flood.start + self.interval_s - now), self.flush)
                self._timer.daemon = True
                self._timer.start()
            return False

    def flush(self) -> int:
        """Log the summary of every flood held back by :meth:`each`; returns how many lines it logged."""
        with self._lock:
            self._timer = None
            return sum(self._summarise(key) for key in list(self._floods))

    def _summarise(self, key: str) -> int:
        flood = self._floods.pop(key)
        if not flood.held:
            return 0
        more = f"; and {flood.held - len(flood.names)} more" if flood.held > len(flood.names) else ""
        self.logger.log(flood.level, "%s: %d more held back in a flood of %.0f s: %s%s", key, flood.held,
                        time.monotonic() - flood.start, "; ".join(flood.names), more)  # fmt: skip
        return 1


class RepeatLimitFilter(logging.Filter):
    """Bounds log volume whatever logs it (asyncio's accept errors included): per logger and message
    template, at most ``max_per_window`` lines per ``window_s``, and ``10 * max_per_window`` lines in all (a flood
    of distinct messages); the first line after a quiet spell says how many were held back.

    >>> f = RepeatLimitFilter(max_per_window=2, window_s=60)
    >>> rec = logging.LogRecord("x", logging.ERROR, __file__, 1, "accept failed: %s", ("EMFILE",), None)
    >>> [f.filter(rec) for _ in range(4)]
    [True, True, False, False]
    """

    def __init__(self, max_per_window: int = 20, window_s: float = 10.0) -> None:
        super().__init__()
        self.max_per_window = max_per_window
        self.window_s = window_s
        self._state: dict[tuple[str, str], list[float]] = {}  # key -> [window start, lines, held back]
        self._all = [-math.inf, 0.0, 0.0]  # the same for every line together

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        key = (record.name, (record.getMessage() if getattr(record, "distinct", False) else str(record.msg))[:200])
        state = self._state.get(key)
        held = 0
        if state is None or now - state[0] >= self.window_s:
            held = int(state[2]) if state is not None else 0
            if len(self._state) > 4096:  # templates are few; a flood of distinct ones must not grow this
                self._state.clear()
            state = self._state[key] = [now, 0, 0]
        if state[1] >= self.max_per_window:
            state[2] += 1
            return False
        total = self._all  # lines let through in all, so that distinct messages cannot flood either
        if now - total[0] >= self.window_s:
            if total[2]:
                record.msg = f"{record.msg} ({int(total[2])} log lines held back in a flood before this one)"
            self._all = total = [now, 0, 0]
        if total[1] >= 10 * self.max_per_window:
            total[2] += 1
            state[2] += 1
            return False
        total[1] += 1
        state[1] += 1
        if held:
            record.msg = f"{record.msg} ({held} similar lines held back in the previous {self.window_s:g} s)"
        return True


def broker_hint(exc: BaseException) -> str:
    """A suggestion for a log line when nothing listens where an MQTT broker should be (the usual first mistake).

    >>> broker_hint(ConnectionRefusedError(111, "Connection refused"))[:38]
    ' (is an MQTT broker running there? sta'
    """
    text = str(exc).lower()
    if isinstance(exc, ConnectionRefusedError) or "refused" in text or "errno 111" in text:
        return " (is an MQTT broker running there? start Mosquitto: `mosquitto -d`, or `systemctl start mosquitto`)"
    return ""


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"t": round(record.created, 3), "level": record.levelname, "logger": record.name}
        out["msg"] = record.getMessage()
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(settings: Logging) -> None:
    """Log lines on stderr, JSON or text (the config's ``logging`` section); any one message template at most
    ``max_repeats_per_10s`` times per 10 s (the rest counted in the next line), so no flood fills a disk."""
    handler = logging.StreamHandler()
    text = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(_JsonFormatter() if settings.format == "json" else text)
    handler.addFilter(RepeatLimitFilter(settings.max_repeats_per_10s))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.level)
