"""Ranks to MI on one torch device: the batched path of the design.

Per hop the copula values of every channel, u (C, T), go to the device once
(from pinned memory on CUDA). Each channel's linear-binning weights W_c (T, G)
are built there: a sample at grid position p = u (G - 1) puts 1 - w on node
floor(p) and w on the next, the same rule as ``copula.pair_histograms``. A
pair's joint histogram is then one matrix product,

    H_ab = W_a^T W_b  (G, G),

and the histograms of every pair of two blocks of channels are one large GEMM
on the device; the marginals are column sums of W. InfoNet and the DV read-out
run on the same tensors (on CUDA as the fused kernels of
``streamcorr.estimate.fused`` where Triton is installed); only the (P,) MI
values come back to the host. On a CPU the same code runs on CPU
tensors (tests compare it with the Numba histogram path); there the Numba
kernels stay faster, so the engine uses this path on CUDA.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import InputError
from .model import dv_readout

__all__ = ["MAX_TRAINED_WINDOW", "TensorPath", "TimeSplit", "bin_weights", "device_batch_size"]

log = logging.getLogger("streamcorr.estimate.tensor_path")

GEMM_SPARSITY = 16  # a block pair takes the GEMM where at least 1/16 of its pairs are requested (the GEMM's
# tensor-core rate against the gathered product's memory traffic: about 10x per histogram on an H200)
GATHER_BYTES = 256 * 2**20  # bin weights gathered at a time for the pairs of sparse block pairs


def device_batch_size(device: torch.device, grid: int, cap: int = 16384, fused: bool = False) -> int:
    """Pairs per batch that fit a quarter of the device's free memory (CPU: ``cap``).

    Per pair: about 64 fp32 G x G planes of histogram, features and activations through torch, 16 through the
    fused kernels (streamcorr.estimate.fused). Gathered bin weights are bounded apart (``GATHER_BYTES``).
    """
    if device.type != "cuda":
        return cap
    free, _ = torch.cuda.mem_get_info(device)
    per_pair = (16 if fused else 64) * grid * grid * 4
    return int(max(256, min(cap, free // 4 // per_pair)))


@dataclass
class TimeSplit:
    """Seconds spent per stage (device-synchronised), summed over calls."""

    upload_s: float = 0.0
    weights_s: float = 0.0
    histograms_s: float = 0.0
    model_s: float = 0.0
    download_s: float = 0.0
    pairs: int = 0
    calls: int = 0

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


def bin_weights(u: torch.Tensor, grid: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Linear-binning weights (C, T, G) of copula values u (C, T) in [0, 1]."""
    p = u.to(torch.float32) * (grid - 1)
    lo = p.floor().clamp_(0, grid - 2)
    w = (p - lo)[..., None]  # (C, T, 1)
    idx = lo.long()[..., None]
    out = torch.zeros(*u.shape, grid, dtype=torch.float32, device=u.device)
    out.scatter_(2, idx, 1.0 - w)
    out.scatter_add_(2, idx + 1, w)
    return out.to(dtype)


MAX_TRAINED_WINDOW = 8192  # the longest window the shipped networks were trained on (their metadata may say)


