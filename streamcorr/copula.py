"""Rank (empirical copula) transform and linear-binned rank histograms.

Tie policy: tied values get their mid-rank (the average of the ranks they
span), so a strictly increasing map of a series leaves its ranks unchanged and
quantised sensors give repeatable, order-free results. A window of length T
maps rank r (0-based, possibly fractional for ties) to u = (r + 0.5) / T, which
lies strictly inside (0, 1).

Histograms use linear binning on a grid of G nodes at positions g / (G - 1):
each sample spreads unit mass over the four nodes around it, bilinearly. A sum
over nodes of hist * table is then exactly the mean over samples of the
bilinearly interpolated table, which is how the estimator reads out the
Donsker-Varadhan first term without touching samples again.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import njit, prange

from .errors import InputError

__all__ = ["marginal_histograms", "pair_histograms", "rank_transform"]


@njit(cache=True, parallel=True, nogil=True)
def _midranks(x: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Mid-ranks in (0, 1) of each row of x, given each row's ascending argsort."""
    rows, n = x.shape
    out = np.empty(x.shape, dtype=np.float64)
    for r in prange(rows):
        xr, orr, outr = x[r], order[r], out[r]
        i = 0
        while i < n:
            j = i
            xi = xr[orr[i]]
            while j + 1 < n and xr[orr[j + 1]] == xi:
                j += 1
            u = (0.5 * (i + j) + 0.5) / n  # mid-rank of the tie group, mapped into (0, 1)
            for k in range(i, j + 1):
                outr[orr[k]] = u
            i = j + 1
    return out


@njit(cache=True, nogil=True)
def _bin(u: float, g: int) -> tuple[int, float]:
    p = u * (g - 1)
    i = int(p)
    if i >= g - 1:
        i = g - 2
    return i, p - i


@njit(cache=True, parallel=True, nogil=True)
def _pair_hist(u: np.ndarray, v: np.ndarray, iu: np.ndarray, iv: np.ndarray, g: int) -> np.ndarray:
    n_pairs = iu.shape[0]
    t = u.shape[1]
    out = np.zeros((n_pairs, g, g), dtype=np.float32)
    for p in prange(n_pairs):
        a = u[iu[p]]
        b = v[iv[p]]
        h = out[p]
        for k in range(t):
            i, wi = _bin(a[k], g)
            j, wj = _bin(b[k], g)
            h[i, j] += (1.0 - wi) * (1.0 - wj)
            h[i + 1, j] += wi * (1.0 - wj)
            h[i, j + 1] += (1.0 - wi) * wj
            h[i + 1, j + 1] += wi * wj
    return out


@njit(cache=True, parallel=True, nogil=True)
def _marg_hist(u: np.ndarray, g: int) -> np.ndarray:
    out = np.zeros((u.shape[0], g), dtype=np.float32)
    for r in prange(u.shape[0]):
        for k in range(u.shape[1]):
            i, w = _bin(u[r, k], g)
            out[r, i] += 1.0 - w
            out[r, i + 1] += w
    return out


def _as_2d_float(x: object, name: str) -> np.ndarray:
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        msg = f"{name} must be numeric; got {type(x).__name__} that numpy cannot convert to float64"
        raise InputError(msg) from exc
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2:
        msg = f"{name} must be 1-D (T,) or 2-D (N, T); got shape {arr.shape}"
        raise InputError(msg)
    return np.ascontiguousarray(arr)


_SORT_POOL: ThreadPoolExecutor | None = None
_PARALLEL_MIN_VALUES = 50_000  # below this, thread hand-off costs more than it saves


def _argsort_rows(arr: np.ndarray) -> np.ndarray:
    """Row-wise argsort; large batches are split across threads (numpy sorts without the GIL)."""
    global _SORT_POOL
    workers = min(os.cpu_count() or 1, arr.shape[0])
    if workers < 2 or arr.size < _PARALLEL_MIN_VALUES:
        return np.argsort(arr, axis=1)
    if _SORT_POOL is None:
        _SORT_POOL = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="streamcorr-sort")
    out = np.empty(arr.shape, dtype=np.intp)
    bounds = np.linspace(0, arr.shape[0], workers + 1).astype(int)

    def sort_chunk(i: int) -> None:
        out[bounds[i] : bounds[i + 1]] = np.argsort(arr[bounds[i] : bounds[i + 1]], axis=1)

    list(_SORT_POOL.map(sort_chunk, range(workers)))
    return out


def rank_transform(x: object) -> np.ndarray:
    """Map each row of ``x`` (shape (T,) or (N, T)) to mid-ranks in (0, 1).

    >>> rank_transform([3.0, 1.0, 2.0, 2.0])
    array([[0.875, 0.125, 0.5  , 0.5  ]])
    """
    arr = _as_2d_float(x, "x")
    if arr.shape[1] == 0:
        raise InputError("x has no samples; pass at least one value per row")
    if not np.isfinite(arr).all():
        raise InputError("x contains NaN or inf; drop or fill non-finite samples before ranking")
    # numpy's vectorised sort beats Numba's argsort several-fold; Numba then resolves ties
    return _midranks(arr, _argsort_rows(arr))


def _check_unit(u: np.ndarray, name: str) -> None:
    if u.size and (u.min() < 0.0 or u.max() > 1.0 or not np.isfinite(u).all()):
        raise InputError(f"{name} must hold copula values in [0, 1]; pass the output of rank_transform")


