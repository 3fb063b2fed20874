"""The engine's door and stream clock: per-channel ring buffers, who may have a channel, due windows.

The bounds on what one sender can do (see :mod:`streamcorr.engine`) are kept here: samples too far ahead
of the receive clock, names breaking the channel-name rule, new names beyond ``max_channels`` are refused
and counted by reason; stream time is the newest accepted timestamp, never past the receive clock. A window
is due once stream time passes its end plus ``max_staleness_s``; ``due_end_tick`` gives each out once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from .buffers import ChannelCounters, Resampler, RingBuffer
from .copula import SlidingRanks
from .errors import InputError
from .logutil import RateLimitedLog
from .names import name_problem
from .settings import EngineConfig

log = logging.getLogger("streamcorr.engine")

__all__ = ["Channel", "EngineCounters", "Intake"]


@dataclass
class EngineCounters:
    hops: int = 0
    hops_skipped: int = 0  # hops superseded because compute was still busy
    pairs_evaluated: int = 0
    pairs_low_coverage: int = 0
    pairs_screened: int = 0  # cells given the screen's figure instead of a network estimate
    screen_passed: int = 0  # pairs that passed the screen
    max_age_overdue: int = 0  # pairs due for their max_age network estimate that did not fit the hop's budget
    screen_deferred: int = 0  # pairs that passed the screen but did not fit the hop's budget (they wait)
    unknown_channel: int = 0  # samples for channels not in the config (auto_add_channels=False)
    bad_name: int = 0  # samples for a name that breaks the channel-name rule
    channel_limit: int = 0  # samples for new names refused because max_channels exist
    future: int = 0  # samples for a new name, all stamped beyond max_future_s (known channels count their own)
    bad_sample: int = 0  # non-numeric or mismatched input to push
    snapshots_dropped: int = 0
    events_dropped: int = 0
    last_hop_s: float = 0.0  # wall time of the newest hop's evaluation
    stage_s: dict[str, float] = field(default_factory=dict)  # seconds spent per stage of evaluate()

    def add_time(self, stage: str, t0: float) -> float:
        now = time.perf_counter()
        self.stage_s[stage] = self.stage_s.get(stage, 0.0) + now - t0
        return now


class Channel:
    """One channel's ring buffer, and the sliding ranks the evaluation keeps for it."""

    def __init__(self, name: str, capacity: int, window_len: int) -> None:
        self.name = name
        self.buffer = RingBuffer(capacity)
        self.ranks = SlidingRanks(1, window_len)  # placeholder: the engine starts one with the estimator's ties
        self.ranks_end_tick: int | None = None  # window end tick the sliding state is at


