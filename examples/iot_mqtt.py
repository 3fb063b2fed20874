"""IoT telemetry through Mosquitto: which devices share a cause, and which one lost its fan.

Four devices each report ``temp`` (degC), ``humidity`` (%RH), ``power`` (W) and ``fan_rpm`` once a second as a
JSON object on ``<site>/<device>``:

- ``lab-1`` and ``lab-2`` stand in the same room as a heater whose output a thermostat moves every few seconds,
  so their temperatures share a common cause although neither device affects the other;
- ``office`` and ``hall`` are in other rooms, each with its own independent heat load.

The signals are smooth, as room air is: each room's heat input wanders over about 3 s and the air at a
device follows it with a 2 s lag, so a minute of readings holds far fewer independent samples than readings
(the engine judges each pair at its effective sample size). Inside each device the channels are coupled the way
real hardware couples them, mostly non-linearly: relative humidity falls exponentially as the air warms, a fan
controller sets the fan speed from the temperature, and the fan's power draw grows with the cube of its speed
(the fan affinity law). The devices keep their own clocks: each samples at its own phase within the second,
with stamp jitter of 20 ms, and the engine puts each reading on the nearest tick of its 1 Hz clock.

Halfway through, ``lab-2``'s fan fails: its tachometer reads only noise around zero, its power draw no longer
follows the fan, and the device slowly warms up.

The script runs a streamcorr ``Daemon`` in-process with an MQTT source (topics ``<site>/+``, channel template
``{topic[1]}.{key}``, so ``site/lab-2`` + ``fan_rpm`` is channel ``lab-2.fan_rpm``) and an MQTT output under a
unique prefix, publishes the telemetry with aiomqtt (simulated time runs ``--speed`` times faster than the wall
clock; the timestamps are in the payloads), and reads the results back with ``Subscriber("mqtt://...")``. It
prints the dependence changes ("became-dependent" / "became-independent" events; ``--all-events`` adds "rise" and
"fall") as they arrive and the strongest pairs of the latest snapshot, overall and across devices, then clears the
retained messages it left on the broker.

How fast: a change of dependence shows as "became-independent" once most of a window holds the new state (plus
``persist`` evaluations), so detection takes about one window (64 s here); a "fall" event (``--all-events``)
comes earlier. With 128-sample windows and hops skipped on a busy machine this took 159 s; now the devices
wait for the engine whenever it is more than a few hops behind (see ``_publish``).

Run: ``python examples/iot_mqtt.py [--host 127.0.0.1] [--port 1883] [--seconds 400] [--speed 40]``. Exit code 0
when the fan failure was detected ("became-independent" between ``lab-2.fan_rpm`` and ``lab-2.temp``) and the
heater's common cause (``lab-1.temp`` ~ ``lab-2.temp``) is among the strongest pairs; 1 otherwise; 2 when no
MQTT broker answers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiomqtt
import numpy as np

from streamcorr.config import parse_config
from streamcorr.daemon import Daemon
from streamcorr.engine.changes import ChangeEvent
from streamcorr.engine.matrix import Snapshot
from streamcorr.errors import StreamcorrError
from streamcorr.publish.subscriber import Subscriber

RATE_HZ = 1.0
# A change shows as "became-independent" once most of a window lies after it (the MI of a window that still holds
# the coupled past stays high), so detection takes about one window plus `persist` hops: keep the window short
# (64 samples: about a minute at 1 Hz; the model needs 32) and the hop small.
WINDOW = 64  # samples: about a minute of telemetry
HOP = 4  # samples: one evaluation every 4 s of device time
FIELDS = ("temp", "humidity", "power", "fan_rpm")
# device -> (room, sampling phase in s before each tick of the common clock, base temperature in degC)
DEVICES: dict[str, tuple[str, float, float]] = {
    "lab-1": ("lab", 0.1, 23.0),
    "lab-2": ("lab", 0.6, 24.0),
    "office": ("office", 0.3, 21.0),
    "hall": ("hall", 0.8, 19.0),
}
JITTER_S = 0.02  # each device's stamp jitter (standard deviation, clipped at three)
FAILING = "lab-2"
FAN_PAIR = ("lab-2.temp", "lab-2.fan_rpm")  # engine order: channels are listed device by device
COMMON_CAUSE_PAIR = ("lab-1.temp", "lab-2.temp")
TOP_K = 10
TOP_CROSS = 5


class Site:
    """The simulated devices: ``readings(k)`` gives every device's reading for second k of device time,
    ``{device: (t_s, {field: x})}``, with t_s the device's own stamp (seconds since the start).

    >>> site = Site(np.random.default_rng(0), fail_at_s=10.0)
    >>> r = site.readings(1)
    >>> sorted(r) == sorted(DEVICES), sorted(r["lab-1"][1]) == sorted(FIELDS), 0.3 < r["lab-2"][0] < 0.5
    (True, True, True)
    """

    STEPS_PER_S = 10  # physics steps per second: each device reads the air at its own instant

    def __init__(self, rng: np.random.Generator, fail_at_s: float) -> None:
        self.rng = rng
        self.fail_at_s = fail_at_s
        dt = 1.0 / self.STEPS_PER_S
        self.phi_heat, self.phi_air = np.exp(-dt / 3.0), np.exp(-dt / 2.0)  # heat input 3 s, air at a device 2 s
        rooms = ("lab", "office", "hall")
        self.heat = dict.fromkeys(rooms, 0.0)  # each room's heat input, AR(1), unit variance
        self.air = {device: 0.0 for device in DEVICES}  # the air at each device, lagging its room's heat input

    def _advance(self) -> dict[str, np.ndarray]:
        """One second of physics: the air at each device, (STEPS_PER_S,), for the steps ending at the second."""
        n = self.STEPS_PER_S
        noise = self.rng.normal(0.0, np.sqrt(1 - self.phi_heat**2), (len(self.heat), n))
        out = {}
        heat = {}
        for (room, prev), e in zip(self.heat.items(), noise, strict=True):
            h = np.empty(n)
            for k in range(n):
                prev = self.phi_heat * prev + e[k]
                h[k] = prev
            self.heat[room], heat[room] = prev, h
        for device, (room, _, _) in DEVICES.items():
            a, prev = np.empty(n), self.air[device]
            for k in range(n):
                prev = self.phi_air * prev + (1 - self.phi_air) * heat[room][k]
                a[k] = prev
            self.air[device], out[device] = prev, a
        return out

    def readings(self, k: int) -> dict[str, tuple[float, dict[str, float]]]:
        air = self._advance()
        out = {}
        for device, (_, phase, base) in DEVICES.items():
            step = self.STEPS_PER_S - 1 - round(phase * self.STEPS_PER_S)  # the device's instant in this second
            failed = device == FAILING and k >= self.fail_at_s
            warming = 2.0 * (1 - np.exp(-(k - self.fail_at_s) / 60.0)) if failed else 0.0  # no cooling any more
            n = self.rng.normal(0.0, 1.0, 5)
            temp = base + 2.5 * air[device][step] + warming + 0.2 * n[0]
            humidity = 60.0 * np.exp(-0.07 * (temp - 20.0)) + 0.8 * n[1]
            if failed:
                rpm = abs(15.0 * n[2])  # the tachometer's noise floor
            else:
                rpm = float(np.clip(1200.0 + 350.0 * (temp - base), 300.0, 3000.0)) + 25.0 * n[2]
            power = 40.0 + 60.0 * (rpm / 2000.0) ** 3 + 1.0 * n[3]
            t_s = k - phase + JITTER_S * float(np.clip(n[4], -3, 3))
            out[device] = (t_s, {"temp": temp, "humidity": humidity, "power": power, "fan_rpm": rpm})
        return out


@dataclass
class IotResult:
    """What the run showed: events, the latest snapshot's strongest pairs, and the verdicts."""

    events: list[ChangeEvent] = field(default_factory=list)
    snapshots: int = 0
    latest: Snapshot | None = None
    top_pairs: list[tuple[str, str, float]] = field(default_factory=list)  # (a, b, nats), strongest first
    top_cross_device: list[tuple[str, str, float]] = field(default_factory=list)  # pairs of two devices' channels
    fan_failure_detected_after_s: float | None = None  # device seconds from the failure to its event
    common_cause_found: bool = False
    ok: bool = False


