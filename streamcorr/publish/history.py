"""MI history on disk: the timeline and the events of a replay, as Parquet (and JSONL for events).

Timeline (``timeline.parquet``): one row per (hop, pair) for every pair assessed at least once by then:

========== ========= =================================================================
column     type      meaning
========== ========= =================================================================
time       float64   stream time of the hop, seconds (end of its window; the snapshot's t_ns / 1e9)
t_ns       int64     the same, nanoseconds (exact)
a, b       string    the pair's channels, a before b in matrix order
mi         float64   nats: the cell's value at this hop
coverage   float32   fraction of the window where both channels had valid samples
age_s      float32   seconds of stream time since the value was computed (0: this hop)
source     string    ``network`` (InfoNet estimate) or ``screen`` (the screen's small-dependence figure)
dependent  bool      the change detector's verdict at this hop; false: not significant; null: not known
n_eff      float32   effective sample size of the pair's newest network window; NaN: none yet
lag_s      float32   the pair's best lag, s; > 0: b follows a (``lags.max_s``); NaN: no significant lag, or off
mi_lag     float32   nats: the MI at that lag; NaN with lag_s
========== ========= =================================================================

Events (``events.parquet`` and ``events.jsonl``, one object per line with the same keys): ``time`` (float64 s),
``t_ns``, ``a``, ``b``, ``change`` (``became-dependent``, ``became-independent``, ``rise``, ``fall``),
``previous`` and ``current`` (nats), ``initial`` (bool: a ``became-dependent`` at the pair's first assessment,
dependent from the start rather than an onset), ``onset_t_ns`` (int64, null without an estimate: the stream time
the change is estimated to have begun; ``time`` and ``t_ns`` stay the time it was detected) and ``path``
(``window`` or ``fast``: the detector that saw it, streamcorr.engine.fast); a ``lag-shift`` (streamcorr.engine.lags)
also fills ``lag_s`` and ``previous_lag_s`` (float64 s, the new and the last reported lag; null for other changes).

Rows are written in row groups as hops arrive, and events line by line, so a stop part way (Ctrl-C) leaves
both files readable with every hop done so far once :meth:`HistoryWriter.close` has run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..engine.changes import ChangeEvent
from ..engine.matrix import SOURCE_NETWORK, SOURCE_NONE, SOURCE_SCREEN, Snapshot
from ..errors import InputError

__all__ = ["EVENT_COLUMNS", "TIMELINE_COLUMNS", "HistoryWriter"]

TIMELINE_COLUMNS = ("time", "t_ns", "a", "b", "mi", "coverage", "age_s", "source", "dependent", "n_eff", "lag_s",
                    "mi_lag")  # fmt: skip
EVENT_COLUMNS = ("time", "t_ns", "a", "b", "change", "previous", "current", "initial", "onset_t_ns", "path", "lag_s",
                 "previous_lag_s")  # fmt: skip
SOURCE_NAMES = {SOURCE_NETWORK: "network", SOURCE_SCREEN: "screen"}
_ROWS_PER_GROUP = 1 << 17


def _pa() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.parquet  # pa.parquet below
    except ImportError:
        raise InputError("writing Parquet needs pyarrow: pip install 'streamcorr[logs]'") from None
    return pa


def timeline_schema() -> Any:
    pa = _pa()
    return pa.schema(
        [
            ("time", pa.float64()),
            ("t_ns", pa.int64()),
            ("a", pa.string()),
            ("b", pa.string()),
            ("mi", pa.float64()),
            ("coverage", pa.float32()),
            ("age_s", pa.float32()),
            ("source", pa.string()),
            ("dependent", pa.bool_()),
            ("n_eff", pa.float32()),
            ("lag_s", pa.float32()),
            ("mi_lag", pa.float32()),
        ]
    )


def event_schema() -> Any:
    pa = _pa()
    fields = [("time", pa.float64()), ("t_ns", pa.int64()), ("a", pa.string()), ("b", pa.string())]
    levels = [("previous", pa.float64()), ("current", pa.float64()), ("initial", pa.bool_())]
    when = [("onset_t_ns", pa.int64()), ("path", pa.string())]
    lags = [("lag_s", pa.float64()), ("previous_lag_s", pa.float64())]  # lag-shift only
    return pa.schema([*fields, ("change", pa.string()), *levels, *when, *lags])


def event_row(ev: ChangeEvent) -> dict[str, Any]:
    a, b = ev.pair
    return {"time": ev.t_ns / 1e9, "t_ns": ev.t_ns, "a": a, "b": b, "change": ev.kind,
            "previous": ev.previous, "current": ev.current, "initial": bool(ev.initial),
            "onset_t_ns": ev.onset_t_ns, "path": ev.path, "lag_s": ev.lag_s,
            "previous_lag_s": ev.previous_lag_s}  # fmt: skip


def snapshot_rows(snap: Snapshot, top_k: int | None = None) -> dict[str, np.ndarray]:
    """Timeline columns of one snapshot: every assessed pair (i < j), or its ``top_k`` strongest."""
    names = np.asarray(snap.channels, dtype=object)
    src = snap.source if snap.source is not None else np.where(np.isnan(snap.mi), SOURCE_NONE, SOURCE_NETWORK)
    i, j = np.triu_indices(len(names), 1)
    keep = src[i, j] != SOURCE_NONE
    i, j = i[keep], j[keep]
    if top_k is not None and len(i) > top_k:
        order = np.argsort(-np.nan_to_num(snap.mi[i, j], nan=-np.inf), kind="stable")[:top_k]
        i, j = i[order], j[order]
    n = len(i)
    # a snapshot made outside MatrixState may not know the verdict: null in the table, not False
    dependent = np.full(n, None, dtype=object) if snap.dependent is None else snap.dependent[i, j].astype(bool)

    def cells(m: np.ndarray | None) -> np.ndarray:
        return np.full(n, np.nan, dtype=np.float32) if m is None else m[i, j].astype(np.float32)

    return {
        "time": np.full(n, snap.t_ns / 1e9),
        "t_ns": np.full(n, snap.t_ns, dtype=np.int64),
        "a": names[i],
        "b": names[j],
        "mi": snap.mi[i, j].astype(np.float64),
        "coverage": snap.coverage[i, j].astype(np.float32),
        "age_s": snap.age_s[i, j].astype(np.float32),
        "source": np.array([SOURCE_NAMES.get(int(s), "none") for s in src[i, j]], dtype=object),
        "dependent": dependent,
        "n_eff": cells(snap.n_eff),
        "lag_s": cells(snap.lag_s),
        "mi_lag": cells(snap.mi_lag),
    }


class HistoryWriter:
    """Appends snapshots and events to ``outdir``'s timeline and event files.

    >>> import tempfile
    >>> from streamcorr.engine.matrix import MatrixState
    >>> st = MatrixState(["x", "y"]); st.update(np.array([0]), np.array([1]), np.array([0.5]), np.array([1.0]), 10**9)
    >>> with tempfile.TemporaryDirectory() as d:
    ...     with HistoryWriter(d) as w:
    ...         w.add(st.snapshot(10**9, 0), [])
    ...     import pyarrow.parquet as pq
    ...     pq.read_table(f"{d}/timeline.parquet").to_pylist()[0]["mi"]
    0.5
    """

    def __init__(self, outdir: str | Path) -> None:
        pa = _pa()
        self.dir = Path(outdir)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._timeline = pa.parquet.ParquetWriter(self.dir / "timeline.parquet", timeline_schema())
            self._jsonl = (self.dir / "events.jsonl").open("w", encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot write to {self.dir}: {exc.strerror or exc} (-o OUTDIR)") from None
        self._pending: list[dict[str, np.ndarray]] = []
        self._pending_rows = 0
        self.events: list[dict[str, Any]] = []
        self.rows = 0
        self.hops = 0

    def add(self, snap: Snapshot, events: list[ChangeEvent]) -> None:
        rows = snapshot_rows(snap)
        self._pending.append(rows)
        n = len(rows["t_ns"])
        self._pending_rows += n
        self.hops += 1
        for ev in events:
            row = event_row(ev)
            self.events.append(row)
            self._jsonl.write(json.dumps(row) + "\n")
        if events:
            self._jsonl.flush()
        if self._pending_rows >= _ROWS_PER_GROUP:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        pa = _pa()
        cols = {c: np.concatenate([p[c] for p in self._pending]) for c in TIMELINE_COLUMNS}
        self._timeline.write_table(pa.table(cols, schema=timeline_schema()))
        self.rows += self._pending_rows
        self._pending, self._pending_rows = [], 0

    def close(self) -> None:
        """Write what is pending and close every file (safe to call twice)."""
        if self._jsonl.closed:
            return
        pa = _pa()
        self._flush()
        self._timeline.close()
        self._jsonl.close()
        cols = {c: [e[c] for e in self.events] for c in EVENT_COLUMNS}
        pa.parquet.write_table(pa.table(cols, schema=event_schema()), self.dir / "events.parquet")

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
