import math

import numpy as np
import pytest

from streamcorr.engine.changes import ChangeDetector
from streamcorr.engine.matrix import MatrixState
from streamcorr.engine.scheduler import PairSelection, Scheduler
from streamcorr.errors import ConfigError
from streamcorr.estimate.significance import NullTable

CH = ["a", "b", "c", "d"]


def test_pair_selection_modes():
    """All pairs, explicit pairs and groups x groups resolve to sorted unique index pairs."""
    assert PairSelection().resolve(CH).tolist() == [[0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]]
    assert PairSelection(pairs=(("d", "a"), ("a", "d"), ("b", "c"))).resolve(CH).tolist() == [[0, 3], [1, 2]]
    cross = PairSelection(groups=("a", "b"), groups_with=("c", "d")).resolve(CH)
    assert cross.tolist() == [[0, 2], [0, 3], [1, 2], [1, 3]]
    with pytest.raises(ConfigError, match="unknown channel 'z'"):
        PairSelection(pairs=(("a", "z"),)).resolve(CH)


def test_scheduler_refreshes_stalest_first_under_a_budget():
    """With room for 2 of 6 pairs per hop, every pair is refreshed within 3 hops and ages stay bounded."""
    sched = Scheduler(PairSelection().resolve(CH), max_pairs_per_hop=2)
    seen = []
    for hop in range(1, 10):
        idx = sched.next_pairs()
        assert len(idx) == 2
        seen.append(set(idx.tolist()))
        sched.mark_refreshed(idx, hop * 1_000_000_000)
        if hop >= 3:
            assert sched.ages_s(hop * 1_000_000_000).max() <= 2.0
    assert set().union(*seen[:3]) == set(range(6))


def _cal() -> NullTable:
    """A null flat in n_eff: 90th percentile 0.01 nats, tail scale 0.01 (so alpha = 0.1 e^-4 puts the bar at 0.05)."""
    return NullTable(512, (0.0, 7.0), (0.0, 0.0), (0.01, 0.01), (0.01, 0.01), null_std=0.01)


ALPHA = 0.1 * math.exp(-4)


def test_change_detector_hysteresis_and_persistence():
    """State flips only after `persist` evaluations beyond the band; a one-off spike raises nothing."""
    det = ChangeDetector(_cal(), ALPHA, min_effect=0.0, delta=0.2, persist=2)
    pair = ("a", "b")
    seq = [0.0, 0.2, 0.0, 0.3, 0.4, 0.03, 0.65, 0.7, 0.005, 0.004]  # 0.2 at t=1 and 0.03 at t=5 are one-offs
    events = [det.update(pair, v, t) for t, v in enumerate(seq)]
    kinds = [(t, e.kind) for t, e in enumerate(events) if e is not None]
    assert kinds == [(4, "became-dependent"), (7, "rise"), (9, "became-independent")]
    assert events[7].previous == 0.4 and events[7].current == 0.7


def test_dependent_at_first_assessment_is_reported_as_initial():
    """A pair above the bar from its first evaluation gets became-dependent marked initial; a later onset does not."""
    det = ChangeDetector(_cal(), ALPHA, min_effect=0.0, persist=2)
    first = [det.update(("a", "b"), 0.5, t) for t in range(3)]
    assert first[0] is None and first[1] is not None and first[1].initial and first[1].kind == "became-dependent"
    late = [det.update(("c", "d"), v, t) for t, v in enumerate([0.0, 0.0, 0.5, 0.5])]
    assert late[3] is not None and late[3].kind == "became-dependent" and not late[3].initial


def test_a_pair_never_seen_independent_is_initial_when_its_evidence_builds_late():
    """A pair between the two bars for several evaluations (never below independent_below) that then crosses the
    upper bar was dependent when first seen: initial; once seen independent, its next crossing is an onset."""
    det = ChangeDetector(_cal(), ALPHA, min_effect=0.0, persist=2)
    hi, lo = (float(v[0]) for v in det.thresholds(np.array([256.0])))
    mid, high = (hi + lo) / 2, hi + 0.1
    events = [det.update(("a", "b"), v, t) for t, v in enumerate([mid] * 6 + [high] * 2)]
    assert events[-1] is not None and events[-1].kind == "became-dependent" and events[-1].initial
    later = [det.update(("a", "b"), v, t) for t, v in enumerate([0.0, 0.0, high, high], start=10)]
    assert later[1] is not None and later[1].kind == "became-independent"
    assert later[3] is not None and later[3].kind == "became-dependent" and not later[3].initial


def test_a_fast_coupling_of_a_pair_never_seen_independent_is_initial_without_an_onset():
    """The fast path's became-dependent on a pair never seen independent is initial and carries no onset (the
    dependence predates what was seen); once the pair was seen independent, a fast coupling keeps its onset."""
    det = ChangeDetector(_cal(), ALPHA, min_effect=0.0, persist=1)
    hi, lo = (float(v[0]) for v in det.thresholds(np.array([256.0])))
    det.update(("a", "b"), (hi + lo) / 2, 0)  # assessed, independent, never below independent_below
    ev = det.fast_change(("a", "b"), "became-dependent", 0.5, 10, onset_t_ns=7, hold_ns=0)
    assert ev is not None and ev.initial and ev.onset_t_ns is None and ev.path == "fast"
    det.update(("c", "d"), 0.0, 0)
    ev = det.fast_change(("c", "d"), "became-dependent", 0.5, 10, onset_t_ns=7, hold_ns=0)
    assert ev is not None and not ev.initial and ev.onset_t_ns == 7


def test_thresholds_follow_the_effective_sample_size():
    """A smaller effective sample size raises both bars; a lower false-alarm rate raises the upper one."""
    table = NullTable(256, (math.log(10), math.log(256)), (0.3, 0.003), (0.6, 0.02), (0.3, 0.02), null_std=0.02)
    det = ChangeDetector(table, 1e-3, min_effect=0.0)
    hi, lo = det.thresholds(np.array([10.0, 50.0, 256.0]))
    assert hi[0] > hi[1] > hi[2] and lo[0] > lo[1] > lo[2] and (lo < hi).all()
    det.alpha = 1e-6
    assert (det.thresholds(np.array([50.0]))[0] > hi[1]).all()
    with pytest.raises(ConfigError, match="false_alarm_rate"):
        det.alpha = 0.5


def test_matrix_state_snapshot_is_symmetric_and_tracks_age():
    """Updates fill both triangles; the snapshot reports age since refresh and grows with new channels."""
    st = MatrixState(["a", "b", "c"])
    st.update(np.array([0]), np.array([2]), np.array([0.5]), np.array([1.0]), t_ns=1_000_000_000)
    snap = st.snapshot(t_ns=3_000_000_000, wall_ns=0)
    assert snap.mi[0, 2] == snap.mi[2, 0] == 0.5
    assert snap.age_s[0, 2] == 2.0 and np.isinf(snap.age_s[0, 1])
    st.add_channel("d")
    assert st.snapshot(3_000_000_000, 0).mi.shape == (4, 4) and st.seq == 2
