"""Effective sample sizes, the null table by n_eff, and alignment that creates no dependence."""

from itertools import pairwise

import numpy as np
import pytest
from scipy.signal import lfilter

from streamcorr.engine.changes import ChangeDetector, cached_calibration
from streamcorr.engine.core import Engine, EngineConfig
from streamcorr.estimate.estimator import default_estimator
from streamcorr.estimate.significance import autocorrelation, pair_n_eff, per_evaluation_rate, rank_rows
from streamcorr.estimate.surrogates import SurrogateNulls, normal_weight, shifted_samples

T0 = 1_732_700_000.0  # a Unix time, so float seconds carry the rounding real logs have


def _ar1(rng: np.random.Generator, phi: float, shape: tuple[int, int]) -> np.ndarray:
    e = rng.standard_normal((shape[0], shape[1] + 2000))
    return lfilter([1.0], [1.0, -phi], e, axis=1)[:, 2000:]


def test_effective_size_falls_as_signals_get_smoother():
    """White pairs keep nearly all their samples; AR(1) pairs keep fewer the closer phi is to 1."""
    rng = np.random.default_rng(11)
    medians = []
    for phi in (0.0, 0.5, 0.9, 0.98):
        x, y = _ar1(rng, phi, (200, 512)), _ar1(rng, phi, (200, 512))
        medians.append(np.median(pair_n_eff(autocorrelation(rank_rows(x)), autocorrelation(rank_rows(y)), 512)))
    assert medians[0] > 450 and all(a > b for a, b in pairwise(medians)) and medians[3] < 80


def test_per_pair_rate_shrinks_with_the_matrix_and_the_hop_rate():
    """More pairs or more frequent independent looks leave each pair a smaller share of the hourly budget."""
    base = per_evaluation_rate(1.0, 100, hop_s=1.0, window_s=10.0)
    assert per_evaluation_rate(1.0, 1000, 1.0, 10.0) == pytest.approx(base / 10)
    assert per_evaluation_rate(1.0, 100, 1.0, 5.0) == pytest.approx(base / 2)
    assert per_evaluation_rate(1.0, 100, 20.0, 10.0, persist=2) > per_evaluation_rate(1.0, 100, 20.0, 10.0)


@pytest.mark.parametrize("phi", [0.9, 0.97, 0.995])
def test_false_alarm_rate_holds_on_smooth_independent_pairs(phi):
    """Independent AR(1) pairs exceed the detector's bar at most twice as often as the configured rate."""
    est = default_estimator()
    table = cached_calibration(est.fingerprint, est.estimate_batch, 256, est.ties)
    alpha = 0.02
    det = ChangeDetector(table, alpha, min_effect=0.0)
    rng = np.random.default_rng(int(phi * 1000))
    x, y = _ar1(rng, phi, (400, 256)), _ar1(rng, phi, (400, 256))
    mi = est.estimate_batch(x, y)
    n_eff = pair_n_eff(autocorrelation(rank_rows(x, est.ties)), autocorrelation(rank_rows(y, est.ties)), 256)
    hi, _ = det.thresholds(n_eff)
    assert (mi > hi).sum() <= 2 * alpha * len(mi), ((mi > hi).sum(), np.median(n_eff))


def _replay(frames: dict[str, tuple[np.ndarray, np.ndarray]], **cfg: object) -> list:
    """Snapshots of an engine fed per-channel (t seconds, values), evaluated hop by hop."""
    names = list(frames)
    eng = Engine(EngineConfig(**({"channels": names, "window_len": 256, "hop_samples": 64, "rate_hz": 100.0,
                                  "skip_stale_hops": False, "max_future_s": None} | cfg)))  # fmt: skip
    out = []
    end = max(t[-1] for t, _ in frames.values())
    for lo in np.arange(min(t[0] for t, _ in frames.values()), end + 1.0, 1.0):  # one second at a time, as a replay
        for name, (t, v) in frames.items():
            sel = (t >= lo) & (t < lo + 1.0)
            eng.push(name, t[sel], v[sel])
        out += [eng.evaluate(e) for e in eng.due_windows()]
    return out


