"""Smooth pairs' folded innovations over the window: the rate they hold, and dependence only they show."""

import numpy as np
from scipy.signal import lfilter

from streamcorr.engine import mixed_rows
from streamcorr.engine.core import Engine, EngineConfig
from streamcorr.engine.short_windows import local_slopes
from streamcorr.engine.smooth_folds import fold_bar, fold_scores
from streamcorr.estimate.copula import rank_transform
from streamcorr.estimate.estimator import default_estimator
from streamcorr.estimate.significance import autocorrelation, pair_n_eff, pair_rows, prewhiten

T0 = 1_732_700_000.0


def _smooth(rng: np.random.Generator, phi: float, shape: tuple[int, int]) -> np.ndarray:
    e = rng.standard_normal((shape[0], shape[1] + 2000))
    return lfilter([1.0], [1.0, -phi], e, axis=1)[:, 2000:]


def _folds_pair_by_pair(est, window, fresh, valid, pairs):
    """The folds' larger z of each pair from its own rows, as short_windows.local_slopes scores them."""
    out = []
    for x, y in pairs:
        keep = pair_rows(fresh[x], fresh[y]) & valid[x] & valid[y]
        levels = np.stack([window[x, keep], window[y, keep]])
        ranks = rank_transform(np.ascontiguousarray(prewhiten(levels)), est.ties)
        acf = autocorrelation(ranks)
        share = pair_n_eff(acf[:1], acf[1:], keep.sum()) / keep.sum()
        _, z = local_slopes(levels, ranks, ranks[::-1], np.tile(share, 2))
        out.append(z.max())
    return np.array(out)


def test_shared_rows_give_each_pairs_own_fold_scores():
    """Scoring pairs together (channels on one clock, on two slower clocks, one with a gap) gives each pair the
    z-score of its own rows scored alone, within rounding."""
    est = default_estimator()
    rng = np.random.default_rng(12)
    c, n = 12, 1024
    window = _smooth(rng, 0.98, (c, n))
    window[1] = window[0] ** 2 + 0.3 * rng.standard_normal(n)
    fresh = np.ones((c, n), dtype=bool)
    fresh[6:9] = np.arange(n) % 2 == 0
    fresh[9:] = np.arange(n) % 5 == 1
    valid = np.ones((c, n), dtype=bool)
    valid[3, :40] = False
    pairs = np.column_stack(np.triu_indices(c, 1))
    got = fold_scores(est, window, fresh, valid, pairs)
    assert np.allclose(got, _folds_pair_by_pair(est, window, fresh, valid, pairs), rtol=1e-9, atol=1e-9)
    assert got[0] > 10  # the square pair


def test_folds_hold_their_rate_on_smooth_and_quantised_independent_pairs():
    """Independent AR(1) pairs (phi 0.9 to 0.995, some rounded to a few levels) pass the folds' bar at most twice as
    often as the rate it is set for, on a window's every row and on a slower channel's rows."""
    est = default_estimator()
    rng = np.random.default_rng(31)
    n, p, alpha = 1024, 300, 0.02
    phi = rng.uniform(0.9, 0.995, (2 * p, 1))
    window = np.concatenate([_smooth(rng, float(f), (1, n)) for f in phi.ravel()])
    window[::3] = np.round(window[::3] / window[::3].std(axis=1, keepdims=True) * 2)  # a third quantised
    pairs = np.column_stack([np.arange(p), np.arange(p, 2 * p)])
    fresh = np.ones_like(window, dtype=bool)
    fresh[p::2, :] = np.arange(n) % 5 == 0  # every other y channel at a fifth of the clock's rate
    z = fold_scores(est, window, fresh, np.ones_like(fresh), pairs)
    assert np.isfinite(z).all()
    assert (z > fold_bar(alpha)).sum() <= 2 * alpha * p, np.sort(z)[-10:]


def test_a_smooth_turning_relation_on_two_clocks_is_flagged_with_the_folds(monkeypatch):
    """Four pairs y = x^2 + noise of a quantised smooth x (a 0.5-s time constant, 50 Hz; y at 20 Hz, own phases),
    judged at a strict rate (a large matrix's): the engine holds each dependent in nearly every hop after its first
    window, where their levels alone (folds scored as nothing) leave many hops unflagged; no other pair of the
    eight channels is ever flagged."""
    rng = np.random.default_rng(3)
    secs, frames = 120, {}
    for r in range(4):
        tx = T0 + rng.uniform(0, 0.02) + np.arange(secs * 50) / 50.0
        ty = T0 + rng.uniform(0, 0.05) + np.arange(secs * 20) / 20.0
        x = _smooth(rng, np.exp(-1 / 25), (1, len(tx)))[0]
        x = np.round(x / x.std() * 2) / 2
        xi = np.interp(ty, tx, x)
        frames[f"x{r}"], frames[f"y{r}"] = (tx, x), (ty, xi**2 / (xi**2).std() + 0.3 * rng.standard_normal(len(ty)))
    names = list(frames)
    iu = np.triu_indices(len(names), 1)

    def flagged(engine: Engine) -> tuple[np.ndarray, int]:
        dep, other = [], 0
        for lo in np.arange(T0, T0 + secs, 1.0):
            for name, (t, v) in frames.items():
                s = (t >= lo) & (t < lo + 1.0)
                engine.push(name, t[s], v[s])
            for e in engine.due_windows():
                d = engine.evaluate(e)[0].dependent
                dep.append([bool(d[2 * r, 2 * r + 1]) for r in range(4)])
                other += int(d[iu].sum()) - sum(dep[-1])
        return np.mean(dep[3:], axis=0), other

    cfg = EngineConfig(channels=names, window_len=1024, hop_samples=100, rate_hz=100.0, skip_stale_hops=False,
                       max_future_s=None, false_alarm_rate=1e-6)  # fmt: skip
    with_folds, other = flagged(Engine(cfg))
    assert (with_folds > 0.9).all() and other == 0, (with_folds, other)
    monkeypatch.setattr(mixed_rows, "fold_scores", lambda est, window, fresh, valid, pairs: np.full(len(pairs), np.nan))
    levels_only, _ = flagged(Engine(cfg))
    assert levels_only.mean() < 0.85, levels_only
