"""Mixed-rate pairs: white noise's bar on a pair's own rows."""

import numpy as np

from streamcorr.engine.changes import cached_calibration
from streamcorr.engine.mixed_rows import MixedRows
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
