"""Robot sensor fusion over ZeroMQ: three IMUs on one robot, and the moment one of them comes loose.

A mobile robot carries three IMUs (accelerometer ax, ay, az in m/s^2 and gyro gx, gy, gz in rad/s, 100 Hz):

- ``body`` on the chassis;
- ``arm`` on a rigid arm 0.5 m out from the yaw axis;
- ``tool`` on a tool clamped 0.8 m out on the same arm.

The robot drives a smooth random manoeuvre: its yaw rate and forward acceleration are band-limited (white noise
through two first-order stages of 0.15 and 0.2 s), as a planner's commands are. The kinematics couple the axes:
every IMU that is rigidly mounted sees the chassis' yaw rate on its gz axis and its forward acceleration on ax,
and the off-axis IMUs see the centripetal acceleration ``-r * omega^2`` on ay. That last coupling is non-linear
and symmetric in omega, so Pearson's correlation with the gyro is about zero while the mutual information is
large. (The tangential term ``r * d(omega)/dt`` is left out to keep the model small.) Roll and pitch gyros and
the vertical accelerometers see only their own sensor noise.

Each IMU keeps its own clock: it samples at its own phase within the 10 ms period, a few milliseconds before or
after the engine's tick, and its stamps jitter by a fraction of a millisecond; its six channels share its stamps.
The engine puts each sample on its nearest tick. Smooth signals hold fewer independent samples per window than
ticks; the engine judges each pair at its effective sample size.

Halfway through, the tool's clamp breaks: the tool hangs from its cable and swings on its own (a lightly damped
pendulum at about 1.2 Hz), so its three coupled axes stop following the chassis.

The script runs a streamcorr ``Daemon`` in-process with a ZeroMQ PULL source and a ZeroMQ PUB output, PUSHes
each IMU's samples to it as msgpack chunks with explicit timestamps (one message per IMU per 100 ms of robot
time, on topic ``robot/<imu>``), and reads the results back with a ``Subscriber`` on the daemon's output: it
prints the change events as they arrive and, at the end, the strongest pairs of the latest snapshot. Robot time
runs ``--speed`` times faster than the wall clock. Sends are paced like a live sensor's, so that no window is
overwritten in the engine's ring buffers before it is evaluated; when the engine is still busy with one window
it moves on to the newest (the skips are counted).

Run: ``python examples/robot_imu_zmq.py [--seconds 40] [--speed 5]``. Exit code 0 when the break was detected
(a "became-independent" event between the tool's gyro and a rigidly mounted gyro after the break) and the
strongest pairs of the latest snapshot include the rigid and the centripetal couplings; 1 otherwise.
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
from scipy.signal import lfilter

from streamcorr.config import parse_config
from streamcorr.daemon import Daemon
from streamcorr.engine.changes import ChangeEvent
from streamcorr.engine.matrix import Snapshot
from streamcorr.errors import StreamcorrError
from streamcorr.publish.subscriber import Subscriber

RATE_HZ = 100.0  # the engine's clock, and each IMU's nominal rate
CHUNK = 10  # ticks per message: 100 ms of robot time
IMUS = ("body", "arm", "tool")
AXES = ("ax", "ay", "az", "gx", "gy", "gz")
CHANNELS = tuple(f"{imu}.{axis}" for imu in IMUS for axis in AXES)
RADIUS_M = {"body": 0.0, "arm": 0.5, "tool": 0.8}  # distance from the yaw axis
# Each IMU's clock: (phase, jitter), in periods. Its sample m is taken at (m + phase) / RATE_HZ and stamped with
# jitter of that standard deviation (clipped at three); |phase| + 3 jitter < 0.5 keeps each on its nearest tick.
IMU_CLOCK = {"body": (-0.25, 0.02), "arm": (0.15, 0.03), "tool": (0.33, 0.03)}
G = 9.81
WINDOW = 512  # samples: 5.12 s of robot time
HOP = 100  # samples: one evaluation per second of robot time
# What the final check looks for: the rigid gyro pair and a centripetal (omega^2) pair stay coupled ...
RIGID_PAIR = ("body.gz", "arm.gz")
CENTRIPETAL_PAIR = ("body.gz", "arm.ay")
# ... and the tool's gyro decouples from a rigidly mounted gyro after the break.
BROKEN_PAIRS = (("body.gz", "tool.gz"), ("arm.gz", "tool.gz"))


class _Smooth:
    """White noise through the filter b / a, scaled to a stationary std, run over consecutive blocks (the filter's
    state carries over)."""

    def __init__(self, b: np.ndarray, a: np.ndarray, std: float) -> None:
        impulse = lfilter(b, a, np.r_[1.0, np.zeros(20_000)])
        self.b, self.a = b * std / np.sqrt(np.sum(impulse**2)), a
        self.zi = np.zeros(max(len(a), len(b)) - 1)

    def __call__(self, e: np.ndarray) -> np.ndarray:
        y, self.zi = lfilter(self.b, self.a, e, zi=self.zi)
        return y


def _band_limited(tau_s: float, dt_s: float, std: float) -> _Smooth:
    """Two first-order stages of time constant tau_s: a smooth random signal."""
    phi = np.exp(-dt_s / tau_s)
    return _Smooth(np.array([(1 - phi) ** 2]), np.convolve([1.0, -phi], [1.0, -phi]), std)


def _pendulum(f_hz: float, damping: float, dt_s: float, std: float) -> _Smooth:
    """A lightly damped oscillator at f_hz (AR(2)): a swinging body."""
    r, w = np.exp(-damping * 2 * np.pi * f_hz * dt_s), 2 * np.pi * f_hz * dt_s
    return _Smooth(np.array([1.0]), np.array([1.0, -2 * r * np.cos(w), r * r]), std)


class Robot:
    """The simulated robot: ``frames(n)`` returns the next n ticks of robot time as each IMU sampled them,
    ``{imu: (stamps in s (m,), {channel: (m,)})}``, stamps on the IMU's own clock.

    >>> robot = Robot(np.random.default_rng(0), break_at_s=1.0)
    >>> chunk = robot.frames(10)
    >>> sorted(chunk) == sorted(IMUS), sorted(chunk["arm"][1]) == sorted(c for c in CHANNELS if "arm" in c)
    (True, True)
    >>> t, values = chunk["body"]
    >>> len(t), values["body.az"].shape, bool(np.all(np.diff(t) > 0))
    (10, (10,), True)
    """

    SUBSTEPS = 4  # physics steps per tick: the IMUs sample between the ticks

    def __init__(self, rng: np.random.Generator, break_at_s: float) -> None:
        self.rng = rng
        self.break_at_s = break_at_s
        self.k = 0  # ticks simulated so far
        self.next_sample = dict.fromkeys(IMUS, 0)  # each IMU's next sample index
        h = 1.0 / (RATE_HZ * self.SUBSTEPS)
        self.h = h
        self.omega = _band_limited(0.15, h, 1.0)  # chassis yaw rate, rad/s
        self.acc = _band_limited(0.2, h, 0.6)  # chassis forward acceleration, m/s^2
        self.swing = _pendulum(1.2, 0.08, h, 1.0)  # the loose tool's own yaw rate, rad/s

    def frames(self, n: int) -> dict[str, tuple[np.ndarray, dict[str, np.ndarray]]]:
        s0, steps = self.k * self.SUBSTEPS, n * self.SUBSTEPS
        e = self.rng.standard_normal((3, steps))
        omega, acc, swing = self.omega(e[0]), self.acc(e[1]), self.swing(e[2])
        t_s = (s0 + np.arange(steps)) * self.h
        loose = t_s >= self.break_at_s  # physics steps after the clamp broke
        out = {}
        for imu in IMUS:
            phase, jitter = IMU_CLOCK[imu]
            first = self.next_sample[imu]
            m = np.arange(first, max(first, int(np.ceil(self.k + n - phase))))
            m = m[m + phase >= 0]
            self.next_sample[imu] = int(m[-1]) + 1 if len(m) else first
            idx = np.floor((m + phase) * self.SUBSTEPS).astype(int) - s0  # the physics step each sample sees
            rate = np.where(loose, swing, omega)[idx] if imu == "tool" else omega[idx]
            fwd = np.where(loose, 0.0, acc)[idx] if imu == "tool" else acc[idx]
            noise = self.rng.normal(0.0, 1.0, (7, len(m)))
            stamps = (m + phase + jitter * np.clip(noise[6], -3, 3)) / RATE_HZ
            out[imu] = (
                stamps,
                {
                    f"{imu}.ax": fwd + 0.1 * noise[0],
                    f"{imu}.ay": -RADIUS_M[imu] * rate**2 + 0.1 * noise[1],  # centripetal, toward the yaw axis
                    f"{imu}.az": G + 0.05 * noise[2],
                    f"{imu}.gx": 0.02 * noise[3],  # flat floor: roll and pitch rates are sensor noise
                    f"{imu}.gy": 0.02 * noise[4],
                    f"{imu}.gz": rate + 0.1 * noise[5],
                },
            )
        self.k += n
        return out


@dataclass
class RobotResult:
    """What the run showed: events, the latest snapshot's strongest pairs, and whether the break was seen."""

    events: list[ChangeEvent] = field(default_factory=list)
    snapshots: int = 0
    latest: Snapshot | None = None
    top_pairs: list[tuple[str, str, float]] = field(default_factory=list)  # (a, b, nats), strongest first
    break_detected_after_s: float | None = None  # robot seconds from the break to its first event
    ok: bool = False


