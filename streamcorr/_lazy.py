"""Lazy re-exports (PEP 562): a module offers names from submodules without importing them up front, so that
``import streamcorr`` loads no torch or numba and naming one transport loads no other."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(module: str, package: str | None, table: Mapping[str, str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` that imports ``table[name]`` (a submodule relative to ``package``) on
    first access and returns its ``name``; other names raise AttributeError as usual.

    >>> __getattr__ = lazy_getattr("streamcorr", "streamcorr", {"Snapshot": "engine.matrix"})
    >>> __getattr__("Snapshot").__name__
    'Snapshot'
    >>> __getattr__("nope")
    Traceback (most recent call last):
    ...
    AttributeError: module 'streamcorr' has no attribute 'nope'
    """

    def __getattr__(name: str) -> Any:
        if name in table:
            return getattr(importlib.import_module(f".{table[name]}", package), name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