@pytest.mark.parametrize("stamp", ["+1us", "+0.37ms", "jitter 0.3ms", "own jitter 0.3ms"])
def test_stamps_off_the_clock_give_the_exact_grid_result(stamp):
    """Independent channels at the clock's rate give the same MI on every hop whether stamped on the ticks or
    off them by an offset or jitter (common or per channel)."""
    rng = np.random.default_rng(len(stamp))
    n = 1500
    k = np.arange(n) / 100.0
    vals = {c: rng.standard_normal(n) for c in "abc"}
    exact = _replay({c: (T0 + k, v) for c, v in vals.items()})
    common = rng.uniform(-3e-4, 3e-4, n)
    shift = {"+1us": lambda c: 1e-6, "+0.37ms": lambda c: 3.7e-4, "jitter 0.3ms": lambda c: common,
             "own jitter 0.3ms": lambda c: rng.uniform(-3e-4, 3e-4, n)}[stamp]  # fmt: skip
    moved = _replay({c: (T0 + k + shift(c), v) for c, v in vals.items()})
    assert len(exact) == len(moved) > 10
    for (a, _), (b, _) in zip(exact, moved, strict=True):
        np.testing.assert_array_equal(np.isnan(a.mi), np.isnan(b.mi))
    pairs = [(a.mi, b.mi) for (a, _), (b, _) in zip(exact, moved, strict=True) if np.isfinite(a.mi).any()]
    diffs = [np.nanmax(np.abs(a - b)) for a, b in pairs]
    assert len(diffs) > 10 and np.quantile(diffs, 0.95) <= 0.02, diffs


@pytest.mark.parametrize(("periods", "phase"), [((1, 1), 0.5), ((1, 2), 0.4999), ((2, 5), 0.47), ((1, 2), 0.93)])
def test_a_dependent_pair_reads_the_same_wherever_its_stamps_sit_between_ticks(periods, phase):
    """A white driver and a follower stamped 0.4 ms after the driver's sample it reads (rates 1:1, 1:2, 2:5 of the
    clock): every stamp moved by the same fraction of a tick (half a tick included), with 0.1 ms jitter, gives
    the exact grid's MI on every hop. A boundary between ticks among the stamps would read the follower against
    the driver's next sample, and the relation would vanish."""
    rng = np.random.default_rng(int(phase * 1e4) + sum(periods))
    n = 1300
    x = rng.standard_normal(n)
    ticks = {name: np.arange(0, n, p) for name, p in zip("xy", periods, strict=True)}
    held = np.maximum.accumulate(np.where(np.arange(n) % periods[0] == 0, np.arange(n), 0))  # driver's newest
    y = np.sin(2 * x[held[ticks["y"]]]) + 0.3 * rng.standard_normal(len(ticks["y"]))
    values = {"x": x[ticks["x"]], "y": y}
    late = {"x": 0.0, "y": 4e-4}
    moved = _replay({c: (T0 + (ticks[c] + phase) / 100.0 + late[c] + rng.uniform(-1e-4, 1e-4, len(ticks[c])),
                         values[c]) for c in "xy"})  # fmt: skip
    b = np.array([s.mi[0, 1] for s, _ in moved[1:]])
    p95 = []
    for on in (0, 1):  # a stamp between two ticks belongs to either: the exact grid on the tick before and after
        exact = _replay({c: (T0 + (ticks[c] + on) / 100.0, values[c]) for c in "xy"})
        a = np.array([s.mi[0, 1] for s, _ in exact[1:]])
        assert len(a) > 10 and np.nanmedian(a) > 0.4, a
        m = min(len(a), len(b))
        p95.append(np.nanquantile(np.abs(a[:m] - b[:m]), 0.95))
    assert min(p95) <= 0.02, (p95, b)


