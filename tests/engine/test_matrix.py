"""Snapshot.top_pairs: the strongest pairs of a snapshot, against a brute-force list of cells."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamcorr.engine.matrix import Snapshot
from streamcorr.errors import InputError


def _snapshot(mi: np.ndarray) -> Snapshot:
    n = mi.shape[0]
    return Snapshot(1, 0, 0, tuple(f"ch{k}" for k in range(n)), mi, np.zeros((n, n)), np.ones((n, n)))


def naive_top_pairs(mi: np.ndarray, k: int | None, threshold: float | None) -> list[tuple[int, int, float]]:
    """Every finite upper-triangle cell at or above the threshold (compared in the matrix's dtype), sorted by
    (-mi, i, j), the first k."""
    n = mi.shape[0]
    cells = [(float(mi[i, j]), i, j) for i in range(n) for j in range(i + 1, n) if math.isfinite(mi[i, j])]
    at = mi.dtype.type
    cells = [c for c in cells if threshold is None or at(c[0]) >= at(threshold)]
    cells.sort(key=lambda c: (-c[0], c[1], c[2]))
    return [(i, j, v) for v, i, j in cells[:k]]


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(0, 12),
    seed=st.integers(0, 2**32 - 1),
    k=st.none() | st.integers(0, 80),
    threshold=st.none() | st.floats(-1, 2),
    float32=st.booleans(),
)
def test_top_pairs_matches_a_sorted_list_of_cells(n, seed, k, threshold, float32):
    """Pairs are the finite upper-triangle cells at or above the threshold, largest first, ties by (i, j), at
    most k; Python ints and floats."""
    rng = np.random.default_rng(seed)
    mi = rng.normal(0.3, 0.4, (n, n))  # some negative: a network estimate can dip below zero
    mi[rng.random((n, n)) < 0.3] = 0.25  # ties
    mi[rng.random((n, n)) < 0.2] = np.nan  # never evaluated
    mi = mi.astype(np.float32) if float32 else mi  # not symmetric: only the upper triangle may be read
    got = _snapshot(mi).top_pairs(k, threshold)
    assert got == naive_top_pairs(mi, k, threshold)
    assert all(type(i) is int and type(j) is int and type(v) is float for i, j, v in got)


def test_top_pairs_thresholds_a_float32_matrix_in_float32():
    """A float32 cell passes a threshold that rounds to its value in float32 (what the envelope publishes)."""
    np.random.default_rng(0)
    mi = np.array([[np.nan, 0.1], [0.1, np.nan]], dtype=np.float32)
    assert _snapshot(mi).top_pairs(threshold=0.100000002) == [(0, 1, float(np.float32(0.1)))]


def test_top_pairs_of_an_all_nan_or_empty_snapshot_is_empty():
    """A snapshot with no evaluated pair, or no channels, has no strongest pairs."""
    np.random.default_rng(0)
    assert _snapshot(np.full((3, 3), np.nan)).top_pairs() == []
    assert _snapshot(np.zeros((0, 0))).top_pairs(k=3) == []


@pytest.mark.parametrize(("k", "threshold"), [(-1, None), (1.5, None), (True, None), (None, math.nan), (None, "1")])
def test_top_pairs_rejects_bad_arguments(k, threshold):
    """k must be a non-negative integer and threshold a finite number; anything else is an InputError."""
    np.random.default_rng(0)
    with pytest.raises(InputError):
        _snapshot(np.zeros((2, 2))).top_pairs(k, threshold)
