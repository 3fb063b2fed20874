import numpy as np
import pytest
import torch

from streamcorr.estimate.model import InfoNet, InfoNetConfig, dv_readout, input_features, log_mean_exp, unrolled_mlp
from tests.naive import bilinear, linear_binned_hist


def _discrete(p: np.ndarray) -> tuple[torch.Tensor, ...]:
    """Histogram and marginals of a distribution on grid nodes, as T = 1000 samples would give."""
    hist = torch.tensor(p * 1000.0, dtype=torch.float64)[None]
    return hist, hist.sum(2), hist.sum(1)


def test_dv_of_log_density_ratio_is_discrete_mi():
    """With theta = log p/(px py) on the grid, the DV read-out equals the discrete MI exactly (Eq. 1)."""
    rng = np.random.default_rng(0)
    p = rng.uniform(size=(8, 8)) ** 4
    p /= p.sum()
    px, py = p.sum(1), p.sum(0)
    mi = float((p * np.log(p / np.outer(px, py))).sum())
    hist, mx, my = _discrete(p)
    theta = torch.tensor(np.log(p / np.outer(px, py)))[None]
    assert dv_readout(theta, hist, mx, my).item() == pytest.approx(mi, abs=1e-10)


def test_dv_is_zero_for_constant_tables_and_shift_invariant():
    """A constant table reads out 0, and adding a constant to any table leaves DV unchanged."""
    rng = np.random.default_rng(1)
    p = rng.uniform(size=(6, 6))
    p /= p.sum()
    hist, mx, my = _discrete(p)
    assert dv_readout(torch.full((1, 6, 6), 3.7, dtype=torch.float64), hist, mx, my).item() == pytest.approx(
        0, abs=1e-12
    )
    theta = torch.tensor(rng.standard_normal((1, 6, 6)))
    assert dv_readout(theta + 5.0, hist, mx, my).item() == pytest.approx(dv_readout(theta, hist, mx, my).item())


def test_dv_never_exceeds_discrete_mi():
    """DV is a lower bound: no table beats the log density ratio."""
    rng = np.random.default_rng(2)
    p = rng.uniform(size=(5, 5)) ** 3
    p /= p.sum()
    mi = float((p * np.log(p / np.outer(p.sum(1), p.sum(0)))).sum())
    hist, mx, my = _discrete(p)
    for _ in range(50):
        theta = torch.tensor(rng.standard_normal((1, 5, 5)) * 2)
        assert dv_readout(theta, hist, mx, my).item() <= mi + 1e-12


def test_first_term_is_mean_of_bilinear_table_at_samples():
    """sum(hist * theta) / T equals the mean bilinear interpolation of theta at the samples."""
    rng = np.random.default_rng(3)
    u, v = rng.uniform(size=300), rng.uniform(size=300)
    table = rng.standard_normal((10, 10))
    hist = torch.tensor(linear_binned_hist(u, v, 10))[None]
    direct = np.mean([bilinear(table, a, b) for a, b in zip(u, v, strict=True)])
    first = (hist * torch.tensor(table)).sum().item() / 300
    assert first == pytest.approx(direct, abs=1e-10)


def test_log_mean_exp_over_uniform_marginals():
    """The second DV term over uniform marginals is the log of the plain table mean of exp."""
    theta = torch.randn(2, 4, 4, dtype=torch.float64)
    q = torch.full((2, 4), 0.25, dtype=torch.float64)
    expected = torch.log(torch.exp(theta).mean(dim=(1, 2)))
    torch.testing.assert_close(log_mean_exp(theta, q, q), expected)


def test_network_shapes_and_permutation_free_input():
    """The network maps (B, G, G) histograms to (B, G, G) tables; independence gives near-zero features."""
    cfg = InfoNetConfig(grid=16, patch=4, d_model=32, n_latents=8, n_heads=2, n_self_layers=1)
    model = InfoNet(cfg).eval()
    hist = torch.rand(3, 16, 16) * 10
    with torch.inference_mode():
        theta = model(hist, hist.sum(2), hist.sum(1))
    assert theta.shape == (3, 16, 16)
    assert torch.isfinite(theta).all()
    uniform = torch.full((1, 16, 16), 100.0)
    feats = input_features(uniform, uniform.sum(2), uniform.sum(1))
    assert feats.abs().max().item() < 1e-5


def _small(smoothers: int) -> InfoNet:
    cfg = InfoNetConfig(grid=16, patch=4, d_model=32, n_latents=8, n_heads=2, n_self_layers=1, smoothers=smoothers)
    return InfoNet(cfg).eval()


def test_closed_gate_gives_the_one_smoother_network_exactly():
    """With the gate shut, a two-smoother network computes what the one-smoother network with the same weights does."""
    torch.manual_seed(0)
    one, two = _small(1), _small(2)
    missing, _ = two.load_state_dict(one.state_dict(), strict=False)
    assert set(missing) == {"smoother_sharp", "gate.weight", "gate.bias"}
    with torch.no_grad():
        two.smoother_sharp.normal_()  # anything: a shut gate must ignore it
        two.gate.bias.fill_(-1e4)
    hist = torch.rand(4, 16, 16) * 20
    with torch.inference_mode():
        torch.testing.assert_close(two(hist, hist.sum(2), hist.sum(1)), one(hist, hist.sum(2), hist.sum(1)))


def test_the_gate_blends_the_smoothers_per_window():
    """Each window gets its own blend: a batch gives each window the table it gets alone, and an open gate
    moves the table towards the second smoother's."""
    torch.manual_seed(1)
    model = _small(2)
    with torch.no_grad():
        model.gate.weight.normal_(std=2.0)
    hist = torch.rand(3, 16, 16) * 20
    hist[1] = torch.diag(torch.full((16,), 50.0))  # a sharp copula beside two diffuse ones
    with torch.inference_mode():
        batch = model(hist, hist.sum(2), hist.sum(1))
        for i in range(3):
            h = hist[i : i + 1]
            torch.testing.assert_close(batch[i : i + 1], model(h, h.sum(2), h.sum(1)), atol=1e-5, rtol=1e-5)
        with torch.no_grad():
            model.gate.bias.fill_(-1e4)
        shut = model(hist, hist.sum(2), hist.sum(1))
    assert (batch - shut).abs().amax(dim=(1, 2)).min() > 0  # the gate changed every window's table


def test_the_written_out_node_mlp_equals_the_matrix_products():
    """The per-node MLP written out over channel planes (what a compiler fuses) equals the Linear-GELU-Linear form."""
    torch.manual_seed(2)
    model = _small(2)
    planes = torch.randn(3, 6, 16, 16)  # (B, C + 2, G, G): table channels, then input features
    with torch.inference_mode():
        fused = unrolled_mlp(list(planes.unbind(1)), model.node_mlp)
        matmul = model.node_mlp(planes.permute(0, 2, 3, 1))[..., 0]
    torch.testing.assert_close(fused, matmul, atol=1e-5, rtol=1e-5)
