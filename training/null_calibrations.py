"""Measure the null calibrations that ship in streamcorr/data/null/ for every shipped model.

    python -m training.null_calibrations [--windows 256 512 1024 2048] [--out DIR]

For each shipped weights name (streamcorr.weights.SHIPPED_WEIGHTS) and window, on the CPU with the
estimator's default tie policy, the calibration the engine would measure on a first start
(streamcorr.changes.NullCalibration.measure at the default false-alarm rate and min_effect), written under
the name its cache looks for. Files of fingerprints no shipped model has any more (replaced weights) are
removed, so the folder always matches the weights (tests/test_user_mistakes.py checks it). Run it after
replacing a shipped model: 4-7 s per window on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from streamcorr.changes import SHIPPED_NULL_DIR, NullCalibration, calibration_file_name
from streamcorr.config import Changes
from streamcorr.estimator import Estimator
from streamcorr.weights import SHIPPED_WEIGHTS

# the shipped files serve the engine's defaults (the config's changes section)
FALSE_ALARM_RATE: float = Changes().false_alarm_rate
MIN_EFFECT: float = Changes().min_effect


def write_calibrations(names: list[str], windows: list[int], out: Path) -> list[Path]:
    """Measure and write one file per (model, window); remove files of fingerprints not among ``names``."""
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    fingerprints = set()
    for name in names:
        est = Estimator(name, device="cpu", compile=False)  # eager: the compiled paths agree within 1e-5 nats
        fingerprints.add(est.fingerprint)
        for window_len in windows:
            t0 = time.perf_counter()
            cal = NullCalibration.measure(est.estimate_batch, window_len, FALSE_ALARM_RATE, MIN_EFFECT)
            path = out / calibration_file_name(est.fingerprint, window_len, FALSE_ALARM_RATE, MIN_EFFECT)
            path.write_text(json.dumps(dataclasses.asdict(cal)))
            written.append(path)
            print(f"{name} window {window_len}: {path.name} ({time.perf_counter() - t0:.0f} s)", flush=True)
    for old in out.glob("null-*.json"):
        if not any(old.name.startswith(f"null-{f}-") for f in fingerprints):
            old.unlink()
            print(f"removed {old.name} (no shipped model has that fingerprint)", flush=True)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--windows", type=int, nargs="+", default=[256, 512, 1024, 2048])
    ap.add_argument("--out", type=Path, default=SHIPPED_NULL_DIR)
    args = ap.parse_args(argv)
    write_calibrations(sorted(SHIPPED_WEIGHTS), args.windows, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
