"""Reaction time: how soon change events follow a change in dependence, with the fast path and without it.

    python -m bench.reaction [--minutes 20] [--seeds 2] [--quick] [--cost-only [--repeats 3]]

A recording of 16 channels at 100 Hz from 8 devices, each on its own clock phase with stamp jitter: 8 drivers (white
noise, or smooth AR(1) with a time constant of 3-30 samples) and 8 followers, each a relation of its driver (linear,
square, sine, abs, tanh, quantised) plus noise, on its driver's device. Six followers switch their dependence on and
off at random times (20-60 s apart); two stay dependent throughout; the other 112 pairs are independent by
construction. Replayed hop by hop through the engine (window 1024, hop 0.5 s, default change settings) with
``changes.fast`` on and off in one run, the same recording for both. Reported per setting, driver kind and change
kind: detection delay (median, p90) of the first matching event after each change, misses (none before the next
change), onset error (share within 1 s), chance ``became-dependent`` per independent pair-hour, false ``became-
independent`` on the steady pairs, and the fast path's share of the hop. Then the cost: hops at 64 channels with
every pair dependent and at 256 channels screened, fast path on against off in the same run (median hop time over
the hops after the first window).
Results: bench/results/reaction.json and .md.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.signal import lfilter

from bench.common import environment, write_results
from streamcorr.engine.core import Engine, EngineConfig

RATE_HZ = 100.0
WINDOW = 1024
HOP = 50  # samples: 0.5 s
RELATIONS = ("linear", "square", "sine", "abs", "tanh", "quantised")
SEED = 31_000_001
T0 = 1_764_000_000.0


def _process(rng: np.random.Generator, n: int, smooth: bool) -> np.ndarray:
    """White noise, or AR(1) with a time constant of 3-30 samples; unit variance."""
    e = rng.standard_normal(n + 500)
    if smooth:
        e = lfilter([1.0], [1.0, -np.exp(-1.0 / rng.uniform(3.0, 30.0))], e)
    x = e[500:]
    return (x - x.mean()) / x.std()


def _relation(name: str, x: np.ndarray) -> np.ndarray:
    y = {"linear": x, "square": x * x, "sine": np.sin(2.0 * x), "abs": np.abs(x), "tanh": np.tanh(2.0 * x),
         "quantised": np.round(x)}[name]  # fmt: skip
    return (y - y.mean()) / (y.std() + 1e-12)


@dataclass
class Recording:
    names: list[str]
    t: dict[str, np.ndarray]  # stamps (s)
    x: dict[str, np.ndarray]
    changes: list[tuple[tuple[str, str], float, str, str]] = field(default_factory=list)  # pair, t, kind, relation
    switching: set[tuple[str, str]] = field(default_factory=set)
    steady: set[tuple[str, str]] = field(default_factory=set)
    seconds: float = 0.0


def recording(seed: int, seconds: float, smooth: bool, channels: int = 16, n_switching: int = 6) -> Recording:
    """Drivers and followers with dependences switching on and off (see the module docstring)."""
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE_HZ)
    half = channels // 2
    names = [f"drv{k:02d}" for k in range(half)] + [f"fol{k:02d}" for k in range(half)]
    rec = Recording(names, {}, {}, seconds=seconds)
    for k in range(half):  # a driver and its follower are fields of one device: its phase, jitter up to 10%
        t = T0 + rng.uniform(0, 1 / RATE_HZ) + (np.arange(n) + rng.uniform(-0.1, 0.1, n)) / RATE_HZ
        rec.t[names[k]] = rec.t[names[half + k]] = t
    rels = rng.permutation(np.resize(RELATIONS, half))
    for k in range(half):
        drv, fol = names[k], names[half + k]
        x = _process(rng, n, smooth)
        rec.x[drv] = x
        on = np.ones(n, dtype=bool)
        if k < n_switching:
            state = bool(rng.integers(2))
            t_next = rng.uniform(15.0, 40.0)  # the first change after the first window
            on[:] = state
            while t_next < seconds - 15.0:
                state = not state
                on[int(t_next * RATE_HZ) :] = state
                rec.changes.append(((drv, fol), T0 + t_next, "coupling" if state else "decoupling", str(rels[k])))
                t_next += rng.uniform(20.0, 60.0)
            rec.switching.add((drv, fol))
        else:
            rec.steady.add((drv, fol))
        related = _relation(str(rels[k]), x) + rng.uniform(0.3, 0.6) * _process(rng, n, smooth)
        related /= related.std()
        rec.x[fol] = np.where(on, related, _process(rng, n, smooth))
    return rec


def replay(rec: Recording, fast: bool) -> dict[str, Any]:
    """Events and the hop's stage times of one replay of rec."""
    cfg = EngineConfig(channels=rec.names, rate_hz=RATE_HZ, window_len=WINDOW, hop_samples=HOP, fast=fast,
                       skip_stale_hops=False, max_future_s=None, queue_size=100_000)  # fmt: skip
    eng = Engine(cfg)
    events: list[Any] = []
    hop_s: list[float] = []
    fast_s: list[float] = []
    chunk = HOP / RATE_HZ
    for lo in np.arange(T0, T0 + rec.seconds, chunk):
        for name in rec.names:
            t = rec.t[name]
            a, b = np.searchsorted(t, [lo, lo + chunk])
            eng.push(name, t[a:b], rec.x[name][a:b])
        for end in eng.due_windows():
            before = eng.counters.stage_s.get("fast", 0.0)
            t0 = time.perf_counter()
            _, ev = eng.evaluate(end)
            hop_s.append(time.perf_counter() - t0)
            fast_s.append(eng.counters.stage_s.get("fast", 0.0) - before)
            events += ev
    return {"events": events, "hop_s": hop_s, "fast_s": fast_s}