def top_pairs(snap: Snapshot, k: int) -> list[tuple[str, str, float]]:
    """The k strongest evaluated pairs of a snapshot, (a, b, MI in nats), strongest first."""
    return [(snap.channels[i], snap.channels[j], mi) for i, j, mi in snap.top_pairs(k)]


def daemon_config(in_port: int, out_port: int, last_port: int) -> dict[str, Any]:
    """The daemon's configuration (the same keys as a YAML file for `streamcorr run`); port 0: any free port."""

    def endpoint(port: int) -> str:
        return f"tcp://127.0.0.1:{port or '*'}"

    return {
        "version": 1,
        "sources": [
            {"type": "zmq", "endpoint": endpoint(in_port), "mode": "pull", "bind": True, "channel_template": "{key}"}
        ],
        "channels": {"names": list(CHANNELS), "rate_hz": RATE_HZ, "max_staleness_s": 0.02},
        "window": {"samples": WINDOW, "hop_samples": HOP},
        "outputs": {
            "zmq": {"endpoint": endpoint(out_port), "snapshot_endpoint": endpoint(last_port), "prefix": "robot"},
            "status_interval_s": 1.0,
        },
        "http": {"enabled": False},
    }


def port_in_use(port: int) -> bool:
    """True if something on this machine already listens on 127.0.0.1:port (0: never)."""
    if port == 0:
        return False
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _fmt_event(ev: ChangeEvent, t0_s: float) -> str:
    a, b = ev.pair
    return f"  t={ev.t_ns / 1e9 - t0_s:6.1f} s  {ev.kind:<18}  {a} ~ {b}:  {ev.previous:.2f} -> {ev.current:.2f} nats"


