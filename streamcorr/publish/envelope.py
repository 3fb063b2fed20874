"""The wire format of published messages: one versioned msgpack map per snapshot, event or status.

Every message is a msgpack map; any msgpack library can read it. Readers must ignore keys they do not
know (new optional keys do not change ``v``); ``v`` changes only when a reader of the old version would
misread a message.

| field          | type                        | meaning                                                            |
|----------------|-----------------------------|--------------------------------------------------------------------|
| `v`            | int                         | schema version: 1                                                  |
| `kind`         | str                         | `"snapshot"`, `"event"` or `"status"`                              |
| `seq`          | uint                        | +1 per message sent on the topic; a jump means lost messages       |
| `t_ns`         | int (nil in a status)       | stream time, ns (snapshot: end of the newest window)               |
| `wall_ns`      | int                         | wall clock, Unix ns, when the snapshot was made / message encoded  |
| *snapshot:*    |                             |                                                                    |
| `snapshot_seq` | uint                        | the engine's own snapshot counter                                  |
| `channels`     | list of str                 | channel names in matrix order (N of them)                          |
| `mi`           | matrix                      | MI, nats; NaN: never evaluated                                     |
| `age_s`        | matrix                      | seconds (stream time) since the cell was refreshed; inf: never     |
| `coverage`     | matrix                      | share of the newest window looked at with both channels; NaN: none |
| `pairs`        | list of `[i, j, mi]` (opt.) | cells with i < j, largest MI first, after top-k / threshold        |
| `source`       | u1 matrix (opt.)            | what `mi` holds: 0 never assessed, 1 network estimate, 2 screen    |
| `dependent`    | u1 matrix (opt.)            | the change detector's verdict: 1 dependent, 0 not (or not yet)     |
| `n_eff`        | matrix (opt.)               | effective sample size of the newest network window; NaN: never     |
| `lag_s`        | matrix (opt.)               | best lag, s: `[i, j]` > 0 when channel j follows i; NaN: none      |
| `mi_lag`       | matrix (opt.)               | MI at that lag, nats; NaN: no significant lag                      |
| *event:*       |                             |                                                                    |
| `pair`         | `[str, str]`                | the two channels                                                   |
| `change`       | str                         | `"rise"`, `"fall"`, `"became-[in]dependent"` or `"lag-shift"`      |
| `previous`     | float                       | last reported MI of the pair, nats (lag-shift: at the old lag)     |
| `current`      | float                       | MI now, nats (lag-shift: at the new lag)                           |
| `initial`      | bool (opt.; absent: false)  | `became-dependent` at the pair's first assessment, not an onset    |
| `onset_t_ns`   | int or nil (opt.)           | estimated start of the change, stream ns; nil: no estimate         |
| `path`         | str (opt.; absent: window)  | which detector saw it: `"window"` estimate or `"fast"` path        |
| `lag_s`        | float (opt.; lag-shift)     | the pair's best lag now, s (`previous_lag_s`: as last reported)    |
| *status:*      |                             |                                                                    |
| `state`        | str                         | `"online"` or `"offline"`                                          |
| `counters`     | map str -> int or float     | the publisher's counters and rates                                 |

A *matrix* is a map ``{"dtype": "<f4", "shape": [N, N], "data": <bin, N*N*4 bytes>}``: row-major, little-endian IEEE
float32 (NaN and inf are kept). Readers should also accept ``"<f8"``. The `source` matrix is ``"|u1"`` (one byte per
cell), from publishers with dependence screening (an optional key, so `v` stays 1): a cell with source 2 holds the
screen's small-dependence MI figure for a pair that failed the screen this hop, not a network estimate. `dependent`
(``"|u1"``, 0/1: a cell with MI and 0 is not significant) and `n_eff` are optional too, as are `lag_s` and `mi_lag`
(publishers with ``lags.max_s`` set); the four are left out, the last first, of a snapshot they would push past the size
limit: `mi_lag` above about 1,600 channels, `lag_s` above 1,750, `n_eff` above 1,900, `dependent` only near 2,048
channels with names of kilobytes. (``Snapshot.network_age_s``, the age of each pair's last network estimate, stays
in-process: with it a 2,048-channel snapshot would pass the limit.) A `seq` lower than the last one seen means the
publisher restarted. Snapshots sent with ``pairs_only`` (on the ``{prefix}/pairs`` topic) carry `pairs` and no matrices.

Decoding without streamcorr (Python here; any language with msgpack and a float32 view reads the same)::

    import msgpack, numpy as np

    m = msgpack.unpackb(payload, raw=False)
    assert m["v"] == 1, "unknown envelope version"
    if m["kind"] == "snapshot":
        for i, j, value in m.get("pairs", []):
            print(m["channels"][i], m["channels"][j], value)
    if m["kind"] == "snapshot" and "mi" in m:  # the {prefix}/pairs topic's snapshots carry pairs only
        mi = np.frombuffer(m["mi"]["data"], dtype=m["mi"]["dtype"]).reshape(m["mi"]["shape"])
        if "dependent" in m:  # optional: 0/1 per cell
            dependent = np.frombuffer(m["dependent"]["data"], dtype=np.uint8).reshape(mi.shape).astype(bool)
    elif m["kind"] == "event":
        print(m["pair"], m["change"], m["previous"], "->", m["current"], m.get("initial", False))
        # when the change began (stream ns; nil: no estimate) and which detector saw it ("window" or "fast")
        print(m["t_ns"] - (m.get("onset_t_ns") or m["t_ns"]), "ns after the onset", m.get("path", "window"))

Round trip with streamcorr:

>>> import numpy as np
>>> snap = Snapshot(
...     7, 10**9, 0, ("a", "b"), np.array([[np.nan, 0.5], [0.5, np.nan]]), np.full((2, 2), np.inf), np.ones((2, 2))
... )
>>> msg = decode_message(encode_snapshot(snap, seq=3, top_k=1))
>>> msg.kind, msg.seq, msg.body.seq, float(msg.body.mi[0, 1]), msg.pairs
('snapshot', 3, 7, 0.5, ((0, 1, 0.5),))
>>> screened = Snapshot(
...     7, 10**9, 0, ("a", "b"), snap.mi, snap.age_s, snap.coverage, source=np.array([[0, 2], [2, 0]], dtype=np.uint8)
... )
>>> decode_message(encode_snapshot(screened)).body.source.tolist()  # 2: the screen's figure, not the network's
[[0, 2], [2, 0]]
>>> out = decode(encode_snapshot(replace(snap, dependent=np.eye(2) == 0, n_eff=np.full((2, 2), 812.5))))
>>> out.dependent.tolist(), float(out.n_eff[0, 1]), snap.dependent is None  # None: not sent
([[False, True], [True, False]], 812.5, True)
>>> ev = ChangeEvent(("a", "b"), 0.0, 0.4, 10**9, "became-dependent", initial=True)
>>> decode(encode_event(ev, seq=1)).initial
True
>>> out = decode(encode_event(replace(ev, onset_t_ns=4 * 10**8, path="fast"), seq=2))  # when it began, who saw it
>>> out.onset_t_ns, out.path
(400000000, 'fast')
>>> out = decode(encode_event(replace(ev, kind="lag-shift", lag_s=0.3, previous_lag_s=0.1), seq=3))
>>> out.kind, out.lag_s, out.previous_lag_s  # the second channel now follows the first by 0.3 s
('lag-shift', 0.3, 0.1)
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

import msgpack
import numpy as np

from ..engine.changes import ChangeEvent, EventKind
from ..engine.matrix import Snapshot
from ..errors import ConfigError, InputError

__all__ = ["MAX_ENVELOPE_BYTES", "STREAMS", "VERSION", "EnvelopeError", "Message", "Status", "check_event",
           "check_pair_selection", "check_snapshot", "decode", "decode_message", "encode_event", "encode_snapshot",
           "encode_status", "topic"]  # fmt: skip

VERSION = 1
MAX_ENVELOPE_BYTES = 64 * 2**20  # larger payloads are refused unread (a 2,000-channel snapshot is ~48 MiB)
STREAMS = ("snapshot", "event", "status", "pairs")  # topic suffixes: {prefix}/{stream}

Kind = Literal["snapshot", "event", "status"]
StatusState = Literal["online", "offline"]
_MATRIX_DTYPE = "<f4"  # float32 keeps NaN and inf, halves the bytes; MI needs no more than ~7 digits
_READ_DTYPES = ("<f4", "<f8")
_BYTE_DTYPE = "|u1"  # the source and dependent matrices: one byte per cell
# the snapshot's matrices in the order sent, with their dtype on the wire; None in a Snapshot: not sent
_WIRE = {"mi": _MATRIX_DTYPE, "age_s": _MATRIX_DTYPE, "coverage": _MATRIX_DTYPE, "source": _BYTE_DTYPE,
         "dependent": _BYTE_DTYPE, "n_eff": _MATRIX_DTYPE, "lag_s": _MATRIX_DTYPE, "mi_lag": _MATRIX_DTYPE}  # fmt: skip
_IF_ROOM = ("dependent", "n_eff", "lag_s", "mi_lag")  # sent only when they fit under MAX_ENVELOPE_BYTES, in order
_CHANGES = frozenset(get_args(EventKind))
_UINT64_MAX, _INT64 = 2**64 - 1, (-(2**63), 2**63 - 1)
_SNAPSHOT_OVERHEAD = 1024  # envelope fields other than names and matrices, with room to spare


class EnvelopeError(InputError):
    """A payload is not a valid streamcorr envelope (garbage, unknown version, missing or mistyped field)."""


@dataclass(frozen=True)
class Status:
    """A publisher's state and counters, as published on ``{prefix}/status``."""

    state: StatusState
    counters: Mapping[str, int | float] = field(default_factory=dict)
    t_ns: int | None = None  # stream time, when the publisher knows one
    wall_ns: int = 0


