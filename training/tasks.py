"""Task distributions with ground-truth MI: the one home used by training/ and bench/.

A task draw is what both sides need: a window of samples as a sensor would give
them, fresh samples of the same distribution at their exact copula coordinates
(for the DV objective in training), and the true MI in nats with its
Monte-Carlo standard error (0 where the MI is exact).

Families (each a function ``(rng, t, n_fresh, ...) -> Draw``):

- ``mixture_draw``: any 2-D GaussianMixture, e.g. the paper's generator
  (``random_mixture``), an independent product (``independent_mixture``, MI
  exactly 0), a single Gaussian (``gaussian_mixture``) or a high-MI mixture
  (``high_mi_mixture``, components with per-component MI up to 3.5 nats).
- ``quantised_draw``: a mixture with x, y or both quantised to L levels,
  equal-width (over the central 99% of the marginal, outer levels saturating
  like an ADC) or equal-frequency. Ground truth is the MI of the quantised
  variables: both axes quantised, exact from cell probabilities (bivariate
  normal rectangles via Owen's T); one axis, Monte Carlo of
  log p(q, y) - log P(q) - log p(y) with exact conditional CDFs of the mixture.
  Fresh copula coordinates of a quantised axis are drawn the way the "jitter"
  tie policy (streamcorr.estimate.copula) ranks: u = P(Q < q) + V P(Q = q), V uniform,
  the exact copula of the jittered variable, whose MI equals that of Q.
- ``bounded_noise_draw``: x ~ U(0, 1), y = f(x) + U(-w, w) for f in
  ``NOISE_FUNCTIONS`` (axes swapped at random); MI = h(Y) - log(2w) with h(Y)
  by quadrature of the exact density of Y.

``sample_task`` draws from the training mixture of families (``TaskMix``).
Held-out protocol sets (paper Tables 2 and 3) are re-exported from
training.evaluate so that bench/ imports tasks from this module only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.special import log_ndtr, ndtr, owens_t

from .evaluate import LEVELS, LevelSet, eval_levels, level_set, order_accuracy, order_windows, windows
from .mixtures import GaussianMixture, gaussian_mi, mc_mutual_information, random_mixture

__all__ = [
    "LEVELS",
    "NOISE_FUNCTIONS",
    "Draw",
    "GaussianMixture",
    "LevelSet",
    "Quantiser",
    "TaskMix",
    "bounded_noise_draw",
    "bounded_noise_mi",
    "cell_mi",
    "eval_levels",
    "gaussian_mi",
    "gaussian_mixture",
    "high_mi_mixture",
    "independent_mixture",
    "level_set",
    "mc_mutual_information",
    "mixture_draw",
    "order_accuracy",
    "order_windows",
    "quantised_draw",
    "random_mixture",
    "sample_task",
    "uniform_noise_mi",
    "windows",
]


@dataclass(frozen=True)
class Draw:
    window: np.ndarray  # (T, 2) samples as observed (quantised axes hold level indices)
    fresh: np.ndarray  # (n_fresh, 2) exact copula coordinates of fresh samples, in [0, 1]
    mi: float  # ground truth, nats
    se: float  # its Monte-Carlo standard error (0 when exact)


# -- Gaussian mixtures ----------------------------------------------------------------------------------
def gaussian_mixture(rho: float) -> GaussianMixture:
    return GaussianMixture(np.ones(1), np.zeros((1, 2)), np.array([[[1.0, rho], [rho, 1.0]]]))


def independent_mixture(rng: np.random.Generator, k_max: int = 6) -> GaussianMixture:
    """Product of two independent 1-D paper-style mixtures: a 2-D mixture with MI exactly 0."""
    a, b = random_mixture(rng, dim=1, k_max=k_max), random_mixture(rng, dim=1, k_max=k_max)
    ka, kb = a.weights.shape[0], b.weights.shape[0]
    w = np.outer(a.weights, b.weights).ravel()
    mu = np.stack(np.broadcast_arrays(a.means[:, None, 0], b.means[None, :, 0]), -1).reshape(ka * kb, 2)
    var = np.stack(np.broadcast_arrays(a.covs[:, None, 0, 0], b.covs[None, :, 0, 0]), -1).reshape(ka * kb, 2)
    return GaussianMixture(w, mu, var[:, :, None] * np.eye(2))


def high_mi_mixture(rng: np.random.Generator, k_max: int = 4, max_component_mi: float = 3.5) -> GaussianMixture:
    """Mixtures of strongly correlated components: per-component MI uniform in [0.5, max_component_mi]."""
    k = int(rng.integers(1, k_max + 1))
    w = rng.uniform(0.2, 1.0, size=k)
    m = rng.uniform(0.5, max_component_mi, size=k)
    rho = np.sqrt(-np.expm1(-2.0 * m)) * rng.choice([-1.0, 1.0], size=k)
    sd = np.exp(rng.uniform(np.log(0.3), np.log(3.0), size=(k, 2)))
    covs = np.empty((k, 2, 2))
    covs[:, 0, 0], covs[:, 1, 1] = sd[:, 0] ** 2, sd[:, 1] ** 2
    covs[:, 0, 1] = covs[:, 1, 0] = rho * sd[:, 0] * sd[:, 1]
    return GaussianMixture(w / w.sum(), rng.uniform(-5.0, 5.0, size=(k, 2)), covs)


def mixture_draw(
    gm: GaussianMixture, rng: np.random.Generator, t: int, n_fresh: int, exact_mi: float | None = None
) -> Draw:
    """Window and fresh copula coordinates of a 2-D mixture; MI by Monte Carlo over the fresh samples."""
    z = gm.sample(t + n_fresh, rng)
    fresh = z[t:]
    uv = np.stack([gm.cdf1d(fresh[:, 0], 0), gm.cdf1d(fresh[:, 1], 1)], axis=1)
    if exact_mi is not None:
        return Draw(z[:t], uv, exact_mi, 0.0)
    pmi = gm.pointwise_pmi(fresh, (0,), (1,))
    return Draw(z[:t], uv, float(pmi.mean()), float(pmi.std(ddof=1) / np.sqrt(n_fresh)))


# -- quantised marginals -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Quantiser:
    levels: tuple[int, int]  # levels per axis; 0 = that axis is not quantised
    equal_frequency: bool
    pilot: int = 20_000  # samples of the marginal that place the edges (ground truth is exact for any edges)

    def thresholds(self, gm: GaussianMixture, axis: int, rng: np.random.Generator) -> np.ndarray:
        """Interior cell edges (L - 1,) of one axis, from a pilot sample of the marginal."""
        n_levels = self.levels[axis]
        pilot = gm.marginal((axis,)).sample(self.pilot, rng)[:, 0]
        if self.equal_frequency:
            return np.quantile(pilot, np.arange(1, n_levels) / n_levels)
        lo, hi = np.quantile(pilot, [0.005, 0.995])
        return np.linspace(lo, hi, n_levels + 1)[1:-1]


_BIG = 38.0  # |z| beyond which the standard normal CDF is 0 or 1 in float64


def bvn_cdf(h: np.ndarray, k: np.ndarray, rho: np.ndarray) -> np.ndarray:
    """Standard bivariate normal CDF P(Z1 < h, Z2 < k) with correlation rho, via Owen's T (Owen 1956)."""
    h = np.clip(h, -_BIG, _BIG)
    k = np.clip(k, -_BIG, _BIG)
    h = np.where(np.abs(h) < 1e-12, 1e-12, h)  # the formula divides by h and k
    k = np.where(np.abs(k) < 1e-12, 1e-12, k)
    s = np.sqrt(1.0 - rho * rho)
    beta = np.where(h * k > 0, 0.0, 0.5)
    return 0.5 * (ndtr(h) + ndtr(k)) - owens_t(h, (k - rho * h) / (h * s)) - owens_t(k, (h - rho * k) / (k * s)) - beta


