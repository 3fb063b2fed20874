"""Command line: `streamcorr run|check|demo|estimate|matrix|version`.

main(argv) returns an exit code, so tests call it without a subprocess.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from . import __version__
from .errors import StreamcorrError


def _demo(args: argparse.Namespace) -> int:
    """The live demo: a simulated robot arm streamed through the engine, shown in the terminal and the browser."""
    if args.static:
        return _static_demo(args)
    import asyncio

    from .demo import run_live_demo

    print("streamcorr demo: a simulated robot arm, 20 sensors at 50 Hz, every pair's MI refreshed each second.")
    print("Scripted faults at 40 s (joint 2 seizes), 80 s (fan fails), 120 s (loose cable). Ctrl-C stops.")
    try:
        return asyncio.run(
            run_live_demo(
                seed=args.seed,
                speed=args.speed,
                duration_s=args.duration,
                script_scale=args.script_scale,
                web_port=None if args.no_web else args.port,
            )
        )
    except KeyboardInterrupt:
        return 130


def _static_demo(args: argparse.Namespace) -> int:
    """Estimate MI on a few relations where Pearson correlation is blind, timing the batch."""
    from .estimator import default_estimator

    rng = np.random.default_rng(args.seed)
    t = args.window_len
    x = rng.standard_normal(t)
    noise = rng.standard_normal(t)
    cases = {
        "independent": rng.standard_normal(t),
        "linear (rho = 0.8)": 0.8 * x + 0.6 * noise,
        "quadratic y = x^2 + noise": x**2 + 0.3 * noise,
        "circle (angle -> cos, sin)": np.cos(3 * x) + 0.1 * noise,
        "sign-flip |x| * s": np.abs(x) * rng.choice([-1, 1], t) + 0.1 * noise,
        "heavy-tailed monotone exp(3x)": np.exp(3 * x + 0.5 * noise),
    }
    t0 = time.perf_counter()
    est = default_estimator()
    load_s = time.perf_counter() - t0
    ys = np.stack(list(cases.values()))
    t0 = time.perf_counter()
    mi = est.estimate_batch(np.broadcast_to(x, ys.shape), ys)
    est_s = time.perf_counter() - t0
    print(f"streamcorr {__version__}: InfoNet MI vs Pearson correlation, window of {t} samples\n")
    print(f"{'relation':34s} {'pearson r':>10s} {'MI (nats)':>10s}")
    for (name, y), m in zip(cases.items(), mi, strict=True):
        print(f"{name:34s} {np.corrcoef(x, y)[0, 1]:10.3f} {m:10.3f}")
    print(f"\nmodel load {load_s * 1e3:.0f} ms; {len(cases)} pairs estimated in {est_s * 1e3:.1f} ms")
    return 0


def _estimate(args: argparse.Namespace) -> int:
    from .estimator import Estimator

    data = np.genfromtxt(args.csv, delimiter=",", names=True, dtype=np.float64)
    names = data.dtype.names or ()
    for col in (args.x, args.y):
        if col not in names:
            raise StreamcorrError(f"column {col!r} not in {args.csv}; columns are {', '.join(names)}")
    est = Estimator(nonfinite="drop")
    print(f"{est.estimate(data[args.x], data[args.y]):.4f}")
    return 0


def _read_table(path: str) -> tuple[list[str], np.ndarray]:
    """Column names and values (C, T) of a CSV (header row) or Parquet file; non-numeric cells become NaN."""
    if path.endswith((".parquet", ".pq")):
        try:
            import pyarrow.parquet as pq  # optional: only for Parquet input
        except ImportError:
            raise StreamcorrError("reading Parquet needs pyarrow: pip install pyarrow (or convert to CSV)") from None
        tab = pq.read_table(path)
        names = [n for n, col in zip(tab.column_names, tab.columns, strict=True) if _numeric(col.type)]
        return names, np.stack([tab.column(n).to_numpy(zero_copy_only=False).astype(np.float64) for n in names])
    try:
        data = np.genfromtxt(path, delimiter=",", names=True, dtype=np.float64)
    except OSError as exc:
        raise StreamcorrError(f"cannot read {path}: {exc}") from None
    names = list(data.dtype.names or ())
    if not names:
        raise StreamcorrError(f"{path} has no header row naming its columns")
    return names, np.stack([np.atleast_1d(data[n]) for n in names])


def _numeric(arrow_type: object) -> bool:
    import pyarrow.types as pt

    return bool(pt.is_integer(arrow_type) or pt.is_floating(arrow_type))


def _matrix(args: argparse.Namespace) -> int:
    from .estimator import Estimator

    names, data = _read_table(args.file)
    if args.columns:
        missing = [c for c in args.columns if c not in names]
        if missing:
            raise StreamcorrError(f"columns {', '.join(missing)} not in {args.file}; columns are {', '.join(names)}")
        data = data[[names.index(c) for c in args.columns]]
        names = list(args.columns)
    start = args.start or 0
    stop = start + args.window if args.window else data.shape[1]
    data = data[:, start:stop]
    est = Estimator(nonfinite="drop")
    mi = est.matrix(data)
    width = max(8, *(len(n) for n in names))
    print(f"MI (nats) between columns of {args.file}, rows {start}..{start + data.shape[1] - 1}\n")
    print(" " * width + "".join(f"{n[:width]:>{width + 1}}" for n in names))
    for n, row in zip(names, mi, strict=True):
        print(f"{n:<{width}}" + "".join(f"{'-' if np.isnan(v) else f'{v:.3f}':>{width + 1}}" for v in row))
    if not args.no_png:
        png = args.png or str(Path(args.file).with_suffix("")) + "_mi.png"
        _heatmap_png(mi, names, png, f"MI (nats): {Path(args.file).name}")
        print(f"\nheatmap written to {png}")
    return 0


def _heatmap_png(mi: np.ndarray, names: list[str], path: str, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        msg = 'the heatmap PNG needs matplotlib: pip install "streamcorr[plot]" (or pass --no-png)'
        raise StreamcorrError(msg) from None
    n = len(names)
    fig, ax = plt.subplots(figsize=(2 + 0.45 * n, 1.5 + 0.4 * n))
    im = ax.imshow(np.ma.masked_invalid(mi), cmap="magma", vmin=0)
    ax.set_xticks(range(n), names, rotation=90)
    ax.set_yticks(range(n), names)
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label="nats")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _check(args: argparse.Namespace) -> int:
    from .config import load_config
    from .daemon import engine_config

    cfg = load_config(args.config)
    ec = engine_config(cfg)
    print(f"{args.config}: OK")
    for s in cfg.sources:
        where = f"{s.host}:{s.port} topics {', '.join(s.topics)}" if s.type == "mqtt" else f"{s.mode} {s.endpoint}"
        print(f"  source {s.type}: {where}")
    print(f"  window {ec.window_len} samples at {ec.rate_hz:g} Hz ({ec.window_len / ec.rate_hz:g} s), "
          f"hop {ec.hop_samples} samples; pairs: {cfg.pairs.mode}")  # fmt: skip
    outs = [name for name in ("zmq", "mqtt") if getattr(cfg.outputs, name) is not None]
    http = f"{cfg.http.host}:{cfg.http.port}" if cfg.http.enabled else "off"
    web = ", web view" if cfg.http.web else ""
    print(f"  outputs: {', '.join(outs) or 'none'}; http (/metrics, /healthz{web}): {http}")
    return 0


def _run(args: argparse.Namespace) -> int:
    import asyncio

    from .config import load_config
    from .daemon import Daemon, setup_logging

    cfg = load_config(args.config)
    setup_logging(cfg.logging.level, cfg.logging.format)
    asyncio.run(Daemon(cfg).run())
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="streamcorr", description="Real-time mutual information between streams.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    demo = sub.add_parser("demo", help="live demo: simulated robot arm, terminal view and web view (no broker)")
    demo.add_argument("--speed", type=float, default=1.0, help="simulation speed, x real time")
    demo.add_argument("--duration", type=float, help="seconds of simulated time (default: the script + 40 s)")
    demo.add_argument("--script-scale", type=float, default=1.0, help="scale the scripted fault times")
    demo.add_argument("--port", type=int, default=8050, help="web view port on 127.0.0.1 (0: any free port)")
    demo.add_argument("--no-web", action="store_true", help="terminal view only")
    demo.add_argument("--static", action="store_true", help="instead: Pearson vs MI on six fixed relations")
    demo.add_argument("--window-len", type=int, default=2000, help="window of the --static examples")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_demo)
    est = sub.add_parser("estimate", help="MI between two columns of a CSV file (header row required)")
    est.add_argument("csv")
    est.add_argument("x")
    est.add_argument("y")
    est.set_defaults(func=_estimate)
    mat = sub.add_parser("matrix", help="MI matrix of all column pairs of a CSV (header row) or Parquet file")
    mat.add_argument("file")
    mat.add_argument("--columns", nargs="+", help="only these columns (default: all numeric columns)")
    mat.add_argument("--start", type=int, default=0, help="first row of the window")
    mat.add_argument("--window", type=int, help="rows in the window (default: to the end of the file)")
    mat.add_argument("--png", help="heatmap path (default: FILE without suffix + _mi.png)")
    mat.add_argument("--no-png", action="store_true", help="print only")
    mat.set_defaults(func=_matrix)
    chk = sub.add_parser("check", help="validate a configuration file and print what it sets up")
    chk.add_argument("config")
    chk.set_defaults(func=_check)
    run = sub.add_parser("run", help="run the daemon with a configuration file (stop with Ctrl-C or SIGTERM)")
    run.add_argument("config")
    run.set_defaults(func=_run)
    ver = sub.add_parser("version", help="print the version")
    ver.set_defaults(func=lambda _a: print(__version__) or 0)
    args = ap.parse_args(argv)
    try:
        return int(args.func(args))
    except StreamcorrError as exc:
        print(f"streamcorr: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
