"""A simulated sensor rig for the live demo: a robot arm, its motors, a tool spindle and its cooling.

Synchronous and deterministic: the same seed gives the same samples, however the stream is cut into chunks.
``Rig.chunk(n)`` advances the rig's clock (``rate_hz``, the engine's clock in the demo) by n ticks and returns
what the devices sent meanwhile, ``{channel: (stamps in s, values)}``, and the same held on the ticks.

The signals are those of a real rig, so that the demo shows the engine on what it will meet: smooth where
physics makes them smooth, noisy where sensors are, quantised where an ADC reads them, and stamped by devices
that keep their own time.

- Devices (``DEVICES``): the motion controller, the IMU hub, the vibration monitor and the power board sample at
  the clock's rate, the thermal board and the data-acquisition card at half of it; each at its own phase within
  its period, with stamp jitter of a fraction of a millisecond to a few. The channels of a device share its
  stamps. The engine puts each sample on its nearest tick and holds a slower device's samples; rows in which
  both channels of a pair repeat are left out of that pair.
- The arm: joints 1 and 2 pitch a planar two-link chain, joint 3 rolls the wrist. The commands ``jN.cmd`` are
  smooth random trajectories (white noise through two first-order stages of 0.15 s: a band-limited
  excitation), tracked by a position loop with a 40 ms time constant. The link-2 gyro sees the sum of joint 1
  and 2 rates, its accelerometer the tilt g cos(theta1 + theta2) and the centripetal r omega^2; a Hall sensor
  on the wrist sees cos(theta3); joint 1's gearbox vibration grows with |omega1|. The rate maps are symmetric
  about zero, and a rate averages to zero over any stretch (the angle stays bounded), so Pearson's r is ~0
  while MI is large (``pearson_blind_pairs``). An angle and its rate, taken at one instant, are independent.
- Motor currents are servo effort: the tracking error (about the loop's time constant times the joint rate)
  plus gravity on the links, clipped at the drive's limit.
- The tool spindle's load wanders over 0.5 s and sets the bus power. The controller board's temperature follows
  the power minutes behind: within a window it is a quantised slow drift, related to nothing the window can
  show. While the fan works, its controller holds the motor winding at 60 degC: the winding's sensor sees
  airflow turbulence (0.3 s), and the fan current tracks it.
- The spare inputs are independent smooth drifts (AR(1) with time constants of 0.5 and 1 s).

A window of such signals holds far fewer independent samples than ticks: independent pairs of smooth channels
read tenths of a nat. The engine judges each pair at its effective sample size (:mod:`streamcorr.significance`),
so it must report the couplings above (``Rig.coupled_at_start``) and nothing on those pairs.

``Rig.script`` lists what changes, and when: joint 2 seizes, so link 2 moves rigidly with link 1 and motor 2
pushes against the seized joint; the fan fails, so its current stops tracking the motor temperature, which then
warms over minutes and follows the bus power; a loose cable couples the spare input aux.adc to motor 1's
current. ``ScriptedChange`` says which events each change must raise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np
from scipy.signal import lfilter

from ..changes import EventKind
from ..errors import ConfigError

__all__ = ["CHANNELS", "DEVICES", "SLOW_CHANNELS", "Chunk", "Device", "Pair", "Rig", "Samples", "ScriptedChange"]

Pair = tuple[str, str]
Samples = tuple[np.ndarray, np.ndarray]  # (stamps in seconds (m,), values (m,)) of one channel


@dataclass(frozen=True)
class Device:
    """One device on the rig: its channels are sampled together and share its stamps.

    ``rate_div``: the device samples every ``rate_div`` ticks of the rig's clock. ``phase``: where in its
    period its first sample falls, as a fraction of the period. ``jitter``: standard deviation of each stamp's
    jitter, as a fraction of the clock's period (clipped to three standard deviations).
    """

    name: str
    channels: tuple[str, ...]
    rate_div: int
    phase: float
    jitter: float
    noise: tuple[float, ...]  # white measurement noise per channel (standard deviation, the channel's unit)
    quantum: tuple[float, ...]  # ADC step per channel (0: not quantised)


DEVICES: tuple[Device, ...] = (
    # the motion controller: joint angle commands, motor currents (current sense), the wrist's Hall sensor
    Device(
        "controller",
        ("j1.cmd", "j2.cmd", "j3.cmd", "m1.current", "m2.current", "m3.current", "j3.hall"),
        rate_div=1,
        phase=0.06,
        jitter=0.01,
        noise=(0, 0, 0, 0.05, 0.05, 0.05, 0.02),
        quantum=(0, 0, 0, 0.01, 0.01, 0.01, 1 / 512),
    ),
    # the IMUs on links 1-3, read by one hub that samples a little before the controller's ticks
    Device(
        "imu",
        ("l1.gyro", "l2.gyro", "l3.gyro", "l2.tilt", "l2.acc_r"),
        rate_div=1,
        phase=0.71,
        jitter=0.04,
        noise=(0.05, 0.05, 0.05, 0.05, 0.02),
        quantum=(0, 0, 0, 0.01, 0.01),
    ),
    # joint 1's condition monitor: gearbox vibration RMS
    Device("vibration", ("j1.vib",), rate_div=1, phase=0.3, jitter=0.05, noise=(0.001,), quantum=(0,)),
    # the power board: tool spindle load, bus power, cooling fan current
    Device(
        "power",
        ("tool.load", "bus.power", "fan.current"),
        rate_div=1,
        phase=0.18,
        jitter=0.03,
        noise=(0.3, 2.0, 0.03),
        quantum=(0.05, 0.5, 0.01),
    ),
    # the thermal board: two temperature sensors, 0.0625 degC steps, at half the clock's rate
    Device(
        "thermal",
        ("ctrl.temp", "motor.temp"),
        rate_div=2,
        phase=0.47,
        jitter=0.05,
        noise=(0.02, 0.02),
        quantum=(0.0625, 0.0625),
    ),
    # two spare inputs of a data-acquisition card at half the clock's rate, 12 bits over +-2.5 V
    Device(
        "daq",
        ("aux.adc", "spare.adc"),
        rate_div=2,
        phase=0.12,
        jitter=0.05,
        noise=(0.002, 0.002),
        quantum=(5 / 4096, 5 / 4096),
    ),
)

CHANNELS: tuple[str, ...] = tuple(c for d in DEVICES for c in d.channels)


@dataclass(frozen=True)
class Chunk:
    """n ticks of the rig: what the devices sent, and the same sampled and held on the clock's ticks."""

    ticks: np.ndarray  # (n,) the clock's ticks, s
    samples: dict[str, Samples]  # per channel, as the devices stamp them (channels of a device share stamps)
    held: dict[str, np.ndarray]  # per channel (n,): its newest sample at each tick (the engine's alignment)


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


