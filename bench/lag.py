"""Lead and lag: how well ``lag_scan`` finds the delay between two channels, how often it invents one, and its cost.

    python -m bench.lag [--pairs 40] [--ksg-pairs 48] [--null-pairs 250] [--seconds 100] [--repeats 3] [--quick]

Windows of N = 1024 samples at 100 Hz, lags searched over |tau| <= K = 100 samples (1 s); positive lag: y, the
second channel, follows x, the first. Four sections, each one table (results: bench/results/lag.json and .md):

1. **Lag error.** y(t) = f(x(t - d)) + noise for f in linear, square, abs, sine (f(x) standardised; three noise
   levels, so the network's MI spans about 0.2-1.6 nats) with d uniform in +-60 samples. White drivers take
   integer d; smooth drivers are AR(1) with phi 0.9-0.99 per sample and non-integer d, evaluated exactly at t
   and t - d: the AR(1) is the sampled Ornstein-Uhlenbeck process, simulated on the union of both time grids (an
   interpolated copy would be low-passed, and its lag blurred). Methods on the same (2, N + K) rows: ``lag_scan``
   (the reported lag, NaN when not significant, counted as a miss), Pearson cross-correlation (argmax of |r| over
   lags, one FFT) and, on a subset, KSG-3 (scikit-learn) at every integer lag. Per method: share within 1
   sample of the truth, median |error| (samples and ms), mean time per pair (median of repeats; lag_scan and
   cross-correlation get one cell's pairs per call, KSG one pair at a time).
2. **Independent pairs** (white, smooth AR(1), quantised smooth, sine + noise; both channels independent):
   share with a significant lag, and with a significant lag and MI >= 0.1 nats (target <= 1%); ``lag_scan``
   with every pair sent to the network (its default) and with the scan's gate first (the engine's path for pairs
   the change detector does not hold dependent).
3. **A drifting lag**: y(t) = x(t - d(t)) + noise, d moving linearly from 10 to 40 samples over 60 s (held
   before and after), smooth driver; ``lag_scan`` on windows ending every 1 s. Error against the delay at the
   centre of y's window and at its end, and the tracking lag: how long before the window's end the true delay
   equalled the reported one.
4. **Engine cost**: the same 12-channel recording (four lagged pairs, four independent channels) replayed
   through ``Engine`` with the lag search on (``max_lag_s`` 1, ``lag_refresh_s`` 1) and off, 1 s of samples
   per channel per push, every due window evaluated; total seconds (median of repeats, on and off alternating),
   the ratio (target <= 3x), the tracker's counts and stage time, and the lags it ends with.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import numpy as np
from scipy.signal import lfilter

from bench.baselines import KSG
from bench.common import environment, write_results
from streamcorr.engine.core import Engine, EngineConfig
from streamcorr.engine.lagscan import lag_scan, lag_windows
from streamcorr.estimate.estimator import Estimator, default_estimator

RATE_HZ = 100.0
MS_PER_SAMPLE = 1e3 / RATE_HZ
N = 1024  # window (samples)
K = 100  # lags searched either side (samples): 1 s
LENGTH = N + K  # each channel's row
MAX_DELAY = 60  # |true delay| (samples)
RELATIONS = ("linear", "square", "abs", "sine")
NOISE = (0.2, 0.5, 1.3)  # noise std over the standardised f(x): MI about 1.6 / 0.8 / 0.2 nats (linear)
DRIVERS = ("white", "smooth")
NULL_KINDS = ("white", "smooth", "quantised smooth", "sine + noise")
SEED = 47_000_001  # none of the tests' seeds
T0 = 1_764_000_000.003


# -- signals ----------------------------------------------------------------------------------------------------


def ou(times: np.ndarray, phi: float, rng: np.random.Generator) -> np.ndarray:
    """Stationary unit-variance AR(1) with coefficient phi per sample, exactly at sorted times (samples, any
    spacing): the Ornstein-Uhlenbeck process with time constant -1 / log(phi) samples."""
    decay = phi ** np.diff(times)  # (T - 1,) exp(-dt / tau)
    e = rng.standard_normal(len(times)) * np.concatenate([[1.0], np.sqrt(1.0 - decay**2)])
    x = np.empty(len(times))
    x[0] = e[0]
    for i in range(1, len(times)):
        x[i] = decay[i - 1] * x[i - 1] + e[i]
    return x


def ou_at(a: np.ndarray, b: np.ndarray, phi: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One OU path read at times a and at times b (samples), jointly."""
    times = np.concatenate([a, b])
    order = np.argsort(times, kind="stable")
    path = np.empty(len(times))
    path[order] = ou(times[order], phi, rng)
    return path[: len(a)], path[len(a) :]


