"""Command line: `streamcorr run|check|demo|estimate|matrix|replay|report|version`; main(argv) returns an exit
code, so tests call it without a subprocess."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

import numpy as np

from .. import __version__
from ..errors import ConfigError, InputError, StreamcorrError
from ..offline.logs import ReadLimits
from .replay import add_limit_flags, limits_from


def _demo(args: argparse.Namespace) -> int:
    """The live demo: a simulated robot arm streamed through the engine, shown in the terminal and the browser."""
    if args.static:
        return _static_demo(args)
    import asyncio

    from ..demo import run_live_demo

    print("streamcorr demo: a simulated robot arm, 20 sensors at 50 Hz, every pair's MI refreshed each second.")
    print("Scripted faults at 40 s (joint 2 seizes), 80 s (fan fails), 120 s (loose cable). Ctrl-C stops.")
    try:
        web = None if args.no_web else args.port
        return asyncio.run(run_live_demo(seed=args.seed, speed=args.speed, duration_s=args.duration,
                                         script_scale=args.script_scale, web_port=web))  # fmt: skip
    except KeyboardInterrupt:
        return 130


def _static_demo(args: argparse.Namespace) -> int:
    """Estimate MI on a few relations where Pearson correlation is blind, timing the batch."""
    from ..estimate.estimator import default_estimator

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


MIN_ROWS = 32  # the model's shortest window
# columns stamped at different times (a wide log of several devices) share few rows
_ALIGN_HINT = "; columns sampled at their own times? `streamcorr replay {}` aligns them on a clock first"


def _estimate(args: argparse.Namespace) -> int:
    from ..estimate.estimator import Estimator

    table = _read_table(args.csv, limits_from(args))
    x, y = (table.column(c) for c in (args.x, args.y))
    keep = np.isfinite(x) & np.isfinite(y)
    dropped = int((~keep).sum())
    if args.max_lag_s is not None and dropped:  # a lag is counted in rows: they must be one clock's samples
        raise InputError(f"--max-lag-s needs {args.x!r} and {args.y!r} on one clock, every row with both ({dropped} "
                         f"of {len(x)} lack one); for channels on their own clocks use `streamcorr replay "
                         f"{args.csv} --max-lag-s {args.max_lag_s:g}`, which aligns them first")  # fmt: skip
    if keep.sum() < MIN_ROWS:
        raise StreamcorrError(
            f"{args.csv}: only {int(keep.sum())} rows have numbers in both {args.x!r} and {args.y!r}"
            f" ({dropped} dropped); the model needs at least {MIN_ROWS}{_ALIGN_HINT.format(args.csv)}"
        )
    if dropped:
        print(f"note: {dropped} of {len(x)} rows dropped (missing or non-numeric {args.x!r} or {args.y!r})",
              file=sys.stderr)  # fmt: skip
    if args.max_lag_s is None:
        if args.rate_hz is not None:
            print("note: --rate-hz is used only with --max-lag-s", file=sys.stderr)
        print(f"{Estimator().estimate(x[keep], y[keep]):.4f}")
        from .lag import smooth_note

        smooth_note(x[keep], y[keep])
        return 0
    from .lag import print_lag_curve

    return print_lag_curve(args, None if table.time is None else table.column(table.time), x, y)


class _Table:
    """Numeric columns of a data file: names, values (C, T) with NaN for empty or non-numeric cells, the
    columns skipped because nothing in them is a number, and the time column (t, time, ...) if any."""

    def __init__(self, path: str, names: list[str], values: np.ndarray, skipped: list[str], time: str | None) -> None:
        self.path, self.names, self.values, self.skipped, self.time = path, names, values, skipped, time

    def column(self, name: str) -> np.ndarray:
        if name not in self.names:
            why = " (it has no numbers)" if name in self.skipped else ""
            raise StreamcorrError(f"column {name!r} not in {self.path}{why}; numeric columns: {_list(self.names)}")
        return self.values[self.names.index(name)]


def _list(names: list[str], limit: int = 20) -> str:
    shown = ", ".join(repr(n) if len(n) < 40 else repr(n[:37] + "...") for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "") if names else "none"


def _read_table(path: str, limits: ReadLimits | None = None) -> _Table:
    """A CSV (delimiter ',', ';', tab or '|', from the header) or Parquet file through the replay's table reader:
    cells that are not numbers read as NaN; the time column (t, time, ...) is named apart, as the replay names it."""
    import pyarrow.types as pt

    from ..offline.logs import TIME_COLUMNS, read_table

    tab, ragged = read_table(path, limits=limits or ReadLimits())
    columns = [
        (name, np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64)
         if pt.is_integer(col.type) or pt.is_floating(col.type)
         else np.asarray(col.cast("string").fill_null("").to_numpy(zero_copy_only=False), dtype=object))
        for name, col in zip(tab.column_names, tab.columns, strict=True)
    ]  # fmt: skip
    if not columns or len(columns[0][1]) == 0:
        raise StreamcorrError(f"{path} has a header row but no data rows")
    if ragged:
        print(f"note: {ragged} rows of {path} do not have {len(columns)} fields; they are left out", file=sys.stderr)
    names: list[str] = []
    values: list[np.ndarray] = []
    skipped: list[str] = []
    comma: list[str] = []
    for k, (name, cells) in enumerate(columns):
        label = name or f"column {k + 1}"
        numbers = cells if cells.dtype == np.float64 else _numbers(cells)
        if cells.dtype == object and np.isnan(numbers).all() and not any(c.strip().lower() == "nan" for c in cells):
            skipped.append(label)
            if _decimal_commas(cells):
                comma.append(label)
        else:
            names.append(label)
            values.append(numbers)
    if skipped:
        hint = f" ({_list(comma)} hold decimal commas: write 1.5, not 1,5)" if comma else ""
        print(f"note: skipped columns without numbers: {_list(skipped)}{hint}", file=sys.stderr)
    if not names:
        hint = "" if len(columns) > 1 else "; only one column found (is the delimiter one of , ; tab |?)"
        raise StreamcorrError(f"{path} has no numeric column{hint}")
    lower = {n.lower(): n for n in names}
    time = next((lower[c] for c in TIME_COLUMNS if c in lower), None)
    return _Table(path, names, np.stack(values), skipped, time)


def _decimal_commas(cells: np.ndarray) -> bool:
    """True when most non-empty cells read as numbers once a decimal comma becomes a point."""
    filled = [c for c in cells[:1000] if c.strip()]
    return bool(filled) and np.isfinite(_numbers(np.array([c.replace(",", ".") for c in filled]))).mean() > 0.9


def _numbers(cells: np.ndarray) -> np.ndarray:
    """float64 of each cell; NaN where the cell is empty or not a number."""
    try:
        return np.asarray(cells, dtype=np.float64)
    except ValueError:
        out = np.full(len(cells), np.nan)
        for k, c in enumerate(cells):
            with contextlib.suppress(ValueError):
                out[k] = float(c)
        return out


def _matrix(args: argparse.Namespace) -> int:
    from ..estimate.estimator import Estimator

    table = _read_table(args.file, limits_from(args))
    names = list(args.columns) if args.columns else [n for n in table.names if n != table.time]
    if not args.columns and table.time is not None:
        print(f"note: column {table.time!r} is time, left out of the matrix (--columns to choose)", file=sys.stderr)
    data = np.stack([table.column(c) for c in names]) if names else np.zeros((0, table.values.shape[1]))
    if len(names) < 2:
        raise StreamcorrError(f"{args.file}: a matrix needs at least 2 numeric columns; found {_list(names)}")
    n_rows = data.shape[1]
    start = args.start
    if not 0 <= start < n_rows:
        raise StreamcorrError(f"--start {start} is outside the file: it has {n_rows} data rows (0..{n_rows - 1})")
    if args.window is not None and args.window < MIN_ROWS:
        raise StreamcorrError(f"--window {args.window}: the model needs at least {MIN_ROWS} rows")
    stop = min(n_rows, start + args.window) if args.window else n_rows
    if args.window and start + args.window > n_rows:
        print(f"note: the file ends at row {n_rows - 1}; the window is rows {start}..{stop - 1}", file=sys.stderr)
    data = data[:, start:stop]
    if data.shape[1] < MIN_ROWS:
        raise StreamcorrError(
            f"rows {start}..{stop - 1} are {data.shape[1]} rows; the model needs at least {MIN_ROWS}"
            " (use an earlier --start or a longer file)"
        )
    finite = np.isfinite(data)
    for name, ok in zip(names, finite, strict=True):
        if not ok.all():
            print(f"note: column {name!r}: {int((~ok).sum())} of {len(ok)} rows missing or non-numeric, dropped"
                  " pairwise", file=sys.stderr)  # fmt: skip
    mi = np.full((len(names), len(names)), np.nan)
    i, j = np.triu_indices(len(names), 1)
    both = (finite[i] & finite[j]).sum(axis=1)
    ok = both >= MIN_ROWS
    if (~ok).any():
        short = [f"{names[a]}~{names[b]}" for a, b in zip(i[~ok], j[~ok], strict=True)]
        print(f"note: fewer than {MIN_ROWS} rows with both values, shown as '-': {_list(short, 10)}"
              f"{_ALIGN_HINT.format(args.file)}", file=sys.stderr)  # fmt: skip
    if not ok.any():  # as `estimate` on the same data: an error, not an empty matrix
        raise StreamcorrError(f"{args.file}: no pair of columns has {MIN_ROWS} rows with both values"
                              f"{_ALIGN_HINT.format(args.file)}")  # fmt: skip
    mi[i[ok], j[ok]] = mi[j[ok], i[ok]] = Estimator(nonfinite="drop").estimate_batch(data[i[ok]], data[j[ok]])
    width = max(8, *(len(n) for n in names))
    print(f"MI (nats) between columns of {args.file}, rows {start}..{stop - 1}\n")
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
    try:
        fig.savefig(path, dpi=100)
    except OSError as exc:
        msg = f"cannot write the heatmap to {path}: {exc.strerror or exc} (--png PATH or --no-png)"
        raise StreamcorrError(msg) from None
    finally:
        plt.close(fig)


def _check(args: argparse.Namespace) -> int:
    from ..config import load_config
    from ..daemon.exposure import exposed_listeners
    from ..engine.changes import first_start_note
    from ..engine.settings import EngineConfig, fast_path_cost, lag_cost
    from ..ingest.payload import source_decoder

    cfg = load_config(args.config)
    ec = EngineConfig.from_config(cfg)
    for k, s in enumerate(cfg.sources):  # what `run` refuses at start: a payload setting the schema lets through
        source_decoder(s, k, max_name_bytes=cfg.channels.max_name_bytes)
    if (rec := cfg.outputs.record) is not None:  # `run` would drop every file: say so now
        from ..publish.record import probe_writable

        if (why := probe_writable(rec.directory)) is not None:
            raise ConfigError(f"outputs.record.directory: cannot write to {rec.directory}: {why}; "
                              "make it a directory the daemon's user can write to")  # fmt: skip
    print(f"{args.config}: OK")
    for line in exposed_listeners(cfg):
        print(f"  warning: listening beyond loopback: {line}")
    for s in cfg.sources:
        if s.type == "mqtt":
            from ..transport.mqtt import describe_receive_buffer

            where = f"{s.host}:{s.port} topics {', '.join(s.topics)}; receive buffer "
            where += describe_receive_buffer(s.receive_buffer_bytes)
        else:
            where = f"{s.mode} {s.endpoint}"
        print(f"  source {s.type}: {where}")
    print(f"  window {ec.window_len} samples at {ec.rate_hz:g} Hz ({ec.window_len / ec.rate_hz:g} s), "
          f"hop {ec.hop_samples} samples; pairs: {cfg.pairs.mode}")  # fmt: skip
    n = len(ec.channels)
    print(f"  changes: {fast_path_cost(ec, n * (n - 1) // 2 if cfg.pairs.mode == 'all' and n > 1 else None)}")
    print(f"  lags: {lag_cost(ec)}")
    if (note := first_start_note(dict(ec.estimator), ec.window_len)) is not None:
        print(f"  note: {note}")
    if (rec := cfg.outputs.record) is not None:
        print(f"  record: {rec.directory} (writable), a new file every {rec.rotate_s:g} s, "
              f"at most {rec.max_bytes:,} bytes")  # fmt: skip
    outs = [name for name in ("mqtt", "record") if getattr(cfg.outputs, name) is not None]
    if (z := cfg.outputs.zmq) is not None:  # both sockets bind: a second daemon on this host needs other ports
        outs.insert(0, f"zmq ({z.endpoint}, late joiners {z.snapshot_endpoint or 'off'})")
    http = f"{cfg.http.host}:{cfg.http.port}" if cfg.http.enabled else "off"
    web = ", web view" if cfg.http.web else ""
    print(f"  outputs: {', '.join(outs) or 'none'}; http (/metrics, /healthz{web}): {http}")
    return 0


def _run(args: argparse.Namespace) -> int:
    import asyncio

    from ..config import load_config
    from ..daemon.service import Daemon
    from ..logutil import setup_logging
    from ..publish.sinks import cap_heap_arenas

    cfg = load_config(args.config)
    setup_logging(cfg.logging)
    if args.owns_process:
        cap_heap_arenas()  # a long-lived process: bounded heap fragmentation (streamcorr.publish.sinks)
    daemon = Daemon(cfg)
    asyncio.run(daemon.run())
    # Everything is closed. Finalising the interpreter would take seconds (torch's and numba's objects), and under
    # a thread still in a first-start calibration it can abort: the process ends here when it is ours.
    if args.owns_process or daemon.setup_abandoned:
        _exit_now(0)
    return 0


def _exit_now(code: int) -> None:
    """End the process without finalising the interpreter: streams flushed, then os._exit(code)."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _compile(args: argparse.Namespace) -> int:
    import time

    from ..estimate.estimator import Estimator

    t0 = time.perf_counter()
    aot = Estimator(args.weights, compile="aot").aot
    if aot is None:
        raise StreamcorrError("the ahead-of-time network is for a CPU without bf16 autocast; nothing to compile")
    if aot.state != "ready":
        print(f"compiling the network for this CPU into {aot.path.parent} (once per machine, weights and torch "
              "version; about 30 s on 2 cores)...", flush=True)  # fmt: skip
        if not aot.ensure(args.timeout_s):
            log = aot.path.with_suffix(".log")
            raise StreamcorrError(f"the build did not finish ({aot.state}); its output is in {log}")
    print(f"ready: {aot.path} ({time.perf_counter() - t0:.0f} s); every later start loads it")
    return 0


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="streamcorr", description="Real-time mutual information between streams.")
    ap.add_argument("-V", "--version", action="version", version=f"streamcorr {__version__}")
    sub = ap.add_subparsers(dest="cmd", metavar="COMMAND")
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
    est = sub.add_parser("estimate", help="MI between two columns of a CSV or Parquet file (CSV: header row required)")
    est.add_argument("csv")
    est.add_argument("x")
    est.add_argument("y")
    est.add_argument(
        "--max-lag-s",
        type=float,
        help="also search lags within +-this many seconds: prints MI against "
        "the lag of y (> 0: y follows x) and the best lag",
    )
    est.add_argument("--rate-hz", type=float, help="with --max-lag-s: the rows' rate (default: from the time column)")
    add_limit_flags(est)
    est.set_defaults(func=_estimate)
    mat = sub.add_parser("matrix", help="MI matrix of all numeric column pairs of a CSV (header row) or Parquet file")
    mat.add_argument("file")
    mat.add_argument("--columns", nargs="+", help="only these columns (default: all numeric columns)")
    mat.add_argument("--start", type=int, default=0, help="first data row of the window (0-based)")
    mat.add_argument("--window", type=int, help="rows in the window (default: to the end of the file)")
    mat.add_argument("--png", help="heatmap path (default: FILE without suffix + _mi.png)")
    mat.add_argument("--no-png", action="store_true", help="print only")
    add_limit_flags(mat)
    mat.set_defaults(func=_matrix)
    chk = sub.add_parser("check", help="validate a configuration file and print what it sets up")
    chk.add_argument("config")
    chk.set_defaults(func=_check)
    run = sub.add_parser("run", help="run the daemon with a configuration file (stop with Ctrl-C or SIGTERM)")
    run.add_argument("config")
    run.set_defaults(func=_run)
    comp = sub.add_parser("compile", help="build the network's ahead-of-time package for this CPU now (e.g. in an "
                          "image build) instead of in the background at the first start")  # fmt: skip
    comp.add_argument("--weights", default=None, help="a shipped model name or a .safetensors path (default: v2)")
    comp.add_argument("--timeout-s", type=float, default=900.0)
    comp.set_defaults(func=_compile)
    from .replay import add_replay_commands  # replay and report live in their own module

    add_replay_commands(sub)
    ver = sub.add_parser("version", help="print the version")
    ver.set_defaults(func=lambda _a: print(__version__) or 0)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit code (0 ok, 2 a usage or input error, 1 anything unexpected,
    130 Ctrl-C). No input, file or keystroke shows a traceback; STREAMCORR_DEBUG=1 shows unexpected ones."""
    ap = _parser()
    try:
        args = ap.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error argparse has already printed
        return exc.code if isinstance(exc.code, int) else 2
    if args.cmd is None:
        ap.print_help()
        return 0
    args.owns_process = argv is None  # the console script: `run` may end the process itself
    try:
        return int(args.func(args))
    except StreamcorrError as exc:
        path = args.config if args.cmd in ("run", "check") else None  # every problem of the file names the file
        where = f"{path}: " if isinstance(exc, ConfigError) and path and not str(exc).startswith(str(path)) else ""
        print(f"streamcorr: error: {where}{exc}", file=sys.stderr)
        if args.owns_process:  # a reader's worker threads left by the error can abort finalisation (exit -6)
            _exit_now(2)
        return 2
    except KeyboardInterrupt:
        print("streamcorr: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `streamcorr matrix ... | head`: the reader left; say nothing more
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush must not fail again
        return 141
    except Exception as exc:
        if os.environ.get("STREAMCORR_DEBUG"):
            raise
        print(f"streamcorr: unexpected error: {type(exc).__name__}: {str(exc)[:500]}\n"
              "  (a bug: please report it; STREAMCORR_DEBUG=1 shows the traceback)", file=sys.stderr)  # fmt: skip
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