def score(rec: Recording, events: list[Any]) -> dict[str, Any]:
    """Delays and misses per change, chance and false events."""
    by_pair: dict[tuple[str, str], list[Any]] = {}
    for ev in events:
        by_pair.setdefault(tuple(sorted(ev.pair)), []).append(ev)  # type: ignore[arg-type]
    rows = []
    for k, (pair, t_c, kind, rel) in enumerate(rec.changes):
        nxt = [c[1] for c in rec.changes[k + 1 :] if c[0] == pair]
        t_end = nxt[0] if nxt else T0 + rec.seconds
        want = "became-dependent" if kind == "coupling" else "became-independent"
        hits = [e for e in by_pair.get(pair, []) if e.kind == want and t_c <= e.t_ns / 1e9 < t_end]
        hit = hits[0] if hits else None
        onset = None if hit is None or hit.onset_t_ns is None else abs(hit.onset_t_ns / 1e9 - t_c)
        rows.append({"kind": kind, "relation": rel, "delay_s": None if hit is None else hit.t_ns / 1e9 - t_c,
                     "path": None if hit is None else hit.path, "onset_error_s": onset})  # fmt: skip
    linked = rec.switching | rec.steady
    chance = [e for e in events if e.kind == "became-dependent" and tuple(sorted(e.pair)) not in linked]
    false_ind = [e for e in events if e.kind == "became-independent" and tuple(sorted(e.pair)) in rec.steady]
    n_ind = len(rec.names) * (len(rec.names) - 1) // 2 - len(linked)
    return {"changes": rows, "chance": len(chance), "independent_pair_hours": n_ind * rec.seconds / 3600,
            "false_independent": len(false_ind), "steady_pair_hours": len(rec.steady) * rec.seconds / 3600}  # fmt: skip


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    d = np.array([r["delay_s"] for r in rows if r["delay_s"] is not None])
    o = np.array([r["onset_error_s"] for r in rows if r["onset_error_s"] is not None])
    return {
        "changes": len(rows),
        "missed": sum(r["delay_s"] is None for r in rows),
        "median_s": float(np.median(d)) if len(d) else None,
        "p90_s": float(np.quantile(d, 0.9)) if len(d) else None,
        "onset_within_1s": float((o <= 1.0).mean()) if len(o) else None,
        "fast_share": float(np.mean([r["path"] == "fast" for r in rows if r["path"] is not None])) if len(d) else None,
    }