def _edges(thr: np.ndarray) -> np.ndarray:
    return np.concatenate([[-np.inf], thr, [np.inf]])


def cell_probabilities(gm: GaussianMixture, tx: np.ndarray, ty: np.ndarray) -> np.ndarray:
    """Exact P(Q(X) = i, Q(Y) = j) (Lx, Ly) of a 2-D mixture for interior edges tx, ty."""
    ex, ey = _edges(tx), _edges(ty)
    sx, sy = np.sqrt(gm.covs[:, 0, 0]), np.sqrt(gm.covs[:, 1, 1])
    rho = gm.covs[:, 0, 1] / (sx * sy)
    h = (ex[None, :] - gm.means[:, 0, None]) / sx[:, None]  # (K, Lx + 1)
    k = (ey[None, :] - gm.means[:, 1, None]) / sy[:, None]  # (K, Ly + 1)
    cdf = bvn_cdf(h[:, :, None], k[:, None, :], rho[:, None, None])  # (K, Lx + 1, Ly + 1)
    rect = cdf[:, 1:, 1:] - cdf[:, :-1, 1:] - cdf[:, 1:, :-1] + cdf[:, :-1, :-1]
    return np.clip(np.einsum("k,kij->ij", gm.weights, rect), 0.0, None)


def cell_mi(cells: np.ndarray) -> float:
    """Discrete MI (nats) of a joint probability table (Lx, Ly)."""
    outer = np.outer(cells.sum(1), cells.sum(0))
    m = cells > 0
    return float((cells[m] * np.log(cells[m] / outer[m])).sum())