def trained_counts(
    hist: torch.Tensor, mx: torch.Tensor, my: torch.Tensor, max_window: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Histograms of windows longer than the network was trained on, scaled to max_window samples (the same
    shape, less noise): read as they are, the network's estimate sinks (y = x + noise, 0.347 nats: 0.259 at
    100,000 samples, 0.339 scaled). The DV read-out is the same at any scale; shorter windows pass unchanged."""
    n = hist.sum(dim=(1, 2), dtype=torch.float32)
    if not bool((n > max_window).any()):
        return hist, mx, my
    f = torch.clamp(max_window / n.clamp_min(1.0), max=1.0)  # (B,)
    return (hist * f[:, None, None]).to(hist.dtype), mx * f[:, None], my * f[:, None]


class TensorPath:
    """InfoNet MI of channel pairs from shared ranks, every stage on one device.

    ``model``: an InfoNet on ``device`` (or torch.compile of one) with ``grid`` nodes per axis.

    ``hist_dtype``: float32 builds histograms in fp32 (on CUDA TF32 is left to
    torch's global setting); float16 halves the bytes the batched product reads
    and runs on tensor cores, at about 1e-3 relative error per histogram cell.
    ``amp``: run the network under bfloat16 autocast (the read-out stays fp32).
    ``timed``: synchronise the device around each stage so that ``split`` holds the
    time per stage (upload, bin weights, histograms, model, download).
    """

    def __init__(
        self,
        model: Callable[..., torch.Tensor],
        *,
        grid: int,
        device: torch.device,
        batch_size: int = 8192,
        hist_dtype: torch.dtype = torch.float32,
        amp: bool = False,
        timed: bool = False,
        fused: Callable[..., torch.Tensor] | None = None,
        max_window: int = MAX_TRAINED_WINDOW,
    ) -> None:
        self.max_window = max_window
        if batch_size < 1:
            raise InputError(f"batch_size must be >= 1; got {batch_size}")
        self.model = model
        self.device = device
        self.grid = grid
        self.batch_size = batch_size
        self.tile = max(1, math.isqrt(batch_size))  # channels per block: a block pair's pairs fill about one batch
        self.fused = fused  # streamcorr.estimate.fused: histograms -> MI in one call, in place of model + read-out
        self.hist_dtype = hist_dtype
        self.amp = amp
        self.timed = timed  # synchronise per stage to fill `split` (costs the overlap of stages on CUDA)
        self.split = TimeSplit()
        self._pinned: torch.Tensor | None = None

    # -- stages ---------------------------------------------------------------------
    def upload(self, u: np.ndarray) -> torch.Tensor:
        """Copula values (C, T) to the device as float32, through a reused pinned buffer on CUDA."""
        host = torch.from_numpy(np.ascontiguousarray(u, dtype=np.float32))
        if self.device.type != "cuda":
            return host
        if self._pinned is None or self._pinned.shape != host.shape:
            self._pinned = torch.empty(host.shape, dtype=torch.float32, pin_memory=True)
        self._pinned.copy_(host)
        return self._pinned.to(self.device, non_blocking=True)

    def _mi(self, hist: torch.Tensor, mx: torch.Tensor, my: torch.Tensor) -> torch.Tensor:
        """MI (B,) of a batch of histograms; out of device memory, the batch is split, and so are later ones."""
        hist, mx, my = trained_counts(hist, mx, my, self.max_window)
        try:
            with self._stage("model_s"):
                if self.fused is not None:
                    return self.fused(hist, mx, my)
                amp = torch.autocast(self.device.type, dtype=torch.bfloat16) if self.amp else contextlib.nullcontext()
                wide = hist.float()
                with amp:
                    theta = self.model(wide, mx, my)  # (B, G, G)
                return dv_readout(theta.float(), wide, mx, my)
        except torch.cuda.OutOfMemoryError:
            if hist.shape[0] == 1:
                raise
        # split outside the handler, so that the failed attempt's frames and tensors are released first
        n = hist.shape[0]
        self.batch_size = max(1, min(self.batch_size, n) // 2)  # another process took memory
        log.warning("CUDA out of memory at %d pairs per batch; continuing with %d", n, self.batch_size)
        torch.cuda.empty_cache()
        h = n // 2
        return torch.cat([self._mi(hist[:h], mx[:h], my[:h]), self._mi(hist[h:], mx[h:], my[h:])])

    def _tile_histograms(
        self, wt: torch.Tensor, idx_u: torch.Tensor, idx_v: torch.Tensor
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(histograms (n, G, G), positions (n,)) of the pairs, one channel-block pair at a time.

        wt: bin weights (C, G, T). For channel blocks A and B of ``tile`` channels, the one product
        W_A^T W_B ((|A| G) x T times T x (|B| G)) holds every pair's histogram of the two blocks; the
        requested pairs are read out of it. One large GEMM runs at the tensor cores' rate, where a batched
        product over per-pair gathers of W moves each pair's 2 T G weights through device memory. A block
        pair with fewer than 1/GEMM_SPARSITY of its pairs requested (the engine's chunks and screened picks)
        takes the gathered product instead: the GEMM would compute mostly unrequested histograms.
        """
        k, g, t = self.tile, self.grid, wt.shape[2]
        nb = (wt.shape[0] + k - 1) // k
        key = (idx_u // k) * nb + idx_v // k  # the pair's block pair, grouped on the device (no host sort)
        order = torch.sort(key, stable=True).indices
        counts = torch.bincount(key, minlength=nb * nb).cpu().numpy()
        ends = np.cumsum(counts)
        sparse = []
        for blk in np.flatnonzero(counts):
            a, b = int(blk // nb) * k, int(blk % nb) * k
            wa, wb = wt[a : a + k], wt[b : b + k]
            group = order[ends[blk] - counts[blk] : ends[blk]]
            if counts[blk] * GEMM_SPARSITY < wa.shape[0] * wb.shape[0]:
                sparse.append(group)
                continue
            full = (wa.reshape(-1, t) @ wb.reshape(-1, t).T).view(wa.shape[0], g, wb.shape[0], g)
            for s in range(0, int(counts[blk]), self.batch_size):
                p = group[s : s + self.batch_size]
                yield full[idx_u[p] - a, :, idx_v[p] - b, :], p
        if sparse:
            rest = torch.cat(sparse)
            step = max(1, GATHER_BYTES // (4 * g * t))  # two gathered (G, T) fp16 blocks per pair
            for s in range(0, rest.numel(), step):
                p = rest[s : s + step]
                yield torch.bmm(wt[idx_u[p]], wt[idx_v[p]].transpose(1, 2)), p

    def estimate(self, u: np.ndarray | torch.Tensor, iu: np.ndarray, iv: np.ndarray) -> np.ndarray:
        """MI in nats (P,) of pairs (iu[p], iv[p]) of rows of u (C, T); clipped at 0, exactly 0 for a constant row."""
        iu_np = np.ascontiguousarray(iu, dtype=np.int64)
        iv_np = np.ascontiguousarray(iv, dtype=np.int64)
        if iu_np.shape != iv_np.shape or iu_np.ndim != 1:
            raise InputError("iu and iv must be 1-D index arrays of equal length")
        c = u.shape[0]
        if iu_np.size and (min(iu_np.min(), iv_np.min()) < 0 or max(iu_np.max(), iv_np.max()) >= c):
            raise InputError(f"a pair index is out of range of the {c} rows of u")
        if iu_np.size == 0:
            return np.empty(0)
        self.split.calls += 1
        self.split.pairs += iu_np.size
        with torch.inference_mode():
            with self._stage("upload_s"):
                ut = u.to(self.device) if isinstance(u, torch.Tensor) else self.upload(u)
                idx_u = torch.from_numpy(iu_np).to(self.device, non_blocking=True)
                idx_v = torch.from_numpy(iv_np).to(self.device, non_blocking=True)
            with self._stage("weights_s"):
                w32 = bin_weights(ut, self.grid)  # (C, T, G)
                marg = w32.sum(dim=1)  # (C, G)
                w = w32.to(self.hist_dtype)
                del w32
                constant = ut.amax(dim=1) == ut.amin(dim=1)  # all ranks tied: a constant series
                wt = w.transpose(1, 2).contiguous()  # (C, G, T): each channel's G rows of T weights
                del w
            mi = torch.empty(iu_np.size, dtype=torch.float32, device=self.device)
            pending: list[tuple[torch.Tensor, torch.Tensor]] = []
            tiles = self._tile_histograms(wt, idx_u, idx_v)
            while True:
                with self._stage("histograms_s"):
                    item = next(tiles, None)
                if item is None:
                    break
                pending.append(item)
                if sum(p.numel() for _, p in pending) >= self.batch_size:
                    self._flush(pending, mi, marg, idx_u, idx_v)
            if pending:
                self._flush(pending, mi, marg, idx_u, idx_v)
            with self._stage("download_s"):
                mi = mi.clamp_min(0.0)
                mi = torch.where(constant[idx_u] | constant[idx_v], torch.zeros_like(mi), mi)
                result = mi.double().cpu().numpy()
        return result

    def _flush(
        self, pending: list[tuple[torch.Tensor, torch.Tensor]], mi: torch.Tensor, marg: torch.Tensor,
        idx_u: torch.Tensor, idx_v: torch.Tensor,
    ) -> None:  # fmt: skip
        """Run the network over the pending histograms as one batch and write their MI at their positions."""
        hist = torch.cat([h for h, _ in pending]) if len(pending) > 1 else pending[0][0]
        pos = torch.cat([p for _, p in pending]) if len(pending) > 1 else pending[0][1]
        pending.clear()
        mi[pos] = self._mi(hist, marg[idx_u[pos]], marg[idx_v[pos]])

    @contextlib.contextmanager
    def _stage(self, name: str) -> Iterator[None]:
        """Add the stage's wall time to the split; synchronises CUDA so each stage is timed on its own."""
        if not self.timed:
            yield
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            setattr(self.split, name, getattr(self.split, name) + time.perf_counter() - t0)