async def _wait_until_up(daemon: Daemon, run: asyncio.Task[None], timeout_s: float = 30.0) -> tuple[str, str, str]:
    """The endpoints actually bound (source, output, late-joiner cache) once the daemon listens."""
    src = daemon.sources[0][1]
    deadline = time.monotonic() + timeout_s
    while not src.ready.is_set():
        if run.done():
            run.result()  # raises what stopped it (e.g. a port in use)
        if time.monotonic() > deadline:
            raise TimeoutError(f"the daemon did not start listening within {timeout_s:.0f} s")
        await asyncio.sleep(0.02)
    sink = daemon.sinks[0]
    return src.bound_endpoint, sink.endpoint, sink.snapshot_endpoint


async def _publish(
    push: zmq.asyncio.Socket, robot: Robot, seconds: float, speed: float, t0_s: float, evaluated_s: Any
) -> int:
    """PUSH each IMU's samples as msgpack chunks with their stamps, paced at `speed` x real time; returns messages
    sent.

    Robot time may outrun this machine's engine (its first hop also compiles kernels): the robot waits while the
    newest evaluated window (``evaluated_s()``, stream seconds) is more than a few hops behind, as a replay would.
    """
    loop = asyncio.get_running_loop()
    start = loop.time()
    max_lag_s = (WINDOW / 2 + 2 * HOP) / RATE_HZ
    n_chunks = int(seconds * RATE_HZ) // CHUNK
    for m in range(n_chunks):
        for imu, (stamps, values) in robot.frames(CHUNK).items():
            chunk = {
                "t": (t0_s + stamps).astype("<f8").tobytes(),  # the IMU's own clock, float64 bins
                "seq": m,  # per topic: lets the daemon count lost messages
                "channels": {name: v.astype("<f8").tobytes() for name, v in values.items()},
            }
            await push.send_multipart([f"robot/{imu}".encode(), msgpack.packb(chunk)])
        await asyncio.sleep(max(0.0, start + (m + 1) * CHUNK / RATE_HZ / speed - loop.time()))
        sent_s = (m + 1) * CHUNK / RATE_HZ
        if sent_s > (WINDOW + 2 * HOP) / RATE_HZ:
            while t0_s + sent_s - evaluated_s() > max_lag_s:
                await asyncio.sleep(0.01)
                start += 0.01  # pacing resumes from here
    n_msgs = n_chunks * len(IMUS)
    return n_msgs