# Times at script_scale=1. Which pairs change follows from the model; the asserted ones were checked by replaying
# the script through the engine on several seeds (tests/test_demo_rig.py): each crosses the engine's threshold
# at the pair's effective sample size within a window of its change. ``not_asserted`` pairs change too, but
# weakly, late, or by an amount that depends on the seed (where the joint seized, how fast the motor warms).
_SCRIPT: tuple[dict[str, Any], ...] = (
    dict(
        t_s=40.0,
        name="joint2-lock",
        description="joint 2 seizes: link 2 stops following the joint 2 command and moves rigidly with link 1; "
        "motor 2 now pushes against the seized joint",
        became_dependent=_pairs(("l1.gyro", "l2.gyro"), ("m1.current", "l2.gyro"), ("j2.cmd", "m2.current")),
        became_independent=_pairs(("m2.current", "l2.gyro")),
        # the tilt then sees cos(theta1 + theta2 at lock): how strongly depends on where the joint seized; link 2's
        # rate, now link 1's, is smaller, so its centripetal term falls by about a nat
        not_asserted=_pairs(
            ("l2.gyro", "l2.acc_r"),
            ("l2.gyro", "j1.vib"),  # |omega1| against omega1 + noise: weaker, confirmed later
            ("j1.cmd", "l2.tilt"),
            ("j2.cmd", "l2.tilt"),
            ("j1.cmd", "m2.current"),
            ("m2.current", "l2.tilt"),
            ("m2.current", "l2.acc_r"),
            ("l1.gyro", "l2.acc_r"),
            ("m1.current", "l2.acc_r"),
            ("l2.acc_r", "j1.vib"),
        ),
        shifted=("l2.gyro", "l2.tilt", "l2.acc_r", "m2.current"),
    ),
    dict(
        t_s=80.0,
        name="fan-failure",
        description="the cooling fan fails: its current stops tracking the motor temperature, which climbs and "
        "now follows bus power",
        became_independent=_pairs(("motor.temp", "fan.current")),
        not_asserted=_pairs(("motor.temp", "bus.power"), ("motor.temp", "tool.load"), ("motor.temp", "ctrl.temp")),
        shifted=("fan.current", "motor.temp"),
    ),
    dict(
        t_s=120.0,
        name="loose-cable",
        description="a loose cable couples the spare input aux.adc to motor 1's current",
        became_dependent=_pairs(("aux.adc", "m1.current"), ("aux.adc", "l1.gyro"), ("aux.adc", "l2.gyro")),
        not_asserted=_pairs(("aux.adc", "j1.vib"), ("aux.adc", "l2.acc_r")),
        shifted=("aux.adc",),
    ),
)

