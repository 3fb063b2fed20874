from pathlib import Path

import numpy as np
import pytest

import streamcorr
from streamcorr import Estimator, InputError, ModelLoadError, estimate_mi, estimate_mi_batch, sliced_mi


@pytest.fixture(scope="module")
def est() -> Estimator:
    return Estimator()


def _gaussian(rng: np.random.Generator, rho: float, t: int) -> np.ndarray:
    return rng.multivariate_normal([0.0, 0.0], [[1.0, rho], [rho, 1.0]], size=t).T


def test_shipped_weights_load_without_network(est):
    """The default estimator loads the committed safetensors weights and their metadata."""
    assert est.meta["config"]["grid"] == est.grid
    assert est.meta["step"] > 0
    shipped = Path(streamcorr.__file__).parent / "data" / "infonet-v2.safetensors"
    assert shipped.is_file()
    if shipped.is_symlink():  # a source checkout: the one copy lives in models/ (a wheel holds the file itself)
        assert shipped.resolve().parent.name == "models"


@pytest.mark.parametrize("rho", [0.0, 0.6, -0.9])
def test_gaussian_known_truth(est, rho):
    """Mean estimate over 8 Gaussian windows (T = 2000) is within 0.05 nats of -0.5 log(1 - rho^2).

    0.05 is the accuracy bar of the estimator; the spread of one estimate at T = 2000
    is about 0.02, so the mean of 8 sits well inside it when the model is unbiased.
    """
    rng = np.random.default_rng(100 + int(10 * rho))
    pairs = np.stack([_gaussian(rng, rho, 2000) for _ in range(8)])
    mi = est.estimate_batch(pairs[:, 0], pairs[:, 1])
    assert abs(mi.mean() - (-0.5 * np.log1p(-rho * rho))) <= 0.05


def test_monotone_maps_do_not_change_the_estimate(est):
    """MI is invariant to strictly increasing maps, and the estimate is identical, not just close."""
    rng = np.random.default_rng(4)
    x, y = _gaussian(rng, 0.7, 1000)
    assert est.estimate(x, y) == est.estimate(np.exp(x), y**3)


def test_same_input_same_output_and_batch_matches_single(est):
    """Estimates are deterministic, and a pair's estimate does not depend on its batch."""
    rng = np.random.default_rng(5)
    pairs = np.stack([_gaussian(rng, r, 500) for r in (0.1, 0.5, 0.8)])
    a = est.estimate_batch(pairs[:, 0], pairs[:, 1])
    b = est.estimate_batch(pairs[:, 0], pairs[:, 1])
    assert np.array_equal(a, b)
    assert est.estimate(pairs[1, 0], pairs[1, 1]) == pytest.approx(a[1], abs=1e-6)


def test_module_level_api():
    """estimate_mi, estimate_mi_batch and sliced_mi work from the package namespace."""
    rng = np.random.default_rng(6)
    x, y = _gaussian(rng, 0.8, 1000)
    assert estimate_mi(list(x), list(y)) > 0.3
    out = estimate_mi_batch(np.stack([x, x]), np.stack([y, rng.standard_normal(1000)]))
    assert out.shape == (2,) and out[0] > 0.3 and out[1] < 0.05


