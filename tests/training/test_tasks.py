"""Ground truth of the task families in training.tasks, against closed forms and brute force."""

import numpy as np
import pytest
from scipy.stats import multivariate_normal

from training.tasks import (
    NOISE_FUNCTIONS,
    Quantiser,
    TaskMix,
    bounded_noise_draw,
    bounded_noise_mi,
    bvn_cdf,
    cell_probabilities,
    gaussian_mixture,
    high_mi_mixture,
    independent_mixture,
    mc_mutual_information,
    quantised_draw,
    random_mixture,
    sample_task,
    uniform_noise_mi,
)


def test_bivariate_normal_cdf_matches_scipy():
    """Owen's-T bivariate normal CDF agrees with scipy's numerical integration, at zeros and tails too."""
    for rho in (-0.95, -0.3, 0.0, 0.5, 0.999):
        for h, k in ((0.3, -1.2), (-2.0, -0.5), (1.5, 2.0), (0.0, 0.7), (-0.4, 0.0), (8.0, 0.2), (-8.0, 1.0)):
            ref = multivariate_normal([0, 0], [[1, rho], [rho, 1]]).cdf([h, k])
            assert bvn_cdf(np.array(h), np.array(k), np.array(rho)) == pytest.approx(ref, abs=1e-6)


def _plugin_mi(cells: np.ndarray) -> float:
    p = cells / cells.sum()
    q = np.outer(p.sum(1), p.sum(0))
    m = p > 0
    return float((p[m] * np.log(p[m] / q[m])).sum())


def test_exact_cell_probabilities_match_counting():
    """Exact cell probabilities of a quantised mixture equal the frequencies of 1M samples (within 4 SE)."""
    rng = np.random.default_rng(0)
    gm = random_mixture(rng)
    tx, ty = np.array([-2.0, 0.0, 1.5]), np.array([-1.0, 2.0])
    cells = cell_probabilities(gm, tx, ty)
    assert cells.sum() == pytest.approx(1.0, abs=1e-9)
    z = gm.sample(1_000_000, rng)
    counts = np.zeros((4, 3))
    np.add.at(counts, (np.searchsorted(tx, z[:, 0]), np.searchsorted(ty, z[:, 1])), 1.0)
    freq = counts / counts.sum()
    assert np.all(np.abs(freq - cells) <= 4 * np.sqrt(cells * (1 - cells) / 1e6) + 1e-9)


def test_one_axis_quantised_mi_lies_between_fine_and_coarse_quantisation():
    """I(Q(X); Y) by Monte Carlo is at least I(Q(X); Q_fine(Y)) (data processing) and close to it (400 levels)."""
    rng = np.random.default_rng(1)
    gm = random_mixture(rng)
    quant = Quantiser((6, 0), equal_frequency=True)
    draw = quantised_draw(gm, quant, np.random.default_rng(2), 100, 200_000)
    tx = quant.thresholds(gm, 0, np.random.default_rng(2))  # the same pilot draw, so the same thresholds
    ty = np.quantile(gm.sample(200_000, rng)[:, 1], np.arange(1, 400) / 400)
    fine = _plugin_mi(cell_probabilities(gm, tx, ty))
    assert fine - 4 * draw.se <= draw.mi <= fine + 0.01 + 4 * draw.se  # 400 levels lose < 0.01 nats here


def test_quantised_fresh_coordinates_are_uniform_and_window_is_tied():
    """Fresh copula coordinates of quantised axes are uniform (jittered CDF); the window holds level indices."""
    rng = np.random.default_rng(3)
    draw = quantised_draw(random_mixture(rng), Quantiser((4, 7), False), rng, 500, 50_000)
    assert set(np.unique(draw.window[:, 0])) <= set(range(4)) and set(np.unique(draw.window[:, 1])) <= set(range(7))
    for a in (0, 1):
        np.testing.assert_allclose(np.quantile(draw.fresh[:, a], [0.1, 0.5, 0.9]), [0.1, 0.5, 0.9], atol=0.01)


@pytest.mark.parametrize("eps", [0.05, 0.3, 0.5, 1.0])
def test_bounded_noise_mi_matches_closed_form(eps):
    """For f = identity the quadrature MI equals the closed form I(X; X + U(-eps, eps)) to 1e-4."""
    assert bounded_noise_mi("identity", eps) == pytest.approx(uniform_noise_mi(eps), abs=1e-4)


@pytest.mark.parametrize("name", list(NOISE_FUNCTIONS))
def test_bounded_noise_fresh_cdf_is_uniform_and_mi_matches_monte_carlo(name):
    """The exact CDF of y makes fresh coordinates uniform; a histogram plug-in on 400k samples agrees on MI."""
    rng = np.random.default_rng(4)
    draw = bounded_noise_draw(name, 0.1, rng, 400_000, 20_000)
    np.testing.assert_allclose(np.quantile(draw.fresh[:, 1], [0.1, 0.5, 0.9]), [0.1, 0.5, 0.9], atol=0.015)
    x, y = draw.window[:, 0], draw.window[:, 1]
    h, _, _ = np.histogram2d(x, y, bins=(200, 200))
    assert _plugin_mi(h) == pytest.approx(draw.mi, abs=0.06)  # plug-in bias at 200 x 200 cells / 400k samples


def test_independent_mixture_has_zero_mi_and_high_mi_mixture_is_high():
    """The product mixture has Monte-Carlo MI ~ 0; high-MI mixtures reach above 1 nat on average."""
    rng = np.random.default_rng(5)
    mi, se = mc_mutual_information(independent_mixture(rng), rng, n=50_000)
    assert abs(mi) < 4 * se + 1e-3
    his = [mc_mutual_information(high_mi_mixture(rng), rng, n=5_000)[0] for _ in range(20)]
    assert np.mean(his) > 1.0
    assert mc_mutual_information(gaussian_mixture(0.0), rng, n=1000)[0] == pytest.approx(0.0, abs=0.01)


def test_sample_task_covers_every_family():
    """Every family of the training mix yields finite windows, coordinates in [0, 1] and finite MI."""
    rng = np.random.default_rng(6)
    mix = TaskMix(p_high_mi=0.2, p_quantised=0.3, p_bounded_noise=0.2)
    for _ in range(60):
        d = sample_task(rng, mix, 64, 256)
        assert d.window.shape == (64, 2) and d.fresh.shape == (256, 2)
        assert np.isfinite(d.window).all() and (d.fresh >= 0).all() and (d.fresh <= 1).all()
        assert np.isfinite(d.mi) and d.mi > -0.1
