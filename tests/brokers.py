"""Helpers for the transport tests: a private Mosquitto (stop, restart), a hostile corpus, a small Engine."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

MOSQUITTO = shutil.which("mosquitto") or next((p for p in ("/usr/sbin/mosquitto",) if os.path.exists(p)), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int, timeout_s: float = 0.2) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s):
            return True
    except OSError:
        return False


class PrivateBroker:
    """A mosquitto on 127.0.0.1 and a free port, with a throwaway config; stop() and start() keep the port."""

    def __init__(self, workdir: Path) -> None:
        if MOSQUITTO is None:
            msg = "no mosquitto binary on PATH (apt-get install mosquitto)"
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(msg)
            pytest.skip(msg)
        self.port = free_port()
        self.conf = workdir / "mosquitto.conf"
        self.conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
        self.log_path = workdir / "mosquitto.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 10.0) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen([str(MOSQUITTO), "-c", str(self.conf)], stdout=log, stderr=log)
        deadline = time.monotonic() + timeout_s
        while not port_open(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mosquitto did not start on {self.port}: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> PrivateBroker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def vm_rss_bytes() -> int:
    """Resident set size of this process, from /proc/self/status."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


# -- hostile corpus -------------------------------------------------------------------------------------
# Decoder and engine settings the corpus is written for: topic "<prefix>/dev" -> channels "dev.<key>".
HOSTILE_DECODER = {"channel_template": "{topic[1]}.{key}", "max_payload_bytes": 4096, "max_samples_per_message": 256}
HOSTILE_CHANNELS = ["dev.x", "dev.y"]  # the engine knows only these (auto_add_channels=False)


@dataclass
class Ledger:
    """What a corpus must produce: drops by reason, samples decoded, and samples the engine accepts."""

    messages: int = 0
    decoded: int = 0
    accepted: int = 0
    unknown_samples: int = 0  # samples for channels the engine does not know
    drops: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)


