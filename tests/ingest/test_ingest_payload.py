"""PayloadDecoder: every wire format, channel templates, and the exact ledger of every bad-input class."""

from __future__ import annotations

import json
import math

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamcorr.config import Payload, parse_config
from streamcorr.errors import ConfigError
from streamcorr.ingest.payload import PayloadDecoder
from tests.brokers import HOSTILE_DECODER, hostile_corpus
from tests.naive import merge_batches


def decoded(dec: PayloadDecoder, topic: str, payload: bytes, arrival_s: float = 50.0) -> dict[str, tuple]:
    return {b.channel: (b.t_s.tolist(), b.values.tolist()) for b in dec.decode(topic, payload, arrival_s)}


def test_bare_number_uses_key_value_and_arrival_time():
    """An ASCII number is one sample on key "value", stamped with the arrival time."""
    rng = np.random.default_rng(0)
    x = float(rng.normal())
    dec = PayloadDecoder()
    assert decoded(dec, "a/b", f" {x!r}\n".encode(), 12.5) == {"a/b/value": ([12.5], [x])}
    assert decoded(dec, "a/b", msgpack.packb(x), 13.0) == {"a/b/value": ([13.0], [x])}
    assert decoded(PayloadDecoder(format="number"), "a", b"23.5", 1.0) == {"a/value": ([1.0], [23.5])}
    assert dec.counters.samples_decoded == 2 and dec.counters.dropped == 0


def test_fields_object_json_and_msgpack():
    """Each non-time numeric field of an object is a channel; without a time field the arrival time is used."""
    rng = np.random.default_rng(1)
    ax, ay = rng.normal(size=2).tolist()
    dec = PayloadDecoder(channel_template="{topic[2]}.{key}")
    want = {"imu1.ax": ([1712.5], [ax]), "imu1.ay": ([1712.5], [ay])}
    assert decoded(dec, "robot/arm/imu1", json.dumps({"t": 1712.5, "ax": ax, "ay": ay}).encode()) == want
    assert decoded(dec, "robot/arm/imu1", msgpack.packb({"t": 1712.5, "ax": ax, "ay": ay})) == want
    assert decoded(dec, "robot/arm/imu1", json.dumps({"ax": 3}).encode(), 9.0) == {"imu1.ax": ([9.0], [3.0])}
    assert dec.counters.samples_decoded == 5 and dec.counters.dropped == 0


def test_chunk_with_time_array_and_compact_form():
    """Chunks carry n samples per channel, with a t array or t0 + k*dt."""
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(2, 5)).tolist()
    t = [10.0, 10.1, 10.2, 10.3, 10.4]
    dec = PayloadDecoder(channel_template="{key}")
    assert decoded(dec, "s", json.dumps({"t": t, "channels": {"x": x, "y": y}}).encode()) == {
        "x": (t, x),
        "y": (t, y),
    }
    out = decoded(dec, "s", msgpack.packb({"t0": 10.0, "dt": 0.1, "channels": {"x": x, "y": y[:2]}}))
    np.testing.assert_allclose(out["x"][0], t)
    assert out["y"] == ([10.0, 10.1], y[:2])
    assert dec.counters.samples_decoded == 17 and dec.counters.dropped == 0


def test_msgpack_raw_float64_bytes():
    """msgpack bin values are little-endian float64 arrays, for both t and channels."""
    rng = np.random.default_rng(3)
    t, x = np.arange(100) * 0.01 + 5.0, rng.normal(size=100)
    dec = PayloadDecoder(channel_template="{key}")
    payload = msgpack.packb({"t": t.astype("<f8").tobytes(), "channels": {"x": x.astype("<f8").tobytes()}})
    [batch] = dec.decode("s", payload, 0.0)
    np.testing.assert_array_equal(batch.t_s, t)
    np.testing.assert_array_equal(batch.values, x)
    assert batch.t_s.dtype == batch.values.dtype == np.float64
    assert dec.decode("s", msgpack.packb({"t": [1.0], "channels": {"x": b"1234567"}}), 0.0) == []
    assert dec.counters.drops == {"type": 1}


