"""Recorded logs as channels of timestamped samples, for ``streamcorr replay``.

Contract: ``open_log(path, ...)`` returns a :class:`Recording`, one :class:`Series` per channel, each
sorted by time (integer nanoseconds: timestamps and integer times exactly, float seconds rounded to the
nanosecond) with only finite samples; or it
raises :class:`~streamcorr.errors.InputError` naming the file, what is wrong and the flag that fixes it.

Formats (by suffix; ``fmt`` overrides):

* CSV (``,``  ``;`` tab or ``|``, found from the header) and Parquet, either **wide** (a time column and one
  numeric column per channel; an empty cell is no sample) or **long** (time, channel name, value columns;
  chosen when the file has a text column and ``value_column`` or a column named ``value``). Times are numbers
  in ``time_unit`` or timestamps (Parquet timestamp type, ISO text in CSV). Text columns may be
  dictionary-encoded. Numeric times that would lie beyond the year 5000 in ``time_unit`` (epoch
  milliseconds read as seconds, ...) are refused with the unit they look like.
* MCAP (``.mcap``): JSON messages, and ROS 2 messages (CDR with a ``ros2msg`` schema) through
  ``mcap-ros2-support``; the message's log time is its time. The file is read record by record: a file cut
  short (a recorder that crashed) is read up to the cut, with a note.
* ROS 1 bags (``.bag``) and ROS 2 bags (a directory with ``metadata.yaml``), through ``rosbags``.

Message fields become channels ``topic.field.subfield`` (the topic without its leading ``/``); numeric arrays
of at most ``MAX_ARRAY`` elements become ``topic.field.0``, ``topic.field.1``, ...; text, booleans, longer
arrays and ``header`` sub-messages are left out. A message that cannot be decoded or read (a number beyond
float range, fields nested deeper than ``MAX_DEPTH``, a log time beyond int64 ns) is skipped and counted in
``Recording.skipped``, never fatal. The readers need the ``logs`` extra (``pip install "streamcorr[logs]"``);
a missing package is named in the error.

Order: each channel is sorted by time. Samples stamped earlier than one before them in the file (which a
live daemon would refuse as late) are kept in time order and counted per channel in ``Recording.reordered``.

Bounds (:class:`ReadLimits`, each with its ``replay`` flag): at most ``max_samples`` samples over all
channels (16 bytes each in memory), ``max_channels`` channels, and ``max_mb`` MiB for a table's columns in
memory, one MCAP record or one decompressed MCAP chunk; a CSV row must fit in ``CSV_BLOCK_BYTES``. Beyond a
bound the reader stops with an InputError naming the flag; message fields of channels beyond
``max_channels`` are left out and counted instead.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import struct
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError

__all__ = ["CSV_BLOCK_BYTES", "MAX_ARRAY", "MAX_DEPTH", "ReadLimits", "Recording", "Series", "open_log", "read_table"]

MAX_ARRAY = 16  # numeric message arrays longer than this (images, scans, covariances) are not channels
MAX_DEPTH = 32  # nesting of a message's fields; deeper messages are skipped (Python's stack is the limit)
TIME_COLUMNS = ("t", "time", "timestamp", "stamp", "time_s", "t_s")  # tried in order when none is given
CSV_BLOCK_BYTES = 4 << 20  # a CSV is parsed this many bytes at a time: no row may be longer
MAX_TIME_S = 1e11  # numeric times past this (year ~5100) are in a finer unit than they were read in
_MAX_TOPICS = 65536  # MCAP channels (topics) remembered; messages on more are skipped and counted
_MAX_REASONS = 64  # distinct skip reasons kept; further ones are counted together


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

    def skip(self, reason: str, n: int = 1) -> None:
        """Count n things left out for ``reason`` (a bounded number of reasons; the rest as "other")."""
        if reason not in self.skipped and len(self.skipped) >= _MAX_REASONS:
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

    def _note_counts(self) -> None:
        self.notes.extend(f"{reason}: {n:,}" for reason, n in self.skipped.items())
        if self.reordered:
            worst = sorted(self.reordered.items(), key=lambda kv: -kv[1])[:3]
            self.notes.append(
                f"{sum(self.reordered.values()):,} samples of {len(self.reordered)} channels are stamped earlier than "
                f"a sample before them ({', '.join(f'{n!r}: {k:,}' for n, k in worst)}): replayed in time order (a "
                "live daemon would refuse them as late)"
            )


def open_log(
    path: str | Path,
    *,
    fmt: str | None = None,
    time_column: str | None = None,
    time_unit: str = "s",
    channel_column: str | None = None,
    value_column: str | None = None,
    topics: Iterable[str] | None = None,
    channels: Iterable[str] | None = None,
    limits: ReadLimits | None = None,
) -> Recording:
    """Read a recorded log (see the module docstring); InputError on anything unusable. ``channels``: read only
    these (the others are not held in memory)."""
    p = Path(path)
    lim = limits or ReadLimits()
    if not p.exists():
        raise InputError(f"{p}: no such file or directory")
    if time_unit not in _UNIT_NS:
        raise InputError(f"time unit {time_unit!r} is not one of {', '.join(_UNIT_NS)}")
    kind = fmt or _guess_format(p)
    wanted = set(channels) if channels else None
    if kind in ("csv", "parquet"):
        spec = _TableSpec(time_column, time_unit, channel_column, value_column, wanted)
        rec = _from_table((_read_csv if kind == "csv" else _read_parquet)(p, spec, lim), str(p), kind, spec, lim)
    elif kind == "mcap":
        rec = _read_mcap(p, set(topics) if topics else None, wanted, lim)
    elif kind in ("bag", "ros2"):
        rec = _read_bag(p, set(topics) if topics else None, wanted, lim)
    else:
        raise InputError(f"{p}: unknown log format {kind!r}; use csv, parquet, mcap, bag or ros2")
    rec._note_counts()
    if wanted is not None and (missing := [c for c in channels or () if c not in rec.series]):
        raise InputError(f"--channels: {_short(missing)} not in {p} (or without samples); see --list")
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


def _short(names: list[str], limit: int = 12) -> str:
    shown = ", ".join(repr(n) if len(n) < 60 else repr(n[:57] + "...") for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _series(t: np.ndarray, values: np.ndarray, t_ok: np.ndarray | None = None) -> tuple[Series, int]:
    """The channel's finite samples in time order, and how many were stamped earlier than one before them."""
    keep = np.isfinite(values) if t_ok is None else t_ok & np.isfinite(values)
    t, values = np.asarray(t, dtype=np.int64)[keep], values[keep]
    late = 0
    if len(t) > 1 and (np.diff(t) < 0).any():
        late = int((t[1:] < np.maximum.accumulate(t)[:-1]).sum())
        order = np.argsort(t, kind="stable")
        t, values = t[order], values[order]
    return Series(np.ascontiguousarray(t), np.ascontiguousarray(values)), late


