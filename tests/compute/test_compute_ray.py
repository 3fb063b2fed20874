"""The Ray compute backend against a real local Ray instance (nothing mocked): equality with the local backend,
a worker killed mid-hop, a worker added, tiles late for the deadline, and a daemon whose SIGTERM shuts its Ray
down. One Ray instance serves the module (2 CPUs); the daemon test starts its own, as `streamcorr run` does."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import yaml
import zmq

try:
    import ray
except ImportError:
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip(
        'ray is not installed (pip install -e ".[dev,ray]"): the Ray backend is untested', allow_module_level=True
    )

from streamcorr.cli.commands import main
from streamcorr.compute.ray import RayEvaluator
from streamcorr.config import Compute
from streamcorr.engine.core import Engine, EngineConfig
from streamcorr.errors import ConfigError
from streamcorr.estimate.copula import rank_transform
from streamcorr.estimate.estimator import Estimator
from tests.brokers import free_port, http_metrics, metric_sum

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CHANNELS, WINDOW = 64, 128
TOL = 1e-6  # the same weights, device and code on both sides; tiles only change the model's batch composition


@pytest.fixture(scope="module")
def ray_instance() -> Iterator[None]:
    """One local Ray instance for the module's tests."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def window() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A 64-channel window's copula values (C, T), constant mask, all pairs (iu, iv) and the local backend's MI."""
    rng = np.random.default_rng(140)
    x = rng.standard_normal((CHANNELS, WINDOW))
    x[1] = x[0] + 0.3 * rng.standard_normal(WINDOW)  # some dependence, so cells differ
    x[2] = np.sin(3 * x[0])
    x[5] = 1.0  # a constant channel: MI exactly 0
    u = rank_transform(x)
    constant = x.min(axis=1) == x.max(axis=1)
    iu, iv = np.triu_indices(CHANNELS, 1)
    return u, constant, iu, iv, Estimator().estimate_ranks(u, iu, iv, constant)


@contextlib.contextmanager
def _evaluator(**settings: Any) -> Iterator[RayEvaluator]:
    base: dict[str, Any] = {"backend": "ray", "workers": 2, "cpus_per_worker": 0.5, "tile_pairs": 128,
                            "hop_timeout_s": 120.0, "start_timeout_s": 120.0}  # fmt: skip
    ev = RayEvaluator(Compute(**(base | settings)), {}, hop_s=1.0)
    ev.start()
    try:
        yield ev
    finally:
        ev.close()


def _hop_until(ev: RayEvaluator, what: str, n: int, window: tuple[Any, ...], timeout_s: float = 60.0) -> None:
    u, constant, iu, iv, _ = window
    deadline = time.monotonic() + timeout_s
    while ev.counters()[what] < n:
        assert time.monotonic() < deadline, f"{what} never reached {n}: {ev.counters()}"
        ev.estimate(u, iu[:64], iv[:64], constant)
        time.sleep(0.2)


def test_ray_equals_local_on_a_64_channel_window(ray_instance, window):
    """All 2,016 pairs of a 64-channel window on 2 workers equal the local backend within 1e-6, the ranks go
    into the object store once, and both workers take tiles."""
    u, constant, iu, iv, ref = window
    with _evaluator() as ev:
        mi = ev.estimate(u, iu, iv, constant)
        c = ev.counters()
        by_worker = ev.tiles_by_worker()
    assert np.abs(mi - ref).max() <= TOL
    assert mi[(iu == 5) | (iv == 5)].max() == 0.0
    assert c["pairs_done"] == len(iu) and c["cells_stale"] == 0 and c["tiles"] == 16
    assert c["object_store_bytes"] == u.nbytes + constant.nbytes
    assert len(by_worker) == 2 and min(by_worker.values()) > 0


