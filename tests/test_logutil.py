"""Log volume limits that keep distinct facts: every new channel's notice, and under a flood a summary that counts
and names what was held back (issue 29: the rate limiter swallowed "new channel" notices)."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

from streamcorr.engine.core import EngineConfig, EngineCounters
from streamcorr.engine.intake import Intake
from streamcorr.logutil import RateLimitedLog, RepeatLimitFilter


class _Lines(logging.Handler):
    """The formatted lines that pass the handler's filters (as setup_logging's handler would write them)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def lines():
    """A handler on the root logger with setup_logging's repeat limit (5 per template per 10 s, to make it bite)."""
    handler = _Lines()
    handler.addFilter(RepeatLimitFilter(max_per_window=5))
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield handler.lines
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def test_every_new_channel_gets_its_own_notice(lines):
    """Twelve channels auto-added within a second each get a "new channel" line naming them: neither the
    intake's rate limit nor the per-template repeat limit takes them for repeats of one message."""
    rng = np.random.default_rng(40)
    cfg = EngineConfig(channels=[], rate_hz=10.0, window_len=64, hop_samples=8, auto_add_channels=True)
    intake = Intake(cfg, EngineCounters(), on_due=lambda: None)
    names = [f"dev{k}.temp" for k in range(12)]
    for k, name in enumerate(names):
        intake.push(name, 100.0 + k / 10, float(rng.standard_normal()))
    notices = [s for s in lines if s.startswith("new channel")]
    assert notices == [f"new channel {name!r}" for name in names], lines


def test_a_flood_of_distinct_facts_is_summarised_with_its_count_and_names(lines):
    """Beyond ``burst`` per interval, distinct facts are held back and, without any further call, a timer logs
    one line within the interval with how many were held back and their names."""
    np.random.default_rng(41)  # nothing random here; seeded by convention
    rl = RateLimitedLog(logging.getLogger("streamcorr.test"), interval_s=0.3)
    got = [rl.each(logging.INFO, "new_channel", "new channel %r", f"n{k}", burst=3) for k in range(10)]
    assert got == [True] * 3 + [False] * 7
    deadline = time.monotonic() + 5
    while not any("held back" in s for s in lines):
        assert time.monotonic() < deadline, lines
        time.sleep(0.02)
    (summary,) = [s for s in lines if "held back" in s]
    assert summary.startswith("new_channel: 7 more held back in a flood"), summary
    assert "new channel 'n3'; new channel 'n4'; new channel 'n5'; and 4 more" in summary, summary
    assert rl.each(logging.INFO, "new_channel", "new channel %r", "later")  # a new window logs again
    assert lines[-1] == "new channel 'later'"


def test_repeat_limit_still_bounds_repeats_of_one_template(lines):
    """Messages not marked distinct keep the per-template limit: 20 bad payloads give 5 lines, then a count."""
    np.random.default_rng(42)  # nothing random here; seeded by convention
    log = logging.getLogger("streamcorr.test")
    for k in range(20):
        log.warning("bad payload %d", k)
    assert len([s for s in lines if s.startswith("bad payload")]) == 5, lines
