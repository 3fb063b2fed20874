"""The msgpack envelope: round trips, a plain-msgpack reader, pair lists, and clean rejection of bad payloads."""

import contextlib
import dataclasses

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamcorr.engine.changes import ChangeEvent
from streamcorr.engine.matrix import Snapshot
from streamcorr.errors import ConfigError, InputError
from streamcorr.publish import envelope
from streamcorr.publish.envelope import (
    VERSION,
    EnvelopeError,
    Status,
    decode,
    decode_message,
    encode_event,
    encode_snapshot,
    encode_status,
)


def random_snapshot(rng: np.random.Generator, n: int, names: list[str] | None = None, seq: int = 1) -> Snapshot:
    """A symmetric snapshot with NaN (never evaluated) and inf-age (never refreshed) cells."""
    mi = rng.gamma(1.0, 0.3, (n, n))
    mi = (mi + mi.T) / 2
    never = rng.random((n, n)) < 0.2
    never = never | never.T
    np.fill_diagonal(never, True)
    mi[never] = np.nan
    age = np.where(never, np.inf, rng.uniform(0, 100, (n, n)))
    coverage = np.where(never, np.nan, rng.uniform(0.9, 1, (n, n)))
    names = names if names is not None else [f"ch{k}" for k in range(n)]
    return Snapshot(seq, int(rng.integers(0, 2**62)), int(rng.integers(0, 2**62)), tuple(names), mi, age, coverage)


def with_significance(rng: np.random.Generator, snap: Snapshot) -> Snapshot:
    """The snapshot with a symmetric detector verdict (False where never evaluated) and n_eff (NaN there)."""
    n = len(snap.channels)
    never = np.isnan(snap.mi)
    dependent = np.triu(rng.random((n, n)) < 0.5, 1)
    dependent = (dependent | dependent.T) & ~never
    n_eff = rng.uniform(50, 1024, (n, n))
    n_eff = np.where(never, np.nan, (n_eff + n_eff.T) / 2)
    return dataclasses.replace(snap, dependent=dependent, n_eff=n_eff)


def assert_same_f32(decoded: np.ndarray, original: np.ndarray) -> None:
    np.testing.assert_array_equal(decoded, np.asarray(original, dtype=np.float32).astype(np.float64))


names_st = st.lists(st.text(min_size=0, max_size=12), min_size=0, max_size=9, unique=True)


@settings(max_examples=60, deadline=None)
@given(names=names_st, seed=st.integers(0, 2**32 - 1), seq=st.integers(0, 2**64 - 1))
def test_snapshot_round_trip_keeps_values_nan_inf_and_unicode_names(names, seed, seq):
    """Any channel count and names (unicode, empty) round-trip; matrices come back as their float32 values,
    NaN and inf cells included, as float64 arrays."""
    rng = np.random.default_rng(seed)
    snap = random_snapshot(rng, len(names), names, seq=int(rng.integers(0, 2**40)))
    msg = decode_message(encode_snapshot(snap, seq=seq))
    assert (msg.kind, msg.seq, msg.version, msg.pairs) == ("snapshot", seq, VERSION, None)
    out = msg.body
    assert isinstance(out, Snapshot)
    assert (out.seq, out.t_ns, out.wall_ns, out.channels) == (snap.seq, snap.t_ns, snap.wall_ns, snap.channels)
    for name in ("mi", "age_s", "coverage"):
        assert getattr(out, name).dtype == np.float64
        assert_same_f32(getattr(out, name), getattr(snap, name))
    assert np.isinf(out.age_s[np.isnan(snap.mi)]).all()


def test_snapshot_seq_defaults_to_the_snapshots_own():
    """Without seq= the envelope's seq is the snapshot's seq."""
    rng = np.random.default_rng(1)
    snap = random_snapshot(rng, 3, seq=41)
    assert decode_message(encode_snapshot(snap)).seq == 41