def test_a_worker_killed_mid_hop_is_retried_and_replaced(ray_instance, window):
    """ray.kill on a worker while its tiles run: the hop still returns every cell equal to local (its tiles are
    retried on the other worker), the loss is counted, and the replacement takes tiles from a later hop."""
    u, constant, iu, iv, ref = window
    with _evaluator() as ev:
        victim = ev.worker_handles()[0]
        out: dict[str, np.ndarray] = {}
        hop = threading.Thread(target=lambda: out.setdefault("mi", ev.estimate(u, iu, iv, constant)))
        hop.start()
        deadline = time.monotonic() + 30
        while ev.counters()["tiles"] < 4:  # both workers hold tiles
            assert time.monotonic() < deadline
            time.sleep(0.002)
        ray.kill(victim)
        hop.join(timeout=120)
        assert not hop.is_alive()
        c = ev.counters()
        assert np.abs(out["mi"] - ref).max() <= TOL
        assert c["workers_lost"] == 1 and c["tiles_retried"] >= 1 and c["cells_stale"] == 0
        _hop_until(ev, "workers", 2, window)  # the replacement joined
        mi = ev.estimate(u, iu[:512], iv[:512], constant)
        assert np.abs(mi - ref[:512]).max() <= TOL
        assert len(ev.tiles_by_worker()) == 2 and min(ev.tiles_by_worker().values()) > 0


def test_the_only_worker_lost_between_hops_is_replaced_within_the_hop(ray_instance, window):
    """A pool of one whose worker dies between hops: the next hop finds it gone, waits for the replacement
    within its deadline instead of marking every cell stale, and returns values equal to local."""
    u, constant, iu, iv, ref = window
    with _evaluator(workers=1) as ev:
        assert np.abs(ev.estimate(u, iu[:64], iv[:64], constant) - ref[:64]).max() <= TOL
        ray.kill(ev.worker_handles()[0])
        mi = ev.estimate(u, iu[:256], iv[:256], constant)
        c = ev.counters()
    assert np.abs(mi - ref[:256]).max() <= TOL
    assert c["workers_lost"] == 1 and c["workers_joined"] == 2 and c["cells_stale"] == 0


def test_a_worker_added_takes_tiles_from_a_later_hop(ray_instance, window):
    """A pool of one gets a second worker while running; once its model has loaded, it takes tiles too, and
    results stay equal to local."""
    u, constant, iu, iv, ref = window
    with _evaluator(workers=1) as ev:
        assert np.abs(ev.estimate(u, iu[:256], iv[:256], constant) - ref[:256]).max() <= TOL
        ev.add_workers(1)
        _hop_until(ev, "workers", 2, window)
        mi = ev.estimate(u, iu[:512], iv[:512], constant)
        assert ev.counters()["workers_joined"] == 2
        assert sorted(ev.tiles_by_worker().values())[0] > 0
    assert np.abs(mi - ref[:512]).max() <= TOL


def test_late_tiles_leave_cells_stale_with_growing_age(ray_instance):
    """In an engine: a hop whose tiles miss the deadline keeps every cell's previous value and lets its age
    grow (counted stale); in-flight work stays within max_in_flight; the next hop refreshes them, equal to a
    local engine's."""
    rng = np.random.default_rng(141)
    names = [f"c{k}" for k in range(8)]
    cfg = EngineConfig(channels=names, window_len=64, hop_samples=10, rate_hz=10)
    t = np.arange(120) / 10
    x = rng.standard_normal((8, 120))
    x[1] += x[0]
    with _evaluator(workers=1, tile_pairs=4) as ev:
        ray_eng, local = Engine(cfg, compute=ev), Engine(cfg)
        for eng in (ray_eng, local):
            eng.push_frame(t, {n: x[k] for k, n in enumerate(names)})
        ends = [int(6.3e9) + k * int(1e9) for k in range(3)]
        first = ray_eng.evaluate(ends[0])[0]
        assert np.allclose(first.mi, local.evaluate(ends[0])[0].mi, atol=TOL, equal_nan=True)
        ev.hop_timeout_s = 1e-4  # no tile can come back this soon
        second = ray_eng.evaluate(ends[1])[0]
        local.evaluate(ends[1])
        off = ~np.eye(8, dtype=bool)
        assert np.array_equal(second.mi[off], first.mi[off])  # previous values kept ...
        assert np.allclose(second.age_s[off], 1.0)  # ... and one hop older
        c = ev.counters()
        assert c["cells_stale"] == 28 and c["cells_stale_last_hop"] == 28 and c["tiles_late"] >= 1
        assert ev.in_flight() <= 2  # max_in_flight per worker, whatever the deadline left behind
        ev.hop_timeout_s = 120.0
        third = ray_eng.evaluate(ends[2])[0]
        assert np.allclose(third.mi, local.evaluate(ends[2])[0].mi, atol=TOL, equal_nan=True)
        assert np.allclose(third.age_s[off], 0.0) and ev.counters()["cells_stale_last_hop"] == 0


