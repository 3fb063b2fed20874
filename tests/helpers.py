"""Helpers shared by several test modules: snapshot and event builders, MQTT connection settings, polling, the
documentation pages, and a `streamcorr run` subprocess probed over HTTP. Shared fixtures live in conftest.py."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import yaml

from streamcorr.config import MqttConnection
from streamcorr.engine.changes import ChangeEvent
from streamcorr.engine.matrix import Snapshot

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
USER_DOCS = [
    README,
    *sorted((REPO / "docs").rglob("*.md")),
    REPO / "models" / "README.md",
    REPO / "bench" / "README.md",
]


ANY_PORT = "tcp://127.0.0.1:*"


def make_snapshot(rng: np.random.Generator, n: int = 4, seq: int = 1) -> Snapshot:
    mi = rng.gamma(1.0, 0.3, (n, n))
    mi = (mi + mi.T) / 2
    np.fill_diagonal(mi, np.nan)
    age = rng.uniform(0, 5, (n, n))
    age[0, -1] = age[-1, 0] = np.inf
    return Snapshot(seq, seq * 10**9, time.time_ns(), tuple(f"ch{k}" for k in range(n)), mi, age, np.ones((n, n)))


def make_event(rng: np.random.Generator, k: int = 0) -> ChangeEvent:
    return ChangeEvent(("ch0", "ch1"), float(rng.random()), float(rng.random()) + 1, k, "rise")


def connection(broker: tuple[str, int], **settings: Any) -> MqttConnection:
    """The connection settings for a (host, port) broker fixture."""
    return MqttConnection(host=broker[0], port=broker[1], **settings)


async def until(predicate, timeout_s: float = 5.0, poll_s: float = 0.01) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(poll_s)


def hooks() -> ModuleType:
    """docs/hooks.py, the generator the site's build runs, imported by path."""
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("docs_hooks", module)
    spec.loader.exec_module(module)
    return module


@contextmanager
def daemon_process(tmp_path: Path, cfg: dict[str, Any], env: dict[str, str] | None = None) -> Iterator[Any]:
    """A `streamcorr run` subprocess (stderr to a file); killed on exit if still running."""
    path = tmp_path / f"cfg-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    log = (tmp_path / "daemon.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamcorr", "run", str(path)],
        stderr=log, stdout=log, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )  # fmt: skip
    proc.log_path = tmp_path / "daemon.log"  # type: ignore[attr-defined]
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def http_get(url: str, timeout_s: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    code, text = http_get(f"http://127.0.0.1:{port}{path}")
    return code, json.loads(text)


def wait_for(cond: Any, what: str, proc: Any, timeout_s: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            got = cond()
        except OSError:
            got = None
        if got:
            return got
        assert proc.poll() is None, f"daemon exited: {proc.log_path.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {proc.log_path.read_text()[-3000:]}"
        time.sleep(0.2)


def metric(text: str, series: str) -> float:
    """The value of one series (name plus labels, exactly as exposed) in a /metrics text."""
    for line in text.splitlines():
        if line.rsplit(" ", 1)[0] == series:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{series} not in /metrics")


def zmq_fed_daemon(names: list[str], rate_hz: float, **sections: Any) -> tuple[dict[str, Any], Any, Any]:
    """A `streamcorr run` config with a bound ZeroMQ PULL source and a ZeroMQ output (and its late-joiner cache) on
    free ports (window 256, 1-s hops, no skipped hops; ``sections`` override or add config sections), a PUSH socket
    connected to its input and a SUB socket subscribed to its snapshots."""
    import zmq

    from tests.brokers import free_port

    p_in, p_out, p_latest = free_port(), free_port(), free_port()
    cfg = {
        "version": 1,
        "sources": [{"type": "zmq", "endpoint": f"tcp://127.0.0.1:{p_in}", "mode": "pull", "bind": True,
                     "channel_template": "{key}"}],
        "channels": {"names": names, "rate_hz": rate_hz},
        "window": {"samples": 256, "hop_s": 1.0, "skip_stale_hops": False},
        "outputs": {"zmq": {"endpoint": f"tcp://127.0.0.1:{p_out}", "snapshot_endpoint": f"tcp://127.0.0.1:{p_latest}"}},
        "http": {"port": 0},
        "logging": {"format": "text"},
    } | sections  # fmt: skip
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"streamcorr/snapshot")
    sub.connect(f"tcp://127.0.0.1:{p_out}")
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(f"tcp://127.0.0.1:{p_in}")
    return cfg, push, sub
