"""What the significance of real streams costs per hop: effective sizes, own rows, surrogate nulls.

    python -m bench.significance_cost [--hops 20] [--quick]

Two engines on the same pushed samples, their hops interleaved: the defaults, and the settings that treat
every tick as an independent sample (``repeated_rows: keep``, ``significance: iid``, ``surrogates: 0``).
Cases: 64 white channels at 100 Hz with every pair dependent (a common factor), window 1024, every pair by
the network each 1-s hop; the same with smooth channels (AR(1), 0.5-s time constants: every pair gets its own
surrogate null and the folded-innovation test); and 256 channels with screening on (white, a few dependent
pairs). Reported: the
median hop time of each, the ratio, and the time in the significance stage. Results go to
bench/results/significance_cost.json and .md.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from scipy.signal import lfilter

from bench.common import environment, write_results
from streamcorr.engine.core import Engine, EngineConfig

BEFORE = {"repeated_rows": "keep", "significance": "iid", "surrogates": 0}


def _data(case: str, channels: int, n: int, rng: np.random.Generator) -> np.ndarray:
    if case == "dense":  # every pair dependent: one common factor
        return rng.standard_normal((1, n)) + 0.8 * rng.standard_normal((channels, n))
    if case == "smooth":  # every pair dependent, each channel smooth (0.5-s time constants at 100 Hz)
        x = lfilter([1.0], [1.0, -0.98], rng.standard_normal((channels + 1, n + 2000)), axis=1)[:, 2000:]
        return x[:1] + 0.8 * x[1:]
    x = rng.standard_normal((channels, n))
    x[1::16] = x[0::16][: len(x[1::16])] ** 2 + 0.3 * rng.standard_normal((len(x[1::16]), n))
    return x


def run_case(case: str, channels: int, window: int, hops: int, seed: int = 0) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    names = [f"c{k:03d}" for k in range(channels)]
    n = window + (hops + 2) * 100
    data = _data(case, channels, n, rng)
    t = 1_732_700_000.0 + np.arange(n) / 100.0
    common = {"channels": names, "window_len": window, "hop_samples": 100, "rate_hz": 100.0,
              "skip_stale_hops": False, "max_future_s": None, "buffer_len": n,
              "screening": "on" if case == "screened" else "off"}  # fmt: skip
    engines = {"after": Engine(EngineConfig(**common)), "before": Engine(EngineConfig(**(common | BEFORE)))}
    for eng in engines.values():
        eng.push_frame(t, dict(zip(names, data, strict=True)))
    ends = {k: list(e.due_windows()) for k, e in engines.items()}
    times: dict[str, list[float]] = {k: [] for k in engines}
    for h in range(min(len(v) for v in ends.values())):
        order = list(engines) if h % 2 == 0 else list(engines)[::-1]
        for k in order:
            t0 = time.perf_counter()
            engines[k].evaluate(ends[k][h])
            times[k].append(time.perf_counter() - t0)
    warm = slice(2, None)  # the first hops build the sliding ranks and warm the network
    after, before = float(np.median(times["after"][warm])), float(np.median(times["before"][warm]))
    stages = engines["after"].counters.stage_s
    return {
        "case": case,
        "channels": channels,
        "window": window,
        "hops": len(times["after"]),
        "hop_s_after": after,
        "hop_s_before": before,
        "ratio": after / before,
        "significance_share": stages.get("significance", 0.0) / max(1e-9, sum(stages.values())),
        "surrogate_pairs": engines["after"].surrogates.measured,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hops", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="16 and 64 channels, window 256, 5 hops (a smoke run)")
    args = ap.parse_args(argv)
    cases = [("dense", 64, 1024), ("smooth", 64, 1024), ("screened", 256, 1024)]
    if args.quick:
        cases, args.hops = [("dense", 16, 256), ("smooth", 16, 256), ("screened", 64, 256)], 5
    rows = [run_case(c, ch, w, args.hops) for c, ch, w in cases]
    for r in rows:
        print(json.dumps(r), flush=True)
    table = "| case | channels | window | hop, defaults (s) | hop, every tick independent (s) | ratio | significance share |\n|---|---|---|---|---|---|---|\n"  # noqa: E501
    table += "".join(
        f"| {r['case']} | {r['channels']} | {r['window']} | {r['hop_s_after']:.3f} | {r['hop_s_before']:.3f} | "
        f"{r['ratio']:.3f} | {r['significance_share']:.1%} |\n"
        for r in rows
    )
    if not args.quick:
        write_results("significance_cost", {"args": vars(args), "rows": rows, "env": environment()}, table)
    else:
        print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