def hostile_corpus(
    rng: np.random.Generator, n: int, prefix: str, *, frame_faults: bool = False
) -> tuple[list[list[bytes]], Ledger]:
    """n messages as [topic, payload] frame lists (a few malformed at frame level when frame_faults), and
    the exact ledger they must produce. Samples on known channels carry strictly increasing times."""
    dev, other = f"{prefix}/dev".encode(), f"{prefix}/other".encode()
    t = [1000.0]

    def tick(k: int = 1) -> list[float]:
        out = [round(t[0] + 0.01 * j, 2) for j in range(k)]
        t[0] = round(t[0] + 0.01 * k, 2)
        return out

    def js(obj: Any) -> bytes:
        import json

        return json.dumps(obj).encode()

    # each maker: () -> (frames, drops, decoded, accepted, unknown pushes)
    def good() -> Any:
        return [dev, js({"t": tick()[0], "x": float(rng.normal()), "y": float(rng.normal())})], {}, 2, 2, 0

    def good_chunk_bytes() -> Any:
        ts = np.array(tick(4))
        p = msgpack.packb({"t": ts.tobytes(), "channels": {"x": rng.normal(size=4).tobytes()}})
        return [dev, p], {}, 4, 4, 0

    def good_compact() -> Any:
        p = js({"t0": tick(3)[0], "dt": 0.01, "channels": {"y": [1.0, 2, 3.5]}})
        return [dev, p], {}, 3, 3, 0

    def nan_json() -> Any:
        return [dev, b'{"t": %r, "x": NaN, "y": -Infinity}' % tick()[0]], {}, 2, 0, 0

    def null() -> Any:
        return [dev, js({"t": tick()[0], "x": None})], {}, 1, 0, 0

    def nan_msgpack() -> Any:
        return [dev, msgpack.packb({"t": tick()[0], "x": math.nan, "y": math.inf})], {}, 2, 0, 0

    def extreme_floats() -> Any:
        return [dev, js({"t": tick()[0], "x": 1e308, "y": -1.7e308})], {}, 2, 2, 0

    def overflow_float() -> Any:
        return [dev, b'{"t": %r, "x": 1e400}' % tick()[0]], {}, 1, 0, 0  # reads as inf: non-finite

    def huge_int_json() -> Any:
        return [dev, b'{"t": %r, "x": %s}' % (tick()[0], b"9" * 400)], {"range": 1}, 0, 0, 0

    def big_int_msgpack() -> Any:
        return [dev, msgpack.packb({"t": tick()[0], "x": 2**64 - 1, "y": -(2**63)})], {}, 2, 2, 0

    def huge_time() -> Any:
        return [dev, js({"t": 1e308, "x": 1.0})], {"time": 1}, 0, 0, 0

    def string_time() -> Any:
        return [dev, js({"t": "now", "x": 1.0, "y": 2.0})], {"time": 2}, 0, 0, 0

    def bad_json() -> Any:
        return [dev, js({"t": 1.0, "x": 2.0})[: int(rng.integers(1, 15))]], {"decode": 1}, 0, 0, 0

    def bad_msgpack() -> Any:
        return [dev, b"\xc1" + rng.bytes(int(rng.integers(0, 50)))], {"decode": 1}, 0, 0, 0

    def truncated_msgpack() -> Any:
        return [dev, msgpack.packb({"t": 1.0, "x": 2.0})[:-3]], {"decode": 1}, 0, 0, 0

    def bad_utf8() -> Any:
        return [dev, b'{"x": "\xff\xfe"}'], {"decode": 1}, 0, 0, 0

    def wrong_types() -> Any:
        p = js({"t": tick()[0], "x": "1.5", "y": True, "z": [1], "w": {"a": 1}})
        return [dev, p], {"type": 4}, 0, 0, 0

    def ext_type() -> Any:
        return [dev, msgpack.packb({"t": tick()[0], "x": msgpack.ExtType(5, b"ab")})], {"type": 1}, 0, 0, 0

    def int_key() -> Any:
        return [dev, msgpack.packb({1: 1.0, "t": 5.0})], {"key": 1}, 0, 0, 0

    def top_array() -> Any:
        return [dev, b"[1, 2, 3]"], {"schema": 1}, 0, 0, 0

    def top_msgpack_array() -> Any:
        return [dev, msgpack.packb([1.0, 2.0])], {"schema": 1}, 0, 0, 0

    def top_bool() -> Any:
        return [dev, b"true"], {"schema": 1}, 0, 0, 0

    def empty() -> Any:
        return [dev, b""], {"empty": 1}, 0, 0, 0

    def empty_object() -> Any:
        return [dev, b"{}"], {"empty": 1}, 0, 0, 0

    def oversize() -> Any:
        return [dev, js({"x": "a" * int(rng.integers(4100, 6000))})], {"oversize": 1}, 0, 0, 0

    def deep_nesting() -> Any:
        return [dev, b'{"a":' * 800], {"decode": 1}, 0, 0, 0

    def chunk_no_timing() -> Any:
        return [dev, js({"channels": {"x": [1, 2, 3]}})], {"schema": 3}, 0, 0, 0

    def chunk_channels_list() -> Any:
        return [dev, js({"t": [1.0], "channels": [1, 2]})], {"schema": 1}, 0, 0, 0

    def chunk_mismatch() -> Any:
        return [dev, js({"t": tick(2), "channels": {"x": [1, 2, 3]}})], {"length": 3}, 0, 0, 0

    def chunk_bad_dt() -> Any:
        return [dev, js({"t0": 1.0, "dt": 0, "channels": {"x": [1.0]}})], {"schema": 1}, 0, 0, 0

    def chunk_extra_key() -> Any:
        return [dev, js({"t": tick(), "channels": {"x": [0.5]}, "junk": 1})], {"schema": 1}, 1, 1, 0

    def chunk_mixed() -> Any:
        p = js({"t": tick(4), "channels": {"y": [1.0, "a", None, False]}})
        return [dev, p], {"type": 2}, 2, 1, 0  # None reads as NaN: handed, then rejected as non-finite

    def too_many() -> Any:
        return (
            [dev, js({"t0": tick()[0], "dt": 1e-3, "channels": {"x": [0.0] * 300}})],
            {"too_many_samples": 300},
            0,
            0,
            0,
        )

    def unknown_channel() -> Any:
        return [other, js({"t": tick()[0], "x": 1.0})], {}, 1, 0, 1

    def bare_number() -> Any:
        return [dev, b"%r" % float(rng.normal())], {}, 1, 0, 1  # channel dev.value is unknown to the engine

    def missing_level() -> Any:
        return [prefix.encode(), js({"x": 1.0})], {"template": 1}, 0, 0, 0

    def bad_seq() -> Any:
        return [dev, js({"seq": "one", "t": tick()[0], "x": 1.0})], {"schema": 1}, 1, 1, 0

    def three_frames() -> Any:
        return [dev, b"1.0", b"extra"], {"frames": 1}, 0, 0, 0

    def bad_topic() -> Any:
        return [b"\xff" + dev, b"1.0"], {"topic": 1}, 0, 0, 0

    makers = [v for k, v in sorted(locals().items()) if callable(v) and k not in ("tick", "js")]
    if not frame_faults:
        makers = [m for m in makers if m not in (three_frames, bad_topic)]
    picks = rng.integers(0, len(makers), size=n)
    picks[: len(makers)] = np.arange(len(makers))  # every kind at least once
    corpus: list[list[bytes]] = []
    ledger = Ledger()
    for k in picks:
        maker = makers[int(k)]
        frames, drops, decoded, accepted, unknown = maker()
        corpus.append(frames)
        ledger.messages += 1
        ledger.decoded += decoded
        ledger.accepted += accepted
        ledger.unknown_samples += unknown
        ledger.drops.update(drops)
        ledger.kinds[maker.__name__] += 1
    return corpus, ledger