class Intake:
    """Channels and stream time of one engine; ``on_due`` is called (on the pushing thread) when a window
    becomes due. Counts refusals in the engine's ``counters``."""

    def __init__(self, cfg: EngineConfig, counters: EngineCounters, on_due: Callable[[], None]) -> None:
        self.cfg = cfg
        self.counters = counters
        self._on_due = on_due
        self._log = RateLimitedLog(log)
        self.resampler = Resampler(cfg.rate_hz, cfg.max_staleness_s)
        self.capacity = cfg.buffer_len or 2 * (cfg.window_len + 2 * cfg.hop_samples)
        self.channels: dict[str, Channel] = {}  # insertion order is matrix order
        self.stream_ns: int | None = None  # newest accepted timestamp (never past the receive clock)
        self.next_end_tick: int | None = None  # end tick (ns) of the next window to evaluate
        for name in cfg.channels:
            self.add_channel(name)

    def sample_drops(self) -> dict[str, int]:
        """Samples refused so far, by reason, over all channels. (Samples that aged out of a full ring buffer
        after use are not drops: see ``channel_counters()[name].overwritten``.)"""
        per_channel = ("late", "duplicate", "nonfinite", "future")
        c = self.counters
        out = {"bad_sample": c.bad_sample, "unknown_channel": c.unknown_channel}
        out |= {"bad_name": c.bad_name, "channel_limit": c.channel_limit}
        for reason in per_channel:
            out[reason] = sum(getattr(cc, reason) for cc in self.channel_counters().values())
        out["future"] += c.future
        return out

    def channel_counters(self) -> dict[str, ChannelCounters]:
        """Per-channel sample counters (accepted, late, duplicate, nonfinite, future, overwritten), by name."""
        return {name: ch.buffer.counters for name, ch in list(self.channels.items())}

    def add_channel(self, name: str) -> None:
        # Only the buffer is created here (on the event loop); the matrix, pairs and scheduler grow in
        # Engine._sync_channels, called by the evaluating thread, so they never change under an evaluation.
        self.channels[name] = Channel(name, self.capacity, self.cfg.window_len)

    def _refused(self, name: str, n: int) -> bool:
        """For a name with no channel yet: whether it may not have one (its n samples then counted by reason)."""
        cnt = self.counters
        if not self.cfg.auto_add_channels:
            cnt.unknown_channel += n  # samples, so every sample is accounted for
            return True
        if len(self.channels) >= self.cfg.max_channels:  # checked first: the cheapest, and what a flood meets
            cnt.channel_limit += n
            self._log(logging.WARNING, "channel_limit", "refused new channel %.80r: max_channels (%d) exist",
                      name, self.cfg.max_channels)  # fmt: skip
            return True
        if (why := name_problem(name, self.cfg.max_name_bytes)) is not None:
            cnt.bad_name += n
            self._log(logging.WARNING, "bad_name", "refused samples for channel %.80r: %s", name, why)
            return True
        return False

    def _channel(self, name: str, n: int) -> Channel | None:
        """The channel's state, created on first use when allowed; None (n samples counted by reason) if not."""
        ch = self.channels.get(name)
        if ch is not None:
            return ch
        if self._refused(name, n):
            return None
        self._log.each(logging.INFO, "new_channel", "new channel %.80r", name)  # each name: a fact of its own
        self.add_channel(name)
        return self.channels[name]

    # -- ingest -------------------------------------------------------------------------------------
    def push(self, channel: str, t: float | np.ndarray, values: float | np.ndarray) -> int:
        """Append samples (t in seconds) to one channel; returns how many were accepted."""
        if channel not in self.channels and self._refused(channel, int(np.size(values)) or 1):
            return 0  # before any conversion: a flood of refused names costs little
        t_ns = self._times_ns(t)
        if t_ns is None:
            self.counters.bad_sample += int(np.size(values)) or 1
            return 0
        return self._push_ns(channel, t_ns, values)

    def push_ns(self, channel: str, t_ns: np.ndarray, values: float | np.ndarray) -> int:
        """Append samples stamped in integer nanoseconds (int64) to one channel; returns how many were accepted."""
        if channel not in self.channels and self._refused(channel, int(np.size(values)) or 1):
            return 0
        arr = np.atleast_1d(np.asarray(t_ns))
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            self.counters.bad_sample += int(np.size(values)) or 1
            return 0
        return self._push_ns(channel, arr.astype(np.int64), values)

    def push_frame(self, t: float | np.ndarray, frame: Mapping[str, float | np.ndarray]) -> int:
        """Append samples of several channels taken together at time(s) t (seconds); returns how many were accepted.

        t is a scalar with one value per channel, or (n,) with n values per channel (a chunk of frames).
        """
        t_ns = self._times_ns(t)
        if t_ns is None:
            self.counters.bad_sample += sum(int(np.size(v)) or 1 for v in frame.values())
            return 0
        return sum(self._push_ns(name, t_ns, value) for name, value in frame.items())

    def _times_ns(self, t: float | np.ndarray) -> np.ndarray | None:
        try:
            t_ns = np.round(np.atleast_1d(np.asarray(t, dtype=np.float64)) * 1e9)
        except (TypeError, ValueError) as exc:
            log.debug("bad timestamps: %s", exc)
            return None
        if t_ns.ndim != 1 or not np.isfinite(t_ns).all() or np.abs(t_ns).max(initial=0) > 9e18:
            return None
        return t_ns.astype(np.int64)

    def _push_ns(self, channel: str, t_ns: np.ndarray, values: float | np.ndarray) -> int:
        try:
            vals = np.atleast_1d(np.asarray(values, dtype=np.float64))
            if t_ns.shape != vals.shape:
                raise InputError(f"t and values must have the same 1-D shape; got {t_ns.shape} and {vals.shape}")
        except (TypeError, ValueError) as exc:
            self.counters.bad_sample += int(np.size(values)) or 1
            log.debug("bad sample for %r: %s", channel, exc)
            return 0
        now_ns = time.time_ns()  # the receive clock
        max_t_ns = None if self.cfg.max_future_s is None else now_ns + round(self.cfg.max_future_s * 1e9)
        if max_t_ns is not None and channel not in self.channels and (t_ns > max_t_ns).all():
            self.counters.future += len(t_ns)  # a new name whose samples are all refused takes no channel slot
            return 0
        ch = self._channel(channel, len(t_ns))
        if ch is None:
            return 0
        accepted = ch.buffer.push_many(t_ns, vals, max_t_ns=max_t_ns)
        if accepted:
            newest = int(ch.buffer.last_t_ns or 0)
            if max_t_ns is not None:  # a sample a little ahead of the clock must not end windows for the others
                newest = min(newest, now_ns)
            self._advance(newest, int(t_ns[0]))
        return accepted

    def _advance(self, t_ns: int, t_first_ns: int) -> None:
        """Move stream time to t_ns (newest sample); t_first_ns (oldest in the push) anchors the first window."""
        if self.stream_ns is None or t_ns > self.stream_ns:
            self.stream_ns = t_ns
        period = self.resampler.period_ns
        if self.next_end_tick is None:  # first window ends one full window after the first sample
            first = (min(t_first_ns, t_ns) // period) * period
            self.next_end_tick = first + (self.cfg.window_len - 1) * period
        if self.stream_ns >= self.next_end_tick + self.resampler.max_staleness_ns:
            self._on_due()

    def due_end_tick(self) -> int | None:
        if self.next_end_tick is None or self.stream_ns is None:
            return None
        period = self.resampler.period_ns
        hop_ns = self.cfg.hop_samples * period
        ready = self.stream_ns - self.resampler.max_staleness_ns
        if ready < self.next_end_tick:
            return None
        behind = (ready - self.next_end_tick) // hop_ns if self.cfg.skip_stale_hops else 0
        self.counters.hops_skipped += int(behind)
        end = self.next_end_tick + behind * hop_ns
        self.next_end_tick = end + hop_ns
        return int(end)

    def due_windows(self) -> Iterator[int]:
        """End ticks (ns) of the windows now due, oldest first, each given out once: a caller that drives
        ``evaluate`` itself (replay, without the event loop) evaluates each. Do not mix with ``start``."""
        while (end := self.due_end_tick()) is not None:
            yield end

    def has_due(self) -> bool:
        if self.next_end_tick is None or self.stream_ns is None:
            return False
        return self.stream_ns - self.resampler.max_staleness_ns >= self.next_end_tick
