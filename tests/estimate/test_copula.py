import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from streamcorr.errors import InputError
from streamcorr.estimate.copula import _radix_argsort, marginal_histograms, pair_histograms, rank_transform
from tests.naive import jittered_ranks, linear_binned_hist, midranks

# Small integer-valued floats make ties frequent, as with quantised sensors.
tied_rows = arrays(np.float64, st.integers(1, 60), elements=st.integers(-5, 5).map(float))
any_rows = arrays(np.float64, st.integers(1, 60), elements=st.floats(-1e6, 1e6, allow_nan=False))
# every finite double: signed zeros, subnormals, the extremes; the sort keys span all 64 bits
wide_rows = arrays(np.float64, st.integers(0, 300), elements=st.floats(allow_nan=False, allow_infinity=False))


@settings(max_examples=300, deadline=None)
@given(st.one_of(tied_rows, any_rows, wide_rows))
def test_radix_argsort_equals_stable_argsort(x):
    """The radix argsort behind the rank transform equals numpy's stable argsort, up to -0.0 and 0.0."""
    order = np.empty(x.shape[0], np.int64)
    _radix_argsort(x, order)
    # numpy treats -0.0 and 0.0 as equal and keeps index order; the keys put -0.0 first
    expected = np.lexsort((np.arange(x.shape[0]), ~np.signbit(x), x))
    np.testing.assert_array_equal(order, expected)


@settings(max_examples=200, deadline=None)
@given(st.one_of(tied_rows, any_rows))
def test_ranks_match_naive_reference(x):
    """Mid-ranks of any finite series, ties included, equal the counting reference."""
    np.testing.assert_allclose(rank_transform(x)[0], midranks(x), rtol=0, atol=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.one_of(tied_rows, any_rows))
def test_jittered_ranks_match_naive_reference(x):
    """The deterministic jitter tie policy equals its counting reference, ties included."""
    np.testing.assert_allclose(rank_transform(x, ties="jitter")[0], jittered_ranks(x), rtol=0, atol=1e-12)


@settings(max_examples=100, deadline=None)
@given(st.one_of(tied_rows, any_rows))
def test_jittered_ranks_are_a_permutation_inside_each_tie_group(x):
    """Jittered ranks are all distinct, and each tied group occupies exactly its mid-rank interval."""
    n = x.shape[0]
    u, mid = rank_transform(x, ties="jitter")[0], rank_transform(x)[0]
    np.testing.assert_allclose(np.sort(u * n - 0.5), np.arange(n), atol=1e-9)
    for value in np.unique(x):
        sel = x == value
        np.testing.assert_allclose(u[sel].mean(), mid[sel][0], atol=1e-12)


def test_jitter_is_deterministic_and_monotone_invariant():
    """The same window, or a strictly increasing map of it, gives bit-identical jittered ranks."""
    rng = np.random.default_rng(4)
    x = rng.integers(0, 5, size=300).astype(float)
    u = rank_transform(x, ties="jitter")
    assert np.array_equal(u, rank_transform(x.copy(), ties="jitter"))
    assert np.array_equal(u, rank_transform(np.exp(x) - 3.0, ties="jitter"))


@settings(max_examples=60, deadline=None)
@given(st.one_of(tied_rows, any_rows), st.integers(0, 2**64 - 1))
def test_salted_jitter_matches_naive_reference(x, salt):
    """A row's salt enters the jitter's digest exactly as in the counting reference."""
    got = rank_transform(x, ties="jitter", salts=np.array([salt], dtype=np.uint64))[0]
    np.testing.assert_allclose(got, jittered_ranks(x, salt), rtol=0, atol=1e-12)


