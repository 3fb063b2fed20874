"""Incremental (sliding) rank copula vs a full re-sort of every window, in one run.

    python -m bench.copula_incremental [--quick]

For C channels advancing by h samples per hop, times SlidingRanks.update against
rank_transform of the whole window (median of repeats over many hops).
"""

from __future__ import annotations

import argparse

import numpy as np

from streamcorr.estimate.copula import SlidingRanks, rank_transform

from .common import environment, median_time, write_results


def time_case(window_len: int, hop: int, channels: int, n_hops: int = 20) -> dict[str, float]:
    """Per-hop seconds of the sliding update and of a full re-sort, same stream."""
    rng = np.random.default_rng(window_len + hop)
    stream = np.round(rng.standard_normal((channels, window_len + hop * n_hops)), 2)  # 0.01 steps: ties
    hops = [stream[:, window_len + k * hop : window_len + (k + 1) * hop] for k in range(n_hops)]
    windows = [stream[:, (k + 1) * hop : window_len + (k + 1) * hop] for k in range(n_hops)]

    def incremental() -> None:
        sr = SlidingRanks(channels, window_len)
        sr.update(stream[:, :window_len])
        for new in hops:
            sr.update(new)

    def full() -> None:
        for w in windows:
            rank_transform(w)

    base = median_time(lambda: SlidingRanks(channels, window_len).update(stream[:, :window_len]), repeats=5)
    t_inc = (median_time(incremental, repeats=5) - base) / n_hops  # the initial fill is not a hop
    t_full = median_time(full, repeats=5) / n_hops
    return {"window_len": window_len, "hop": hop, "channels": channels, "incremental_ms": t_inc * 1e3,
            "full_ms": t_full * 1e3, "speedup": t_full / t_inc}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    for window_len in (256, 1024) if args.quick else (256, 1024, 4096):
        for hop in (1, 10, 100):
            rows.append(time_case(window_len, hop, channels=64))
            print(rows[-1], flush=True)
    md = ["## Sliding rank copula vs full re-sort (64 channels, per hop, median of 5)\n",
          "| window | hop | incremental ms | full re-sort ms | speed-up |", "|---|---|---|---|---|"]  # fmt: skip
    md += [f"| {r['window_len']} | {r['hop']} | {r['incremental_ms']:.3f} | {r['full_ms']:.3f} | "
           f"{r['speedup']:.1f}x |" for r in rows]  # fmt: skip
    name = "copula_incremental_quick" if args.quick else "copula_incremental"
    write_results(name, {"env": environment(), "rows": rows}, "\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
