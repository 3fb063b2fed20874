"""The live MI matrix: a mutable state updated per pair, and immutable snapshots of it.

Each cell holds the freshest assessment of its pair and says which kind it is (``source``): a network
(InfoNet) estimate, or, when dependence screening is on, the screen's small-dependence MI figure for a pair
that failed the screen this hop. ``age_s`` is the age of the value shown; ``network_age_s`` the age of the
pair's last network estimate, which the scheduler keeps below ``max_age``.
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError


@dataclass(frozen=True)
class Snapshot:
    """One published view of the matrix. Matrices are (N, N), symmetric, NaN where never evaluated."""

    seq: int
    t_ns: int  # stream time of the snapshot (end of the newest window)
    wall_ns: int  # wall-clock time it was made
    channels: tuple[str, ...]
    mi: np.ndarray  # nats
    age_s: np.ndarray  # seconds since each cell was refreshed (inf: never)
    coverage: np.ndarray  # fraction of the window where both channels were valid
    # per cell: SOURCE_NONE (never assessed), SOURCE_NETWORK or SOURCE_SCREEN; None: not known (older publisher)
    source: np.ndarray | None = field(default=None, kw_only=True)
    network_age_s: np.ndarray | None = field(default=None, kw_only=True)  # since the last network estimate; inf
    # per cell: the change detector's verdict (bool; False where never assessed) and the pair's effective sample
    # size on its newest network window (NaN: never); None: not known (older publisher)
    dependent: np.ndarray | None = field(default=None, kw_only=True)
    n_eff: np.ndarray | None = field(default=None, kw_only=True)
    # lead and lag (streamcorr.engine.lags; None: off): each pair's newest significant best lag, seconds, with
    # lag_s[i, j] > 0 when channel j follows channel i (antisymmetric), and the MI at that lag; NaN: none
    lag_s: np.ndarray | None = field(default=None, kw_only=True)
    mi_lag: np.ndarray | None = field(default=None, kw_only=True)
    # as received by a Subscriber: "live" (just published), "retained" (the broker's or the cache's copy,
    # made wall_age_s ago) or "offline" (its publisher's last status says offline: the daemon is gone)
    origin: str = "live"

    @property
    def wall_age_s(self) -> float:
        """Seconds (wall clock) since the publisher made this snapshot."""
        return time.time() - self.wall_ns / 1e9

    def top_pairs(self, k: int | None = None, threshold: float | None = None) -> list[tuple[int, int, float]]:
        """The strongest pairs, ``(i, j, mi)`` with i < j indexing :attr:`channels`, largest MI first.

        Only finite cells (NaN: never evaluated) with ``mi >= threshold`` count, at most ``k`` of them; ties
        keep (i, j) order, so the same snapshot always gives the same list. MI is compared in the dtype of
        :attr:`mi` (a float32 matrix gives float32 values).

        >>> nan = float("nan")
        >>> snap = Snapshot(1, 0, 0, ("a", "b", "c"), np.array([[nan, 0.2, 0.9], [0.2, nan, nan], [0.9, nan, nan]]),
        ...                 np.zeros((3, 3)), np.ones((3, 3)))
        >>> snap.top_pairs()
        [(0, 2, 0.9), (0, 1, 0.2)]
        >>> [(snap.channels[i], snap.channels[j]) for i, j, _ in snap.top_pairs(k=1)], snap.top_pairs(threshold=0.5)
        ([('a', 'c')], [(0, 2, 0.9)])
        """
        if k is not None and (isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 0):
            raise InputError(f"k must be a non-negative integer or None (all pairs); got {k!r}")
        if threshold is not None and not (isinstance(threshold, numbers.Real) and math.isfinite(threshold)):
            raise InputError(f"threshold must be a finite number of nats or None; got {threshold!r}")
        mi = np.asarray(self.mi)  # no cast: a float32 matrix is ranked and thresholded as float32
        i, j = np.triu_indices(mi.shape[0], k=1)  # row-major: (i, j) order, which the stable sort keeps for ties
        values = mi[i, j]
        keep = np.isfinite(values)
        if threshold is not None:
            keep &= values >= threshold
        i, j, values = i[keep], j[keep], values[keep]
        order = np.argsort(-values, kind="stable")[:k]
        return list(zip(i[order].tolist(), j[order].tolist(), values[order].tolist(), strict=True))


SOURCE_NONE, SOURCE_NETWORK, SOURCE_SCREEN = 0, 1, 2  # values of Snapshot.source (uint8)


class MatrixState:
    def __init__(self, channels: list[str], lags: bool = False) -> None:
        n = len(channels)
        self.lags = lags  # the lag_s and mi_lag matrices are kept (lags.max_s > 0)
        self.lag_s = np.full((n, n), np.nan) if lags else np.zeros((0, 0))
        self.mi_lag = np.full((n, n), np.nan) if lags else np.zeros((0, 0))
        self.channels = list(channels)
        self.mi = np.full((n, n), np.nan)
        self.coverage = np.full((n, n), np.nan)
        self.refreshed_ns = np.full((n, n), -1, dtype=np.int64)
        self.network_ns = np.full((n, n), -1, dtype=np.int64)  # stream time of the last network estimate
        self.source = np.zeros((n, n), dtype=np.uint8)
        self.dependent = np.zeros((n, n), dtype=bool)
        self.n_eff = np.full((n, n), np.nan)
        self.seq = 0

    def add_channel(self, name: str) -> None:
        self.add_channels([name])

    def add_channels(self, names: list[str]) -> None:
        """Append channels, growing each matrix once for all of them."""
        n, k = len(self.channels), len(names)
        self.channels.extend(names)
        cells: list[tuple[str, float]] = [
            ("mi", np.nan),
            ("coverage", np.nan),
            ("refreshed_ns", -1),
            ("network_ns", -1),
            ("source", 0),
            ("dependent", False),
            ("n_eff", np.nan),
        ]
        if self.lags:
            cells += [("lag_s", np.nan), ("mi_lag", np.nan)]
        for attr, fill in cells:
            old = getattr(self, attr)
            new = np.full((n + k, n + k), fill, dtype=old.dtype)
            new[:n, :n] = old
            setattr(self, attr, new)

    def remove_channels(self, names: set[str]) -> None:
        """Drop channels (retired) and their rows and columns; the others keep their order and cells."""
        keep = np.array([k for k, name in enumerate(self.channels) if name not in names], dtype=np.int64)
        self.channels = [self.channels[k] for k in keep]
        lags = ("lag_s", "mi_lag") if self.lags else ()
        for attr in ("mi", "coverage", "refreshed_ns", "network_ns", "source", "dependent", "n_eff", *lags):
            setattr(self, attr, getattr(self, attr)[np.ix_(keep, keep)])

    def update(
        self,
        i: np.ndarray,
        j: np.ndarray,
        mi: np.ndarray,
        coverage: np.ndarray,
        t_ns: int,
        source: int = SOURCE_NETWORK,
    ) -> None:
        """Set cells (i, j) and (j, i) to values of one kind (SOURCE_NETWORK or SOURCE_SCREEN) at stream time t_ns."""
        assert source in (SOURCE_NETWORK, SOURCE_SCREEN), source
        for a, b in ((i, j), (j, i)):
            self.mi[a, b] = mi
            self.coverage[a, b] = coverage
            self.refreshed_ns[a, b] = t_ns
            self.source[a, b] = source
            if source == SOURCE_NETWORK:
                self.network_ns[a, b] = t_ns

    def set_coverage(self, i: np.ndarray, j: np.ndarray, coverage: np.ndarray) -> None:
        """Record the coverage of cells (i, j) and (j, i) not refreshed for lack of it (their values keep their age)."""
        self.coverage[i, j] = self.coverage[j, i] = coverage

    def set_significance(self, i: np.ndarray, j: np.ndarray, dependent: np.ndarray, n_eff: np.ndarray) -> None:
        """Record the detector's verdict and the effective sample size of cells (i, j) and (j, i)."""
        for a, b in ((i, j), (j, i)):
            self.dependent[a, b] = dependent
            self.n_eff[a, b] = n_eff

    def set_lags(self, i: np.ndarray, j: np.ndarray, lag_s: np.ndarray, mi_lag: np.ndarray) -> None:
        """Record the newest lag search of pairs (i, j): lag_s > 0 when j follows i (NaN: no significant lag)."""
        self.lag_s[i, j], self.lag_s[j, i] = lag_s, -lag_s
        self.mi_lag[i, j] = self.mi_lag[j, i] = mi_lag

    def snapshot(self, t_ns: int, wall_ns: int) -> Snapshot:
        self.seq += 1
        age = np.where(self.refreshed_ns < 0, np.inf, (t_ns - self.refreshed_ns) / 1e9)
        net_age = np.where(self.network_ns < 0, np.inf, (t_ns - self.network_ns) / 1e9)
        return Snapshot(
            self.seq,
            t_ns,
            wall_ns,
            tuple(self.channels),
            self.mi.copy(),
            age,
            self.coverage.copy(),
            source=self.source.copy(),
            network_age_s=net_age,
            dependent=self.dependent.copy(),
            n_eff=self.n_eff.copy(),
            lag_s=self.lag_s.copy() if self.lags else None,
            mi_lag=self.mi_lag.copy() if self.lags else None,
        )
