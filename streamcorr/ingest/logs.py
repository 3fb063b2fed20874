"""Recorded logs as channels of timestamped samples, for ``streamcorr replay``.

Contract: ``open_log(path, ...)`` returns a :class:`Recording`, one :class:`Series` per channel, each
sorted by time (integer nanoseconds: timestamps and integer times exactly, float seconds rounded to the
nanosecond) with only finite samples; or it
raises :class:`~streamcorr.errors.InputError` naming the file, what is wrong and the flag that fixes it.

Formats (by suffix; ``fmt`` overrides):

* CSV (``,``  ``;`` tab or ``|``, found from the header) and Parquet, either **wide** (a time column and one
  numeric column per channel; an empty cell is no sample) or **long** (time, channel name, value columns;
  chosen when the file has a text column and ``value_column`` or a column named ``value``). Times are numbers
  in ``time_unit`` or timestamps (Parquet timestamp type, ISO text in CSV).
* MCAP (``.mcap``): JSON messages, and ROS 2 messages (CDR with a ``ros2msg`` schema) through
  ``mcap-ros2-support``; the message's log time is its time.
* ROS 1 bags (``.bag``) and ROS 2 bags (a directory with ``metadata.yaml``), through ``rosbags``.

Message fields become channels ``topic.field.subfield`` (the topic without its leading ``/``); numeric arrays
of at most ``MAX_ARRAY`` elements become ``topic.field.0``, ``topic.field.1``, ...; text, booleans, longer
arrays and ``header`` sub-messages are left out. The readers need the ``logs`` extra
(``pip install "streamcorr[logs]"``); a missing package is named in the error.

A recording is held in memory (a float64 time and value per sample): hours of tens of channels at 100 Hz,
not a data lake; give a shorter log or fewer ``topics``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError

__all__ = ["MAX_ARRAY", "Recording", "Series", "open_log"]

MAX_ARRAY = 16  # numeric message arrays longer than this (images, scans, covariances) are not channels
TIME_COLUMNS = ("t", "time", "timestamp", "stamp", "time_s", "t_s")  # tried in order when none is given
_UNIT_S = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


@dataclass
class Series:
    """One channel: t_ns (n,) int64 nanoseconds, ascending; values (n,) float64, finite."""

    t_ns: np.ndarray
    values: np.ndarray

    @property
    def t(self) -> np.ndarray:
        """The stamps in float seconds (for display and rates; the engine takes t_ns)."""
        return self.t_ns / 1e9


@dataclass
class Recording:
    """What a log holds: channels in the log's order, and notes on what was left out and why."""

    path: str
    kind: str  # e.g. "CSV (wide)", "MCAP", "ROS 2 bag"
    series: dict[str, Series]
    notes: list[str] = field(default_factory=list)
    topics: dict[str, tuple[str, int]] = field(default_factory=dict)  # message logs: topic -> (type, messages)

    @property
    def n_samples(self) -> int:
        return sum(len(s.t_ns) for s in self.series.values())

    @property
    def t_start(self) -> float:
        return min(float(s.t[0]) for s in self.series.values())

    @property
    def t_end(self) -> float:
        return max(float(s.t[-1]) for s in self.series.values())

    def describe(self, limit: int = 200) -> str:
        """A listing for ``replay --list``: topics, then channels with samples, span and median rate."""
        lines = [f"{self.path}: {self.kind}, {len(self.series)} channels, {self.n_samples:,} samples"]
        if self.series:
            lines[0] += f", {self.t_end - self.t_start:.3f} s from t = {self.t_start:.3f}"
        for topic, (msgtype, count) in self.topics.items():
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


