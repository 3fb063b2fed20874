"""Lead and lag: the MI of x(t) against y(t + tau) over lags |tau| <= K, and the lag where it peaks.

Sign convention (used everywhere): a positive lag means y, the second channel of the pair, follows x, the first.

A lag curve does not cost a network pass per lag. Three steps, for many pairs at once:

1. **Scan** (every lag, no network). Each channel's copula values over its extended window (N + K samples) are
   sketched by the screen's cosine features f_k(u) = sqrt(2) cos(k pi u), k = 1..4
   (:func:`streamcorr.engine.screen.sketch`), and for a pair the cross-correlations of every feature pair at every
   lag come from one FFT product. Their sum of squares, S(tau) = T_tau sum_kl c_kl(tau)^2, is the screen's
   statistic at lag tau: about chi-square with 16 degrees of freedom for white independent channels, and it sees
   non-monotone relations (a square, an absolute value) that plain cross-correlation misses.
2. **Network** (a few lags). The ``candidates`` highest local maxima of S get one network estimate each, on
   windows of N samples shifted by that lag, in one batch; the best of them is the pair's lag.
3. **Refine**. A parabola through S at the best lag and its two neighbours gives the sub-sample lag; the
   sample-and-hold alignment's mean age per channel (``age``, samples by which a channel's held value trails the
   clock tick) is taken off, so two devices stamping at different phases read their true delay.

**Significance.** The best of many lags is biased upward. The MI at the best lag must clear the null of
independent windows at the pair's effective size, at the rate ``alpha`` divided by the number of effectively
independent lags searched, (2K + 1) n_eff / N (a union bound: neighbouring lags of a smooth pair are nearly the
same test). A smooth pair (n_eff below N / 2) is judged on its own null instead: its best-lag windows shifted
circularly against each other (``surrogates`` shifts, :class:`streamcorr.estimate.surrogates.SurrogateNulls`),
never below white noise's bar at the same rate. Otherwise the pair reports no lag.

>>> from streamcorr.estimate.estimator import default_estimator
>>> rng = np.random.default_rng(1)
>>> x = rng.standard_normal(1100)
>>> y = np.roll(x, 30) ** 2 + 0.3 * rng.standard_normal(1100)  # y follows x by 30 samples, non-monotone
>>> r = lag_scan(default_estimator(), np.stack([x, y]), [0], [1], max_lag=50)
>>> round(float(r.lag[0])), bool(r.mi[0] > 0.5), bool(r.significant[0])
(30, True, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import chi2

from ..errors import InputError
from ..estimate.copula import Ties, rank_transform
from ..estimate.estimator import Estimator
from ..estimate.significance import NullTable, autocorrelation, pair_n_eff
from ..estimate.surrogates import SurrogateNulls
from .changes import cached_calibration
from .screen import sketch

__all__ = ["CANDIDATES", "LagScan", "lag_scan", "lag_windows", "scan_statistic"]

CANDIDATES = 3  # lags per pair the network evaluates: the scan's highest local maxima
SURROGATES = 16  # shifted surrogates per smooth pair for its own null (streamcorr.estimate.surrogates)
N_BASIS = 4  # cosine features per channel in the scan (the screen's)
_CHUNK_FLOATS = 8_000_000  # bounds the scan's (pairs, F, F, nfft) temporary


@dataclass(frozen=True)
class LagScan:
    """The lag search's result for P pairs (lags in samples of the common clock; positive: y follows x)."""

    lag: np.ndarray  # (P,) best lag, sub-sample, age-corrected; NaN where not significant
    best: np.ndarray  # (P,) the same before the significance test (NaN where not evaluated)
    mi: np.ndarray  # (P,) nats: network MI at the best integer lag (NaN where not evaluated)
    threshold: np.ndarray  # (P,) nats: the max-over-lags null the MI had to clear
    significant: np.ndarray  # (P,) bool
    curve: np.ndarray  # (P, 2K + 1) float32: the scan's small-dependence MI figure at lags -K..K, nats
    n_eff: np.ndarray  # (P,) effective sample size of the pair's window
    cand_lag: np.ndarray  # (P, M) integer lags the network evaluated
    cand_mi: np.ndarray  # (P, M) nats there (NaN: the pair failed the scan's screen and was not evaluated)
    network_pairs: int  # network estimates made: candidates and surrogates


def _features(values: np.ndarray, ties: Ties) -> np.ndarray:
    """Standardised cosine features (C, F, L) of each row's copula values (the screen's sketch)."""
    return sketch(rank_transform(values, ties), N_BASIS)