@pytest.mark.parametrize("periods", [(2, 2), (1, 2), (2, 5), (5, 5)])
def test_channels_slower_than_the_clock_show_no_dependence(periods):
    """Independent channels at 1/p of the clock's rate, sharing a device's stamps where their rates match, read
    as independent as on the exact grid: the pair keeps the slower channel's new samples, no repeated rows."""
    rng = np.random.default_rng(sum(periods))
    n = 3000
    frames = {}
    for name, p in zip("ab", periods, strict=True):
        t = T0 + np.arange(0, n, p) / 100.0
        frames[name] = (t, rng.standard_normal(len(t)))
    hops = _replay(frames)
    mi = np.array([s.mi[0, 1] for s, _ in hops[2:]])
    # the pair keeps 256 / max(p) rows: compare with the estimator's own null on that many independent samples
    rows = 256 // max(periods)
    null = default_estimator().estimate_batch(rng.standard_normal((200, rows)), rng.standard_normal((200, rows)))
    assert np.nanmean(mi) < null.mean() + 0.03 and not any(s.dependent[0, 1] for s, _ in hops), (mi, null.mean())
    kept = _replay(frames, repeated_rows="keep")  # the behaviour this replaces, where both repeat
    if periods[0] == periods[1]:
        assert np.nanmean([s.mi[0, 1] for s, _ in kept[2:]]) > 0.3


def test_smooth_independent_channels_are_not_flagged_but_dependent_ones_are():
    """Two independent smooth channels read well above zero yet stay independent; a channel and a noisy
    function of it are dependent, from the first assessment (marked initial)."""
    rng = np.random.default_rng(5)
    n = 6000
    t = T0 + np.arange(n) / 100.0
    a, b = _ar1(rng, 0.98, (2, n))
    w = rng.standard_normal(n)
    c = np.abs(w) + 0.2 * rng.standard_normal(n)
    hops = _replay({"a": (t, a), "b": (t, b), "c": (t, c), "w": (t, w)})
    snap = hops[-1][0]
    events = [e for _, evs in hops for e in evs]
    assert np.nanmean([s.mi[0, 1] for s, _ in hops]) > 0.05  # the estimate itself is not touched
    assert not snap.dependent[0, 1] and snap.dependent[2, 3] and snap.n_eff[0, 1] < 100
    assert not any(set(e.pair) == {"a", "b"} for e in events)
    onset = [e for e in events if set(e.pair) == {"c", "w"}]
    assert onset and onset[0].kind == "became-dependent" and onset[0].initial


@pytest.mark.parametrize("phi", [0.9, 0.995])
def test_surrogate_nulls_hold_the_rate_and_find_smooth_dependence(phi):
    """A smooth pair's own null (shifted surrogates) keeps independent AR(1) pairs under twice the rate, and
    flags a smooth channel against a noisy function of it."""
    est = default_estimator()
    rng = np.random.default_rng(int(phi * 100))
    x, y = _ar1(rng, phi, (120, 512)), _ar1(rng, phi, (120, 512))
    dep = np.abs(x) + 0.5 * y
    alpha = 0.02
    for other, want in ((y, "few"), (dep, "most")):
        u = rank_rows(np.concatenate([x, other]), est.ties)
        i, j = np.arange(120), np.arange(120, 240)
        n_eff = pair_n_eff(autocorrelation(u[i]), autocorrelation(u[j]), 512)
        pairs = [(f"x{k}", f"y{k}") for k in range(120)]
        sur = SurrogateNulls(20, refresh_ns=1)
        sur.measure(est.estimate_histograms, est.grid, u, i, j, pairs, n_eff, t_ns=0)
        hi, _ = sur.thresholds(pairs, alpha)
        mi = est.estimate_ranks(u, i, j)
        if want == "few":
            assert (mi > hi).sum() <= 2 * alpha * len(mi), (mi > hi).sum()
        else:
            assert (mi > hi).mean() > 0.9, (mi > hi).mean()