def open_log(
    path: str | Path,
    *,
    fmt: str | None = None,
    time_column: str | None = None,
    time_unit: str = "s",
    channel_column: str | None = None,
    value_column: str | None = None,
    topics: Iterable[str] | None = None,
) -> Recording:
    """Read a recorded log (see the module docstring); InputError on anything unusable."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file or directory")
    if time_unit not in _UNIT_S:
        raise InputError(f"time unit {time_unit!r} is not one of {', '.join(_UNIT_S)}")
    kind = fmt or _guess_format(p)
    if kind in ("csv", "parquet"):
        table = _read_csv(p) if kind == "csv" else _read_parquet(p)
        rec = _from_table(table, str(p), kind, time_column, time_unit, channel_column, value_column)
    elif kind == "mcap":
        rec = _read_mcap(p, set(topics) if topics else None)
    elif kind in ("bag", "ros2"):
        rec = _read_bag(p, set(topics) if topics else None)
    else:
        raise InputError(f"{p}: unknown log format {kind!r}; use csv, parquet, mcap, bag or ros2")
    if not rec.series:
        why = f" ({'; '.join(rec.notes)})" if rec.notes else ""
        raise InputError(f"{p} holds no numeric channel with samples{why}")
    return rec


def _guess_format(p: Path) -> str:
    if p.is_dir():
        if (p / "metadata.yaml").exists():
            return "ros2"
        raise InputError(f"{p} is a directory without metadata.yaml: give a log file or a ROS 2 bag directory")
    suffix = p.suffix.lower()
    if suffix in (".parquet", ".pq"):
        return "parquet"
    if suffix == ".mcap":
        return "mcap"
    if suffix == ".bag":
        return "bag"
    if suffix == ".db3":
        return "ros2"
    return "csv"


def _need(module: str, package: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        msg = f"reading this log needs {package}: pip install 'streamcorr[logs]' (or pip install {package})"
        raise InputError(msg) from None


# -- tables --------------------------------------------------------------------------------------------
def _read_csv(p: Path) -> Any:
    pa_csv = _need("pyarrow.csv", "pyarrow")
    if not p.is_file():
        raise InputError(f"{p} is not a regular file; give a CSV, Parquet, MCAP or bag file")
    try:
        with p.open(encoding="utf-8-sig") as f:
            header = f.readline(1 << 20)
    except UnicodeDecodeError as exc:
        raise InputError(f"{p} is not UTF-8 text ({exc.reason} at byte {exc.start}): not a CSV file?") from None
    except OSError as exc:
        raise InputError(f"cannot read {p}: {exc.strerror or exc}") from None
    if not header.strip():
        raise InputError(f"{p} is empty: expected a header row naming the columns, then data rows")
    delimiter = max(",;\t|", key=header.count) if any(c in header for c in ",;\t|") else ","
    try:
        return pa_csv.read_csv(
            p,
            parse_options=pa_csv.ParseOptions(delimiter=delimiter),
            convert_options=pa_csv.ConvertOptions(strings_can_be_null=True),
        )
    except Exception as exc:  # pyarrow's ArrowInvalid and friends: one meaning to the user
        raise InputError(f"{p} is not a readable CSV file: {str(exc).splitlines()[0][:300]}") from None


def _read_parquet(p: Path) -> Any:
    pq = _need("pyarrow.parquet", "pyarrow")
    try:
        return pq.read_table(p)
    except Exception as exc:  # missing, truncated or not Parquet at all
        raise InputError(f"cannot read {p} as Parquet: {str(exc).splitlines()[0][:300]}") from None


_UNIT_NS = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
_MAX_NS = 2**63 - 1


def _times_ns(col: Any, unit: str, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(t_ns int64, usable) of a time column: timestamps and integers exactly, floats rounded to the ns; a
    missing, non-finite or out-of-range stamp is not usable (its row is left out)."""
    import pyarrow as pa
    import pyarrow.types as pt

    if pt.is_timestamp(col.type) or pt.is_date(col.type):
        ns = col.cast(pa.timestamp("ns")).cast(pa.int64()).to_numpy(zero_copy_only=False)
        arr = np.asarray(ns, dtype=np.float64)  # nulls come back as NaN
        ok = np.isfinite(arr)
        return np.where(ok, np.nan_to_num(arr), 0).astype(np.int64), ok
    scale = _UNIT_NS[unit]
    if pt.is_integer(col.type) and col.null_count == 0:
        raw = np.asarray(col.to_numpy(zero_copy_only=False))
        ok = np.abs(raw.astype(np.float64)) * scale <= 9.2e18
        return np.where(ok, raw, 0).astype(np.int64) * scale, ok
    if pt.is_integer(col.type) or pt.is_floating(col.type):
        t = np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64) * scale
        ok = np.isfinite(t) & (np.abs(t) <= 9.2e18)
        return np.round(np.where(ok, t, 0.0)).astype(np.int64), ok
    raise InputError(f"{where}: the time column holds {col.type}, not numbers or timestamps; see --time-column")


def _numeric(arrow_type: Any) -> bool:
    import pyarrow.types as pt

    return bool(pt.is_integer(arrow_type) or pt.is_floating(arrow_type))


