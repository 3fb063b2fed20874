"""Incremental (sliding) rank copula vs a full re-sort of every window, in one run.

    python -m bench.copula_incremental [--quick]

For C channels advancing by h samples per hop, times SlidingRanks.update against
rank_transform of the whole window (median of repeats over many hops).
"""

from __future__ import annotations

import argparse

import numpy as np

from streamcorr.copula import SlidingRanks, rank_transform

from .common import environment, median_time, write_results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    channels = 64
    rows = []
    for window_len in (256, 1024) if args.quick else (256, 1024, 4096):
        for hop in (1, 10, 100):
            rng = np.random.default_rng(window_len + hop)
            n_hops = 20
            stream = np.round(rng.standard_normal((channels, window_len + hop * (n_hops + 1))), 2)  # 0.01 steps: ties
            sr = SlidingRanks(channels, window_len)
            sr.update(stream[:, :window_len])
            pos = [window_len]

            def incremental() -> None:
                for _ in range(n_hops):
                    sr.update(stream[:, pos[0] : pos[0] + hop])
                    pos[0] += hop

            def full() -> None:
                for k in range(n_hops):
                    end = window_len + (k + 1) * hop
                    rank_transform(stream[:, end - window_len : end])

            def reset() -> None:
                sr.__init__(channels, window_len)  # type: ignore[misc]
                sr.update(stream[:, :window_len])
                pos[0] = window_len

            reset()
            incremental()  # compile
            times_inc = []
            for _ in range(5):
                reset()
                times_inc.append(median_time(incremental, repeats=1, warmup=0))
            t_inc = float(np.median(times_inc)) / n_hops
            t_full = median_time(full, repeats=5) / n_hops
            rows.append({"window_len": window_len, "hop": hop, "channels": channels,
                         "incremental_ms": t_inc * 1e3, "full_ms": t_full * 1e3, "speedup": t_full / t_inc})  # fmt: skip
            print(rows[-1], flush=True)
    md = ["## Sliding rank copula vs full re-sort (64 channels, per hop, median of 5)\n",
          "| window | hop | incremental ms | full re-sort ms | speed-up |", "|---|---|---|---|---|"]  # fmt: skip
    md += [f"| {r['window_len']} | {r['hop']} | {r['incremental_ms']:.3f} | {r['full_ms']:.3f} | "
           f"{r['speedup']:.1f}x |" for r in rows]  # fmt: skip
    write_results("copula_incremental_quick" if args.quick else "copula_incremental", {"env": environment(),
                  "rows": rows}, "\n".join(md))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
