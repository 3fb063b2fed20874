"""Train InfoNet on random distributions: resumable or time-boxed, CPU or CUDA, from scratch or fine-tuned.

    python -m training.train training/configs/infonet-v1.yaml [--device auto] [--steps N]
    python -m training.train training/configs/infonet-v2.yaml --device cuda --max-minutes 6 --out "$OUT"

Without --out, writes training/runs/<name>/: checkpoint.pt (model, optimiser,
step, and the EMA; resumed when present), loss.csv, eval.csv, config.yaml, model.safetensors.
With --out DIR, writes only DIR/model.safetensors, best.safetensors (the
evaluated snapshot with the smallest worst per-family validation MAE ratio to
the start), loss.csv, eval.csv, config.yaml: no pickled optimiser state, no resume. With ``ema_decay``
in the config, an exponential moving average of the weights is kept beside them and saved as
ema.safetensors (and, with ``--out`` and ``snapshot_every_s``, as numbered ema-<step>.safetensors
snapshots, to choose or average afterwards on data of one's own). Weights are saved every
``save_every_s`` seconds and at the end, with the model and data config (tie
policy included) in the safetensors metadata. ``init`` in the config (or
--init) starts from shipped weights. With --max-minutes, the learning-rate
schedule follows wall-clock progress and the run stops in time, counting
start-up after imports (a few seconds). ``symmetrise`` applies a random exact
symmetry of the square to each item; ``max_reuse`` > 1 lets a fast device take
another step on the last batch (under a new symmetry) while the workers catch up.
Imports streamcorr.estimate.model / .weights / .copula only (no pydantic).
git ignores a run's weights and checkpoint (training/runs/*/*.safetensors, checkpoint.pt); to ship weights,
copy them to models/<name>.safetensors and link streamcorr/data/<name>.safetensors to that file.

Objective per batch (see models/README.md for why both terms):
    loss = -mean DV(theta; fresh samples) + readout_weight * mean (DV(theta; window) - MI)^2
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import multiprocessing as mp
import os
import queue as queue_mod
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from streamcorr.estimate.model import InfoNet, InfoNetConfig, dv_readout, log_mean_exp
from streamcorr.estimate.weights import load_model, save_weights

from .data import DataConfig, make_batch
from .validation import validation_set

RUNS = Path(__file__).parent / "runs"
STOP_MARGIN_S = 20.0  # of a --max-minutes budget, kept for the last evaluation and save


def _worker(seed: int, cfg: DataConfig, batch: int, queue: Any) -> None:
    import numba

    torch.set_num_threads(1)
    numba.set_num_threads(1)  # one process per core; threads inside would only contend
    rng = np.random.default_rng(seed)
    queue.cancel_join_thread()  # on exit, do not wait to flush batches nobody will read
    parent = os.getppid()
    while os.getppid() == parent:  # exit once the trainer is gone, even if it was killed
        item = make_batch(rng, cfg, batch)
        while os.getppid() == parent:
            try:
                queue.put(item, timeout=1.0)
                break
            except queue_mod.Full:
                continue


def fresh_dv(theta: torch.Tensor, fresh: torch.Tensor) -> torch.Tensor:
    """DV objective on fresh samples (hist normalised to 1) against uniform marginals: (B,)."""
    g = theta.shape[-1]
    trap = torch.ones(g, device=theta.device)
    trap[0] = trap[-1] = 0.5  # linear binning of a uniform marginal puts half mass on the end nodes
    q = (trap / trap.sum()).expand(theta.shape[0], g)
    return (fresh * theta).sum(dim=(1, 2)) - log_mean_exp(theta, q, q)


def symmetrise(batch: dict[str, torch.Tensor], gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Apply a random symmetry of the unit square to each item: transpose (swap x and y) and/or
    reflect u -> 1 - u on either axis. Each is exact for these inputs: MI is unchanged, the rank
    (r + 0.5) / T of -x is 1 - that of x, and the nodes g / (G - 1) map onto themselves."""
    hist, fresh, mx, my = batch["hist"], batch["fresh"], batch["mx"], batch["my"]
    b = hist.shape[0]
    t, fx, fy = (torch.rand(3, b, generator=gen, device=gen.device) < 0.5).to(hist.device)
    t3, fx3, fy3 = t[:, None, None], fx[:, None, None], fy[:, None, None]
    hist = torch.where(t3, hist.transpose(1, 2), hist)
    fresh = torch.where(t3, fresh.transpose(1, 2), fresh)
    mx, my = torch.where(t[:, None], my, mx), torch.where(t[:, None], mx, my)
    hist, fresh = torch.where(fx3, hist.flip(1), hist), torch.where(fx3, fresh.flip(1), fresh)
    hist, fresh = torch.where(fy3, hist.flip(2), hist), torch.where(fy3, fresh.flip(2), fresh)
    mx, my = torch.where(fx[:, None], mx.flip(1), mx), torch.where(fy[:, None], my.flip(1), my)
    return {"hist": hist, "fresh": fresh, "mx": mx, "my": my, "mi": batch["mi"]}