async def _until(done: Any, timeout_s: float) -> None:
    """Poll done() every 20 ms until it is true or timeout_s has passed."""
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


async def run(seconds: float, break_at_s: float, speed: float, seed: int, ports: tuple[int, int, int]) -> RobotResult:
    """Run the daemon, the robot and the subscriber; collect what the subscriber received."""
    result = RobotResult()
    # the robot's clock: Unix seconds, advancing `speed` x faster than real time; it starts in the past so that it
    # never runs ahead of the wall clock (the daemon refuses samples stamped beyond channels.max_future_s)
    t0_s = float(round(time.time() - seconds))
    daemon = Daemon(parse_config(daemon_config(*ports)))  # loads the model (and calibrates once per machine)
    daemon_task = asyncio.create_task(daemon.run(install_signals=False))
    push = zmq.asyncio.Context.instance().socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 1000)  # PUSH blocks when the daemon is this far behind: nothing is lost
    push.setsockopt(zmq.LINGER, 0)
    src = daemon.sources[0][1]
    try:
        src_ep, out_ep, last_ep = await _wait_until_up(daemon, daemon_task)
        push.connect(src_ep)
        print(f"daemon: ZeroMQ PULL on {src_ep}, publishing on {out_ep} (latest snapshot: {last_ep})")
        print(f"robot: {len(CHANNELS)} channels at {RATE_HZ:g} Hz for {seconds:g} s, clamp breaks at {break_at_s:g} s")
        print("change events:")
        async with Subscriber(out_ep, prefix="robot", snapshot_url=last_ep, late_join=False) as sub:
            await asyncio.sleep(0.3)  # PUB/SUB: let the subscription reach the publisher before anything is sent

            async def take_snapshots() -> None:
                async for snap in sub.snapshots():
                    result.snapshots += 1
                    result.latest = snap

            async def take_events() -> None:
                async for ev in sub.events():
                    result.events.append(ev)
                    print(_fmt_event(ev, t0_s), flush=True)

            readers = [asyncio.create_task(take_snapshots()), asyncio.create_task(take_events())]
            robot = Robot(np.random.default_rng(seed), break_at_s)

            def evaluated_s() -> float:
                latest = daemon.engine.latest
                return latest.t_ns / 1e9 if latest is not None else float("-inf")

            sent = await _publish(push, robot, seconds, speed, t0_s, evaluated_s)
            await _until(lambda: src.counters.messages >= sent, timeout_s=10.0)  # all ingested ...
            await daemon.engine.flush()  # ... and every window that is due evaluated
            await asyncio.sleep(0.3)  # ... and its snapshot and events have crossed the PUB socket
            for task in readers:
                task.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
    finally:
        daemon.stop()
        await daemon_task
        push.close()  # after the daemon, which would otherwise log the robot's disconnection
    counters, ec = src.counters, daemon.engine.counters
    print(
        f"daemon: {counters.messages} messages, {counters.samples_accepted} samples accepted, "
        f"{counters.dropped} dropped, {counters.seq_gaps} lost; {ec.hops} windows evaluated "
        f"({ec.pairs_evaluated} pair estimates), {ec.hops_skipped} skipped while the engine was busy"
    )
    _judge(result, t0_s + break_at_s)
    return result