def test_plain_msgpack_reader_decodes_a_snapshot_with_numpy_frombuffer():
    """A non-Python client with only msgpack and a float32 view gets the documented fields and values."""
    rng = np.random.default_rng(2)
    snap = random_snapshot(rng, 4, ["x", "y", "température", "🌡"], seq=5)
    raw = msgpack.unpackb(encode_snapshot(snap, seq=9, threshold=0.0), raw=False)
    assert raw["v"] == 1 and raw["kind"] == "snapshot" and raw["seq"] == 9 and raw["snapshot_seq"] == 5
    assert raw["t_ns"] == snap.t_ns and raw["wall_ns"] == snap.wall_ns
    assert raw["channels"] == ["x", "y", "température", "🌡"]
    for name in ("mi", "age_s", "coverage"):
        spec = raw[name]
        assert spec["dtype"] == "<f4" and spec["shape"] == [4, 4] and len(spec["data"]) == 4 * 4 * 4
        values = np.frombuffer(spec["data"], dtype="<f4").reshape(spec["shape"])
        assert_same_f32(values, getattr(snap, name))
    # little-endian on the wire whatever the host: the first cell read by hand equals the matrix's
    first = np.frombuffer(raw["coverage"]["data"][:4][::-1], dtype=">f4")[0]
    np.testing.assert_array_equal(first, np.float32(snap.coverage[0, 0]))
    for i, j, value in raw["pairs"]:
        assert i < j and value == float(np.float32(snap.mi[i, j]))


def test_significance_round_trips_and_reads_with_plain_msgpack():
    """dependent (one 0/1 byte per cell) and n_eff (float32, NaN kept) come back as a bool and a float64
    matrix, and a reader with only msgpack and numpy finds them under their documented dtypes."""
    rng = np.random.default_rng(10)
    snap = with_significance(rng, random_snapshot(rng, 5))
    assert snap.dependent is not None and snap.n_eff is not None
    payload = encode_snapshot(snap, seq=4)
    out = decode(payload)
    assert isinstance(out, Snapshot) and out.dependent is not None and out.n_eff is not None
    assert out.dependent.dtype == bool and out.n_eff.dtype == np.float64
    np.testing.assert_array_equal(out.dependent, snap.dependent)
    assert_same_f32(out.n_eff, snap.n_eff)
    raw = msgpack.unpackb(payload, raw=False)
    assert raw["dependent"]["dtype"] == "|u1" and raw["dependent"]["shape"] == [5, 5]
    plain = np.frombuffer(raw["dependent"]["data"], dtype=np.uint8).reshape(5, 5)
    assert set(plain.ravel().tolist()) <= {0, 1}
    np.testing.assert_array_equal(plain.astype(bool), snap.dependent)
    assert raw["n_eff"]["dtype"] == "<f4" and len(raw["n_eff"]["data"]) == 5 * 5 * 4
    assert_same_f32(np.frombuffer(raw["n_eff"]["data"], dtype="<f4").reshape(5, 5), snap.n_eff)


def test_messages_without_significance_or_initial_decode_as_unknown():
    """A snapshot without dependent / n_eff (an older publisher) decodes with both None, and an event without
    initial decodes with initial False; a snapshot that has none sends neither key."""
    rng = np.random.default_rng(11)
    full = with_significance(rng, random_snapshot(rng, 4))
    raw = msgpack.unpackb(encode_snapshot(full, seq=1), raw=False)
    del raw["dependent"], raw["n_eff"]
    old = decode(msgpack.packb(raw, use_bin_type=True))
    assert isinstance(old, Snapshot) and old.dependent is None and old.n_eff is None
    assert "dependent" not in msgpack.unpackb(encode_snapshot(random_snapshot(rng, 4)), raw=False)
    ev = ChangeEvent(("a", "b"), 0.0, float(rng.random()), 5, "became-dependent", initial=True)
    raw_ev = msgpack.unpackb(encode_event(ev, seq=1), raw=False)
    assert raw_ev["initial"] is True
    del raw_ev["initial"]
    old_ev = decode(msgpack.packb(raw_ev, use_bin_type=True))
    assert isinstance(old_ev, ChangeEvent) and old_ev.initial is False


