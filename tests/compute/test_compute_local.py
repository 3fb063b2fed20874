"""The in-process compute backend: the estimator's results, counted, and a stop honoured between model batches."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from streamcorr.compute.local import EngineStopping, LocalEvaluator, stoppable
from streamcorr.estimate.copula import rank_transform
from streamcorr.estimate.estimator import default_estimator


def _ranks(rng: np.random.Generator, c: int, t: int) -> np.ndarray:
    x = rng.standard_normal((c, t))
    x[1] = x[0] ** 2 + 0.2 * rng.standard_normal(t)  # rows 0 and 1 dependent (not monotonically)
    return rank_transform(x)


def test_the_local_evaluator_gives_the_estimators_figures_and_counts_them():
    """LocalEvaluator.estimate equals Estimator.estimate_ranks on the same rows; its counters add up."""
    rng = np.random.default_rng(51)
    u = _ranks(rng, 6, 256)
    iu, iv = np.array([0, 0, 2, 3]), np.array([1, 2, 4, 5])
    est = default_estimator()
    ev = LocalEvaluator(est)
    mi = ev.estimate(u, iu, iv, np.zeros(6, dtype=bool))
    np.testing.assert_allclose(mi, est.estimate_ranks(u, iu, iv, np.zeros(6, dtype=bool)), atol=1e-6)
    assert mi[0] > 0.3 and np.all(mi[1:] < 0.1)
    c = ev.counters()
    assert (c["hops"], c["pairs"], c["pairs_done"]) == (1, 4, 4) and c["seconds"] > 0


def test_a_set_stop_flag_ends_estimation_before_the_next_batch():
    """With the engine's stop flag set, every estimation entry point raises EngineStopping at once; cleared, the
    same handle estimates as the estimator it wraps."""
    rng = np.random.default_rng(52)
    u = _ranks(rng, 4, 128)
    iu, iv = np.array([0, 1]), np.array([1, 2])
    stop = threading.Event()
    est = stoppable(default_estimator(), stop)
    stop.set()
    with pytest.raises(EngineStopping):
        est.estimate_ranks(u, iu, iv)
    with pytest.raises(EngineStopping):
        est.estimate_batch(u[:1], u[1:2])
    stop.clear()
    np.testing.assert_allclose(est.estimate_ranks(u, iu, iv), default_estimator().estimate_ranks(u, iu, iv), atol=1e-6)
    assert default_estimator().between_batches is None  # the shared estimator keeps no engine's flag
    ev = LocalEvaluator(default_estimator(), stop)
    stop.set()
    with pytest.raises(EngineStopping):
        ev.estimate(u, iu, iv, np.zeros(4, dtype=bool))