def top_pairs(snap: Snapshot, k: int, *, cross_device: bool = False) -> list[tuple[str, str, float]]:
    """The k strongest evaluated pairs of a snapshot, (a, b, MI in nats), strongest first; with cross_device,
    only pairs whose channels belong to different devices."""
    names = snap.channels
    device = [name.split(".", 1)[0] for name in names]
    pairs = [(i, j, mi) for i, j, mi in snap.top_pairs() if not cross_device or device[i] != device[j]]
    return [(names[i], names[j], mi) for i, j, mi in pairs[:k]]


def broker_answers(host: str, port: int, timeout_s: float = 2.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def daemon_config(host: str, port: int, site: str, prefix: str) -> dict[str, Any]:
    """The daemon's configuration (the same keys as a YAML file for `streamcorr run`)."""
    broker = {"host": host, "port": port}
    return {
        "version": 1,
        "sources": [{"type": "mqtt", **broker, "topics": [f"{site}/+"], "channel_template": "{topic[1]}.{key}"}],
        "channels": {
            "names": [f"{d}.{f}" for d in DEVICES for f in FIELDS],
            "rate_hz": RATE_HZ,
            "max_staleness_s": 0.9,  # each device's sample is held until the next tick of the 1 Hz clock
        },
        # simulated time runs `speed` x faster than the wall clock: evaluate every window, as in a replay, so
        # that detection times do not depend on how busy this machine is
        "window": {"samples": WINDOW, "hop_samples": HOP, "skip_stale_hops": False},
        "outputs": {"mqtt": {**broker, "prefix": prefix}, "status_interval_s": 1.0},
        "http": {"enabled": False},
    }


def _fmt_event(ev: ChangeEvent, t0_s: float) -> str:
    a, b = ev.pair
    return f"  t={ev.t_ns / 1e9 - t0_s:6.0f} s  {ev.kind:<18}  {a} ~ {b}:  {ev.previous:.2f} -> {ev.current:.2f} nats"


async def _publish(
    host: str, port: int, site: Site, site_name: str, seconds: float, speed: float, t0_s: float, evaluated_s: Any
) -> int:
    """Publish every device's readings once per device second, paced at `speed` x real time; returns messages.

    Simulated time may outrun this machine's engine: the devices wait while the newest evaluated window
    (``evaluated_s()``, stream seconds) is more than a few hops behind, as a replay would, so that no window is
    overwritten in the ring buffers before it is evaluated (that, on a busy machine, delayed detection by minutes).
    """
    sent = 0
    loop = asyncio.get_running_loop()
    start = loop.time()
    max_lag_s = (WINDOW / 2 + 2 * HOP) / RATE_HZ
    async with aiomqtt.Client(host, port, identifier=f"iot-sim-{uuid.uuid4().hex[:8]}") as client:
        for k in range(1, int(seconds * RATE_HZ) + 1):
            for device, (t_s, fields) in site.readings(k).items():
                t = t0_s + t_s  # each device stamps its reading on its own clock
                payload = {"t": round(t, 3), "seq": k, **{f: round(v, 3) for f, v in fields.items()}}
                await client.publish(f"{site_name}/{device}", json.dumps(payload), qos=1)
                sent += 1
            await asyncio.sleep(max(0.0, start + k / RATE_HZ / speed - loop.time()))
            if k / RATE_HZ > (WINDOW + 2 * HOP) / RATE_HZ:
                while t0_s + k / RATE_HZ - evaluated_s() > max_lag_s:
                    await asyncio.sleep(0.01)
                    start += 0.01  # pacing resumes from here
    return sent


async def _clear_retained(host: str, port: int, prefix: str) -> None:
    """The output retains its last snapshot and status; a one-off run should not leave them on the broker."""
    async with aiomqtt.Client(host, port) as client:
        for stream in ("snapshot", "pairs", "status"):
            await client.publish(f"{prefix}/{stream}", b"", qos=1, retain=True)


async def run(
    host: str,
    port: int,
    site_name: str,
    seconds: float,
    fail_at_s: float,
    speed: float,
    seed: int,
    all_events: bool = False,
) -> IotResult:
    """Run the daemon, the devices and the subscriber; collect what the subscriber received."""
    result = IotResult()
    prefix = f"streamcorr-example/{uuid.uuid4().hex[:8]}"
    # device clocks: Unix seconds, advancing `speed` x faster than real time; they start in the past so that they
    # never run ahead of the wall clock (the daemon refuses samples stamped beyond channels.max_future_s)
    t0_s = float(round(time.time() - seconds))
    daemon = Daemon(parse_config(daemon_config(host, port, site_name, prefix)))
    daemon_task = asyncio.create_task(daemon.run(install_signals=False))
    src = daemon.sources[0][1]
    try:
        deadline = time.monotonic() + 30
        while not (src.connected and daemon.sinks[0].connected):
            if daemon_task.done():
                daemon_task.result()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the daemon did not connect to {host}:{port} within 30 s")
            await asyncio.sleep(0.05)
        print(f"daemon: subscribed to {site_name}/+ on {host}:{port}, publishing under {prefix}/")
        print(
            f"site: {len(DEVICES)} devices x {len(FIELDS)} fields, {seconds:g} s; {FAILING}'s fan fails at "
            f"{fail_at_s:g} s"
        )
        print("change events:" if all_events else "change events (dependence switching on or off):")
        async with Subscriber(f"mqtt://{host}:{port}", prefix=prefix, streams=("snapshot", "event")) as sub:

            async def take_snapshots() -> None:
                async for snap in sub.snapshots():
                    result.snapshots += 1
                    result.latest = snap

            async def take_events() -> None:
                async for ev in sub.events():
                    result.events.append(ev)
                    if all_events or ev.kind.startswith("became-"):
                        print(_fmt_event(ev, t0_s), flush=True)

            readers = [asyncio.create_task(take_snapshots()), asyncio.create_task(take_events())]
            site = Site(np.random.default_rng(seed), fail_at_s)

            def evaluated_s() -> float:
                latest = daemon.engine.latest
                return latest.t_ns / 1e9 if latest is not None else float("-inf")

            sent = await _publish(host, port, site, site_name, seconds, speed, t0_s, evaluated_s)
            deadline = time.monotonic() + 10
            while src.counters.messages < sent and time.monotonic() < deadline:  # all through the broker ...
                await asyncio.sleep(0.02)
            await daemon.engine.flush()  # ... every window that is due evaluated ...
            await asyncio.sleep(0.5)  # ... and the last snapshot and events back through the broker
            for task in readers:
                task.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
    finally:
        daemon.stop()
        await daemon_task
        with contextlib.suppress(aiomqtt.MqttError, OSError):
            await _clear_retained(host, port, prefix)
    if not all_events:
        moves = sum(not ev.kind.startswith("became-") for ev in result.events)
        print(f"  (and {moves} rise/fall events of pairs that stayed dependent; --all-events lists them)")
    c, ec = src.counters, daemon.engine.counters
    print(
        f"daemon: {c.messages} messages, {c.samples_accepted} samples accepted, {c.dropped} dropped, "
        f"{c.seq_gaps} lost; {ec.hops} windows evaluated "
        f"({ec.pairs_evaluated} pair estimates), {ec.hops_skipped} skipped while the engine was busy"
    )
    _judge(result, t0_s + fail_at_s)
    return result


def _judge(result: IotResult, fail_t_s: float) -> None:
    after = [
        ev.t_ns / 1e9 - fail_t_s
        for ev in result.events
        if ev.kind == "became-independent" and ev.pair == FAN_PAIR and ev.t_ns / 1e9 >= fail_t_s
    ]
    result.fan_failure_detected_after_s = min(after) if after else None
    if result.latest is not None:
        result.top_pairs = top_pairs(result.latest, TOP_K)
        result.top_cross_device = top_pairs(result.latest, TOP_CROSS, cross_device=True)
    # The heater couples the two lab devices and nothing else: the strongest cross-device pairs are all lab-1 x
    # lab-2, the temperatures among them.
    labs = {"lab-1", "lab-2"}
    result.common_cause_found = COMMON_CAUSE_PAIR in {(a, b) for a, b, _ in result.top_cross_device} and all(
        {a.split(".")[0], b.split(".")[0]} == labs for a, b, _ in result.top_cross_device
    )
    result.ok = result.fan_failure_detected_after_s is not None and result.common_cause_found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="MQTT broker (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=1883, help="MQTT port (default 1883)")
    parser.add_argument("--site", default="site", help="first topic level: devices publish on <site>/<device>")
    parser.add_argument("--seconds", type=float, default=400.0, help="device time to simulate (default 400)")
    parser.add_argument("--fail-at", type=float, default=None, help="device time the fan fails (default: halfway)")
    parser.add_argument("--speed", type=float, default=40.0, help="device seconds per wall-clock second (default 40)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--all-events", action="store_true", help="also print rise/fall events")
    args = parser.parse_args(argv)
    fail_at = args.seconds / 2 if args.fail_at is None else args.fail_at
    window_s = WINDOW / RATE_HZ
    after_s = window_s + 4 * HOP / RATE_HZ  # the failure must fill a window, then be confirmed
    if not 0 < args.speed <= 1000 or not window_s + 2 * HOP / RATE_HZ <= fail_at <= args.seconds - after_s:
        parser.error(
            f"need 0 < --speed <= 1000, and --fail-at at least {window_s + 2 * HOP / RATE_HZ:g} s into the run "
            f"and {after_s:g} s before its end (a window before it, a window and a few evaluations after)"
        )
    if not args.site or any(c in args.site for c in "/+#"):
        parser.error(f"--site must be one topic level without '/', '+' or '#'; got {args.site!r}")
    if not broker_answers(args.host, args.port):
        print(
            f"No MQTT broker answers on {args.host}:{args.port}. Start Mosquitto (e.g. `mosquitto -d`, or "
            f"`sudo systemctl start mosquitto`) or point --host/--port at a running broker.",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        result = asyncio.run(
            run(args.host, args.port, args.site, args.seconds, fail_at, args.speed, args.seed, args.all_events)
        )
    except (StreamcorrError, TimeoutError, OSError, aiomqtt.MqttError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"\nstrongest pairs of the latest snapshot ({result.snapshots} snapshots received):")
    for a, b, mi in result.top_pairs:
        print(f"  {a:>15} ~ {b:<15} {mi:5.2f} nats")
    print("strongest pairs across devices:")
    for a, b, mi in result.top_cross_device:
        print(f"  {a:>15} ~ {b:<15} {mi:5.2f} nats")
    if result.ok:
        print(
            f"\nOK: {FAILING}'s fan failure was detected {result.fan_failure_detected_after_s:.0f} s after it "
            f"happened (a {WINDOW / RATE_HZ:g} s window must mostly hold the new state), and the shared heater "
            f"shows as {COMMON_CAUSE_PAIR[0]} ~ {COMMON_CAUSE_PAIR[1]}"
        )
        return 0
    if result.fan_failure_detected_after_s is None:
        print(f"\nFAILED: no 'became-independent' event on {FAN_PAIR} after the fan failed")
    if not result.common_cause_found:
        print(f"\nFAILED: the strongest cross-device pairs are not all lab-1 ~ lab-2 including {COMMON_CAUSE_PAIR}")
    return 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
