"""Shared helpers for benchmarks: environment record, timing, result files."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Overridable so that smoke tests do not overwrite the committed results.
RESULTS = Path(os.environ.get("STREAMCORR_BENCH_RESULTS", Path(__file__).parent / "results"))


def environment() -> dict[str, Any]:
    import numba
    import numpy
    import torch

    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            check=False,
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "streamcorr", "models"],
                capture_output=True,
                text=True,
                cwd=Path(__file__).parent.parent,  # the paths above are the repository's
                check=False,
            ).stdout.strip()
        )
    except OSError:
        sha, dirty = "unknown", False
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "git_sha": sha + ("-dirty" if dirty else ""),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "numba_threads": numba.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numba": numba.__version__,
        "numpy": numpy.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }


def median_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    """Median wall time (s) of fn over repeats, after warm-up calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def write_results(name: str, data: dict[str, Any], markdown: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")
    env = data.get("env", {})
    footer = (
        f"\n_git {env.get('git_sha')}, {env.get('cpu')} ({env.get('cores')} cores), torch {env.get('torch')} "
        f"({env.get('torch_threads')} threads), numba {env.get('numba')}, {env.get('date')}_\n"
    )
    (RESULTS / f"{name}.md").write_text(markdown + footer)
    print(markdown + footer)


def rss_mb() -> float:
    """Resident memory of this process in MB (Linux /proc), NaN where unavailable."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def stop_process(proc: subprocess.Popen[bytes] | None, timeout_s: float) -> None:
    """Terminate proc if it still runs, and kill it if it has not exited within timeout_s."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
