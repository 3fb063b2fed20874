"""InfoNet: from the rank histogram of one window to a Donsker-Varadhan lookup table.

Reads top to bottom: the input features, the attention blocks, the network, the
DV read-out. Departures from the paper (see models/README.md for measurements):

- The set of rank pairs enters as its linear-binned histogram on a G x G grid
  (a count-weighted set of grid points), so the cost after one O(T) pass does
  not grow with the window length T.
- The histogram is split into p x p patches (tokens). Learned latents
  cross-attend to the tokens, self-attend, and the tokens then query the latents
  back (Perceiver IO), one output patch (C channels per node) per token. A
  per-node MLP mixes those channels with the input features (full-resolution
  detail), and a learned separable smoother A theta A^T, initialised to a
  Gaussian blur, replaces the paper's fixed Gaussian smoothing. A 3 x 3
  convolution stack in that place cost 4x more CPU time (models/README.md).
  With ``smoothers: 2`` the smoother is chosen per window: A = (1 - a) A0 + a A1,
  a gate a in (0, 1) read from the latents, because one shared smoother has to
  trade sharp copulas (narrow noise bands, high MI) against smooth ones (short
  windows, mixtures). It costs two more G x G products per window.
- The table is read out bilinearly at the samples (exact via the linear-binned
  histogram) and the second DV term is taken exactly over the product of the
  window's marginal histograms instead of over shuffled pairs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class InfoNetConfig:
    grid: int = 32  # G: table nodes per axis
    patch: int = 8  # p: nodes per token side; G must be a multiple of p
    d_model: int = 64
    n_latents: int = 16
    n_heads: int = 4
    n_self_layers: int = 3
    ff_mult: int = 2
    out_channels: int = 4  # C: channels per table node from the token head
    node_hidden: int = 16  # width of the per-node MLP
    min_window: int = 32  # shortest window (samples) the model was trained on
    smoothers: int = 1  # 1: one learned smoother; 2: a per-window blend of two, gated by the latents

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def input_features(hist: torch.Tensor, mx: torch.Tensor, my: torch.Tensor) -> torch.Tensor:
    """Two per-node channels describing dependence, (B, G, G) -> (B, 2, G, G).

    hist: linear-binned joint histogram summing to T; mx, my: (B, G) marginal
    histograms summing to T. Expected counts under independence are T * qx qy.
    """
    n = hist.sum(dim=(1, 2)).clamp_min(1.0)  # (B,)
    expected = (mx[:, :, None] * my[:, None, :]) / n[:, None, None]  # (B, G, G)
    resid = (hist - expected) / torch.sqrt(expected + 1.0)  # Pearson residual, ~N(0,1) if independent
    log_ratio = torch.log((hist + 0.5) / (expected + 0.5))
    # asinh written out: torch.asinh is several times slower on CPU
    squashed = torch.sign(resid) * torch.log(resid.abs() + torch.sqrt(resid * resid + 1.0))
    return torch.stack([squashed, log_ratio], dim=1)


class Attention(nn.Module):
    def __init__(self, d: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        h = self.n_heads
        q = self.q(x).view(b, n, h, d // h).transpose(1, 2)  # (B, h, N, d/h)
        k, v = self.kv(ctx).view(b, ctx.shape[1], 2, h, d // h).permute(2, 0, 3, 1, 4)  # 2 x (B, h, M, d/h)
        y = F.scaled_dot_product_attention(q, k, v)  # (B, h, N, d/h)
        return self.out(y.transpose(1, 2).reshape(b, n, d))


class Block(nn.Module):
    """Pre-norm attention (self or cross) followed by a feed-forward layer."""

    def __init__(self, d: int, n_heads: int, ff_mult: int, cross: bool) -> None:
        super().__init__()
        self.norm_x = nn.LayerNorm(d)
        self.norm_ctx = nn.LayerNorm(d) if cross else None
        self.attn = Attention(d, n_heads)
        self.norm_ff = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, ff_mult * d), nn.GELU(), nn.Linear(ff_mult * d, d))

    def forward(self, x: torch.Tensor, ctx: torch.Tensor | None = None) -> torch.Tensor:
        xn = self.norm_x(x)
        kv = xn if self.norm_ctx is None or ctx is None else self.norm_ctx(ctx)
        x = x + self.attn(xn, kv)
        return x + self.ff(self.norm_ff(x))


def unrolled_mlp(columns: list[torch.Tensor], mlp: nn.Sequential) -> torch.Tensor:
    """``mlp(stack(columns, -1))[..., 0]`` for a Linear-act-Linear(1) MLP, as per-element arithmetic.

    The per-node MLP has 6 inputs and 16 hidden units: as two matrix products it
    writes and re-reads a 16-channel hidden tensor per table node (tens of MB for a
    batch), most of the network's memory traffic on a CPU and on a GPU. Written out
    over contiguous (B, G, G) columns, a compiler fuses it into one vectorised kernel
    that reads the inputs once and writes theta once.
    """
    first, act, last = mlp[0], mlp[1], mlp[2]
    assert isinstance(first, nn.Linear) and isinstance(last, nn.Linear)
    out = torch.zeros_like(columns[0]) + last.bias[0]
    for k in range(first.out_features):
        h = first.bias[k] + sum(first.weight[k, c] * col for c, col in enumerate(columns))
        out = out + last.weight[0, k] * act(h)
    return out


class InfoNet(nn.Module):
    def __init__(self, cfg: InfoNetConfig) -> None:
        super().__init__()
        if cfg.grid % cfg.patch:
            raise ValueError(f"grid ({cfg.grid}) must be a multiple of patch ({cfg.patch})")
        self.cfg = cfg
        d, p = cfg.d_model, cfg.patch
        self.n_side = cfg.grid // p
        n_tokens = self.n_side**2
        self.embed = nn.Linear(2 * p * p, d)
        self.pos = nn.Parameter(torch.randn(n_tokens, d) * 0.02)
        self.len_embed = nn.Sequential(nn.Linear(1, d), nn.GELU(), nn.Linear(d, d))
        self.latents = nn.Parameter(torch.randn(cfg.n_latents, d) * 0.02)
        self.encode = Block(d, cfg.n_heads, cfg.ff_mult, cross=True)
        self.process = nn.ModuleList(Block(d, cfg.n_heads, cfg.ff_mult, cross=False) for _ in range(cfg.n_self_layers))
        self.decode = Block(d, cfg.n_heads, cfg.ff_mult, cross=True)
        self.norm_out = nn.LayerNorm(d)
        self.head = nn.Linear(d, cfg.out_channels * p * p)  # one table patch per token
        self.node_mlp = nn.Sequential(
            nn.Linear(cfg.out_channels + 2, cfg.node_hidden), nn.GELU(), nn.Linear(cfg.node_hidden, 1)
        )
        pos = torch.arange(cfg.grid, dtype=torch.float32)
        blur = torch.exp(-0.5 * (pos[:, None] - pos[None, :]) ** 2)  # Gaussian, sigma = 1 node
        self.smoother = nn.Parameter(blur / blur.sum(dim=1, keepdim=True))  # (G, G), rows sum to 1
        if cfg.smoothers not in (1, 2):
            raise ValueError(f"smoothers must be 1 or 2, got {cfg.smoothers}")
        if cfg.smoothers == 2:
            self.smoother_sharp = nn.Parameter(torch.eye(cfg.grid))  # starts as no smoothing at all
            self.gate = nn.Linear(d, 1)
            nn.init.zeros_(self.gate.weight)
            nn.init.constant_(self.gate.bias, -4.0)  # a ~ 0.02: starts close to the one-smoother network

    def forward(self, hist: torch.Tensor, mx: torch.Tensor, my: torch.Tensor) -> torch.Tensor:
        """Histograms (B, G, G), marginals (B, G) -> lookup table theta (B, G, G)."""
        feats, tokens, lat = self.inputs(hist, mx, my)
        lat = self.encode(lat, tokens)  # (B, M, d)
        for blk in self.process:
            lat = blk(lat)
        return self.table(self.decode(tokens, lat), lat, feats)

    def inputs(self, hist: torch.Tensor, mx: torch.Tensor, my: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Features (B, 2, G, G), embedded tokens (B, S*S, d) and the latents' start (B, M, d)."""
        p, s = self.cfg.patch, self.n_side
        b = hist.shape[0]
        feats = input_features(hist, mx, my)  # (B, 2, G, G)
        tokens = feats.view(b, 2, s, p, s, p).permute(0, 2, 4, 1, 3, 5).reshape(b, s * s, 2 * p * p)
        n = hist.sum(dim=(1, 2)).clamp_min(1.0)
        length = self.len_embed(((torch.log(n) - math.log(1000.0)) / 2.0)[:, None])[:, None, :]  # (B, 1, d)
        tokens = self.embed(tokens) + self.pos + length  # (B, S*S, d)
        return feats, tokens, self.latents.expand(b, -1, -1) + length

    def head_planes(self, tokens: torch.Tensor) -> torch.Tensor:
        """Decoded tokens (B, S*S, d) -> the head's output (B, S*S, C*p*p), each token's rows channel-major."""
        return self.head_product(self.norm_out(tokens))

    def head_product(self, normed: torch.Tensor) -> torch.Tensor:
        """The head's product of norm_out(decoded tokens): (B, S*S, C*p*p), each token's rows channel-major."""
        c, d, p = self.cfg.out_channels, self.cfg.d_model, self.cfg.patch
        # the head's rows reordered channel-major (the same products): each channel's table is then contiguous
        # along the grid, which a compiler needs to vectorise the per-node MLP below
        weight = self.head.weight.view(p, p, c, d).permute(2, 0, 1, 3).reshape(c * p * p, d)
        bias = self.head.bias.view(p, p, c).permute(2, 0, 1).reshape(c * p * p)
        return F.linear(normed, weight, bias)

    def gate_of(self, lat: torch.Tensor) -> torch.Tensor:
        """The smoother blend a (B, 1, 1) in (0, 1) read from the processed latents (two smoothers only)."""
        return torch.sigmoid(self.gate(lat.float().mean(dim=1)))[:, :, None]

    def table(self, tokens: torch.Tensor, lat: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        """Decoded tokens, processed latents and features -> the smoothed table theta (B, G, G)."""
        cfg = self.cfg
        b, g, p, s, c = tokens.shape[0], cfg.grid, cfg.patch, self.n_side, cfg.out_channels
        out = self.head_planes(tokens)  # (B, S*S, C*p*p)
        planes = out.float().view(b, s, s, c, p, p).permute(0, 3, 1, 4, 2, 5).reshape(b, c, g, g)  # (B, C, G, G)
        # the table stays fp32 under autocast: bf16 rounding of theta moves the DV read-out by ~0.005 nats
        with torch.autocast(tokens.device.type, enabled=False):
            if torch.compiler.is_compiling():  # written out, it fuses into one vectorised kernel (2x the network)
                theta = unrolled_mlp([*planes.unbind(1), *feats.unbind(1)], self.node_mlp)
            else:
                nodes = torch.cat([planes, feats], dim=1).permute(0, 2, 3, 1)  # (B, G, G, C + 2)
                theta = self.node_mlp(nodes)[..., 0]  # (B, G, G)
            return self.smooth(theta, self.gate_of(lat) if cfg.smoothers == 2 else None)

    def smooth(self, theta: torch.Tensor, a: torch.Tensor | None) -> torch.Tensor:
        """A theta A^T (B, G, G): the learned smoother, or with two, A = (1 - a) A0 + a A1 for gates a (B, 1, 1)."""
        if a is None:
            return self.smoother @ theta @ self.smoother.T  # separable smoothing, (B, G, G)
        # written with the shared matrices (exactly equal): a per-window (B, G, G) smoother costs more as a
        # batched product than these four shared ones
        left = (1.0 - a) * (self.smoother @ theta) + a * (self.smoother_sharp @ theta)  # A theta
        return (1.0 - a) * (left @ self.smoother.T) + a * (left @ self.smoother_sharp.T)  # (B, G, G)


def log_mean_exp(theta: torch.Tensor, qx: torch.Tensor, qy: torch.Tensor) -> torch.Tensor:
    """log sum_ij qx_i qy_j exp(theta_ij), for probability vectors qx, qy (B, G)."""
    logq = torch.log(qx.clamp_min(1e-30))[:, :, None] + torch.log(qy.clamp_min(1e-30))[:, None, :]
    return torch.logsumexp((theta + logq).flatten(1), dim=1)


def dv_readout(theta: torch.Tensor, hist: torch.Tensor, mx: torch.Tensor, my: torch.Tensor) -> torch.Tensor:
    """Donsker-Varadhan MI (paper Eq. 1) of a window from its own table: (B,) nats.

    First term: mean of the bilinear table over the window's samples, exactly
    sum(hist * theta) / T. Second term: exact expectation over the product of
    the window's marginals (no shuffling).
    """
    n = hist.sum(dim=(1, 2)).clamp_min(1.0)
    first = (hist * theta).sum(dim=(1, 2)) / n
    return first - log_mean_exp(theta, mx / n[:, None], my / n[:, None])


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
