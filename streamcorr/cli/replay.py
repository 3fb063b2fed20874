"""The `replay` and `report` commands of the command line (kept apart from cli/commands.py, which registers them).

Handlers raise StreamcorrError subclasses with the fix in the message; cli.main prints them without a
traceback and returns 2 (130 after Ctrl-C).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import signal
import sys
import threading
from pathlib import Path

from ..errors import InputError
from ..offline.logs import ReadLimits

__all__ = ["add_limit_flags", "add_replay_commands", "limits_from"]


def add_replay_commands(sub: argparse._SubParsersAction) -> None:
    rp = sub.add_parser(
        "replay",
        help="run a recorded log (CSV, Parquet, MCAP, ROS bag) through the engine, every hop; MI timeline + events",
        description="Replay a recorded log through the engine as fast as the machine allows. Settings come "
        "from a daemon config (-c; its sources are not needed) and/or the flags, which take precedence.",
    )
    rp.add_argument("log", help="CSV or Parquet (wide or long), .mcap, ROS 1 .bag, or a ROS 2 bag directory")
    rp.add_argument("-c", "--config", help="a daemon configuration file: channels, window, pairs, changes")
    rp.add_argument("-o", "--output", help="output directory (default: LOG's name + '_replay')")
    rp.add_argument("--list", action="store_true", help="list the log's topics and channels, then exit")
    rp.add_argument("--format", choices=["csv", "parquet", "mcap", "bag", "ros2"], help="default: from the name")
    rp.add_argument("--time-column", help="time column of a table (default: t, time, timestamp, ...)")
    rp.add_argument("--time-unit", default="s", choices=["s", "ms", "us", "ns"], help="of numeric times")
    rp.add_argument("--channel-column", help="long tables: the channel-name column (default: channel)")
    rp.add_argument("--value-column", help="long tables: the value column (default: value)")
    rp.add_argument("--topics", nargs="+", help="message logs: only these topics")
    rp.add_argument("--channels", nargs="+", help="only these channels (default: every numeric one)")
    rp.add_argument("--rate-hz", type=float, help="the common clock (default: config, else 100)")
    rp.add_argument("--window", type=int, help="window, samples of the clock (default: config, else 1024)")
    rp.add_argument("--hop", type=int, help="hop, samples of the clock (default: config, else one second)")
    rp.add_argument("--screening", choices=["on", "off"],
                    help="on: the cheap screen picks the network's pairs each hop (faster); off (default, and what "
                    "the config's 'auto' means in a replay): the network on every selected pair")  # fmt: skip
    rp.add_argument("--threads", type=int, help="threads of the model and the rank kernels (default: config's "
                    "estimator.threads, else all cores; 1 is often fastest on a machine busy with other "
                    "work)")  # fmt: skip
    rp.add_argument("--max-gap-s", type=float, help="a longer stretch without samples on any channel is skipped, "
                    "not evaluated hop by hop, and listed in replay.json (default: 4 windows)")  # fmt: skip
    add_limit_flags(rp)
    rp.add_argument(
        "--max-lag-s",
        type=float,
        help="search each pair's best lag within +-this many seconds: timeline "
        "columns lag_s (> 0: the second channel follows the first) and mi_lag (default: config, else off)",
    )
    rp.add_argument("--no-progress", action="store_true", help="no progress bar")
    rp.set_defaults(func=_replay)
    rep = sub.add_parser("report", help="one self-contained HTML file from a replay's output directory")
    rep.add_argument("outdir", help="a directory written by 'streamcorr replay' or by a daemon's outputs.record")
    rep.add_argument("-o", "--output", help="HTML file (default: OUTDIR/report.html)")
    rep.add_argument("--top", type=int, default=8, help="strongest pairs drawn over time (besides event pairs)")
    rep.add_argument("--at", type=float, nargs="+", help="stream times (s) of the matrices shown (default: 4)")
    rep.set_defaults(func=_report)


def add_limit_flags(parser: argparse.ArgumentParser) -> None:
    """The reader's bounds (offline.logs.ReadLimits) as flags."""
    parser.add_argument("--max-samples", type=int, default=ReadLimits.max_samples,
                        help="refuse a file with more samples (table cells), over all channels (default "
                        "%(default)s; 16 bytes each once read)")  # fmt: skip
    parser.add_argument("--max-channels", type=int, default=ReadLimits.max_channels,
                        help="refuse a table with more channel columns or names; message fields beyond are left "
                        "out and counted (default %(default)s)")  # fmt: skip
    parser.add_argument("--max-mb", type=int, default=ReadLimits.max_mb,
                        help="MiB that a table's columns, one MCAP record or one decompressed chunk may take "
                        "(default %(default)s)")  # fmt: skip


def limits_from(args: argparse.Namespace) -> ReadLimits:
    for flag, value in (("--max-samples", args.max_samples), ("--max-channels", args.max_channels),
                        ("--max-mb", args.max_mb)):  # fmt: skip
        if value < 1:
            raise InputError(f"{flag} must be at least 1; got {value}")
    return ReadLimits(max_samples=args.max_samples, max_channels=args.max_channels, max_mb=args.max_mb)


