"""CSV and Parquet logs as a :class:`~streamcorr.offline.recording.Recording`: the one table reader, used by
``replay`` (through :func:`streamcorr.offline.logs.open_log`), ``matrix`` and ``estimate`` (:func:`read_table`).

CSV is parsed a block of ``CSV_BLOCK_BYTES`` at a time with pyarrow's streaming reader (a column whose type
changes part way is read again as the wider type); Parquet is checked from its footer before any page is
read. Only the columns a log needs are read; names are read as dictionary codes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from .recording import ReadLimits, Recording, add_series, need_module, series_of, short_list

__all__ = ["CSV_BLOCK_BYTES", "TIME_COLUMNS", "UNITS", "read_table", "table_recording"]

TIME_COLUMNS = ("t", "time", "timestamp", "stamp", "time_s", "t_s")  # tried in order when none is given
CSV_BLOCK_BYTES = 4 << 20  # a CSV is parsed this many bytes at a time: no row may be longer
MAX_TIME_S = 1e11  # numeric times past this (year ~5100) are in a finer unit than they were read in
UNITS = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}  # time units, ns each
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
        raise InputError(
            f"{where}: column name(s) {short_list(dup)} appear more than once: give each column its own name"
        )


def _plan(names: list[str], types: dict[str, Any], where: str, spec: _TableSpec, lim: ReadLimits) -> _Plan:
    _check_names(names, where, lim)
    lower = {n.lower(): n for n in names}
    time = spec.time_column
    if time is None:
        time = next((lower[c] for c in TIME_COLUMNS if c in lower), None)
        if time is None:
            raise InputError(f"{where}: which column is time? none is named {'/'.join(TIME_COLUMNS)}; "
                             f"pass --time-column (columns: {short_list(names)})")  # fmt: skip
    if time not in names:
        raise InputError(f"{where}: no column {time!r} (--time-column); columns: {short_list(names)}")
    text = [n for n in names if n != time and _is_text(types[n])]
    if spec.channel_column is not None or spec.value_column is not None or (bool(text) and "value" in lower):
        channel = spec.channel_column or lower.get("channel") or lower.get("name") or (text[0] if text else None)
        value = spec.value_column or lower.get("value")
        if channel not in names or value not in names:
            raise InputError(f"{where}: a long-form log needs a channel-name column and a value column "
                             f"(--channel-column, --value-column); columns: {short_list(names)}")  # fmt: skip
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
    pa_csv = need_module("pyarrow.csv", "pyarrow")

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
    pq = need_module("pyarrow.parquet", "pyarrow")
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
        pq = need_module("pyarrow.parquet", "pyarrow")
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
    import pyarrow.compute as pc
    import pyarrow.types as pt

    stamped = pt.is_timestamp(col.type) or pt.is_date(col.type)
    if pt.is_date32(col.type):  # days
        col, scale = col.cast(pa.int32()), 86_400 * 10**9
    elif pt.is_date64(col.type):  # milliseconds
        col, scale = col.cast(pa.int64()), 10**6
    elif pt.is_timestamp(col.type):  # integers in the type's unit: no cast to ns that could overflow
        col, scale = col.cast(pa.int64()), UNITS[col.type.unit]
    elif pt.is_integer(col.type) or pt.is_floating(col.type):
        scale = UNITS[unit]
    else:
        raise InputError(f"{where}: the time column holds {col.type}, not numbers or timestamps; see --time-column")
    exact = pt.is_integer(col.type)
    valid = pc.is_valid(col).to_numpy(zero_copy_only=False) if col.null_count else None
    raw = np.asarray((pc.fill_null(col, 0) if exact and col.null_count else col).to_numpy(zero_copy_only=False))
    as_float = np.asarray(raw, dtype=np.float64)  # no copy of a float column (its nulls are NaN)
    typical = 0.0 if stamped else _typical(as_float)
    if typical * scale / 1e9 > MAX_TIME_S:
        finer = [u for u in ("ms", "us", "ns") if UNITS[u] < scale and typical * UNITS[u] / 1e9 <= MAX_TIME_S]
        hint = (f": epoch {_UNIT_NAME[finer[0]]}? pass --time-unit {finer[0]}" if finer
                else ": not times in any unit? see --time-column")  # fmt: skip
        years = typical * scale / 1e9 / 3.156e7
        raise InputError(f"{where}: time column {name!r} holds values like {typical:.6g}, which in "
                         f"{_UNIT_NAME[unit]} (--time-unit {unit}) are {years:.3g} years after 1970"
                         f"{hint}")  # fmt: skip
    bound = 9.2e18 / scale
    ok = (as_float <= bound) & (as_float >= -bound)  # False for NaN
    if valid is not None:
        ok &= valid
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
            add_series(rec, name, *series_of(t[rows], vals[rows], t_ok[rows]))
        return rec
    skipped = list(plan.skipped)
    for n in plan.numeric:
        col = _plain(tab.column(n))
        tab = tab.drop_columns([n])  # its memory goes as its channel is made
        if _is_numeric(col.type) or str(col.type) == "null":
            add_series(rec, n, *series_of(t, np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64), t_ok))
        else:
            skipped.append(n)
    if skipped:
        rec.notes.append(f"columns without numbers left out: {short_list(skipped)}")
    return rec


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


def _release() -> None:
    """Hand Arrow's freed buffers back to the system (its allocator keeps them otherwise)."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()


def table_recording(p: Path, kind: str, time_column: str | None, time_unit: str, channel_column: str | None,
                    value_column: str | None, wanted: set[str] | None, lim: ReadLimits) -> Recording:  # fmt: skip
    """A CSV (``kind`` "csv") or Parquet log read as the module docstring of streamcorr.offline.logs says."""
    spec = _TableSpec(time_column, time_unit, channel_column, value_column, wanted)
    return _from_table((_read_csv if kind == "csv" else _read_parquet)(p, spec, lim), str(p), kind, spec, lim)
