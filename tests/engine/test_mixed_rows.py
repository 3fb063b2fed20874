"""Mixed-rate pairs: white noise's bar on a pair's own rows."""

import numpy as np
from scipy.signal import lfilter

from streamcorr.engine.changes import cached_calibration
from streamcorr.engine.core import Engine, EngineConfig
from streamcorr.engine.mixed_rows import MIN_FRESH_SHARE, MixedRows, own_shares
from streamcorr.estimate.estimator import default_estimator


def test_a_pair_on_fewer_rows_gets_white_noises_bar_on_as_many_rows():
    """The bar for a pair estimated on R rows is white noise's at R (the shipped null tables, interpolated in
    log-log between their lengths): higher the fewer the rows, equal to a table's own at its length."""
    est = default_estimator()
    mixed = MixedRows(20, 10**10)
    bars = mixed.white_above(est, np.array([128, 256, 362, 512, 1024, 4096]), 1e-4)
    for rows, bar in ((256, bars[1]), (512, bars[3]), (1024, bars[4])):
        table = cached_calibration(est.fingerprint, est.estimate_batch, rows, est.ties)
        assert np.isclose(bar, table.white_above(1e-4))
    assert bars[0] > bars[1] > bars[2] > bars[3] > bars[4] >= bars[5] > 0
    assert np.isclose(bars[2], np.sqrt(bars[1] * bars[3]), rtol=0.01)  # 362 rows: halfway in log between 256 and 512


def test_only_a_faster_channel_that_renews_its_noise_gets_the_second_test():
    """Effective samples per sample on a channel's own samples: white noise and a noisy reading keep most, a smooth
    AR and a near-random walk few; a 100 Hz walk beside an independent 20 Hz channel gets no second (every-new-row)
    test, whose near-copy rows and circular-shift null would read it as dependent."""
    rng = np.random.default_rng(29)
    n = 1024
    walk = lfilter([1.0], [1.0, -0.999], rng.standard_normal(n + 3000))[3000:]
    smooth = lfilter([1.0], [1.0, -0.95], rng.standard_normal(n + 3000))[3000:]
    noisy = np.repeat(rng.standard_normal(n // 5 + 1), 5)[:n] + 1.5 * rng.standard_normal(n)
    rows = np.stack([rng.standard_normal(n), noisy, smooth, walk])
    white, reading, ar, drift = own_shares(rows, np.ones(rows.shape, dtype=bool), np.arange(4))
    assert white > 0.6 and reading > MIN_FRESH_SHARE > ar > drift and drift < 0.05
    t_fast = 1_732_700_000.0 + np.arange(9000) / 100.0
    t_slow = t_fast[::5] + 0.013
    slow = lfilter([1.0], [1.0, -0.9], rng.standard_normal(len(t_slow)))
    fast = lfilter([1.0], [1.0, -0.999], rng.standard_normal(len(t_fast)))
    eng = Engine(EngineConfig(channels=["fast", "slow"], window_len=1024, hop_samples=100, rate_hz=100.0,
                              skip_stale_hops=False, max_future_s=None))  # fmt: skip
    eng.push("fast", t_fast, fast)
    eng.push("slow", t_slow, slow)
    hops = [eng.evaluate(end)[0] for end in eng.due_windows()]
    assert len(hops) > 50 and eng.mixed.counts["second_row_pairs"] == 0
    assert not any(s.dependent[0, 1] for s in hops)