def test_rows_with_one_tie_structure_get_unrelated_orders():
    """A row's jittered ranks depend on it alone (not on its place in the call); a quantised series and a strictly
    increasing map of it (the same tie structure) share an order unless salted apart: pair_ranks salts the
    second of such a pair, and the engine's name salts differ; a name's salt is stable across processes."""
    from streamcorr.estimate.salts import name_salt, pair_ranks

    rng = np.random.default_rng(6)
    x = rng.integers(0, 3, size=20_000).astype(float)
    other = rng.integers(0, 5, size=20_000).astype(float)
    u = rank_transform(np.stack([other, x, 2 * x + 1]), ties="jitter")
    assert np.array_equal(u[1], rank_transform(x, ties="jitter")[0]) and np.array_equal(u[1], u[2])
    mid = rank_transform(x)[0]
    v = pair_ranks(np.stack([other, x]), np.stack([x, 2 * x + 1]), "jitter")  # pairs (other, x) and (x, 2x + 1)
    assert np.array_equal(v[1], u[1]) and np.array_equal(v[2], u[1])  # x: its own order in any pair
    assert abs(np.corrcoef(v[1] - mid, v[3] - mid)[0, 1]) < 0.03  # SE of a correlation at n = 20000 is 0.007
    salts = np.array([name_salt("a.temp"), name_salt("b.temp")], dtype=np.uint64)
    w = rank_transform(np.stack([x, x]), ties="jitter", salts=salts)
    assert abs(np.corrcoef(w[0] - mid, w[1] - mid)[0, 1]) < 0.03
    assert name_salt("a.temp") == 0x34743533F013A5A7 and name_salt("a.temp") != name_salt("b.temp")
    with pytest.raises(InputError, match="one value per row"):
        rank_transform(np.stack([x, x]), ties="jitter", salts=salts[:1])


def test_jitter_does_not_correlate_independent_quantised_series():
    """Two independent binary series keep a near-zero rank correlation after jittering (no shared order)."""
    rng = np.random.default_rng(5)
    x, y = rng.integers(0, 2, size=(2, 20_000)).astype(float)
    u = rank_transform(np.stack([x, y]), ties="jitter")
    assert abs(np.corrcoef(u)[0, 1]) < 0.03  # SE of a correlation at n = 20000 is 0.007


def test_unknown_tie_policy_is_rejected():
    """A misspelt tie policy names the accepted ones."""
    from streamcorr.estimate.copula import SlidingRanks

    with pytest.raises(InputError, match="'mid' or 'jitter'"):
        rank_transform([1.0, 2.0], ties="random")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="'mid' or 'jitter'"):
        SlidingRanks(1, 4, ties="avg")  # type: ignore[arg-type]


def test_batched_rows_are_ranked_independently():
    """Each row of a (N, T) batch is ranked on its own."""
    rng = np.random.default_rng(1)
    x = rng.integers(0, 7, size=(5, 40)).astype(float)
    u = rank_transform(x)
    for r in range(5):
        np.testing.assert_allclose(u[r], midranks(x[r]), atol=1e-12)


@pytest.mark.parametrize(
    "transform",
    [np.exp, lambda v: v**3, lambda v: 3.0 * v - 7.0, np.arctan, lambda v: np.sign(v) * np.abs(v) ** 1.5],
)
def test_strictly_increasing_map_leaves_ranks_identical(transform):
    """A strictly increasing map of x gives bit-identical copula values (the model input)."""
    rng = np.random.default_rng(2)
    x = np.round(rng.standard_normal(500), 1)  # rounding adds ties
    u, v = rank_transform(x)[0], rank_transform(transform(x))[0]
    assert np.array_equal(u, v)
    h1 = pair_histograms(u[None], u[None], 16)
    h2 = pair_histograms(v[None], v[None], 16)
    assert np.array_equal(h1, h2)


@settings(max_examples=50, deadline=None)
@given(st.integers(2, 12), st.integers(1, 80), st.integers(0, 2**32 - 1))
def test_histogram_matches_naive_linear_binning(grid, t, seed):
    """Joint and marginal histograms equal the one-sample-at-a-time reference and sum to T."""
    rng = np.random.default_rng(seed)
    u, v = rng.uniform(size=(1, t)), rng.uniform(size=(1, t))
    u[0, 0], v[0, -1] = 0.0, 1.0  # both grid ends
    h = pair_histograms(u, v, grid)[0]
    np.testing.assert_allclose(h, linear_binned_hist(u[0], v[0], grid), atol=1e-4)
    assert h.sum() == pytest.approx(t, rel=1e-5)
    np.testing.assert_allclose(marginal_histograms(u, grid)[0], h.sum(axis=1), atol=1e-4)


