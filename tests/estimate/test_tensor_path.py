"""The device path (ranks -> GEMM histograms -> InfoNet -> MI) run on CPU tensors, against the Numba path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streamcorr.errors import InputError
from streamcorr.estimate import tensor_path
from streamcorr.estimate.copula import marginal_histograms, pair_histograms, rank_transform
from streamcorr.estimate.estimator import Estimator
from streamcorr.estimate.tensor_path import TensorPath, bin_weights


@pytest.fixture(scope="module")
def est() -> Estimator:
    return Estimator()


def channels(seed: int, c: int = 10, t: int = 512) -> np.ndarray:
    """Independent, linear, non-monotone, quantised and constant channels."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((c, t))
    x[1] = x[0] + 0.5 * rng.standard_normal(t)
    x[3] = np.abs(x[2]) + 0.2 * rng.standard_normal(t)
    x[5] = np.round(2 * x[4])  # ties
    x[6] = 7.0  # constant
    return x


def test_bin_weights_match_marginal_histograms() -> None:
    """Column sums of the bin weights are the linear-binned marginals, and each sample's weights sum to 1."""
    u = rank_transform(channels(0))
    w = bin_weights(torch.from_numpy(u), 64)
    np.testing.assert_allclose(w.sum(dim=2).numpy(), 1.0, atol=1e-6)
    np.testing.assert_allclose(w.sum(dim=1).numpy(), marginal_histograms(u, 64), rtol=1e-5, atol=1e-3)


