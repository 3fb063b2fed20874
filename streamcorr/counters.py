"""Counters as flat ``name -> number`` maps: the one flattener behind status messages, /metrics and the ledger.

A counters object is a dataclass, a plain object or a mapping; its numeric attributes become entries, a mapping of
numbers under ``name`` becomes ``name.key`` entries, and booleans and private names are left out.

>>> from dataclasses import dataclass, field
>>> @dataclass
... class C:
...     hops: int = 3
...     stage_s: dict = field(default_factory=lambda: {"ranks": 0.5, "model": 1.5})
...     running: bool = True
>>> flat_counters(C())
{'hops': 3, 'stage_s.ranks': 0.5, 'stage_s.model': 1.5}
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping

__all__ = ["flat_counters"]


def _number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def flat_counters(obj: object) -> dict[str, int | float]:
    """The numeric entries of ``obj`` (see the module docstring); top-level ints stay ints, nested numbers are
    floats."""
    out: dict[str, int | float] = {}
    items = obj.items() if isinstance(obj, Mapping) else vars(obj).items()
    for name, value in items:
        if name.startswith("_"):
            continue
        if _number(value):
            out[name] = int(value) if isinstance(value, numbers.Integral) else float(value)
        elif isinstance(value, Mapping):
            out.update({f"{name}.{k}": float(v) for k, v in value.items() if _number(v)})
    return out
