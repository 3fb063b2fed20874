"""The per-sample evidence kernel against the one-sample-at-a-time bilinear lookup of tests/naive.py."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamcorr.errors import InputError
from streamcorr.estimate.evidence import cusum_threshold, evidence
from tests.naive import bilinear


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), pairs=st.integers(1, 5), m=st.integers(1, 40), grid=st.integers(2, 33))
def test_evidence_is_the_bilinear_table_at_each_sample_minus_log_z(seed: int, pairs: int, m: int, grid: int) -> None:
    """Each sample's evidence is the table read bilinearly at (u, v) minus log Z, corners and edges included."""
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=(pairs, grid, grid)).astype(np.float32)
    log_z = rng.normal(size=pairs)
    u, v = rng.uniform(size=(pairs, m)), rng.uniform(size=(pairs, m))
    u[:, :1], v[:, -1:] = 1.0, 0.0  # the square's edges
    e = evidence(theta, log_z, u, v)
    ref = np.array([[bilinear(theta[p].astype(np.float64), u[p, k], v[p, k]) - log_z[p] for k in range(m)]
                    for p in range(pairs)])  # fmt: skip
    np.testing.assert_allclose(e, ref, rtol=1e-9, atol=1e-9)


def test_evidence_names_the_shapes_it_needs() -> None:
    """Samples that do not match the tables' pairs, NaN samples and a log Z of another shape raise InputError."""
    with pytest.raises(InputError, match=r"\(P, M\) with P = 2"):
        evidence(np.zeros((2, 5, 5), np.float32), np.zeros(2), np.zeros((3, 4)), np.zeros((3, 4)))
    with pytest.raises(InputError, match="finite"):
        evidence(np.zeros((1, 5, 5), np.float32), np.zeros(1), np.full((1, 4), np.nan), np.zeros((1, 4)))
    with pytest.raises(InputError, match="log_z"):
        evidence(np.zeros((2, 5, 5), np.float32), np.zeros((2, 1)), np.zeros((2, 4)), np.zeros((2, 4)))


def test_cusum_threshold_gives_the_run_length_asked_for() -> None:
    """A CUSUM with the threshold for a mean run length of 400 samples crosses it after 200 to 800 on average."""
    rng = np.random.default_rng(502)
    drift, var = 0.1, 0.5
    h = cusum_threshold(drift, var, 400.0)
    lengths = []
    for _ in range(300):
        s, k = 0.0, 0
        while s <= h:
            s = max(0.0, s - drift + np.sqrt(var) * rng.standard_normal())
            k += 1
        lengths.append(k)
    assert 200 < np.mean(lengths) < 800  # Brownian approximation, overshoot ignored: conservative, within 2x
    assert cusum_threshold(drift, var, 4e6) > cusum_threshold(drift, var, 4e4) > h