def ar1(rng: np.random.Generator, n: int, phi: float) -> np.ndarray:
    """Stationary unit-variance AR(1) on the integer grid (a stationary start, no burn-in needed)."""
    e = np.sqrt(1.0 - phi * phi) * rng.standard_normal(n)
    return lfilter([1.0], [1.0, -phi], e, zi=[phi * rng.standard_normal()])[0]


def relation(name: str, x: np.ndarray) -> np.ndarray:
    y = {"linear": x, "square": x * x, "abs": np.abs(x), "sine": np.sin(2.0 * x)}[name]
    return (y - y.mean()) / y.std()


def driven_pair(rng: np.random.Generator, rel: str, noise: float, driver: str) -> tuple[np.ndarray, float]:
    """Rows (2, N + K): x and y(t) = f(x(t - d)) + noise; returns them and d (samples)."""
    t = np.arange(LENGTH, dtype=np.float64)
    if driver == "smooth":
        d = float(rng.uniform(-MAX_DELAY, MAX_DELAY))
        x, xd = ou_at(t, t - d, float(rng.uniform(0.9, 0.99)), rng)
    else:
        d = float(rng.integers(-MAX_DELAY, MAX_DELAY + 1))
        w = rng.standard_normal(LENGTH + 2 * MAX_DELAY)
        x, xd = w[MAX_DELAY : MAX_DELAY + LENGTH], w[MAX_DELAY - int(d) : MAX_DELAY - int(d) + LENGTH]
    y = relation(rel, xd) + noise * rng.standard_normal(LENGTH)
    return np.stack([x, y]), d


def independent_channel(rng: np.random.Generator, kind: str) -> np.ndarray:
    if kind == "white":
        return rng.standard_normal(LENGTH)
    if kind == "smooth":
        return ar1(rng, LENGTH, float(rng.uniform(0.9, 0.99)))
    if kind == "quantised smooth":  # 7-25 levels
        step = float(rng.uniform(0.3, 1.0))
        return np.round(ar1(rng, LENGTH, float(rng.uniform(0.9, 0.99))) / step) * step
    f_hz = float(rng.uniform(0.1, 3.0))  # sine + noise
    t = np.arange(LENGTH) / RATE_HZ
    return np.sin(2 * np.pi * f_hz * t + rng.uniform(0, 2 * np.pi)) + rng.uniform(0.3, 1.0) * rng.standard_normal(
        LENGTH
    )


# -- the methods ------------------------------------------------------------------------------------------------


def xcorr_lags(values: np.ndarray, iu: np.ndarray, iv: np.ndarray, max_lag: int) -> np.ndarray:
    """Pearson cross-correlation's lag (P,): argmax over |tau| <= max_lag of |r| between x(t) and y(t + tau)."""
    z = (values - values.mean(axis=1, keepdims=True)) / values.std(axis=1, keepdims=True)
    length = z.shape[1]
    nfft = 1 << int(np.ceil(np.log2(length + max_lag)))
    spec = np.fft.rfft(z, nfft, axis=1)
    lags = np.arange(-max_lag, max_lag + 1)
    r = np.fft.irfft(np.conj(spec[iu]) * spec[iv], nfft, axis=1)[:, lags % nfft] / (length - np.abs(lags))
    return lags[np.argmax(np.abs(r), axis=1)].astype(np.float64)


def ksg_lag(values: np.ndarray, ksg: KSG) -> float:
    """KSG's MI at every integer lag of one pair (rows 0, 1); the argmax."""
    lags = np.arange(-K, K + 1)
    x, y = lag_windows(values, np.zeros(len(lags), np.int64), np.ones(len(lags), np.int64), lags, N)
    return float(lags[int(np.argmax(ksg.estimate(x, y)))])