# -- tables --------------------------------------------------------------------------------------------
_UNIT_NS = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
_UNIT_NAME = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}


@dataclass
class _TableSpec:
    time_column: str | None
    unit: str
    channel_column: str | None
    value_column: str | None
    channels: set[str] | None


@dataclass
class _Plan:
    """Which columns of a table are read, and as what."""

    time: str
    long: bool
    channel: str | None = None
    value: str | None = None
    numeric: list[str] = field(default_factory=list)  # wide: the channel columns read
    skipped: list[str] = field(default_factory=list)  # wide: columns without numbers

    @property
    def columns(self) -> list[str]:
        return [self.time, str(self.channel), str(self.value)] if self.long else [self.time, *self.numeric]


@dataclass
class _Loaded:
    """A table read for a plan; the reader hands it over once, so its memory goes with the last use."""

    tab: Any
    plan: _Plan
    bad_rows: int = 0  # CSV rows without the header's number of fields, skipped


def _is_text(t: Any) -> bool:
    import pyarrow.types as pt

    if pt.is_dictionary(t):
        t = t.value_type
    return bool(pt.is_string(t) or pt.is_large_string(t))


def _is_numeric(t: Any) -> bool:
    import pyarrow.types as pt

    if pt.is_dictionary(t):
        t = t.value_type
    return bool(pt.is_integer(t) or pt.is_floating(t))


def _plain(col: Any) -> Any:
    """A dictionary-encoded column as its values (numbers and times; names are grouped by their codes)."""
    import pyarrow.compute as pc
    import pyarrow.types as pt

    return pc.cast(col, col.type.value_type) if pt.is_dictionary(col.type) else col


def _check_width(n_columns: int, where: str, lim: ReadLimits) -> None:
    if n_columns > lim.max_channels + 64:  # a few text columns beside the channels
        raise InputError(f"{where} has {n_columns:,} columns, more than --max-channels ({lim.max_channels:,}) "
                         "allows: raise --max-channels, or give a narrower table")  # fmt: skip


def _check_names(names: list[str], where: str, lim: ReadLimits) -> None:
    from collections import Counter

    _check_width(len(names), where, lim)
    dup = [n for n, k in Counter(names).items() if k > 1]
    if dup:
        raise InputError(f"{where}: column name(s) {_short(dup)} appear more than once: give each column its own name")


