"""InfoNet's blocks and its table read-out as fused Triton kernels (the CUDA path's network).

Run through torch, a transformer block over a batch is a dozen kernels, each reading
and writing (B, 16, 64) activations, and the table's tail (node MLP, smoother, DV
read-out) another dozen over (B, G, G) planes: about 1 MB of device memory traffic
per pair, which bounds the network far below the card's arithmetic. Here one kernel
runs a whole block for a tile of pairs, and one kernel turns a pair's head output,
histogram and marginals into its MI; activations stay on the chip. The inputs stage
(features, token embedding) and the head's product stay in torch.

The kernels compute the same function as ``InfoNet`` under bfloat16 autocast:
matrix products take bf16 operands and accumulate in fp32, everything else is fp32.
Tests run them on the CPU with ``TRITON_INTERPRET=1`` (fp32 operands there).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from .model import InfoNet, dv_readout

try:
    import triton
    import triton.language as tl
except ImportError:  # the extra is not installed, or no CUDA toolchain: the torch path serves
    triton = None

__all__ = ["FusedInfoNet", "fused_available", "fused_network"]

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def fused_available(model: InfoNet, device: torch.device) -> bool:
    """Whether the fused kernels serve this network here (CUDA, or the CPU interpreter in tests)."""
    cfg = model.cfg
    return (
        triton is not None
        and (device.type == "cuda" or _INTERPRET)
        and os.environ.get("STREAMCORR_FUSED", "1") != "0"
        and cfg.n_latents == (cfg.grid // cfg.patch) ** 2  # cross-attention pairs rows of equal count
        and cfg.out_channels == 4
        and cfg.d_model % cfg.n_heads == 0
        and (cfg.d_model // cfg.n_heads) >= 16
    )


def fused_network(model: InfoNet, device: torch.device, compile_inputs: bool = True) -> FusedInfoNet | None:
    """The fused network for ``model`` where it serves (``fused_available``), else None."""
    return FusedInfoNet(model, compile_inputs=compile_inputs) if fused_available(model, device) else None


if triton is not None:

    @triton.jit
    def _tile(ptr, row0, col0, ld, ROWS: tl.constexpr, COLS: tl.constexpr):
        """M[row0:row0+ROWS, col0:col0+COLS] of a row-major matrix with leading dimension ld."""
        r = tl.arange(0, ROWS)
        c = tl.arange(0, COLS)
        return tl.load(ptr + (row0 + r)[:, None] * ld + (col0 + c)[None, :])

    @triton.jit
    def _vec(ptr, off, N: tl.constexpr):
        return tl.load(ptr + off + tl.arange(0, N))

    @triton.jit
    def _layer_norm(x, w_ptr, b_ptr, D: tl.constexpr, eps):
        mean = tl.sum(x, 1) / D
        xc = x - mean[:, None]
        var = tl.sum(xc * xc, 1) / D
        return xc / tl.sqrt(var + eps)[:, None] * _vec(w_ptr, 0, D)[None, :] + _vec(b_ptr, 0, D)[None, :]

    @triton.jit
    def _gelu(x):
        return 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))

    @triton.jit
    def _block_kernel(
        x_ptr, c_ptr, o_ptr, n_rows,
        lnx_w, lnx_b, lnc_w, lnc_b, wq, bq, wkv, bkv, wo, bo, lnf_w, lnf_b, w1, b1, w2, b2,
        eps, scale, lnz_w, lnz_b, eps_z,
        HAS_CTX: tl.constexpr, FINAL_LN: tl.constexpr, R: tl.constexpr, SEQ: tl.constexpr, D: tl.constexpr,
        H: tl.constexpr, F: tl.constexpr, DOT: tl.constexpr,
    ):  # fmt: skip
        """One pre-norm block (attention, feed-forward) over R rows = R / SEQ pairs; weights transposed (in, out)."""
        HD: tl.constexpr = D // H
        r = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
        live = r < n_rows
        d = tl.arange(0, D)
        x = tl.load(x_ptr + r[:, None] * D + d[None, :], mask=live[:, None], other=0.0)
        xn = _layer_norm(x, lnx_w, lnx_b, D, eps)
        if HAS_CTX:
            c = tl.load(c_ptr + r[:, None] * D + d[None, :], mask=live[:, None], other=0.0)
            cd = _layer_norm(c, lnc_w, lnc_b, D, eps).to(DOT)
        else:
            cd = xn.to(DOT)
        xd = xn.to(DOT)
        # a row attends only to the rows of its own pair: a block-diagonal mask over the tile
        pair = tl.arange(0, R) // SEQ
        same = pair[:, None] == pair[None, :]
        acc = tl.zeros((R, D), tl.float32) + _vec(bo, 0, D)[None, :]
        for h in tl.static_range(H):
            q = tl.dot(xd, _tile(wq, 0, h * HD, D, D, HD).to(DOT)) + _vec(bq, h * HD, HD)[None, :]
            k = tl.dot(cd, _tile(wkv, 0, h * HD, 2 * D, D, HD).to(DOT)) + _vec(bkv, h * HD, HD)[None, :]
            v = tl.dot(cd, _tile(wkv, 0, D + h * HD, 2 * D, D, HD).to(DOT)) + _vec(bkv, D + h * HD, HD)[None, :]
            s = tl.dot(q.to(DOT), tl.trans(k.to(DOT))) * scale
            s = tl.where(same, s, float("-inf"))
            p = tl.exp(s - tl.max(s, 1)[:, None])
            p = p / tl.sum(p, 1)[:, None]
            o = tl.dot(p.to(DOT), v.to(DOT))  # (R, HD)
            acc += tl.dot(o.to(DOT), _tile(wo, h * HD, 0, D, HD, D).to(DOT))
        x = x + acc
        f = tl.dot(_layer_norm(x, lnf_w, lnf_b, D, eps).to(DOT), _tile(w1, 0, 0, F, D, F).to(DOT))
        f = _gelu(f + _vec(b1, 0, F)[None, :])
        x = x + tl.dot(f.to(DOT), _tile(w2, 0, 0, D, F, D).to(DOT)) + _vec(b2, 0, D)[None, :]
        if FINAL_LN:  # the decode block's only reader is the head, after norm_out
            x = _layer_norm(x, lnz_w, lnz_b, D, eps_z)
        tl.store(o_ptr + r[:, None] * D + d[None, :], x.to(o_ptr.dtype.element_ty), mask=live[:, None])

    @triton.jit
    def _node_weight(w1, k, c, CIN: tl.constexpr):
        return tl.load(w1 + k * CIN + c)

    @triton.jit
    def _theta_rows(head_ptr, hist, mx_ptr, my_ptr, w1, b1, w2, b2, b, n, r0,
                    G: tl.constexpr, P: tl.constexpr, S: tl.constexpr, NH: tl.constexpr, RC: tl.constexpr):  # fmt: skip
        """Rows r0 .. r0 + RC of a pair's unsmoothed table: features and the per-node MLP over 4 head planes."""
        g = tl.arange(0, G)
        ri = r0 + tl.arange(0, RC)
        hc = tl.load(hist + ri[:, None] * G + g[None, :]).to(tl.float32)
        e = tl.load(mx_ptr + b * G + ri)[:, None] * tl.load(my_ptr + b * G + g)[None, :] / n
        resid = (hc - e) / tl.sqrt(e + 1.0)
        sq = tl.where(resid < 0, -1.0, 1.0) * tl.log(tl.abs(resid) + tl.sqrt(resid * resid + 1.0))
        lr = tl.log((hc + 0.5) / (e + 0.5))
        width: tl.constexpr = 4 * P * P  # the head's outputs per token: 4 channel-major planes of one patch
        at = head_ptr + b * S * S * width + ((ri // P) * S)[:, None] * width + (g // P)[None, :] * width
        at += (ri % P)[:, None] * P + (g % P)[None, :]
        p0 = tl.load(at).to(tl.float32)
        p1 = tl.load(at + P * P).to(tl.float32)
        p2 = tl.load(at + 2 * P * P).to(tl.float32)
        p3 = tl.load(at + 3 * P * P).to(tl.float32)
        theta = tl.zeros((RC, G), tl.float32) + tl.load(b2)
        for k in tl.static_range(NH):
            z = tl.load(b1 + k) + _node_weight(w1, k, 0, 6) * p0 + _node_weight(w1, k, 1, 6) * p1
            z += _node_weight(w1, k, 2, 6) * p2 + _node_weight(w1, k, 3, 6) * p3
            z += _node_weight(w1, k, 4, 6) * sq + _node_weight(w1, k, 5, 6) * lr
            theta += tl.load(w2 + k) * _gelu(z)
        return theta

    @triton.jit
    def _theta_kernel(
        head_ptr, hist_ptr, mx_ptr, my_ptr, w1, b1, w2, b2, theta_ptr,
        G: tl.constexpr, P: tl.constexpr, S: tl.constexpr, NH: tl.constexpr, RC: tl.constexpr,
    ):  # fmt: skip
        """Unsmoothed tables (B, G, G) fp32, RC rows of one pair per program: grid (B, G / RC)."""
        b = tl.program_id(0).to(tl.int64)
        r0 = tl.program_id(1) * RC
        g = tl.arange(0, G)
        hist = hist_ptr + b * G * G
        n = tl.maximum(tl.sum(tl.sum(tl.load(hist + g[:, None] * G + g[None, :]).to(tl.float32), 1), 0), 1.0)
        theta = _theta_rows(head_ptr, hist, mx_ptr, my_ptr, w1, b1, w2, b2, b, n, r0, G, P, S, NH, RC)
        ri = r0 + tl.arange(0, RC)
        tl.store(theta_ptr + b * G * G + ri[:, None] * G + g[None, :], theta)

    @triton.jit
    def _tail_kernel(
        head_ptr, hist_ptr, mx_ptr, my_ptr, gate_ptr, s0_ptr, s1_ptr, w1, b1, w2, b2, out_ptr,
        G: tl.constexpr, P: tl.constexpr, S: tl.constexpr, NH: tl.constexpr, RC: tl.constexpr,
        TWO: tl.constexpr, PREC: tl.constexpr,
    ):  # fmt: skip
        """MI of one pair: features, per-node MLP over 4 head planes, A theta A^T, DV read-out over its histogram."""
        b = tl.program_id(0).to(tl.int64)
        g = tl.arange(0, G)
        hist = hist_ptr + b * G * G
        h = tl.load(hist + g[:, None] * G + g[None, :]).to(tl.float32)
        n = tl.maximum(tl.sum(tl.sum(h, 1), 0), 1.0)
        mx = tl.load(mx_ptr + b * G + g)
        my = tl.load(my_ptr + b * G + g)
        a = 0.0
        if TWO:
            a = tl.load(gate_ptr + b)
        left = tl.zeros((G, G), tl.float32)
        for r0 in tl.static_range(0, G, RC):
            theta = _theta_rows(head_ptr, hist, mx_ptr, my_ptr, w1, b1, w2, b2, b, n, r0, G, P, S, NH, RC)
            # A[:, rows] for A = (1 - a) S0 + a S1
            cols = _tile(s0_ptr, 0, r0, G, G, RC)
            if TWO:
                cols = (1.0 - a) * cols + a * _tile(s1_ptr, 0, r0, G, G, RC)
            left += tl.dot(cols, theta, input_precision=PREC)
        at_ = tl.trans(_tile(s0_ptr, 0, 0, G, G, G))
        if TWO:
            at_ = (1.0 - a) * at_ + a * tl.trans(_tile(s1_ptr, 0, 0, G, G, G))
        sm = tl.dot(left, at_, input_precision=PREC)  # A theta A^T
        first = tl.sum(tl.sum(h * sm, 1), 0) / n
        z = sm + tl.log(tl.maximum(mx / n, 1e-30))[:, None] + tl.log(tl.maximum(my / n, 1e-30))[None, :]
        top = tl.max(tl.max(z, 1), 0)
        tl.store(out_ptr + b, first - top - tl.log(tl.sum(tl.sum(tl.exp(z - top), 1), 0)))


class FusedInfoNet:
    """MI (B,) of histograms (B, G, G) and marginals (B, G) through the fused kernels; same weights as ``model``.

    ``rows``: rows (latents or tokens) per block-kernel program, a multiple of 16 (pairs per program: rows / 16);
    ``warps``: warps per block program. ``tail``: "split" computes the unsmoothed tables with one kernel over
    (pair, 16 rows) programs, then the smoother and the read-out through torch (compiled); "fused" does all
    of it in one kernel per pair, its smoother products at tl.dot's ``precision``.
    """

    def __init__(
        self, model: InfoNet, *, rows: int = 64, warps: int = 4, tail: str = "split", tail_warps: int = 16,
        precision: str = "tf32x3", compile_inputs: bool = True,
    ) -> None:  # fmt: skip
        if triton is None:
            raise RuntimeError("the fused path needs triton")
        if tail not in ("split", "fused"):
            raise ValueError(f"tail must be 'split' or 'fused'; got {tail!r}")
        self.model = model
        self.cfg = model.cfg
        self.rows, self.warps, self.tail, self.tail_warps = rows, warps, tail, tail_warps
        self.precision = "ieee" if _INTERPRET else precision
        self.dot = tl.float32 if _INTERPRET else tl.bfloat16
        self.act_dtype = torch.float32 if _INTERPRET else torch.bfloat16  # the head's input
        self.blocks = [self._block_params(b, self.act_dtype) for b in (model.encode, *model.process, model.decode)]
        self.norm_out = [model.norm_out.weight.detach().float(), model.norm_out.bias.detach().float()]
        m = model.node_mlp
        params = [*m[0].parameters(), *m[2].parameters()]  # weight, bias of each layer
        self.node = [t.detach().float().contiguous() for t in params]
        self.s0 = model.smoother.detach().float().contiguous()
        two = model.cfg.smoothers == 2
        self.s1 = model.smoother_sharp.detach().float().contiguous() if two else self.s0

        def inputs(hist: torch.Tensor, mx: torch.Tensor, my: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return model.inputs(hist.float(), mx, my)  # the fp16 histograms widened inside the compiled graph

        def smooth_readout(theta: torch.Tensor, hist: torch.Tensor, mx: torch.Tensor, my: torch.Tensor,
                           a: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
            return dv_readout(model.smooth(theta, a), hist.float(), mx, my)

        compiled = compile_inputs and not _INTERPRET
        self.inputs: Any = torch.compile(inputs, dynamic=True) if compiled else inputs
        self.smooth_readout: Any = torch.compile(smooth_readout, dynamic=True) if compiled else smooth_readout

    @staticmethod
    def _block_params(block: Any, wdtype: torch.dtype) -> dict[str, Any]:
        def t(w: torch.Tensor) -> torch.Tensor:  # (out, in) -> (in, out), the kernels' operand layout
            return w.detach().t().to(wdtype).contiguous()

        def v(w: torch.Tensor) -> torch.Tensor:
            return w.detach().float().contiguous()

        ctx = block.norm_ctx if block.norm_ctx is not None else block.norm_x
        ff1, ff2 = block.ff[0], block.ff[2]
        return {
            "args": [
                *(v(x) for x in (block.norm_x.weight, block.norm_x.bias, ctx.weight, ctx.bias)),
                *(
                    f(x)
                    for lin in (block.attn.q, block.attn.kv, block.attn.out)
                    for f, x in ((t, lin.weight), (v, lin.bias))
                ),
                *(v(x) for x in (block.norm_ff.weight, block.norm_ff.bias)),
                *(f(x) for lin in (ff1, ff2) for f, x in ((t, lin.weight), (v, lin.bias))),
            ],
            "eps": float(block.norm_x.eps),
            "ff": ff1.out_features,
        }

    def block(
        self, params: dict[str, Any], x: torch.Tensor, ctx: torch.Tensor | None, final_ln: bool = False
    ) -> torch.Tensor:
        """One block over x (B, N, d) fp32 attending to ctx (B, N, d), or to itself; with ``final_ln``
        the output is norm_out of it, in the head's input dtype."""
        b, n, d = x.shape
        x = x.float().contiguous()
        c = ctx.float().contiguous() if ctx is not None else x
        out = torch.empty(x.shape, dtype=self.act_dtype if final_ln else torch.float32, device=x.device)
        rows = b * n
        _block_kernel[(triton.cdiv(rows, self.rows),)](
            x, c, out, rows, *params["args"], params["eps"], (d // self.cfg.n_heads) ** -0.5, *self.norm_out,
            float(self.model.norm_out.eps), HAS_CTX=ctx is not None, FINAL_LN=final_ln, R=self.rows, SEQ=n, D=d,
            H=self.cfg.n_heads, F=params["ff"], DOT=self.dot, num_warps=self.warps,
        )  # fmt: skip
        return out

    def __call__(self, hist: torch.Tensor, mx: torch.Tensor, my: torch.Tensor) -> torch.Tensor:
        cfg, model = self.cfg, self.model
        b, g, p = hist.shape[0], cfg.grid, cfg.patch
        hist = hist.contiguous()
        mx, my = mx.float().contiguous(), my.float().contiguous()
        with torch.autocast(hist.device.type, dtype=torch.bfloat16, enabled=not _INTERPRET):
            _, tokens, lat = self.inputs(hist, mx, my)
        enc, *process, dec = self.blocks
        lat = self.block(enc, lat, tokens)
        for params in process:
            lat = self.block(params, lat, None)
        normed = self.block(dec, tokens, lat, final_ln=True)  # norm_out(decode(tokens, lat))
        c, d = cfg.out_channels, cfg.d_model
        weight = model.head.weight.view(p, p, c, d).permute(2, 0, 1, 3).reshape(c * p * p, d)  # channel-major
        bias = model.head.bias.view(p, p, c).permute(2, 0, 1).reshape(c * p * p)
        out = torch.nn.functional.linear(normed, weight.to(normed.dtype), bias.to(normed.dtype))  # (B, S*S, 4 p p)
        two = cfg.smoothers == 2
        gate = model.gate_of(lat) if two else None  # (B, 1, 1)
        w1, b1, w2, b2 = self.node
        shape = {"G": g, "P": p, "S": g // p, "NH": cfg.node_hidden, "RC": 16}
        if self.tail == "split":
            theta = torch.empty(b, g, g, dtype=torch.float32, device=hist.device)
            _theta_kernel[(b, g // 16)](out, hist, mx, my, w1, b1, w2, b2, theta, **shape, num_warps=4)
            return self.smooth_readout(theta, hist, mx, my, gate)
        mi = torch.empty(b, dtype=torch.float32, device=hist.device)
        _tail_kernel[(b,)](
            out, hist, mx, my, gate.reshape(b).contiguous() if gate is not None else mx, self.s0, self.s1,
            w1, b1, w2, b2, mi, **shape, TWO=two, PREC=self.precision, num_warps=self.tail_warps,
        )  # fmt: skip
        return mi