@pytest.mark.parametrize(
    ("unit", "t", "want"), [("ms", 1500, 1.5), ("us", 2_500_000, 2.5), ("ns", 1712345678123456789, 1712345678.1234567)]
)
def test_time_units(unit, t, want):
    """Times in ms, us or ns are converted to float64 seconds (t, t0 and dt alike)."""
    rng = np.random.default_rng(4)
    v = float(rng.normal())
    dec = PayloadDecoder(time_unit=unit, channel_template="{key}")
    assert decoded(dec, "s", json.dumps({"t": t, "x": v}).encode())["x"][0] == pytest.approx([want], abs=1e-6)
    out = decoded(dec, "s", json.dumps({"t0": t, "dt": t, "channels": {"x": [v, v]}}).encode())
    assert out["x"][0] == pytest.approx([want, 2 * want], abs=1e-6)


def test_templates_topic_levels_and_key():
    """{topic}, {topic[N]}, {topic[-1]} and {key} fill channel names; a missing level is a counted drop."""
    rng = np.random.default_rng(5)
    v = float(rng.normal())
    payload = json.dumps({"t": 1.0, "ax": v}).encode()
    cases = {
        "{topic}/{key}": "robot/arm/imu1/ax",
        "{topic[0]}-{topic[2]}:{key}": "robot-imu1:ax",
        "{topic[-1]}.{key}": "imu1.ax",
        "{topic}": "robot/arm/imu1",
    }
    for template, name in cases.items():
        assert list(decoded(PayloadDecoder(channel_template=template), "robot/arm/imu1", payload)) == [name]
    dec = PayloadDecoder(channel_template="{topic[3]}.{key}")
    assert dec.decode("robot/arm/imu1", payload, 0.0) == []
    assert dec.counters.drops == {"template": 1}
    dec = PayloadDecoder(channel_template="{topic[1]}{key}")  # empty level and empty key: empty name
    assert dec.decode("a//c", b'{"": 1.0}', 0.0) == []
    assert dec.counters.drops == {"template": 1}


@pytest.mark.parametrize(
    "template", ["", "{}", "{0}", "{name}", "{topic.levels}", "{key!x}", "{topic[x]}", "{topic", "{topic[2000]}"]
)
def test_bad_template_is_config_error(template):
    """A template that could never be filled is refused at construction with a ConfigError."""
    np.random.default_rng(6)
    with pytest.raises(ConfigError, match="channel_template"):
        PayloadDecoder(channel_template=template)


def test_other_config_errors():
    """Unknown format or unit, non-positive limits and clashing time field names are ConfigErrors."""
    np.random.default_rng(7)
    for kwargs in (
        {"format": "xml"},
        {"time_unit": "h"},
        {"max_payload_bytes": 0},
        {"max_samples_per_message": 0},
        {"time_field": "channels"},
        {"time_field": ""},
    ):
        with pytest.raises(ConfigError):
            PayloadDecoder(**kwargs)  # type: ignore[arg-type]


def test_settings_come_from_the_payload_section_and_keywords_override_its_keys():
    """PayloadDecoder reads a config.Payload (a source's section will do); keywords replace keys and are validated
    like the configuration file, a bad one naming its key."""
    np.random.default_rng(70)
    section = parse_config(
        {"version": 1, "sources": [{"type": "zmq", "endpoint": "tcp://127.0.0.1:1", "time_unit": "ms"}]}
    ).sources[0]
    dec = PayloadDecoder(section, channel_template="{key}")
    assert type(dec.settings) is Payload and (dec.settings.time_unit, dec.channel_template) == ("ms", "{key}")
    assert decoded(dec, "s", b'{"t": 1500, "x": 2}') == {"x": ([1.5], [2.0])}
    assert PayloadDecoder().settings == Payload()
    with pytest.raises(ConfigError, match=r"max_topic_bytes: .* 65535 \(got 70000\)"):
        PayloadDecoder(Payload(), max_topic_bytes=70_000)
    with pytest.raises(ConfigError, match="time_units: not a decoder setting"):
        PayloadDecoder(time_units="ms")


