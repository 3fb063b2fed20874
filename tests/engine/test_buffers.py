import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamcorr.engine.buffers import Resampler, RingBuffer
from streamcorr.errors import InputError

samples = st.lists(
    st.tuples(st.integers(0, 50), st.one_of(st.floats(-1e3, 1e3), st.just(float("nan")), st.just(float("inf")))),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 20), samples)
def test_ring_buffer_matches_list_reference(capacity, pushes):
    """The buffer holds the newest `capacity` accepted samples; every push is accepted or counted once."""
    buf = RingBuffer(capacity)
    kept: list[tuple[int, float]] = []
    for t, v in pushes:
        ok = buf.push(t, v)
        expect = np.isfinite(v) and (not kept or t > kept[-1][0])
        assert ok == expect
        if ok:
            kept.append((t, v))
    kept = kept[-capacity:]
    assert buf.times().tolist() == [t for t, _ in kept]
    assert buf.values().tolist() == [v for _, v in kept]
    c = buf.counters
    assert c.accepted + c.dropped == len(pushes)
    assert c.overwritten == max(0, c.accepted - capacity)
    assert len(buf) == len(kept)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 20), samples, st.lists(st.integers(1, 30), min_size=1, max_size=10))
def test_push_many_in_chunks_equals_one_at_a_time(capacity, pushes, cuts):
    """Vectorised push_many keeps the same samples and the same counters as pushing one sample at a time."""
    one, many = RingBuffer(capacity), RingBuffer(capacity)
    for t, v in pushes:
        one.push(t, v)
    t_all = np.array([t for t, _ in pushes], dtype=np.int64)
    v_all = np.array([v for _, v in pushes], dtype=np.float64)
    start, k = 0, 0
    while start < len(pushes):
        stop = start + cuts[k % len(cuts)]
        many.push_many(t_all[start:stop], v_all[start:stop])
        start, k = stop, k + 1
    assert many.times().tolist() == one.times().tolist()
    assert many.values().tolist() == one.values().tolist()
    assert many.counters == one.counters
    assert many.last_t_ns == one.last_t_ns


def test_late_and_duplicate_timestamps_are_counted_apart():
    """Out-of-order samples count as late, repeated timestamps as duplicate; neither enters the buffer."""
    buf = RingBuffer(8)
    buf.push_many(np.array([10, 20, 15, 20, 30]), np.ones(5))
    assert buf.times().tolist() == [10, 20, 30]
    assert (buf.counters.late, buf.counters.duplicate) == (1, 1)


def test_sample_and_hold_respects_staleness():
    """A tick takes the newest sample at or before it, and is invalid (NaN) when that sample is too old."""
    buf = RingBuffer(8)
    buf.push_many(np.array([100, 200, 500]), np.array([1.0, 2.0, 5.0]))
    out = buf.sample_and_hold(np.array([50, 100, 150, 250, 450, 500]), max_staleness_ns=100)
    np.testing.assert_array_equal(out, [np.nan, 1.0, 1.0, 2.0, np.nan, 5.0])


def test_resampler_aligns_channels_on_one_clock():
    """Channels sampled at different times line up on the common ticks; a silent channel becomes NaN."""
    rs = Resampler(rate_hz=10.0, max_staleness_s=0.15)
    a, b, silent = RingBuffer(64), RingBuffer(64), RingBuffer(4)
    for k in range(20):
        a.push(k * 100_000_000 + 3_000_000, float(k))  # 100 ms period, 3 ms phase
        b.push(k * 100_000_000 + 51_000_000, float(-k))  # 51 ms phase
    w = rs.window([a, b, silent], end_ns=19 * 100_000_000 + 60_000_000, n=5)
    assert w.shape == (3, 5)
    np.testing.assert_array_equal(w[0], [15, 16, 17, 18, 19])  # 3 ms after its tick: still that tick's sample
    np.testing.assert_array_equal(w[1], [-14, -15, -16, -17, -18])  # 51 ms: past the half-tick, the next tick's
    assert np.isnan(w[2]).all()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"rate_hz": 0, "max_staleness_s": 1}, "rate_hz"), ({"rate_hz": 10, "max_staleness_s": -1}, "max_staleness_s")],
)
def test_resampler_rejects_bad_settings(kwargs, match):
    """Impossible clock settings raise InputError naming the setting."""
    with pytest.raises(InputError, match=match):
        Resampler(**kwargs)


def test_ring_buffer_rejects_bad_shapes():
    """Mismatched sample arrays and a zero capacity raise InputError."""
    with pytest.raises(InputError, match="capacity"):
        RingBuffer(0)
    with pytest.raises(InputError, match="equal length"):
        RingBuffer(4).push_many(np.array([1, 2]), np.array([1.0]))


def test_unix_timestamps_on_the_clock_grid_give_each_tick_its_own_sample():
    """Float Unix seconds at exactly the clock rate are not shifted by a tick (no duplicated or skipped rows)."""
    rng = np.random.default_rng(11)
    rate = 100.0
    t_s = 1.7e9 + np.arange(2000) / rate  # lands up to ~0.2 us either side of the ticks
    values = rng.standard_normal(2000)
    buf = RingBuffer(4096)
    buf.push_many(np.round(t_s * 1e9).astype(np.int64), values)
    res = Resampler(rate, max_staleness_s=0.005)
    window = res.window([buf], round(t_s[-1] * 1e9), 1024)[0]
    assert np.array_equal(window, values[-1024:])