# Channels that drift over many seconds (the temperatures): while a window straddles a change, a channel whose
# distribution stepped can look dependent on them.
SLOW_CHANNELS: tuple[str, ...] = ("ctrl.temp", "motor.temp")

# Pairs coupled before the first change, strongly enough that the engine must report them dependent (once, as
# its verdict on the starting state) before it: the stable couplings and those the first change breaks.
_COUPLED_AT_START: tuple[Pair, ...] = _pairs(
    ("j3.cmd", "j3.hall"),
    ("m1.current", "l1.gyro"),
    ("m1.current", "j1.vib"),
    ("l1.gyro", "j1.vib"),
    ("m2.current", "l2.gyro"),
    ("l2.gyro", "l2.acc_r"),
    ("m3.current", "l3.gyro"),
    ("tool.load", "bus.power"),
    ("fan.current", "motor.temp"),
)


def _transient(spec: dict[str, Any]) -> tuple[Pair, ...]:
    touched = {p for key in ("became_dependent", "became_independent", "rises", "falls", "not_asserted")
               for p in spec.get(key, ())}  # fmt: skip
    pairs = {_pair(a, b) for a in spec.get("shifted", ()) for b in SLOW_CHANNELS if a != b}
    return tuple(sorted(pairs - touched, key=lambda p: (CHANNELS.index(p[0]), CHANNELS.index(p[1]))))


class _Lag:
    """First-order filters y[k] = phi y[k-1] + gain x[k] of R rows, run over consecutive chunks (R, n)."""

    def __init__(self, phi: np.ndarray | float, gain: np.ndarray | float, y0: float = 0.0) -> None:
        self.phi = np.atleast_1d(np.asarray(phi, dtype=float))  # (R,)
        self.gain = np.broadcast_to(np.asarray(gain, dtype=float), self.phi.shape).copy()
        self.y = np.full(self.phi.shape, y0)  # each row's last output

    def __call__(self, x: np.ndarray) -> np.ndarray:
        out = np.empty_like(x)  # (R, n)
        for r in range(len(self.phi)):
            out[r], _ = lfilter([self.gain[r]], [1.0, -self.phi[r]], x[r], zi=[self.phi[r] * self.y[r]])
        if x.shape[1]:
            self.y = out[:, -1].copy()
        return out


