"""Significance of MI on autocorrelated windows: effective sample sizes and a null indexed by them.

A window of T samples of a smooth signal holds far fewer independent samples than T, so two independent
smooth channels give MI estimates well above zero (T = 1024 and AR(1) with phi = 0.98: about 0.2 nats).
Whether an estimate is significant depends on the pair's *effective* sample size. Per pair it is taken
from Bartlett's formula for the variance of a cross-correlation of two autocorrelated series,

    n_eff = T / (1 + 2 sum_{k=1..K} w_k rho_x(k) rho_y(k)),   w_k = 1 - k / (K + 1),  K = T // 4,

with rho the autocorrelation of a feature of each channel's ranks over the window (the level, or the
distance from the median: the pair of features that gives the smallest n_eff), clipped to [2, T]. It is an index,
not an exact count: the null table below maps the *estimated* n_eff to the distribution of MI estimates on
independent pairs, measured over white, autoregressive, oscillating, band-limited, near-random-walk,
quantised and held (slower than the clock) processes, so the estimator's own bias is inside the table.

The table keeps, per bin of log n_eff, the null's median and 90th percentile and the mean excess over the
90th percentile (smoothed over neighbouring bins). Beyond it the null's tail is modelled as exponential, so a
false-alarm rate far below what any calibration can sample still gets a threshold (``NullTable.tail_check``:
the pooled standardised excess at the 0.999 quantile, 4.61 for an exact exponential; larger widens the scale):

    dependent_above(n_eff, alpha) = max(q90(n_eff) + s(n_eff) * log(0.1 / alpha), min_effect)

Pairs with n_eff of at least ``WHITE_FROM`` of the window take the null of white noise, measured on its own from
many more windows (its tail beyond the 99th percentile extrapolated from its top percent); none gets a lower bar.

``alpha`` is per pair and evaluation; :func:`per_evaluation_rate` derives it from the operator's
``changes.false_alarms_per_hour`` for the whole matrix.

>>> rng = np.random.default_rng(0)
>>> white = rank_rows(rng.standard_normal((2, 1024)))
>>> smooth = rank_rows(np.cumsum(rng.standard_normal((2, 1024)), axis=1))
>>> a, s = autocorrelation(white), autocorrelation(smooth)
>>> bool(pair_n_eff(a[:1], a[1:], 1024)[0] > 900), bool(pair_n_eff(s[:1], s[1:], 1024)[0] < 60)
(True, True)
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np
from scipy.signal import lfilter

from ..errors import ConfigError, InputError
from .copula import Ties, rank_transform

__all__ = [
    "N_FEATURES",
    "NullTable",
    "ar_fit",
    "ar_residuals",
    "autocorrelation",
    "estimate_own_rows",
    "max_lag",
    "null_processes",
    "pair_n_eff",
    "pair_rows",
    "per_evaluation_rate",
    "prewhiten",
    "prewhiten_own_samples",
    "rank_rows",
]

MIN_N_EFF = 2.0
WHITE_FROM = 0.6  # pairs with n_eff above this share of the window take the white-noise null
N_FEATURES = 2  # per channel: the level and the distance from the median (autocorrelation)


def max_lag(window_len: int) -> int:
    """Lags the autocorrelation sum runs over: a quarter of the window."""
    return max(1, window_len // 4)


def rank_rows(x: np.ndarray, ties: Ties = "jitter") -> np.ndarray:
    """Copula values of each row of x (C, T), with the engine's tie policy (streamcorr.estimate.copula)."""
    return rank_transform(x, ties)


