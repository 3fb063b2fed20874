"""Plot a run's loss and validation curves to PNG: python -m training.plot training/runs/<name>"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _read(path: Path) -> dict[str, list[float]]:
    with path.open() as f:
        rows = list(csv.DictReader(f))
    return {k: [float(r[k]) for r in rows] for k in rows[0]} if rows else {}


def plot(run: Path) -> Path:
    loss, ev = _read(run / "loss.csv"), _read(run / "eval.csv")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    k = 50  # running mean over k steps; single batches are noisy
    for key, label in (("dv_fresh", "DV on fresh samples"), ("readout_mae", "|read-out - true MI| (train)")):
        ys = loss[key]
        smooth = [sum(ys[max(0, i - k + 1) : i + 1]) / len(ys[max(0, i - k + 1) : i + 1]) for i in range(len(ys))]
        axes[0].plot(loss["step"], smooth, label=label)
    axes[0].set_xlabel("step")
    axes[0].set_title(f"training (running mean of {k} batches)")
    axes[0].legend()
    if ev:
        axes[1].plot(ev["step"], ev["mae"], "o-", label="MAE")
        for key in [k for k in ev if k.startswith("bias_")]:
            axes[1].plot(ev["step"], ev[key], ".--", label=key.replace("bias_", "bias, MI in ").replace("_", "-"))
        axes[1].axhline(0, color="k", lw=0.5)
        axes[1].set_xlabel("step")
        axes[1].set_ylabel("nats")
        axes[1].set_title("held-out validation, T = 2000")
        axes[1].legend(fontsize=8)
    fig.tight_layout()
    out = run / "loss.png"
    fig.savefig(out, dpi=110)
    return out


if __name__ == "__main__":
    print(plot(Path(sys.argv[1])))