def test_a_smooth_dependent_pair_is_flagged_and_a_smooth_independent_one_is_not():
    """With the defaults, a smooth channel and a noisy function of it become dependent; two independent smooth
    channels at the same time constant do not."""
    rng = np.random.default_rng(8)
    n = 9000
    t = T0 + np.arange(n) / 100.0
    a, b = _ar1(rng, 0.98, (2, n))
    c = np.abs(a) + 0.5 * b
    d = _ar1(rng, 0.98, (1, n))[0]
    hops = _replay({"a": (t, a), "c": (t, c), "d": (t, d)}, window_len=1024, hop_samples=100)
    flagged = np.array([s.dependent[0, 1] for s, _ in hops[3:]])
    assert flagged.mean() > 0.9
    assert not any(s.dependent[0, 2] or s.dependent[1, 2] for s, _ in hops)


def test_prewhitening_reads_the_dependence_of_innovations():
    """With prewhiten='ar', two independent smooth series read near zero, and two smooth series driven by the
    same innovations (each through its own filter) read clearly dependent."""
    from streamcorr.estimate.estimator import Estimator

    rng = np.random.default_rng(41)
    est, plain = Estimator(prewhiten="ar"), default_estimator()
    x, y = _ar1(rng, 0.99, (40, 1024)), _ar1(rng, 0.99, (40, 1024))
    assert plain.estimate_batch(x, y).mean() > 0.1 and est.estimate_batch(x, y).mean() < 0.02
    e = rng.standard_normal((40, 3024))
    shared_x = lfilter([1.0], [1.0, -0.98], e, axis=1)[:, 2000:]
    shared_y = lfilter([1.0], [1.0, -1.6, 0.64], e + 0.5 * rng.standard_normal(e.shape), axis=1)[:, 2000:]
    assert est.estimate_batch(shared_x, shared_y).mean() > 0.3


def test_prewhitening_fits_each_channel_on_its_own_samples():
    """Pre-whitened, two independent smooth channels at 20 Hz and 50 Hz (held on a 100 Hz clock) read near zero
    and are never flagged: fitted on the clock's ticks instead, the held samples leave residuals at each channel's
    own ticks, which read as about 0.1 nats of dependence."""
    from streamcorr.estimate.significance import prewhiten, prewhiten_own_samples

    rng = np.random.default_rng(52)
    seconds = 90
    t20 = T0 + 0.021 + np.arange(seconds * 20) / 20.0 + rng.uniform(-1e-3, 1e-3, seconds * 20)
    t50 = T0 + 0.007 + np.arange(seconds * 50) / 50.0 + rng.uniform(-4e-4, 4e-4, seconds * 50)
    a, b = _ar1(rng, 0.95, (1, len(t20)))[0], _ar1(rng, 0.95, (1, len(t50)))[0]
    hops = _replay({"a": (t20, a), "b": (t50, b)}, window_len=1024, hop_samples=100, estimator={"prewhiten": "ar"})
    mi = np.array([s.mi[0, 1] for s, _ in hops if np.isfinite(s.mi[0, 1])])
    assert len(mi) > 50 and np.median(mi) < 0.02
    assert not any(s.dependent[0, 1] for s, _ in hops)
    # the same on one window directly, against a fit over the clock's ticks
    x = np.stack([np.repeat(a, 5)[:1024], np.repeat(b, 2)[:1024]])
    fresh = np.zeros(x.shape, dtype=bool)
    fresh[0, ::5] = fresh[1, ::2] = True
    rows = fresh.any(axis=0)
    est = default_estimator()
    own, grid = prewhiten_own_samples(x, fresh)[:, rows], prewhiten(x)[:, rows]
    assert est.estimate_batch(own[:1], own[1:])[0] < 0.02 < 0.05 < est.estimate_batch(grid[:1], grid[1:])[0]