def autocorrelation(u: np.ndarray, lags: int | None = None) -> np.ndarray:
    """Autocorrelations (C, F, K + 1) of F = 2 features of each row of copula values u (C, T), lags 0..K.

    The features are cos(pi u) (the level) and cos(2 pi u) (the distance from the median: envelopes and
    magnitudes), so a pair whose magnitudes are smooth is not mistaken for one of many independent samples.
    A constant feature has autocorrelation 1 at lag 0 and 0 elsewhere.
    """
    u = np.asarray(u, dtype=np.float64)
    _c, t = u.shape
    k = max_lag(t) if lags is None else lags
    feats = np.stack([np.cos(np.pi * u), np.cos(2 * np.pi * u)], axis=1)  # (C, F, T)
    d = feats - feats.mean(axis=2, keepdims=True)
    nfft = 1 << math.ceil(math.log2(2 * t))
    f = np.fft.rfft(d, nfft, axis=2)
    r = np.fft.irfft(f.real**2 + f.imag**2, nfft, axis=2)[:, :, : k + 1]  # (C, F, K + 1)
    var = r[:, :, :1]
    out = np.divide(r, var, out=np.zeros_like(r), where=var > 1e-12)
    out[:, :, 0] = 1.0
    return out


def pair_n_eff(acf_x: np.ndarray, acf_y: np.ndarray, n: int | np.ndarray) -> np.ndarray:
    """Effective sample sizes (P,) of pairs whose rows have feature autocorrelations acf_x, acf_y (P, F, K + 1)
    over n samples: Bartlett's sum for the feature pair that makes it smallest."""
    k = acf_x.shape[2] - 1
    w = 1.0 - np.arange(1, k + 1) / (k + 1)  # Bartlett's taper: distant lags are estimated worst
    s = 1.0 + 2.0 * np.einsum("pak,pbk,k->pab", acf_x[:, :, 1:], acf_y[:, :, 1:], w).max(axis=(1, 2))
    n_arr = np.asarray(n, dtype=np.float64)
    return np.clip(n_arr / np.maximum(s, 1e-9), MIN_N_EFF, n_arr)


AR_ORDER = 8  # lags of the pre-whitening fit: enough for smooth and oscillating sensor signals


def prewhiten(x: np.ndarray, order: int = AR_ORDER) -> np.ndarray:
    """Innovations of each row of x (P, T) of finite values: residuals of an AR(order) fit over the row
    (Yule-Walker), the first ``order`` with the lags the row has. A constant row is returned as it is.

    >>> rng = np.random.default_rng(0)
    >>> smooth = lfilter([1.0], [1.0, -0.98], rng.standard_normal(4096))[None]
    >>> r1 = lambda v: float(np.corrcoef(v[0, :-1], v[0, 1:])[0, 1])
    >>> round(r1(smooth), 2), abs(r1(prewhiten(smooth))) < 0.05
    (0.98, True)
    """
    x = np.asarray(x, dtype=np.float64)
    out = x.copy()
    coef, fitted = ar_fit(x, order)
    out[fitted] = ar_residuals(x[fitted] - x[fitted].mean(axis=1, keepdims=True), coef[fitted])
    return out