def test_gemm_histograms_equal_numba_histograms() -> None:
    """W_a^T W_b is the linear-binned joint histogram of copula.pair_histograms."""
    u = rank_transform(channels(1))
    i, j = np.triu_indices(u.shape[0], 1)
    w = bin_weights(torch.from_numpy(u), 64)
    gemm = torch.bmm(w[i].transpose(1, 2), w[j]).numpy()
    np.testing.assert_allclose(gemm, pair_histograms(u, u, 64, i, j), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("seed", [2, 3])
def test_tensor_path_equals_histogram_path(est: Estimator, seed: int) -> None:
    """On CPU tensors the device path gives the Numba path's MI for every pair, constant channels exactly 0."""
    u = rank_transform(channels(seed))
    i, j = np.triu_indices(u.shape[0], 1)
    path = TensorPath(est.model, grid=est.grid, device=est.device, batch_size=7)  # several batches, one partial
    got = path.estimate(u, i, j)
    marg = marginal_histograms(u, est.grid)
    ref = est.estimate_histograms(pair_histograms(u, u, est.grid, i, j), marg[i], marg[j])
    constant = (i == 6) | (j == 6)
    np.testing.assert_allclose(got[~constant], ref[~constant], atol=1e-5)
    assert (got[constant] == 0.0).all()
    assert got[(i == 0) & (j == 1)][0] > 0.2 and got[(i == 2) & (j == 3)][0] > 0.2


def test_estimate_ranks_matches_matrix(est: Estimator) -> None:
    """estimate_ranks on shared ranks gives the same MI as Estimator.matrix on the raw channels."""
    x = channels(4)
    i, j = np.triu_indices(x.shape[0], 1)
    u = rank_transform(x, est.ties)  # the estimator's tie policy: channels() has tied (quantised) rows
    constant = x.min(axis=1) == x.max(axis=1)  # jittered ranks of a constant are spread out: the mask makes MI 0
    np.testing.assert_allclose(est.estimate_ranks(u, i, j, constant), est.matrix(x)[i, j], atol=1e-6)


def test_bf16_autocast_stays_within_tolerance(est: Estimator) -> None:
    """bf16 autocast moves no estimate by more than 0.005 nats (the table and read-out stay fp32)."""
    u = rank_transform(channels(5, c=16, t=1024))
    i, j = np.triu_indices(u.shape[0], 1)
    fp32 = TensorPath(est.model, grid=est.grid, device=est.device, batch_size=64).estimate(u, i, j)
    bf16 = TensorPath(est.model, grid=est.grid, device=est.device, batch_size=64, amp=True).estimate(u, i, j)
    assert np.abs(bf16 - fp32).max() < 0.005


def test_timed_split_accounts_every_stage(est: Estimator) -> None:
    """A timed path records time in every stage and counts the pairs it evaluated."""
    u = rank_transform(channels(6))
    i, j = np.triu_indices(u.shape[0], 1)
    path = TensorPath(est.model, grid=est.grid, device=est.device, timed=True)
    path.estimate(u, i, j)
    split = path.split.as_dict()
    assert split["pairs"] == len(i) and split["calls"] == 1
    assert all(split[k] > 0 for k in ("weights_s", "histograms_s", "model_s"))


def test_bad_pair_indices_are_refused(est: Estimator) -> None:
    """Out-of-range or mismatched pair indices raise InputError naming the problem."""
    u = rank_transform(channels(7))
    path = TensorPath(est.model, grid=est.grid, device=est.device)
    with pytest.raises(InputError, match="out of range"):
        path.estimate(u, np.array([0]), np.array([99]))
    with pytest.raises(InputError, match="equal length"):
        path.estimate(u, np.array([0, 1]), np.array([2]))


@pytest.mark.parametrize(("batch", "n_pairs", "sparsity"), [(1, 40, 16), (9, 40, 16), (50, 40, 16), (400, 8, 16),
                                                       (36, 60, 2), (36, 60, 10**6), (4, 40, 1)])  # fmt: skip
def test_block_gemm_histograms_serve_any_pair_list(
    est: Estimator, batch: int, n_pairs: int, sparsity: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pairs in any order, either orientation, repeated, spread over several channel blocks (tile = isqrt(batch)),
    block pairs dense enough for the GEMM and sparse ones for the gathered product (the share set by
    GEMM_SPARSITY): each pair gets the Numba path's MI, in the caller's order."""
    monkeypatch.setattr(tensor_path, "GEMM_SPARSITY", sparsity)
    rng = np.random.default_rng(batch)
    x = rng.standard_normal((13, 300)).cumsum(axis=1)  # random walks: smooth channels
    x[7] = np.round(x[2] / 3)  # a quantised copy, in another block
    u = rank_transform(x)
    iu = rng.integers(0, 13, n_pairs)
    iv = (iu + rng.integers(1, 13, n_pairs)) % 13
    iu[5], iv[5], iu[6], iv[6] = 2, 7, 7, 2  # both orientations of one pair
    iu[3], iv[3] = iu[4], iv[4]  # a repeat
    got = TensorPath(est.model, grid=est.grid, device=est.device, batch_size=batch).estimate(u, iu, iv)
    marg = marginal_histograms(u, est.grid)
    ref = est.estimate_histograms(pair_histograms(u, u, est.grid, iu, iv), marg[iu], marg[iv])
    np.testing.assert_allclose(got, ref, atol=1e-5)
    assert got[5] > 0.3


def test_windows_longer_than_trained_are_read_at_the_trained_count(est: Estimator) -> None:
    """A window longer than the network was trained on (8,192 samples) is read from its histogram scaled to that
    count, on the histogram path and the device path alike: Gaussian pairs of 60,000 samples read within 0.04
    nats of their MI up to 1.16 nats (means over 3 other seeds: -0.006 to -0.028), where read unscaled they
    sink by up to 0.09; an independent pair stays near 0."""
    rng = np.random.default_rng(17)
    n, rhos = 60_000, (0.0, 0.6, 0.8, 0.95)
    x = rng.standard_normal((len(rhos), n))
    y = np.stack([r * x[k] + np.sqrt(1 - r * r) * rng.standard_normal(n) for k, r in enumerate(rhos)])
    u = rank_transform(np.concatenate([x, y]))
    i, j = np.arange(len(rhos)), np.arange(len(rhos)) + len(rhos)
    truth = -0.5 * np.log(1 - np.square(rhos))
    marg = marginal_histograms(u, est.grid)
    cpu = est.estimate_histograms(pair_histograms(u, u, est.grid, i, j), marg[i], marg[j])
    dev = TensorPath(est.model, grid=est.grid, device=est.device, batch_size=3).estimate(u, i, j)
    unscaled = TensorPath(est.model, grid=est.grid, device=est.device, max_window=10**9).estimate(u, i, j)
    np.testing.assert_allclose(cpu, truth, atol=0.04)
    np.testing.assert_allclose(dev, cpu, atol=1e-5)
    assert (np.abs(cpu - truth)[1:] < np.abs(unscaled - truth)[1:]).all(), (cpu, unscaled, truth)
    h = torch.ones(2, 4, 4)
    same = tensor_path.trained_counts(h, h.sum(2), h.sum(1), 8)  # 16 samples each, 8 trained: halved
    assert torch.equal(same[0], h / 2) and torch.equal(same[1], h.sum(2) / 2)
