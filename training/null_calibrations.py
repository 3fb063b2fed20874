"""Measure the null tables that ship in streamcorr/data/null/ for every shipped model.

    python -m training.null_calibrations [--windows 256 512 1024 2048] [--pairs 8000] [--out DIR]

For each shipped weights name (streamcorr.estimate.weights.SHIPPED_WEIGHTS) and window, on the CPU with the weights'
tie policy: MI estimates of independent pairs of white, autoregressive, oscillating, band-limited,
near-random-walk, quantised and held signals, tabulated by the pairs' effective sample size
(streamcorr.estimate.significance.NullTable.measure), written under the name the engine's cache looks for. Files of
fingerprints no shipped model has any more (replaced weights) are removed, so the folder always matches the
weights (tests/test_user_mistakes.py checks it). Run it after replacing a shipped model: about 1 min per
1,000 pairs at window 2048 on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from streamcorr.engine.changes import SHIPPED_NULL_DIR, calibration_file_name
from streamcorr.estimate.estimator import Estimator
from streamcorr.estimate.significance import NullTable
from streamcorr.estimate.weights import SHIPPED_WEIGHTS


def write_calibrations(names: list[str], windows: list[int], out: Path, n_pairs: int) -> list[Path]:
    """Measure and write one file per (model, window); remove files of fingerprints not among ``names``."""
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    fingerprints = set()
    for name in names:
        est = Estimator(name, device="cpu", compile=False)  # eager: the compiled paths agree within 1e-5 nats
        fingerprints.add(est.fingerprint.split("-")[0])  # the weights' digest: files of any tie policy stay
        for window_len in windows:
            t0 = time.perf_counter()
            table = NullTable.measure(est.estimate_batch, window_len, n_pairs=n_pairs, ties=est.ties)
            path = out / calibration_file_name(est.fingerprint, window_len)
            path.write_text(table.to_json())
            written.append(path)
            print(f"{name} window {window_len}: {path.name} ({time.perf_counter() - t0:.0f} s, "
                  f"tail check {table.tail_check:.2f})", flush=True)  # fmt: skip
    for old in out.glob("*.json"):
        if not any(old.name.startswith(f"nulltable-{f}-") for f in fingerprints):
            old.unlink()
            print(f"removed {old.name} (no shipped model has that fingerprint, or an older format)", flush=True)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--windows", type=int, nargs="+", default=[256, 512, 1024, 2048])
    ap.add_argument("--pairs", type=int, default=6000)
    ap.add_argument("--names", nargs="+", default=sorted(SHIPPED_WEIGHTS))
    ap.add_argument("--out", type=Path, default=SHIPPED_NULL_DIR)
    args = ap.parse_args(argv)
    write_calibrations(args.names, args.windows, args.out, args.pairs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
