"""The fast path's short windows: innovation tests at several lengths, shortest first."""

from __future__ import annotations

import numpy as np
from scipy.signal import lfilter
from scipy.stats import chi2, norm

from streamcorr.engine.settings import innovation_lengths
from streamcorr.engine.short_windows import (
    FOLD_BINS,
    FOLDS,
    MIN_BIN,
    innovation_estimates,
    innovation_tests,
    local_slopes,
    short_estimates,
)
from streamcorr.estimate.estimator import Estimator
from tests import naive


def _smooth(rng: np.random.Generator, n: int, tau: float) -> np.ndarray:
    return lfilter([1.0], [1.0, -np.exp(-1.0 / tau)], rng.standard_normal(n + 300))[300:]


def test_innovation_lengths_are_half_once_and_twice_the_short_window_within_half_the_window() -> None:
    """The defaults give 128, 256 and 512 rows at window 1024; a short window keeps what fits."""
    assert innovation_lengths(256, 1024) == (128, 256, 512)
    assert innovation_lengths(256, 512) == (128, 256)
    assert innovation_lengths(64, 256) == (32, 64, 128)


def test_a_strong_coupling_is_seen_on_the_shortest_window_and_independent_pairs_on_none() -> None:
    """Smooth channels whose newest 150 rows couple strongly (y's innovations follow x's) are seen at 128 rows;
    independent smooth pairs pass every length at a strict threshold; each pair is tried until one length shows it."""
    rng = np.random.default_rng(531)
    n, k = 1024, 6
    x = np.stack([_smooth(rng, n, tau) for tau in rng.uniform(5.0, 30.0, k)])
    y = np.stack([_smooth(rng, n, tau) for tau in rng.uniform(5.0, 30.0, k)])
    y[0, -150:] = x[0, -150:] + 0.2 * _smooth(rng, 150, 10.0)
    window = np.concatenate([x, y])  # (2k, n): channel c pairs with k + c
    fresh = np.ones_like(window, dtype=bool)
    pairs = np.stack([np.arange(k), np.arange(k) + k], axis=1)
    est = Estimator()
    tried: list[tuple[int, int]] = []

    def threshold(m: int, n_eff: np.ndarray) -> np.ndarray:
        tried.append((m, len(n_eff)))
        return np.full(len(n_eff), 0.3)  # nats: far above independent pairs' innovations at these lengths

    def fold_z(m: int) -> float:
        return 5.3  # the folds' bar at a rate near 1e-7

    seen, shown_by = innovation_tests(est, window, fresh, pairs, (128, 256, 512), threshold, fold_z)
    assert seen[0] == 128 and (seen[1:] == 0).all() and shown_by[0] == FOLDS.index("innovations")
    assert tried == [(128, k), (256, k - 1), (512, k - 1)]  # the coupled pair is not tried again
    mi, n_eff, _, _ = short_estimates(est, window, fresh, pairs, 128, innovations=True)
    assert mi[0] > 0.3 > np.max(mi[1:])
    assert (n_eff > 0.6 * 128).all()  # innovations hold nearly one effective sample a row


def test_short_estimates_match_each_pair_computed_on_its_own() -> None:
    """Channels shared by several pairs are pre-whitened and ranked once: the same MI as each pair on its own."""
    from streamcorr.estimate.copula import rank_transform
    from streamcorr.estimate.significance import prewhiten

    rng = np.random.default_rng(532)
    window = np.stack([_smooth(rng, 512, tau) for tau in (4.0, 12.0, 25.0, 8.0)])
    window[3] = window[0] + 0.5 * window[3]
    fresh = np.ones_like(window, dtype=bool)
    pairs = np.array([[0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]])
    est = Estimator()
    mi, _, u, _ = short_estimates(est, window, fresh, pairs, 256, innovations=True)
    for q, (a, b) in enumerate(pairs):
        own = rank_transform(prewhiten(window[[a, b], -256:]), est.ties)
        assert np.array_equal(u[:, q], own)
        alone = est.estimate_ranks(own, np.array([0]), np.array([1]))[0]
        assert abs(mi[q] - alone) < 1e-5  # float32 network: a batch of one runs eager, six the compiled package


def test_a_fold_shows_on_folded_innovations_and_independent_pairs_stay_null_under_folding() -> None:
    """y = x^2, y = -|x| and y = sin(2x) on smooth x: y's innovations follow x's with the sign of the local slope,
    so the correlations within x's quartiles show it strongly; on independent smooth pairs the folds' z-scores read
    as |N(0, 1)| (each bin's correlation is noise)."""
    rng = np.random.default_rng(533)
    n, m, k = 1024, 256, 60
    x = np.stack([_smooth(rng, n, tau) for tau in rng.uniform(8.0, 30.0, k)])
    y = np.stack([_smooth(rng, n, tau) for tau in rng.uniform(8.0, 30.0, k)])
    x /= x.std(axis=1, keepdims=True)
    y[0] = x[0] ** 2 + 0.3 * y[0] / y[0].std()
    y[1] = -np.abs(x[1]) + 0.3 * y[1] / y[1].std()
    y[2] = np.sin(2.0 * x[2]) + 0.3 * y[2] / y[2].std()
    window = np.concatenate([x, y])
    fresh = np.ones_like(window, dtype=bool)
    pairs = np.stack([np.arange(k), np.arange(k) + k], axis=1)
    est = Estimator()
    _, n_eff, fold_z = innovation_estimates(est, window, fresh, pairs, m)
    assert (fold_z[:3, 0] > 8.0).all()  # x folded against y: far beyond any false-alarm rate the engine uses
    null = fold_z[3:]
    # |N(0, 1)| over 114 draws: mean 0.80, none above 4 (the test's seed; P(any > 4) about 0.7%)
    assert 0.6 < null.mean() < 1.0 and null.max() < 4.0
    assert (n_eff > 0.6 * m).all()
    # the same pairs with their channels swapped are seen on the other fold, with the same correlation
    _, _, swapped = innovation_estimates(est, window, fresh, pairs[:3, ::-1], m)
    assert np.allclose(swapped[:, 1], fold_z[:3, 0])


def test_local_slopes_match_a_bin_by_bin_reference() -> None:
    """The vectorised fold (edges, signs, z-score) matches correlations taken bin by bin, on smooth, quantised and
    white rows; a bin with fewer than MIN_BIN rows counts as no correlation."""
    rng = np.random.default_rng(534)
    m = 200
    levels = np.stack([_smooth(rng, m, 10.0), np.round(_smooth(rng, m, 20.0)), rng.standard_normal(m)])
    a, b = rng.standard_normal((3, m)), rng.standard_normal((3, m))
    b[0] += 0.8 * np.sign(levels[0] - np.median(levels[0])) * a[0]
    share = np.array([1.0, 0.8, 0.5])
    fold, z = local_slopes(levels, a, b, share)
    for row in range(3):
        ref = naive.local_slope_correlations(levels[row], a[row], b[row], FOLD_BINS)
        assert np.allclose(fold.edges[row], np.quantile(levels[row], [0.25, 0.5, 0.75]))
        q = sum(n * r * r for n, r in ref if n >= MIN_BIN) * share[row]
        assert abs(z[row] - norm.isf(chi2.sf(q, FOLD_BINS) / 2)) < 1e-9
        for k, (n, r) in enumerate(ref):
            if n >= MIN_BIN and abs(r) > 1e-9:
                assert fold.signs[row, k] == np.sign(r)
    assert z[0] > 5.0 and fold.signs[0].tolist() == [-1, -1, 1, 1]