def test_sliced_mi_separates_dependent_from_independent():
    """Sliced MI of linearly coupled vectors exceeds that of independent ones, deterministically per seed."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1000, 8))
    y_dep = (x + rng.standard_normal((1000, 8))) / np.sqrt(2)
    y_ind = rng.standard_normal((1000, 8))
    dep = sliced_mi(x, y_dep, n_projections=64, seed=1)
    assert dep > sliced_mi(x, y_ind, n_projections=64, seed=1) + 0.02
    assert dep == sliced_mi(x, y_dep, n_projections=64, seed=1)


def test_lookup_table_of_a_pair(est):
    """table() returns the G x G discriminant and node positions; it is high on the diagonal for rho > 0."""
    rng = np.random.default_rng(8)
    x, y = _gaussian(rng, 0.9, 2000)
    theta, nodes = est.table(x, y)
    assert theta.shape == (est.grid, est.grid) and nodes[0] == 0.0 and nodes[-1] == 1.0
    assert np.diag(theta).mean() > np.fliplr(theta).diagonal().mean() + 1.0


def test_constant_series_has_zero_mi(est):
    """A constant series carries no information: MI is exactly 0, documented rather than an error."""
    rng = np.random.default_rng(9)
    assert est.estimate(np.full(200, 3.0), rng.standard_normal(200)) == 0.0
    assert est.estimate_batch(np.ones((2, 100)), np.ones((2, 100))).tolist() == [0.0, 0.0]


@pytest.mark.parametrize(
    ("x", "y", "match"),
    [
        (np.zeros(100), np.zeros(99), "same length"),
        (np.zeros((2, 100)), np.zeros((2, 100)), "estimate_mi_batch"),
        ([1.0, None] * 50, np.arange(100.0), "holds None"),
        (np.array([None] * 100), np.arange(100.0), "holds None"),
        (np.arange(10.0), np.arange(10.0), "at least 32"),
        (np.r_[np.nan, np.arange(99.0)], np.arange(100.0), "NaN or inf"),
        (np.r_[np.inf, np.arange(99.0)], np.arange(100.0), "nonfinite='drop'"),
        (["a"] * 100, np.arange(100.0), "numeric"),
        (None, None, "real numbers"),
        (np.arange(100.0) * 1j, np.arange(100.0), "real numbers"),
    ],
)
def test_bad_input_to_estimate(est, x, y, match):
    """Each bad input raises InputError with the problem and the fix, never a torch or Numba error."""
    with pytest.raises(InputError, match=match):
        est.estimate(x, y)


@pytest.mark.parametrize(
    ("x", "y", "match"),
    [
        (np.zeros((2, 100)), np.zeros((3, 100)), "same shape"),
        (np.zeros(100), np.zeros(100), "2-D"),
        (np.zeros((2, 5, 5)), np.zeros((2, 5, 5)), "2-D"),
        (np.zeros((2, 20)), np.zeros((2, 20)), "at least 32"),
    ],
)
def test_bad_input_to_estimate_batch(est, x, y, match):
    """Batch shape errors name the expected (P, T) layout."""
    with pytest.raises(InputError, match=match):
        est.estimate_batch(x, y)


def test_nonfinite_drop_option():
    """With nonfinite='drop', pairs with a NaN or inf on either side are dropped before ranking."""
    est = Estimator(nonfinite="drop")
    rng = np.random.default_rng(10)
    x, y = _gaussian(rng, 0.8, 600)
    xd, yd = x.copy(), y.copy()
    xd[::7], yd[3::11] = np.nan, np.inf
    keep = np.isfinite(xd) & np.isfinite(yd)
    assert est.estimate(xd, yd) == pytest.approx(est.estimate(x[keep], y[keep]), abs=1e-6)
    xd[:590] = np.nan
    with pytest.raises(InputError, match="after dropping non-finite"):
        est.estimate(xd, yd)


def test_bad_constructor_arguments(tmp_path):
    """Missing or corrupt weights and impossible settings fail at construction with a clear message."""
    with pytest.raises(ModelLoadError, match="not found"):
        Estimator(tmp_path / "nope.safetensors")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(ModelLoadError, match="corrupt"):
        Estimator(bad)
    with pytest.raises(InputError, match="device"):
        Estimator(device="tpu")
    with pytest.raises(InputError, match="batch_size"):
        Estimator(batch_size=0)
    with pytest.raises(InputError, match="nonfinite"):
        Estimator(nonfinite="ignore")  # type: ignore[arg-type]


def test_sliced_mi_rejects_mismatched_samples():
    """Sliced MI needs the same number of samples on both sides."""
    with pytest.raises(InputError, match="same number of samples"):
        sliced_mi(np.zeros((100, 3)), np.zeros((90, 3)))


def test_a_quantised_reading_and_its_increasing_map_read_their_entropy(est):
    """A quantised series and a strictly increasing map of it (another unit) share their tie structure: estimate,
    estimate_batch and matrix read about the entropy of the levels, as a decreasing map does, not the ~4.6 nats
    of an exact copy; the result does not depend on the argument order."""
    rng = np.random.default_rng(47)
    q = np.digitize(rng.standard_normal(2000), [-0.67, 0.0, 0.67]).astype(float)  # 4 levels: ln 4 = 1.386 nats
    f = 1.8 * q + 32.0
    assert abs(est.estimate(q, f) - np.log(4)) < 0.1 and abs(est.estimate(q, -f) - np.log(4)) < 0.1
    assert est.estimate(q, f) == est.estimate(f, q)
    m = est.matrix(np.stack([q, f, rng.standard_normal(2000)]))
    assert abs(m[0, 1] - np.log(4)) < 0.1 and m[0, 2] < 0.05


def test_mi_is_one_number_for_a_pair_and_its_transpose(est):
    """estimate, estimate_batch, matrix and estimate_ranks read (x, y) and (y, x) as one pair: the same MI to the last
    bit, on continuous, quantised and short windows (the network alone reads a transpose up to 0.03 nats apart)."""
    rng = np.random.default_rng(48)
    for t in (64, 205, 1000):
        x = rng.standard_normal(t)
        ys = [x + rng.standard_normal(t), np.round(np.cumsum(rng.standard_normal(t)) * 0.5), np.round(2 * x) / 2]
        for y in ys:
            assert est.estimate(x, y) == est.estimate(y, x)
        xs, yy = np.stack([x] * 3), np.stack(ys)
        assert np.array_equal(est.estimate_batch(xs, yy), est.estimate_batch(yy, xs))
        d = np.stack([x, *ys])
        m, flipped = est.matrix(d), est.matrix(d[::-1])
        assert np.array_equal(m, flipped[::-1, ::-1], equal_nan=True)


def test_a_relation_turning_over_many_times_is_beyond_the_table(est):
    """The model card's limitation, measured: an unwrapped angle against its wrapped value reads high over a
    turn, less over ten, and near 0 over thirty (finer than the 64-node table); ``i mod 7`` reads 0."""
    rng = np.random.default_rng(3)
    mi = []
    for turns in (1, 3, 10, 30):
        angle = np.cumsum(np.abs(rng.normal(1.0, 0.3, 1024)))
        angle *= turns * 2 * np.pi / angle[-1]
        mi.append(est.estimate(angle, np.mod(angle, 2 * np.pi)))
    assert mi[0] > 4.0 and mi[0] > mi[1] > mi[2] > mi[3] and mi[3] < 0.05, mi
    assert est.estimate(np.arange(1000.0), np.arange(1000.0) % 7) < 0.05
