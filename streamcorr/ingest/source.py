"""What every transport source shares: the ingest ledger, rate-limited logging, handing batches to the sink.

The ledger is exact. For one source (one decoder):

* messages published = ``messages`` + ``queue_full`` (+ losses the transport hides: ZeroMQ SUB high-water
  drops and broker-side MQTT drops, which only a ``seq`` field in the payload reveals as ``seq_gaps``);
* items in the decoded messages = ``samples_decoded`` + ``dropped`` (by reason in ``drops``; the decode
  reasons are listed in ``payload``; transports add "frames" and "topic" (ZeroMQ) and "internal", a decoder
  bug, logged with its traceback);
* ``samples_decoded`` = ``samples_handed`` (every decoded sample goes to the sink);
* ``samples_handed`` = ``samples_accepted`` + ``samples_rejected`` (the engine counts its own reasons:
  late, duplicate, non-finite, future (stamped more than ``max_future_s`` ahead of the receive clock),
  unknown channel, bad name and channel limit: see ``Engine.sample_drops``).

Channel names are checked at the door: the decoder refuses (reason ``name``) any name that is not valid
UTF-8, has an unprintable character or is longer than ``max_name_bytes`` (the rule in
:mod:`streamcorr.names`), and topics longer than ``max_topic_bytes`` (reason ``topic``). So no name that
reaches an output can fail to encode, and names cost bounded bytes in every snapshot.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from ..logutil import RateLimitedLog

__all__ = [
    "ArrivalClock",
    "Batch",
    "Gather",
    "IngestCounters",
    "RateLimitedLog",
    "SampleSink",
    "Source",
    "deliver",
]

# (channel, t_s, values) -> samples accepted; Engine.push has this shape.
SampleSink = Callable[[str, np.ndarray, np.ndarray], int]


class Batch(NamedTuple):
    """Samples of one channel from one message: float64 seconds and float64 values of equal length."""

    channel: str
    t_s: np.ndarray
    values: np.ndarray


class Gather:
    """Decoded samples per channel, in order: single samples in lists, arrays as they come; ``batches()`` makes
    one (t_s, values) pair of float64 arrays per channel.

    >>> g = Gather()
    >>> g.sample("a", 1.0, 5.0); g.samples("a", np.array([2.0, 3.0]), np.array([6.0, 7.0])); g.sample("b", 1.0, 0.5)
    >>> [(b.channel, b.t_s.tolist(), b.values.tolist()) for b in g.batches()], g.count
    ([('a', [1.0, 2.0, 3.0], [5.0, 6.0, 7.0]), ('b', [1.0], [0.5])], 4)
    """

    __slots__ = ("_arrays", "_t", "_undo", "_v", "count")

    def __init__(self) -> None:
        self._t: dict[str, list[Any]] = {}  # channel -> floats, or arrays where _arrays holds it
        self._v: dict[str, list[Any]] = {}
        self._arrays: set[str] = set()
        self._undo: list[tuple[str, int]] = []  # (channel, samples) added since begin()
        self.count = 0  # samples gathered

    def begin(self) -> None:
        """A message starts: ``rollback()`` takes back what is added from here."""
        self._undo.clear()

    def rollback(self) -> None:
        """Take back the samples added since ``begin()`` (a message whose decoding failed part-way)."""
        for channel, n in reversed(self._undo):
            self._t[channel].pop()
            self._v[channel].pop()
            self.count -= n
        self._undo.clear()

    def sample(self, channel: str, t_s: float, value: float) -> None:
        ts = self._t.get(channel)
        if ts is None:
            self._t[channel], self._v[channel] = [t_s], [value]
        else:
            ts.append(t_s)
            self._v[channel].append(value)
        self._undo.append((channel, 1))
        self.count += 1

    def samples(self, channel: str, t_s: np.ndarray, values: np.ndarray) -> None:
        self._t.setdefault(channel, []).append(t_s)
        self._v.setdefault(channel, []).append(values)
        self._arrays.add(channel)
        self._undo.append((channel, len(t_s)))
        self.count += len(t_s)

    def batches(self) -> list[Batch]:
        out = []
        for channel, ts in self._t.items():
            vs = self._v[channel]
            if not ts:  # every sample taken back
                continue
            if channel not in self._arrays:
                out.append(Batch(channel, np.array(ts, dtype=np.float64), np.array(vs, dtype=np.float64)))
            elif len(ts) == 1 and isinstance(ts[0], np.ndarray):  # one chunk: no copy
                out.append(Batch(channel, ts[0], vs[0]))
            else:
                t = np.concatenate([np.atleast_1d(np.asarray(x, dtype=np.float64)) for x in ts])
                v = np.concatenate([np.atleast_1d(np.asarray(x, dtype=np.float64)) for x in vs])
                out.append(Batch(channel, t, v))
        return out


@dataclass
class IngestCounters:
    """The ingest ledger of one source (see the module docstring for the identities it satisfies).

    >>> c = IngestCounters()
    >>> c.drop("decode"); c.drop("type", 3)
    >>> c.dropped, c.drops
    (4, {'decode': 1, 'type': 3})
    """

    messages: int = 0  # messages received and handled (decoded, or dropped whole)
    samples_decoded: int = 0
    drops: dict[str, int] = field(default_factory=dict)  # items dropped at decode, by reason
    samples_handed: int = 0  # passed to the sink
    samples_accepted: int = 0  # the sink's return values, summed
    sink_errors: int = 0  # sink calls that raised; their samples count as handed, not accepted
    queue_full: int = 0  # messages discarded undecoded because the bounded incoming queue was full
    seq_gaps: int = 0  # messages missing by the payloads' "seq" numbers (lost before reaching us)
    seq_resets: int = 0  # "seq" went backwards or repeated (publisher restart)
    connects: int = 0
    disconnects: int = 0
    connect_failures: int = 0

    def drop(self, reason: str, n: int = 1) -> None:
        self.drops[reason] = self.drops.get(reason, 0) + n

    @property
    def dropped(self) -> int:
        return sum(self.drops.values())

    @property
    def samples_rejected(self) -> int:
        """Handed to the sink but not accepted by it (the engine says why in its own counters)."""
        return self.samples_handed - self.samples_accepted


class ArrivalClock:
    """Wall-clock seconds that strictly increase, for samples that carry no timestamp of their own.

    float64 epoch seconds resolve about 0.24 us, so two messages decoded back to back could share a
    timestamp and the engine would reject the second as a duplicate; each reading is at least ``min_step_s``
    after the previous one.
    """

    def __init__(self, min_step_s: float = 1e-6) -> None:
        self.min_step_s = min_step_s
        self._last = -math.inf

    def __call__(self) -> float:
        self._last = max(time.time(), self._last + self.min_step_s)
        return self._last


def deliver(batches: Iterable[Batch], sink: SampleSink, counters: IngestCounters, rate_log: RateLimitedLog) -> None:
    """Hand each batch to the sink and book it; a raising sink is counted and logged, never propagated."""
    for batch in batches:
        n = len(batch.t_s)
        counters.samples_handed += n
        try:
            accepted = sink(batch.channel, batch.t_s, batch.values)
        except Exception:
            counters.sink_errors += 1
            rate_log(logging.ERROR, "sink", "sink raised on %d samples of %r", n, batch.channel, exc_info=True)
            continue
        counters.samples_accepted += int(accepted)


@runtime_checkable
class Source(Protocol):
    """One input of the engine; the daemon drives every source through this.

    - ``run()`` receives until cancelled (cancelling is how a source stops: it closes its sockets on the way
      out); broker loss is retried inside with jittered backoff, so it returns or raises only when it cannot
      go on (a port in use, a bad endpoint: a StreamcorrError naming the problem);
    - ``counters``: its ingest ledger (the identities above);
    - ``connected``: True while it holds its connection (a bound ZeroMQ socket always does);
    - ``queue_depth``: messages received and waiting to be decoded (ZeroMQ keeps its queue inside libzmq: 0).
    """

    @property
    def counters(self) -> IngestCounters: ...

    async def run(self) -> None: ...

    @property
    def connected(self) -> bool: ...

    @property
    def queue_depth(self) -> int: ...