@dataclass(frozen=True)
class Message:
    """A decoded envelope: the body plus the fields of the envelope itself.

    ``pairs`` holds the ``[i, j, mi]`` list when the snapshot carried one (None otherwise). A pairs-only
    snapshot decodes to a ``Snapshot`` whose ``mi`` has those cells (NaN elsewhere) and whose ``age_s``
    and ``coverage`` are all NaN (not sent).
    """

    kind: Kind
    seq: int
    body: Snapshot | ChangeEvent | Status
    wall_ns: int
    version: int = VERSION
    pairs: tuple[tuple[int, int, float], ...] | None = None


def topic(prefix: str, stream: str) -> str:
    """The topic of one stream, e.g. ``topic("streamcorr", "snapshot") == "streamcorr/snapshot"``."""
    if stream not in STREAMS:
        raise ConfigError(f"stream must be one of {STREAMS}; got {stream!r}")
    return f"{check_prefix(prefix)}/{stream}"


def check_prefix(prefix: str) -> str:
    if not isinstance(prefix, str) or not prefix or prefix.endswith("/") or any(c in prefix for c in "+#\0"):
        raise ConfigError(f"prefix must be a non-empty topic without '+', '#' or a trailing '/'; got {prefix!r}")
    return prefix


def _check_seq(seq: object) -> int:
    if isinstance(seq, bool) or not isinstance(seq, numbers.Integral) or not 0 <= int(seq) <= _UINT64_MAX:
        raise InputError(f"seq must be an unsigned 64-bit integer; got {seq!r}")
    return int(seq)


