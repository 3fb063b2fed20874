"""Train InfoNet on random distributions. Resumable; CPU or CUDA.

    python -m training.train training/configs/infonet-v1.yaml [--device auto] [--steps N]

Writes training/runs/<name>/: checkpoint.pt (model, optimiser, step), loss.csv,
eval.csv, and model.safetensors + model.json (the exportable weights).
Objective per batch (see models/README.md for why both terms):
    loss = -mean DV(theta; fresh samples) + readout_weight * mean (DV(theta; window) - MI)^2
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import multiprocessing as mp
import os
import queue as queue_mod
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from streamcorr.model import InfoNet, InfoNetConfig, dv_readout, log_mean_exp
from streamcorr.weights import save_weights

from .data import DataConfig, make_batch
from .validation import validation_set

RUNS = Path(__file__).parent / "runs"


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


def _truncate_logs(run: Path, step: int) -> None:
    """Drop log rows written after the checkpoint being resumed, so steps stay unique."""
    for name in ("loss.csv", "eval.csv"):
        path = run / name
        if path.exists():
            lines = path.read_text().splitlines(keepends=True)
            keep = [ln for i, ln in enumerate(lines) if i == 0 or int(ln.split(",", 1)[0]) <= step]
            path.write_text("".join(keep))


def lr_at(step: int, cfg: dict[str, Any]) -> float:
    if step < cfg["warmup_steps"]:
        return cfg["lr"] * (step + 1) / cfg["warmup_steps"]
    frac = min(1.0, (step - cfg["warmup_steps"]) / max(1, cfg["steps"] - cfg["warmup_steps"]))
    return cfg["min_lr"] + 0.5 * (cfg["lr"] - cfg["min_lr"]) * (1 + math.cos(math.pi * frac))


def evaluate(model: InfoNet, val: dict[str, torch.Tensor]) -> dict[str, float]:
    model.eval()
    with torch.inference_mode():
        est = dv_readout(model(val["hist"], val["mx"], val["my"]), val["hist"], val["mx"], val["my"])
    model.train()
    err = (est - val["mi"]).cpu().numpy()
    mi = val["mi"].cpu().numpy()
    out = {"mae": float(np.abs(err).mean()), "bias": float(err.mean())}
    for lo, hi in [(0.0, 0.1), (0.4, 0.6), (0.8, 1.0), (1.2, 2.5)]:
        sel = (mi >= lo) & (mi < hi)
        out[f"bias_{lo:.1f}_{hi:.1f}"] = float(err[sel].mean()) if sel.any() else float("nan")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", type=Path)
    ap.add_argument("--device", default="auto", help="cpu, cuda or auto")
    ap.add_argument("--steps", type=int, default=None, help="override the config's total steps")
    ap.add_argument("--runs-dir", type=Path, default=RUNS, help="where run folders go")
    args = ap.parse_args(argv)
    cfg = yaml.safe_load(args.config.read_text())
    if args.steps:
        cfg["steps"] = args.steps
    device = torch.device(
        "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device.replace("auto", "cpu")
    )
    torch.set_num_threads(cfg["threads"])
    run = args.runs_dir / cfg["name"]
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))

    mcfg, dcfg = InfoNetConfig(**cfg["model"]), DataConfig(**cfg["data"])
    torch.manual_seed(cfg["seed"])
    model = InfoNet(mcfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    step, wall = 0, 0.0
    ckpt_path = run / "checkpoint.pt"
    if ckpt_path.exists():
        ckpt = torch.load(ckpt_path, map_location=device, weights_only=True)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        step, wall = int(ckpt["step"]), float(ckpt["wall_s"])
        _truncate_logs(run, step)
        print(f"resumed {run} at step {step}", flush=True)

    val_np = validation_set(dcfg.grid, cfg.get("val_mixtures", 256))
    val = {k: torch.from_numpy(v).to(device) for k, v in val_np.items()}
    ctx = mp.get_context("spawn")
    queue = ctx.Queue(maxsize=2 * cfg["workers"])
    workers = [
        ctx.Process(target=_worker, args=(cfg["seed"] * 1000 + step * 7 + i, dcfg, cfg["batch"], queue), daemon=True)
        for i in range(cfg["workers"])
    ]
    for w in workers:
        w.start()

    loss_f = (run / "loss.csv").open("a", newline="")
    loss_w = csv.writer(loss_f)
    if loss_f.tell() == 0:
        loss_w.writerow(["step", "wall_s", "lr", "loss", "dv_fresh", "readout_mse", "readout_mae"])
    eval_f = (run / "eval.csv").open("a", newline="")
    eval_w = csv.writer(eval_f)
    t0 = time.perf_counter() - wall
    while step < cfg["steps"]:
        batch = {k: torch.from_numpy(v).to(device) for k, v in queue.get().items()}
        lr = lr_at(step, cfg)
        for group in opt.param_groups:
            group["lr"] = lr
        theta = model(batch["hist"], batch["mx"], batch["my"])
        dv = fresh_dv(theta, batch["fresh"])
        est = dv_readout(theta, batch["hist"], batch["mx"], batch["my"])
        mse = ((est - batch["mi"]) ** 2).mean()
        loss = -dv.mean() + cfg["readout_weight"] * mse
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        opt.step()
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
        if step % cfg["eval_every"] == 0 or step == cfg["steps"]:
            ev = evaluate(model, val)
            if eval_f.tell() == 0:
                eval_w.writerow(["step", "wall_s", *ev])
            eval_w.writerow([step, f"{wall:.1f}", *(f"{v:.4f}" for v in ev.values())])
            eval_f.flush()
            print(f"step {step} wall {wall:.0f}s " + " ".join(f"{k}={v:.4f}" for k, v in ev.items()), flush=True)
        if step % cfg["checkpoint_every"] == 0 or step == cfg["steps"]:
            loss_f.flush()
            tmp = run / "checkpoint.tmp"
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "wall_s": wall}, tmp)
            tmp.replace(ckpt_path)
            meta = {
                "config": mcfg.to_dict(),
                "step": step,
                "train_wall_s": round(wall, 1),
                "device": str(device),
                "run": cfg["name"],
            }
            save_weights(model, run / "model.safetensors", meta)
    for w in workers:
        w.terminate()
    loss_f.close()
    eval_f.close()
    print(json.dumps({"done": step, "wall_s": round(wall, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