def _grow(init: InfoNet, cfg: InfoNetConfig) -> InfoNet:
    """Grow init weights into a larger network that computes the same function (the only changes of
    architecture a fine-tune may make): one smoother into two (the gate starts nearly shut), and more latent
    self-attention blocks (appended with zero output projections, so each starts as the identity). Every
    shared parameter is copied."""
    old, new = init.cfg.to_dict(), cfg.to_dict()
    grows_smoother = (old["smoothers"], new["smoothers"]) == (1, 2)
    same_rest = {**old, "smoothers": 0, "n_self_layers": 0} == {**new, "smoothers": 0, "n_self_layers": 0}
    smoothers_ok = grows_smoother or old["smoothers"] == new["smoothers"]
    if not (same_rest and smoothers_ok and new["n_self_layers"] >= old["n_self_layers"]):
        raise SystemExit(f"config model section {new} differs from the init weights' {old}")
    model = InfoNet(cfg)
    missing, unexpected = model.load_state_dict(init.state_dict(), strict=False)
    added = tuple(f"process.{i}." for i in range(old["n_self_layers"], new["n_self_layers"]))
    expected = {"smoother_sharp", "gate.weight", "gate.bias"} if grows_smoother else set()
    assert not unexpected and {m for m in missing if not m.startswith(added)} == expected, missing
    with torch.no_grad():
        for blk in model.process[old["n_self_layers"] :]:
            for lin in (blk.attn.out, blk.ff[-1]):  # residual branches that add nothing yet
                lin.weight.zero_()
                lin.bias.zero_()
    return model


def _truncate_logs(run: Path, step: int) -> None:
    """Drop log rows written after the checkpoint being resumed, so steps stay unique."""
    for name in ("loss.csv", "eval.csv"):
        path = run / name
        if path.exists():
            lines = path.read_text().splitlines(keepends=True)
            keep = [ln for i, ln in enumerate(lines) if i == 0 or int(ln.split(",", 1)[0]) <= step]
            path.write_text("".join(keep))


def lr_at(progress: float, step: int, cfg: dict[str, Any]) -> float:
    """Linear warm-up over warmup_steps, then cosine from lr to min_lr as progress goes 0 -> 1."""
    if step < cfg["warmup_steps"]:
        return cfg["lr"] * (step + 1) / cfg["warmup_steps"]
    frac = min(1.0, max(0.0, progress))
    return cfg["min_lr"] + 0.5 * (cfg["lr"] - cfg["min_lr"]) * (1 + math.cos(math.pi * frac))


FAMILIES = {0: "mix", 1: "gauss", 2: "quant", 3: "noise"}


