"""Rate-limited logging for bad input and flapping connections: one line per kind, not one per message."""

from __future__ import annotations

import logging
import math
import time

__all__ = ["RateLimitedLog"]


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
