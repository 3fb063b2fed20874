"""The engine's incremental ranks follow the estimator's tie policy (issue 13)."""

import asyncio
import functools

import numpy as np
import pytest

from streamcorr import Estimator
from streamcorr.engine.core import Engine, EngineConfig

RATE = 50.0


@functools.cache
def _run(ties: str, seed: int = 7) -> Engine:
    """Quantised sensors through several hops (so the sliding ranks are updated, not rebuilt), and a constant."""
    est = Estimator(ties=ties)  # type: ignore[arg-type]

    async def run() -> Engine:
        cfg = EngineConfig(channels=["x", "y", "z", "const"], rate_hz=RATE, window_len=256, hop_samples=64,
                           max_staleness_s=0.05, skip_stale_hops=False, queue_size=10_000)  # fmt: skip
        eng = Engine(cfg, estimator=est)
        rng = np.random.default_rng(seed)
        async with eng:
            for k in range(640):
                tk = k / RATE
                x = rng.standard_normal()
                eng.push("x", tk, np.round(2 * x))  # about 9 levels: many ties
                eng.push("y", tk, np.round(x + 0.5 * rng.standard_normal()))
                eng.push("z", tk, float(rng.integers(0, 4)))  # independent, 4 levels
                eng.push("const", tk, 3.0)
                await eng.flush()
        return eng

    return asyncio.run(run())


@pytest.mark.parametrize("ties", ["jitter", "mid"])
def test_engine_matches_estimator_matrix_on_the_same_window(ties):
    """With tied (quantised) samples, the engine's MI after many incremental hops equals Estimator.matrix and
    estimate_batch on the same window under the same tie policy; a constant channel gives exactly 0."""
    eng = _run(ties)
    est = eng.est
    assert eng.counters.hops >= 5
    assert eng.latest is not None and eng._last_window is not None
    names, window = eng._last_window
    assert list(eng.latest.channels) == list(names) and np.isfinite(window).all()
    want = est.matrix(window)
    got = eng.latest.mi
    off = ~np.eye(len(names), dtype=bool)
    np.testing.assert_allclose(got[off], want[off], rtol=0, atol=1e-5)
    i, j = np.triu_indices(len(names), 1)
    np.testing.assert_allclose(got[i, j], est.estimate_batch(window[i], window[j]), rtol=0, atol=1e-5)
    c = list(names).index("const")
    assert np.all(got[c, off[c]] == 0.0)


def test_tie_policy_changes_the_engine_result_on_tied_data():
    """The comparison above is not vacuous: mid-ranks and jitter give different MI on these quantised channels,
    and an engine built without an estimator takes the default estimator's policy."""
    jit, mid = _run("jitter"), _run("mid")
    ix, iy = 0, 1
    assert abs(jit.latest.mi[ix, iy] - mid.latest.mi[ix, iy]) > 1e-3
    eng = Engine(EngineConfig(channels=["a", "b"], rate_hz=RATE, window_len=256, hop_samples=64))
    assert eng.est.ties == Estimator().ties