def check_pair_selection(top_k: int | None, threshold: float | None) -> None:
    """Raise ConfigError unless top_k is None or >= 1 and threshold is None or a finite number."""
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1):
        raise ConfigError(f"top_k must be a positive integer or None; got {top_k!r}")
    if threshold is not None and not (isinstance(threshold, numbers.Real) and math.isfinite(threshold)):
        raise ConfigError(f"threshold must be a finite number of nats or None; got {threshold!r}")


def check_snapshot(snap: Snapshot) -> int:
    """Raise InputError unless the snapshot can be encoded; returns its channel count N."""
    return _check_snapshot(snap)[0]


def _check_snapshot(snap: Snapshot) -> tuple[int, int]:
    """(N, the envelope's size bound in bytes without the matrices sent only when they fit: _IF_ROOM)."""
    n = len(snap.channels)
    if len(set(snap.channels)) != n:
        raise InputError(f"snapshot channels must be unique; got {n} names, some repeated")
    names_bytes = 0
    for name in snap.channels:
        if not isinstance(name, str):
            raise InputError(f"snapshot channel names must be strings; got {type(name).__name__}")
        try:
            names_bytes += len(name.encode("utf-8")) + 5  # msgpack str header: at most 5 bytes
        except UnicodeEncodeError as exc:
            raise InputError(f"snapshot channel name {name!r:.80} is not valid UTF-8: {exc.reason}") from None
    sent = [k for k in _WIRE if k not in _IF_ROOM and getattr(snap, k) is not None]
    size = sum(np.dtype(_WIRE[k]).itemsize for k in sent) * n * n + names_bytes + _SNAPSHOT_OVERHEAD
    if size > MAX_ENVELOPE_BYTES:
        msg = f"a snapshot of {n} channels ({names_bytes} bytes of names) would exceed {MAX_ENVELOPE_BYTES} bytes"
        raise InputError(msg + "; lower channels.max_channels or channels.max_name_bytes")
    for name in _WIRE:
        if getattr(snap, name) is None:  # only the optional matrices may be None
            continue
        shape = np.shape(getattr(snap, name))
        if shape != (n, n):
            raise InputError(f"snapshot.{name} must have shape ({n}, {n}) for {n} channels; got {shape}")
    _check_seq(snap.seq)
    return n, size


