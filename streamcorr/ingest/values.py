"""Payload bytes -> objects (``parse``), and values -> float64: which decoded JSON / msgpack values count as
numbers, and why the others do not.

A sample is a float or an int (bool is an int subclass and is not a sample); ``None`` (JSON's ``null``) reads as
NaN; an int beyond float64 is the drop reason ``range``, anything else ``type``. An array is a list of such values
or bytes of little-endian float64 (8 bytes per element).

>>> sample_array([1, 2.5, None, "x", 10**400])[1:]
(array([ True,  True,  True, False, False]), 1, 1)
"""

from __future__ import annotations

import json
from typing import Any

import msgpack
import numpy as np
import orjson

__all__ = ["array_len", "is_number", "parse", "sample_array", "sample_value", "time_scalar"]

_MSGPACK_MAP = frozenset([*range(0x80, 0x90), 0xDE, 0xDF])
_SPACE = (b"\t", b"\n", b"\r")  # one-byte payloads read as (empty) text, not as msgpack integers


def parse(payload: bytes, fmt: str) -> Any:
    """A payload's object in format fmt ("auto": the rules of streamcorr.ingest.payload's docstring); raises on
    bytes not valid in it."""
    if fmt == "auto":
        first = payload[:64].lstrip()[:1]  # a peek, not a copy of the whole payload
        if first == b"{":
            fmt = "json"
        elif payload[0] in _MSGPACK_MAP:
            fmt = "msgpack"
        else:
            try:
                return float(payload.decode("ascii"))
            except (UnicodeDecodeError, ValueError):  # ASCII text is JSON: msgpack's only ASCII payloads are
                # one-byte integers, and one that is a printable character reads as the text it is
                text = payload.isascii() and (len(payload) > 1 or payload[0] >= 0x20 or payload in _SPACE)
                fmt = "json" if text else "msgpack"
    if fmt == "json":
        try:  # orjson: about 7x the stdlib on a reading's few fields
            return orjson.loads(payload)
        except orjson.JSONDecodeError:  # what orjson refuses (NaN literals, huge integers) the stdlib reads
            return json.loads(payload)
    if fmt == "msgpack":
        return msgpack.unpackb(payload, raw=False, strict_map_key=False)
    return float(payload.decode("ascii"))


def is_number(x: Any) -> bool:
    return type(x) is float or type(x) is int  # bool is an int subclass and is not a sample


def time_scalar(x: Any) -> float | None:
    """A time-like number as float, or None."""
    if not is_number(x):
        return None
    try:
        return float(x)
    except OverflowError:
        return None


def sample_value(x: Any) -> tuple[float, str]:
    """(value, "") or (nan, drop reason); None reads as NaN (JSON's only way to say 'no value')."""
    if type(x) is float:
        return x, ""
    if x is None:
        return float("nan"), ""
    if type(x) is int:
        try:
            return float(x), ""
        except OverflowError:
            return float("nan"), "range"
    return float("nan"), "type"


def array_len(arr: Any) -> int | None:
    """Number of samples in an array value, or None where it is not an array."""
    if isinstance(arr, list):
        return len(arr)
    if isinstance(arr, bytes) and len(arr) % 8 == 0:
        return len(arr) // 8
    return None


def sample_array(arr: list[Any] | bytes) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(float64 values, valid mask, count of non-numbers, count of integers beyond float64)."""
    if isinstance(arr, bytes):
        values = np.frombuffer(arr, dtype="<f8").astype(np.float64)
        return values, np.ones(len(values), dtype=bool), 0, 0
    if all(type(x) is float or type(x) is int for x in arr):  # the fast path, almost always taken
        try:
            values = np.array(arr, dtype=np.float64)
            return values, np.ones(len(values), dtype=bool), 0, 0
        except OverflowError:
            pass
    values = np.empty(len(arr))
    ok = np.ones(len(arr), dtype=bool)
    n_type = n_range = 0
    for k, raw in enumerate(arr):
        values[k], reason = sample_value(raw)
        if reason:
            ok[k] = False
            n_type += reason == "type"
            n_range += reason == "range"
    return values, ok, n_type, n_range