def _from_table(
    tab: Any,
    where: str,
    kind: str,
    time_column: str | None,
    unit: str,
    channel_column: str | None,
    value_column: str | None,
) -> Recording:
    import pyarrow.types as pt

    names = list(tab.column_names)
    if tab.num_rows == 0:
        raise InputError(f"{where} has a header but no data rows")
    if time_column is None:
        lower = {n.lower(): n for n in names}
        time_column = next((lower[c] for c in TIME_COLUMNS if c in lower), None)
        if time_column is None:
            raise InputError(f"{where}: which column is time? none is named {'/'.join(TIME_COLUMNS)}; "
                             f"pass --time-column (columns: {_short(names)})")  # fmt: skip
    if time_column not in names:
        raise InputError(f"{where}: no column {time_column!r} (--time-column); columns: {_short(names)}")
    t, t_ok = _times_ns(tab.column(time_column), unit, where)
    text = [n for n in names if n != time_column and (pt.is_string(tab.column(n).type) or
                                                      pt.is_large_string(tab.column(n).type))]  # fmt: skip
    lower = {n.lower(): n for n in names}
    long_form = channel_column is not None or value_column is not None or (bool(text) and "value" in lower)
    if long_form:
        channel_column = channel_column or lower.get("channel") or lower.get("name") or (text[0] if text else None)
        value_column = value_column or lower.get("value")
        if channel_column not in names or value_column not in names:
            raise InputError(f"{where}: a long-form log needs a channel-name column and a value column "
                             f"(--channel-column, --value-column); columns: {_short(names)}")  # fmt: skip
        if not _numeric(tab.column(value_column).type):
            raise InputError(f"{where}: value column {value_column!r} holds {tab.column(value_column).type}, "
                             "not numbers")  # fmt: skip
        chan = np.asarray(tab.column(channel_column).to_numpy(zero_copy_only=False), dtype=object)
        vals = np.asarray(tab.column(value_column).to_numpy(zero_copy_only=False), dtype=np.float64)
        chan = np.where(chan == None, "", chan).astype(str)  # noqa: E711 (elementwise)
        uniq, first = np.unique(chan, return_index=True)
        series = {}
        for name in uniq[np.argsort(first)]:  # channels in order of first appearance
            if name:
                rows = chan == name
                series[str(name)] = _series(t[rows], vals[rows], t_ok[rows])
        rec = Recording(where, f"{kind.upper() if kind == 'csv' else 'Parquet'} (long)", {})
        rec.series = {n: s for n, s in series.items() if len(s.t_ns)}
        return rec
    rec = Recording(where, f"{kind.upper() if kind == 'csv' else 'Parquet'} (wide)", {})
    skipped = []
    for n in names:
        if n == time_column:
            continue
        col = tab.column(n)
        if not _numeric(col.type):
            skipped.append(n)
            continue
        s = _series(t, np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64), t_ok)
        if len(s.t_ns):
            rec.series[n] = s
    if skipped:
        rec.notes.append(f"columns without numbers left out: {_short(skipped)}")
    return rec


def _series(t: np.ndarray, values: np.ndarray, t_ok: np.ndarray | None = None) -> Series:
    keep = np.isfinite(values) if t_ok is None else t_ok & np.isfinite(values)
    t, values = np.asarray(t, dtype=np.int64)[keep], values[keep]
    if len(t) > 1 and (np.diff(t) < 0).any():
        order = np.argsort(t, kind="stable")
        t, values = t[order], values[order]
    return Series(np.ascontiguousarray(t), np.ascontiguousarray(values))


def _short(names: list[str], limit: int = 12) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


# -- messages ------------------------------------------------------------------------------------------
def flatten(prefix: str, msg: Any) -> Iterator[tuple[str, float]]:
    """(channel, value) for each numeric field of a decoded message (dict, ROS message object or sequence)."""
    if isinstance(msg, bool) or msg is None or isinstance(msg, str | bytes):
        return
    if isinstance(msg, int | float | np.integer | np.floating):
        v = float(msg)
        if math.isfinite(v):
            yield prefix, v
        return
    if isinstance(msg, np.ndarray):
        if msg.ndim == 1 and len(msg) <= MAX_ARRAY and msg.dtype.kind in "iuf":
            for k, v in enumerate(msg.tolist()):
                yield from flatten(f"{prefix}.{k}", v)
        return
    if isinstance(msg, list | tuple):
        if len(msg) <= MAX_ARRAY:
            for k, v in enumerate(msg):
                yield from flatten(f"{prefix}.{k}", v)
        return
    items: Iterable[tuple[str, Any]]
    if isinstance(msg, dict):
        items = msg.items()
    elif hasattr(msg, "__dataclass_fields__"):  # rosbags messages
        items = ((k, getattr(msg, k)) for k in msg.__dataclass_fields__)
    elif hasattr(msg, "__slots__"):  # mcap-ros2-support's generated classes
        items = ((k, getattr(msg, k)) for k in msg.__slots__ if not k.startswith("_"))
    else:
        return
    for key, value in items:
        if key == "header" or key == "__msgtype__":  # frame ids and stamps are not signals
            continue
        yield from flatten(f"{prefix}.{key}" if prefix else str(key), value)


