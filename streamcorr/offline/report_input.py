"""The replay output a report is drawn from, read and checked: ``timeline.parquet`` (or an ``outputs.record``
directory's ``timeline-*.parquet``), ``events.parquet``, ``replay.json`` and ``tables.json``. Columns are cast
to their types; a file of another shape, a wrong type, empty cells where a value is needed, more rows than
``MAX_ROWS`` or names longer than ``MAX_NAME_CHARS`` give one InputError naming the file. Output without the
``dependent`` / ``n_eff`` columns (written before they existed), or without ``lag_s`` / ``mi_lag`` (lags off, or
older), reads them as nulls."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError

__all__ = ["load_output"]

_OPTIONAL = {
    "dependent": "bool",
    "n_eff": "float32",
    "lag_s": "float32",
    "mi_lag": "float32",
    "coverage": "float32",
}  # absent: nulls
_TYPES = {"t_ns": "int64", "a": "string", "b": "string", "mi": "float64", "dependent": "bool", "n_eff": "float32"}
_EVENT_TYPES = {"time": "float64", "t_ns": "int64", "a": "string", "b": "string", "change": "string",
                "previous": "float64", "current": "float64"}  # fmt: skip
_EVENT_OPTIONAL = {
    "initial": "bool",
    "onset_t_ns": "int64",
    "path": "string",
    "lag_s": "float64",
    "previous_lag_s": "float64",
}  # absent from older output: nulls
MAX_ROWS = 5_000_000  # timeline rows a report reads (each row is a pair at a hop): beyond, a named error
MAX_EVENTS = 100_000
MAX_NAME_CHARS = 1024  # channel names longer than this are not from streamcorr
MAX_TABLE_SIDE = 512  # a lookup table's grid


def load_output(outdir: Path) -> tuple[dict[str, Any], dict[str, np.ndarray], list[dict[str, Any]], dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError("the report reads Parquet: pip install 'streamcorr[logs]'") from None
    import pyarrow as pa

    timeline = [outdir / "timeline.parquet"] if (outdir / "timeline.parquet").is_file() else []
    timeline = timeline or sorted(outdir.glob("timeline-*.parquet"))  # a recording (outputs.record)
    event_files = [outdir / "events.parquet"] if (outdir / "events.parquet").is_file() else []
    event_files = event_files or sorted(outdir.glob("events-*.parquet"))
    if not outdir.is_dir():
        raise InputError(f"{outdir} is not a directory: give the output directory of 'streamcorr replay' or "
                         "outputs.record")  # fmt: skip
    if not timeline:
        raise InputError(f"{outdir} has no timeline.parquet (nor timeline-*.parquet): give a directory written by "
                         "'streamcorr replay' or outputs.record")  # fmt: skip
    import pyarrow.compute as pc

    rows = [0]

    def read(path: Path, types: dict[str, str], optional: dict[str, str], limit: int) -> Any:
        """The columns ``types`` (cast; present, without nulls) and ``optional`` (nulls when absent)."""
        pf = pq.ParquetFile(path)
        rows[0] += pf.metadata.num_rows
        if rows[0] > limit:
            raise _Bad(f"more than {limit:,} rows: not replay output, or a replay too long for one report")
        have = set(pf.schema_arrow.names)
        if missing := [c for c in types if c not in have]:
            raise _Bad(f"{path.name} has no column {', '.join(missing)}: not written by streamcorr")
        wanted = [*types, *(c for c in optional if c in have)]
        tab = pq.read_table(path, columns=wanted, read_dictionary=[c for c in wanted if types.get(c) == "string"])
        out = {}
        for name, kind in {**types, **optional}.items():
            if name not in have:
                out[name] = pa.nulls(tab.num_rows, pa.type_for_alias(kind))
                continue
            col = tab.column(name)
            if kind == "string":
                names = col.combine_chunks().dictionary if pa.types.is_dictionary(col.type) else col
                if (pc.max(pc.utf8_length(names.cast(pa.string()))).as_py() or 0) > MAX_NAME_CHARS:
                    raise _Bad(f"{path.name}: column {name} holds names longer than {MAX_NAME_CHARS} characters")
            target = pa.type_for_alias(kind)
            if kind == "string" and pa.types.is_dictionary(col.type):  # names stay codes: a copy of each name
                target = pa.dictionary(col.type.index_type, pa.string())
            try:
                col = col.cast(target)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                raise _Bad(f"{path.name}: column {name} holds {col.type}, not {kind}") from None
            if name in types and name != "mi" and col.null_count:
                raise _Bad(f"{path.name}: column {name} has empty cells")
            out[name] = col
        return pa.table(out)

    try:
        info = _json_object(outdir / "replay.json")
        tab = pa.concat_tables([read(p, {c: _TYPES[c] for c in ("t_ns", "a", "b", "mi")}, _OPTIONAL, MAX_ROWS)
                                for p in timeline])  # fmt: skip
        rows[0] = 0
        events = [e for p in event_files for e in read(p, _EVENT_TYPES, _EVENT_OPTIONAL, MAX_EVENTS).to_pylist()]
        tables = _tables(_json_object(outdir / "tables.json"))
        for key in ("t_start", "t_end"):
            value = info.get(key, 0.0)
            if not isinstance(value, int | float) or not math.isfinite(value):
                raise _Bad(f"replay.json: {key} is {value!r:.40}, not a number")
        if not isinstance(info.get("channels", []), list):
            raise _Bad("replay.json: channels is not a list")
    except _Bad as exc:
        raise InputError(f"cannot read the replay output in {outdir}: {exc}") from None
    except Exception as exc:  # a damaged or foreign file: one message
        raise InputError(f"cannot read the replay output in {outdir}: {str(exc).splitlines()[0][:300]}") from None
    cols = {"t_ns": tab.column("t_ns").to_numpy(zero_copy_only=False)}
    cols["pair"], cols["pairs"] = _pair_codes(tab.column("a"), tab.column("b"))
    cols["mi"] = pc.fill_null(tab.column("mi"), np.nan).to_numpy(zero_copy_only=False)
    dependent = tab.column("dependent")
    known = pc.is_valid(dependent).to_numpy(zero_copy_only=False)
    verdict = pc.fill_null(dependent, False).to_numpy(zero_copy_only=False)
    # 1 dependent, 0 not significant, -1 not known (older output, or a snapshot without the verdict)
    cols["dependent"] = np.where(known, verdict, -1).astype(np.int8)
    for name in ("n_eff", "lag_s", "mi_lag", "coverage"):  # NaN where null: no estimate, no lag, or not written
        cols[name] = pc.fill_null(tab.column(name).cast(pa.float64()), np.nan).to_numpy(zero_copy_only=False)
    if len(cols["t_ns"]) == 0:
        raise InputError(f"{outdir}/timeline.parquet has no rows: the replay evaluated no hop")
    return info, cols, events, tables


def _pair_codes(a: Any, b: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the index of its pair in the sorted labels "a\x1fb" (object array): from the names'
    dictionary codes, so a row costs 8 bytes however long its names."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def codes(col: Any) -> tuple[np.ndarray, list[str]]:
        arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        if not pa.types.is_dictionary(arr.type):
            arr = pc.dictionary_encode(arr)
        return arr.indices.to_numpy(zero_copy_only=False).astype(np.int64), arr.dictionary.to_pylist()

    (ia, names_a), (ib, names_b) = codes(a), codes(b)
    used, inverse = np.unique(ia * max(1, len(names_b)) + ib, return_inverse=True)
    del ia, ib
    labels = [f"{names_a[c // max(1, len(names_b))]}\x1f{names_b[c % max(1, len(names_b))]}" for c in used.tolist()]
    pairs = sorted(set(labels))  # a dictionary may hold a name twice: one pair whatever its codes
    where = {label: k for k, label in enumerate(pairs)}
    lut = np.array([where[label] for label in labels], dtype=np.int64)
    return lut[inverse.reshape(-1)], np.array(pairs, dtype=object)


class _Bad(ValueError):
    """What is wrong with a file of the replay output."""


def _json_object(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    if path.stat().st_size > 64 << 20:
        raise _Bad(f"{path.name} is larger than 64 MiB: not written by streamcorr")
    value = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(value, dict):
        raise _Bad(f"{path.name} holds a {type(value).__name__}, not a JSON object")
    return value


def _tables(tables: dict[str, Any]) -> dict[str, Any]:
    """tables.json checked: pairs of names, a finite MI and a square grid of numbers each."""
    pairs = tables.get("pairs", [])
    if not isinstance(pairs, list) or not isinstance(tables.get("time", 0.0), int | float):
        raise _Bad("tables.json: 'pairs' is not a list, or 'time' not a number")
    for tb in pairs:
        ok = isinstance(tb, dict) and all(isinstance(tb.get(k), str) for k in ("a", "b"))
        ok = ok and isinstance(tb.get("mi"), int | float) and isinstance(tb.get("table"), list)
        if ok:
            grid = np.asarray(tb["table"], dtype=float)
            ok = grid.ndim == 2 and 0 < grid.shape[0] == grid.shape[1] <= MAX_TABLE_SIDE and np.isfinite(grid).all()
        if not ok:
            raise _Bad("tables.json: each pair needs names a and b, a number mi and a square table of numbers")
    return tables