def test_dependence_of_a_slow_channel_on_a_fast_clock_is_found_on_the_slow_channels_samples():
    """A 20 Hz device's field and a 100 Hz noisy non-monotone function of it read about 0.5 nats on the slow
    channel's 205 samples a window (every tick, holding each slow sample five times beside the moving follower,
    blurs it to about 0.2) and are flagged on nearly every hop at the per-evaluation rate of a 66-pair matrix; a
    smooth independent channel beside them never is."""
    rng = np.random.default_rng(31)
    seconds = 120
    t_slow = T0 + 0.013 + np.arange(seconds * 20) / 20.0
    drive = _ar1(rng, 0.5, (1, len(t_slow)))[0]
    t_fast = T0 + 0.004 + np.arange(seconds * 100) / 100.0 + rng.uniform(-2e-4, 2e-4, seconds * 100)
    follow = np.cos(1.5 * np.interp(t_fast, t_slow, drive)) + 0.5 * rng.standard_normal(len(t_fast))
    other = _ar1(rng, 0.97, (1, len(t_fast)))[0]
    hops = _replay({"drive": (t_slow, drive), "follow": (t_fast, follow), "other": (t_fast, other)},
                   window_len=1024, hop_samples=100, false_alarm_rate=2e-5)  # fmt: skip
    late = [s for s, _ in hops[12:]]
    mi = np.array([s.mi[0, 1] for s in late])
    assert 0.35 < np.median(mi) < 0.8, np.median(mi)
    assert np.mean([s.dependent[0, 1] for s in late]) > 0.9
    assert not any(s.dependent[0, 2] or s.dependent[1, 2] for s, _ in hops)


def test_a_noisy_fast_follower_of_a_slow_channel_is_found_by_the_every_new_row_test():
    """A 100 Hz reading of a 20 Hz channel's value (quantised) under heavy noise of its own: on the slow channel's
    samples alone the relation is buried (about 0.2 nats, flagged on a fraction of hops); the second test, on
    every row either renews, averages the fast channel's noise and flags it on nearly every hop. A smooth
    independent channel beside them, tested the same two ways, never is."""
    rng = np.random.default_rng(77)
    seconds = 150
    t_slow = T0 + 0.021 + np.arange(seconds * 20) / 20.0 + rng.uniform(-1e-3, 1e-3, seconds * 20)
    drive = _ar1(rng, 0.5, (1, len(t_slow)))[0]
    t_fast = T0 + 0.002 + np.arange(seconds * 100) / 100.0 + rng.uniform(-2e-4, 2e-4, seconds * 100)
    follow = np.round(np.interp(t_fast, t_slow, drive / drive.std())) + 1.5 * rng.standard_normal(len(t_fast))
    other = _ar1(rng, 0.98, (1, len(t_fast)))[0]
    hops = _replay({"drive": (t_slow, drive), "follow": (t_fast, follow), "other": (t_fast, other)},
                   window_len=1024, hop_samples=100, false_alarm_rate=2e-5, max_staleness_s=0.075)  # fmt: skip
    late = [s for s, _ in hops[12:]]
    assert 0.1 < np.median([s.mi[0, 1] for s in late]) < 0.4  # the value shown: the slow channel's rows
    assert np.mean([s.dependent[0, 1] for s in late]) > 0.9
    assert not any(s.dependent[0, 2] or s.dependent[1, 2] for s, _ in hops)


def test_the_surrogate_tail_turns_from_gamma_to_normal_as_effective_samples_grow():
    """Small effective sizes keep the skewed (gamma) tail, large ones the normal tail, blended between."""
    assert normal_weight(20.0) == 0.0 and normal_weight(1000.0) == 1.0
    assert 0.0 < normal_weight(120.0) < normal_weight(200.0) < 1.0


def test_a_held_channel_beside_a_random_walk_is_not_flagged():
    """An independent 50 Hz channel, held on a 100 Hz clock, beside a 100 Hz near-random walk (stamps on their
    own phases, jittered): on every tick, rows repeating the slow sample while the walk barely moves are
    near-copies that read about 0.27 nats; on the slow channel's own samples the pair reads near zero, and with
    its second test on every tick (its own null there) it is never flagged."""
    rng = np.random.default_rng(52)
    seconds = 300

    def stamps(rate: float) -> np.ndarray:
        n = int(seconds * rate)
        return T0 + rng.uniform(0, 1 / rate) + np.arange(n) / rate + rng.uniform(-0.1, 0.1, n) / rate

    t_fast, t_slow = stamps(100.0), stamps(50.0)
    walk = lfilter([1.0], [1.0, -0.999], rng.standard_normal(len(t_fast) + 3000))[3000:]
    hops = _replay({"walk": (t_fast, walk), "slow": (t_slow, rng.standard_normal(len(t_slow)))},
                   window_len=1024, hop_samples=100)  # fmt: skip
    assert np.nanmedian([s.mi[0, 1] for s, _ in hops]) < 0.02  # no near-copies in the value shown
    assert not any(s.dependent[0, 1] for s, _ in hops)