def evaluate(model: InfoNet, val: dict[str, torch.Tensor]) -> dict[str, float]:
    model.eval()
    with torch.inference_mode():
        theta = model(val["hist"], val["mx"], val["my"]).float()
        est = dv_readout(theta, val["hist"], val["mx"], val["my"])
    model.train()
    err = (est - val["mi"]).cpu().numpy()
    mi = val["mi"].cpu().numpy()
    fam = val["family"].cpu().numpy() if "family" in val else np.zeros(len(mi), int)
    out = {"mae": float(np.abs(err).mean()), "bias": float(err.mean())}
    for lo, hi in [(0.0, 0.1), (0.4, 0.6), (0.8, 1.0), (1.2, 2.5)]:
        sel = (mi >= lo) & (mi < hi) & (fam <= 1)
        out[f"bias_{lo:.1f}_{hi:.1f}"] = float(err[sel].mean()) if sel.any() else float("nan")
    for code, name in FAMILIES.items():
        sel = fam == code
        out[f"mae_{name}"] = float(np.abs(err[sel]).mean()) if sel.any() else float("nan")
    return out


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", type=Path)
    ap.add_argument("--device", default="auto", help="cpu, cuda or auto")
    ap.add_argument("--steps", type=int, default=None, help="override the config's total steps")
    ap.add_argument("--runs-dir", type=Path, default=RUNS, help="where run folders go (without --out)")
    ap.add_argument("--out", type=Path, default=None, help="flat output folder: weights, logs, config; no resume")
    ap.add_argument("--max-minutes", type=float, default=None, help="hard wall-clock limit, start-up included")
    ap.add_argument("--init", default=None, help="start from these weights (overrides the config's init)")
    ap.add_argument("--workers", type=int, default=None, help="data worker processes (default: config)")
    ap.add_argument("--batch", type=int, default=None, help="override the config's batch size")
    ap.add_argument("--lr", type=float, default=None, help="override the config's peak learning rate")
    ap.add_argument("--snapshot-every-s", type=float, default=None, help="override the config's EMA snapshot period")
    args = ap.parse_args(argv)
    t_begin = time.perf_counter()
    cfg = yaml.safe_load(args.config.read_text())
    for key in ("steps", "workers", "batch", "init", "lr", "snapshot_every_s"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    budget_s = 60.0 * args.max_minutes if args.max_minutes else None
    device = _device(args.device)
    torch.set_num_threads(cfg["threads"])
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    precision = cfg.get("precision", "fp32")  # fp32, tf32 (TF32 matmuls) or bf16 (autocast + TF32); CUDA only
    if precision not in ("fp32", "tf32", "bf16"):
        raise SystemExit(f"precision must be fp32, tf32 or bf16; got {precision!r}")
    use_bf16 = device.type == "cuda" and precision == "bf16"
    if device.type == "cuda" and precision != "fp32":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    # huber: squared error up to huber_delta nats, linear beyond, so that items no table can fit (the
    # sharpest copulas) do not outweigh the many small mixture errors
    readout_loss = cfg.get("readout_loss", "mse")
    if readout_loss not in ("mse", "huber"):
        raise SystemExit(f"readout_loss must be mse or huber; got {readout_loss!r}")
    readout_fn = (
        torch.nn.HuberLoss(delta=float(cfg.get("huber_delta", 0.05))) if readout_loss == "huber" else torch.nn.MSELoss()
    )
    run = args.out if args.out is not None else args.runs_dir / cfg["name"]
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))

    dcfg = DataConfig(**cfg["data"])
    torch.manual_seed(cfg["seed"])
    init_meta: dict[str, Any] = {}
    if cfg.get("init"):
        model, init_meta = load_model(cfg["init"], device)
        mcfg = InfoNetConfig(**{**model.cfg.to_dict(), **cfg["model"]})
        if mcfg != model.cfg:
            model = _grow(model, mcfg).to(device)
        model.train()
    else:
        mcfg = InfoNetConfig(**cfg["model"])
        model = InfoNet(mcfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    ema_decay = float(cfg.get("ema_decay", 0.0))
    ema = (
        torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(ema_decay))
        if ema_decay
        else None
    )
    step, wall = 0, 0.0
    ckpt_path = run / "checkpoint.pt"
    if args.out is None and ckpt_path.exists():
        ckpt = torch.load(ckpt_path, map_location=device, weights_only=True)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        if ema is not None and "ema" in ckpt:  # the average goes on where it stopped instead of restarting
            ema.load_state_dict(ckpt["ema"])
        step, wall = int(ckpt["step"]), float(ckpt["wall_s"])
        _truncate_logs(run, step)
        print(f"resumed {run} at step {step}", flush=True)

    make_batch(np.random.default_rng(0), dcfg, 2)  # compile (and cache) the Numba kernels once, before the workers
    ctx = mp.get_context("spawn")
    queue = ctx.Queue(maxsize=3 * cfg["workers"])
    workers = [
        ctx.Process(target=_worker, args=(cfg["seed"] * 1000 + step * 7 + i, dcfg, cfg["batch"], queue), daemon=True)
        for i in range(cfg["workers"])
    ]
    for w in workers:
        w.start()
    val_np = validation_set(
        dcfg.grid, cfg.get("val_mixtures", 256), ties=dcfg.ties, n_quantised=cfg.get("val_quantised", 0)
    )
    val = {k: torch.from_numpy(v).to(device) for k, v in val_np.items()}

    loss_f = (run / "loss.csv").open("a", newline="")
    loss_w = csv.writer(loss_f)
    if loss_f.tell() == 0:
        loss_w.writerow(["step", "wall_s", "lr", "loss", "dv_fresh", "readout_mse", "readout_mae"])
    eval_f = (run / "eval.csv").open("a", newline="")
    eval_w = csv.writer(eval_f)
    save_every_s = float(cfg.get("save_every_s", 60.0))

    first: dict[str, float] = {}
    best = [math.inf]

    def log_eval() -> None:
        """Validation metrics; with --out, best.safetensors keeps the snapshot whose worst per-family
        MAE ratio to the first evaluation (the init weights when fine-tuning) is smallest."""
        ev = evaluate(model, val)
        fams = [k for k, v in ev.items() if k.startswith("mae_") and np.isfinite(v)]
        first.update({k: ev[k] for k in fams if k not in first})
        ev["worst_ratio"] = max(ev[k] / max(first[k], 1e-6) for k in fams)
        if eval_f.tell() == 0:
            eval_w.writerow(["step", "wall_s", *ev])
        eval_w.writerow([step, f"{wall:.1f}", *(f"{v:.4f}" for v in ev.values())])
        eval_f.flush()
        print(f"step {step} wall {wall:.0f}s " + " ".join(f"{k}={v:.4f}" for k, v in ev.items()), flush=True)
        if args.out is not None and ev["worst_ratio"] < best[0]:
            best[0] = ev["worst_ratio"]
            save(name="best.safetensors", extra={"worst_ratio": round(ev["worst_ratio"], 4)})

    def weights_meta() -> dict[str, Any]:
        return {
            "config": mcfg.to_dict(),
            "ties": dcfg.ties,
            "data": asdict(dcfg),
            "step": step,
            "train_wall_s": round(wall, 1),
            "device": str(device),
            "run": cfg["name"],
            "init": str(cfg.get("init") or ""),
            "init_run": init_meta.get("run", ""),
            **({"ema_decay": ema_decay} if ema is not None else {}),
        }

    def save(name: str = "model.safetensors", extra: dict[str, Any] | None = None) -> None:
        loss_f.flush()
        if args.out is None and name == "model.safetensors":
            tmp = run / "checkpoint.tmp"
            state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "wall_s": wall}
            torch.save({**state, **({"ema": ema.state_dict()} if ema is not None else {})}, tmp)
            tmp.replace(ckpt_path)
        meta = {**weights_meta(), **(extra or {})}
        tmp_w = run / f"{name}.tmp"
        save_weights(model, tmp_w, meta)
        tmp_w.replace(run / name)
        if ema is not None and name == "model.safetensors":
            save_weights(ema.module, run / "ema.safetensors.tmp", meta)
            (run / "ema.safetensors.tmp").replace(run / "ema.safetensors")

    def snapshot() -> None:
        if ema is not None and args.out is not None:
            save_weights(ema.module, run / f"ema-{step:06d}.safetensors", weights_meta())

    gen = torch.Generator(device="cpu").manual_seed(cfg["seed"] + step)
    max_reuse = int(cfg.get("max_reuse", 1))  # steps per batch at most, when the data workers fall behind
    last: dict[str, torch.Tensor] | None = None
    uses = 0
    t0 = time.perf_counter() - wall
    last_save = last_snapshot = time.perf_counter()
    snapshot_every_s = float(cfg.get("snapshot_every_s", 0.0))
    deadline = t_begin + budget_s - STOP_MARGIN_S if budget_s else math.inf
    if step == 0 and time.perf_counter() < deadline:
        log_eval()  # the starting point: random or init weights
    while step < cfg["steps"] and time.perf_counter() < deadline:
        try:
            wait = 0.0 if last is not None and uses < max_reuse else max(0.1, min(30.0, deadline - time.perf_counter()))
            item = queue.get(timeout=wait) if wait else queue.get_nowait()
            last, uses = {k: torch.from_numpy(v).to(device, non_blocking=True) for k, v in item.items()}, 0
        except queue_mod.Empty:
            if last is None or uses >= max_reuse:
                continue
        assert last is not None
        uses += 1
        batch = symmetrise(last, gen) if cfg.get("symmetrise", False) else last
        progress = step / cfg["steps"]
        if budget_s:
            progress = max(progress, (time.perf_counter() - t_begin) / (budget_s - STOP_MARGIN_S))
        lr = lr_at(progress, step, cfg)
        for group in opt.param_groups:
            group["lr"] = lr
        amp = torch.autocast("cuda", dtype=torch.bfloat16) if use_bf16 else contextlib.nullcontext()
        with amp:
            theta = model(batch["hist"], batch["mx"], batch["my"])
        theta = theta.float()  # the DV terms (log-sum-exp) in fp32
        dv = fresh_dv(theta, batch["fresh"])
        est = dv_readout(theta, batch["hist"], batch["mx"], batch["my"])
        mse = ((est - batch["mi"]) ** 2).mean()
        loss = -dv.mean() + cfg["readout_weight"] * readout_fn(est, batch["mi"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        opt.step()
        if ema is not None:
            ema.update_parameters(model)
        step += 1
        wall = time.perf_counter() - t0
        mae = (est - batch["mi"]).abs().mean()
        loss_w.writerow(
            [
                step,
                f"{wall:.1f}",
                f"{lr:.3g}",
                f"{loss.item():.5f}",
                f"{dv.mean().item():.5f}",
                f"{mse.item():.6f}",
                f"{mae.item():.5f}",
            ]
        )
        if step % 50 == 0:
            loss_f.flush()
        if step % cfg["eval_every"] == 0:
            log_eval()
        if step % cfg["checkpoint_every"] == 0 or time.perf_counter() - last_save >= save_every_s:
            save()
            if step % cfg["eval_every"]:
                log_eval()
            last_save = time.perf_counter()
        if snapshot_every_s and time.perf_counter() - last_snapshot >= snapshot_every_s:
            snapshot()
            last_snapshot = time.perf_counter()
    for w in workers:
        w.terminate()
    wall = time.perf_counter() - t0
    if step % cfg["eval_every"]:
        log_eval()
    save()
    snapshot()
    loss_f.close()
    eval_f.close()
    print(json.dumps({"done": step, "wall_s": round(wall, 1), "out": str(run)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
