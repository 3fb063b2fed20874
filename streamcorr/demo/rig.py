"""A simulated sensor rig for the live demo: a robot arm, its motors, and their thermal loop.

Synchronous and deterministic: the same seed gives the same frames. One frame per
tick of ``rate_hz``, each a ``{channel: value}`` dict at stream time t (seconds).

What is coupled to what, and why (``Rig.script`` lists what changes, and when):

- The arm: joints 1 and 2 pitch a planar two-link chain, joint 3 rolls the wrist.
  Joint angle commands ``jN.cmd`` are a fast random excitation (as in a
  system-identification run) tracked by a servo. The link-2 gyro sees the sum of
  joint 1 and 2 rates, its tilt accelerometer g cos(theta1 + theta2), its radial
  axis the centripetal term r omega^2; a Hall sensor on the wrist sees
  cos(theta3); joint 1's gearbox vibration grows with |omega1|. The last three are
  Pearson-blind: symmetric about zero, so Pearson's r is ~0 while MI is large.
- Motor currents are servo effort: the tracking error plus gravity on the links.
- The tool spindle's load is the slow common cause of the thermal channels: load
  -> bus power -> controller temperature (first-order lag). The motor winding
  temperature is held by a fan controller: while the fan works the fan current
  tracks the temperature error, which is mostly airflow turbulence, so the motor
  temperature does not follow power.
- Two spare analog inputs are independent noise.

The excitation is fast on purpose: a 10 s window then holds hundreds of nearly
independent samples. Slow, smooth independent signals look dependent in short
windows (the engine's null calibration assumes exchangeable samples), so the
only slow channels are the load family, which depend on each other anyway.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np

from ..engine.changes import EventKind
from ..errors import ConfigError

__all__ = ["CHANNELS", "SLOW_CHANNELS", "Pair", "Rig", "ScriptedChange", "TimedFrame"]

Pair = tuple[str, str]
TimedFrame = tuple[float, dict[str, float]]  # (t in seconds, {channel: value})

CHANNELS: tuple[str, ...] = (
    "j1.cmd",  # joint angle commands, rad
    "j2.cmd",
    "j3.cmd",
    "l1.gyro",  # link angular rates, rad/s
    "l2.gyro",
    "l3.gyro",
    "l2.tilt",  # link 2 accelerometer, tangential axis: g cos(theta1 + theta2), m/s^2
    "l2.acc_r",  # link 2 accelerometer, radial axis: centripetal r omega^2, m/s^2
    "j3.hall",  # joint 3 magnetic angle sensor: cos(theta3), normalised
    "j1.vib",  # joint 1 gearbox vibration RMS, g
    "m1.current",  # motor currents, A
    "m2.current",
    "m3.current",
    "tool.load",  # tool spindle load, N m
    "bus.power",  # W
    "ctrl.temp",  # controller board temperature, degC
    "motor.temp",  # motor winding temperature, degC
    "fan.current",  # cooling fan current, A
    "aux.adc",  # spare analog inputs: noise, V
    "spare.adc",
)


@dataclass(frozen=True)
class ScriptedChange:
    """A timed change in the rig and the change events it should raise.

    Pairs are in ``CHANNELS`` order (the engine's order when it is configured with
    ``channels=list(Rig.channels)``). ``not_asserted`` pairs change too, but
    weakly: an event there is correct but not guaranteed within two windows.
    """

    t_s: float
    name: str
    description: str
    became_dependent: tuple[Pair, ...] = ()
    became_independent: tuple[Pair, ...] = ()
    rises: tuple[Pair, ...] = ()  # dependent before and after, much more so after
    falls: tuple[Pair, ...] = ()
    not_asserted: tuple[Pair, ...] = ()
    # Channels whose distribution steps at t_s. While a window straddles t_s, such a channel looks dependent on
    # any slowly drifting channel (both differ between the window's halves): brief, real artefacts of windowing.
    shifted: tuple[str, ...] = ()
    transient: tuple[Pair, ...] = ()  # shifted x slow channels: events allowed within two windows of t_s

    @property
    def expected(self) -> tuple[tuple[Pair, EventKind], ...]:
        """(pair, event kind) the engine must report after t_s."""
        kinds: tuple[tuple[EventKind, tuple[Pair, ...]], ...] = (
            ("became-dependent", self.became_dependent),
            ("became-independent", self.became_independent),
            ("rise", self.rises),
            ("fall", self.falls),
        )
        return tuple((p, kind) for kind, pairs in kinds for p in pairs)

    @property
    def pairs(self) -> set[Pair]:
        """Every pair this change touches, asserted or not."""
        return {p for p, _ in self.expected} | set(self.not_asserted)

    def __str__(self) -> str:
        return f"t={self.t_s:g} s {self.name}: {self.description}"


def _pair(a: str, b: str) -> Pair:
    ia, ib = CHANNELS.index(a), CHANNELS.index(b)
    return (a, b) if ia < ib else (b, a)


def _pairs(*ab: tuple[str, str]) -> tuple[Pair, ...]:
    return tuple(_pair(a, b) for a, b in ab)


# Times at script_scale=1. Which pairs change follows from the model; each list was checked against InfoNet
# estimates on 512-sample windows of each regime (tests/demo/test_demo_rig.py): became_* pairs cross from well below
# the engine's thresholds to well above, or back; rises and falls move by more than 1 nat.
_SCRIPT: tuple[dict[str, Any], ...] = (
    dict(
        t_s=40.0,
        name="joint2-lock",
        description="joint 2 seizes: link 2 stops following the joint 2 command and moves rigidly with link 1; "
        "motor 2 now pushes against the seized joint",
        became_dependent=_pairs(
            ("j1.cmd", "l2.gyro"),
            ("l1.gyro", "l2.gyro"),
            ("l1.gyro", "l2.acc_r"),
            ("l2.gyro", "j1.vib"),
            ("l2.gyro", "m1.current"),
            ("l2.acc_r", "j1.vib"),
            ("l2.acc_r", "m1.current"),
        ),
        became_independent=_pairs(
            ("j2.cmd", "l2.gyro"),
            ("j2.cmd", "l2.tilt"),
            ("j2.cmd", "l2.acc_r"),
            ("l2.gyro", "m2.current"),
            ("l2.acc_r", "m2.current"),
        ),
        rises=_pairs(("j2.cmd", "m2.current")),
        falls=_pairs(("l2.gyro", "l2.acc_r")),
        # the tilt then sees cos(theta1 + theta2 at lock): strength depends on where the joint seized
        not_asserted=_pairs(
            ("j1.cmd", "l2.acc_r"),
            ("j1.cmd", "l2.tilt"),
            ("l1.gyro", "l2.tilt"),
            ("l2.gyro", "l2.tilt"),
            ("l2.tilt", "l2.acc_r"),
            ("l2.tilt", "j1.vib"),
            ("l2.tilt", "m1.current"),
        ),
        shifted=("l2.gyro", "l2.tilt", "l2.acc_r", "m2.current"),
    ),
    dict(
        t_s=80.0,
        name="fan-failure",
        description="the cooling fan fails: its current stops tracking the motor temperature, which now follows "
        "bus power",
        became_dependent=_pairs(("motor.temp", "bus.power"), ("motor.temp", "tool.load"), ("motor.temp", "ctrl.temp")),
        became_independent=_pairs(("motor.temp", "fan.current")),
        shifted=("fan.current", "motor.temp"),
    ),
    dict(
        t_s=120.0,
        name="loose-cable",
        description="a loose cable couples the spare input aux.adc to motor 1's current",
        became_dependent=_pairs(
            ("aux.adc", "m1.current"),
            ("aux.adc", "l1.gyro"),
            ("aux.adc", "l2.gyro"),
            ("aux.adc", "j1.vib"),
        ),
        # l2.acc_r sees the cable only through motor 1's current: under the default budget of one chance event
        # an hour over the 190 pairs it stays below the bar at a 10 s window
        not_asserted=_pairs(
            ("aux.adc", "j1.cmd"), ("aux.adc", "l2.tilt"), ("aux.adc", "bus.power"), ("aux.adc", "l2.acc_r")
        ),
        shifted=("aux.adc",),
    ),
)

# Channels that drift over seconds: the load and everything it heats.
SLOW_CHANNELS: tuple[str, ...] = ("tool.load", "bus.power", "ctrl.temp", "motor.temp")

# Pairs whose dependence is weak and wanders around the detection threshold: never asserted. l2.tilt and
# m2.current share cos(theta1 + theta2) through gravity on link 2 until the lock: about 0.03 nats over a long
# regime 0 (KSG-3 0.046), so a mean of three 512-sample windows lands either side of 0.05.
_BORDERLINE: tuple[Pair, ...] = _pairs(("l3.gyro", "j3.hall"), ("l2.tilt", "m2.current"))


def _transient(spec: dict[str, Any]) -> tuple[Pair, ...]:
    touched = {p for key in ("became_dependent", "became_independent", "rises", "falls", "not_asserted")
               for p in spec.get(key, ())}  # fmt: skip
    pairs = {_pair(a, b) for a in spec.get("shifted", ()) for b in SLOW_CHANNELS if a != b}
    return tuple(sorted(pairs - touched, key=lambda p: (CHANNELS.index(p[0]), CHANNELS.index(p[1]))))


class Rig:
    """Simulated arm + motors + thermal loop, one frame per tick; see the module docstring.

    >>> rig = Rig(seed=1)
    >>> t, frame = rig.step()
    >>> t, len(frame), sorted(frame)[:2]
    (0.0, 20, ['aux.adc', 'bus.power'])
    >>> [c.t_s for c in Rig(script_scale=0.5).script]
    [20.0, 40.0, 60.0]
    """

    channels: tuple[str, ...] = CHANNELS

    def __init__(
        self, seed: int = 0, rate_hz: float = 50.0, *, script_scale: float = 1.0, nan_rate: float = 0.0
    ) -> None:
        if not rate_hz > 0:
            raise ConfigError(f"rate_hz must be > 0; got {rate_hz}")
        if not script_scale > 0:
            raise ConfigError(f"script_scale must be > 0 (0.5 halves every scripted time); got {script_scale}")
        if not 0 <= nan_rate < 1:
            raise ConfigError(f"nan_rate must be in [0, 1) (fraction of samples sent as NaN); got {nan_rate}")
        self.seed = seed
        self.rate_hz = float(rate_hz)
        self.nan_rate = nan_rate
        self.dt = 1.0 / self.rate_hz
        self.script: list[ScriptedChange] = [
            ScriptedChange(**(spec | {"t_s": spec["t_s"] * script_scale, "transient": _transient(spec)}))
            for spec in _SCRIPT
        ]
        self._t_lock, self._t_fan, self._t_cable = (c.t_s for c in self.script)
        self._rng = np.random.default_rng(seed)
        self._glitch_rng = np.random.default_rng([seed, 1])  # separate stream: glitches leave clean values as they are
        self._k = 0
        self._noise = np.empty((0, 0))
        self._noise_at = 0
        dt = self.dt
        self._phi_q = math.exp(-dt / 0.01)  # command excitation: a fresh random set-point nearly every tick
        self._beta = 1.0 - math.exp(-dt / 0.02)  # servo: 20 ms time constant
        self._phi_load = math.exp(-dt / 0.5)  # tool load wanders over ~0.5 s
        self._a_ctrl = 1.0 - math.exp(-dt / 0.1)  # controller board thermal lag
        self._a_motor = 1.0 - math.exp(-dt / 0.1)  # motor winding thermal lag once uncooled
        self._phi_turb = math.exp(-dt / 0.02)  # airflow turbulence at the motor
        self._q = np.zeros(3)
        self._theta = np.zeros(3)
        self._load = 20.0
        self._ctrl_temp = 45.0
        self._motor_free = 60.0  # winding temperature without the fan (set when it fails)
        self._turb = 0.0

    # -- public ----------------------------------------------------------------------------------
    @property
    def pairs(self) -> list[Pair]:
        """Every unordered channel pair, in CHANNELS order."""
        return list(combinations(self.channels, 2))

    def changing_pairs(self) -> set[Pair]:
        """Pairs the script changes, asserted or not."""
        return {p for c in self.script for p in c.pairs}

    def transient_pairs(self) -> set[Pair]:
        """Pairs that may raise brief events while a window straddles a scripted change (see ScriptedChange)."""
        return {p for c in self.script for p in c.transient}

    def stable_pairs(self) -> list[Pair]:
        """Pairs that must never raise a change event: the script leaves them clearly dependent or independent."""
        skip = self.changing_pairs() | self.transient_pairs() | set(_BORDERLINE)
        return [p for p in self.pairs if p not in skip]

    def pearson_blind_pairs(self) -> list[Pair]:
        """Pairs with |Pearson r| < 0.1 but clearly positive MI in every regime (symmetric non-monotone maps)."""
        return list(_pairs(("j3.cmd", "j3.hall"), ("l1.gyro", "j1.vib"), ("l2.gyro", "l2.acc_r")))

    def step(self) -> TimedFrame:
        """Advance one tick; returns (t in seconds, {channel: value})."""
        t = self._k * self.dt
        self._k += 1
        return t, self._tick(t, self._draw())

    def frames(self, n: int) -> Iterator[TimedFrame]:
        """The next n frames."""
        if n < 0:
            raise ConfigError(f"n must be >= 0 frames; got {n}")
        for _ in range(n):
            yield self.step()

    def arrays(self, n: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The next n frames as arrays: times (n,) and one (n,) series per channel."""
        t = np.empty(n)
        out = {c: np.empty(n) for c in self.channels}
        for k, (tk, frame) in enumerate(self.frames(n)):
            t[k] = tk
            for c, v in frame.items():
                out[c][k] = v
        return t, out

    # -- simulation --------------------------------------------------------------------------------
    _N_NOISE = 24  # standard normals per tick

    def _draw(self) -> np.ndarray:
        if self._noise_at >= len(self._noise):  # draw in blocks: one generator call per 1024 ticks
            self._noise = self._rng.standard_normal((1024, self._N_NOISE))
            self._noise_at = 0
        row = self._noise[self._noise_at]
        self._noise_at += 1
        return row

    def _tick(self, t: float, z: np.ndarray) -> dict[str, float]:
        dt, g = self.dt, 9.81
        locked = t >= self._t_lock
        fan_ok = t < self._t_fan
        cable = t >= self._t_cable

        # joint commands: OU excitation around home. The shoulder moves little, the elbow more, and the wrist
        # roll sweeps wide and symmetrically so that cos(theta3) covers its range.
        sigma_q = np.array([0.07, 0.4, 1.2])
        self._q = self._phi_q * self._q + math.sqrt(1 - self._phi_q**2) * sigma_q * z[0:3]
        theta_prev = self._theta.copy()
        self._theta = theta_prev + self._beta * (self._q - theta_prev)
        if locked:
            self._theta[1] = theta_prev[1]  # the joint is seized where it stood
        omega = (self._theta - theta_prev) / dt  # joint rates (3,)
        pitch2 = self._theta[0] + self._theta[1]  # planar chain: link 2 pitches by both joint angles
        rate2 = omega[0] + omega[1]

        # servo effort: tracking error (against the seized joint, once locked) plus gravity on the links
        err = self._q - theta_prev
        gravity = 0.4 * np.array([math.cos(self._theta[0]), math.cos(pitch2), 0.0])
        current = np.clip(8.0 * err + gravity, -6.0, 6.0) + 0.05 * z[4:7]

        # power and heat: the tool spindle's load is the slow common cause (the arm's motors draw little)
        self._load = 20.0 + self._phi_load * (self._load - 20.0) + math.sqrt(1 - self._phi_load**2) * 6.0 * z[3]
        power = 30.0 + 4.0 * self._load + 2.0 * z[7]
        self._ctrl_temp += self._a_ctrl * (20.0 + 0.3 * power - self._ctrl_temp)
        self._turb = self._phi_turb * self._turb + math.sqrt(1 - self._phi_turb**2) * z[8]
        if fan_ok:
            motor_temp = 60.0 + 0.8 * self._turb  # held at setpoint; the residual is turbulence
            fan = 1.5 + 0.6 * (motor_temp - 60.0) + 0.05 * z[9]
            self._motor_free = motor_temp
        else:
            self._motor_free += self._a_motor * (25.0 + 0.25 * power - self._motor_free)
            motor_temp = self._motor_free + 0.8 * self._turb
            fan = 0.02 * abs(z[9])  # stalled: leakage only

        aux = 0.1 * z[10] + (0.2 * current[0] if cable else 0.0)
        frame = {
            "j1.cmd": self._q[0],
            "j2.cmd": self._q[1],
            "j3.cmd": self._q[2],
            "l1.gyro": omega[0] + 0.3 * z[11],
            "l2.gyro": rate2 + 0.3 * z[12],
            "l3.gyro": omega[2] + 0.3 * z[13],
            "l2.tilt": g * math.cos(pitch2) + 0.05 * z[14],
            "l2.acc_r": 0.4 * rate2**2 + 2.0 * z[15],
            "j3.hall": math.cos(self._theta[2]) + 0.05 * z[16],
            "j1.vib": 0.02 + 0.01 * abs(omega[0]) * (1.0 + 0.2 * z[17]),
            "m1.current": current[0],
            "m2.current": current[1],
            "m3.current": current[2],
            "tool.load": self._load + 0.3 * z[18],
            "bus.power": power,
            "ctrl.temp": self._ctrl_temp + 0.05 * z[19],
            "motor.temp": motor_temp + 0.05 * z[20],
            "fan.current": fan,
            "aux.adc": aux,
            "spare.adc": 0.1 * z[21],
        }
        out = {k: float(v) for k, v in frame.items()}
        if self.nan_rate > 0:  # sensor glitches: the engine drops and counts non-finite samples
            for k, u in zip(out, self._glitch_rng.random(len(out)), strict=True):
                if u < self.nan_rate:
                    out[k] = math.nan
        return out