@pytest.mark.parametrize("offset_ns", [0, 1_000, 370_000, 4_900_000, -4_900_000])
def test_a_device_on_the_clock_keeps_its_ticks_under_offset_and_jitter(offset_ns):
    """Samples at the clock's rate, off the ticks by a constant offset and jitter under half a period, fill every
    tick once: no repeated and no skipped sample."""
    rng = np.random.default_rng(abs(offset_ns) + 7)
    rs = Resampler(rate_hz=100.0, max_staleness_s=0.05)
    buf = RingBuffer(512)
    k = np.arange(400)
    jitter = rng.uniform(-1, 1, k.size) * max(0, 4_999_000 - abs(offset_ns)) * 0.9
    t = 1_732_700_000_000_000_000 + k * 10_000_000 + offset_ns + jitter.astype(np.int64)
    buf.push_many(t, k.astype(float))
    values, fresh = rs.window_fresh([buf], end_ns=1_732_700_000_000_000_000 + 399 * 10_000_000, n=300)
    np.testing.assert_array_equal(values[0], k[100:].astype(float))
    assert fresh.all()


@pytest.mark.parametrize("phase", [0.5, 0.45, 0.62])
def test_the_boundary_moves_off_stamps_that_sit_half_a_tick_off(phase):
    """A device about half a period off the ticks with jitter, and a second stamped 0.4 ms after it: with the
    boundary placed (Resampler.place), every tick holds one sample of each, the two read on the same tick, and the
    boundary stays while the stamps stay."""
    rng = np.random.default_rng(int(phase * 100))
    rs = Resampler(rate_hz=100.0, max_staleness_s=0.05)
    a, b = RingBuffer(512), RingBuffer(512)
    k = np.arange(400)
    t = 1_732_700_000_000_000_000 + ((k + phase) * 10_000_000).astype(np.int64) + rng.integers(-3e5, 3e5, k.size)
    a.push_many(t, k.astype(float))
    b.push_many(t + 400_000, k.astype(float))
    end = 1_732_700_000_000_000_000 + 400 * 10_000_000
    assert rs.place([a, b], end, 300) == (phase < 0.55)  # at 0.62 the stamps leave the default boundary clear
    values, fresh = rs.window_fresh([a, b], end_ns=end, n=300)
    assert fresh.all() and np.array_equal(values[0], values[1]) and (np.diff(values[0]) == 1).all()
    assert not rs.place([a, b], end, 300) and not rs.place([a, b], end - 50 * 10_000_000, 300)


def test_fresh_marks_ticks_that_repeat_a_sample():
    """A channel at a fifth of the clock's rate is fresh once every five ticks; a missing one is never fresh."""
    rs = Resampler(rate_hz=100.0, max_staleness_s=0.06)
    slow, gone = RingBuffer(64), RingBuffer(4)
    for k in range(40):
        slow.push(k * 50_000_000, float(k))  # 20 Hz
    values, fresh = rs.window_fresh([slow, gone], end_ns=39 * 50_000_000, n=100)
    assert fresh[0, 1:].sum() == 20 and (np.diff(values[0])[~fresh[0][1:]] == 0).all()  # the first row counts
    assert not fresh[1].any()


def test_push_many_refuses_samples_outside_its_bounds_without_moving_the_bound():
    """Samples earlier than min_t_ns count as late and later than max_t_ns as future; neither raises the bound
    the samples after them must pass, and the rest are accepted in order."""
    np.random.default_rng(91)  # nothing random here; seeded by convention
    buf = RingBuffer(16)
    t = np.array([5, 10, 20, 95, 30, 200, 40], dtype=np.int64)
    # 5 and 10 before min_t_ns, 200 after max_t_ns; 30 and 40 come after the accepted 95
    assert buf.push_many(t, np.arange(7.0), max_t_ns=100, min_t_ns=15) == 2
    c = buf.counters
    assert (c.accepted, c.late, c.future, c.duplicate) == (2, 4, 1, 0) and buf.last_t_ns == 95
    assert buf.push_many(np.array([12, 96], dtype=np.int64), np.zeros(2), min_t_ns=15) == 1  # 12: late again
    assert buf.last_t_ns == 96 and buf.counters.late == 5


@pytest.mark.parametrize(("capacity", "n"), [(100, 250), (64, 64), (50, 20), (10, 0)])
def test_phase_counts_read_in_place_match_the_stamps(capacity, n):
    """The per-bin counts of a window's stamps, read from the ring in place (wrapped or not), as from a copy."""
    rng = np.random.default_rng(capacity + n)
    buf = RingBuffer(capacity)
    t = np.cumsum(rng.integers(1, 20, n)).astype(np.int64)
    buf.push_many(t, np.ones(n))
    held = buf.times()
    for lo, hi in ((0, 10**6), (int(t.mean()) if n else 0, int(t.max()) if n else 5)):
        sel = held[(held > lo) & (held <= hi)]
        want = np.bincount((sel % 17) * 8 // 17, minlength=8)
        np.testing.assert_array_equal(buf.phase_counts(lo, hi, 17, 8), want)
