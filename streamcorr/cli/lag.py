"""`streamcorr estimate data.csv x y`: the note on smooth series, and with ``--max-lag-s S`` one pair's MI against lag
and its best lag."""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np

from ..errors import InputError

__all__ = ["print_lag_curve", "smooth_note"]


def smooth_note(x: np.ndarray, y: np.ndarray) -> None:
    """On stderr, where the rows hold far fewer independent samples than rows (smooth series): a value is not a
    verdict there, since independent smooth series read well above 0."""
    from ..estimate.significance import WHITE_FROM, autocorrelation, pair_n_eff, rank_rows

    acf = autocorrelation(rank_rows(np.stack([x, y])))
    n_eff = float(pair_n_eff(acf[:1], acf[1:], len(x))[0])
    if n_eff < WHITE_FROM * len(x):
        print(f"note: the rows hold about {n_eff:.0f} independent samples of {len(x)} (smooth series), and two "
              "independent series that smooth can read this high: `streamcorr replay` judges a pair against the "
              "null at its effective size (docs/real-sensors.md)", file=sys.stderr)  # fmt: skip


def print_lag_curve(args: argparse.Namespace, stamps: np.ndarray | None, x: np.ndarray, y: np.ndarray) -> int:
    """`streamcorr estimate ... --max-lag-s`: MI against lag of two columns whose rows are samples on one clock (its
    rate from --rate-hz, else the time column's stamps)."""
    from ..engine.changes import SHIPPED_WINDOWS
    from ..engine.lagscan import lag_scan
    from ..estimate.estimator import default_estimator

    rate = stamped = None
    if stamps is not None:
        step = np.diff(stamps)
        stamped = 1.0 / float(np.median(step)) if len(step) and np.median(step) > 0 else None
    rate = args.rate_hz or stamped
    if args.rate_hz and stamped and abs(args.rate_hz / stamped - 1) > 0.01:
        print(f"note: --rate-hz {args.rate_hz:g} overrides the time column's {stamped:.4g} Hz", file=sys.stderr)
    if not (math.isfinite(args.max_lag_s) and args.max_lag_s > 0):
        raise InputError(f"--max-lag-s must be a positive number of seconds; got {args.max_lag_s}")
    if rate is None or not (math.isfinite(rate) and rate > 0):
        raise InputError("--max-lag-s needs the rows' rate: give --rate-hz, or a time column (t, time, ...)")
    k = max(1, math.ceil(args.max_lag_s * rate - 1e-9))
    # the newest 2048, 1024, 512 or 256 rows beside the lag range: windows with a shipped null (others measure one)
    n = max((w for w in SHIPPED_WINDOWS if w + k <= len(x)), default=0)
    if n == 0:
        raise InputError(f"{len(x)} rows: a lag search of +-{k} samples needs at least {min(SHIPPED_WINDOWS) + k}")
    r = lag_scan(default_estimator(), np.stack([x, y]), [0], [1], max_lag=k, window_len=n)
    print(f"lag_s\tscan_mi  (nats: the scan's small-dependence figure, a shape; {args.y!r} against {args.x!r} over "
          f"the newest {n} rows, a window with a shipped null; lag > 0: {args.y!r} follows)")  # fmt: skip
    for lag, value in zip(np.arange(-k, k + 1) / rate, r.curve[0], strict=True):
        print(f"{lag:+.4f}\t{value:.4f}")
    for lag, value in zip(r.cand_lag[0] / rate, r.cand_mi[0], strict=True):
        print(f"network at {lag:+.4f} s: {value:.4f} nats")
    if r.significant[0]:
        print(f"best lag {r.lag[0] / rate:+.4f} s, MI there {r.mi[0]:.4f} nats (null for the best of the lags: "
              f"{r.threshold[0]:.4f})")  # fmt: skip
    else:
        print(f"no significant lag: best MI {r.mi[0]:.4f} nats is within the null for the best of the lags "
              f"({r.threshold[0]:.4f})")  # fmt: skip
    return 0