def test_significance_is_left_out_of_snapshots_it_would_push_past_the_size_limit(monkeypatch):
    """Under a limit the full snapshot passes, n_eff is left out first and dependent next, the payload stays
    within the limit; a limit the plain matrices pass is refused with InputError."""
    rng = np.random.default_rng(12)
    n = 40
    snap = with_significance(rng, random_snapshot(rng, n))
    full = len(encode_snapshot(snap))
    monkeypatch.setattr(envelope, "MAX_ENVELOPE_BYTES", full - 1)
    payload = encode_snapshot(snap)
    raw = msgpack.unpackb(payload, raw=False)
    assert "n_eff" not in raw and "dependent" in raw and len(payload) <= full - 1
    monkeypatch.setattr(envelope, "MAX_ENVELOPE_BYTES", full - 4 * n * n - 1)
    payload = encode_snapshot(snap)
    raw = msgpack.unpackb(payload, raw=False)
    assert "n_eff" not in raw and "dependent" not in raw and "mi" in raw and len(payload) <= full - 4 * n * n - 1
    monkeypatch.setattr(envelope, "MAX_ENVELOPE_BYTES", 12 * n * n)
    with pytest.raises(InputError, match="would exceed"):
        encode_snapshot(snap)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 12),
    seed=st.integers(0, 2**32 - 1),
    top_k=st.none() | st.integers(1, 80),
    threshold=st.none() | st.floats(-1, 2),
)
def test_pairs_are_the_top_pairs_of_the_float32_matrix(n, seed, top_k, threshold):
    """The pairs list is Snapshot.top_pairs of the matrix as sent (float32), so each value equals its cell."""
    rng = np.random.default_rng(seed)
    snap = random_snapshot(rng, n)
    snap.mi[rng.random((n, n)) < 0.3] = 0.25  # ties
    raw = msgpack.unpackb(encode_snapshot(snap, top_k=top_k, threshold=threshold), raw=False)
    if top_k is None and threshold is None:
        assert "pairs" not in raw
        return
    mi32 = np.frombuffer(raw["mi"]["data"], dtype="<f4").reshape(n, n)
    expected = Snapshot(1, 0, 0, snap.channels, mi32, snap.age_s, snap.coverage).top_pairs(top_k, threshold)
    assert [tuple(p) for p in raw["pairs"]] == expected


def test_pairs_only_omits_matrices_and_decodes_to_a_sparse_mi():
    """pairs_only sends only the pair list; decoding fills those cells symmetrically, NaN elsewhere."""
    rng = np.random.default_rng(3)
    snap = random_snapshot(rng, 6)
    payload = encode_snapshot(snap, seq=2, top_k=3, pairs_only=True)
    raw = msgpack.unpackb(payload, raw=False)
    assert "mi" not in raw and "age_s" not in raw and "coverage" not in raw and len(raw["pairs"]) == 3
    assert len(payload) < len(encode_snapshot(snap, seq=2))
    msg = decode_message(payload)
    assert msg.pairs is not None and len(msg.pairs) == 3
    out = msg.body
    assert isinstance(out, Snapshot)
    for i, j, value in msg.pairs:
        assert out.mi[i, j] == out.mi[j, i] == value == float(np.float32(snap.mi[i, j]))
    assert np.isnan(out.mi).sum() == 36 - 6
    assert np.isnan(out.age_s).all() and np.isnan(out.coverage).all()


def test_event_round_trip():
    """An event keeps its pair, change kind, levels and stream time; the envelope carries seq and wall time."""
    rng = np.random.default_rng(4)
    ev = ChangeEvent(("ax", "température"), float(rng.random()), float(rng.random()), 123_456_789, "became-dependent")
    msg = decode_message(encode_event(ev, seq=17, wall_ns=99))
    assert (msg.kind, msg.seq, msg.wall_ns, msg.body) == ("event", 17, 99, ev)
    first = dataclasses.replace(ev, initial=True)
    assert decode(encode_event(first, seq=18)) == first


