"""One benchmark on two versions of the code, back to back on the same machine: did a change move its figures?

    python -m bench.ab --base REV [--repeats 2] [--keys k1,k2] [--name NAME] -- MODULE ARGS...

e.g. ``python -m bench.ab --base 64c2f8f -- engine_throughput live --duration-s 90``. The base revision is
checked out into a temporary git worktree; runs alternate base, head, base, head (so drift in machine load
hits both alike), each writing its result files into a directory of its own (STREAMCORR_BENCH_RESULTS). The
numeric figures of each run's JSON are flattened (``runs.0.steady_samples_per_s``) and tabulated: median per
version and head / base. Written to ``results/ab_<name>.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import environment, write_results

REPO = Path(__file__).resolve().parents[1]


def _flatten(obj: Any, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    if isinstance(obj, dict):
        items = list(obj.items())
    elif isinstance(obj, list):
        items = [(str(v.get("transport", k)) if isinstance(v, dict) else str(k), v) for k, v in enumerate(obj)]
    else:
        items = []
    for k, v in items:
        key = f"{prefix}{k}"
        if k == "env":
            continue
        if isinstance(v, bool):
            continue
        if isinstance(v, int | float):
            out[key] = float(v)
        elif isinstance(v, dict | list):
            out.update(_flatten(v, key + "."))
    return out


def _run(tree: Path, module: str, args: list[str], out_dir: Path) -> dict[str, float]:
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "STREAMCORR_BENCH_RESULTS": str(out_dir), "PYTHONPATH": str(tree)}
    t0 = time.time()
    subprocess.run([sys.executable, "-m", f"bench.{module}", *args], cwd=tree, env=env, check=True)
    written = [p for p in out_dir.glob("*.json") if p.stat().st_mtime >= t0 - 1]
    if not written:
        raise SystemExit(f"bench.{module} wrote no JSON result in {out_dir}")
    return _flatten(json.loads(max(written, key=lambda p: p.stat().st_mtime).read_text()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="git revision to compare against (the working tree is head)")
    ap.add_argument("--repeats", type=int, default=2, help="runs per version, interleaved")
    ap.add_argument("--keys", default="", help="comma-separated substrings: only figures whose name has one")
    ap.add_argument("--name", default=None, help="results file stem after ab_ (default: the module)")
    ap.add_argument("bench", nargs=argparse.REMAINDER, help="-- MODULE ARGS...")
    a = ap.parse_args()
    rest = a.bench[1:] if a.bench[:1] == ["--"] else a.bench
    if not rest:
        ap.error("give the benchmark after --, e.g. -- engine_throughput live")
    module, args = rest[0], rest[1:]
    base_sha = subprocess.run(["git", "rev-parse", "--short", a.base], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip
    runs: dict[str, list[dict[str, float]]] = {"base": [], "head": []}
    with tempfile.TemporaryDirectory(prefix="streamcorr-ab-") as tmp:
        base_tree = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base_tree), a.base], cwd=REPO, check=True)
        try:
            for k in range(a.repeats):
                for version, tree in (("base", base_tree), ("head", REPO)):
                    print(f"== {version} run {k + 1}/{a.repeats}: bench.{module} {' '.join(args)}", flush=True)
                    runs[version].append(_run(tree, module, args, Path(tmp) / f"{version}{k}"))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=REPO, check=False)
    wanted = [s for s in a.keys.split(",") if s]
    keys = [k for k in runs["head"][0] if k in runs["base"][0] and (not wanted or any(w in k for w in wanted))]
    rows = []
    for key in keys:
        b = statistics.median(r[key] for r in runs["base"] if key in r)
        h = statistics.median(r[key] for r in runs["head"] if key in r)
        rows.append({"figure": key, "base": b, "head": h, "ratio": h / b if b else None})
    env = environment()
    name = a.name or module
    md = [f"# A/B: bench.{module} {' '.join(args)}", "",
          f"base = `{base_sha}`, head = `{env['git_sha']}`; {a.repeats} runs each, interleaved base/head; "
          "median per version.", "", "| figure | base | head | head / base |", "|---|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.3f}"
        md.append(f"| {r['figure']} | {r['base']:.6g} | {r['head']:.6g} | {ratio} |")
    data = {"env": env, "base": base_sha, "module": module, "args": args, "repeats": a.repeats, "rows": rows,
            "runs": runs}  # fmt: skip
    write_results(f"ab_{name}", data, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