def _log_interval(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """log(Phi(b) - Phi(a)) for a < b, accurate in both tails."""
    upper = a > 0  # in the upper tail use Phi(-a) - Phi(-b)
    lo = np.where(upper, -b, a)
    hi = np.where(upper, -a, b)
    lhi, llo = log_ndtr(hi), log_ndtr(lo)
    return lhi + np.log(-np.expm1(np.minimum(llo - lhi, -1e-300)))


def _log_cond_cell(gm: GaussianMixture, q_axis: int, z_other: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """log p(other = z, q-axis in [lo, hi)) for samples (n,), summed over components with log-sum-exp."""
    o = 1 - q_axis
    var_o = gm.covs[:, o, o]
    slope = gm.covs[:, q_axis, o] / var_o  # (K,)
    cond_sd = np.sqrt(gm.covs[:, q_axis, q_axis] - slope * gm.covs[:, q_axis, o])
    d = z_other[None, :] - gm.means[:, o, None]  # (K, n)
    cond_mu = gm.means[:, q_axis, None] + slope[:, None] * d
    log_pdf_o = -0.5 * d * d / var_o[:, None] - 0.5 * np.log(2 * np.pi * var_o)[:, None]
    comp = np.log(gm.weights)[:, None] + log_pdf_o
    comp = comp + _log_interval((lo[None, :] - cond_mu) / cond_sd[:, None], (hi[None, :] - cond_mu) / cond_sd[:, None])
    top = comp.max(axis=0)
    return top + np.log(np.exp(comp - top).sum(axis=0))


def _jittered_u(q: np.ndarray, p_levels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Exact copula coordinate of the jittered quantised variable: P(Q < q) + V P(Q = q)."""
    below = np.concatenate([[0.0], np.cumsum(p_levels)[:-1]])
    return np.clip(below[q] + rng.uniform(size=q.shape) * p_levels[q], 0.0, 1.0)


def quantised_draw(gm: GaussianMixture, quant: Quantiser, rng: np.random.Generator, t: int, n_fresh: int) -> Draw:
    """A mixture observed through quantisers on one or both axes; MI of the quantised variables."""
    quantised = [quant.levels[a] > 0 for a in (0, 1)]
    thr = [quant.thresholds(gm, a, rng) if quantised[a] else np.empty(0) for a in (0, 1)]
    z = gm.sample(t + n_fresh, rng)
    q = np.stack([np.searchsorted(thr[a], z[:, a]) for a in (0, 1)], 1)  # level indices (0 where not quantised)
    window = np.where(quantised, q, z)[:t].astype(np.float64)
    fresh_z, fresh_q = z[t:], q[t:]
    uv = np.empty((n_fresh, 2))
    if all(quantised):
        cells = cell_probabilities(gm, thr[0], thr[1])  # (Lx, Ly)
        px, py = cells.sum(1), cells.sum(0)
        mi = cell_mi(cells)
        uv[:, 0] = _jittered_u(fresh_q[:, 0], px, rng)
        uv[:, 1] = _jittered_u(fresh_q[:, 1], py, rng)
        return Draw(window, uv, max(mi, 0.0), 0.0)
    a = 0 if quantised[0] else 1  # the quantised axis
    edges = _edges(thr[a])
    marg = gm.marginal((a,))
    sd = np.sqrt(marg.covs[:, 0, 0])
    cdf_edges = (marg.weights[:, None] * ndtr((edges[None, :] - marg.means[:, 0, None]) / sd[:, None])).sum(0)
    p_levels = np.clip(np.diff(cdf_edges), 1e-300, None)
    qa = fresh_q[:, a]
    log_joint = _log_cond_cell(gm, a, fresh_z[:, 1 - a], edges[qa], edges[qa + 1])
    log_other = gm.marginal((1 - a,)).logpdf(fresh_z[:, 1 - a : 2 - a])
    pmi = log_joint - np.log(p_levels[qa]) - log_other
    uv[:, a] = _jittered_u(qa, p_levels, rng)
    uv[:, 1 - a] = gm.cdf1d(fresh_z[:, 1 - a], 1 - a)
    return Draw(window, uv, float(pmi.mean()), float(pmi.std(ddof=1) / np.sqrt(n_fresh)))


# -- bounded (uniform) additive noise ------------------------------------------------------------------
NOISE_FUNCTIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "identity": lambda x: x,
    "square": lambda x: x * x,
    "cube": lambda x: x**3,
    "sqrt": np.sqrt,
    "sine": lambda x: np.sin(1.5 * np.pi * x),  # not monotone: y does not determine x even without noise
    "exp": lambda x: np.expm1(3.0 * x) / np.expm1(3.0),
}
_GRID = (np.arange(1 << 16) + 0.5) / (1 << 16)  # midpoints of x ~ U(0, 1)
_SORTED: dict[str, tuple[np.ndarray, np.ndarray]] = {}


def _sorted_f(name: str) -> tuple[np.ndarray, np.ndarray]:
    if name not in _SORTED:
        fs = np.sort(NOISE_FUNCTIONS[name](_GRID))
        _SORTED[name] = (fs, np.concatenate([[0.0], np.cumsum(fs)]))
    return _SORTED[name]


def _noise_density_cdf(name: str, width: float, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact density and CDF of Y = f(X) + U(-w, w), X ~ U(0, 1), up to the 2^16-point x grid."""
    fs, csum = _sorted_f(name)
    g = fs.shape[0]
    lo = np.searchsorted(fs, y - width, side="right")
    hi = np.searchsorted(fs, y + width, side="left")
    count = hi - lo
    inside = ((y + width) * count - (csum[hi] - csum[lo])) / (2 * width)  # sum of clip((y + w - f) / 2w) inside
    return count / (g * 2 * width), np.clip((lo + inside) / g, 0.0, 1.0)


def bounded_noise_mi(name: str, width: float) -> float:
    """I(X; f(X) + U(-w, w)) for X ~ U(0, 1): h(Y) - log(2w), h(Y) by quadrature on a fine grid."""
    fs, _ = _sorted_f(name)
    ys = np.linspace(fs[0] - width, fs[-1] + width, 1 << 13)
    p, _ = _noise_density_cdf(name, width, ys)
    dy = ys[1] - ys[0]
    m = p > 0
    return float(-(p[m] * np.log(p[m])).sum() * dy - np.log(2 * width))


def uniform_noise_mi(eps: float) -> float:
    """I(X; X + N), X ~ U(0, 1), N ~ U(-eps, eps): h(X + N) - log(2 eps) (closed form)."""
    return eps - np.log(2 * eps) if eps <= 0.5 else 1.0 / (4 * eps)


def bounded_noise_draw(
    name: str, width: float, rng: np.random.Generator, t: int, n_fresh: int, swap: bool = False
) -> Draw:
    """y = f(x) + U(-width, width), x ~ U(0, 1); width in units of f's range on [0, 1]."""
    fs, _ = _sorted_f(name)
    w = width * (fs[-1] - fs[0])
    x = rng.uniform(size=t + n_fresh)
    y = NOISE_FUNCTIONS[name](x) + rng.uniform(-w, w, size=x.shape)
    _, cdf = _noise_density_cdf(name, w, y[t:])
    window = np.stack([x[:t], y[:t]], 1)
    fresh = np.stack([x[t:], cdf], 1)
    mi = bounded_noise_mi(name, w)
    if swap:
        window, fresh = window[:, ::-1].copy(), fresh[:, ::-1].copy()
    return Draw(window, fresh, mi, 0.0)


# -- the training mixture of families -----------------------------------------------------------------
@dataclass(frozen=True)
class TaskMix:
    """Probabilities of each family in training (paper mixtures take the rest)."""

    k_max: int = 20
    p_independent: float = 0.10
    p_gaussian: float = 0.15
    max_gaussian_mi: float = 2.5
    p_high_mi: float = 0.0
    p_quantised: float = 0.0
    p_bounded_noise: float = 0.0
    min_levels: int = 2
    max_levels: int = 30
    p_both_quantised: float = 0.5
    p_equal_frequency: float = 0.5
    min_noise_width: float = 0.03  # of f's range
    max_noise_width: float = 1.0


def _base_mixture(rng: np.random.Generator, mix: TaskMix) -> GaussianMixture:
    r = rng.uniform()
    if r < 0.1:
        return independent_mixture(rng)
    if r < 0.25:
        mi = rng.uniform(0.0, mix.max_gaussian_mi)
        return gaussian_mixture(float(np.sqrt(-np.expm1(-2.0 * mi)) * rng.choice([-1.0, 1.0])))
    if r < 0.4:
        return high_mi_mixture(rng)
    return random_mixture(rng, k_max=mix.k_max)


def sample_task(rng: np.random.Generator, mix: TaskMix, t: int, n_fresh: int) -> Draw:
    """One training draw from the mixture of families."""
    probs = (mix.p_gaussian, mix.p_independent, mix.p_high_mi, mix.p_quantised, mix.p_bounded_noise)
    names = ("gaussian", "independent", "high_mi", "quantised", "bounded_noise", "paper")
    family = names[int(np.searchsorted(np.cumsum(probs), rng.uniform(), side="right"))]
    if family == "gaussian":
        mi = rng.uniform(0.0, mix.max_gaussian_mi)
        rho = float(np.sqrt(-np.expm1(-2.0 * mi)) * rng.choice([-1.0, 1.0]))
        return mixture_draw(gaussian_mixture(rho), rng, t, n_fresh, exact_mi=float(mi))
    if family == "independent":
        return mixture_draw(independent_mixture(rng), rng, t, n_fresh, exact_mi=0.0)
    if family == "high_mi":
        return mixture_draw(high_mi_mixture(rng), rng, t, n_fresh)
    if family == "quantised":
        n_levels = rng.integers(mix.min_levels, mix.max_levels + 1, size=2)
        if rng.uniform() >= mix.p_both_quantised:
            n_levels[rng.integers(2)] = 0
        quant = Quantiser((int(n_levels[0]), int(n_levels[1])), bool(rng.uniform() < mix.p_equal_frequency), pilot=4000)
        return quantised_draw(_base_mixture(rng, mix), quant, rng, t, n_fresh)
    if family == "bounded_noise":
        name = list(NOISE_FUNCTIONS)[rng.integers(len(NOISE_FUNCTIONS))]
        width = float(np.exp(rng.uniform(np.log(mix.min_noise_width), np.log(mix.max_noise_width))))
        return bounded_noise_draw(name, width, rng, t, n_fresh, swap=bool(rng.integers(2)))
    return mixture_draw(random_mixture(rng, k_max=mix.k_max), rng, t, n_fresh)