def scan_statistic(feat: np.ndarray, iu: np.ndarray, iv: np.ndarray, max_lag: int) -> np.ndarray:
    """S (P, 2K + 1) at lags -K..K of pairs (iu, iv) of per-channel features feat (C, F, L): the screen's
    statistic of x(t) against y(t + tau), over the L - |tau| overlapping samples."""
    _c, f, length = feat.shape
    nfft = 1 << math.ceil(math.log2(length + max_lag))
    spec = np.fft.rfft(feat, nfft, axis=2)  # (C, F, nfft / 2 + 1)
    lags = np.arange(-max_lag, max_lag + 1)
    overlap = (length - np.abs(lags)).astype(np.float64)  # (2K + 1,)
    out = np.empty((len(iu), len(lags)))
    chunk = max(1, _CHUNK_FLOATS // (f * f * nfft))
    for p0 in range(0, len(iu), chunk):
        a, b = iu[p0 : p0 + chunk], iv[p0 : p0 + chunk]
        # sum_t x_k(t) y_l(t + tau): conj(X_k) Y_l, all feature pairs at once
        prod = np.conj(spec[a])[:, :, None, :] * spec[b][:, None, :, :]  # (p, F, F, nfft / 2 + 1)
        r = np.fft.irfft(prod, nfft, axis=3)  # (p, F, F, nfft): lag tau at index tau mod nfft
        r = r[:, :, :, lags % nfft] / overlap  # (p, F, F, 2K + 1) cross-moments c_kl(tau)
        out[p0 : p0 + chunk] = np.einsum("pklt,pklt->pt", r, r) * overlap
    return out


def _peaks(s: np.ndarray, n: int, gap: int) -> np.ndarray:
    """Indices of n lags of s, highest first: its local maxima (not the shoulders of one broad peak), then, if
    fewer, the highest other values; all at least gap apart (greedy)."""
    inner = np.r_[True, s[1:] >= s[:-1]] & np.r_[s[:-1] >= s[1:], True]  # (L,) at least both neighbours
    order = np.argsort(-s, kind="stable")
    picked: list[int] = []
    for k in (*order[inner[order]], *order[~inner[order]]):
        if all(abs(int(k) - q) >= gap for q in picked):
            picked.append(int(k))
            if len(picked) == n:
                break
    return np.array(picked, dtype=np.int64)


def lag_windows(values: np.ndarray, iu: np.ndarray, iv: np.ndarray, lags: np.ndarray,
                window_len: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """x(t), y(t + tau) (P, N) of pairs (iu, iv) at integer lags (P,) from per-channel windows values (C, N + K),
    newest last: the pair's newest N aligned samples at that lag."""
    length = values.shape[1]
    k = length - window_len
    rows = np.arange(window_len)
    start_x = k - np.maximum(lags, 0)  # y's newest sample is the window's when tau >= 0, x's when tau < 0
    start_y = k + np.minimum(lags, 0)
    x = values[iu[:, None], start_x[:, None] + rows]
    y = values[iv[:, None], start_y[:, None] + rows]
    return x, y


def lag_scan(
    est: Estimator,
    values: np.ndarray,
    iu: object,
    iv: object,
    *,
    max_lag: int,
    window_len: int | None = None,
    null: NullTable | None = None,
    alpha: float = 1e-3,
    min_effect: float = 0.0,
    age: np.ndarray | None = None,
    candidates: int = CANDIDATES,
    surrogates: int = SURROGATES,
    force: np.ndarray | None = None,
) -> LagScan:
    """Best lag of pairs (iu[p], iv[p]) of rows of ``values`` (C, N + K), each row a channel's newest N + K samples
    on the common clock (finite), N = ``window_len`` (default: the rows' length minus K).

    ``null`` is the null table of N-sample windows (default: the estimator's, measured once and cached); a pair's
    lag is reported when its MI at the best lag is above the null at its effective size for the rate ``alpha``
    per pair and scan, spread over the effectively independent lags, and above ``min_effect``. ``age`` (C,) is
    each row's mean sample-and-hold age in samples (default 0). ``force`` (P,) marks pairs the network evaluates
    whatever the scan shows (default: all); the others only when the scan's peak is beyond chance.
    """
    values = np.asarray(values, dtype=np.float64)
    iu_a, iv_a = np.atleast_1d(np.asarray(iu, dtype=np.int64)), np.atleast_1d(np.asarray(iv, dtype=np.int64))
    if values.ndim != 2:
        raise InputError(f"values must be (C, N + K) channel rows; got shape {values.shape}")
    if not isinstance(max_lag, int | np.integer) or max_lag < 1:
        raise InputError(f"max_lag must be a whole number of samples >= 1; got {max_lag!r}")
    n = values.shape[1] - max_lag if window_len is None else int(window_len)
    if n + max_lag > values.shape[1] or n < est.min_window:
        need = f"at least {est.min_window} + max_lag = {est.min_window + max_lag}"
        raise InputError(f"rows must hold window_len + max_lag samples ({need}); got {values.shape[1]}")
    if iu_a.shape != iv_a.shape or (iu_a.size and (min(iu_a.min(), iv_a.min()) < 0 or
                                                   max(iu_a.max(), iv_a.max()) >= len(values))):  # fmt: skip
        raise InputError(f"iu and iv must be equal-length row indices below {len(values)}")
    if not np.isfinite(values[np.union1d(iu_a, iv_a)]).all():
        raise InputError("values of the scanned channels must be finite (leave out pairs with gaps)")
    p, width = len(iu_a), 2 * max_lag + 1
    age_a = np.zeros(len(values)) if age is None else np.asarray(age, dtype=np.float64)
    values = values[:, values.shape[1] - n - max_lag :]
    used = np.union1d(iu_a, iv_a)
    feat = np.zeros((len(values), N_BASIS, values.shape[1]), dtype=np.float32)
    feat[used] = _features(values[used], est.ties)
    s = scan_statistic(feat, iu_a, iv_a, max_lag)  # (P, 2K + 1)
    overlap = values.shape[1] - np.abs(np.arange(-max_lag, max_lag + 1))
    curve = np.maximum(0.0, (s - N_BASIS**2) / (2.0 * overlap)).astype(np.float32)
    # each pair's window's effective size, from its channels' newest N samples
    acf = np.zeros((len(values), 2, max(1, n // 4) + 1))
    acf[used] = autocorrelation(rank_transform(values[used, max_lag:], est.ties))
    n_eff = pair_n_eff(acf[iu_a], acf[iv_a], n) if p else np.zeros(0)
    independent_lags = np.maximum(1.0, width * n_eff / n)
    # pairs not forced go to the network only when the scan's peak, scaled to the pair's effective size, is beyond
    # chance over the lags searched (a loose bar: it saves the network's time, the network's null decides)
    scaled = s.max(axis=1, initial=0.0) * n_eff / n
    go = (
        np.ones(p, bool)
        if force is None
        else np.asarray(force, bool) | (scaled > chi2.isf(0.01 / independent_lags, N_BASIS**2))
    )
    # the network on each pair's highest scan peaks, one batch
    cand = np.stack([_peaks(s[q], candidates, 3) for q in range(p)]) if p else np.zeros((0, candidates), np.int64)
    m = cand.shape[1]
    mi = np.full((p, m), np.nan)
    rows_go = np.flatnonzero(go)
    if rows_go.size:
        lags = (cand[rows_go] - max_lag).reshape(-1)
        x, y = lag_windows(values, np.repeat(iu_a[rows_go], m), np.repeat(iv_a[rows_go], m), lags, n)
        mi[rows_go] = est.estimate_batch(x, y).reshape(-1, m)
    pick = np.argmax(np.nan_to_num(mi, nan=-1.0), axis=1) if m else np.zeros(p, np.int64)
    rows = np.arange(p)
    k_best = cand[rows, pick]  # index into -K..K
    mi_best = mi[rows, pick]
    # sub-sample: the parabola through S at the peak and its neighbours, where it is a local maximum inside
    best = k_best.astype(np.float64) - max_lag
    inner = (k_best > 0) & (k_best < width - 1)
    q = rows[inner]
    s0, s1, s2 = s[q, k_best[inner] - 1], s[q, k_best[inner]], s[q, k_best[inner] + 1]
    denom = s0 - 2.0 * s1 + s2
    ok = (denom < 0) & (s1 >= s0) & (s1 >= s2)
    shift = np.where(ok, 0.5 * (s0 - s2) / np.where(ok, denom, -1.0), 0.0)
    best[q] += np.clip(shift, -0.5, 0.5)
    best -= age_a[iv_a] - age_a[iu_a]  # held values trail their ticks: y's age adds to the grid's lag
    # the max-over-lags null: alpha spread over the effectively independent lags searched
    if null is None:
        null = cached_calibration(est.fingerprint, est.estimate_batch, n, est.ties)
    threshold = np.array([null.dependent_above(np.array([ne]), alpha / k, min_effect)[0]
                          for ne, k in zip(n_eff, independent_lags, strict=True)])  # fmt: skip
    smooth = np.flatnonzero(go & (n_eff < 0.5 * n)) if surrogates else np.zeros(0, np.int64)
    if smooth.size:  # the pair's own null: its best-lag windows shifted circularly against each other
        xs, ys = lag_windows(values, iu_a[smooth], iv_a[smooth], k_best[smooth] - max_lag, n)
        u = rank_transform(np.concatenate([xs, ys]), est.ties)
        own = SurrogateNulls(surrogates, 1)
        keys = [(str(k), "") for k in range(len(smooth))]
        idx = np.arange(len(smooth))
        own.measure(est.estimate_histograms, est.grid, u, idx, idx + len(smooth), keys, n_eff[smooth], 0)
        hi = np.array(
            [own.thresholds([key], alpha / independent_lags[q])[0][0] for key, q in zip(keys, smooth, strict=True)]
        )
        # never below white noise's bar at the same rate: 16 shifts of an oscillating pair can all land low
        white = np.array([null.dependent_above(np.array([float(n)]), alpha / independent_lags[q])[0] for q in smooth])
        threshold[smooth] = np.maximum(np.maximum(hi, white), min_effect)
    significant = go & (mi_best > threshold)
    best[~go] = np.nan
    return LagScan(np.where(significant, best, np.nan), best, mi_best, threshold, significant, curve,
                   n_eff, cand - max_lag, mi, int(rows_go.size * m + smooth.size * surrogates))  # fmt: skip