def check_event(ev: ChangeEvent) -> None:
    """Raise InputError unless the event can be encoded."""
    if ev.kind not in _CHANGES:
        raise InputError(f"event kind must be one of {sorted(_CHANGES)}; got {ev.kind!r}")
    if len(ev.pair) != 2:
        raise InputError(f"event pair must be two channel names; got {ev.pair!r}")


def _matrix(a: np.ndarray, n: int, dtype: str = _MATRIX_DTYPE) -> dict[str, Any]:
    data = np.ascontiguousarray(a, dtype=dtype).tobytes()
    return {"dtype": dtype, "shape": [n, n], "data": data}


def encode_snapshot(
    snap: Snapshot, *, seq: int | None = None, top_k: int | None = None, threshold: float | None = None,
    pairs_only: bool = False,
) -> bytes:  # fmt: skip
    """The envelope of a snapshot; ``seq`` defaults to the snapshot's own. With ``top_k`` and/or
    ``threshold`` a ``pairs`` list is added; ``pairs_only`` leaves the matrices out."""
    check_pair_selection(top_k, threshold)
    if pairs_only and top_k is None and threshold is None:
        raise ConfigError("pairs_only needs top_k and/or threshold (otherwise the message would be empty)")
    n, size = _check_snapshot(snap)
    msg: dict[str, Any] = {
        "v": VERSION,
        "kind": "snapshot",
        "seq": _check_seq(snap.seq if seq is None else seq),
        "t_ns": int(snap.t_ns),
        "wall_ns": int(snap.wall_ns),
        "snapshot_seq": int(snap.seq),
        "channels": [str(c) for c in snap.channels],
    }
    mi32 = np.asarray(snap.mi, dtype=np.float32)
    for key, dtype in () if pairs_only else _WIRE.items():
        value, cell_bytes = getattr(snap, key), np.dtype(dtype).itemsize * n * n
        if value is None or (key in _IF_ROOM and size + cell_bytes > MAX_ENVELOPE_BYTES):
            continue
        size += cell_bytes if key in _IF_ROOM else 0  # the others are in the size already
        msg[key] = _matrix(mi32 if key == "mi" else value, n, dtype)  # a bool matrix goes as bytes 0 / 1
    if top_k is not None or threshold is not None:
        # ranked in float32, so that a pair and its matrix cell are the same number
        picked = replace(snap, mi=mi32).top_pairs(top_k, threshold)
        msg["pairs"] = [[i, j, value] for i, j, value in picked]
    return msgpack.packb(msg, use_bin_type=True)


