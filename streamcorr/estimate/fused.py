"""InfoNet's blocks and its table read-out as fused Triton kernels (the CUDA path's network).

Run through torch, a transformer block over a batch is a dozen kernels, each reading
and writing (B, 16, 64) activations, and the table's tail (node MLP, smoother, DV
read-out) another dozen over (B, G, G) planes: about 1 MB of device memory traffic
per pair, which bounds the network far below the card's arithmetic. Here one kernel
runs a whole block (attention, feed-forward, norms) for a tile of pairs with its
activations on the chip, one kernel computes the unsmoothed tables (features and
per-node MLP) from the head's output, and one the smoother (its products in 3xTF32,
fp32 accuracy) with the DV read-out; the inputs stage and the head's product stay in
torch (compiled). On an H200 the smoother kernel took 2.1 ms per 65,536 pairs where
torch (compiled, fp32) took 7.5 ms; a single-kernel tail per pair (``tail="fused"``)
measured slower (bench/results/gpu_path_nvidia-h200.md).
``STREAMCORR_FUSED=0`` turns the fused path off.

The kernels compute ``InfoNet``'s function as bfloat16 autocast does, with fewer
roundings: matrix products take bf16 operands and accumulate in fp32; their outputs,
the attention weights and the activations stay fp32 (autocast rounds them to bf16).
Weights are copied at construction: a model changed afterwards needs a new instance.
Tests run them on the CPU with ``TRITON_INTERPRET=1`` (fp32 operands there).
"""

from __future__ import annotations

import importlib.util
import math
import os
from typing import Any

import torch

from .model import InfoNet, dv_readout

HAS_TRITON = importlib.util.find_spec("triton") is not None  # CUDA builds of torch bring it; else the dev extra

