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
memory, one MCAP record or one decompressed MCAP chunk (all chunks together: at most ``INFLATION`` times
the file's size, or ``max_mb``); a CSV row must fit in ``CSV_BLOCK_BYTES``. Beyond a bound the reader stops
with an InputError naming the flag; message fields of channels beyond ``max_channels``, or named longer than
``MAX_NAME_CHARS``, are left out and counted instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ..errors import InputError
from .log_messages import MAX_ARRAY, MAX_DEPTH, read_bag, read_mcap
from .log_tables import CSV_BLOCK_BYTES, TIME_COLUMNS, UNITS, read_table, table_recording
from .recording import ReadLimits, Recording, Series, short_list

__all__ = [
    "CSV_BLOCK_BYTES",
    "MAX_ARRAY",
    "MAX_DEPTH",
    "TIME_COLUMNS",
    "ReadLimits",
    "Recording",
    "Series",
    "open_log",
    "read_table",
]


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
    if time_unit not in UNITS:
        raise InputError(f"time unit {time_unit!r} is not one of {', '.join(UNITS)}")
    kind = fmt or _guess_format(p)
    wanted = set(channels) if channels else None
    if kind in ("csv", "parquet"):
        rec = table_recording(p, kind, time_column, time_unit, channel_column, value_column, wanted, lim)
    elif kind == "mcap":
        rec = read_mcap(p, set(topics) if topics else None, wanted, lim)
    elif kind in ("bag", "ros2"):
        rec = read_bag(p, set(topics) if topics else None, wanted, lim)
    else:
        raise InputError(f"{p}: unknown log format {kind!r}; use csv, parquet, mcap, bag or ros2")
    rec.note_counts()
    if wanted is not None and (missing := [c for c in channels or () if c not in rec.series]):
        raise InputError(f"--channels: {short_list(missing)} not in {p} (or without samples); see --list")
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