def encode_event(ev: ChangeEvent, *, seq: int, wall_ns: int | None = None) -> bytes:
    """The envelope of a change event."""
    check_event(ev)
    msg = {
        "v": VERSION,
        "kind": "event",
        "seq": _check_seq(seq),
        "t_ns": int(ev.t_ns),
        "wall_ns": time.time_ns() if wall_ns is None else int(wall_ns),
        "pair": [str(ev.pair[0]), str(ev.pair[1])],
        "change": ev.kind,
        "previous": float(ev.previous),
        "current": float(ev.current),
        "initial": bool(ev.initial),
        "onset_t_ns": None if ev.onset_t_ns is None else int(ev.onset_t_ns),
        "path": ev.path,
    }
    if ev.lag_s is not None:
        msg["lag_s"], msg["previous_lag_s"] = float(ev.lag_s), ev.previous_lag_s
    return msgpack.packb(msg, use_bin_type=True)


def encode_status(
    state: str, counters: Mapping[str, float | int], *, seq: int, t_ns: int | None = None, wall_ns: int | None = None
) -> bytes:
    """The envelope of a status message; counter values must be numbers (numpy scalars are fine)."""
    if state not in ("online", "offline"):
        raise InputError(f"status state must be 'online' or 'offline'; got {state!r}")
    clean: dict[str, int | float] = {}
    for key, value in counters.items():
        if not isinstance(key, str) or isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise InputError(f"status counters map names to numbers; got {key!r}: {value!r}")
        clean[key] = int(value) if isinstance(value, numbers.Integral) else float(value)
    msg = {
        "v": VERSION,
        "kind": "status",
        "seq": _check_seq(seq),
        "t_ns": None if t_ns is None else int(t_ns),
        "wall_ns": time.time_ns() if wall_ns is None else int(wall_ns),
        "state": state,
        "counters": clean,
    }
    return msgpack.packb(msg, use_bin_type=True)


# -- decoding: every check raises EnvelopeError naming the field -----------------------------------------
def _get(m: Mapping[str, Any], key: str, kinds: type | tuple[type, ...], what: str) -> Any:
    if key not in m:
        raise EnvelopeError(f"{what} envelope has no {key!r} field")
    value = m[key]
    if isinstance(value, bool) or not isinstance(value, kinds):  # no field is a bool
        names = "/".join(k.__name__ for k in (kinds if isinstance(kinds, tuple) else (kinds,)))
        raise EnvelopeError(f"{what} field {key!r} has type {type(value).__name__}; expected {names}")
    return value


def _int(m: Mapping[str, Any], key: str, what: str, lo: int = _INT64[0], hi: int = _INT64[1]) -> int:
    value: int = _get(m, key, int, what)
    if not lo <= value <= hi:
        raise EnvelopeError(f"{what} field {key!r} = {value} is out of range [{lo}, {hi}]")
    return value


