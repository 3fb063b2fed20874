"""Jitter salts (see :mod:`streamcorr.estimate.copula`, tie policy "jitter"): a channel's, from its name, and the
second row of a pair whose two rows would otherwise share one order (one a strictly increasing map of the other);
and each pair's orientation, so that MI(x, y) and MI(y, x) are one number.

Without them a quantised reading and the same reading in other units share their tie groups' order and read as an
exact copy (about 4.6 nats) instead of the entropy of their levels.
"""

from __future__ import annotations

import hashlib

import numpy as np

from .copula import Ties, rank_transform

__all__ = ["identical_rows", "name_salt", "oriented", "pair_ranks"]


def pair_ranks(x: np.ndarray, y: np.ndarray, ties: Ties) -> np.ndarray:
    """Copula values (2P, T) of the rows of x (P, T), then of y (P, T), each ranked on its own; where a pair's
    two rows rank identically under the jitter (one a strictly increasing map of the other, ties included), its
    y row is ranked again with salt 1, so that shared tie groups do not read as an exact copy."""
    u = rank_transform(np.concatenate([x, y]), ties)
    p = x.shape[0]
    if ties == "jitter" and len(same := np.flatnonzero((u[:p] == u[p:]).all(axis=1))):
        u[p + same] = rank_transform(y[same], ties, salts=np.ones(len(same), dtype=np.uint64))
    return u


def identical_rows(u: np.ndarray, iu: np.ndarray, iv: np.ndarray) -> np.ndarray:
    """Indices of the pairs (iu, iv) whose rows of u (C, T) are identical."""
    digest = np.array([hash(row.tobytes()) for row in u])
    maybe = np.flatnonzero(digest[iu] == digest[iv])
    return maybe[[np.array_equal(u[iu[k]], u[iv[k]]) for k in maybe]] if len(maybe) else maybe


def name_salt(name: str) -> int:
    """A channel's jitter salt: a stable 64-bit digest of its name (the same in every process and source)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


def oriented(u: np.ndarray, iu: np.ndarray, iv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pairs (iu, iv) of rows of copula values u (C, T), each with the row first whose first 8 values are
    lexicographically smaller by their distance from the median (then by value): the network reads a pair and its
    transpose a little differently (up to 0.03 nats on ~200 quantised rows, median 0.001), so which channel the
    caller or the matrix lists first must not move the MI; keyed by the distance, reflecting a channel (y -> -y)
    keeps the orientation, so the refinement reads a reflected pair as before."""
    k = min(u.shape[1], 8)
    head = u[:, :k][:, ::-1]  # np.lexsort's last key is its first
    rank = np.empty(len(u), dtype=np.int64)
    rank[np.lexsort(np.concatenate([head, np.abs(head - 0.5)], axis=1).T)] = np.arange(len(u))
    swap = rank[iu] > rank[iv]
    return np.where(swap, iv, iu), np.where(swap, iu, iv)