def _replay(args: argparse.Namespace) -> int:
    """SIGTERM before the replay loop (reading the log, starting the engine) stops it as Ctrl-C does there: exit 130,
    nothing written yet; within the loop the replay's own handler writes what was done."""
    if threading.current_thread() is not threading.main_thread():
        return _replay_log(args)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _replay_log(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _replay_log(args: argparse.Namespace) -> int:
    from ..engine.settings import EngineConfig
    from ..offline.logs import open_log

    limits = limits_from(args)
    for flag, value in (("--rate-hz", args.rate_hz), ("--max-gap-s", args.max_gap_s)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise InputError(f"{flag} must be a finite number more than 0; got {value}")
    if args.max_lag_s is not None and not (math.isfinite(args.max_lag_s) and args.max_lag_s >= 0):
        raise InputError(f"--max-lag-s must be a finite number of seconds, 0 for off; got {args.max_lag_s}")
    rec = open_log(
        args.log,
        fmt=args.format,
        time_column=args.time_column,
        time_unit=args.time_unit,
        channel_column=args.channel_column,
        value_column=args.value_column,
        topics=args.topics,
        channels=args.channels,
        limits=limits,
    )
    if args.channels:
        missing = [c for c in args.channels if c not in rec.series]
        if missing:
            raise InputError(f"--channels: {', '.join(map(repr, missing))} not in {args.log}; see --list")
        rec.series = {c: rec.series[c] for c in args.channels}
    if args.list:
        print(rec.describe())
        return 0
    for flag, value, low in (("--window", args.window, 31), ("--hop", args.hop, 0)):
        if value is not None and not value > low:
            raise InputError(f"{flag} must be more than {low}; got {value}")
    if args.config:
        from ..config import load_config

        cfg = load_config(args.config, need_sources=False)
        ec = EngineConfig.from_config(cfg)
        if cfg.compute.backend != "local":
            print("note: replay computes in this process (compute.backend is for live runs)", file=sys.stderr)
        changes: dict[str, object] = {}
        if args.rate_hz is not None:
            changes["rate_hz"] = args.rate_hz
        if args.window is not None:
            changes["window_len"] = args.window
        if args.hop is not None:
            changes["hop_samples"] = args.hop
        if args.screening is not None:
            changes["screening"] = args.screening
        if args.max_lag_s is not None:
            changes["max_lag_s"] = args.max_lag_s
        if changes:
            ec = dataclasses.replace(ec, **changes)  # type: ignore[arg-type]
    else:
        rate = args.rate_hz or 100.0
        ec = EngineConfig(channels=list(rec.series), rate_hz=rate, window_len=args.window or 1024,
                          hop_samples=args.hop or 0, screening=args.screening or "off",
                          max_lag_s=args.max_lag_s or 0.0)  # fmt: skip
    if args.threads is not None:
        if args.threads < 1:
            raise InputError(f"--threads must be at least 1; got {args.threads}")
        ec = dataclasses.replace(ec, estimator={**ec.estimator, "threads": args.threads})
    if ec.rate_hz < 1e-3:  # a clock period beyond int64 nanoseconds' reach once windows add up
        raise InputError(f"the clock's rate is {ec.rate_hz:g} Hz: at least 0.001 Hz (--rate-hz)")
    window_s = (ec.window_len - 1) / ec.rate_hz
    span_s = rec.t_end - rec.t_start
    if span_s < window_s:
        raise InputError(f"{args.log} covers {span_s:.3f} s but a window is {window_s:.3f} s "
                         f"({ec.window_len} samples at {ec.rate_hz:g} Hz): use a smaller --window")  # fmt: skip
    outdir = Path(args.output or Path(args.log).name.split(".")[0] + "_replay")
    what = f"{rec.kind}, {len(rec.series)} channels, {rec.n_samples:,} samples, {span_s:,.1f} s"
    print(f"replaying {rec.path}: {what}; window {ec.window_len} at {ec.rate_hz:g} Hz, hop {ec.hop_samples}",
          file=sys.stderr)  # fmt: skip
    for note in rec.notes:
        print(f"note: {note}", file=sys.stderr)
    from ..offline.replay import GAP_WINDOWS, LISTED, replay  # the engine and torch: after --list and the checks

    progress = not args.no_progress and sys.stderr.isatty()
    max_gap_s = args.max_gap_s or GAP_WINDOWS * ec.window_len / ec.rate_hz
    res = replay(rec, ec, outdir, progress=progress, meta={"config": args.config}, max_gap_s=max_gap_s)
    for note in res.notes:
        print(f"note: {note}", file=sys.stderr)
    if res.gaps:
        shown = ", ".join(f"{g.from_ns / 1e9:.3f} .. {g.to_ns / 1e9:.3f} s" for g in res.gaps[:3])
        more = f" and {len(res.gaps) - 3} more (replay.json lists {LISTED})" if len(res.gaps) > 3 else ""
        hops = sum(g.hops_skipped for g in res.gaps)
        print(f"note: {len(res.gaps)} gap(s) without samples longer than --max-gap-s {max_gap_s:g} skipped, "
              f"{hops:,} hops not evaluated: {shown}{more}", file=sys.stderr)  # fmt: skip
    how = "stopped (Ctrl-C or SIGTERM) after" if res.interrupted else "done:"
    print(f"{how} {res.hops} hops, {res.rows:,} timeline rows, {res.events} events; {res.stream_s:,.1f} s of "
          f"stream in {res.wall_s:.1f} s ({res.speed:.1f}x real time) -> {outdir}/")  # fmt: skip
    return 130 if res.interrupted else 0


def _report(args: argparse.Namespace) -> int:
    from ..offline.report import write_report

    out = Path(args.output or Path(args.outdir) / "report.html")
    for note in write_report(args.outdir, out, top=args.top, at=args.at):
        print(f"note: {note}", file=sys.stderr)
    print(f"report written to {out}")
    return 0