def _decode_matrix(m: Mapping[str, Any], key: str, n: int, dtypes: tuple[str, ...] = _READ_DTYPES) -> np.ndarray:
    spec = _get(m, key, dict, "snapshot")
    dtype = spec.get("dtype")
    if dtype not in dtypes:
        raise EnvelopeError(f"snapshot matrix {key!r} has dtype {dtype!r}; this reader knows {dtypes}")
    if spec.get("shape") != [n, n]:
        raise EnvelopeError(f"snapshot matrix {key!r} has shape {spec.get('shape')!r}; expected [{n}, {n}]")
    data = spec.get("data")
    itemsize = np.dtype(dtype).itemsize
    if not isinstance(data, bytes) or len(data) != n * n * itemsize:
        size = len(data) if isinstance(data, bytes) else type(data).__name__
        raise EnvelopeError(f"snapshot matrix {key!r} data must be {n * n * itemsize} bytes; got {size}")
    if dtype == _BYTE_DTYPE:
        return np.frombuffer(data, dtype=np.uint8).reshape(n, n).copy()
    with np.errstate(invalid="ignore"):  # a signalling NaN on the wire stays a NaN, without a warning
        return np.frombuffer(data, dtype=dtype).reshape(n, n).astype(np.float64)


def _decode_pairs(raw: Any, n: int) -> tuple[tuple[int, int, float], ...]:
    if not isinstance(raw, list):
        raise EnvelopeError(f"snapshot field 'pairs' must be a list; got {type(raw).__name__}")
    out = []
    for entry in raw:
        ok = isinstance(entry, list) and len(entry) == 3
        ok = ok and all(type(x) is int and 0 <= x < n for x in entry[:2])
        ok = ok and type(entry[2]) in (int, float)
        if not ok:
            raise EnvelopeError(f"snapshot pairs entries must be [i, j, mi] with 0 <= i, j < {n}; got {entry!r}")
        out.append((entry[0], entry[1], float(entry[2])))
    return tuple(out)


def _decode_snapshot(m: Mapping[str, Any], seq: int, wall_ns: int) -> Message:
    channels = _get(m, "channels", list, "snapshot")
    if not all(isinstance(c, str) for c in channels):
        raise EnvelopeError("snapshot field 'channels' must be a list of strings")
    if len(set(channels)) != len(channels):
        raise EnvelopeError("snapshot field 'channels' has duplicate names")
    n = len(channels)
    pairs = _decode_pairs(m["pairs"], n) if "pairs" in m else None
    extra: dict[str, np.ndarray] = {}  # the optional matrices sent
    if "mi" in m:
        mi, age_s, coverage = (_decode_matrix(m, key, n) for key in ("mi", "age_s", "coverage"))
        for key in (k for k in _WIRE if k in m and k not in ("mi", "age_s", "coverage")):
            extra[key] = _decode_matrix(m, key, n, (_BYTE_DTYPE,) if _WIRE[key] == _BYTE_DTYPE else _READ_DTYPES)
        if "dependent" in extra:
            extra["dependent"] = extra["dependent"] != 0
    elif pairs is not None:
        mi = np.full((n, n), np.nan)
        for i, j, value in pairs:
            mi[i, j] = mi[j, i] = value
        age_s, coverage = np.full((n, n), np.nan), np.full((n, n), np.nan)
    else:
        raise EnvelopeError("snapshot envelope has neither matrices ('mi') nor 'pairs'")
    snap = Snapshot(_int(m, "snapshot_seq", "snapshot", 0, _UINT64_MAX), _int(m, "t_ns", "snapshot"), wall_ns,
                    tuple(channels), mi, age_s, coverage, **extra)  # type: ignore[arg-type]  # fmt: skip
    return Message("snapshot", seq, snap, wall_ns, VERSION, pairs)


