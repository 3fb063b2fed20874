"""Payload values -> float64: which decoded JSON / msgpack values count as numbers, and why the others do not.

A sample is a float or an int (bool is an int subclass and is not a sample); ``None`` (JSON's ``null``) reads as
NaN; an int beyond float64 is the drop reason ``range``, anything else ``type``. An array is a list of such values
or bytes of little-endian float64 (8 bytes per element).

>>> sample_array([1, 2.5, None, "x", 10**400])[1:]
(array([ True,  True,  True, False, False]), 1, 1)
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["array_len", "is_number", "sample_array", "sample_value", "time_scalar"]


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