__all__ = ["FusedInfoNet", "fused_available", "fused_network"]

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def fused_available(model: InfoNet, device: torch.device) -> bool:
    """Whether the fused kernels serve this network here (CUDA, or the CPU interpreter in tests)."""
    cfg = model.cfg
    if not HAS_TRITON or os.environ.get("STREAMCORR_FUSED", "1") == "0":
        return False
    if device.type == "cuda":
        if torch.cuda.get_device_capability(device) < (8, 0):  # bf16 tensor-core products: Ampere or newer
            return False
    elif not _INTERPRET:
        return False
    head = cfg.d_model // cfg.n_heads
    sizes = (cfg.grid, cfg.patch, cfg.d_model, head, cfg.d_model * cfg.ff_mult, cfg.n_latents, cfg.node_hidden)
    return (
        cfg.n_latents == (cfg.grid // cfg.patch) ** 2  # cross-attention pairs rows of equal count
        and cfg.out_channels == 4
        and cfg.d_model == head * cfg.n_heads
        and head >= 16
        and cfg.grid >= 16
        and all(n & (n - 1) == 0 for n in sizes)  # Triton's block shapes are powers of two
    )


def fused_network(model: InfoNet, device: torch.device, compile_inputs: bool = True) -> FusedInfoNet | None:
    """The fused network for ``model`` where it serves (``fused_available``), else None."""
    return FusedInfoNet(model, compile_inputs=compile_inputs) if fused_available(model, device) else None


class FusedInfoNet:
    """MI (B,) of histograms (B, G, G) and marginals (B, G) through the fused kernels; same weights as ``model``.

    ``rows``: rows (latents or tokens) per block-kernel program, a multiple of the latents per pair (16 in the
    shipped networks: 4 pairs per program at 64);
    ``warps``: warps per block program. ``tail``: "split" computes the unsmoothed tables with one kernel over
    (pair, 8 rows) programs, then the smoother and the read-out with one kernel per pair; "torch" takes the
    smoother and the read-out through torch (compiled) instead; "fused" does all of it in one kernel per pair.
    ``precision``: tl.dot's for the smoother's products in the kernels ("tf32x3": fp32 accuracy). ``embed``:
    "torch" takes the input features and the tokens' embedding through ``InfoNet.inputs`` (compiled); "kernel"
    computes them in one kernel per pair (checked in the interpreter only: ``bench.gpu_path`` times it as a
    variant, and it becomes the default once a GPU run shows it faster within tolerance).
    """

    def __init__(
        self, model: InfoNet, *, rows: int = 64, warps: int = 4, tail: str = "split", tail_warps: int = 16,
        precision: str = "tf32x3", compile_inputs: bool = True, embed: str = "torch",
    ) -> None:  # fmt: skip
        if not HAS_TRITON:
            raise RuntimeError("the fused path needs triton")
        if rows % model.cfg.n_latents:  # a program's rows must hold whole pairs: attention stays inside a pair
            raise ValueError(f"rows ({rows}) must be a multiple of the network's {model.cfg.n_latents} latents")
        import triton.language as tl

        from . import fused_kernels

        self.kernels = fused_kernels
        if tail not in ("split", "torch", "fused"):
            raise ValueError(f"tail must be 'split', 'torch' or 'fused'; got {tail!r}")
        if embed not in ("kernel", "torch"):
            raise ValueError(f"embed must be 'kernel' or 'torch'; got {embed!r}")
        self.embed = embed
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

        self.embed_t = model.embed.weight.detach().t().to(self.act_dtype).contiguous()  # (2 p p, d)
        self.embed_b = model.embed.bias.detach().float().contiguous()
        self.pos = model.pos.detach().float().contiguous()  # (S*S, d)

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
        self.kernels._block_kernel[((rows + self.rows - 1) // self.rows,)](
            x, c, out, rows, *params["args"], params["eps"], (d // self.cfg.n_heads) ** -0.5, *self.norm_out,
            float(self.model.norm_out.eps), HAS_CTX=ctx is not None, FINAL_LN=final_ln, R=self.rows, SEQ=n, D=d,
            H=self.cfg.n_heads, F=params["ff"], DOT=self.dot, num_warps=self.warps,
        )  # fmt: skip
        return out

    def __call__(self, hist: torch.Tensor, mx: torch.Tensor, my: torch.Tensor) -> torch.Tensor:
        if hist.device.type != "cuda":
            return self._forward(hist, mx, my)
        with torch.cuda.device(hist.device):  # Triton launches on the current device: make it the tensors'
            return self._forward(hist, mx, my)

    def _forward(self, hist: torch.Tensor, mx: torch.Tensor, my: torch.Tensor) -> torch.Tensor:
        cfg, model = self.cfg, self.model
        b = hist.shape[0]
        hist = hist.contiguous()
        mx, my = mx.float().contiguous(), my.float().contiguous()
        if self.embed == "kernel":
            tokens, lat = self.tokens(hist, mx, my)
        else:
            with torch.autocast(hist.device.type, dtype=torch.bfloat16, enabled=not _INTERPRET):
                _, tokens, lat = self.inputs(hist, mx, my)
        enc, *process, dec = self.blocks
        lat = self.block(enc, lat, tokens)
        for params in process:
            lat = self.block(params, lat, None)
        out = self.head(self.block(dec, tokens, lat, final_ln=True))  # head(norm_out(decode(tokens, lat)))
        two = cfg.smoothers == 2
        gate = model.gate_of(lat) if two else None  # (B, 1, 1)
        if self.tail != "fused":
            return self.readout(self.theta(out, hist, mx, my), hist, mx, my, gate)
        mi = torch.empty(b, dtype=torch.float32, device=hist.device)
        a = gate.reshape(b).contiguous() if gate is not None else mx  # (B,) gates; unread with one smoother
        w1, b1, w2, b2 = self.node
        self.kernels._tail_kernel[(b,)](
            out, hist, mx, my, a, self.s0, self.s1, w1, b1, w2, b2, mi, **self._shape(), TWO=two, PREC=self.precision,
            num_warps=self.tail_warps,
        )  # fmt: skip
        return mi

    def _shape(self) -> dict[str, int]:
        cfg = self.cfg
        return {"G": cfg.grid, "P": cfg.patch, "S": cfg.grid // cfg.patch, "NH": cfg.node_hidden, "RC": 16}

    def tokens(self, hist: torch.Tensor, mx: torch.Tensor, my: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The embedded tokens (B, S*S, d) fp32 (one kernel: features, embedding, positions, plus the window's length
        embedding) and the latents' start (B, M, d), as ``InfoNet.inputs`` gives them."""
        cfg, model = self.cfg, self.model
        b, s = hist.shape[0], cfg.grid // cfg.patch
        n = mx.sum(dim=1).clamp_min(1.0)
        length = model.len_embed(((torch.log(n) - math.log(1000.0)) / 2.0)[:, None]).float()[:, None, :]  # (B, 1, d)
        out = torch.empty(b, s * s, cfg.d_model, dtype=torch.float32, device=hist.device)
        self.kernels._embed_kernel[(b,)](hist, mx, my, self.embed_t, self.embed_b, self.pos, out, G=cfg.grid,
                                         P=cfg.patch, S=s, D=cfg.d_model, DOT=self.dot, num_warps=4)  # fmt: skip
        return out + length, model.latents.float() + length

    def head(self, normed: torch.Tensor) -> torch.Tensor:
        """The head's product (B, S*S, 4 p p) of norm_out(decoded tokens), in bf16 as under autocast."""
        with torch.autocast(normed.device.type, dtype=torch.bfloat16, enabled=not _INTERPRET):
            return self.model.head_product(normed)

    def theta(self, out: torch.Tensor, hist: torch.Tensor, mx: torch.Tensor, my: torch.Tensor) -> torch.Tensor:
        """Unsmoothed tables (B, G, G) fp32 from the head's output: features and the per-node MLP (one kernel)."""
        b, g = hist.shape[0], self.cfg.grid
        theta = torch.empty(b, g, g, dtype=torch.float32, device=hist.device)
        shape = self._shape() | {"RC": 8}  # 8 rows, 8 warps a program: 8.2 ms per 65,536 pairs on an H200 (16, 4: 9.5)
        self.kernels._theta_kernel[(b, g // 8)](out, hist, mx, my, *self.node, theta, **shape, num_warps=8)
        return theta

    def readout(
        self, theta: torch.Tensor, hist: torch.Tensor, mx: torch.Tensor, my: torch.Tensor, gate: torch.Tensor | None
    ) -> torch.Tensor:
        """MI (B,) from unsmoothed tables (B, G, G): the smoother and the DV read-out (a kernel, or torch)."""
        if self.tail == "torch":
            return self.smooth_readout(theta, hist, mx, my, gate)
        b = theta.shape[0]
        mi = torch.empty(b, dtype=torch.float32, device=theta.device)
        a = gate.reshape(b).contiguous() if gate is not None else mx  # (B,) gates; unread with one smoother
        self.kernels._smooth_kernel[(b,)](
            theta, hist, mx, my, a, self.s0, self.s1, mi, G=self.cfg.grid, TWO=gate is not None, PREC=self.precision,
            num_warps=4,
        )  # fmt: skip
        return mi