def test_a_pair_newly_above_a_null_from_an_earlier_window_is_judged_on_a_fresh_one():
    """Two smooth pairs cross bars measured on white-noise windows: the hop measures one null (its budget), the
    stronger crossing's, and the other pair waits (no bar it can cross) until a later hop measures its own."""
    est = default_estimator()
    table = cached_calibration(est.fingerprint, est.estimate_batch, 512, est.ties)
    rng = np.random.default_rng(4)
    pairs = [("a", "b"), ("c", "d")]
    i, j = np.array([0, 2]), np.array([1, 3])
    sur = SurrogateNulls(20, refresh_ns=10**12, max_pairs=1)
    white = rank_rows(rng.standard_normal((4, 512)), est.ties)
    sur.measure(est.estimate_histograms, est.grid, white, i, j, pairs, np.full(2, 512.0), t_ns=0)
    x = _ar1(rng, 0.99, (2, 512))
    u = rank_rows(np.stack([x[0], x[0] + 0.3 * x.std() * rng.standard_normal(512),
                            x[1], x[1] ** 2 + 0.6 * x.std() ** 2 * rng.standard_normal(512)]), est.ties)  # fmt: skip
    n_eff = pair_n_eff(autocorrelation(u[i]), autocorrelation(u[j]), 512)
    mi = est.estimate_ranks(u, i, j)
    strong, weak = int(np.argmax(mi)), int(np.argmin(mi))
    old_hi, _ = sur.thresholds(pairs, 1e-3)
    assert (mi > old_hi).all()  # both cross the white-noise bars
    done, held = np.ones(2, dtype=bool), np.ones(2, dtype=bool)
    for t_ns, measured in ((1, strong), (2, weak)):
        hi, _ = sur.hop_thresholds(est, table, 1e-3, u, [], i, j, pairs, mi, n_eff, done, t_ns, held)
        assert sur.thresholds(pairs, 1e-3)[0][measured] > old_hi[measured]  # measured afresh: a wider null
        if t_ns == 1:
            assert hi[weak] >= 1e9 > hi[strong]
    assert (hi < 1e9).all()


def test_mirrored_shifts_join_no_window_end_to_its_start():
    """A near-random walk's window ends far from where it began: every plain circular shift carries that jump,
    while each mirrored shift (the window, then the window reversed) moves by no more than the walk's own steps.
    White noise, whose steps are as large, keeps the plain shifts."""
    est = default_estimator()
    rng = np.random.default_rng(6)
    u = rank_rows(lfilter([1.0], [1.0, -0.999], rng.standard_normal((3, 4024)), axis=1)[:, 3000:], est.ties)
    step = np.abs(np.diff(u, axis=1)).max(axis=1)[:, None]  # (3, 1)
    plain, mirrored = shifted_samples(u, 20), shifted_samples(u, 20, mirror=True)
    assert plain.shape == mirrored.shape == (3, 20, 1024)
    assert (np.abs(np.diff(plain, axis=2)).max(axis=2) > step).all()
    assert (np.abs(np.diff(mirrored, axis=2)).max(axis=2) <= step).all()
    assert not any(np.array_equal(m, u[0]) for m in mirrored[0])  # none is the window itself
    noisy = rank_rows(rng.standard_normal((3, 1024)), est.ties)  # its steps are as large as any wrap-around
    np.testing.assert_array_equal(shifted_samples(noisy, 20, mirror=True), shifted_samples(noisy, 20))
