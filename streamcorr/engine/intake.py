"""The engine's door and stream clock: per-channel ring buffers, who may have a channel, due windows.

The bounds on what one sender can do (see :mod:`streamcorr.engine.core`) are kept here: samples too far ahead
of the receive clock, names breaking the channel-name rule, new names beyond ``max_channels`` are refused
and counted by reason; stream time is the newest accepted timestamp, never past the receive clock. A window
is due once stream time passes its end plus ``max_staleness_s``; ``due_end_tick`` gives each out once.

Channels come and go. An auto-added channel with no accepted sample for ``retire_after_s`` of stream time
(and at least one window plus ``max_staleness_s``, until when it can still hold values) is retired at the next
hop: its buffer and counters go (its drops stay in ``sample_drops``), the engine drops its pairs, and
``max_channels`` counts live channels only; when the name speaks again it is a new channel. Configured
channels never retire. Stream time is what ages a channel, so when the whole stream pauses nothing retires.

A channel's clock may step. A sample more than a window behind the channel's newest accepted one, or older than the
next window to evaluate, is late: no window to come can hold it (a new device whose clock counts from its boot sends
only such samples). When every finite sample a channel sends is late that way (a step back), or beyond
``max_future_s`` (a step forward past the receive clock), for ``reanchor_after_s`` of the samples' own stamps (and
``MIN_STEP_SAMPLES`` samples), the channel is re-anchored: its later stamps are shifted by the step, so that its
newest one lands on the stream clock, and it rejoins the windows; until then its samples are dropped and counted
(``late``, ``future``) as always. The stream clock itself never steps back, so snapshots, ages and events stay in
order. A step forward that stays within ``max_future_s`` of the receive clock (or any step forward with
``max_future_s: null``) cannot be told from a pause in the stream by its stamps, so stream time follows it as it
follows a gap.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..estimate.copula import SlidingRanks, Ties
from ..estimate.salts import name_salt
from ..logutil import RateLimitedLog
from ..names import name_problem
from .buffers import ChannelCounters, Resampler, RingBuffer
from .counters import EngineCounters
from .settings import EngineConfig, lag_samples

log = logging.getLogger("streamcorr.engine.core")

__all__ = ["Channel", "ClockStep", "EngineCounters", "Intake"]

MIN_STEP_SAMPLES = 8  # off-clock samples a re-anchor needs besides reanchor_after_s of their stamps
MAX_GROWTH = 16  # a channel's buffer grows to at most this many times the default capacity ...
GROWTH_BYTES = 256 << 20  # ... and all buffers' growth together to at most this (16 bytes a sample)


@dataclass
class ClockStep:
    """A run of a channel's samples all off its clock in one direction ("back" or "forward"), in their stamps."""

    direction: str
    first_ns: int
    newest_ns: int
    samples: int = 0


class Channel:
    """One channel's ring buffer, its clock offset, and the sliding ranks the evaluation keeps for it."""

    def __init__(self, name: str, capacity: int, window_len: int, born_ns: int | None = None) -> None:
        self.name = name
        self.buffer = RingBuffer(capacity)
        self.ranks = SlidingRanks(1, window_len)  # placeholder: the engine starts one with the estimator's ties
        self.ranks_end_tick: int | None = None  # window end tick the sliding state is at
        self.offset_ns = 0  # added to every stamp: nonzero once the channel's clock stepped and was re-anchored
        self.step: ClockStep | None = None  # the current run of off-clock samples
        self.born_ns = born_ns  # stream time when it was added: its age while it has no accepted sample
        self.capped = False  # its buffer could not grow to hold a window (logged once)
        self.gaps: list[tuple[int, int, int]] = []  # its first pushes' (median interval, span, stale) in ns
        self.paced = False  # its interval was judged against max_staleness_s (Intake._pace)

    def rank(self, values: np.ndarray, end_tick: int, period_ns: int, ties: Ties) -> np.ndarray | None:
        """Copula values (N,) of a fully valid window ending at ``end_tick``, updated incrementally when the previous
        window was contiguous; None (and the sliding state reset) when the window has a gap."""
        n = len(values)
        if not np.isfinite(values).all():
            self.ranks_end_tick = None
            return None
        if self.ranks_end_tick is not None and 0 < (end_tick - self.ranks_end_tick) // period_ns < n:
            h = (end_tick - self.ranks_end_tick) // period_ns
            u = self.ranks.update(values[None, -h:])[0]
        else:  # the estimator's tie policy; the jitter salted by the channel's name (any source, any channel order)
            self.ranks = SlidingRanks(1, n, ties=ties, salts=np.array([name_salt(self.name)], dtype=np.uint64))
            u = self.ranks.update(values[None, :])[0]
        self.ranks_end_tick = end_tick
        return u

    def heard_ns(self) -> int | None:
        """Stream time the channel was last heard from: its newest accepted stamp, else when it was added."""
        return self.buffer.last_t_ns if self.buffer.last_t_ns is not None else self.born_ns