def test_pair_indices_select_rows():
    """Index arrays pick which rows of u and v form each pair, so ranks are shared across pairs."""
    rng = np.random.default_rng(3)
    u = rng.uniform(size=(4, 50))
    h = pair_histograms(u, u, 8, np.array([0, 2, 3]), np.array([1, 1, 0]))
    np.testing.assert_allclose(h[1], linear_binned_hist(u[2], u[1], 8), atol=1e-4)
    np.testing.assert_allclose(h[2], linear_binned_hist(u[3], u[0], 8), atol=1e-4)


@pytest.mark.parametrize(
    ("x", "match"),
    [
        ([[1.0, np.nan]], "NaN or inf"),
        ([[1.0, np.inf]], "NaN or inf"),
        (np.zeros((2, 2, 2)), "1-D"),
        (np.zeros((1, 0)), "no samples"),
        ([["a", "b"]], "numeric"),
    ],
)
def test_rank_transform_rejects_bad_input(x, match):
    """Bad input to the rank transform raises InputError naming the problem."""
    with pytest.raises(InputError, match=match):
        rank_transform(x)


def test_histogram_rejects_values_outside_unit_interval():
    """Histograms accept only copula values; raw data gets a pointer to rank_transform."""
    with pytest.raises(InputError, match="rank_transform"):
        pair_histograms(np.array([[0.5, 2.0]]), np.array([[0.5, 0.5]]), 8)
    with pytest.raises(InputError, match="out of range"):
        pair_histograms(np.full((1, 3), 0.5), np.full((1, 3), 0.5), 8, np.array([1]), np.array([0]))


def test_large_batches_split_across_threads_match_reference():
    """Batches big enough to be sorted on several threads give the same mid-ranks as scipy's rankdata."""
    from scipy.stats import rankdata

    rng = np.random.default_rng(11)
    x = rng.integers(0, 50, size=(64, 1500)).astype(float)
    expected = (rankdata(x, method="average", axis=1) - 0.5) / x.shape[1]
    np.testing.assert_allclose(rank_transform(x), expected, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 40),
    st.lists(st.integers(1, 50), min_size=1, max_size=12),
    st.integers(0, 2**32 - 1),
    st.sampled_from(["mid", "jitter"]),
)
def test_sliding_ranks_equal_full_reranking_on_every_hop(window_len, hops, seed, ties):
    """After every hop, incremental ranks equal rank_transform of the current window, ties included, per policy."""
    from streamcorr.estimate.copula import SlidingRanks

    rng = np.random.default_rng(seed)
    salts = rng.integers(0, 2**63, size=3).astype(np.uint64) if seed % 2 else None  # explicit, or row indices
    sr = SlidingRanks(n_channels=3, window_len=window_len, ties=ties, salts=salts)
    stream = np.empty((3, 0))
    for h in hops:
        new = rng.integers(0, 6, size=(3, h)).astype(float)  # few levels: many ties
        stream = np.concatenate([stream, new], axis=1)
        window = stream[:, -window_len:]
        np.testing.assert_allclose(sr.update(new), rank_transform(window, ties=ties, salts=salts), atol=1e-12)


def test_sliding_ranks_reject_nonfinite_and_wrong_shape():
    """Sliding ranks need finite samples and one row per channel."""
    from streamcorr.estimate.copula import SlidingRanks

    sr = SlidingRanks(n_channels=2, window_len=8)
    with pytest.raises(InputError, match="NaN or inf"):
        sr.update(np.array([[1.0], [np.nan]]))
    with pytest.raises(InputError, match="shape"):
        sr.update(np.zeros((3, 1)))
