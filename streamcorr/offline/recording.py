"""What a recorded log holds once read (:class:`Recording`, one :class:`Series` per channel) and the bounds on
reading it (:class:`ReadLimits`); shared by the table and message readers of :mod:`streamcorr.offline.logs`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InputError

__all__ = ["ReadLimits", "Recording", "Series", "add_series", "need_module", "series_of", "short_list"]

MAX_REASONS = 64  # distinct skip reasons kept; further ones are counted together


@dataclass(frozen=True)
class ReadLimits:
    """What reading one log may make this process hold; beyond a bound, :func:`open_log` raises InputError
    naming the ``replay`` flag that raises it."""

    max_samples: int = 10_000_000  # --max-samples: over all channels (16 bytes each once read)
    max_channels: int = 2048  # --max-channels: table columns, long-table names, message fields
    max_mb: int = 512  # --max-mb: a table's columns in memory, one MCAP record, one decompressed chunk

    @property
    def max_bytes(self) -> int:
        return self.max_mb << 20

    def too_many_samples(self, where: str) -> InputError:
        return InputError(f"{where} holds more than {self.max_samples:,} samples (--max-samples): give a shorter "
                          "log, fewer --channels or --topics, or raise --max-samples (16 bytes a sample)")  # fmt: skip


@dataclass
class Series:
    """One channel: t_ns (n,) int64 nanoseconds, ascending; values (n,) float64, finite."""

    t_ns: np.ndarray
    values: np.ndarray

    @property
    def t(self) -> np.ndarray:
        """The stamps in float seconds (for display and rates; the engine takes t_ns)."""
        return self.t_ns / 1e9

    @property
    def interval_s(self) -> float:
        """The median interval between samples, s (0 with fewer than two)."""
        return float(np.median(np.diff(self.t_ns))) / 1e9 if len(self.t_ns) > 1 else 0.0


@dataclass
class Recording:
    """What a log holds: channels in the log's order, and notes on what was left out and why.

    ``skipped``: what was left out, reason -> count (messages, rows, values); ``reordered``: per channel, the
    samples stamped earlier than a sample before them in the log, which are kept in time order."""

    path: str
    kind: str  # e.g. "CSV (wide)", "MCAP", "ROS 2 bag"
    series: dict[str, Series]
    notes: list[str] = field(default_factory=list)
    topics: dict[str, tuple[str, int]] = field(default_factory=dict)  # message logs: topic -> (type, messages)
    skipped: dict[str, int] = field(default_factory=dict)
    reordered: dict[str, int] = field(default_factory=dict)

    @property
    def n_samples(self) -> int:
        return sum(len(s.t_ns) for s in self.series.values())

    @property
    def t_start(self) -> float:
        return min(float(s.t[0]) for s in self.series.values())

    @property
    def t_end(self) -> float:
        return max(float(s.t[-1]) for s in self.series.values())

    def channel_gaps(self, min_s: float) -> list[tuple[str, int, int]]:
        """Stretches of at least ``min_s`` (and three of its median intervals) in which one channel has no sample
        while another has, as (channel, last stamp before, first stamp after) in ns, in time order."""
        names, lo, hi = [], [], []
        for name, s in self.series.items():
            dt = np.diff(s.t_ns)
            if len(dt):
                at = np.flatnonzero(dt >= max(min_s * 1e9, 3.0 * float(np.median(dt))))
                names += [name] * len(at)
                lo.append(s.t_ns[at])
                hi.append(s.t_ns[at + 1])
        if not names:
            return []
        a, b = np.concatenate(lo), np.concatenate(hi)
        every = np.sort(np.concatenate([s.t_ns for s in self.series.values()]))  # the gap's own channel has none in it
        inside = np.searchsorted(every, b, "left") - np.searchsorted(every, a, "right")
        out = [(names[k], int(a[k]), int(b[k])) for k in np.flatnonzero(inside > 0).tolist()]
        return sorted(out, key=lambda g: (g[1], g[0]))

    def skip(self, reason: str, n: int = 1) -> None:
        """Count n things left out for ``reason`` (a bounded number of reasons; the rest as "other")."""
        if reason not in self.skipped and len(self.skipped) >= MAX_REASONS:
            reason = "other"
        self.skipped[reason] = self.skipped.get(reason, 0) + n

    def describe(self, limit: int = 200) -> str:
        """A listing for ``replay --list``: topics, then channels with samples, span and median rate."""
        lines = [f"{self.path}: {self.kind}, {len(self.series)} channels, {self.n_samples:,} samples"]
        if self.series:
            lines[0] += f", {self.t_end - self.t_start:.3f} s from t = {self.t_start:.3f}"
        for topic, (msgtype, count) in list(self.topics.items())[:limit]:
            lines.append(f"  topic {topic}  [{msgtype}]  {count:,} messages")
        width = min(60, max((len(n) for n in self.series), default=8))
        for name, s in list(self.series.items())[:limit]:
            dt = np.diff(s.t)
            rate = f"{1 / np.median(dt):9.2f} Hz" if len(dt) and np.median(dt) > 0 else "        - Hz"
            lines.append(f"  {name:<{width}}  {len(s.t_ns):>10,} samples  {rate}  t {s.t[0]:.3f} .. {s.t[-1]:.3f}")
        if len(self.series) > limit:
            lines.append(f"  ... and {len(self.series) - limit} more channels")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def note_counts(self) -> None:
        """Notes from the counts of what was skipped and reordered (once, when reading is done)."""
        self.notes.extend(f"{reason}: {n:,}" for reason, n in self.skipped.items())
        if self.reordered:
            worst = sorted(self.reordered.items(), key=lambda kv: -kv[1])[:3]
            self.notes.append(
                f"{sum(self.reordered.values()):,} samples of {len(self.reordered)} channels are stamped earlier than "
                f"a sample before them ({', '.join(f'{n!r}: {k:,}' for n, k in worst)}): replayed in time order (a "
                "live daemon would refuse them as late)"
            )


def need_module(module: str, package: str) -> Any:
    """The module, or an InputError naming the package to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        msg = f"reading this log needs {package}: pip install 'streamcorr[logs]' (or pip install {package})"
        raise InputError(msg) from None


def short_list(names: list[str], limit: int = 12) -> str:
    """Names for a message: the first ``limit``, each cut to 60 characters, and how many more."""
    shown = ", ".join(repr(n) if len(n) < 60 else repr(n[:57] + "...") for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def series_of(t: np.ndarray, values: np.ndarray, t_ok: np.ndarray | None = None) -> tuple[Series, int]:
    """The channel's finite samples in time order, and how many were stamped earlier than one before them."""
    keep = np.isfinite(values) if t_ok is None else t_ok & np.isfinite(values)
    t, values = np.asarray(t, dtype=np.int64)[keep], values[keep]
    late = 0
    if len(t) > 1 and (np.diff(t) < 0).any():
        late = int((t[1:] < np.maximum.accumulate(t)[:-1]).sum())
        order = np.argsort(t, kind="stable")
        t, values = t[order], values[order]
    return Series(np.ascontiguousarray(t), np.ascontiguousarray(values)), late


def add_series(rec: Recording, name: str, s: Series, late: int) -> None:
    """Add a channel made by series_of (if it has samples) and its count of samples out of order."""
    if len(s.t_ns):
        rec.series[name] = s
    if late:
        rec.reordered[name] = late
