"""React to change events in Python: raise an alert when a watched pair of channels becomes dependent.

A machine-tool spindle reports its load (torque ripple around the set point, N m) and its bearing vibration
(RMS, g) ten times a second, beside a coolant temperature that has nothing to do with either. While the bearing
is healthy, vibration is independent of load. Then the bearing gets damaged and vibration starts to follow the
square of the load (so Pearson's correlation stays near zero: the ripple is symmetric about the set point);
after a repair it is independent again.

The script starts, in one process:

- a simulated sensor gateway that PUBlishes the samples as msgpack chunks on a ZeroMQ socket (one message per
  second of machine time; machine time runs ``--speed`` times faster than the wall clock);
- a streamcorr ``Daemon`` whose ZeroMQ SUB source connects to that gateway, with a ZeroMQ PUB output;
- a watcher: ``async with Subscriber(...)`` and ``async for event in sub.events()``, which reacts to
  ``became-dependent`` / ``became-independent`` events on the watched pair. Here it prints an ALERT or RESOLVED
  line and counts them; a real watcher would open a ticket, page someone or stop the machine (see ``react``).

Run: ``python examples/react_to_events.py [--phase 45] [--speed 20]``. Exit code 0 iff exactly the expected
alerts arrived for the watched pair: "became-dependent" after the damage, then "became-independent" after the
repair; 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import zmq
import zmq.asyncio

from streamcorr.config import parse_config
from streamcorr.daemon import Daemon
from streamcorr.engine.changes import ChangeEvent
from streamcorr.errors import StreamcorrError
from streamcorr.publish.subscriber import Subscriber

RATE_HZ = 10.0
# The gateway's clock is not locked to the engine's 10 Hz grid: each sample is taken a quarter period before a tick
# and held for it, as with a real free-running sensor. (Samples stamped exactly on the ticks work too: the engine
# counts a sample up to 1 us after a tick as on it, since float64 Unix seconds resolve only ~0.24 us.)
PHASE_S = -0.25 / RATE_HZ
WINDOW = 128  # samples: 12.8 s of machine time
HOP = 10  # samples: one evaluation per second of machine time
CHANNELS = ("spindle.load", "spindle.vibration", "coolant.temp")
WATCHED = ("spindle.load", "spindle.vibration")
EXPECTED = ("became-dependent", "became-independent")
PREFIX = "spindle"


class Spindle:
    """The simulated machine: ``samples(k0, n)`` gives n samples of every channel from sample k0 on.

    The bearing is damaged during [damage_s, repair_s) of machine time.

    >>> s = Spindle(np.random.default_rng(0), damage_s=1.0, repair_s=2.0)
    >>> {name: v.shape for name, v in s.samples(0, 5).items()}
    {'spindle.load': (5,), 'spindle.vibration': (5,), 'coolant.temp': (5,)}
    """

    def __init__(self, rng: np.random.Generator, damage_s: float, repair_s: float) -> None:
        self.rng = rng
        self.damage_s = damage_s
        self.repair_s = repair_s

    def samples(self, k0: int, n: int) -> dict[str, np.ndarray]:
        t_s = (k0 + np.arange(n)) / RATE_HZ
        damaged = (t_s >= self.damage_s) & (t_s < self.repair_s)
        load, vib_noise, temp_noise = self.rng.normal(0.0, 1.0, (3, n))
        healthy_vib = 0.05 + 0.01 * np.abs(vib_noise)  # broadband noise floor of a good bearing
        damaged_vib = 0.05 + 0.04 * load**2 + 0.005 * np.abs(vib_noise)  # defect impacts grow with load
        return {
            "spindle.load": 12.0 * load,
            "spindle.vibration": np.where(damaged, damaged_vib, healthy_vib),
            "coolant.temp": 18.0 + 0.3 * temp_noise,
        }


@dataclass
class Alert:
    """One reaction of the watcher: the event kind, when (machine seconds since the start) and the MI level."""

    kind: str
    t_s: float
    mi: float


@dataclass
class ReactResult:
    """The alerts raised for the watched pair, every event seen, and whether the alerts were the expected ones."""

    alerts: list[Alert] = field(default_factory=list)
    other_events: list[ChangeEvent] = field(default_factory=list)  # on pairs nobody watches
    ok: bool = False


class Watcher:
    """Turns change events into reactions for one pair; other events are only recorded.

    >>> w = Watcher(("a", "b"), t0_s=0.0)
    >>> alert = w.react(ChangeEvent(("b", "a"), 0.01, 0.8, 5_000_000_000, "became-dependent"))  # doctest: +ELLIPSIS
    ALERT    t=  5.0 s  b and a became dependent (0.80 nats): ... opening a maintenance ticket
    >>> alert.kind, len(w.result.alerts)
    ('became-dependent', 1)
    >>> w.react(ChangeEvent(("a", "c"), 0.01, 0.8, 6_000_000_000, "became-dependent")) is None
    True
    """

    def __init__(self, pair: tuple[str, str], t0_s: float) -> None:
        self.pair = frozenset(pair)
        self.t0_s = t0_s
        self.result = ReactResult()

    def react(self, ev: ChangeEvent) -> Alert | None:
        if frozenset(ev.pair) != self.pair:
            self.result.other_events.append(ev)
            return None
        if ev.kind not in ("became-dependent", "became-independent"):
            return None  # rise / fall of an already dependent pair: no new alert
        alert = Alert(ev.kind, ev.t_ns / 1e9 - self.t0_s, ev.current)
        self.result.alerts.append(alert)
        a, b = ev.pair
        if ev.kind == "became-dependent":
            # Here a real system would open a ticket or stop the machine.
            print(
                f"ALERT    t={alert.t_s:5.1f} s  {a} and {b} became dependent ({ev.current:.2f} nats): "
                "bearing damage suspected, opening a maintenance ticket",
                flush=True,
            )
        else:
            print(
                f"RESOLVED t={alert.t_s:5.1f} s  {a} and {b} are independent again ({ev.current:.2f} nats): "
                "closing the ticket",
                flush=True,
            )
        return alert


def daemon_config(gateway: str, out_port: int) -> dict[str, Any]:
    """The daemon's configuration: SUB to the gateway, PUB the results (port 0: any free port)."""
    out = f"tcp://127.0.0.1:{out_port or '*'}"
    return {
        "version": 1,
        "sources": [{"type": "zmq", "endpoint": gateway, "mode": "sub", "channel_template": "{key}"}],
        "channels": {"names": list(CHANNELS), "rate_hz": RATE_HZ, "max_staleness_s": 0.05},
        "window": {"samples": WINDOW, "hop_samples": HOP},
        "outputs": {"zmq": {"endpoint": out, "snapshot_endpoint": None, "prefix": PREFIX}, "status_interval_s": 1.0},
        "http": {"enabled": False},
    }