def test_nan_null_inf_and_extremes():
    """NaN/Infinity tokens and null pass through as non-finite; 1e308 passes; 1e400 is inf; huge ints drop."""
    rng = np.random.default_rng(8)
    v = float(rng.normal())
    dec = PayloadDecoder(channel_template="{key}")
    out = decoded(dec, "s", b'{"t": 1, "a": NaN, "b": -Infinity, "c": null, "d": 1e308, "e": 1e400, "f": %r}' % v)
    assert math.isnan(out["a"][1][0]) and out["b"][1] == [-math.inf] and math.isnan(out["c"][1][0])
    assert out["d"][1] == [1e308] and out["e"][1] == [math.inf] and out["f"][1] == [v]
    assert decoded(dec, "s", b'{"t": 1, "g": %s}' % (b"9" * 400)) == {}
    assert decoded(dec, "s", b'{"t": 1, "g": %s}' % (b"9" * 5000)) == {}  # beyond Python's int digit limit
    assert decoded(dec, "s", msgpack.packb({"t": 1, "h": 2**64 - 1})) == {"h": ([1.0], [float(2**64 - 1)])}
    assert dec.counters.drops == {"range": 1, "decode": 1}


def test_bad_times_are_dropped():
    """Times that are not finite numbers within the engine's int64-ns clock drop their samples ("time")."""
    np.random.default_rng(9)
    dec = PayloadDecoder(channel_template="{key}")
    for t in ("1e308", "NaN", '"now"', "true", "null", "1e10"):
        assert dec.decode("s", b'{"t": %s, "x": 1, "y": 2}' % t.encode(), 0.0) == []
    out = decoded(dec, "s", b'{"t": [1, "x", null, 1e300, 5], "channels": {"x": [1, 2, 3, 4, 5]}}')
    assert out == {"x": ([1.0, 5.0], [1.0, 5.0])}
    assert dec.counters.drops == {"time": 15}


def test_ledger_per_reason():
    """Each malformed message class is counted under its documented reason, item by item."""
    np.random.default_rng(10)
    dec = PayloadDecoder(channel_template="{key}", max_payload_bytes=1000, max_samples_per_message=10)
    cases: list[tuple[bytes, dict[str, int], int]] = [
        (b"", {"empty": 1}, 0),
        (b"{}", {"empty": 1}, 0),
        (b'{"t": 3}', {"empty": 1}, 0),
        (b"x" * 1001, {"oversize": 1}, 0),
        (b'{"t": 1,', {"decode": 1}, 0),
        (b"\xc1\x00", {"decode": 1}, 0),
        (b"[1, 2]", {"schema": 1}, 0),
        (msgpack.packb([1, 2]), {"schema": 1}, 0),
        (msgpack.packb(True), {"schema": 1}, 0),
        (b'{"t": 1, "a": "x", "b": true, "c": [1], "d": {}, "e": 1}', {"type": 4}, 1),
        (msgpack.packb({"t": 1, 7: 1.0, b"k": 2.0, "e": 1}), {"key": 2}, 1),
        (b'{"t0": 1, "a": 1}', {"schema": 1}, 1),
        (b'{"channels": {"a": [1, 2]}}', {"schema": 2}, 0),
        (b'{"t": 5, "channels": {"a": [1, 2]}}', {"schema": 2}, 0),
        (b'{"t0": 1, "dt": -1, "channels": {"a": [1]}}', {"schema": 1}, 0),
        (b'{"t": [1], "channels": {}}', {"schema": 1}, 0),
        (b'{"t": [1], "channels": "a"}', {"schema": 1}, 0),
        (b'{"t": [1], "channels": {"a": [1]}, "extra": 0}', {"schema": 1}, 1),
        (b'{"t": [1, 2], "channels": {"a": [1], "b": [1, 2]}}', {"length": 1}, 2),
        (b'{"t": [1, 2], "channels": {"a": 5, "b": {"c": 1}}}', {"type": 2}, 0),
        (
            b'{"t0": 1, "dt": 1, "channels": {"a": [0, 0, 0, 0, 0, 0], "b": [0, 0, 0, 0, 0]}}',
            {"too_many_samples": 11},
            0,
        ),
        (b'{"seq": 1.5, "t": 1, "a": 1}', {"schema": 1}, 1),
    ]
    for payload, drops, n_ok in cases:
        before, n0 = dict(dec.counters.drops), dec.counters.samples_decoded
        dec.decode("s", payload, 1.0)
        delta = {k: v - before.get(k, 0) for k, v in dec.counters.drops.items() if v != before.get(k, 0)}
        assert (delta, dec.counters.samples_decoded - n0) == (drops, n_ok), payload
    assert dec.counters.messages == len(cases)