def _judge(result: RobotResult, break_t_s: float) -> None:
    broken = {tuple(p) for p in BROKEN_PAIRS}
    after = [
        ev.t_ns / 1e9 - break_t_s
        for ev in result.events
        if ev.kind == "became-independent" and ev.pair in broken and ev.t_ns / 1e9 >= break_t_s
    ]
    result.break_detected_after_s = min(after) if after else None
    if result.latest is not None:
        result.top_pairs = top_pairs(result.latest, 8)
    strongest = {(a, b) for a, b, _ in result.top_pairs}
    result.ok = result.break_detected_after_s is not None and {RIGID_PAIR, CENTRIPETAL_PAIR} <= strongest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=40.0, help="robot time to simulate (default 40)")
    parser.add_argument("--break-at", type=float, default=None, help="robot time of the break (default: halfway)")
    parser.add_argument("--speed", type=float, default=5.0, help="robot time per wall-clock second (default 5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=int, default=0, help="daemon's ZeroMQ PULL port (default: any free port)")
    parser.add_argument("--pub-port", type=int, default=0, help="daemon's ZeroMQ PUB port (default: any free port)")
    parser.add_argument("--latest-port", type=int, default=0, help="late-joiner cache port (default: any free)")
    args = parser.parse_args(argv)
    break_at = args.seconds / 2 if args.break_at is None else args.break_at
    before_s = (WINDOW + 2 * HOP) / RATE_HZ  # a window of the coupled robot first
    after_s = (WINDOW + 4 * HOP) / RATE_HZ  # the break must fill a window, then be confirmed
    if not 0 < args.speed <= 1000 or not before_s <= break_at <= args.seconds - after_s:
        parser.error(
            f"need 0 < --speed <= 1000, and --break-at at least {before_s:g} s into the run and {after_s:g} s "
            f"before its end (a window before it, a window and a few evaluations after)"
        )
    ports = (args.port, args.pub_port, args.latest_port)
    busy = [p for p in ports if port_in_use(p)]
    if busy or len({p for p in ports if p}) != len([p for p in ports if p]):
        parser.error(f"ports must be free and distinct (in use: {busy}); 0 picks a free one")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        result = asyncio.run(run(args.seconds, break_at, args.speed, args.seed, ports))
    except (StreamcorrError, TimeoutError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"\nstrongest pairs of the latest snapshot ({result.snapshots} snapshots received):")
    for a, b, mi in result.top_pairs:
        print(f"  {a:>8} ~ {b:<8} {mi:5.2f} nats")
    if result.ok:
        print(f"\nOK: the tool's clamp break was detected {result.break_detected_after_s:.1f} s after it happened")
        return 0
    if result.break_detected_after_s is None:
        print("\nFAILED: no 'became-independent' event between the tool's gyro and a rigid gyro after the break")
    else:
        print(f"\nFAILED: the strongest pairs lack the rigid {RIGID_PAIR} or centripetal {CENTRIPETAL_PAIR} coupling")
    return 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
