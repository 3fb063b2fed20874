"""The channel-name rule, checked where names enter (payload decoding, ``Engine.push``, the config).

A channel name is accepted when it is a ``str`` that

* encodes to UTF-8 (no lone surrogates such as JSON's ``"\\ud800"``),
* is between 1 and ``max_bytes`` bytes long in UTF-8 (default 256),
* has only printable characters (``str.isprintable``: no control, format, separator other than the ASCII
  space, private-use, surrogate or unassigned code points).

Anything else is refused and counted by the caller (drop reason ``name``), so every name that reaches a
snapshot can be encoded, and N names cost at most N x ``max_bytes`` bytes in each snapshot.

>>> name_problem("robot.arm/ax"), name_problem(""), name_problem("a\\nb"), name_problem("\\ud800")
(None, 'empty', 'not printable', 'not valid UTF-8')
>>> name_problem("x" * 300)
'longer than 256 bytes'
"""

from __future__ import annotations

from .errors import ConfigError

__all__ = ["MAX_NAME_BYTES", "check_max_name_bytes", "name_problem"]

MAX_NAME_BYTES = 256  # default bound on a channel name, UTF-8 bytes
MAX_NAME_BYTES_LIMIT = 4096  # the largest bound a configuration may set


def name_problem(name: object, max_bytes: int = MAX_NAME_BYTES) -> str | None:
    """Why ``name`` is not an acceptable channel name, or None if it is."""
    if not isinstance(name, str):
        return f"not a string ({type(name).__name__})"
    if not name:
        return "empty"
    if len(name) > max_bytes:  # a cheap bound first: UTF-8 has at least one byte per character
        return f"longer than {max_bytes} bytes"
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return "not valid UTF-8"
    if size > max_bytes:
        return f"longer than {max_bytes} bytes"
    if not name.isprintable():
        return "not printable"
    return None


def check_max_name_bytes(max_bytes: int) -> int:
    """max_bytes if it is a usable bound, else ConfigError naming the range."""
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or not 1 <= max_bytes <= MAX_NAME_BYTES_LIMIT:
        raise ConfigError(f"max_name_bytes must be an integer in [1, {MAX_NAME_BYTES_LIMIT}]; got {max_bytes!r}")
    return max_bytes