async def _gateway(pub: zmq.asyncio.Socket, spindle: Spindle, seconds: float, speed: float, t0_s: float) -> int:
    """Publish one msgpack chunk per second of machine time, paced at `speed` x real time; returns messages sent."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    per = int(RATE_HZ)  # samples per message
    for m in range(int(seconds)):
        values = spindle.samples(m * per, per)
        chunk = {
            "t0": t0_s + PHASE_S + m,
            "dt": 1.0 / RATE_HZ,
            "seq": m,  # PUB/SUB loses messages silently under load: seq lets the daemon count them
            "channels": {k: v.tolist() for k, v in values.items()},
        }
        await pub.send_multipart([b"spindle", msgpack.packb(chunk)])
        await asyncio.sleep(max(0.0, start + (m + 1) / speed - loop.time()))
    return int(seconds)


async def run(phase_s: float, speed: float, seed: int, out_port: int) -> ReactResult:
    """Run the gateway, the daemon and the watcher; return what the watcher did."""
    # machine time: Unix seconds, advancing `speed` x faster than real time; it starts in the past so that it never
    # runs ahead of the wall clock (the daemon refuses samples stamped beyond channels.max_future_s)
    t0_s = float(round(time.time() - 3 * phase_s))
    damage_s, repair_s = phase_s, 2 * phase_s
    watcher = Watcher(WATCHED, t0_s)
    ctx = zmq.asyncio.Context.instance()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind("tcp://127.0.0.1:*")
    gateway = pub.getsockopt_string(zmq.LAST_ENDPOINT)
    daemon = Daemon(parse_config(daemon_config(gateway, out_port)))
    daemon_task = asyncio.create_task(daemon.run(install_signals=False))
    src = daemon.sources[0][1]
    try:
        deadline = time.monotonic() + 30
        while not src.connected:  # the daemon's SUB socket has reached the gateway
            if daemon_task.done():
                daemon_task.result()
            if time.monotonic() > deadline:
                raise TimeoutError("the daemon did not connect to the gateway within 30 s")
            await asyncio.sleep(0.02)
        out = daemon.sinks[0].endpoint
        print(f"gateway publishing on {gateway}; daemon publishing results on {out}")
        print(f"watching {WATCHED[0]} ~ {WATCHED[1]}: bearing damaged from {damage_s:g} s to {repair_s:g} s")

        async with Subscriber(out, prefix=PREFIX, streams=("event",), late_join=False) as sub:
            await asyncio.sleep(0.3)  # PUB/SUB: both subscriptions reach their publishers before data flows

            async def watch() -> None:
                async for ev in sub.events():
                    watcher.react(ev)

            watching = asyncio.create_task(watch())
            spindle = Spindle(np.random.default_rng(seed), damage_s, repair_s)
            sent = await _gateway(pub, spindle, 3 * phase_s, speed, t0_s)
            c = src.counters
            deadline = time.monotonic() + 5
            while c.messages + c.seq_gaps < sent and time.monotonic() < deadline:  # all in (or counted lost) ...
                await asyncio.sleep(0.02)
            await daemon.engine.flush()  # ... and every window that is due evaluated
            await asyncio.sleep(0.3)  # the last events cross the daemon's PUB socket
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
    finally:
        daemon.stop()
        await daemon_task
        pub.close(linger=0)
    c, ec = src.counters, daemon.engine.counters
    print(
        f"daemon: {c.messages} messages, {c.samples_accepted} samples accepted, {c.seq_gaps} lost on the way; "
        f"{ec.hops} windows evaluated "
        f"({ec.pairs_evaluated} pair estimates), {ec.hops_skipped} skipped while the engine was busy"
    )
    result = watcher.result
    kinds = tuple(a.kind for a in result.alerts)
    in_time = len(kinds) == 2 and damage_s <= result.alerts[0].t_s < repair_s <= result.alerts[1].t_s
    result.ok = kinds == EXPECTED and in_time
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phase", type=float, default=45.0, help="machine seconds healthy, damaged, repaired")
    parser.add_argument("--speed", type=float, default=20.0, help="machine seconds per wall-clock second")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pub-port", type=int, default=0, help="daemon's ZeroMQ PUB port (default: any free port)")
    args = parser.parse_args(argv)
    min_phase = 2 * WINDOW / RATE_HZ
    if not 0 < args.speed <= 1000 or args.phase < min_phase:
        parser.error(f"need 0 < --speed <= 1000 and --phase >= {min_phase:g} s (two windows)")
    if args.pub_port:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", args.pub_port))
            except OSError:
                parser.error(f"--pub-port {args.pub_port} is in use; 0 picks a free port")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        result = asyncio.run(run(args.phase, args.speed, args.seed, args.pub_port))
    except (StreamcorrError, TimeoutError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    others = ", ".join(f"{e.kind} on {e.pair[0]} ~ {e.pair[1]}" for e in result.other_events) or "none"
    print(f"alerts on the watched pair: {len(result.alerts)}; events on other pairs: {others}")
    if result.ok:
        print("OK: one alert when the bearing was damaged, one all-clear after the repair")
        return 0
    print(
        f"FAILED: expected {' then '.join(EXPECTED)}, got {[a.kind for a in result.alerts]} "
        f"at {[round(a.t_s, 1) for a in result.alerts]} s"
    )
    return 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