def test_format_forced():
    """A forced format refuses the other encodings ("decode") instead of guessing."""
    np.random.default_rng(11)
    assert PayloadDecoder(format="json").decode("s", msgpack.packb({"a": 1.0}), 0.0) == []
    assert PayloadDecoder(format="msgpack").decode("s", b'{"a": 1.0}', 0.0) == []
    dec = PayloadDecoder(format="number")
    assert dec.decode("s", b'{"a": 1.0}', 0.0) == [] and dec.counters.drops == {"decode": 1}
    assert len(PayloadDecoder(format="json").decode("s", b"  2.5", 0.0)) == 1


def test_ascii_text_that_is_not_a_number_is_counted_not_read_as_msgpack():
    """A status letter or word, a JSON array or string: counted (decode or schema), never a sample; msgpack
    numbers outside the printable bytes still read, and format: msgpack reads any."""
    dec = PayloadDecoder()
    for text in (b"K", b"x", b"[", b"~", b"OK", b"\n"):
        assert dec.decode("s/d", text, 0.0) == [], text
    assert dec.counters.drops == {"decode": 6}
    for text in (b"[1, 2, 3]", b'"idle"', b"true"):
        assert dec.decode("s/d", text, 0.0) == [], text
    assert dec.counters.drops == {"decode": 6, "schema": 3}
    assert [decoded(dec, "s", msgpack.packb(v))["s/value"][1] for v in (5, 300, -3, 2.5)] == [[5], [300], [-3], [2.5]]
    assert decoded(PayloadDecoder(format="msgpack"), "s", msgpack.packb(75)) == {"s/value": ([50.0], [75.0])}


def test_sequence_gaps_and_resets():
    """An integer seq field counts missing messages per topic, and restarts, without becoming a channel."""
    np.random.default_rng(12)
    dec = PayloadDecoder(channel_template="{key}")
    for topic, seq in [("a", 1), ("a", 2), ("b", 7), ("a", 5), ("b", 8), ("a", 1), ("b", 10)]:
        assert list(decoded(dec, topic, json.dumps({"seq": seq, "x": 1.0}).encode())) == ["x"]
    assert (dec.counters.seq_gaps, dec.counters.seq_resets) == (2 + 1, 1)


def test_hostile_corpus_ledger_matches():
    """10k hostile payloads decode without an exception and match the corpus's ledger item by item."""
    rng = np.random.default_rng(13)
    corpus, want = hostile_corpus(rng, 10_000, "hx")
    dec = PayloadDecoder(**HOSTILE_DECODER)  # type: ignore[arg-type]
    for topic, payload in corpus:
        dec.decode(topic.decode(), payload, 0.0)
    assert dec.counters.messages == want.messages
    assert dec.counters.samples_decoded == want.decoded
    assert dec.counters.drops == dict(want.drops)


_values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.booleans(),
    st.none(),
    st.text(max_size=5),
    st.lists(st.integers(-1000, 1000), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(-1000, 1000), max_size=2),
)
_keys = st.text(min_size=1, max_size=8).filter(lambda k: k not in ("t", "t0", "dt", "channels", "seq"))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fields=st.dictionaries(_keys, _values, max_size=8), use_msgpack=st.booleans())
def test_property_fields_every_item_accounted(fields, use_msgpack):
    """For any object of fields, decoded + dropped equals the number of fields (one if there are none)."""
    np.random.default_rng(14)
    obj = {"t": 1.0, **fields}
    if use_msgpack:
        obj = {k: (v if not isinstance(v, int) or abs(v) < 2**63 else float("inf")) for k, v in obj.items()}
        payload = msgpack.packb(obj)
    else:
        payload = json.dumps(obj).encode()
    dec = PayloadDecoder(channel_template="{key}", max_payload_bytes=1 << 22)
    out = dec.decode("s", payload, 0.0)
    assert dec.counters.samples_decoded + dec.counters.dropped == max(1, len(fields))
    for b in out:
        assert b.t_s.dtype == b.values.dtype == np.float64 and b.t_s.shape == b.values.shape == (1,)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    channels=st.dictionaries(_keys, st.lists(_values, max_size=6), min_size=1, max_size=4),
    times=st.lists(st.one_of(st.floats(-1e12, 1e12), st.none(), st.text(max_size=2)), min_size=0, max_size=6),
)
def test_property_chunk_every_item_accounted(channels, times):
    """For any chunk, decoded + dropped equals the total array length (one for an all-empty chunk)."""
    np.random.default_rng(15)
    payload = json.dumps({"t": times, "channels": channels}).encode()
    dec = PayloadDecoder(channel_template="{key}", max_payload_bytes=1 << 22)
    out = dec.decode("s", payload, 0.0)
    total = sum(len(v) for v in channels.values())
    assert dec.counters.samples_decoded + dec.counters.dropped == max(1, total)
    for b in out:
        assert np.all(np.abs(b.t_s) < 9e9) and b.t_s.shape == b.values.shape