def test_status_round_trip_with_numpy_counters_and_no_stream_time():
    """A status keeps state and counters (numpy scalars become plain numbers); t_ns may be absent (nil)."""
    rng = np.random.default_rng(5)
    rate = rng.random()
    counters = {"sent_snapshot": np.int64(12), "lag_s": np.float32(0.5), "rate_hz": rate}
    msg = decode_message(encode_status("online", counters, seq=3, wall_ns=7))
    assert msg.kind == "status" and msg.seq == 3
    assert msg.body == Status("online", {"sent_snapshot": 12, "lag_s": 0.5, "rate_hz": rate}, None, 7)
    assert isinstance(decode(encode_status("offline", {}, seq=4, t_ns=5)), Status)


def test_encoders_reject_bad_input_with_clear_errors():
    """Mismatched shapes, unknown states, non-numeric counters, negative seq and empty pair selections are refused."""
    rng = np.random.default_rng(6)
    snap = random_snapshot(rng, 3)
    bad = Snapshot(1, 0, 0, ("a", "b"), snap.mi, snap.age_s, snap.coverage)
    with pytest.raises(InputError, match=r"shape \(2, 2\)"):
        encode_snapshot(bad)
    with pytest.raises(ConfigError, match="pairs_only needs"):
        encode_snapshot(snap, pairs_only=True)
    with pytest.raises(ConfigError, match="top_k"):
        encode_snapshot(snap, top_k=0)
    with pytest.raises(InputError, match="seq"):
        encode_snapshot(snap, seq=-1)
    with pytest.raises(InputError, match="online"):
        encode_status("running", {}, seq=1)
    with pytest.raises(InputError, match="numbers"):
        encode_status("online", {"host": "x"}, seq=1)  # type: ignore[dict-item]


def valid_envelope(rng: np.random.Generator) -> dict:
    snap = with_significance(rng, random_snapshot(rng, 3))
    return msgpack.unpackb(encode_snapshot(snap, seq=1, top_k=2), raw=False)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda m: m.update(v=2), "unsupported envelope version 2"),
        (lambda m: m.pop("v"), "no 'v'"),
        (lambda m: m.update(v="1"), "unsupported envelope version"),
        (lambda m: m.update(kind="matrix"), "unknown envelope kind 'matrix'"),
        (lambda m: m.pop("seq"), "no 'seq'"),
        (lambda m: m.update(seq=-3), "'seq' = -3 is out of range"),
        (lambda m: m.update(seq=True), "'seq' has type bool"),
        (lambda m: m.update(t_ns=1.5), "'t_ns' has type float"),
        (lambda m: m.update(channels=["a", "a", "b"]), "duplicate"),
        (lambda m: m.update(channels=["a", 2, "b"]), "list of strings"),
        (lambda m: m["mi"].update(dtype="<i4"), "dtype '<i4'"),
        (lambda m: m["mi"].update(shape=[2, 2]), "shape"),
        (lambda m: m["age_s"].update(data=b"\0" * 5), "must be 36 bytes; got 5"),
        (lambda m: m["coverage"].update(data="text"), "got str"),
        (lambda m: m.update(pairs=[[0, 7, 0.1]]), "pairs entries"),
        (lambda m: m["dependent"].update(dtype="<f4"), "'dependent' has dtype '<f4'"),
        (lambda m: m["dependent"].update(data=b"\1" * 8), "'dependent' data must be 9 bytes"),
        (lambda m: m["n_eff"].update(shape=[3]), "'n_eff' has shape"),
        (lambda m: [m.pop(k) for k in ("mi", "pairs")], "neither matrices"),
    ],
)
def test_bad_snapshot_envelopes_are_rejected_with_a_message_naming_the_problem(mutate, message):
    """Each broken field of an otherwise valid snapshot envelope raises EnvelopeError that names it."""
    m = valid_envelope(np.random.default_rng(7))
    mutate(m)
    with pytest.raises(EnvelopeError, match=message):
        decode(msgpack.packb(m, use_bin_type=True))


