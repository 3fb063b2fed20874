"""Messages for configuration errors: one line per problem, naming the key path and the fix.

A misspelled key gets the closest key its section accepts:

>>> from pydantic import BaseModel, ConfigDict, ValidationError
>>> class Section(BaseModel):
...     model_config = ConfigDict(extra="forbid")
...     hop_s: float = 1.0
>>> class Top(BaseModel):
...     model_config = ConfigDict(extra="forbid")
...     window: Section = Section()
>>> try:
...     Top.model_validate({"window": {"hops": 2}})
... except ValidationError as exc:
...     print(describe(exc, Top))
window.hops: unknown key: did you mean 'hop_s'? (see docs/configuration.md)
"""

from __future__ import annotations

import difflib
import reprlib
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

__all__ = ["describe", "echo"]

MAX_ERRORS_SHOWN = 10


def echo(value: Any) -> str:
    """A short repr of a user value for an error message: a huge or deeply shared value is cut, not expanded.

    >>> echo("x" * 1000)[:12], len(echo("x" * 1000)) < 80
    ("'xxxxxxxxxxx", True)
    """
    r = reprlib.Repr()  # Python 3.11 takes the limits as attributes, not arguments
    r.maxlevel, r.maxlist, r.maxtuple, r.maxdict, r.maxset = 2, 4, 4, 4, 4
    r.maxstring, r.maxother, r.maxlong = 60, 60, 40
    return r.repr(value)


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation can hold (through Optional, unions, lists, dicts and Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _known_keys(model: type[BaseModel], loc: list[str | int]) -> set[str]:
    """Keys accepted where ``loc`` (a path of keys and list indices) points, from the schema."""
    level = [model]
    for step in loc:
        if isinstance(step, int):
            continue  # a list item: the same models
        inner = [m for cls in level if (f := cls.model_fields.get(step)) is not None for m in _models(f.annotation)]
        level = inner or level  # a union's tag (mqtt, zmq) is not a field: stay
    return {name for cls in level for name in cls.model_fields}


def describe(exc: ValidationError, model: type[BaseModel]) -> str:
    """One line per error of validating against ``model``: the key path, then what is wrong and the fix."""
    lines = []
    for err in exc.errors():
        raw = [p for p in err["loc"] if not str(p).startswith("function-after")]
        loc = [str(p) for p in raw]
        if len(loc) > 2 and loc[0] == "sources" and loc[2] in ("mqtt", "zmq"):
            del loc[2]  # the union's tag, which is not a key in the file
        path = ".".join(p if len(p) <= 60 else echo(p) for p in loc) or "(top level)"
        if err["type"] == "extra_forbidden":
            close = difflib.get_close_matches(str(raw[-1]), sorted(_known_keys(model, raw[:-1])), n=1, cutoff=0.6)
            fix = f"did you mean {close[0]!r}?" if close else "remove it or check its spelling"
            msg = f"unknown key: {fix} (see docs/configuration.md)"
        elif err["type"] == "missing":
            msg = "required key is missing"
        elif err["type"] == "union_tag_invalid":
            msg = "'type' must be 'mqtt' or 'zmq'"
        else:
            got = err.get("input")
            msg = err["msg"][:300] + ("" if isinstance(got, dict | list) else f" (got {echo(got)})")
        lines.append(f"{path}: {msg}")
    if len(lines) > MAX_ERRORS_SHOWN:  # a list of 100,000 wrong items is one mistake, not a page per item
        lines[MAX_ERRORS_SHOWN:] = [f"... and {len(lines) - MAX_ERRORS_SHOWN} more errors"]
    return "; ".join(lines)
