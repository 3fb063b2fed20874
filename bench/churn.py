"""Channel churn: one new name a second beside three live channels, through the Engine in simulated time.

    python -m bench.churn [--minutes 10] [--quick] [--tag NAME]

Issue 29's workload: three channels stream at 100 Hz (a and b dependent), and every second a new name sends
one second of samples and falls silent. The engine runs at its defaults (window 1024, 1-s hop, screening
auto) with ``max_channels`` raised to 2,048 so that the names are not refused; each 1-s chunk is pushed with
``push_ns`` and every window that falls due is evaluated at once, so simulated time runs as fast as the hops.
Per simulated minute: channels in the matrix, process RSS, median and largest hop time, and the align stage's
share. Run it on a revision without channel retirement (``git worktree``) for the baseline.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import numpy as np

from streamcorr.engine.core import Engine, EngineConfig

from .common import environment, rss_mb, write_results

RATE = 100.0
PERIOD_NS = round(1e9 / RATE)


def run(minutes: float) -> dict:
    """Push ``minutes`` of the churn workload; returns per-minute rows and the settings."""
    kw = {"rate_hz": RATE, "max_channels": 2048, "skip_stale_hops": False}
    has_retire = "retire_after_s" in {f.name for f in dataclasses.fields(EngineConfig)}
    eng = Engine(EngineConfig(**kw))
    rng = np.random.default_rng(29)
    rows, hop_s = [], []
    align0 = 0.0
    rss0 = rss_mb()
    wall0 = time.perf_counter()
    for sec in range(round(minutes * 60)):
        t = (sec * int(RATE) + np.arange(int(RATE), dtype=np.int64)) * PERIOD_NS
        x = rng.standard_normal(len(t))
        eng.push_ns("a", t, x)
        eng.push_ns("b", t, x + 0.5 * rng.standard_normal(len(t)))
        eng.push_ns("c", t, rng.standard_normal(len(t)))
        eng.push_ns(f"name{sec:05d}", t, rng.standard_normal(len(t)))  # one second, then silent for good
        for end in eng.due_windows():
            h0 = time.perf_counter()
            eng.evaluate(end)
            hop_s.append(time.perf_counter() - h0)
        if (sec + 1) % 60 == 0:
            align = eng.counters.stage_s.get("align", 0.0)
            row = {
                "minute": (sec + 1) // 60,
                "channels": len(eng.channels),
                "pairs": len(eng._pairs),
                "rss_mb": round(rss_mb(), 1),
                "hop_median_s": round(statistics.median(hop_s), 4) if hop_s else None,
                "hop_max_s": round(max(hop_s), 4) if hop_s else None,
                "align_share": round((align - align0) / sum(hop_s), 3) if hop_s else None,
                "retired": getattr(eng.counters, "channels_retired", None),
                "wall_s": round(time.perf_counter() - wall0, 1),
            }
            rows.append(row)
            print(row, flush=True)
            hop_s, align0 = [], align
    settings = {"retire_after_s": eng.cfg.retire_after_s if has_retire else "n/a (no retirement)",
                "window_len": eng.cfg.window_len, "rate_hz": RATE, "hop_samples": eng.cfg.hop_samples,
                "rss_before_engine_mb": round(rss0, 1)}  # fmt: skip
    return {"rows": rows, "settings": settings}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--quick", action="store_true", help="two minutes (a smoke test, not for the table)")
    ap.add_argument("--tag", default="", help="suffix of the result files (e.g. base for the baseline)")
    args = ap.parse_args(argv)
    minutes = 2.0 if args.quick else args.minutes
    out = run(minutes)
    s = out["settings"]
    md = [f"## Channel churn: a new name a second beside 3 live channels, {minutes:g} simulated minutes\n",
          f"Engine defaults (window {s['window_len']}, {s['rate_hz']:g} Hz, hop {s['hop_samples']} samples), "
          f"max_channels 2048, retire_after_s {s['retire_after_s']}; RSS before the engine "
          f"{s['rss_before_engine_mb']} MB.\n",
          "| minute | channels | pairs | RSS MB | hop median s | hop max s | align share | retired |",
          "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    md += [f"| {r['minute']} | {r['channels']} | {r['pairs']} | {r['rss_mb']} | {r['hop_median_s']} | "
           f"{r['hop_max_s']} | {r['align_share']} | {r['retired']} |" for r in out["rows"]]  # fmt: skip
    name = "churn" + (f"_{args.tag}" if args.tag else "") + ("_quick" if args.quick else "")
    write_results(name, {"env": environment(), **out}, "\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