def _plan(names: list[str], types: dict[str, Any], where: str, spec: _TableSpec, lim: ReadLimits) -> _Plan:
    _check_names(names, where, lim)
    lower = {n.lower(): n for n in names}
    time = spec.time_column
    if time is None:
        time = next((lower[c] for c in TIME_COLUMNS if c in lower), None)
        if time is None:
            raise InputError(f"{where}: which column is time? none is named {'/'.join(TIME_COLUMNS)}; "
                             f"pass --time-column (columns: {_short(names)})")  # fmt: skip
    if time not in names:
        raise InputError(f"{where}: no column {time!r} (--time-column); columns: {_short(names)}")
    text = [n for n in names if n != time and _is_text(types[n])]
    if spec.channel_column is not None or spec.value_column is not None or (bool(text) and "value" in lower):
        channel = spec.channel_column or lower.get("channel") or lower.get("name") or (text[0] if text else None)
        value = spec.value_column or lower.get("value")
        if channel not in names or value not in names:
            raise InputError(f"{where}: a long-form log needs a channel-name column and a value column "
                             f"(--channel-column, --value-column); columns: {_short(names)}")  # fmt: skip
        return _Plan(time, True, channel, value)
    numeric = [n for n in names if n != time and _is_numeric(types[n])]
    skipped = [n for n in names if n != time and n not in set(numeric)]
    if spec.channels is not None:
        numeric = [n for n in numeric if n in spec.channels]
    if len(numeric) > lim.max_channels:
        raise InputError(f"{where} has {len(numeric):,} numeric columns, more than --max-channels "
                         f"({lim.max_channels:,}): pick some with --channels, or raise --max-channels")  # fmt: skip
    return _Plan(time, False, numeric=numeric, skipped=skipped)


def _csv_header(p: Path, lim: ReadLimits) -> str:
    """The delimiter: the most frequent of , ; tab | in the header (at most max_channels + 64 fields)."""
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
    _check_width(header.count(delimiter) + 1, str(p), lim)  # before pyarrow makes a builder for each
    if len(header) >= 1 << 20 and not header.endswith("\n"):
        raise InputError(f"{p}: the header row is longer than 1 MiB: not a CSV log?")
    return delimiter


def _csv_reader(p: Path, delimiter: str, bad: list[int], **convert: Any) -> Any:
    pa_csv = _need("pyarrow.csv", "pyarrow")

    def invalid_row(_row: Any) -> str:  # a row with more or fewer fields than the header: skipped, counted
        bad[0] += 1
        return "skip"

    return pa_csv.open_csv(
        p,
        read_options=pa_csv.ReadOptions(block_size=CSV_BLOCK_BYTES),
        parse_options=pa_csv.ParseOptions(delimiter=delimiter, invalid_row_handler=invalid_row),
        convert_options=pa_csv.ConvertOptions(strings_can_be_null=True, **convert),
    )


def _csv_error(p: Path, exc: BaseException) -> InputError:
    first = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
    if "straddl" in first:
        return InputError(f"{p}: a row is longer than {CSV_BLOCK_BYTES >> 20} MiB (or a quote is never closed): "
                          "not a CSV log?")  # fmt: skip
    if "UTF8" in first or "UTF-8" in first:
        return InputError(f"{p} is not UTF-8 text: not a CSV file? ({first})")
    return InputError(f"{p} is not a readable CSV file: {first}")


def _csv_schema(p: Path, delimiter: str, lim: ReadLimits) -> tuple[list[str], dict[str, Any]]:
    """Column names and the types inferred from the first block (null and integer columns as float64)."""
    import pyarrow as pa
    import pyarrow.types as pt

    try:
        reader = _csv_reader(p, delimiter, [0])
        schema = reader.schema
        reader.close()
    except Exception as exc:  # pyarrow's ArrowInvalid and friends: one meaning to the user
        raise _csv_error(p, exc) from None
    names = list(schema.names)
    _check_names(names, str(p), lim)
    types = {f.name: pa.float64() if pt.is_null(f.type) or pt.is_integer(f.type) else f.type for f in schema}
    return names, types


def _scan_csv(p: Path, delimiter: str, names: list[str], types: dict[str, Any], include: list[str], per_row: int,
              lim: ReadLimits) -> tuple[Any, int]:  # fmt: skip
    """The ``include`` columns, a block at a time within the limits; a column whose type changes part way
    (an integer column with a fraction, a number column with text) is read again as the wider type."""
    import pyarrow as pa
    import pyarrow.types as pt

    for _attempt in range(8):
        bad = [0]
        try:
            reader = _csv_reader(p, delimiter, bad, column_types=types, include_columns=include)
            batches, nbytes, rows = [], 0, 0
            for batch in reader:
                nbytes += batch.nbytes
                rows += batch.num_rows
                if nbytes > lim.max_bytes:
                    raise InputError(f"{p}: its columns take more than {lim.max_mb} MiB in memory (--max-mb): give "
                                     "a shorter log or fewer --channels, or raise --max-mb")  # fmt: skip
                if rows * per_row > lim.max_samples:
                    raise lim.too_many_samples(str(p))
                batches.append(batch)
            return pa.Table.from_batches(batches, schema=reader.schema), bad[0]
        except InputError:
            raise
        except Exception as exc:
            m = re.search(r"CSV column #(\d+).*?conversion error to (\w+)", str(exc))
            if m is None or int(m.group(1)) >= len(names) or m.group(2) == "string":
                raise _csv_error(p, exc) from None
            name = names[int(m.group(1))]
            widen = pt.is_integer(types.get(name, pa.null())) or m.group(2) == "null"
            types[name] = pa.float64() if widen else pa.string()
    raise InputError(f"{p}: the types of its columns keep changing part way through: not a CSV log?")