def test_workers_that_cannot_be_placed_fail_the_start_naming_the_fix(ray_instance):
    """Workers asking for a GPU the cluster lacks never become ready: start() gives up after
    compute.start_timeout_s with a ConfigError that names the keys to change, instead of hanging."""
    ev = RayEvaluator(Compute(backend="ray", workers=1, device="cuda", start_timeout_s=2.0), {}, hop_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"compute.start_timeout_s=2 s .*1 GPU.*compute.device: cpu"):
        ev.start()
    assert time.monotonic() - t0 < 30
    assert ev.counters()["workers"] == 0


def test_example_ray_config_checks():
    """examples/ray.yaml is a complete, valid configuration (2 local workers)."""
    assert main(["check", str(EXAMPLES / "ray.yaml")]) == 0
    cfg = yaml.safe_load((EXAMPLES / "ray.yaml").read_text())
    assert cfg["compute"]["backend"] == "ray" and cfg["compute"]["workers"] == 2


def test_daemon_sigterm_shuts_its_ray_down(tmp_path):
    """`streamcorr run` with compute.backend ray starts a local Ray instance, evaluates hops on its worker
    (counted on /metrics), and on SIGTERM exits 0 with that instance shut down (its GCS port closed)."""
    rng = np.random.default_rng(142)
    http_port, p_in = free_port(), free_port()
    names = ["a", "b", "c"]
    cfg = {
        "version": 1,
        "sources": [{"type": "zmq", "endpoint": f"tcp://127.0.0.1:{p_in}", "mode": "pull", "bind": True,
                     "channel_template": "{key}"}],
        "channels": {"names": names, "rate_hz": 10.0},
        "window": {"samples": 64, "hop_samples": 10},
        "compute": {"backend": "ray", "workers": 1, "cpus_per_worker": 0.5, "hop_timeout_s": 30},
        "http": {"port": http_port},
        "logging": {"format": "text"},
    }  # fmt: skip
    path, log = tmp_path / "cfg.yaml", tmp_path / "daemon.log"
    path.write_text(yaml.safe_dump(cfg))
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "streamcorr", "run", str(path)], stdout=out, stderr=out,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while metric_sum(http_metrics(http_port), 'streamcorr_compute_workers{backend="ray"}') < 1:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.3)
        t = np.floor(time.time()) - 10.0 + np.arange(100) / 10
        push = zmq.Context.instance().socket(zmq.PUSH)
        push.connect(f"tcp://127.0.0.1:{p_in}")
        push.send_multipart([b"rig", msgpack.packb({"t": t.tolist(), "channels": {
            n: rng.standard_normal(100).tolist() for n in names}})])  # fmt: skip
        push.close(linger=2000)
        while metric_sum(http_metrics(http_port), 'streamcorr_compute_pairs_done_total{backend="ray"}') < 3:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.3)
        gcs = re.search(r"gcs ([\d.]+):(\d+)\)", log.read_text())
        assert gcs is not None, log.read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "the local instance is shut down" in text, text[-3000:]
    assert "SIGTERM received" not in text  # Ray's own signal handler stays out of the daemon's shutdown
    with pytest.raises(OSError), socket.create_connection((gcs.group(1), int(gcs.group(2))), timeout=2):
        pass