class Intake:
    """Channels and stream time of one engine; ``on_due`` is called (on the pushing thread) when a window
    becomes due. Counts refusals in the engine's ``counters``."""

    def __init__(self, cfg: EngineConfig, counters: EngineCounters, on_due: Callable[[], None]) -> None:
        self.cfg = cfg
        self.counters = counters
        self._on_due = on_due
        self._log = RateLimitedLog(log)
        self.resampler = Resampler(cfg.rate_hz, cfg.max_staleness_s)
        ticks = cfg.window_len + lag_samples(cfg) + 2 * cfg.hop_samples  # what a buffer must span, in ticks
        self.capacity = cfg.buffer_len or 2 * ticks
        # a channel faster than the clock needs more samples than ticks to span them, so its buffer doubles while
        # it does not (up to MAX_GROWTH x, GROWTH_BYTES for all; not when the configuration sets buffer_len):
        # otherwise its pairs would see part of each window and never be estimated
        self.span_ns = ticks * self.resampler.period_ns + self.resampler.max_staleness_ns
        self.grown_bytes = 0
        self.channels: dict[str, Channel] = {}  # insertion order is matrix order
        self.stream_ns: int | None = None  # newest accepted timestamp (never past the receive clock)
        self.next_end_tick: int | None = None  # end tick (ns) of the next window to evaluate
        self._gap: tuple[int, int, str] | None = None  # (stream time before, first stamp after, channel): unpassed
        self.retired = ChannelCounters()  # the counters of retired channels, summed (the drop ledger keeps them)
        window_ns = cfg.window_len * self.resampler.period_ns
        self.window_ns = window_ns
        # a channel leaves only once no window can hold its samples
        self.retire_ns = None if cfg.retire_after_s is None else max(
            round(cfg.retire_after_s * 1e9), window_ns + self.resampler.max_staleness_ns)  # fmt: skip
        self.reanchor_ns = None if cfg.reanchor_after_s is None else round(cfg.reanchor_after_s * 1e9)
        # pushes (event loop) create channels and fill buffers; retirement (the evaluating thread) removes them
        self._lock = threading.Lock()
        for name in cfg.channels:
            self.add_channel(name)

    def sample_drops(self) -> dict[str, int]:
        """Samples refused so far, by reason, over all channels. (Samples that aged out of a full ring buffer
        after use are not drops: see ``channel_counters()[name].overwritten``.)"""
        per_channel = ("late", "duplicate", "nonfinite", "future")
        c = self.counters
        out = {"bad_sample": c.bad_sample, "unknown_channel": c.unknown_channel}
        out |= {"bad_name": c.bad_name, "channel_limit": c.channel_limit}
        with self._lock:  # a channel retiring now is counted once, live or retired
            live = [ch.buffer.counters for ch in self.channels.values()]
            for reason in per_channel:
                out[reason] = getattr(self.retired, reason) + sum(getattr(cc, reason) for cc in live)
        out["future"] += c.future
        return out

    def channel_counters(self) -> dict[str, ChannelCounters]:
        """Per-channel sample counters (accepted, late, duplicate, nonfinite, future, overwritten), by name, of
        the live channels (a retired channel's are summed in ``retired``)."""
        return {name: ch.buffer.counters for name, ch in list(self.channels.items())}

    def add_channel(self, name: str) -> None:
        # Only the buffer is created here (on the event loop); the matrix, pairs and scheduler grow in
        # Engine._sync_channels, called by the evaluating thread, so they never change under an evaluation.
        self.channels[name] = Channel(name, self.capacity, self.cfg.window_len, self.stream_ns)

    def retire_silent(self, now_ns: int) -> list[str]:
        """Retire the auto-added channels not heard from for ``retire_after_s`` at stream time now_ns (the hop's
        end); returns their names. Called by the evaluating thread (Engine._sync_channels)."""
        if self.retire_ns is None:
            return []
        configured = set(self.cfg.channels)
        gone = []
        with self._lock:
            for name, ch in list(self.channels.items()):
                heard = ch.heard_ns()
                if heard is None:  # added before stream time began: its silence counts from now
                    ch.born_ns = now_ns
                if name in configured or heard is None or now_ns - heard <= self.retire_ns:
                    continue
                del self.channels[name]
                self.grown_bytes -= 16 * max(0, ch.buffer.capacity - self.capacity)
                for f in dataclasses.fields(ChannelCounters):
                    setattr(self.retired, f.name, getattr(self.retired, f.name) + getattr(ch.buffer.counters, f.name))
                gone.append(name)
                self._log.each(
                    logging.INFO,
                    "retired",
                    "channel %.80r silent for %.0f s: retired (it returns as a new channel when it speaks)",
                    name,
                    (now_ns - heard) / 1e9,
                )  # each name: its own fact
        self.counters.channels_retired += len(gone)
        return gone

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
        with self._lock:
            ch = self._channel(channel, len(t_ns))
            if ch is None:
                return 0
            if ch.offset_ns:  # re-anchored: onto the stream clock (saturating, so no stamp wraps around)
                lo, hi = np.iinfo(np.int64).min, np.iinfo(np.int64).max
                t_ns = np.clip(t_ns, max(lo, lo - ch.offset_ns), min(hi, hi - ch.offset_ns)) + ch.offset_ns
            last = ch.buffer.last_t_ns
            # before the next window to evaluate (or a window behind the channel's newest): no window to come can
            # hold it (a device clock that counts from its boot), so it is late even for a new channel
            floors = [] if last is None else [last - self.window_ns]
            if self.next_end_tick is not None:
                floors.append(self.next_end_tick - self.window_ns - self.resampler.max_staleness_ns)
            min_t_ns = max(floors, default=None)
            if len(ch.buffer) + len(t_ns) > ch.buffer.capacity and self.cfg.buffer_len is None:
                self._grow(ch, int(t_ns[-1]))
            accepted = ch.buffer.push_many(t_ns, vals, max_t_ns=max_t_ns, min_t_ns=min_t_ns)
            if accepted and not ch.paced:
                self._pace(ch, last, t_ns)
            old = np.zeros(len(t_ns), dtype=bool) if min_t_ns is None else t_ns < min_t_ns
            if self.reanchor_ns is not None:
                self._watch_clock(ch, t_ns, vals, old, now_ns, max_t_ns, accepted)
            if accepted:
                newest = int(ch.buffer.last_t_ns or 0)
                if max_t_ns is not None:  # a sample a little ahead of the clock must not end windows for the others
                    newest = min(newest, now_ns)
                self._advance(newest, int(t_ns[0]), channel)
        return accepted

    def _pace(self, ch: Channel, last: int | None, t_ns: np.ndarray) -> None:
        """Judge a channel's sample intervals over its first 8 pushes (with the sample before each): one stale
        (intervals longer than max_staleness_s) for more of the time than min_coverage leaves has pairs that are
        never estimated: say so once, with the setting that fixes it. (A channel whose intervals only scatter around
        max_staleness_s is stale for slivers: its pairs are estimated, and it is not named.)"""
        gaps = np.diff(t_ns if last is None else np.concatenate(([last], t_ns)))
        gaps = gaps[gaps > 0]
        if not len(gaps):
            return
        stale_ns = self.resampler.max_staleness_ns
        ch.gaps.append((int(np.median(gaps)), int(gaps.sum()), int(np.maximum(gaps - stale_ns, 0).sum())))
        ch.paced = len(ch.gaps) >= 8
        if not ch.paced:
            return
        medians, spans, stale = np.array(ch.gaps, dtype=np.float64).T
        share = stale.sum() / spans.sum()  # of the time between its samples
        if share > 1.0 - self.cfg.min_coverage:
            interval_s = float(np.median(medians)) / 1e9
            self._log.each(logging.WARNING, "slow_channel", "channel %.80r samples every %.3g s, less often than "
                           "channels.max_staleness_s (%g s): it is stale %.0f%% of the time, more than "
                           "window.min_coverage (%g) allows, so its pairs are not estimated; set "
                           "channels.max_staleness_s to %.2g or more", ch.name, interval_s, self.cfg.max_staleness_s,
                           100 * share, self.cfg.min_coverage, 1.5 * interval_s)  # fmt: skip

    def _grow(self, ch: Channel, newest_ns: int) -> None:
        """Double a full channel buffer that spans less than a window needs, within the bounds (see __init__)."""
        buf = ch.buffer
        oldest = buf.oldest_t_ns()
        if oldest is None or newest_ns - oldest >= self.span_ns:
            return
        more = min(buf.capacity, MAX_GROWTH * self.capacity - buf.capacity)
        if more <= 0 or self.grown_bytes + 16 * more > GROWTH_BYTES:
            if not ch.capped:
                ch.capped = True
                self._log.each(logging.WARNING, "buffer_cap", "channel %.80r samples faster than its buffer (%d "
                               "samples) can hold a window: the oldest samples of its windows are overwritten "
                               "(counted as overwritten)", ch.name, buf.capacity)  # fmt: skip
            return
        buf.grow(buf.capacity + more)
        self.grown_bytes += 16 * more

    def _watch_clock(
        self,
        ch: Channel,
        t_ns: np.ndarray,
        vals: np.ndarray,
        old: np.ndarray,
        now_ns: int,
        max_t_ns: int | None,
        accepted: int,
    ) -> None:
        """Follow the run of samples off the channel's clock (module docstring); re-anchor it once it is long.
        ``old`` (per sample): more than a window behind the channel's newest stamp, or before the next window."""
        finite = np.isfinite(vals)
        if accepted:  # on its clock
            ch.step = None
        if accepted or not finite.any():
            return
        t_fin = t_ns[finite]
        last = ch.buffer.last_t_ns
        if old[finite].all():
            direction = "back"
        elif max_t_ns is not None and (t_fin > max_t_ns).all():
            direction = "forward"
        else:  # duplicates, small reordering, a mix: not a step
            ch.step = None
            return
        run = ch.step
        if run is None or run.direction != direction:
            run = ch.step = ClockStep(direction, int(t_fin[0]), int(t_fin[0]))
        run.newest_ns = max(run.newest_ns, int(t_fin.max()))
        run.samples += len(t_fin)
        assert self.reanchor_ns is not None
        if run.newest_ns - run.first_ns < self.reanchor_ns or run.samples < MIN_STEP_SAMPLES:
            return
        anchor = max((v for v in (self.stream_ns, last) if v is not None), default=now_ns)
        step_ns = anchor - run.newest_ns  # the newest off-clock stamp lands on the stream clock
        ch.offset_ns += step_ns
        ch.step = None
        self.counters.channels_reanchored += 1
        why = "late" if direction == "back" else "future"
        ahead = "behind the stream clock by" if direction == "back" else "ahead of the receive clock by"
        how = f"stepped {direction} by" if last is not None else ahead
        hint = "" if last is not None else " (is the device's clock set? stamps in seconds since its boot read so)"
        log.warning("channel %.80r: stamps %s %.3f s; re-anchored (later stamps shifted by %+.3f s onto "
                    "the stream clock; %d samples dropped as %s before)%s", ch.name, how, abs(step_ns) / 1e9,
                    ch.offset_ns / 1e9, run.samples, why, hint)  # fmt: skip

    def _advance(self, t_ns: int, t_first_ns: int, channel: str = "") -> None:
        """Move stream time to t_ns (newest sample); t_first_ns (oldest in the push) anchors the first window. A push
        whose oldest sample is more than a window past stream time opens a gap of the whole stream (live, with
        skip_stale_hops: a replay evaluates every hop, and skips its log's long gaps itself)."""
        before = self.stream_ns
        stream = self.stream_ns = t_ns if before is None or t_ns > before else before
        gap_ns, first = self.window_ns + self.resampler.max_staleness_ns, min(t_first_ns, t_ns)  # t_ns: at most now
        if self.cfg.skip_stale_hops and before is not None and first - before > gap_ns:
            self._gap = (before, first, channel)
        period = self.resampler.period_ns
        if self.next_end_tick is None:  # first window ends one full window after the first sample
            first = (min(t_first_ns, t_ns) // period) * period
            self.next_end_tick = first + (self.cfg.window_len - 1) * period
        if stream >= self.next_end_tick + self.resampler.max_staleness_ns:
            self._on_due()

    def due_end_tick(self) -> int | None:
        if self.next_end_tick is None or self.stream_ns is None:
            return None
        period = self.resampler.period_ns
        hop_ns = self.cfg.hop_samples * period
        ready = self.stream_ns - self.resampler.max_staleness_ns
        if self._gap is not None:
            if self.next_end_tick <= self._gap[0]:  # windows before the gap first: compute lag there is judged alone
                ready = min(ready, self._gap[0])
            else:
                self._pass_gap(hop_ns)
        if ready < self.next_end_tick:
            return None
        behind = (ready - self.next_end_tick) // hop_ns if self.cfg.skip_stale_hops else 0
        self.counters.hops_skipped += int(behind)
        if behind:  # the hops take longer than they come: say so, with what to try (counted in hops_skipped)
            self._log.warning("behind", "hops take longer than the hop interval: %d hop(s) skipped, %d in all (fewer "
                              "pairs, screening, a longer hop, or estimator.threads: 1 on a busy machine)", behind,
                              self.counters.hops_skipped)  # fmt: skip
        end = self.next_end_tick + behind * hop_ns
        self.next_end_tick = end + hop_ns
        return int(end)

    def _pass_gap(self, hop_ns: int) -> None:
        """Pass over the hops whose windows end inside the stream's gap (no channel had a sample there): counted in
        hops_in_gaps, not as hops skipped for compute, and said once per gap with the channel that ended it."""
        assert self._gap is not None and self.next_end_tick is not None
        before, after, channel = self._gap
        self._gap = None
        passed = max(0, -(-(after - self.next_end_tick) // hop_ns))
        if not passed:  # already passed over (a replay skips its log's gaps itself)
            return
        self.next_end_tick += passed * hop_ns
        self.counters.hops_in_gaps += passed
        self._log.warning("gap", "stream time jumped %.3f s ahead with channel %.80r: no channel had a sample in "
                          "between (a pause of the whole stream, or a device clock that stepped forward, e.g. stamps "
                          "from its boot then from the epoch); %d hop(s) passed over, %d in all (hops_in_gaps)",
                          (after - before) / 1e9, channel, passed, self.counters.hops_in_gaps)  # fmt: skip

    def due_windows(self) -> Iterator[int]:
        """End ticks (ns) of the windows now due, oldest first, each given out once: a caller that drives
        ``evaluate`` itself (replay, without the event loop) evaluates each. Do not mix with ``start``."""
        while (end := self.due_end_tick()) is not None:
            yield end

    def has_due(self) -> bool:
        if self.next_end_tick is None or self.stream_ns is None:
            return False
        return self.stream_ns - self.resampler.max_staleness_ns >= self.next_end_tick