def _decode_event(m: Mapping[str, Any], seq: int, wall_ns: int) -> Message:
    pair = _get(m, "pair", list, "event")
    if len(pair) != 2 or not all(isinstance(c, str) for c in pair):
        raise EnvelopeError(f"event field 'pair' must be two channel names; got {pair!r}")
    change = _get(m, "change", str, "event")
    if change not in _CHANGES:
        raise EnvelopeError(f"event field 'change' must be one of {sorted(_CHANGES)}; got {change!r}")
    previous = float(_get(m, "previous", (int, float), "event"))
    current = float(_get(m, "current", (int, float), "event"))
    initial = m.get("initial", False)  # absent from older publishers
    if not isinstance(initial, bool):
        raise EnvelopeError(f"event field 'initial' has type {type(initial).__name__}; expected bool")
    onset = None if m.get("onset_t_ns") is None else _int(m, "onset_t_ns", "event")  # absent (older) or nil
    if (path := m.get("path", "window")) not in ("window", "fast"):
        raise EnvelopeError(f"event field 'path' must be 'window' or 'fast'; got {path!r:.40}")
    lags = [m.get(k) for k in ("lag_s", "previous_lag_s")]  # lag-shift only
    if not all(v is None or type(v) in (int, float) for v in lags):
        raise EnvelopeError(f"event fields 'lag_s', 'previous_lag_s' must be numbers or nil; got {lags!r:.60}")
    ev = ChangeEvent((pair[0], pair[1]), previous, current, _int(m, "t_ns", "event"), change, initial, onset, path,
                     *(None if v is None else float(v) for v in lags))  # fmt: skip
    return Message("event", seq, ev, wall_ns)


def _decode_status(m: Mapping[str, Any], seq: int, wall_ns: int) -> Message:
    state = _get(m, "state", str, "status")
    if state not in ("online", "offline"):
        raise EnvelopeError(f"status field 'state' must be 'online' or 'offline'; got {state!r}")
    counters = _get(m, "counters", dict, "status")
    if not all(isinstance(k, str) and type(v) in (int, float) for k, v in counters.items()):
        raise EnvelopeError("status field 'counters' must map names to numbers")
    t_ns = None if m.get("t_ns") is None else _int(m, "t_ns", "status")
    return Message("status", seq, Status(state, counters, t_ns, wall_ns), wall_ns)


def decode_message(payload: bytes | bytearray | memoryview) -> Message:
    """Decode and check one envelope; anything else raises :class:`EnvelopeError` (never another error)."""
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise EnvelopeError(f"an envelope is bytes; got {type(payload).__name__}")
    if len(payload) > MAX_ENVELOPE_BYTES:
        raise EnvelopeError(f"envelope of {len(payload)} bytes exceeds the {MAX_ENVELOPE_BYTES}-byte limit")
    try:
        m = msgpack.unpackb(payload, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises ValueError, TypeError, StackError, ... on garbage
        raise EnvelopeError(f"not a msgpack envelope: {type(exc).__name__}: {exc}") from exc
    if not isinstance(m, dict):
        raise EnvelopeError(f"an envelope is a msgpack map; got {type(m).__name__}")
    if "v" not in m:
        raise EnvelopeError("not a streamcorr envelope: no 'v' (version) field")
    if m["v"] != VERSION or type(m["v"]) is not int:
        raise EnvelopeError(f"unsupported envelope version {m['v']!r}: this streamcorr reads version {VERSION}")
    kind = _get(m, "kind", str, "the")
    seq = _int(m, "seq", kind, 0, _UINT64_MAX)
    wall_ns = _int(m, "wall_ns", kind)
    if kind == "snapshot":
        return _decode_snapshot(m, seq, wall_ns)
    if kind == "event":
        return _decode_event(m, seq, wall_ns)
    if kind == "status":
        return _decode_status(m, seq, wall_ns)
    raise EnvelopeError(f"unknown envelope kind {kind!r}; expected 'snapshot', 'event' or 'status'")


def decode(payload: bytes | bytearray | memoryview) -> Snapshot | ChangeEvent | Status:
    """The body of one envelope (see :func:`decode_message` for the sequence number and pairs)."""
    return decode_message(payload).body