def cost(channels: int, dependent: bool, hops: int) -> dict[str, float]:
    """Hop times at this many channels (every pair dependent through a common factor, or a few linked pairs among
    independent channels, screened), fast path on and off: two engines fed the same samples, evaluated in turn each
    hop. Medians over the hops after the first window (the fast path's references are built once, there)."""
    rng = np.random.default_rng(SEED + channels)
    n = WINDOW + hops * HOP
    x = rng.standard_normal((channels, n))
    if dependent:
        x += 1.5 * rng.standard_normal(n)
    else:
        for k in range(0, channels // 8 * 2, 2):
            x[k + 1] = x[k] + 0.5 * rng.standard_normal(n)
    names = [f"c{k:03d}" for k in range(channels)]
    engines = {fast: Engine(EngineConfig(channels=names, rate_hz=RATE_HZ, window_len=WINDOW, hop_samples=HOP,
                                         fast=fast, skip_stale_hops=False, max_future_s=None, queue_size=100_000))
               for fast in (True, False)}  # fmt: skip
    t = np.arange(n) / RATE_HZ + T0
    times: dict[bool, list[float]] = {True: [], False: []}
    fast_s: list[float] = []
    for s in range(0, n, HOP):
        for eng in engines.values():
            eng.push_frame(t[s : s + HOP], {name: x[k, s : s + HOP] for k, name in enumerate(names)})
        for fast, eng in engines.items():
            for end in eng.due_windows():
                before = eng.counters.stage_s.get("fast", 0.0)
                t0 = time.perf_counter()
                eng.evaluate(end)
                times[fast].append(time.perf_counter() - t0)
                if fast:
                    fast_s.append(eng.counters.stage_s.get("fast", 0.0) - before)
    on, off = np.array(times[True][3:]), np.array(times[False][3:])
    return {"hop_s_fast_on": float(np.median(on)), "hop_s_fast_off": float(np.median(off)),
            "ratio": float(np.median(on) / np.median(off)), "fast_stage_s": float(np.median(fast_s[3:])),
            "fast_share": float(np.median(fast_s[3:]) / np.median(on)),
            "first_hops_fast_stage_s": float(max(fast_s[:3], default=0.0))}  # fmt: skip


def demo_rig(fast: bool) -> dict[str, Any]:
    """The demo rig's script (streamcorr.demo.check_script: joint lock, fan failure, cable fault; demo settings)
    with the fast path on or off: each expected event's delay after its scripted change, misses, false events."""
    from streamcorr.demo import check_script

    check = check_script(0, fast=fast)
    return {"delays_s": {f"{a}~{b} {kind}": d for (a, b), kind, d in
                         sorted(((p, k, d) for (p, k), d in check.delays_s.items()), key=lambda x: x[2])},
            "missing": len(check.missing), "false_events": len(check.false_events),
            "max_delay_s": check.max_delay_s}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=20.0, help="recording length per seed and driver kind")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="3 minutes, one seed, a short cost run (a smoke test)")
    ap.add_argument("--cost-only", action="store_true", help="only the cost runs, --repeats times (reaction_cost)")
    ap.add_argument("--repeats", type=int, default=3, help="cost runs with --cost-only; the median ratio is reported")
    args = ap.parse_args(argv)
    minutes, seeds, cost_hops = (3.0, 1, 8) if args.quick else (args.minutes, args.seeds, 40)
    if args.cost_only:
        if args.repeats < 1:
            ap.error(f"--repeats must be >= 1; got {args.repeats}")
        return cost_only(args.repeats, cost_hops)
    results: dict[str, Any] = {"env": environment(), "minutes": minutes, "seeds": seeds, "settings": {}}
    for fast in (True, False):
        label = "fast on" if fast else "fast off (window only)"
        per: dict[str, Any] = {}
        for drivers in ("white", "smooth"):
            rows: list[dict[str, Any]] = []
            chance = false_ind = ind_hours = steady_hours = 0.0
            shares = []
            for seed in range(seeds):
                rec = recording(SEED + seed, minutes * 60, drivers == "smooth")
                out = replay(rec, fast)
                sc = score(rec, out["events"])
                rows += sc["changes"]
                chance += sc["chance"]
                false_ind += sc["false_independent"]
                ind_hours += sc["independent_pair_hours"]
                steady_hours += sc["steady_pair_hours"]
                shares.append(float(np.sum(out["fast_s"]) / np.sum(out["hop_s"])))
            per[drivers] = {
                "coupling": _summary([r for r in rows if r["kind"] == "coupling"]),
                "decoupling": _summary([r for r in rows if r["kind"] == "decoupling"]),
                "by_relation": {rel: _summary([r for r in rows if r["relation"] == rel]) for rel in RELATIONS},
                "chance_per_pair_hour": chance / ind_hours,
                "chance_events": chance,
                "false_independent": false_ind,
                "steady_pair_hours": steady_hours,
                "fast_share_of_hop": float(np.mean(shares)),
            }
        results["settings"][label] = per
    results["demo_rig"] = {"fast on": demo_rig(True), "fast off (window only)": demo_rig(False)}
    results["cost"] = {}
    for channels, dependent in ((64, True), (256, False)):
        key = f"{channels} channels, {'every pair dependent' if dependent else 'sparse, screened'}"
        results["cost"][key] = cost(channels, dependent, cost_hops)
    write_results("reaction" if not args.quick else "reaction_quick", results, markdown(results))
    return 0