def pair_histograms(
    u: np.ndarray,
    v: np.ndarray,
    grid: int,
    iu: np.ndarray | None = None,
    iv: np.ndarray | None = None,
) -> np.ndarray:
    """Linear-binned joint histograms of rows ``u[iu[p]]`` and ``v[iv[p]]``.

    u: (Nu, T) and v: (Nv, T) copula values; iu, iv: (P,) row indices (default:
    row p with row p). Returns float32 (P, grid, grid); each histogram sums to T.
    """
    u = np.ascontiguousarray(u, dtype=np.float64)
    v = np.ascontiguousarray(v, dtype=np.float64)
    if u.ndim != 2 or v.ndim != 2 or u.shape[1] != v.shape[1]:
        raise InputError(f"u and v must be 2-D with equal row length; got {u.shape} and {v.shape}")
    if grid < 2:
        raise InputError(f"grid must be >= 2; got {grid}")
    _check_unit(u, "u")
    _check_unit(v, "v")
    if iu is None or iv is None:
        if u.shape[0] != v.shape[0]:
            raise InputError("without index arrays, u and v must have the same number of rows")
        iu = iv = np.arange(u.shape[0], dtype=np.int64)
    iu = np.ascontiguousarray(iu, dtype=np.int64)
    iv = np.ascontiguousarray(iv, dtype=np.int64)
    if iu.shape != iv.shape or iu.ndim != 1:
        raise InputError("iu and iv must be 1-D index arrays of equal length")
    if iu.size and (iu.min() < 0 or iu.max() >= u.shape[0] or iv.min() < 0 or iv.max() >= v.shape[0]):
        raise InputError("a pair index is out of range of the rows of u or v")
    return _pair_hist(u, v, iu, iv, grid)


def marginal_histograms(u: np.ndarray, grid: int) -> np.ndarray:
    """Linear-binned histogram of each row of ``u`` (N, T): float32 (N, grid)."""
    u = np.ascontiguousarray(u, dtype=np.float64)
    if u.ndim != 2:
        raise InputError(f"u must be 2-D (N, T); got shape {u.shape}")
    if grid < 2:
        raise InputError(f"grid must be >= 2; got {grid}")
    _check_unit(u, "u")
    return _marg_hist(u, grid)


@njit(cache=True, parallel=True, nogil=True)
def _slide(vals: np.ndarray, ids: np.ndarray, n_filled: int, new: np.ndarray, first_new: int, n_win: int) -> np.ndarray:
    """Advance every channel's sorted window by the columns of new (C, h); return mid-ranks (C, n) in time order."""
    c_count, h = new.shape
    end = first_new + h
    cutoff = end - n_win
    n_out = min(n_win, n_filled + h)
    first = end - n_out
    out = np.empty((c_count, n_out), dtype=np.float64)
    for c in prange(c_count):
        keep_v = np.empty(n_filled, dtype=np.float64)
        keep_i = np.empty(n_filled, dtype=np.int64)
        k = 0
        for i in range(n_filled):  # drop the samples that leave the window, keeping sorted order
            if ids[c, i] >= cutoff:
                keep_v[k] = vals[c, i]
                keep_i[k] = ids[c, i]
                k += 1
        order = np.argsort(new[c])
        a = 0
        b = 0
        m = 0
        while a < k or b < h:  # merge the survivors with the sorted new samples
            if b >= h or (a < k and keep_v[a] <= new[c, order[b]]):
                vals[c, m] = keep_v[a]
                ids[c, m] = keep_i[a]
                a += 1
            else:
                vals[c, m] = new[c, order[b]]
                ids[c, m] = first_new + order[b]
                b += 1
            m += 1
        i = 0
        while i < m:  # mid-ranks of tie groups, scattered back to time order
            j = i
            while j + 1 < m and vals[c, j + 1] == vals[c, i]:
                j += 1
            u = (0.5 * (i + j) + 0.5) / m
            for q in range(i, j + 1):
                out[c, ids[c, q] - first] = u
            i = j + 1
    return out


class SlidingRanks:
    """Mid-ranks of the last ``window_len`` samples of many channels, updated per hop.

    Channels advance in lockstep (one aligned column per tick). Each update keeps
    every channel's window sorted by merging the h new samples into it, which
    costs O(window_len + h log h) instead of a full O(window_len log window_len)
    re-sort. Results equal ``rank_transform`` of the current window exactly.

    >>> sr = SlidingRanks(n_channels=1, window_len=3)
    >>> sr.update(np.array([[5.0, 1.0]])).tolist()
    [[0.75, 0.25]]
    >>> sr.update(np.array([[3.0, 3.0]])).tolist()  # window is now 1, 3, 3
    [[0.16666666666666666, 0.6666666666666666, 0.6666666666666666]]
    """

    def __init__(self, n_channels: int, window_len: int) -> None:
        if n_channels < 1 or window_len < 1:
            raise InputError(f"n_channels and window_len must be >= 1; got {n_channels} and {window_len}")
        self.window_len = window_len
        self._vals = np.empty((n_channels, window_len), dtype=np.float64)
        self._ids = np.empty((n_channels, window_len), dtype=np.int64)
        self._filled = 0
        self._next_id = 0

    def update(self, new: np.ndarray) -> np.ndarray:
        """Append columns new (C, h) of finite values; returns the window's copula values (C, n), oldest first."""
        new = np.ascontiguousarray(new, dtype=np.float64)
        if new.ndim != 2 or new.shape[0] != self._vals.shape[0]:
            raise InputError(f"new must have shape ({self._vals.shape[0]}, h); got {new.shape}")
        if not np.isfinite(new).all():
            raise InputError("new contains NaN or inf; sliding ranks need finite samples (fill or drop them first)")
        if new.shape[1] >= self.window_len:  # the whole window is new: start from empty
            self._next_id += new.shape[1] - self.window_len
            new = new[:, -self.window_len :]
            self._filled = 0
        out = _slide(self._vals, self._ids, self._filled, new, self._next_id, self.window_len)
        self._next_id += new.shape[1]
        self._filled = out.shape[1]
        return out