@settings(max_examples=300, deadline=None)
@given(payload=st.binary(max_size=200))
def test_property_arbitrary_bytes_never_raise(payload):
    """Arbitrary bytes never raise, and every message is accounted for at least once."""
    np.random.default_rng(16)
    dec = PayloadDecoder()
    dec.decode("a/b", payload, 0.0)
    assert dec.counters.samples_decoded + dec.counters.dropped >= 1


def test_decode_many_equals_decoding_each_message_and_merging():
    """decode_many over a mix of readings, chunks and hostile payloads gives the batches (channels in first-seen
    order, samples in message order) and the ledger of decoding each message alone and merging per channel."""
    rng = np.random.default_rng(95)
    frames, _ = hostile_corpus(rng, 400, "hm")
    messages = [(f[0].decode("utf-8", "replace"), f[1]) for f in frames if len(f) == 2]
    messages += [("hm/dev", json.dumps({"t": 2000.0 + k, "x": float(k), "y": -float(k)}).encode()) for k in range(5)]
    arrivals = [1e9 + 0.001 * k for k in range(len(messages))]
    one, many = PayloadDecoder(**HOSTILE_DECODER), PayloadDecoder(**HOSTILE_DECODER)
    singles = [b for (topic, payload), a in zip(messages, arrivals, strict=True) for b in one.decode(topic, payload, a)]
    gathered = many.decode_many([(t, p, a) for (t, p), a in zip(messages, arrivals, strict=True)])
    want = merge_batches(singles)
    assert [b.channel for b in gathered] == [b.channel for b in want]
    for got, ref in zip(gathered, want, strict=True):
        np.testing.assert_array_equal(got.t_s, ref.t_s)
        np.testing.assert_array_equal(got.values, ref.values)
    assert many.counters == one.counters and sum(len(b.t_s) for b in gathered) == one.counters.samples_decoded


def test_a_decoder_bug_part_way_through_a_message_takes_back_its_samples(monkeypatch):
    """A bug that strikes after some of a message's samples were gathered is counted ("internal") and those samples
    are taken back, so the ledger still holds (samples_decoded = samples gathered); the other messages decode."""
    np.random.default_rng(96)
    dec = PayloadDecoder(channel_template="{key}")
    resolve = PayloadDecoder._resolve

    def buggy(self: PayloadDecoder, topic: str, key: str) -> tuple[str | None, str]:
        if key == "boom":
            raise RuntimeError("a bug")
        return resolve(self, topic, key)

    monkeypatch.setattr(PayloadDecoder, "_resolve", buggy)
    batches = dec.decode_many([("d", b'{"t": 1.0, "a": 1.5}', 0.0), ("d", b'{"t": 2.0, "a": 2.5, "boom": 0}', 0.0),
                               ("d", b'{"t": 3.0, "a": 3.5, "b": 0.5}', 0.0)])  # fmt: skip
    assert [(b.channel, b.t_s.tolist(), b.values.tolist()) for b in batches] == [
        ("a", [1.0, 3.0], [1.5, 3.5]), ("b", [3.0], [0.5])]  # fmt: skip
    assert dec.counters.drops == {"internal": 1} and dec.counters.samples_decoded == 3 and dec.counters.messages == 3