def ar_residuals(d: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """Residuals (P, T) of the AR filters coef (P, K) on the rows d (P, T), taken about their means:
    e[t] = d[t] - sum_k coef[k] d[t - k - 1], the terms before a row's start left out."""
    e = np.array(d, dtype=np.float64)
    for k in range(coef.shape[1]):
        e[:, k + 1 :] -= coef[:, k : k + 1] * d[:, : -k - 1]
    return e


def ar_fit(x: np.ndarray, order: int = AR_ORDER) -> tuple[np.ndarray, np.ndarray]:
    """Yule-Walker AR coefficients (P, min(order, T // 4)) of each row of x (P, T) about its mean, and which rows
    were fitted (P,): a constant row is not (its coefficients are 0)."""
    x = np.asarray(x, dtype=np.float64)
    t = x.shape[1]
    order = min(order, t // 4)
    coef = np.zeros((len(x), max(order, 0)))
    fitted = np.zeros(len(x), dtype=bool)
    if order < 1:
        return coef, fitted
    d = x - x.mean(axis=1, keepdims=True)
    nfft = 1 << math.ceil(math.log2(2 * t))
    f = np.fft.rfft(d, nfft, axis=1)
    r = np.fft.irfft(f.real**2 + f.imag**2, nfft, axis=1)[:, : order + 1] / t  # (P, order + 1)
    fitted = r[:, 0] > 1e-12 * np.maximum(1.0, np.abs(x).max(axis=1) ** 2)
    rows = np.flatnonzero(fitted)
    lag = np.abs(np.arange(order)[:, None] - np.arange(order)[None, :])  # the Yule-Walker matrices' Toeplitz index
    try:
        coef[rows] = np.linalg.solve(r[rows][:, lag], r[rows, 1 : order + 1, None])[:, :, 0]  # all rows at once
    except np.linalg.LinAlgError:  # a singular system (a row of a few repeated values): row by row, least squares
        for k in rows:
            coef[k] = np.linalg.lstsq(r[k][lag], r[k, 1 : order + 1], rcond=None)[0]
    return coef, fitted


def prewhiten_own_samples(x: np.ndarray, fresh: np.ndarray) -> np.ndarray:
    """Innovations of each row of x (C, N) on the clock's ticks, fitted over the row's own samples (``fresh`` (C, N):
    a new sample at that tick; each row's first tick among them) and held on the ticks between them, as the samples
    are. Values must be finite.

    A channel slower than the clock repeats each sample over several ticks; an AR fit over those ticks reads
    the repeats as dynamics and leaves a residual at every new sample, and two fields of one device (new samples
    on the same ticks) would then share that pattern as dependence. Rows with the same ticks share one call (each
    keeps its own fit).

    >>> rng = np.random.default_rng(1)
    >>> slow = np.repeat(lfilter([1.0], [1.0, -0.9], rng.standard_normal((2, 300)), axis=1), 4, axis=1)  # (2, 1200)
    >>> fresh = np.zeros_like(slow, dtype=bool); fresh[:, ::4] = True
    >>> e = prewhiten_own_samples(slow, fresh)
    >>> r1 = lambda v: float(np.corrcoef(v[:-1], v[1:])[0, 1])  # lag-1 autocorrelation of the own samples
    >>> bool((e[:, 1::4] == e[:, ::4]).all()), round(r1(slow[0, ::4]), 1), abs(r1(e[0, ::4])) < 0.1
    (True, 0.8, True)
    """
    out = np.asarray(x, dtype=np.float64).copy()
    fresh = np.asarray(fresh, dtype=bool)
    if fresh.shape != out.shape:
        raise InputError(f"fresh must have the shape of x {out.shape}; got {fresh.shape}")
    by_ticks: dict[bytes, list[int]] = {}
    for k in range(len(out)):
        by_ticks.setdefault(np.packbits(fresh[k]).tobytes(), []).append(k)
    for rows in by_ticks.values():
        f = fresh[rows[0]]
        if not f.any():
            continue
        own = prewhiten(out[rows][:, f])  # (R, samples)
        # hold each innovation until the row's next sample; ticks before its first sample take the first
        at = np.maximum(np.cumsum(f) - 1, 0)
        out[rows] = own[:, at]
    return out


def pair_rows(fresh_x: np.ndarray, fresh_y: np.ndarray) -> np.ndarray:
    """A pair's rows (..., T) bool: the ticks where the channel with fewer new samples (fresh, (..., T)) has one,
    beside the other's newest sample (elsewhere its held value makes near-copies of earlier rows).

    >>> fast, slow = np.ones(8, bool), np.arange(8) % 4 == 0  # 100 Hz and 25 Hz on a 100 Hz clock
    >>> pair_rows(fast, slow).nonzero()[0].tolist(), pair_rows(slow, fast).sum()
    ([0, 4], np.int64(2))
    """
    slower_x = fresh_x.sum(axis=-1, keepdims=True) <= fresh_y.sum(axis=-1, keepdims=True)
    return np.where(slower_x, fresh_x, fresh_y)


def estimate_own_rows(
    est: Any,
    window: np.ndarray,
    fresh: np.ndarray,
    valid: np.ndarray,
    i: np.ndarray,
    j: np.ndarray,
    which: np.ndarray,
    mi: np.ndarray,
    n_eff: np.ndarray,
    groups: list[tuple[np.ndarray, np.ndarray]] | None = None,
    every_new: bool = False,
) -> int:
    """MI and n_eff (written into mi, n_eff) of the pairs (i, j) marked in ``which``, each over its own rows of
    window (C, T): both channels valid, on the slower channel's new samples (fresh (C, T): a new sample at that
    tick; :func:`pair_rows`; ``every_new``: on every row either channel renews).
    Pairs with the same rows (channels of one device) share one batch of ``est`` (an Estimator); ``groups``,
    if given, receives each batch's copula rows [x; y] (2m, R) and its pair indices (m,). Returns how many
    pairs had fewer rows than the model needs (left NaN)."""
    by_rows: dict[bytes, list[int]] = {}
    rows_of: dict[bytes, np.ndarray] = {}
    short = 0
    for k in np.flatnonzero(which):
        both = valid[i[k]] & valid[j[k]]
        rows = both & (fresh[i[k]] | fresh[j[k]]) if every_new else pair_rows(both & fresh[i[k]], both & fresh[j[k]])
        if rows.sum() < est.min_window:
            short += 1
            continue
        key = np.packbits(rows).tobytes()
        by_rows.setdefault(key, []).append(int(k))
        rows_of[key] = rows
    for key, members in by_rows.items():
        rows, idx = rows_of[key], np.array(members)
        x, y = window[i[idx]][:, rows], window[j[idx]][:, rows]
        mi[idx] = est.estimate_batch(x, y)
        ux, uy = rank_rows(x, est.ties), rank_rows(y, est.ties)
        r = int(rows.sum())
        # the null table is of full windows: fewer rows are noisier, so count them as proportionally fewer samples
        n_eff[idx] = pair_n_eff(autocorrelation(ux), autocorrelation(uy), r) * (r / window.shape[1])
        if groups is not None:
            groups.append((np.concatenate([ux, uy]), idx))
    return short


def per_evaluation_rate(
    false_alarms_per_hour: float, n_pairs: int, hop_s: float, window_s: float, persist: int = 1
) -> float:
    """Per pair and evaluation false-alarm rate that gives ``false_alarms_per_hour`` chance
    ``became-dependent`` events an hour over ``n_pairs`` independent pairs.

    Consecutive windows overlap when hop_s < window_s, so their estimates move together: a pair then has
    about two independent looks per window length (3600 / (window_s / 2) an hour), and ``persist``
    consecutive evaluations above the threshold are nearly as likely as one. With hops of a window or more,
    every evaluation is a fresh look and persist consecutive ones multiply.

    >>> round(per_evaluation_rate(1.0, 276, hop_s=1.0, window_s=12.8, persist=2), 9)
    6.441e-06
    """
    if not false_alarms_per_hour > 0:
        raise ConfigError(f"changes.false_alarms_per_hour must be > 0; got {false_alarms_per_hour}")
    pairs = max(1, n_pairs)
    if hop_s < window_s:
        looks = 3600.0 / max(hop_s, window_s / 2)
        return min(0.05, false_alarms_per_hour / (pairs * looks))
    looks = 3600.0 / hop_s
    return min(0.05, (false_alarms_per_hour / (pairs * looks)) ** (1.0 / persist))


@dataclass(frozen=True)
class NullTable:
    """MI estimates on independent windows of ``window_len`` samples, by effective sample size.

    ``log_n_eff`` (B,) are bin centres; ``median``, ``q90`` (non-increasing in n_eff) and ``tail_scale`` (mean
    excess over q90) are per bin, in nats. ``null_std`` is the spread of the null at n_eff = window_len (white
    noise), the scale of the detector's default rise/fall step.
    """

    window_len: int
    log_n_eff: tuple[float, ...]
    median: tuple[float, ...]
    q90: tuple[float, ...]
    tail_scale: tuple[float, ...]
    null_std: float
    tail_check: float = float("nan")  # pooled standardised excess at 0.999 (Exp(1): log(100) = 4.61)
    n_windows: int = 0
    # white noise measured on its own (many windows): pairs with n_eff >= white_from take this null, whose
    # tail beyond its 99th percentile is extrapolated from its own top percent
    white_from: float = float("inf")
    white_q90: float = 0.0
    white_q99: float = 0.0
    white_scale: float = 0.0  # mean excess over white_q99
    white_windows: int = 0

    def _at(self, values: tuple[float, ...], n_eff: np.ndarray) -> np.ndarray:
        return np.interp(np.log(np.maximum(n_eff, MIN_N_EFF)), self.log_n_eff, values)

    def white_above(self, alpha: float) -> float:
        if alpha >= 0.01:  # between the measured q90 and q99, log-linearly
            return self.white_q90 + (self.white_q99 - self.white_q90) * math.log10(0.1 / alpha)
        return self.white_q99 + self.white_scale * math.log(0.01 / alpha)

    def dependent_above(self, n_eff: np.ndarray, alpha: float, min_effect: float = 0.0) -> np.ndarray:
        """Threshold (nats) an independent pair of these effective sizes exceeds with probability alpha."""
        n_eff = np.asarray(n_eff, dtype=np.float64)
        tail = max(0.0, math.log(0.1 / alpha))
        bins = self._at(self.q90, n_eff) + self._at(self.tail_scale, n_eff) * tail
        white = self.white_above(alpha)
        # a smaller effective size never gets a lower bar than white noise
        return np.maximum(np.where(n_eff >= self.white_from, white, np.maximum(bins, white)), min_effect)

    def median_at(self, n_eff: np.ndarray) -> np.ndarray:
        """The null's median at these effective sizes."""
        return self._at(self.median, np.asarray(n_eff, dtype=np.float64))

    def independent_below(self, n_eff: np.ndarray) -> np.ndarray:
        """The null's 90th percentile at these effective sizes: an independent pair is below it 90% of the time."""
        n_eff = np.asarray(n_eff, dtype=np.float64)
        return np.where(n_eff >= self.white_from, self.white_q90, np.maximum(self._at(self.q90, n_eff), self.white_q90))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> NullTable:
        d = json.loads(text)
        d = {k: (float("inf") if v is None else v) for k, v in d.items()}  # JSON has no infinity
        for key in ("log_n_eff", "median", "q90", "tail_scale"):
            d[key] = tuple(float(v) for v in d[key])
        table = cls(**d)
        if not len(table.log_n_eff) == len(table.q90) == len(table.tail_scale) == len(table.median) > 0:
            raise ValueError("null table arrays differ in length")
        return table

    @classmethod
    def measure(
        cls,
        estimate_batch: Callable[[np.ndarray, np.ndarray], np.ndarray],
        window_len: int,
        n_pairs: int = 6000,
        seed: int = 0,
        batch: int = 500,
        ties: Ties = "jitter",
    ) -> NullTable:
        """Estimate MI of n_pairs independent pairs drawn from :func:`null_processes` and tabulate by n_eff."""
        rng = np.random.default_rng(seed)
        mi, n_eff = [], []
        for start in range(0, n_pairs, batch):
            m = min(batch, n_pairs - start)
            x, held = null_processes(rng, m, window_len)
            # both channels held on the same ticks: the engine leaves those rows out (buffers.Resampler), so the
            # calibration never pairs two held rows
            y, _ = null_processes(rng, m, window_len, no_hold=held)
            mi.append(estimate_batch(x, y))
            ax, ay = autocorrelation(rank_rows(x, ties)), autocorrelation(rank_rows(y, ties))
            n_eff.append(pair_n_eff(ax, ay, window_len))
        n_white = 20_000 if window_len <= 512 else 10_000
        white = np.concatenate([
            estimate_batch(rng.standard_normal((batch, window_len)), rng.standard_normal((batch, window_len)))
            for _ in range(0, n_white, batch)
        ])  # fmt: skip
        table = cls.from_samples(window_len, np.concatenate(n_eff), np.concatenate(mi), float(np.std(white)))
        q90, q99 = float(np.quantile(white, 0.9)), float(np.quantile(white, 0.99))
        scale = float((white[white > q99] - q99).mean())
        return dataclasses.replace(table, white_from=WHITE_FROM * window_len, white_q90=q90, white_q99=q99,
                                   white_scale=scale, white_windows=len(white))  # fmt: skip

    @classmethod
    def from_samples(cls, window_len: int, n_eff: np.ndarray, mi: np.ndarray, null_std: float) -> NullTable:
        """Bin (n_eff, mi) samples in log n_eff (at least 150 samples a bin) and take the bins' statistics."""
        order = np.argsort(n_eff)
        n_eff, mi = n_eff[order], mi[order]
        per_bin = max(150, len(mi) // 24)
        edges = [*list(range(0, len(mi) - per_bin // 2, per_bin)), len(mi)]
        edges = sorted(set([*edges[:-2], len(mi)])) if len(edges) > 2 and len(mi) - edges[-2] < per_bin else edges
        logs, med, q90, scale, excess = [], [], [], [], []
        for lo, hi in pairwise(edges):
            m = mi[lo:hi]
            q = float(np.quantile(m, 0.9))
            logs.append(float(np.log(n_eff[lo:hi]).mean()))
            med.append(float(np.median(m)))
            q90.append(q)
            excess.append(m[m > q] - q)
            scale.append(max(float(excess[-1].mean()) if excess[-1].size else 0.0, 1e-4))
        # a bin's mean excess rests on a tenth of its samples: smooth over neighbouring bins (median of three)
        sc = np.array(scale)
        if len(sc) >= 3:
            sc[1:-1] = np.median(np.stack([sc[:-2], sc[1:-1], sc[2:]]), axis=0)
        # a longer effective window never has a wider null: enforce non-increasing, erring high
        q90_arr = np.maximum.accumulate(np.array(q90)[::-1])[::-1]
        scale_arr = np.maximum.accumulate(sc[::-1])[::-1]
        pooled = np.concatenate([e / s for e, s in zip(excess, scale_arr, strict=True)])
        # 0.99 of the excess (the tail beyond q90) is the null's 0.999 quantile
        check = float(np.quantile(pooled, 0.99))
        scale_arr *= max(1.0, check / math.log(100.0))  # a tail heavier than exponential: widen, never narrow
        return cls(window_len, tuple(logs), tuple(med), tuple(q90_arr.tolist()), tuple(scale_arr.tolist()),
                   null_std, check, len(mi))  # fmt: skip


def null_processes(
    rng: np.random.Generator, n: int, window_len: int, no_hold: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(n, window_len) windows of independent stationary-looking sensor signals, one family per row, and which
    rows are held (n,) (never those marked in ``no_hold``).

    Families: white noise; AR(1) with time constants from 1 to 1000 samples; oscillating AR(2); moving
    averages (band-limited); random walks; each optionally with white measurement noise, quantised to a few
    levels, or held (a channel 2-5x slower than the clock).
    """
    burn = 512
    out = np.empty((n, window_len))
    held = np.zeros(n, dtype=bool)
    kinds = rng.integers(0, 5, n)
    for r in range(n):
        e = rng.standard_normal(window_len + burn)
        kind = kinds[r]
        if kind == 0:
            x = e
        elif kind == 1:
            tau = 10 ** rng.uniform(0, 3)
            x = lfilter([1.0], [1.0, -math.exp(-1 / tau)], e)
        elif kind == 2:
            radius, omega = 1 - 10 ** rng.uniform(-3, -1), rng.uniform(0.01, 0.6)
            x = lfilter([1.0], [1.0, -2 * radius * math.cos(omega), radius**2], e)
        elif kind == 3:
            width = int(rng.integers(2, 200))
            x = np.convolve(e, np.ones(width) / width, mode="same")
        else:
            x = np.cumsum(e)
        x = x[burn:]
        x = (x - x.mean()) / (x.std() + 1e-12)
        mod = rng.integers(0, 3 if no_hold is not None and no_hold[r] else 4)
        if mod == 1:
            x = x + rng.uniform(0.05, 1.0) * rng.standard_normal(window_len)
        elif mod == 2:
            x = np.round(x * rng.uniform(1, 6))
        elif mod == 3:
            hold = int(rng.integers(2, 6))
            x = np.repeat(x[::hold], hold)[:window_len]
            held[r] = True
        out[r] = x
    return out, held