def _phi(tau_s: float, dt_s: float) -> float:
    return math.exp(-dt_s / tau_s)


class Rig:
    """Simulated arm + motors + spindle + cooling, sensed by devices on their own clocks; see the module docstring.

    >>> rig = Rig(seed=1)
    >>> chunk = rig.chunk(50)
    >>> len(chunk.samples), chunk.samples["j1.cmd"][0].shape, chunk.samples["ctrl.temp"][0].shape
    (20, (50,), (25,))
    >>> [c.t_s for c in Rig(script_scale=0.5).script]
    [20.0, 40.0, 60.0]
    """

    channels: tuple[str, ...] = CHANNELS
    devices: tuple[Device, ...] = DEVICES
    SUBSTEPS = 4  # physics steps per tick: devices sample the state between the ticks

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
        self._device_rng = [np.random.default_rng([seed, 2 + k]) for k in range(len(DEVICES))]
        self._glitch_rng = np.random.default_rng([seed, 1])  # separate stream: glitches leave clean values as they are
        self._k = 0  # ticks simulated so far
        self._next_sample = [0] * len(DEVICES)  # index of each device's next sample
        self._last = {c: math.nan for c in CHANNELS}  # each channel's newest sample, for held values
        self._last_t = {c: -math.inf for c in CHANNELS}
        self._noise = np.empty((0, 0))
        self._noise_at = 0
        h = self.dt / self.SUBSTEPS
        self.h = h
        # joint angle commands: white noise through two first-order stages (band-limited, smooth)
        tau_q = np.array([0.15, 0.15, 0.15])
        self.sigma_q = np.array([0.2, 0.4, 1.2])
        phi_q = np.exp(-h / tau_q)
        self._cmd1 = _Lag(phi_q, np.sqrt(1 - phi_q**2))  # unit variance
        self._cmd2 = _Lag(phi_q, (1 - phi_q) * (1 + phi_q) / np.sqrt(1 + phi_q**2))  # unit variance again
        self.tau_servo = 0.04  # position loop
        self.k_current = np.array([1.0, 0.8, 0.3])  # A per rad/s of tracking error over the loop's time constant
        self._servo = _Lag(np.full(3, _phi(self.tau_servo, h)), 1 - _phi(self.tau_servo, h))
        self._theta_prev = np.zeros(3)
        self._theta2_lock: float | None = None
        phi_load = _phi(0.5, h)
        self._load = _Lag(phi_load, 6.0 * math.sqrt(1 - phi_load**2))  # spindle load wanders over 0.5 s
        phi_turb = _phi(0.3, h)
        self._turb = _Lag(phi_turb, math.sqrt(1 - phi_turb**2))  # airflow turbulence at the motor's sensor
        self._ctrl_board = _Lag(_phi(120.0, h), 1 - _phi(120.0, h), 110.0)  # board: minutes behind bus power
        self._motor_housing = _Lag(_phi(300.0, h), 1 - _phi(300.0, h), 0.0)
        self._motor_winding = _Lag(_phi(2.0, h), 1 - _phi(2.0, h), 110.0)
        phi_adc = np.array([_phi(0.5, h), _phi(1.0, h)])
        self._drift = _Lag(phi_adc, np.sqrt(1 - phi_adc**2))

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
        skip = self.changing_pairs() | self.transient_pairs()
        return [p for p in self.pairs if p not in skip]

    def coupled_at_start(self) -> list[Pair]:
        """Pairs coupled before the first change strongly enough that the engine must report them dependent."""
        return list(_COUPLED_AT_START)

    def pearson_blind_pairs(self) -> list[Pair]:
        """Pairs with Pearson r ~ 0 but clearly positive MI in every regime: a joint rate and its magnitude or
        square (symmetric maps of a zero-mean rate)."""
        return list(_pairs(("l1.gyro", "j1.vib"), ("m1.current", "j1.vib"), ("l2.gyro", "l2.acc_r")))

    def max_period_s(self) -> float:
        """The slowest device's sampling period plus its jitter: how long the engine must hold a sample."""
        return max(d.rate_div * self.dt + 3 * d.jitter * self.dt for d in DEVICES)

    def chunk(self, n: int) -> Chunk:
        """The next n ticks of the clock: each device's samples whose sampling instant falls in them."""
        if n < 0:
            raise ConfigError(f"n must be >= 0 ticks; got {n}")
        if n == 0:
            empty = np.empty(0)
            return Chunk(empty, {c: (empty, empty) for c in CHANNELS}, {c: empty for c in CHANNELS})
        k0 = self._k
        self._k += n
        state = self._simulate(k0 * self.SUBSTEPS, self._draw(n * self.SUBSTEPS))  # channel -> (n * SUBSTEPS,)
        ticks = (k0 + np.arange(n)) * self.dt
        samples: dict[str, Samples] = {}
        for d, device in enumerate(DEVICES):
            first = self._next_sample[d]
            last = math.ceil((k0 + n) / device.rate_div - device.phase)  # its samples before the chunk's end
            self._next_sample[d] = max(first, last)
            m = np.arange(first, max(first, last))
            instants = (m + device.phase) * device.rate_div * self.dt  # when it samples
            steps = np.floor((m + device.phase) * device.rate_div * self.SUBSTEPS).astype(int)  # the state it sees
            z = self._device_rng[d].standard_normal((len(m), 1 + len(device.channels))).T  # per sample, in order
            stamps = instants + np.clip(z[0], -3, 3) * device.jitter * self.dt
            idx = steps - k0 * self.SUBSTEPS
            noise = z[1:]
            for c, sd, q, e in zip(device.channels, device.noise, device.quantum, noise, strict=True):
                v = state[c][idx] + sd * e
                if q > 0:
                    v = np.round(v / q) * q
                samples[c] = (stamps, v)
        if self.nan_rate > 0:  # sensor glitches: the engine drops and counts non-finite samples
            for c in CHANNELS:
                t, v = samples[c]
                bad = self._glitch_rng.random(len(v)) < self.nan_rate
                samples[c] = (t, np.where(bad, math.nan, v))
        return Chunk(ticks, samples, self._hold(ticks, samples))

    def arrays(self, n: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The next n ticks held on the clock: ticks (n,) and one (n,) series per channel (NaN before a
        channel's first sample)."""
        c = self.chunk(n)
        return c.ticks, c.held

    # -- simulation --------------------------------------------------------------------------------
    _N_NOISE = 7  # standard normals per physics step

    def _draw(self, n: int) -> np.ndarray:
        out = np.empty((n, self._N_NOISE))
        at = 0
        while at < n:
            if self._noise_at >= len(self._noise):  # draw in blocks: the same values whatever the chunk sizes
                self._noise = self._rng.standard_normal((4096, self._N_NOISE))
                self._noise_at = 0
            take = min(n - at, len(self._noise) - self._noise_at)
            out[at : at + take] = self._noise[self._noise_at : self._noise_at + take]
            self._noise_at += take
            at += take
        return out.T  # (N_NOISE, n)

    def _hold(self, ticks: np.ndarray, samples: dict[str, Samples]) -> dict[str, np.ndarray]:
        """Each channel's newest sample at each tick, a sample stamped within half a period after it counting."""
        out = {}
        for c, (t, v) in samples.items():
            ok = np.isfinite(v)
            tt = np.concatenate([[self._last_t[c]], t[ok]])
            vv = np.concatenate([[self._last[c]], v[ok]])
            idx = np.searchsorted(tt, ticks + 0.5 * self.dt, side="right") - 1
            out[c] = np.where(idx >= 0, vv[np.maximum(idx, 0)], math.nan)
            if ok.any():
                self._last_t[c], self._last[c] = float(tt[-1]), float(vv[-1])
        return out

    def _simulate(self, s0: int, z: np.ndarray) -> dict[str, np.ndarray]:
        """The physical state at physics steps s0, s0 + 1, ... (one per column of z (N_NOISE, n))."""
        n = z.shape[1]
        h, g = self.h, 9.81
        t = (s0 + np.arange(n)) * h
        locked = t >= self._t_lock
        fan_ok = t < self._t_fan
        cable = t >= self._t_cable

        # joints: smooth band-limited commands around home, tracked by a stiff position loop. The shoulder and elbow
        # pitch link 1 and link 2; the wrist roll sweeps wide and symmetrically so that cos(theta3) covers its range.
        q = self.sigma_q[:, None] * self._cmd2(self._cmd1(z[0:3]))  # (3, n) rad
        theta = self._servo(q)
        if locked.any():  # the joint is seized where it stood
            if self._theta2_lock is None:
                first = int(np.argmax(locked))
                self._theta2_lock = float(theta[1, first - 1]) if first > 0 else float(self._theta_prev[1])
            theta[1, locked] = self._theta2_lock
        omega = np.diff(np.concatenate([self._theta_prev[:, None], theta], axis=1), axis=1) / h  # (3, n) rad/s
        self._theta_prev = theta[:, -1].copy()
        pitch2 = theta[0] + theta[1]
        rate2 = omega[0] + omega[1]

        # servo effort: the tracking error (against the seized joint, once locked) plus gravity on the links
        err = q - theta
        gravity = 0.4 * np.stack([np.cos(theta[0]), np.cos(pitch2), np.zeros(n)])
        current = np.clip(self.k_current[:, None] * err / self.tau_servo + gravity, -6.0, 6.0)

        # the tool spindle: its load sets the bus power, which warms the controller board over minutes
        load = 20.0 + self._load(z[3:4])[0]
        power = 30.0 + 4.0 * load
        ctrl_temp = 20.0 + 0.15 * self._ctrl_board(power[None])[0]
        # the motor winding: while the fan works its controller holds the temperature at 60 degC and the sensor
        # sees airflow turbulence; uncooled, the housing warms over minutes and the winding follows power in seconds
        turb = self._turb(z[4:5])[0]
        warm = self._motor_housing(np.where(fan_ok, 0.0, 10.0)[None])[0]
        winding = self._motor_winding(power[None])[0] - 110.0
        motor_temp = np.where(fan_ok, 60.0 + 0.8 * turb, 60.0 + warm + 0.04 * winding + 0.1 * turb)
        # the fan controller reads its own thermistor beside the winding's sensor; stalled, the fan draws nothing
        fan = np.where(fan_ok, 1.5 + 0.6 * (motor_temp - 60.0), 0.0)

        drift = 0.1 * self._drift(z[5:7])  # (2, n) V
        aux = drift[0] + np.where(cable, 0.4 * current[0], 0.0)
        return {
            "j1.cmd": q[0],
            "j2.cmd": q[1],
            "j3.cmd": q[2],
            "l1.gyro": omega[0],
            "l2.gyro": rate2,
            "l3.gyro": omega[2],
            "l2.tilt": g * np.cos(pitch2),
            "l2.acc_r": 0.4 * rate2**2,
            "j3.hall": np.cos(theta[2]),
            "j1.vib": 0.02 + 0.01 * np.abs(omega[0]),
            "m1.current": current[0],
            "m2.current": current[1],
            "m3.current": current[2],
            "tool.load": load,
            "bus.power": power,
            "ctrl.temp": ctrl_temp,
            "motor.temp": motor_temp,
            "fan.current": fan,
            "aux.adc": aux,
            "spare.adc": drift[1],
        }