class _Collector:
    """Samples per channel from decoded messages, in arrival order (sorted at the end)."""

    def __init__(self, where: str, kind: str) -> None:
        self.rec = Recording(where, kind, {})
        self.t: dict[str, list[int]] = {}
        self.v: dict[str, list[float]] = {}
        self.counts: dict[str, int] = {}
        self.types: dict[str, str] = {}

    def add(self, topic: str, msgtype: str, t_ns: int, msg: Any) -> None:
        self.counts[topic] = self.counts.get(topic, 0) + 1
        self.types[topic] = msgtype
        for name, value in flatten(topic.lstrip("/"), msg):
            if name not in self.t:
                self.t[name], self.v[name] = [], []
            self.t[name].append(int(t_ns))
            self.v[name].append(value)

    def done(self) -> Recording:
        self.rec.topics = {k: (self.types[k], self.counts[k]) for k in self.counts}
        for name in self.t:
            self.rec.series[name] = _series(np.array(self.t[name], dtype=np.int64), np.array(self.v[name]))
        return self.rec


def _read_mcap(p: Path, topics: set[str] | None) -> Recording:
    reader_mod = _need("mcap.reader", "mcap")
    out = _Collector(str(p), "MCAP")
    decoders: dict[int, Any] = {}
    left_out: dict[str, str] = {}
    try:
        with p.open("rb") as f:
            reader = reader_mod.make_reader(f)
            for schema, channel, message in reader.iter_messages(topics=list(topics) if topics else None):
                if channel.id not in decoders:
                    decoders[channel.id] = _mcap_decoder(schema, channel, left_out)
                decode = decoders[channel.id]
                if decode is None:
                    continue
                try:
                    msg = decode(message.data)
                except Exception as exc:  # one undecodable message is skipped and counted, not fatal
                    left_out.setdefault(channel.topic, f"undecodable message ({type(exc).__name__})")
                    continue
                out.add(channel.topic, schema.name if schema else channel.message_encoding, message.log_time, msg)
    except InputError:
        raise
    except OSError as exc:
        raise InputError(f"cannot read {p}: {exc.strerror or exc}") from None
    except Exception as exc:  # mcap's McapError, struct errors on truncated files, ...
        raise InputError(f"{p} is not a readable MCAP file: {type(exc).__name__}: {str(exc)[:300]}") from None
    rec = out.done()
    rec.notes.extend(f"topic {t}: {why}" for t, why in left_out.items())
    return rec


def _mcap_decoder(schema: Any, channel: Any, left_out: dict[str, str]) -> Any:
    enc = channel.message_encoding
    if enc == "json":
        return lambda data: json.loads(data)
    if enc == "cdr" and schema is not None and schema.encoding in ("ros2msg", "ros2idl"):
        ros2 = _need("mcap_ros2.decoder", "mcap-ros2-support")
        return ros2.DecoderFactory().decoder_for(enc, schema)
    left_out[channel.topic] = f"message encoding {enc!r} is not read (JSON and ROS 2 CDR are)"
    return None


def _read_bag(p: Path, topics: set[str] | None) -> Recording:
    highlevel = _need("rosbags.highlevel", "rosbags")
    typesys = _need("rosbags.typesys", "rosbags")
    kind = "ROS 1 bag" if p.suffix.lower() == ".bag" else "ROS 2 bag"
    out = _Collector(str(p), kind)
    left_out: dict[str, str] = {}
    try:  # ROS 2 bags before Iron carry no message definitions: the Humble types are the default
        store = typesys.get_typestore(typesys.Stores.ROS2_HUMBLE)
        with highlevel.AnyReader([p], default_typestore=store) as reader:
            conns = [c for c in reader.connections if topics is None or c.topic in topics]
            for conn, t_ns, raw in reader.messages(connections=conns):
                try:
                    msg = reader.deserialize(raw, conn.msgtype)
                except Exception as exc:  # an unknown type or a damaged message: that topic is noted
                    left_out.setdefault(conn.topic, f"cannot decode {conn.msgtype} ({type(exc).__name__})")
                    continue
                out.add(conn.topic, conn.msgtype, t_ns, msg)
    except InputError:
        raise
    except Exception as exc:  # rosbags' AnyReaderError, ReaderError, ...
        raise InputError(f"{p} is not a readable ROS bag: {type(exc).__name__}: {str(exc)[:300]}") from None
    rec = out.done()
    rec.notes.extend(f"topic {t}: {why}" for t, why in left_out.items())
    return rec
