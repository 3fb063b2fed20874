"""Dependence screening: a cheap all-pairs statistic from the shared ranks (synchronous, pure numpy).

Each channel's copula values u (one window, shape (T,)) are sketched by K cosine
features f_k(u) = sqrt(2) cos(k pi u), k = 1..K, standardised over the window. For
mid-ranks (r + 0.5) / T these are the DCT-II basis: exactly centred and
orthonormal, so for a pair of channels the cross-moments c_kl = mean_t f_k(u_t) f_l(v_t)
are approximately independent N(0, 1/T) under independence whatever the
marginals, and the statistic

    S = T * sum_{k,l <= K} c_kl^2            (approximately chi-square with K^2 d.o.f. under the null)

detects any dependence with a component on the first K x K cosine modes:
linear and monotone (k = l = 1), even maps such as x^2 and |x| (k = 2 against
l = 1), and sine-like maps (odd k, l up to K). All pairs come from one matrix
product of the (C K, T) feature matrix with itself. The same cross-moments give a
small-dependence MI figure, 1/2 of the projected chi-square divergence
(``screen_mi``), which is what a snapshot shows for pairs that fail the screen.

The pass threshold is calibrated per window length (``ScreenCalibration.measure``):
pairs with MI exactly ``min_effect`` from several families (linear, square, abs,
sine) are simulated with their true MI known (numerical integration), and the
threshold is their 0.5% quantile, so that a pair with MI >= min_effect passes
with probability >= 99% (reported per family); the false-pass rate on
independent windows is measured in the same run. Because the statistic only sees
ranks, the null does not depend on the channels' marginal distributions.

>>> rng = np.random.default_rng(0)
>>> x = rng.standard_normal((3, 512))
>>> x[1] = x[0] ** 2 + 0.5 * rng.standard_normal(512)  # non-monotone dependence on channel 0
>>> s = screen_statistic(rank_transform(x), n_basis=4)
>>> bool(s[0, 1] > 100), bool(s[0, 2] < 40)
(True, True)
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from ..errors import ConfigError, InputError
from ..estimate.copula import marginal_histograms, pair_histograms, rank_transform
from .scheduler import Scheduler
from .settings import EngineConfig

log = logging.getLogger("streamcorr.engine.screen")

__all__ = [
    "FAMILIES",
    "ScreenCalibration",
    "ScreenPlan",
    "Screener",
    "family_noise",
    "pair_statistic",
    "screen_mi",
    "screen_statistic",
    "simulate_family",
    "sketch",
]

Basis = Literal["cosine", "bins"]
FAMILIES = ("linear", "square", "abs", "sine")  # y = f(x) + sigma e, x and e standard normal
_BLOCK_FEATURES = 2048  # rows of the feature matrix per matrix-product block: bounds the (block, C K) temporary


def sketch(u: np.ndarray, n_basis: int = 4, basis: Basis = "cosine") -> np.ndarray:
    """Standardised per-channel features (C, K, T) of copula values u (C, T) in (0, 1), as float32.

    ``cosine``: sqrt(2) cos(k pi u), k = 1..K. ``bins``: indicators of K equal bins of u (a coarse grid).
    Each feature is centred and scaled to unit variance over the window; a constant feature is all zero.
    """
    u = np.asarray(u, dtype=np.float64)
    if u.ndim != 2:
        raise InputError(f"u must be (C, T) copula values; got shape {u.shape}")
    if n_basis < 1:
        raise InputError(f"n_basis must be >= 1; got {n_basis}")
    if basis == "cosine":
        k = np.arange(1, n_basis + 1, dtype=np.float64)[None, :, None]
        f = np.cos(np.pi * k * u[:, None, :])  # (C, K, T)
    elif basis == "bins":
        idx = np.minimum((u * n_basis).astype(np.int64), n_basis - 1)
        f = (idx[:, None, :] == np.arange(n_basis)[None, :, None]).astype(np.float64)
    else:
        raise InputError(f"basis must be 'cosine' or 'bins'; got {basis!r}")
    f -= f.mean(axis=2, keepdims=True)
    sd = f.std(axis=2, keepdims=True)
    f /= np.where(sd > 1e-12, sd, np.inf)  # ties can make a feature constant: it then carries nothing
    return f.astype(np.float32)


def screen_statistic(u: np.ndarray, n_basis: int = 4, basis: Basis = "cosine") -> np.ndarray:
    """All-pairs statistic S (C, C) = T * sum_kl c_kl^2 from copula values u (C, T); diagonal included.

    One (C K, T) x (T, C K) product, in row blocks so the temporary stays small.
    """
    f = sketch(u, n_basis, basis)
    c, k, t = f.shape
    flat = f.reshape(c * k, t)
    out = np.empty((c, c), dtype=np.float64)
    rows = max(k, _BLOCK_FEATURES // k * k)  # whole channels per block
    for r0 in range(0, c * k, rows):
        g = flat[r0 : r0 + rows] @ flat.T / np.float32(t)  # (block C K, C K) cross-moments c_kl
        g = g.reshape(-1, k, c, k)
        out[r0 // k : r0 // k + g.shape[0]] = np.einsum("akbl,akbl->ab", g, g, dtype=np.float64) * t
    return out


def screen_mi(stat: np.ndarray, window_len: int, n_basis: int = 4) -> np.ndarray:
    """MI figure (nats) from the statistic: 1/2 of the projected chi-square divergence, null mean removed, >= 0.

    For weak dependence MI ~ chi^2-divergence / 2 and the K x K cosine modes capture part of it, so this is a
    rough small-dependence approximation, not an estimate of strong dependence.
    """
    return np.maximum(0.0, (np.asarray(stat) - n_basis**2) / (2.0 * window_len))


# -- calibration ----------------------------------------------------------------------------------------------
def _apply(family: str, x: np.ndarray) -> np.ndarray:
    if family == "linear":
        return x
    if family == "square":
        return x**2
    if family == "abs":
        return np.abs(x)
    if family == "sine":
        return np.sin(2 * x)
    raise InputError(f"unknown family {family!r}; known: {FAMILIES}")


def _family_mi(family: str, sigma: float) -> float:
    """I(X; f(X) + sigma E) in nats for standard normal X, E: h(Y) - h(sigma E), h(Y) by quadrature."""
    if family == "linear":
        return 0.5 * math.log1p(1.0 / sigma**2)
    x = np.linspace(-8, 8, 801)
    wx = np.exp(-0.5 * x**2)
    wx /= wx.sum()
    fx = _apply(family, x)
    y = np.linspace(fx.min() - 8 * sigma, fx.max() + 8 * sigma, 1201)
    dy = y[1] - y[0]
    p = np.zeros_like(y)
    for lo in range(0, len(x), 200):  # p(y) = E_x phi_sigma(y - f(x)), in blocks to bound memory
        z = (y[None, :] - fx[lo : lo + 200, None]) / sigma
        p += wx[lo : lo + 200] @ np.exp(-0.5 * z**2)
    p /= sigma * math.sqrt(2 * math.pi)
    h_y = -float(np.sum(p * np.log(np.where(p > 0, p, 1.0))) * dy)
    return h_y - 0.5 * math.log(2 * math.pi * math.e * sigma**2)


@functools.lru_cache(maxsize=64)
def family_noise(family: str, mi: float) -> float:
    """The noise scale sigma at which I(X; f(X) + sigma E) = mi nats (bisection on log sigma)."""
    if mi <= 0:
        raise InputError(f"mi must be > 0 nats; got {mi}")
    lo, hi = math.log(1e-3), math.log(1e3)  # MI falls as sigma grows
    for _ in range(30):  # sigma to ~1e-7 relative
        mid = 0.5 * (lo + hi)
        if _family_mi(family, math.exp(mid)) > mi:
            lo = mid
        else:
            hi = mid
    return math.exp(0.5 * (lo + hi))


def simulate_family(family: str, mi: float, n_pairs: int, window_len: int, rng: np.random.Generator) -> np.ndarray:
    """(2, n_pairs, T) windows (x, y) of one family at the given true MI."""
    x = rng.standard_normal((n_pairs, window_len))
    y = _apply(family, x) + family_noise(family, mi) * rng.standard_normal((n_pairs, window_len))
    return np.stack([x, y])


def pair_statistic(x: np.ndarray, y: np.ndarray, n_basis: int = 4, basis: Basis = "cosine") -> np.ndarray:
    """S for each row pair of x, y (P, T) (the diagonal block of the all-pairs product, without the rest)."""
    fx = sketch(rank_transform(x), n_basis, basis).astype(np.float64)
    fy = sketch(rank_transform(y), n_basis, basis).astype(np.float64)
    t = x.shape[1]
    cross = np.einsum("pkt,plt->pkl", fx, fy) / t  # (P, K, K)
    return np.asarray((cross**2).sum(axis=(1, 2)) * t)


@dataclass(frozen=True)
class ScreenCalibration:
    """Pass threshold of the screen statistic at one window length, with the pass rates it was measured at."""

    window_len: int
    min_effect: float  # nats
    n_basis: int
    basis: str
    threshold: float  # a pair passes when S > threshold
    dependent_pass: dict[str, float] = field(default_factory=dict)  # per family, fresh pairs at MI = min_effect
    null_pass: float = float("nan")  # fraction of independent pairs passing
    n_pairs: int = 0  # per family and for the null

    @classmethod
    def measure(
        cls,
        window_len: int,
        min_effect: float = 0.1,
        n_basis: int = 4,
        basis: Basis = "cosine",
        n_pairs: int = 2000,
        quantile: float = 0.005,
        seed: int = 0,
    ) -> ScreenCalibration:
        """Threshold = the `quantile` of S over pairs at MI = min_effect of every family (fitted on one sample);
        pass rates are then measured on a second, fresh sample and on independent pairs."""
        if window_len < 8:
            raise ConfigError(f"window_len must be >= 8 for screening; got {window_len}")
        if min_effect <= 0:
            raise ConfigError(f"screening needs min_effect > 0 nats; got {min_effect}")
        rng = np.random.default_rng(seed)

        def stat(xy: np.ndarray) -> np.ndarray:
            return pair_statistic(xy[0], xy[1], n_basis, basis)

        fit = [stat(simulate_family(f, min_effect, n_pairs, window_len, rng)) for f in FAMILIES]
        threshold = float(min(np.quantile(s, quantile) for s in fit))
        passes = {f: float(np.mean(stat(simulate_family(f, min_effect, n_pairs, window_len, rng)) > threshold))
                  for f in FAMILIES}  # fmt: skip
        null = stat(rng.standard_normal((2, n_pairs, window_len)))
        return cls(window_len, min_effect, n_basis, basis, threshold, passes, float(np.mean(null > threshold)), n_pairs)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def cached(cls, window_len: int, min_effect: float, cache_dir: Path | None = None) -> ScreenCalibration:
        """``measure`` with the defaults, once per setting: kept in the process and as JSON in cache_dir."""
        key = (window_len, float(min_effect))
        if key in _CALIBRATIONS:
            return _CALIBRATIONS[key]
        path = None if cache_dir is None else cache_dir / f"screen-v1-{window_len}-{min_effect:g}.json"
        cal: ScreenCalibration | None = None
        if path is not None:
            with contextlib.suppress(OSError, ValueError, TypeError):
                cal = cls(**json.loads(path.read_text()))
        if cal is None:
            cal = cls.measure(window_len, min_effect)
            if path is not None:
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    tmp = path.with_suffix(f".{os.getpid()}.tmp")
                    tmp.write_text(json.dumps(cal.as_dict()))
                    tmp.replace(path)
                except OSError as exc:  # a read-only cache only costs the next start the measurement again
                    log.info("could not cache the screen calibration in %s: %s", path.parent, exc)
        _CALIBRATIONS[key] = cal
        return cal


_CALIBRATIONS: dict[tuple[int, float], ScreenCalibration] = {}


class _ModelLike(Protocol):
    grid: int

    def estimate_histograms(self, hist: np.ndarray, mx: np.ndarray, my: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class ScreenPlan:
    """One hop's use of the network under screening (indices into the engine's pairs)."""

    pick: np.ndarray  # (n,) pairs for the network, in priority order
    screened: np.ndarray  # (m,) pairs that failed the screen and are not picked: they show the screen's figure
    screened_mi: np.ndarray  # (m,) that figure, nats (``screen_mi``)
    passed: int  # pairs that passed the screen this hop
    budget: int  # network pairs allowed this hop
    overdue: int = 0  # pairs due for their max_age estimate that did not fit the budget
    deferred: int = 0  # pairs that passed the screen but did not fit the budget (they wait)
    flagged: np.ndarray | None = None  # (n_pairs,) bool: passed the screen this hop


class Screener:
    """Decides each hop whether to screen, and turns the screen into the scheduler's plan.

    mode "auto" screens when the selected pairs exceed the hop's network budget, ``hop_budget`` x hop x the
    model's pairs/s (measured by a short probe at the first large hop, then from every hop's model time);
    "on" always screens; "off" never (every selected pair each hop, or the stalest ``max_pairs_per_hop``).
    """

    @classmethod
    def for_engine(cls, cfg: EngineConfig, cache_dir: Path | None = None) -> Screener:
        """The screener of an engine with these settings."""
        return cls(mode=cfg.screening, window_len=cfg.window_len, hop_s=cfg.hop_samples / cfg.rate_hz,
                   min_effect=cfg.min_effect, max_age_s=cfg.max_age_s, hop_budget=cfg.hop_budget,
                   max_pairs_per_hop=cfg.max_pairs_per_hop, cache_dir=cache_dir)  # fmt: skip

    PROBE_PAIRS = 128
    SMALL = 256  # auto: at most this many pairs never need screening, and never pay for the probe

    def __init__(
        self,
        *,
        mode: str,
        window_len: int,
        hop_s: float,
        min_effect: float,
        max_age_s: float,
        hop_budget: float,
        max_pairs_per_hop: int | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        if mode not in ("auto", "on", "off"):
            raise ConfigError(f"screening must be 'auto', 'on' or 'off'; got {mode!r}")
        if not max_age_s > 0:
            raise ConfigError(f"max_age_s must be > 0 seconds; got {max_age_s}")
        if not 0 < hop_budget <= 1:
            raise ConfigError(f"hop_budget must be in (0, 1] (a share of the hop); got {hop_budget}")
        if mode != "off" and min_effect <= 0:
            raise ConfigError(f"screening needs min_effect > 0 nats; got {min_effect} (or set screening off)")
        self.mode, self.window_len, self.hop_s = mode, window_len, hop_s
        self.min_effect, self.max_age_s, self.hop_budget = min_effect, max_age_s, hop_budget
        self.max_pairs_per_hop = max_pairs_per_hop
        self.cache_dir = cache_dir
        self.pairs_per_s: float | None = None  # the model's measured throughput
        self._calibration: ScreenCalibration | None = None
        self._preparing: threading.Thread | None = None
        if mode == "on":  # a first run at this window length simulates for seconds: start while the window fills
            self._start_preparing()

    def _start_preparing(self) -> None:
        if self._preparing is None and self._calibration is None:
            self._preparing = threading.Thread(target=self._prepare, name="streamcorr-screen-calibration", daemon=True)
            self._preparing.start()

    def _prepare(self) -> None:
        try:
            self._calibration = ScreenCalibration.cached(self.window_len, self.min_effect, self.cache_dir)
        except Exception:  # the first screened hop measures again, and raises where it can be seen
            log.exception("screen calibration failed in the background")

    @property
    def calibration(self) -> ScreenCalibration:
        if self._preparing is not None:
            self._preparing.join()
            self._preparing = None
        if self._calibration is None:
            self._calibration = ScreenCalibration.cached(self.window_len, self.min_effect, self.cache_dir)
        return self._calibration

    def observe_model(self, n_pairs: int, seconds: float) -> None:
        """Record one model call's time; small calls are dominated by overhead and are ignored."""
        if n_pairs >= 32 and seconds > 0:
            rate = n_pairs / seconds
            self.pairs_per_s = rate if self.pairs_per_s is None else 0.8 * self.pairs_per_s + 0.2 * rate

    def probe(self, est: _ModelLike) -> None:
        """Time the model on PROBE_PAIRS random windows at the window length (after one warm-up call)."""
        rng = np.random.default_rng(0)
        u = rank_transform(rng.standard_normal((16, self.window_len)))
        idx = rng.integers(0, 16, size=(2, self.PROBE_PAIRS))
        hist = pair_histograms(u, u, est.grid, idx[0], idx[1])
        marg = marginal_histograms(u, est.grid)
        est.estimate_histograms(hist, marg[idx[0]], marg[idx[1]])  # warm-up: the first call pays one-time costs
        t0 = time.perf_counter()
        est.estimate_histograms(hist, marg[idx[0]], marg[idx[1]])
        self.observe_model(self.PROBE_PAIRS, time.perf_counter() - t0)

    def budget(self) -> int | None:
        """Network pairs per hop: hop_budget of the hop at the measured rate, capped by max_pairs_per_hop."""
        caps = [self.max_pairs_per_hop] if self.max_pairs_per_hop else []
        if self.pairs_per_s is not None:
            caps.append(max(1, int(self.pairs_per_s * self.hop_s * self.hop_budget)))
        return min(caps) if caps else None

    def active(self, n_pairs: int, est: _ModelLike) -> bool:
        if self.mode == "off" or n_pairs < 2:
            return False
        if self.mode == "auto" and n_pairs <= self.SMALL and self.max_pairs_per_hop is None:
            return False
        self._start_preparing()
        if self.pairs_per_s is None:  # a warmed-up measurement, not the first (cold) hop's model time
            self.probe(est)
        if self.mode == "on":
            return True
        budget = self.budget()
        return budget is not None and n_pairs > budget

    def plan(
        self, ranks: Sequence[np.ndarray | None], pairs: np.ndarray, scheduler: Scheduler, now_ns: int, hop_ns: int
    ) -> ScreenPlan:
        """Screen every pair whose two channels have full-window ranks; the scheduler picks the network's pairs.
        In "auto" mode, until the calibration is ready (a first run at this window length simulates for a few
        seconds, in the background) the network refreshes the stalest pairs within the budget instead."""
        budget = self.budget() or len(pairs)
        if self.mode == "auto" and self._preparing is not None and self._preparing.is_alive():
            empty = np.zeros(0, dtype=np.int64)
            return ScreenPlan(scheduler.next_pairs()[:budget], empty, np.zeros(0), 0, budget)
        cal = self.calibration
        n_ch = len(ranks)
        full = np.array([r is not None for r in ranks], dtype=bool)
        u = np.full((n_ch, self.window_len), 0.5)
        for k, r in enumerate(ranks):
            if r is not None:
                u[k] = r
        stat_all = screen_statistic(u, cal.n_basis, cal.basis)  # type: ignore[arg-type]
        i, j = pairs[:, 0], pairs[:, 1]
        stat = stat_all[i, j]
        screenable = full[i] & full[j]  # gapped pairs are not screened: they keep their cell, and rotate
        passed = screenable & (stat > cal.threshold)
        max_age_ns = round(self.max_age_s * 1e9)
        pick = scheduler.plan(passed, stat, now_ns, hop_ns, max_age_ns, budget, cap=self.max_pairs_per_hop)
        picked = np.zeros(len(pairs), dtype=bool)
        picked[pick] = True
        screened = np.flatnonzero(screenable & ~picked & ~passed)
        mi = screen_mi(stat[screened], self.window_len, cal.n_basis)
        return ScreenPlan(
            pick, screened, mi, int(passed.sum()), budget, scheduler.last_overdue, scheduler.last_deferred, passed
        )