def test_bad_event_and_status_envelopes_are_rejected():
    """Unknown change kinds, one-channel pairs, unknown states and non-numeric counters are rejected."""
    rng = np.random.default_rng(8)
    ev = msgpack.unpackb(encode_event(ChangeEvent(("a", "b"), 0.1, rng.random(), 1, "rise"), seq=1), raw=False)
    st_ = msgpack.unpackb(encode_status("online", {"n": 1}, seq=1), raw=False)
    for base, key, value, message in [
        (ev, "change", "spike", "'change' must be one of"),
        (ev, "pair", ["a"], "two channel names"),
        (ev, "previous", "0.1", "'previous' has type str"),
        (ev, "initial", 1, "'initial' has type int; expected bool"),
        (st_, "state", "busy", "'online' or 'offline'"),
        (st_, "counters", {"n": "1"}, "names to numbers"),
    ]:
        with pytest.raises(EnvelopeError, match=message):
            decode(msgpack.packb(base | {key: value}, use_bin_type=True))


def test_non_envelopes_are_rejected_cleanly():
    """Truncated data, non-maps, non-bytes and oversized maps keys raise EnvelopeError, nothing else."""
    rng = np.random.default_rng(9)
    good = encode_snapshot(random_snapshot(rng, 4), seq=1)
    for payload, message in [
        (good[: len(good) // 2], "not a msgpack envelope"),
        (good + b"\x00", "not a msgpack envelope"),  # trailing bytes
        (b"", "not a msgpack envelope"),
        (msgpack.packb([1, 2, 3]), "msgpack map; got list"),
        (msgpack.packb({1: 2}), "not a msgpack envelope"),  # non-string keys
        (b"\x91" * 100_000, "not a msgpack envelope"),  # nesting bomb
        ("a string", "bytes; got str"),
    ]:
        with pytest.raises(EnvelopeError, match=message):
            decode(payload)  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None)
@given(payload=st.binary(max_size=200), seed=st.integers(0, 2**32 - 1))
def test_random_and_bit_flipped_bytes_never_raise_anything_but_envelope_error(payload, seed):
    """Arbitrary bytes, and a valid envelope with random bytes overwritten, decode or raise EnvelopeError only."""
    rng = np.random.default_rng(seed)
    good = bytearray(encode_snapshot(random_snapshot(rng, 3), seq=1, top_k=2))
    for at in rng.integers(0, len(good), 3).tolist():
        good[at] = int(rng.integers(0, 256))
    for candidate in (payload, bytes(good)):
        with contextlib.suppress(EnvelopeError):
            decode(candidate)


scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=5)
msgpack_values = st.recursive(
    scalars | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=20,
)
FIELDS = ("seq", "t_ns", "wall_ns", "channels", "mi", "pairs", "pair", "change", "previous", "current", "state",
          "dependent", "n_eff", "initial")  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(
    base=st.fixed_dictionaries(
        {"v": st.just(1) | msgpack_values, "kind": st.sampled_from(["snapshot", "event", "status"]) | msgpack_values},
        optional={k: msgpack_values for k in (*FIELDS, "counters", "snapshot_seq")},
    ),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_envelope_shaped_maps_never_crash_the_decoder(base, seed):
    """Maps with the envelope's keys and random values (or a random key dropped) decode or raise EnvelopeError."""
    rng = np.random.default_rng(seed)
    if base and rng.random() < 0.5:
        base.pop(sorted(base)[int(rng.integers(len(base)))])
    with contextlib.suppress(EnvelopeError):
        decode(msgpack.packb(base, use_bin_type=True))