def _read_csv(p: Path, spec: _TableSpec, lim: ReadLimits) -> _Loaded:
    import pyarrow as pa
    import pyarrow.types as pt

    delimiter = _csv_header(p, lim)
    names, inferred = _csv_schema(p, delimiter, lim)
    plan = _plan(names, inferred, str(p), spec, lim)
    types = {n: pa.float64() for n in plan.columns}
    if pt.is_timestamp(inferred[plan.time]) or pt.is_integer(inferred[plan.time]):
        types[plan.time] = inferred[plan.time]
    if plan.long:
        types[str(plan.channel)] = pa.string()
    per_row = 1 if plan.long else max(1, len(plan.numeric))
    tab, bad = _scan_csv(p, delimiter, names, types, plan.columns, per_row, lim)
    return _Loaded(tab, plan, bad)


def _read_parquet(p: Path, spec: _TableSpec, lim: ReadLimits) -> _Loaded:
    pq = _need("pyarrow.parquet", "pyarrow")
    try:
        pf = pq.ParquetFile(p)
        schema, md = pf.schema_arrow, pf.metadata
    except Exception as exc:  # missing, truncated or not Parquet at all
        raise InputError(f"cannot read {p} as Parquet: {str(exc).splitlines()[0][:300]}") from None
    names = list(schema.names)
    plan = _plan(names, {f.name: f.type for f in schema}, str(p), spec, lim)
    _parquet_bounds(p, md, plan.columns, 1 if plan.long else max(1, len(plan.numeric)), lim)
    text = [c for c in plan.columns if _is_text(schema.field(c).type)]
    try:  # names as dictionaries: codes and one copy of each name, however long the names
        tab = pq.read_table(p, columns=plan.columns, read_dictionary=text)
    except Exception as exc:
        raise InputError(f"cannot read {p} as Parquet: {str(exc).splitlines()[0][:300]}") from None
    return _Loaded(tab, plan)


def _parquet_bounds(p: Path, md: Any, columns: list[str], per_row: int, lim: ReadLimits) -> None:
    """Refuse from the footer, before any page is read: too many samples, or columns too large in memory."""
    if md.num_rows * per_row > lim.max_samples:
        raise lim.too_many_samples(str(p))
    wanted = set(columns)
    held = md.num_rows * 8 * len(columns)  # as Arrow holds them: 8 bytes a number, at most 8 a name's code
    stored = 0  # decompressed pages, dictionaries included
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        stored += sum(rg.column(j).total_uncompressed_size for j in range(rg.num_columns)
                      if rg.column(j).path_in_schema in wanted)  # fmt: skip
        if max(held, stored) > lim.max_bytes:
            raise InputError(f"{p}: its columns take more than {lim.max_mb} MiB in memory (--max-mb): give a "
                             "shorter log or fewer --channels, or raise --max-mb")  # fmt: skip


def read_table(path: str | Path, *, limits: ReadLimits | None = None) -> tuple[Any, int]:
    """Every column of a CSV or Parquet table (a pyarrow Table; CSV header names stripped of spaces) within
    ``limits``, and the number of CSV rows skipped for having another number of fields than the header."""
    p = Path(path)
    lim = limits or ReadLimits()
    if not p.exists():
        raise InputError(f"cannot read {p}: No such file or directory")
    if p.suffix.lower() in (".parquet", ".pq"):
        pq = _need("pyarrow.parquet", "pyarrow")
        try:
            pf = pq.ParquetFile(p)
            names = list(pf.schema_arrow.names)
            _check_names(names, str(p), lim)
            _parquet_bounds(p, pf.metadata, names, max(1, len(names)), lim)
            return pq.read_table(p), 0
        except InputError:
            raise
        except Exception as exc:
            raise InputError(f"cannot read {p} as Parquet: {str(exc).splitlines()[0][:300]}") from None
    delimiter = _csv_header(p, lim)
    names, types = _csv_schema(p, delimiter, lim)
    tab, bad = _scan_csv(p, delimiter, names, types, names, max(1, len(names)), lim)
    stripped = [n.strip() for n in names]
    _check_names(stripped, str(p), lim)
    return tab.rename_columns(stripped), bad