def _median_time(fn: Any, repeats: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


# -- 1. lag error -----------------------------------------------------------------------------------------------


def lag_error(est: Estimator, pairs: int, ksg_pairs: int, repeats: int) -> dict[str, Any]:
    rng = np.random.default_rng(SEED)
    cells = [(drv, rel, noise) for drv in DRIVERS for rel in RELATIONS for noise in NOISE]
    ksg_cells = set(np.linspace(0, len(cells) - 1, min(ksg_pairs, len(cells))).round().astype(int).tolist())
    ksg_extra = max(0, ksg_pairs - len(cells))  # more KSG pairs than cells: spread over the cells in turn
    ksg = KSG(3)
    rows: list[dict[str, Any]] = []
    t_scan = t_xcorr = t_ksg = 0.0
    network = 0
    for c, (drv, rel, noise) in enumerate(cells):
        made = [driven_pair(rng, rel, noise, drv) for _ in range(pairs)]
        values = np.concatenate([v for v, _ in made])  # (2P, N + K)
        truth = np.array([d for _, d in made])
        iu, iv = np.arange(0, 2 * pairs, 2), np.arange(1, 2 * pairs, 2)
        dt, r = _median_time(lambda: lag_scan(est, values, iu, iv, max_lag=K), repeats)  # noqa: B023
        t_scan += dt  # per call; divided by the pairs below
        network += r.network_pairs
        dx, xc = _median_time(lambda: xcorr_lags(values, iu, iv, K), repeats)  # noqa: B023
        t_xcorr += dx
        n_ksg = (1 if c in ksg_cells else 0) + (ksg_extra // len(cells) + (c < ksg_extra % len(cells)))
        ks = np.full(pairs, np.nan)
        for q in range(min(n_ksg, pairs)):
            t0 = time.perf_counter()
            ks[q] = ksg_lag(values[2 * q : 2 * q + 2], ksg)
            t_ksg += time.perf_counter() - t0
        for q in range(pairs):
            rows.append({"driver": drv, "relation": rel, "noise": noise, "delay": float(truth[q]),
                         "scan_lag": float(r.lag[q]), "scan_best": float(r.best[q]), "mi": float(r.mi[q]),
                         "significant": bool(r.significant[q]), "xcorr_lag": float(xc[q]),
                         "ksg_lag": float(ks[q])})  # fmt: skip
    n_pairs = len(rows)
    n_ksg_done = int(np.isfinite([w["ksg_lag"] for w in rows]).sum())
    # per-call medians summed over the cells, divided by the pairs: mean time per pair
    times = {"lag_scan": t_scan / n_pairs, "xcorr": t_xcorr / n_pairs, "ksg": t_ksg / max(1, n_ksg_done)}
    one = [driven_pair(rng, "linear", 0.5, "white")[0] for _ in range(20)]
    single = statistics.median(
        _median_time(lambda: lag_scan(est, v, [0], [1], max_lag=K), repeats)[0]  # noqa: B023
        for v in one
    )
    return {"pairs": n_pairs, "pairs_per_cell": pairs, "ksg_pairs": n_ksg_done, "rows": rows,
            "time_per_pair_s": times, "lag_scan_one_pair_per_call_s": single,
            "network_pairs": network, "network_passes_per_pair": network / n_pairs,
            "summary": summarise(rows), "by_cell": by_cell(rows, cells)}  # fmt: skip


def _score(truth: np.ndarray, found: np.ndarray) -> dict[str, Any]:
    """Share within 1 sample (a NaN is a miss), share found, median and p90 |error| over the found."""
    err = np.abs(found - truth)
    ok = np.isfinite(err)
    return {"n": len(truth), "found": float(ok.mean()) if len(truth) else None,
            "within_1": float((err[ok] <= 1.0).sum() / len(truth)) if len(truth) else None,
            "median_abs_err": float(np.median(err[ok])) if ok.any() else None,
            "p90_abs_err": float(np.quantile(err[ok], 0.9)) if ok.any() else None}  # fmt: skip


def _methods(rows: list[dict[str, Any]]) -> dict[str, Any]:
    d = np.array([w["delay"] for w in rows])
    return {"lag_scan": _score(d, np.array([w["scan_lag"] for w in rows])),
            "lag_scan_best": _score(d, np.array([w["scan_best"] for w in rows])),
            "xcorr": _score(d, np.array([w["xcorr_lag"] for w in rows]))}  # fmt: skip


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    sub = [w for w in rows if np.isfinite(w["ksg_lag"])]
    d = np.array([w["delay"] for w in sub])
    out = {"all": _methods(rows), "ksg_subset": _methods(sub)}
    out["ksg_subset"]["ksg"] = _score(d, np.array([w["ksg_lag"] for w in sub]))
    for drv in DRIVERS:
        out[drv] = _methods([w for w in rows if w["driver"] == drv])
    return out


def by_cell(rows: list[dict[str, Any]], cells: list[tuple[str, str, float]]) -> list[dict[str, Any]]:
    out = []
    for drv, rel, noise in cells:
        sub = [w for w in rows if (w["driver"], w["relation"], w["noise"]) == (drv, rel, noise)]
        ks = [w for w in sub if np.isfinite(w["ksg_lag"])]
        m = _methods(sub)
        kscore = _score(np.array([w["delay"] for w in ks]), np.array([w["ksg_lag"] for w in ks]))
        mi = np.array([w["mi"] for w in sub])
        out.append({"driver": drv, "relation": rel, "noise": noise, "mi_median": float(np.nanmedian(mi)),
                    "lag_scan": m["lag_scan"], "xcorr": m["xcorr"], "ksg": kscore})  # fmt: skip
    return out


# -- 2. independent pairs ---------------------------------------------------------------------------------------


def independent(est: Estimator, per_kind: int) -> dict[str, Any]:
    rng = np.random.default_rng(SEED + 1)
    out: dict[str, Any] = {}
    for kind in NULL_KINDS:
        values = np.stack([independent_channel(rng, kind) for _ in range(2 * per_kind)])
        iu, iv = np.arange(0, 2 * per_kind, 2), np.arange(1, 2 * per_kind, 2)
        res = {}
        for label, force in (("network on every pair", None), ("scan gate first", np.zeros(per_kind, bool))):
            r = lag_scan(est, values, iu, iv, max_lag=K, force=force)
            sig = r.significant
            res[label] = {"pairs": per_kind, "significant": int(sig.sum()),
                          "significant_mi_ge_0.1": int((sig & (r.mi >= 0.1)).sum()),
                          "evaluated": int(np.isfinite(r.mi).sum()), "network_pairs": r.network_pairs,
                          "mi_significant": [round(float(m), 4) for m in r.mi[sig]],
                          "lag_significant": [round(float(m), 2) for m in r.lag[sig]],
                          "n_eff_median": float(np.median(r.n_eff))}  # fmt: skip
        out[kind] = res
    return out


# -- 3. a drifting lag ------------------------------------------------------------------------------------------


def drift(est: Estimator) -> dict[str, Any]:
    rng = np.random.default_rng(SEED + 2)
    hold_s, ramp_s, d0, d1 = 12.0, 60.0, 10.0, 40.0
    seconds = 2 * hold_s + ramp_s
    n = int(seconds * RATE_HZ)
    t = np.arange(n, dtype=np.float64)

    def delay(ts: np.ndarray) -> np.ndarray:  # samples, at time ts (samples)
        frac = np.clip((ts / RATE_HZ - hold_s) / ramp_s, 0.0, 1.0)
        return d0 + (d1 - d0) * frac

    x, xd = ou_at(t, t - delay(t), 0.95, rng)
    y = xd + 0.5 * rng.standard_normal(n)
    ends = np.arange(LENGTH, n + 1, int(RATE_HZ))  # exclusive end sample of each window
    values = np.concatenate([np.stack([x[e - LENGTH : e], y[e - LENGTH : e]]) for e in ends])
    iu, iv = np.arange(0, 2 * len(ends), 2), np.arange(1, 2 * len(ends), 2)
    r = lag_scan(est, values, iu, iv, max_lag=K)
    centre = ends - N / 2 - 0.5  # the centre of y's newest N samples (y(t) = x(t - d(t)) at those t)
    last = ends - 1.0
    ramp_lo, ramp_hi = hold_s * RATE_HZ, (hold_s + ramp_s) * RATE_HZ
    inside = (ends - LENGTH >= ramp_lo) & (ends <= ramp_hi)  # the whole row lies on the ramp
    slope = (d1 - d0) / (ramp_s * RATE_HZ)  # samples of delay per sample of time
    lag = r.lag
    # the time at which the true delay equalled the reported lag (on the ramp), before the window's end
    t_match = ramp_lo + (lag - d0) / slope
    tracking_s = (last - t_match) / RATE_HZ

    def score(ref: np.ndarray, sel: np.ndarray) -> dict[str, Any]:
        err = np.abs(lag[sel] - ref[sel])
        ok = np.isfinite(err)
        return {"windows": int(sel.sum()), "found": float(ok.mean()),
                "median_abs_err": float(np.median(err[ok])) if ok.any() else None,
                "p90_abs_err": float(np.quantile(err[ok], 0.9)) if ok.any() else None}  # fmt: skip

    every = np.ones(len(ends), bool)
    fin = inside & np.isfinite(lag)
    return {"seconds": seconds, "hold_s": hold_s, "ramp_s": ramp_s, "delay_from": d0, "delay_to": d1,
            "phi": 0.95, "noise": 0.5, "windows": len(ends),
            "centre_all": score(delay(centre), every), "end_all": score(delay(last), every),
            "centre_ramp": score(delay(centre), inside), "end_ramp": score(delay(last), inside),
            "tracking_lag_s_median": float(np.median(tracking_s[fin])) if fin.any() else None,
            "tracking_lag_s_iqr": [float(q) for q in np.quantile(tracking_s[fin], [0.25, 0.75])] if fin.any()
            else None, "centre_offset_s": (N / 2 + 0.5) / RATE_HZ,
            "series": [{"end_s": float(e / RATE_HZ), "delay_centre": float(delay(np.array([c]))[0]),
                        "lag": None if not np.isfinite(v) else round(float(v), 3), "mi": round(float(m), 4)}
                       for e, c, v, m in zip(ends, centre, lag, r.mi, strict=True)]}  # fmt: skip


# -- 4. engine cost ---------------------------------------------------------------------------------------------

LINKS = (("c00", "c01", "linear", 10, False), ("c02", "c03", "square", 30, False),
         ("c04", "c05", "linear", -50, True), ("c06", "c07", "abs", 80, True))  # fmt: skip


def engine_recording(seconds: float) -> tuple[list[str], np.ndarray, np.ndarray]:
    """12 channels at 100 Hz: four (driver, follower) pairs at known lags (white, white, smooth, smooth) and four
    independent channels (two white, two smooth)."""
    rng = np.random.default_rng(SEED + 3)
    n = int(seconds * RATE_HZ)
    names = [f"c{k:02d}" for k in range(12)]
    x = np.empty((12, n))
    pad = 2 * MAX_DELAY + 100
    for k, (_, _, rel, d, smooth) in enumerate(LINKS):
        w = ar1(rng, n + pad, 0.95) if smooth else rng.standard_normal(n + pad)
        x[2 * k] = w[pad // 2 : pad // 2 + n]
        x[2 * k + 1] = relation(rel, w[pad // 2 - d : pad // 2 - d + n]) + 0.5 * rng.standard_normal(n)
    for k in range(8, 12):
        x[k] = rng.standard_normal(n) if k < 10 else ar1(rng, n, 0.95)
    return names, np.arange(n) / RATE_HZ + T0, x


def replay(names: list[str], t: np.ndarray, x: np.ndarray, max_lag_s: float) -> dict[str, Any]:
    cfg = EngineConfig(channels=names, rate_hz=RATE_HZ, window_len=N, max_lag_s=max_lag_s, lag_refresh_s=1.0,
                       skip_stale_hops=False)  # fmt: skip
    eng = Engine(cfg)
    step = int(RATE_HZ)
    hops = 0
    snap = None
    t0, c0 = time.perf_counter(), time.process_time()
    for s in range(0, x.shape[1], step):
        for k, name in enumerate(names):
            eng.push(name, t[s : s + step], x[k, s : s + step])
        for end in eng.due_windows():
            snap, _ = eng.evaluate(end)
            hops += 1
    total, cpu = time.perf_counter() - t0, time.process_time() - c0
    out: dict[str, Any] = {"total_s": total, "cpu_s": cpu, "load_1min": os.getloadavg()[0], "hops": hops,
                           "stage_s": dict(eng.counters.stage_s)}  # fmt: skip
    if eng.lags is not None:
        out["lag_counts"] = dict(eng.lags.counts)
        assert snap is not None and snap.lag_s is not None
        idx = {c: k for k, c in enumerate(snap.channels)}
        out["final_lags"] = {f"{a}->{b} {rel}": {"true_s": d / RATE_HZ, "lag_s": _num(snap.lag_s[idx[a], idx[b]]),
                                                  "mi_lag": _num(snap.mi_lag[idx[a], idx[b]])}  # type: ignore[index]
                             for a, b, rel, d, _ in LINKS}  # fmt: skip
        linked = {(a, b) for a, b, *_ in LINKS}
        cells = [(i, j) for i in range(len(names)) for j in range(i + 1, len(names))
                 if (snap.channels[i], snap.channels[j]) not in linked]  # fmt: skip
        out["independent_cells_with_lag"] = int(sum(np.isfinite(snap.lag_s[i, j]) for i, j in cells))
        out["independent_cells"] = len(cells)
    return out


def _num(v: float) -> float | None:
    return None if not np.isfinite(v) else round(float(v), 4)


def engine_cost(seconds: float, repeats: int) -> dict[str, Any]:
    names, t, x = engine_recording(seconds)
    replay(names, t[:1500], x[:, :1500], 1.0)  # warm-up: the model, the null table, Numba
    runs: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    for k in range(repeats):
        for label in ("on", "off") if k % 2 == 0 else ("off", "on"):
            runs[label].append(replay(names, t, x, 1.0 if label == "on" else 0.0))
    on = statistics.median(r["total_s"] for r in runs["on"])
    off = statistics.median(r["total_s"] for r in runs["off"])
    on_cpu = statistics.median(r["cpu_s"] for r in runs["on"])
    off_cpu = statistics.median(r["cpu_s"] for r in runs["off"])
    last_on = runs["on"][-1]
    return {"seconds": seconds, "channels": len(names), "pairs": len(names) * (len(names) - 1) // 2,
            "repeats": repeats, "on_s": on, "off_s": off, "ratio": on / off,
            "on_runs_s": [r["total_s"] for r in runs["on"]], "off_runs_s": [r["total_s"] for r in runs["off"]],
            "on_cpu_s": on_cpu, "off_cpu_s": off_cpu, "cpu_ratio": on_cpu / off_cpu,
            "load_1min_after_runs": {k: [r["load_1min"] for r in v] for k, v in runs.items()},
            "lags_stage_s_median": statistics.median(r["stage_s"].get("lags", 0.0) for r in runs["on"]),
            "hops": last_on["hops"], "lag_counts": last_on["lag_counts"], "stage_s_on": last_on["stage_s"],
            "stage_s_off": runs["off"][-1]["stage_s"], "final_lags": last_on["final_lags"],
            "independent_cells_with_lag": last_on["independent_cells_with_lag"],
            "independent_cells": last_on["independent_cells"]}  # fmt: skip


# -- main and the tables ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=40, help="pairs per (driver, relation, noise) cell, 24 cells")
    ap.add_argument("--ksg-pairs", type=int, default=48, help="pairs KSG scans (about 1.5 s each)")
    ap.add_argument("--null-pairs", type=int, default=250, help="independent pairs per kind, 4 kinds")
    ap.add_argument("--seconds", type=float, default=100.0, help="engine recording length")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="a few pairs, 30 s of engine, one repeat (a smoke test)")
    args = ap.parse_args(argv)
    if args.quick:
        args.pairs, args.ksg_pairs, args.null_pairs, args.seconds, args.repeats = 2, 1, 10, 30.0, 1
    t_start = time.perf_counter()
    est = default_estimator()
    warm = driven_pair(np.random.default_rng(SEED + 9), "linear", 0.5, "white")[0]
    lag_scan(est, warm, [0], [1], max_lag=K)  # the null table and the model, once
    results: dict[str, Any] = {"env": environment(), "load_avg_start": list(os.getloadavg()),
                               "settings": {"window_len": N, "max_lag": K, "rate_hz": RATE_HZ,
                                            "max_delay": MAX_DELAY, "noise": list(NOISE), "seed": SEED,
                                            "repeats": args.repeats}}  # fmt: skip
    sections = (("lag_error", lambda: lag_error(est, args.pairs, args.ksg_pairs, args.repeats)),
                ("independent", lambda: independent(est, args.null_pairs)),
                ("drift", lambda: drift(est)),
                ("engine", lambda: engine_cost(args.seconds, args.repeats)))  # fmt: skip
    results["section_s"] = {}
    for name, fn in sections:
        t0 = time.perf_counter()
        results[name] = fn()
        results["section_s"][name] = time.perf_counter() - t0
        results.setdefault("load_1min_after", {})[name] = os.getloadavg()[0]
        print(f"{name}: {results['section_s'][name]:.0f} s", flush=True)
    results["load_avg_end"] = list(os.getloadavg())
    results["run_s"] = time.perf_counter() - t_start
    write_results("lag" if not args.quick else "lag_quick", results, markdown(results))
    return 0


def _f(v: Any, fmt: str = ".2f", unit: str = "") -> str:
    return "-" if v is None else f"{v:{fmt}}{unit}"


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _err(s: dict[str, Any]) -> str:
    m = s["median_abs_err"]
    return "-" if m is None else f"{m:.2f} ({m * MS_PER_SAMPLE:.0f} ms)"


def markdown(r: dict[str, Any]) -> str:
    le = r["lag_error"]
    sm, tp = le["summary"], le["time_per_pair_s"]
    lines = [f"# Lead and lag (`lag_scan`): window {N}, lags +-{K} samples at {RATE_HZ:g} Hz", "",
             f"Whole run {r['run_s']:.0f} s; machine load average (1 min) {r['load_avg_start'][0]:.1f} at the start, "
             f"{r['load_avg_end'][0]:.1f} at the end, after each section "
             + ", ".join(f"{k} {v:.1f}" for k, v in r.get("load_1min_after", {}).items())
             + " (2 cores; a load above 2 means other work shared them and wall times are inflated).", "",
             f"## 1. Lag error ({le['pairs']} pairs; KSG on {le['ksg_pairs']})", "",
             f"y(t) = f(x(t - d)) + noise, f in {', '.join(RELATIONS)}, noise std {', '.join(map(str, NOISE))} on the "
             f"standardised f(x), d uniform in +-{MAX_DELAY} samples (integer for white drivers, non-integer for "
             "smooth AR(1) drivers with phi 0.9-0.99, exact OU values at t - d); "
             f"{le['pairs_per_cell']} pairs per (driver, relation, noise) cell. Within 1 sample: share of all pairs "
             "(lag_scan's not-significant pairs count as misses); median |error| over the pairs given a lag. Time: "
             "mean per pair, lag_scan and cross-correlation on one cell's pairs per call (median of "
             f"{r['settings'].get('repeats', 3)} calls), KSG-3 one pair at a time over 201 lags.", "",
             "| method | pairs | lag given | within 1 sample | median \\|error\\| samples (ms) | p90 \\|error\\| | "
             "time per pair | network passes per pair |", "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    a = sm["all"]
    lines.append(f"| lag_scan | {a['lag_scan']['n']} | {_pct(a['lag_scan']['found'])} | "
                 f"{_pct(a['lag_scan']['within_1'])} | {_err(a['lag_scan'])} | {_f(a['lag_scan']['p90_abs_err'])} | "
                 f"{tp['lag_scan'] * 1e3:.2f} ms | {le['network_passes_per_pair']:.2f} |")  # fmt: skip
    lines.append(f"| lag_scan, best lag before the significance test | {a['lag_scan_best']['n']} | "
                 f"{_pct(a['lag_scan_best']['found'])} | {_pct(a['lag_scan_best']['within_1'])} | "
                 f"{_err(a['lag_scan_best'])} | {_f(a['lag_scan_best']['p90_abs_err'])} | - | - |")  # fmt: skip
    lines.append(f"| Pearson cross-correlation | {a['xcorr']['n']} | 100% | {_pct(a['xcorr']['within_1'])} | "
                 f"{_err(a['xcorr'])} | {_f(a['xcorr']['p90_abs_err'])} | {tp['xcorr'] * 1e3:.3f} ms "
                 "| - |")  # fmt: skip
    for drv in DRIVERS:
        d = sm[drv]
        lines.append(f"| lag_scan, {drv} drivers | {d['lag_scan']['n']} | {_pct(d['lag_scan']['found'])} | "
                     f"{_pct(d['lag_scan']['within_1'])} | {_err(d['lag_scan'])} | "
                     f"{_f(d['lag_scan']['p90_abs_err'])} | | |")  # fmt: skip
        lines.append(f"| cross-correlation, {drv} drivers | {d['xcorr']['n']} | 100% | {_pct(d['xcorr']['within_1'])} "
                     f"| {_err(d['xcorr'])} | {_f(d['xcorr']['p90_abs_err'])} | | |")  # fmt: skip
    ks = sm["ksg_subset"]
    lines.append(f"| KSG-3 at every integer lag | {ks['ksg']['n']} | 100% | {_pct(ks['ksg']['within_1'])} | "
                 f"{_err(ks['ksg'])} | {_f(ks['ksg']['p90_abs_err'])} | {tp['ksg']:.2f} s | - |")  # fmt: skip
    lines.append(f"| lag_scan on KSG's pairs | {ks['lag_scan']['n']} | {_pct(ks['lag_scan']['found'])} | "
                 f"{_pct(ks['lag_scan']['within_1'])} | {_err(ks['lag_scan'])} | {_f(ks['lag_scan']['p90_abs_err'])} "
                 "| | |")  # fmt: skip
    lines.append(f"| cross-correlation on KSG's pairs | {ks['xcorr']['n']} | 100% | {_pct(ks['xcorr']['within_1'])} | "
                 f"{_err(ks['xcorr'])} | {_f(ks['xcorr']['p90_abs_err'])} | | |")  # fmt: skip
    lines += ["", f"lag_scan with one pair per call: {le['lag_scan_one_pair_per_call_s'] * 1e3:.1f} ms (median of "
              "20 pairs).", "", "By cell: MI is the network's at lag_scan's best lag (median); KSG: pairs within "
              "1 sample / pairs scanned.", "",
              "| driver | relation | noise | MI (nats) | lag_scan: lag given | within 1 | median \\|error\\| | "
              "cross-corr.: within 1 | median \\|error\\| | KSG-3 within 1 |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for c in le["by_cell"]:
        k = c["ksg"]
        kcell = "-" if not k["n"] else f"{round(k['within_1'] * k['n'])}/{k['n']}"
        lines.append(f"| {c['driver']} | {c['relation']} | {c['noise']} | {c['mi_median']:.2f} | "
                     f"{_pct(c['lag_scan']['found'])} | {_pct(c['lag_scan']['within_1'])} | "
                     f"{_f(c['lag_scan']['median_abs_err'])} | {_pct(c['xcorr']['within_1'])} | "
                     f"{_f(c['xcorr']['median_abs_err'])} | {kcell} |")  # fmt: skip
    ind = r["independent"]
    lines += ["", "## 2. Independent pairs", "",
              "Both channels independent; the rows are N + K samples, lag_scan at its defaults (alpha 1e-3, "
              "min_effect 0). Target: significant with MI >= 0.1 nats on <= 1% of pairs.", "",
              "| kind | lag_scan mode | pairs | significant | significant, MI >= 0.1 | largest MI among the "
              "significant | network passes per pair | median n_eff |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    tot: dict[str, list[int]] = {}
    for kind, res in ind.items():
        for mode, x in res.items():
            t = tot.setdefault(mode, [0, 0, 0])
            t[0] += x["pairs"]
            t[1] += x["significant"]
            t[2] += x["significant_mi_ge_0.1"]
            lines.append(f"| {kind} | {mode} | {x['pairs']} | {x['significant']} "
                         f"({_pct(x['significant'] / x['pairs'])}) | {x['significant_mi_ge_0.1']} "
                         f"({_pct(x['significant_mi_ge_0.1'] / x['pairs'])}) | "
                         f"{_f(max(x['mi_significant'], default=None), '.3f')} | "
                         f"{x['network_pairs'] / x['pairs']:.2f} | {x['n_eff_median']:.0f} |")  # fmt: skip
    for mode, (n, s, b) in tot.items():
        lines.append(f"| **all** | {mode} | {n} | {s} ({_pct(s / n)}) | {b} ({_pct(b / n)}) | | | |")
    worst = max(b / n for n, _s, b in tot.values())
    lines += ["", f"Target (significant with MI >= 0.1 on <= 1% of pairs): {'met' if worst <= 0.01 else 'missed'} "
              f"({_pct(worst)} at most)."]  # fmt: skip
    dr = r["drift"]
    lines += ["", "## 3. A drifting lag", "",
              f"y(t) = x(t - d(t)) + {dr['noise']} noise, x AR(1) phi {dr['phi']} (exact OU values at t - d(t)); d "
              f"held at {dr['delay_from']:g} samples for {dr['hold_s']:g} s, moving linearly to {dr['delay_to']:g} "
              f"over {dr['ramp_s']:g} s (0.5 samples per second), held again {dr['hold_s']:g} s. Windows end every "
              f"1 s ({dr['windows']} windows). Reference: the true delay at the centre of y's newest N samples, "
              f"{dr['centre_offset_s']:.2f} s before the window's end (the lag search pairs those y(t) with x(t - "
              "tau); on a linear ramp the best single lag is the delay at their centre); the window's end for "
              "comparison. 'On the ramp': windows whose whole row (N + K samples) lies on the ramp.", "",
              "| windows | reference | n | lag given | median \\|error\\| samples (ms) | p90 \\|error\\| |",
              "|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for sel, label in (("all", "all"), ("ramp", "on the ramp")):
        for ref in ("centre", "end"):
            s = dr[f"{ref}_{sel}"]
            lines.append(f"| {label} | delay at the {ref} | {s['windows']} | {_pct(s['found'])} | {_err(s)} | "
                         f"{_f(s['p90_abs_err'])} |")  # fmt: skip
    iqr = dr["tracking_lag_s_iqr"]
    lines += ["", f"Tracking lag (on the ramp): the reported lag equals the true delay of "
              f"{_f(dr['tracking_lag_s_median'], '.2f', ' s')} before the window's end (median; IQR "
              f"{_f(iqr[0] if iqr else None)}-{_f(iqr[1] if iqr else None)} s); the window's centre is "
              f"{dr['centre_offset_s']:.2f} s before its end."]  # fmt: skip
    en = r["engine"]
    lc = en["lag_counts"]
    lines += ["", f"## 4. Engine cost ({en['channels']} channels, {en['pairs']} pairs, {en['seconds']:g} s at 100 Hz)",
              "", "`Engine` with `window_len` 1024, `lag_refresh_s` 1, `skip_stale_hops` False; 1 s of samples per "
              "channel per push, every due window evaluated; total wall time of the replay, median of "
              f"{en['repeats']} (on and off alternating; runs on: {', '.join(f'{v:.1f}' for v in en['on_runs_s'])} "
              f"s, off: {', '.join(f'{v:.1f}' for v in en['off_runs_s'])} s; load average after each run, on: "
              f"{', '.join(f'{v:.1f}' for v in en['load_1min_after_runs']['on'])}, off: "
              f"{', '.join(f'{v:.1f}' for v in en['load_1min_after_runs']['off'])}). CPU: this process's CPU "
              "seconds over the replay (all its threads). Target: ratio <= 3.", "",
              "| `max_lag_s` | total | per hop | CPU | `stage_s['lags']` | pairs searched | network passes | gapped | "
              "ratio (wall) | ratio (CPU) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
              f"| 1.0 (on) | {en['on_s']:.1f} s | {en['on_s'] / en['hops'] * 1e3:.0f} ms | {en['on_cpu_s']:.1f} s | "
              f"{en['lags_stage_s_median']:.1f} s | {lc['pairs_searched']} | {lc['network_pairs']} | {lc['gapped']} | "
              f"{en['ratio']:.2f}x | {en['cpu_ratio']:.2f}x |",
              f"| 0 (off) | {en['off_s']:.1f} s | {en['off_s'] / en['hops'] * 1e3:.0f} ms | {en['off_cpu_s']:.1f} s | "
              "- | - | - | - | 1 | 1 |", "",
              f"Target (ratio <= 3): {'met' if en['ratio'] <= 3 else 'missed'} on wall time ({en['ratio']:.2f}x), "
              f"{'met' if en['cpu_ratio'] <= 3 else 'missed'} on CPU time ({en['cpu_ratio']:.2f}x).", "",
              "Stage seconds, last run on / off: " + ", ".join(
                  f"{k} {v:.1f} / {en['stage_s_off'].get(k, 0.0):.1f}" for k, v in en["stage_s_on"].items()), "",
              "The lags the engine ends with (its lag_s; positive: the second channel follows the first): " +
              "; ".join(f"{k}: true {v['true_s']:+.2f} s, reported {_f(v['lag_s'], '+.2f', ' s')} (MI "
                        f"{_f(v['mi_lag'])})" for k, v in en["final_lags"].items()) +
              f"; independent cells with a lag: {en['independent_cells_with_lag']} of "
              f"{en['independent_cells']}."]  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
