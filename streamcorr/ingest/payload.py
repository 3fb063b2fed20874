"""Payload decoding: message bytes (MQTT or ZeroMQ) -> per-channel batches of (t_s, value) samples.

Transport-independent and synchronous. ``PayloadDecoder.decode`` never raises on a bad payload: every item
of a message is either returned as a sample or counted, by reason, in ``decoder.counters.drops``.

Wire formats
------------
A payload is UTF-8 JSON, msgpack, or a bare number. With ``format="auto"`` (the default) the first byte
decides: ``{`` (after optional whitespace) is JSON; a msgpack map header (0x80-0x8f, 0xde, 0xdf) is msgpack;
anything else is tried as an ASCII number, then, if it is ASCII text, as JSON (an array, a string or a
status word is counted, not read), else as msgpack. msgpack's only ASCII payloads are one-byte integers, so
a bare msgpack integer from 32 to 127 (a printable character, say ``K`` for 75) is read as text and dropped:
send such a value in a map, or as a float. Three shapes are understood:

1. **Bare number** -- ``23.5`` (ASCII text, or a JSON or msgpack number). One sample, key ``value``, stamped
   with the arrival time.
2. **Fields** -- an object (JSON object or msgpack map with string keys) of one sample per channel:
   ``{"t": 1712.5, "ax": 0.1, "ay": 0.2}``. Each field other than the reserved names below is a channel
   (key = field name) and must be a number. Without a time field all samples get the arrival time.
3. **Chunk** -- many samples and channels per message; an object with a ``channels`` field:

   * ``{"t": [t_0, ..., t_n-1], "channels": {"ax": [n numbers], "ay": [n numbers]}}`` -- explicit times; every
     channel array must have the length of ``t``.
   * ``{"t0": start, "dt": period, "channels": {"ax": [...], ...}}`` -- sample k of each channel is at
     ``t0 + k * dt`` (``dt`` > 0); channel arrays may differ in length here.
   * In msgpack, any of these arrays (``t`` and channel arrays) may instead be a bin (bytes) value holding
     little-endian IEEE-754 float64 (numpy ``"<f8"``), 8 bytes per element.

Reserved names, never channels: the time field (``t`` unless ``time_field`` says otherwise), ``t0``, ``dt``,
``channels`` and ``seq``. ``seq`` (optional, an integer incremented by one per message and topic) lets the
decoder count messages lost before they reached it (``seq_gaps``), e.g. ZeroMQ high-water drops, which are
otherwise silent at the receiver.

All times (``t``, ``t0``, ``dt``) are numbers in ``time_unit`` (seconds by default), usually since the Unix
epoch. They are converted to float64 seconds (about 0.24 us resolution today) and must be finite and below
9e9 s (the engine's int64 nanosecond clock). Values are float64. JSON has no NaN: the non-standard tokens
``NaN``, ``Infinity`` and ``-Infinity`` are accepted and ``null`` is read as NaN; such samples are handed on
and the engine counts them as non-finite. Numbers beyond float64 (``1e400`` in JSON) become +-inf; an
integer too large to convert is dropped ("range").

Channel names come from ``channel_template``, a ``str.format`` template over ``{topic}`` (the whole topic),
``{topic[0]}``, ``{topic[1]}``, ... (its ``/``-separated levels; ``{topic[-1]}`` is the last) and ``{key}``
(the field name). Topic ``robot/arm/imu1`` with ``"{topic[2]}.{key}"`` gives ``imu1.ax``. The name must
follow the channel-name rule of :mod:`streamcorr.names` (valid UTF-8, printable, 1 to ``max_name_bytes``
bytes), and a topic may be at most ``max_topic_bytes`` UTF-8 bytes.

Settings: the config section :class:`streamcorr.config.Payload` holds every key with its default and bounds;
``PayloadDecoder(settings, **overrides)`` takes one (a source's section will do) and keyword overrides of its
keys, validated the same way (a bad value is a ConfigError naming the key).

Memory: the decoder remembers the channel name of each (topic, field) and the last ``seq`` of each topic;
both caches are bounded in bytes (``CACHE_BYTES`` each, counting topics, keys and names) and are cleared
when full, which only costs the next messages a fresh lookup (and a ``seq`` gap cannot be seen across one).

Drop reasons (items counted, each under the first reason that applies)
--------------------------------------------------------------------
Whole messages whose item count cannot be known count as one: ``oversize`` (more than
``max_payload_bytes``), ``topic`` (a topic longer than ``max_topic_bytes``), ``empty`` (zero bytes, or
nothing in it to decode), ``decode`` (not valid in the format), ``schema`` (parsed, but neither a number
nor an object; or ``channels`` is not a non-empty object).
Per item: ``schema`` (a chunk without usable timing; an unknown or misused top-level key of a chunk; a bad
``seq``), ``key`` (a field name that is not a string), ``template`` (the topic lacks a level the template
needs, or the name is empty), ``name`` (the channel name breaks the channel-name rule: invalid UTF-8 such
as a lone surrogate, a control or other unprintable character, or longer than ``max_name_bytes``),
``type`` (a value that is not a number: string, bool, nested object, or an array that is neither a list
nor whole float64 bytes -- counted as one), ``range`` (integer beyond float64),
``length`` (a channel array whose length differs from ``t``), ``time`` (its time is missing, not a number,
not finite or out of range), ``too_many_samples`` (the message holds more than ``max_samples_per_message``:
all its samples).
"""