_ESTIMATOR: list[Any] = []


def small_engine(**config: Any) -> Any:
    """A small real Engine (64-sample windows at 10 Hz) sharing one estimator per process, so the null
    calibration (cached per estimator) runs once; a 5% false-alarm rate keeps that calibration short."""
    from streamcorr import Engine, EngineConfig
    from streamcorr.estimate.estimator import Estimator

    if not _ESTIMATOR:
        _ESTIMATOR.append(Estimator())
    cfg = EngineConfig(**({"window_len": 64, "hop_samples": 32, "rate_hz": 10, "false_alarm_rate": 0.05} | config))
    return Engine(cfg, estimator=_ESTIMATOR[0])


async def until(pred: Callable[[], bool], timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not pred():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.01)


async def stop(task: asyncio.Task[None]) -> None:
    assert not task.done(), "run() returned or raised while it should be running"
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def http_metrics(port: int) -> str:
    """The /metrics body of a daemon on 127.0.0.1:port; empty while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return str(r.read().decode())
    except OSError:
        return ""


def metric_sum(text: str, prefix: str) -> float:
    """Sum of the series whose line starts with prefix (name and the start of its labels)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def pearson_blind_rig(seconds: int, seed: int = 0, rate_hz: float = 10.0) -> tuple[np.ndarray, np.ndarray]:
    """(t (n,), values (3, n)) for channels a, b, c: b becomes a^2 + noise half way (Pearson-blind); c stays
    independent noise."""
    rng = np.random.default_rng(seed)
    n = int(seconds * rate_hz)
    t = 1_700_000_000.0 + np.arange(n) / rate_hz
    a, noise, c = rng.standard_normal((3, n))
    b = np.where(np.arange(n) < n // 2, noise, a**2 + 0.1 * noise)
    return t, np.stack([a, b, c])