def _times_ns(col: Any, unit: str, where: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(t_ns int64, usable) of a time column: timestamps and integers exactly, floats rounded to the ns; a
    missing, non-finite or out-of-range stamp is not usable (its row is left out). Numbers that would put
    the samples past MAX_TIME_S in ``unit`` are refused, naming the unit they look like."""
    import pyarrow as pa
    import pyarrow.types as pt

    if pt.is_timestamp(col.type) or pt.is_date(col.type):
        ns = col.cast(pa.timestamp("ns")).cast(pa.int64()).to_numpy(zero_copy_only=False)
        arr = np.asarray(ns, dtype=np.float64)  # nulls come back as NaN
        ok = np.isfinite(arr)
        return np.where(ok, np.nan_to_num(arr), 0).astype(np.int64), ok
    if not (pt.is_integer(col.type) or pt.is_floating(col.type)):
        raise InputError(f"{where}: the time column holds {col.type}, not numbers or timestamps; see --time-column")
    scale = _UNIT_NS[unit]
    raw = np.asarray(col.to_numpy(zero_copy_only=False))
    as_float = np.asarray(raw, dtype=np.float64)  # no copy of a float column (nulls are NaN)
    typical = _typical(as_float)
    if typical * scale / 1e9 > MAX_TIME_S:
        finer = [u for u in ("ms", "us", "ns") if _UNIT_NS[u] < scale and typical * _UNIT_NS[u] / 1e9 <= MAX_TIME_S]
        hint = (f": epoch {_UNIT_NAME[finer[0]]}? pass --time-unit {finer[0]}" if finer
                else ": not times in any unit? see --time-column")  # fmt: skip
        years = typical * scale / 1e9 / 3.156e7
        raise InputError(f"{where}: time column {name!r} holds values like {typical:.6g}, which in "
                         f"{_UNIT_NAME[unit]} (--time-unit {unit}) are {years:.3g} years after 1970"
                         f"{hint}")  # fmt: skip
    bound = 9.2e18 / scale
    ok = (as_float <= bound) & (as_float >= -bound)  # False for NaN
    exact = pt.is_integer(col.type) and col.null_count == 0
    t_ns = np.zeros(len(as_float), dtype=np.int64)
    for start in range(0, len(t_ns), 1 << 20):  # a block at a time: no float copy of the whole column
        part = slice(start, start + (1 << 20))
        if exact:
            t_ns[part] = np.where(ok[part], raw[part], 0).astype(np.int64) * scale
        else:
            t_ns[part] = np.rint(np.where(ok[part], as_float[part], 0.0) * scale)
    return t_ns, ok


def _typical(t: np.ndarray) -> float:
    """The median magnitude of the finite values, from at most 100,000 of them spread over the column."""
    some = np.abs(t[:: max(1, len(t) // 100_000)])
    some = some[np.isfinite(some)]
    return float(np.median(some)) if len(some) else 0.0


def _from_table(loaded: _Loaded, where: str, kind: str, spec: _TableSpec, lim: ReadLimits) -> Recording:
    tab, plan = loaded.tab, loaded.plan
    loaded.tab = None
    if tab.num_rows == 0:
        raise InputError(f"{where} has a header but no data rows")
    _release()
    rec = Recording(where, f"{'CSV' if kind == 'csv' else 'Parquet'} ({'long' if plan.long else 'wide'})", {})
    if loaded.bad_rows:
        rec.skip("rows with another number of fields than the header", loaded.bad_rows)
    t, t_ok = _times_ns(_plain(tab.column(plan.time)), spec.unit, where, plan.time)
    if (n_bad := int((~t_ok).sum())) > 0:
        rec.skip("rows without a usable time (empty, not finite, or beyond int64 nanoseconds)", n_bad)
    if plan.long:  # each column to numpy, then out of the table, so that a copy of one column is made at a time
        codes, names = _channel_codes(tab.column(str(plan.channel)), where, spec.channels, lim)
        value = _plain(tab.column(str(plan.value)))
        tab = None
        if not (_is_numeric(value.type) or str(value.type) == "null"):
            raise InputError(f"{where}: value column {plan.value!r} holds {value.type}, not numbers")
        vals = np.asarray(value.to_numpy(zero_copy_only=False), dtype=np.float64)
        del value
        _release()
        order = np.argsort(codes, kind="stable")  # rows of each channel together, in file order
        bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
        del codes
        for k, name in enumerate(names):
            rows = order[bounds[k] : bounds[k + 1]]
            _add(rec, name, *_series(t[rows], vals[rows], t_ok[rows]))
        return rec
    skipped = list(plan.skipped)
    for n in plan.numeric:
        col = _plain(tab.column(n))
        tab = tab.drop_columns([n])  # its memory goes as its channel is made
        if _is_numeric(col.type) or str(col.type) == "null":
            _add(rec, n, *_series(t, np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64), t_ok))
        else:
            skipped.append(n)
    if skipped:
        rec.notes.append(f"columns without numbers left out: {_short(skipped)}")
    return rec


def _release() -> None:
    """Hand Arrow's freed buffers back to the system (its allocator keeps them otherwise)."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()


def _add(rec: Recording, name: str, s: Series, late: int) -> None:
    if len(s.t_ns):
        rec.series[name] = s
    if late:
        rec.reordered[name] = late


def _channel_codes(col: Any, where: str, wanted: set[str] | None, lim: ReadLimits) -> tuple[np.ndarray, list[str]]:
    """Per row, the index of its channel in ``names`` (-1: no name, or not wanted); names in order of first
    appearance. Works on dictionary codes: each distinct name becomes a Python string once."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.types as pt

    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not pt.is_dictionary(arr.type):
        arr = pc.dictionary_encode(arr if _is_text(arr.type) else pc.cast(arr, pa.string()))
    idx = np.asarray(pc.fill_null(arr.indices, -1).to_numpy(zero_copy_only=False), dtype=np.int32)
    first = np.full(len(arr.dictionary), len(idx), dtype=np.int64)  # each code's first row, a block at a time
    for start in range(0, len(idx), 1 << 20):
        block = idx[start : start + (1 << 20)]
        codes_here, at = np.unique(block, return_index=True)
        keep = codes_here >= 0
        np.minimum.at(first, codes_here[keep], at[keep] + start)
    used = np.flatnonzero(first < len(idx))
    used = used[np.argsort(first[used], kind="stable")]
    if wanted is None and len(used) > lim.max_channels:
        raise InputError(f"{where} names {len(used):,} channels, more than --max-channels ({lim.max_channels:,}): "
                         "pick some with --channels, or raise --max-channels")  # fmt: skip
    lut = np.full(len(arr.dictionary) + 1, -1, dtype=np.int32)  # the last entry is code -1's: no channel
    names: list[str] = []
    index: dict[str, int] = {}
    for code, value in zip(used.tolist(), arr.dictionary.take(pa.array(used)).to_pylist(), strict=True):
        name = str(value) if value is not None else ""
        if not name or (wanted is not None and name not in wanted):
            continue
        if name not in index:  # a dictionary may hold one name twice
            index[name] = len(names)
            names.append(name)
        lut[code] = index[name]
    if len(names) > lim.max_channels:
        raise InputError(f"{where}: more than --max-channels ({lim.max_channels:,}) channels chosen")
    return lut[idx], names


# -- messages ------------------------------------------------------------------------------------------
class _TooDeep(ValueError):
    pass


def flatten(prefix: str, msg: Any, depth: int = 0) -> Iterator[tuple[str, float]]:
    """(channel, value) for each numeric field of a decoded message (dict, ROS message object or sequence).
    Raises OverflowError on an integer beyond float range and ValueError on nesting deeper than MAX_DEPTH."""
    if depth > MAX_DEPTH:
        raise _TooDeep(f"fields nested deeper than {MAX_DEPTH}")
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
                yield from flatten(f"{prefix}.{k}", v, depth + 1)
        return
    if isinstance(msg, list | tuple):
        if len(msg) <= MAX_ARRAY:
            for k, v in enumerate(msg):
                yield from flatten(f"{prefix}.{k}", v, depth + 1)
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
        yield from flatten(f"{prefix}.{key}" if prefix else str(key), value, depth + 1)


def _why_skipped(exc: BaseException) -> str:
    if isinstance(exc, OverflowError):
        return "a number beyond float range"
    if isinstance(exc, _TooDeep | RecursionError):
        return f"fields nested deeper than {MAX_DEPTH}"
    return f"unreadable ({type(exc).__name__})"


class _Collector:
    """Samples per channel from decoded messages, in arrival order (sorted at the end), within the limits:
    16 bytes a sample; fields of channels beyond ``max_channels`` left out and counted."""

    def __init__(self, where: str, kind: str, wanted: set[str] | None, lim: ReadLimits) -> None:
        self.rec = Recording(where, kind, {})
        self.t: dict[str, array[int]] = {}
        self.v: dict[str, array[float]] = {}
        self.counts: dict[str, int] = {}
        self.types: dict[str, str] = {}
        self.wanted = wanted
        self.lim = lim
        self.samples = 0
        self.messages = 0

    def add(self, topic: str, msgtype: str, t_ns: int, msg: Any) -> None:
        if topic not in self.counts and len(self.counts) >= _MAX_TOPICS:
            self.rec.skip(f"messages on topics beyond the first {_MAX_TOPICS:,}")
            return
        self.counts[topic] = self.counts.get(topic, 0) + 1
        self.types[topic] = msgtype
        if not 0 <= t_ns < 2**63:
            self.rec.skip(f"topic {topic}: messages skipped (log time beyond int64 nanoseconds)")
            return
        try:
            fields = list(flatten(topic.lstrip("/"), msg))
        except Exception as exc:  # one message that cannot be read is skipped and counted, never fatal
            self.rec.skip(f"topic {topic}: messages skipped ({_why_skipped(exc)})")
            return
        self.messages += 1
        for name, value in fields:
            if self.wanted is not None and name not in self.wanted:
                continue
            if name not in self.t:
                if len(self.t) >= self.lim.max_channels:
                    self.rec.skip(f"values of channels beyond --max-channels ({self.lim.max_channels:,})")
                    continue
                self.t[name], self.v[name] = array("q"), array("d")
            self.t[name].append(t_ns)
            self.v[name].append(value)
            self.samples += 1
        if self.samples > self.lim.max_samples:
            raise self.lim.too_many_samples(self.rec.path)

    def skip(self, reason: str) -> None:
        self.rec.skip(reason)

    def done(self) -> Recording:
        self.rec.topics = {k: (self.types[k], self.counts[k]) for k in self.counts}
        for name in list(self.t):
            t, v = self.t.pop(name), self.v.pop(name)
            _add(self.rec, name, *_series(np.frombuffer(t, dtype=np.int64), np.frombuffer(v, dtype=np.float64)))
        return self.rec


_MCAP_MAGIC = b"\x89MCAP0\r\n"
_OP_HEADER, _OP_FOOTER, _OP_SCHEMA, _OP_CHANNEL, _OP_MESSAGE, _OP_CHUNK = 0x01, 0x02, 0x03, 0x04, 0x05, 0x06


class _McapLog:
    """An MCAP file read record by record from the start (no index needed, so a file cut short reads up to
    the cut); records and chunks are bounded by ``max_bytes`` before they are read or decompressed."""

    def __init__(self, p: Path, topics: set[str] | None, out: _Collector, lim: ReadLimits) -> None:
        self.records = _need("mcap.records", "mcap")
        self.stream = _need("mcap.data_stream", "mcap")
        self.p, self.topics, self.out, self.lim = p, topics, out, lim
        self.schemas: dict[int, Any] = {}
        self.channels: dict[int, Any] = {}
        self.decoders: dict[int, Any] = {}
        self.left_out: dict[str, str] = {}

    def read(self) -> None:
        p = self.p
        try:
            f = p.open("rb")
        except OSError as exc:
            raise InputError(f"cannot read {p}: {exc.strerror or exc}") from None
        with f:
            size = os.fstat(f.fileno()).st_size
            if f.read(8) != _MCAP_MAGIC:
                raise InputError(f"{p} is not a readable MCAP file: it does not start with the MCAP magic bytes")
            pos, first = 8, True
            while True:
                head = f.read(9)
                if len(head) < 9:
                    self._cut(pos, "the file ends without a footer" if not head else "the file ends inside a record")
                    return
                opcode, length = struct.unpack("<BQ", head)
                if first and opcode != _OP_HEADER:
                    raise InputError(f"{p} is not a readable MCAP file: its first record is not a header")
                first = False
                if opcode == 0 or length > size - pos - 9:
                    self._cut(pos, "a record runs past the end of the file" if opcode else "a damaged record")
                    return
                if length > self.lim.max_bytes:
                    raise InputError(f"{p}: a record of {length >> 20:,} MiB at byte {pos:,}, more than --max-mb "
                                     f"({self.lim.max_mb}) allows: raise --max-mb")  # fmt: skip
                body = f.read(length)
                pos += 9 + length
                if opcode == _OP_FOOTER:
                    return
                if opcode == _OP_CHUNK:
                    self._chunk(body, pos)
                else:
                    self._record(opcode, body)

    def _cut(self, pos: int, why: str) -> None:
        if self.out.messages == 0 and not self.out.rec.skipped:
            raise InputError(f"{self.p} is not a readable MCAP file: {why} at byte {pos:,}, before any message")
        self.out.rec.notes.append(f"{why} at byte {pos:,} (a recording cut short?): read the "
                                  f"{sum(self.out.counts.values()):,} messages before it")  # fmt: skip

    def _parse(self, cls: Any, body: bytes) -> Any:
        return cls.read(self.stream.ReadDataStream(io.BytesIO(body)))

    def _record(self, opcode: int, body: bytes) -> None:
        try:
            if opcode == _OP_MESSAGE:
                channel_id, _seq, log_time, _pub = struct.unpack_from("<HIQQ", body)
                self._message(channel_id, log_time, body[22:])
            elif opcode == _OP_SCHEMA:
                schema = self._parse(self.records.Schema, body)
                self.schemas[schema.id] = schema
            elif opcode == _OP_CHANNEL and len(self.channels) < _MAX_TOPICS:
                channel = self._parse(self.records.Channel, body)
                self.channels[channel.id] = channel
        except InputError:
            raise
        except Exception:  # struct.error, EndOfFile, UnicodeDecodeError: a damaged record
            self.out.skip("damaged records skipped")

    def _chunk(self, body: bytes, pos: int) -> None:
        # start, end, uncompressed size, crc, compression, records: parsed in place (the records not copied)
        try:
            (size,) = struct.unpack_from("<Q", body, 16)
            (n,) = struct.unpack_from("<I", body, 28)
            compression = body[32 : 32 + n].decode()
            (length,) = struct.unpack_from("<Q", body, 32 + n)
            if 40 + n + length > len(body):
                raise ValueError("records past the chunk")
        except (struct.error, UnicodeDecodeError, ValueError):
            self.out.skip("damaged chunks skipped")
            return
        if size > self.lim.max_bytes:
            raise InputError(f"{self.p}: a chunk at byte {pos:,} decompresses to {size >> 20:,} MiB, more than "
                             f"--max-mb ({self.lim.max_mb}) allows: raise --max-mb")  # fmt: skip
        data = self._inflate(compression, memoryview(body)[40 + n : 40 + n + length], size)
        if data is None:
            self.out.skip("damaged chunks skipped")
            return
        at = 0
        while at + 9 <= len(data):
            opcode, length = struct.unpack_from("<BQ", data, at)
            if at + 9 + length > len(data):
                self.out.skip("damaged records skipped")
                return
            self._record(opcode, bytes(data[at + 9 : at + 9 + length]))
            at += 9 + length

    def _inflate(self, compression: str, packed: memoryview, size: int) -> memoryview | bytes | None:
        """The chunk's records, at most their declared size (None: damaged, or another size than declared)."""
        try:
            if compression == "":
                data: memoryview | bytes = packed
            elif compression == "zstd":
                zstd = _need("zstandard", "zstandard")
                reader = zstd.ZstdDecompressor().stream_reader(packed)
                out = bytearray()
                while len(out) <= size and (part := reader.read(min(1 << 20, size + 1 - len(out)))):
                    out += part
                data = memoryview(out)
            elif compression == "lz4":
                lz4 = _need("lz4.frame", "lz4")
                data = lz4.LZ4FrameDecompressor().decompress(packed, max_length=size + 1)
            else:
                self.out.skip(f"chunks with unknown compression {compression[:40]!r} skipped")
                return None
        except InputError:
            raise
        except Exception:
            return None
        return data if len(data) == size else None

    def _message(self, channel_id: int, log_time: int, data: bytes) -> None:
        channel = self.channels.get(channel_id)
        if channel is None:
            self.out.skip("messages on a channel not declared before them, skipped")
            return
        if self.topics is not None and channel.topic not in self.topics:
            return
        if channel_id not in self.decoders:
            self.decoders[channel_id] = self._decoder(channel)
        decode = self.decoders[channel_id]
        schema = self.schemas.get(channel.schema_id)
        msgtype = schema.name if schema is not None else channel.message_encoding
        if decode is None:
            self.out.counts[channel.topic] = self.out.counts.get(channel.topic, 0) + 1
            self.out.types[channel.topic] = msgtype
            return
        try:
            msg = decode(data)
        except Exception as exc:  # one undecodable message is skipped and counted, not fatal
            self.out.skip(f"topic {channel.topic}: messages skipped (undecodable: {type(exc).__name__})")
            return
        self.out.add(channel.topic, msgtype, log_time, msg)

    def _decoder(self, channel: Any) -> Any:
        enc = channel.message_encoding
        schema = self.schemas.get(channel.schema_id)
        if enc == "json":
            return lambda data: json.loads(data)
        if enc == "cdr" and schema is not None and schema.encoding in ("ros2msg", "ros2idl"):
            ros2 = _need("mcap_ros2.decoder", "mcap-ros2-support")
            try:
                return ros2.DecoderFactory().decoder_for(enc, schema)
            except Exception as exc:
                self.out.rec.notes.append(f"topic {channel.topic}: schema not readable ({type(exc).__name__})")
                return None
        self.out.rec.notes.append(f"topic {channel.topic}: message encoding {enc[:40]!r} is not read (JSON and ROS 2 "
                                  "CDR are)")  # fmt: skip
        return None


def _read_mcap(p: Path, topics: set[str] | None, wanted: set[str] | None, lim: ReadLimits) -> Recording:
    out = _Collector(str(p), "MCAP", wanted, lim)
    _McapLog(p, topics, out, lim).read()
    return out.done()


def _read_bag(p: Path, topics: set[str] | None, wanted: set[str] | None, lim: ReadLimits) -> Recording:
    highlevel = _need("rosbags.highlevel", "rosbags")
    typesys = _need("rosbags.typesys", "rosbags")
    kind = "ROS 1 bag" if p.suffix.lower() == ".bag" else "ROS 2 bag"
    out = _Collector(str(p), kind, wanted, lim)
    try:  # ROS 2 bags before Iron carry no message definitions: the Humble types are the default
        store = typesys.get_typestore(typesys.Stores.ROS2_HUMBLE)
        with highlevel.AnyReader([p], default_typestore=store) as reader:
            conns = [c for c in reader.connections if topics is None or c.topic in topics]
            try:
                for conn, t_ns, raw in reader.messages(connections=conns):
                    try:
                        msg = reader.deserialize(raw, conn.msgtype)
                    except Exception as exc:  # an unknown type or a damaged message: skipped and counted
                        out.skip(f"topic {conn.topic}: messages skipped (cannot decode {conn.msgtype}: "
                                 f"{type(exc).__name__})")  # fmt: skip
                        continue
                    out.add(conn.topic, conn.msgtype, t_ns, msg)
            except InputError:
                raise
            except Exception as exc:  # damage part way: what came before it is kept
                if out.messages == 0:
                    raise
                out.rec.notes.append(f"the bag is damaged part way ({type(exc).__name__}): read the "
                                     f"{sum(out.counts.values()):,} messages before it")  # fmt: skip
    except InputError:
        raise
    except Exception as exc:  # rosbags' AnyReaderError, ReaderError, ...
        raise InputError(f"{p} is not a readable ROS bag: {type(exc).__name__}: {str(exc)[:300]}") from None
    return out.done()