def cost_only(repeats: int, hops: int) -> int:
    """The cost cases alone, each run ``repeats`` times (two engines in turn per run); the median run by ratio."""
    results: dict[str, Any] = {"env": environment(), "repeats": repeats, "hops": hops, "cost": {}}
    lines = [f"# Fast path cost ({repeats} runs per case, {hops} hops each; median run by ratio)", "",
             "| case | fast on | fast off | ratio (median) | ratios of the runs | fast stage | its share of the hop |",
             "|---|---:|---:|---:|---|---:|---:|"]  # fmt: skip
    for channels, dependent in ((64, True), (256, False)):
        key = f"{channels} channels, {'every pair dependent' if dependent else 'sparse, screened'}"
        runs = sorted((cost(channels, dependent, hops) for _ in range(repeats)), key=lambda c: c["ratio"])
        c = runs[len(runs) // 2]
        results["cost"][key] = {"median_run": c, "runs": runs}
        ratios = ", ".join(f"{r['ratio']:.3f}" for r in runs)
        lines.append(
            f"| {key} | {c['hop_s_fast_on'] * 1e3:.0f} ms | {c['hop_s_fast_off'] * 1e3:.0f} ms | "
            f"{c['ratio']:.3f} | {ratios} | {c['fast_stage_s'] * 1e3:.1f} ms | {c['fast_share']:.1%} |"
        )
        print(lines[-1], flush=True)
    quick = " --quick" if hops < 40 else ""
    lines += ["", f"Command: `python -m bench.reaction --cost-only --repeats {repeats}{quick}`"]
    write_results("reaction_cost" + ("_quick" if quick else ""), results, "\n".join(lines))
    return 0


def _fmt(v: Any, unit: str = "") -> str:
    return "-" if v is None else (f"{v:.2f}{unit}" if isinstance(v, float) else str(v))


def markdown(r: dict[str, Any]) -> str:
    lines = [f"# Reaction time ({r['minutes']:g} min per seed and driver kind, {r['seeds']} seeds)", "",
             "16 channels at 100 Hz, window 1024, hop 0.5 s, default change settings; 6 pairs switch, 2 stay "
             "dependent, 112 independent. Delay: change to first matching event.", "",
             "| setting | drivers | change | changes | missed | median | p90 | onset within 1 s | fast path |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for label, per in r["settings"].items():
        for drivers, s in per.items():
            for kind in ("coupling", "decoupling"):
                x = s[kind]
                lines.append(f"| {label} | {drivers} | {kind} | {x['changes']} | {x['missed']} | "
                             f"{_fmt(x['median_s'], ' s')} | {_fmt(x['p90_s'], ' s')} | {_fmt(x['onset_within_1s'])} | "
                             f"{_fmt(x['fast_share'])} |")  # fmt: skip
    lines += ["", "| setting | drivers | chance became-dependent / independent pair-hour | false became-independent "
              "(steady pair-hours) | fast path's share of the hop |", "|---|---|---:|---:|---:|"]  # fmt: skip
    for label, per in r["settings"].items():
        for drivers, s in per.items():
            lines.append(f"| {label} | {drivers} | {s['chance_per_pair_hour']:.3f} ({s['chance_events']:g}) | "
                         f"{s['false_independent']:g} ({s['steady_pair_hours']:.1f}) | "
                         f"{s['fast_share_of_hop']:.1%} |")  # fmt: skip
    lines += ["", "By relation (fast on): median delay, misses", "",
              "| drivers | relation | changes | missed | median |", "|---|---|---:|---:|---:|"]  # fmt: skip
    for drivers, s in r["settings"]["fast on"].items():
        for rel, x in s["by_relation"].items():
            lines.append(f"| {drivers} | {rel} | {x['changes']} | {x['missed']} | {_fmt(x['median_s'], ' s')} |")
    lines += ["", "The demo rig's script (`streamcorr.demo.check_script`, seed 0): delay of each expected event after "
              "its scripted change", "", "| event | fast on | fast off |", "|---|---:|---:|"]  # fmt: skip
    on, off = r["demo_rig"]["fast on"], r["demo_rig"]["fast off (window only)"]
    for key in on["delays_s"]:
        lines.append(f"| {key} | {on['delays_s'][key]:.1f} s | {_fmt(off['delays_s'].get(key), ' s')} |")
    lines.append(f"| missing / events on stable pairs | {on['missing']} / {on['false_events']} | "
                 f"{off['missing']} / {off['false_events']} |")  # fmt: skip
    lines += ["", "Cost (median hop; two engines on the same samples, evaluated in turn each hop)", "",
              "| case | fast on | fast off | ratio | fast stage | its share of the hop | fast stage, first hops |",
              "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for key, c in r["cost"].items():
        lines.append(f"| {key} | {c['hop_s_fast_on'] * 1e3:.0f} ms | {c['hop_s_fast_off'] * 1e3:.0f} ms | "
                     f"{c['ratio']:.3f} | {c['fast_stage_s'] * 1e3:.1f} ms | {c['fast_share']:.1%} | "
                     f"{c['first_hops_fast_stage_s'] * 1e3:.0f} ms |")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
