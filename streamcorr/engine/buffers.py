"""Per-channel ring buffers and time alignment (synchronous, pure numpy).

Policy for each channel's timestamps (nanoseconds, int64):
- a sample whose timestamp is not later than the channel's newest accepted one
  is dropped and counted: ``late`` if earlier, ``duplicate`` if equal;
- a non-finite value (NaN, inf) is dropped and counted as ``nonfinite``;
- a sample later than ``max_t_ns`` (when the caller gives one: the engine's receive
  clock plus ``max_future_s``) is dropped and counted as ``future``, and one earlier
  than ``min_t_ns`` (the engine's: no window to come can hold it) as ``late``; like
  the two above, neither raises the bound later samples must pass;
- when the buffer is full the oldest sample is overwritten (``overwritten``):
  memory per channel is fixed at construction, unless its owner grows it
  (``grow``: the engine does, within a bound, for a channel faster than its clock).

Alignment onto a common clock (``Resampler``): at each tick the channel's value
is its newest sample before the boundary to the next tick, if that sample is at
most ``max_staleness_ns`` old; otherwise the channel is invalid (NaN) there. The
boundary starts half a period after the tick and moves, each hop, to where no
channel's stamps fall (``Resampler.place``): offsets, jitter and float seconds
do not move a device off its ticks, and channels stamped a moment apart share one.
A tick is *fresh* for a channel when its sample was not already shown at the tick
before: a channel slower than the clock, or one whose stamps wobble around the
ticks, repeats samples. A row in which both channels of a pair repeat is a copy
of an earlier row and carries no information, and one in which only the slower
channel repeats is a near-copy beside a smooth channel; kept, such rows look like
dependence, so a pair's window holds the ticks where its slower channel has a new
sample (``window.repeated_rows: drop``; ``estimate.significance.pair_rows``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError

__all__ = ["PHASE_BINS", "ChannelCounters", "Resampler", "RingBuffer"]

PHASE_BINS = 32  # the period's bins in which the ticks' boundary is placed (Resampler.place)


@dataclass
class ChannelCounters:
    accepted: int = 0
    late: int = 0
    duplicate: int = 0
    nonfinite: int = 0
    future: int = 0
    overwritten: int = 0

    @property
    def dropped(self) -> int:
        return self.late + self.duplicate + self.nonfinite + self.future


@dataclass
class RingBuffer:
    """Fixed-capacity buffer of (t_ns, value) samples for one channel, in time order.

    >>> buf = RingBuffer(capacity=3)
    >>> buf.push_many(np.array([1, 2, 2, 5]), np.array([0.1, 0.2, 9.0, np.nan]))
    2
    >>> buf.times().tolist(), buf.counters.duplicate, buf.counters.nonfinite
    ([1, 2], 1, 1)
    """

    capacity: int
    counters: ChannelCounters = field(default_factory=ChannelCounters)

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise InputError(f"capacity must be >= 1 sample; got {self.capacity}")
        self._t = np.zeros(self.capacity, dtype=np.int64)
        self._v = np.zeros(self.capacity, dtype=np.float64)
        self._head = 0  # index of the next write
        self._size = 0
        self.last_t_ns: int | None = None
        # pushes come from the event loop while a worker thread reads windows: reads must see one state
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._size

    def push(self, t_ns: int, value: float) -> bool:
        """Append one sample; returns whether it was accepted (see the module policy)."""
        with self._lock:
            return self._push_one(t_ns, value)

    def _push_one(self, t_ns: int, value: float) -> bool:
        if not np.isfinite(value):
            self.counters.nonfinite += 1
            return False
        if self.last_t_ns is not None and t_ns <= self.last_t_ns:
            if t_ns == self.last_t_ns:
                self.counters.duplicate += 1
            else:
                self.counters.late += 1
            return False
        if self._size == self.capacity:
            self.counters.overwritten += 1
        else:
            self._size += 1
        self._t[self._head] = t_ns
        self._v[self._head] = value
        self._head = (self._head + 1) % self.capacity
        self.last_t_ns = int(t_ns)
        self.counters.accepted += 1
        return True

    def push_many(
        self, t_ns: np.ndarray, values: np.ndarray, max_t_ns: int | None = None, min_t_ns: int | None = None
    ) -> int:
        """Append samples in order, refusing those later than max_t_ns or earlier than min_t_ns (if given); returns
        how many were accepted."""
        t_ns = np.asarray(t_ns, dtype=np.int64)
        values = np.asarray(values, dtype=np.float64)
        if t_ns.shape != values.shape or t_ns.ndim != 1:
            raise InputError(f"t_ns and values must be 1-D of equal length; got {t_ns.shape} and {values.shape}")
        if t_ns.size == 0:
            return 0
        with self._lock:
            return self._push_arrays(t_ns, values, max_t_ns, min_t_ns)

    def _push_arrays(
        self, t_ns: np.ndarray, values: np.ndarray, max_t_ns: int | None = None, min_t_ns: int | None = None
    ) -> int:
        finite = np.isfinite(values)
        cand = finite if max_t_ns is None else finite & (t_ns <= max_t_ns)  # candidates: finite, not too far ahead
        self.counters.future += int((finite & ~cand).sum())
        if min_t_ns is not None:  # ... nor too far behind
            old = cand & (t_ns < min_t_ns)
            self.counters.late += int(old.sum())
            cand &= ~old
        # A sample is accepted iff it is later than every earlier candidate (a rejected one never raises that bound).
        floor = np.iinfo(np.int64).min if self.last_t_ns is None else self.last_t_ns
        bound = np.maximum.accumulate(np.concatenate(([floor], np.where(cand, t_ns, floor)[:-1])))
        ok = cand & (t_ns > bound)
        self.counters.nonfinite += int((~finite).sum())
        self.counters.duplicate += int((cand & (t_ns == bound)).sum())
        self.counters.late += int((cand & (t_ns < bound)).sum())
        n = int(ok.sum())
        if n == 0:
            return 0
        t_ok, v_ok = t_ns[ok], values[ok]
        self.counters.overwritten += max(0, self._size + n - self.capacity)
        self.counters.accepted += n
        if n > self.capacity:
            t_ok, v_ok = t_ok[-self.capacity :], v_ok[-self.capacity :]
        skipped = n - len(t_ok)  # more new samples than slots: the first ones are overwritten at once
        idx = (self._head + skipped + np.arange(len(t_ok))) % self.capacity
        self._t[idx] = t_ok
        self._v[idx] = v_ok
        self._head = (self._head + n) % self.capacity
        self._size = min(self.capacity, self._size + n)
        self.last_t_ns = int(t_ok[-1])
        return n

    def oldest_t_ns(self) -> int | None:
        with self._lock:
            return None if self._size == 0 else int(self._t[(self._head - self._size) % self.capacity])

    def grow(self, capacity: int) -> None:
        """A larger buffer holding every sample held now (a smaller capacity changes nothing)."""
        with self._lock:
            if capacity <= self.capacity:
                return
            order = self._order()
            t, v = np.zeros(capacity, dtype=np.int64), np.zeros(capacity, dtype=np.float64)
            t[: self._size], v[: self._size] = self._t[order], self._v[order]
            self._t, self._v, self._head, self.capacity = t, v, self._size % capacity, capacity

    def _order(self) -> np.ndarray:
        start = (self._head - self._size) % self.capacity
        return (start + np.arange(self._size)) % self.capacity

    def times(self) -> np.ndarray:
        return self.contents()[0]

    def values(self) -> np.ndarray:
        return self.contents()[1]

    def contents(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of (times, values), oldest first, taken together so a concurrent push cannot split them."""
        with self._lock:
            order = self._order()
            return self._t[order], self._v[order]

    def phase_counts(self, lo_ns: int, hi_ns: int, period_ns: int, bins: int) -> np.ndarray:
        """How many of the samples stamped in (lo_ns, hi_ns] fall in each of ``bins`` bins of the period (their
        stamps modulo it), read in place: no copy of the buffer."""
        counts = np.zeros(bins, dtype=np.int64)
        with self._lock:
            if self._size == 0:
                return counts
            start, end = (self._head - self._size) % self.capacity, (self._head - 1) % self.capacity + 1
            for t in [self._t[start:end]] if start < end else [self._t[start:], self._t[:end]]:  # each part sorted
                t = t[np.searchsorted(t, lo_ns, "right") : np.searchsorted(t, hi_ns, "right")]
                counts += np.bincount((t % period_ns) * bins // period_ns, minlength=bins)[:bins]
        return counts

    def sample_and_hold(self, ticks_ns: np.ndarray, max_staleness_ns: int, tolerance_ns: int = 0) -> np.ndarray:
        """Value at each tick (ascending int64 ns): newest sample at or before it (or at most tolerance_ns after
        it), NaN if none or too old."""
        return self.hold_fresh(ticks_ns, max_staleness_ns, tolerance_ns)[0]

    def hold_fresh(
        self, ticks_ns: np.ndarray, max_staleness_ns: int, tolerance_ns: int = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        """sample_and_hold's values, and whether each tick shows a sample the tick before did not (fresh)."""
        t, v = self.contents()
        idx, ok = _held(t, ticks_ns, max_staleness_ns, tolerance_ns)
        out = np.full(ticks_ns.shape, np.nan)
        out[ok] = v[idx[ok]]
        fresh = ok.copy()
        fresh[1:] &= idx[1:] != idx[:-1]
        return out, fresh


def _held(t: np.ndarray, ticks_ns: np.ndarray, max_staleness_ns: int, tolerance_ns: int) -> tuple[np.ndarray, ...]:
    """Index into t (ascending) of the sample each tick shows, and whether it shows one (not too old)."""
    idx = np.searchsorted(t, ticks_ns + tolerance_ns, side="right") - 1
    ok = idx >= 0
    ok[ok] = (ticks_ns[ok] - t[idx[ok]]) <= max_staleness_ns
    return idx, ok


class Resampler:
    """Aligns independent channels onto a common clock of ``rate_hz`` by sample-and-hold."""

    def __init__(self, rate_hz: float, max_staleness_s: float) -> None:
        if not rate_hz > 0:
            raise InputError(f"rate_hz must be > 0; got {rate_hz}")
        if not max_staleness_s >= 0:
            raise InputError(f"max_staleness_s must be >= 0; got {max_staleness_s}")
        self.period_ns = round(1e9 / rate_hz)
        self.max_staleness_ns = round(max_staleness_s * 1e9)
        # the boundary (how long after a tick its samples may be stamped) starts half a period on: a device on the
        # clock's rate whose stamps sit a little off the ticks must not wobble between two, repeating and skipping
        self.tolerance_ns = max(0, (self.period_ns - 1) // 2)

    def place(self, buffers: list[RingBuffer], end_ns: int, n: int) -> bool:
        """Move the ticks' boundary (tick k shows samples up to k x period + ``tolerance_ns``) into the widest
        stretch of the period that no channel's stamps in the window fall on (the fewest, where every bin has
        some); True when it moved. A boundary among a channel's stamps makes its jitter wobble samples between
        two ticks (a sample skipped, the one before repeated), and splits channels stamped a moment apart onto
        neighbouring ticks: read against the next sample, a relation of white signals vanishes."""
        period, bins = self.period_ns, PHASE_BINS
        if self.max_staleness_ns < period // 2 or period < bins:  # a boundary before the tick needs the staleness
            return False
        hi = (end_ns // period) * period + period // 2  # the window's stamps only: the same live and replayed
        lo = hi - (n + 1) * period
        score = np.zeros(bins)
        for b in buffers:
            counts = b.phase_counts(lo, hi, period, bins)
            if 0 < (total := int(counts.sum())) <= n + n // 16:  # each channel's share of its stamps in each bin (a
                # channel faster than the clock shows one of several samples at each tick wherever the boundary is)
                score += counts / total
        if not score.any():
            return False
        near = score + np.roll(score, 1) + np.roll(score, -1)  # a bin beside stamps is no place for the boundary
        low = near <= near.min() + 1e-3
        current = (self.tolerance_ns % period) * bins // period
        if near[current] <= near.min() + 0.02:  # within 2% of one channel's stamps of the best: a jittery
            return False  # channel's stamps everywhere would move it every window, restarting every channel's ranks
        start = int(np.argmin(low))  # a bin above the minimum: runs of low bins do not wrap past it
        edges = np.diff(np.concatenate([[0], np.roll(low, -start).astype(np.int8), [0]]))
        begins, widths = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)
        best = len(widths) - 1 - int(np.argmax(widths[::-1]))  # the widest run (the last of equals)
        width, first = int(widths[best]), int(begins[best])
        phase = int((start + first + width / 2) * period / bins) % period  # the widest run's middle, ns
        tolerance = phase if phase <= period // 2 else phase - period  # never more than half a period after a tick
        moved = tolerance != self.tolerance_ns
        self.tolerance_ns = int(tolerance)
        return moved

    def ticks(self, end_ns: int, n: int) -> np.ndarray:
        """The n clock ticks ending at the last tick at or before end_ns (ascending)."""
        last = (end_ns // self.period_ns) * self.period_ns
        return last - self.period_ns * np.arange(n - 1, -1, -1, dtype=np.int64)

    def window(self, buffers: list[RingBuffer], end_ns: int, n: int) -> np.ndarray:
        """(C, n) aligned values of each buffer over the n ticks ending at end_ns; NaN where invalid."""
        return self.window_fresh(buffers, end_ns, n)[0]

    def window_ages(self, buffers: list[RingBuffer], end_ns: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(C, n) aligned values (NaN where invalid) and (C,) the mean age of each channel's held values, in ticks:
        how far, on average, the sample a tick shows lies before the tick (negative: after it, within tolerance)."""
        ticks = self.ticks(end_ns, n)
        values, ages = np.full((len(buffers), n), np.nan), np.zeros(len(buffers))
        for k, b in enumerate(buffers):
            t, v = b.contents()
            idx, ok = _held(t, ticks, self.max_staleness_ns, self.tolerance_ns)
            values[k, ok] = v[idx[ok]]
            if ok.any():
                ages[k] = float(np.mean(ticks[ok] - t[idx[ok]])) / self.period_ns
        return values, ages

    def window_fresh(self, buffers: list[RingBuffer], end_ns: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(C, n) aligned values (NaN where invalid) and (C, n) fresh flags (see the module docstring)."""
        ticks = self.ticks(end_ns, n)
        held = [b.hold_fresh(ticks, self.max_staleness_ns, self.tolerance_ns) for b in buffers]
        if not held:
            return np.zeros((0, n)), np.zeros((0, n), dtype=bool)
        return np.stack([h[0] for h in held]), np.stack([h[1] for h in held])