from __future__ import annotations

import logging
import re
import string
from collections.abc import Iterable
from typing import Any

import numpy as np
from pydantic import ValidationError

from ..config import Payload, echo
from ..errors import ConfigError
from ..names import MAX_NAME_BYTES, check_max_name_bytes, name_problem
from .source import Batch, Gather, IngestCounters, RateLimitedLog
from .values import array_len, is_number, parse, sample_array, sample_value, time_scalar

__all__ = ["Batch", "PayloadDecoder"]

log = logging.getLogger("streamcorr.ingest.payload")

_UNIT_S = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
MAX_ABS_T_S = 9e9  # the engine refuses |t| > 9e18 ns (int64 nanoseconds end at 9.22e18)
_FIELD = re.compile(r"^(?:key|topic(?:\[-?\d+\])?)$")
_MISSING = object()
_CACHE_MAX = 65_536  # entries per cache (names, seq numbers); cleared when full
CACHE_BYTES = 4 << 20  # bytes per cache (topics, keys and names counted); cleared when over
_ENTRY_BYTES = 200  # a cache entry's overhead beyond its strings (dict slot, tuple, str headers)


class _Topic:
    """A topic as the template sees it: formats as the whole topic, indexes as its levels."""

    __slots__ = ("levels", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.levels = text.split("/")

    def __format__(self, spec: str) -> str:
        return format(self.text, spec)

    def __str__(self) -> str:
        return self.text

    def __getitem__(self, index: int | str) -> str:
        return self.levels[int(index)]  # str.format passes "-1" as a string, 0 as an int


class PayloadDecoder:
    """Turns message payloads into per-channel sample batches, counting whatever it cannot use.

    >>> dec = PayloadDecoder(channel_template="{topic[2]}.{key}")
    >>> [(b.channel, b.t_s.tolist(), b.values.tolist())
    ...  for b in dec.decode("robot/arm/imu1", b'{"t": 1712.5, "ax": 0.1, "ay": "x"}', arrival_s=0.0)]
    [('imu1.ax', [1712.5], [0.1])]
    >>> dec.counters.samples_decoded, dec.counters.drops
    (1, {'type': 1})
    >>> [b.t_s.tolist() for b in dec.decode("a/b/c", b'{"t0": 10, "dt": 0.5, "channels": {"v": [1, 2]}}', 0.0)]
    [[10.0, 10.5]]
    """

    def __init__(
        self,
        settings: Payload | None = None,
        *,
        max_name_bytes: int = MAX_NAME_BYTES,
        seq_field: str | None = "seq",
        counters: IngestCounters | None = None,
        **overrides: Any,
    ) -> None:
        self.settings = p = payload_settings(settings, overrides)
        if p.time_field in ("t0", "dt", "channels") or p.time_field == seq_field or not p.time_field:
            raise ConfigError(f"time_field {p.time_field!r} is empty or clashes with a reserved name")
        _check_template(p.channel_template)
        check_max_name_bytes(max_name_bytes)
        # the settings, as attributes read on every message
        self.format = p.format
        self.channel_template = p.channel_template
        self.time_field = p.time_field
        self.time_scale = _UNIT_S[p.time_unit]
        self.max_payload_bytes = p.max_payload_bytes
        self.max_samples_per_message = p.max_samples_per_message
        self.max_topic_bytes = p.max_topic_bytes
        self.max_name_bytes = max_name_bytes
        self.seq_field = seq_field
        self.counters = counters if counters is not None else IngestCounters()
        self._reserved = {p.time_field, "t0", "dt", "channels"} | ({seq_field} if seq_field else set())
        self._names: dict[tuple[str, str], tuple[str | None, str]] = {}  # -> (name, "" | drop reason)
        self._names_bytes = 0
        self._last_seq: dict[str, int] = {}
        self._seq_bytes = 0
        self._rate_log = RateLimitedLog(log)
        self._msg_drops = 0  # items dropped in the message being decoded

    # -- public -----------------------------------------------------------------------------------
    def decode(self, topic: str, payload: bytes, arrival_s: float) -> list[Batch]:
        """Samples in one message, one batch per channel; bad items are counted, never raised."""
        gather = Gather()
        self._decode_into(gather, topic, payload, arrival_s)
        return gather.batches()

    def decode_many(self, messages: Iterable[tuple[str, bytes, float]]) -> list[Batch]:
        """Samples of many (topic, payload, arrival_s) messages, one batch per channel in message order: a
        reading's one sample per message costs a list append, and each channel one array at the end. A decoder
        bug on a message is counted ("internal") and logged, its samples taken back, and the next message decoded."""
        gather = Gather()
        for topic, payload, arrival_s in messages:
            gather.begin()
            try:
                self._decode_into(gather, topic, payload, arrival_s)
            except Exception:
                gather.rollback()
                self.counters.drop("internal")
                self._rate_log(logging.ERROR, "internal", "decoder failed on a message for %r", topic, exc_info=True)
        return gather.batches()

    def _decode_into(self, gather: Gather, topic: str, payload: bytes, arrival_s: float) -> None:
        self.counters.messages += 1
        self._msg_drops = 0
        if len(payload) > self.max_payload_bytes:
            return self._drop(topic, "oversize", f"{len(payload)} bytes > max_payload_bytes")
        if len(payload) == 0:
            return self._drop(topic, "empty", "zero-length payload")
        if len(topic) > self.max_topic_bytes or len(topic.encode("utf-8", "surrogatepass")) > self.max_topic_bytes:
            return self._drop(topic[:64], "topic", f"topic longer than max_topic_bytes ({self.max_topic_bytes})")
        try:
            obj = self._parse(bytes(payload))
        except Exception as exc:  # any parser failure (ValueError, RecursionError, msgpack errors) is "decode"
            return self._drop(topic, "decode", self._undecodable(payload, exc))
        before = gather.count
        if isinstance(obj, dict):
            self._object(gather, topic, obj, arrival_s)
        elif is_number(obj) or obj is None:
            self._fields(gather, topic, {"value": obj}, arrival_s)
        else:
            return self._drop(topic, "schema", f"top level is {type(obj).__name__}, not a number or object")
        if gather.count == before and not self._msg_drops:  # nothing to decode and nothing wrong: still accounted
            self._drop(topic, "empty", "no samples in the message")
        self.counters.samples_decoded += gather.count - before
        return None

    def channel(self, topic: str, key: str) -> str | None:
        """The channel name for a topic and field, or None where the template cannot be filled or the name
        breaks the channel-name rule."""
        return self._resolve(topic, key)[0]

    def _resolve(self, topic: str, key: str) -> tuple[str | None, str]:
        """(name, "") or (None, drop reason: "template" or "name"), remembered in a byte-bounded cache."""
        cache_key = (topic, key)
        hit = self._names.get(cache_key)
        if hit is not None:
            return hit
        try:
            name: str | None = self.channel_template.format(topic=_Topic(topic), key=key) or None
        except (IndexError, ValueError, KeyError):
            name = None
        out: tuple[str | None, str] = (None, "template")
        if name is not None:
            out = (name, "") if name_problem(name, self.max_name_bytes) is None else (None, "name")
        size = len(topic) + len(key) + len(out[0] or "") + _ENTRY_BYTES
        if size > CACHE_BYTES // 16:  # a huge key (refused, most likely) is not worth a slot
            return out
        if len(self._names) >= _CACHE_MAX or self._names_bytes + size > CACHE_BYTES:
            self._names.clear()
            self._names_bytes = 0
        self._names[cache_key] = out
        self._names_bytes += size
        return out

    # -- parsing ----------------------------------------------------------------------------------
    def _parse(self, payload: bytes) -> Any:
        return parse(payload, self.format)

    def _undecodable(self, payload: bytes, exc: Exception) -> str:
        """What a user can act on: the formats tried and how the payload starts (not msgpack's ExtraData)."""
        shown = repr(bytes(payload[:40])) + ("..." if len(payload) > 40 else "")
        if self.format == "auto" and payload[:64].lstrip()[:1] != b"{":
            return f"not JSON, msgpack or a bare number: {shown} (see docs/payloads.md)"
        fmt = "JSON" if self.format in ("auto", "json") else self.format
        return f"not valid {fmt} ({type(exc).__name__}: {str(exc)[:120]}): {shown}"

    def _drop(self, topic: str, reason: str, detail: str, n: int = 1) -> None:
        if n <= 0:
            return
        self.counters.drop(reason, n)
        self._msg_drops += n
        self._rate_log(logging.WARNING, reason, "dropped %d item(s) on %r: %s (%s)", n, topic, reason, detail)

    # -- shapes -----------------------------------------------------------------------------------
    def _object(self, gather: Gather, topic: str, obj: dict[Any, Any], arrival_s: float) -> None:
        if self.seq_field is not None and self.seq_field in obj:
            self._sequence(topic, obj[self.seq_field])
        if "channels" in obj:
            return self._chunk(gather, topic, obj)
        for key in ("t0", "dt"):
            if key in obj and key != self.time_field:
                self._drop(topic, "schema", f"{key!r} outside a chunk")
        fields = {k: v for k, v in obj.items() if k not in self._reserved}
        return self._fields(gather, topic, fields, arrival_s, obj.get(self.time_field, _MISSING))

    def _sequence(self, topic: str, seq: Any) -> None:
        if type(seq) is not int:
            self._drop(topic, "schema", f"seq must be an integer, got {type(seq).__name__}")
            return
        last = self._last_seq.get(topic)
        if last is not None:
            if seq > last + 1:
                self.counters.seq_gaps += seq - last - 1
            elif seq <= last:
                self.counters.seq_resets += 1
        else:
            size = len(topic) + _ENTRY_BYTES
            if len(self._last_seq) >= _CACHE_MAX or self._seq_bytes + size > CACHE_BYTES:
                self._last_seq.clear()
                self._seq_bytes = 0
            self._seq_bytes += size
        self._last_seq[topic] = seq

    def _fields(
        self, gather: Gather, topic: str, fields: dict[Any, Any], arrival_s: float, t_raw: Any = _MISSING
    ) -> None:
        if not fields:
            return None
        if len(fields) > self.max_samples_per_message:
            return self._drop(topic, "too_many_samples", f"{len(fields)} fields", len(fields))
        if t_raw is _MISSING:
            t_s = arrival_s
        else:
            t = time_scalar(t_raw)
            t_s = t * self.time_scale if t is not None else float("nan")
            if not abs(t_s) < MAX_ABS_T_S:  # also catches NaN
                return self._drop(topic, "time", f"bad time {t_raw!r:.40}", len(fields))
        for key, raw in fields.items():
            if not isinstance(key, str):
                self._drop(topic, "key", f"field name {key!r:.40} is not a string")
                continue
            name, why = self._resolve(topic, key)
            if name is None:
                self._drop(topic, why, f"{self.channel_template!r} with key {key!r:.40}")
                continue
            value, reason = sample_value(raw)
            if reason:
                self._drop(topic, reason, f"field {key!r:.40} = {raw!r:.40}")
                continue
            gather.sample(name, t_s, value)
        return None

    def _chunk(self, gather: Gather, topic: str, obj: dict[Any, Any]) -> None:
        chans = obj["channels"]
        if not isinstance(chans, dict) or not chans:
            return self._drop(topic, "schema", "'channels' must be a non-empty object of arrays")
        for key in obj:
            if key not in self._reserved:
                self._drop(topic, "schema", f"unknown key {key!r:.40} in a chunk")
        sizes = {key: array_len(arr) for key, arr in chans.items()}
        total = sum(n if n is not None else 1 for n in sizes.values())
        if total > self.max_samples_per_message:
            return self._drop(topic, "too_many_samples", f"{total} samples", total)
        times = self._chunk_times(topic, obj)
        for key, arr in chans.items():
            n = sizes[key]
            count = n if n is not None else 1
            if not isinstance(key, str):
                self._drop(topic, "key", f"channel name {key!r:.40} is not a string", count)
                continue
            name, why = self._resolve(topic, key)
            if name is None:
                self._drop(topic, why, f"{self.channel_template!r} with key {key!r:.40}", count)
                continue
            if n is None:
                self._drop(topic, "type", f"channel {key!r:.40} is {type(arr).__name__}, not an array")
                continue
            if times is None:
                self._drop(topic, "schema", "chunk without 't' array or 't0' and 'dt'", n)
                continue
            if isinstance(times, tuple):
                t0, dt = times
                t_s = t0 + dt * np.arange(n)
            elif len(times) != n:
                self._drop(topic, "length", f"channel {key!r:.40} has {n} samples, 't' has {len(times)}", n)
                continue
            else:
                t_s = times
            values, value_ok, n_type, n_range = sample_array(arr)
            self._drop(topic, "type", f"non-numbers in channel {key!r:.40}", n_type)
            self._drop(topic, "range", f"integers beyond float64 in channel {key!r:.40}", n_range)
            time_ok = np.abs(t_s) < MAX_ABS_T_S
            keep = value_ok & time_ok
            self._drop(topic, "time", f"bad times for channel {key!r:.40}", int((value_ok & ~time_ok).sum()))
            if n == 0:
                continue
            if keep.all():
                gather.samples(name, t_s.astype(np.float64, copy=False), values)
            elif keep.any():
                gather.samples(name, t_s[keep], values[keep])
        return None

    def _chunk_times(self, topic: str, obj: dict[Any, Any]) -> np.ndarray | tuple[float, float] | None:
        """Times in seconds: an array (NaN where invalid), (t0_s, dt_s), or None where unusable."""
        if self.time_field in obj:
            raw = obj[self.time_field]
            if array_len(raw) is None:
                return None
            t, ok, _, _ = sample_array(raw)
            t = t * self.time_scale
            t[~ok] = np.nan
            return t
        t0, dt = time_scalar(obj.get("t0")), time_scalar(obj.get("dt"))
        if t0 is None or dt is None or not (dt > 0 and np.isfinite(dt) and np.isfinite(t0)):
            return None
        return t0 * self.time_scale, dt * self.time_scale


def payload_settings(settings: Payload | None, overrides: dict[str, Any]) -> Payload:
    """``settings`` (default: ``Payload()``) with keyword overrides of its keys, validated like the configuration
    file: ConfigError naming each bad key.

    >>> payload_settings(None, {"time_unit": "ms"}).time_unit
    'ms'
    >>> payload_settings(None, {"max_payload_bytes": 0})
    Traceback (most recent call last):
    ...
    streamcorr.errors.ConfigError: max_payload_bytes: Input should be greater than or equal to 16 (got 0)
    """
    if settings is not None and not isinstance(settings, Payload):
        raise ConfigError(f"settings must be a streamcorr.config.Payload section; got {type(settings).__name__}")
    if settings is not None and not overrides and type(settings) is Payload:
        return settings
    keys = set(Payload.model_fields)
    given = settings.model_dump(include=keys) if settings is not None else {}
    try:
        return Payload.model_validate({**given, **overrides})
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            key = ".".join(str(part) for part in err["loc"])
            if err["type"] == "extra_forbidden":
                others = "max_name_bytes, seq_field, counters"
                problems.append(f"{key}: not a decoder setting; use one of {', '.join(Payload.model_fields)}, {others}")
            else:
                problems.append(f"{key}: {err['msg']} (got {echo(err.get('input'))})")
        raise ConfigError("; ".join(problems)) from None


def source_decoder(settings: Payload, index: int, *, max_name_bytes: int = MAX_NAME_BYTES) -> PayloadDecoder:
    """The decoder of the config's source number ``index``; a setting it refuses is named by its key path."""
    try:
        return PayloadDecoder(settings, max_name_bytes=max_name_bytes)
    except ConfigError as exc:
        raise ConfigError(f"sources.{index}.{exc}") from None


def _check_template(template: str) -> None:
    """Raise ConfigError unless the template uses only {topic}, {topic[N]} and {key}."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise ConfigError(f"channel_template {template!r} is not a valid format string: {exc}") from exc
    bad = [f for f in fields if not _FIELD.match(f)]
    if bad:
        msg = f"channel_template {template!r} may use only {{topic}}, {{topic[N]}} and {{key}}; found {bad}"
        raise ConfigError(msg)
    if not template:
        raise ConfigError("channel_template is empty; use e.g. '{topic}/{key}'")
    try:
        template.format(topic=_Topic("/".join(["x"] * 1000)), key="k")
    except (ValueError, IndexError) as exc:
        raise ConfigError(f"channel_template {template!r} cannot be filled: {exc}") from exc
