"""Start-up notices: which null calibration a daemon uses (shipped, cached or measured), and "measuring" said
only when it measures (issue 29: every start claimed a 16 s measurement while it read the shipped file)."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest
import yaml

import streamcorr.daemon.service as daemon_module
import streamcorr.engine.changes as changes
from streamcorr.config import parse_config
from streamcorr.daemon.service import Daemon
from streamcorr.estimate.estimator import default_estimator
from tests.brokers import free_port


async def _start_and_stop(cfg: Any, details: list[str], timeout_s: float) -> None:
    """Run a daemon until it is running (noting each phase detail on the way), then stop it."""
    d = Daemon(cfg, estimator=default_estimator())
    run = asyncio.create_task(d.run(install_signals=False))
    deadline = time.monotonic() + timeout_s
    while d.phase != "running":
        assert time.monotonic() < deadline and not run.done(), d.phase_detail
        details.append(d.phase_detail)
        await asyncio.sleep(0.1)
    d.stop()
    await asyncio.wait_for(run, 30)


def test_calibration_origin_names_the_shipped_file_and_a_window_that_needs_measuring(tmp_path, monkeypatch, caplog):
    """With an empty cache, window 256 of the shipped weights comes from the shipped file (and the log line says
    so, with its path); a window nothing ships is "measure"; a table loaded once is "loaded"."""
    np.random.default_rng(0)  # nothing random here; seeded by convention
    monkeypatch.setenv("STREAMCORR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(changes, "_TABLES", {})
    est = default_estimator()
    assert changes.calibration_origin(est.fingerprint, 256) == "shipped"
    assert changes.calibration_origin(est.fingerprint, 100) == "measure"
    with caplog.at_level(logging.INFO, logger="streamcorr.engine.changes"):
        changes.cached_calibration(est.fingerprint, est.estimate_batch, 256, est.ties)
    (line,) = [r.getMessage() for r in caplog.records if "null calibration" in r.getMessage()]
    assert "window.samples=256: shipped" in line and str(changes.SHIPPED_NULL_DIR) in line, line
    assert changes.calibration_origin(est.fingerprint, 256) == "loaded"


def test_a_slow_start_with_the_shipped_calibration_never_says_measuring(tmp_path, monkeypatch, caplog):
    """A daemon whose engine takes seconds to build (a slow CPU loading the model) with window 256, whose null
    table is shipped: no "measuring" line in the log and never on /healthz; the shipped file is named instead."""
    np.random.default_rng(1)  # nothing random here; seeded by convention
    monkeypatch.setenv("STREAMCORR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(changes, "_TABLES", {})
    real_engine = daemon_module.Engine

    def slow_engine(*args: Any, **kwargs: Any) -> Any:
        time.sleep(3.0)  # longer than the 2 s after which the daemon says what it is waiting for
        return real_engine(*args, **kwargs)

    monkeypatch.setattr(daemon_module, "Engine", slow_engine)
    src = {"type": "zmq", "endpoint": f"tcp://127.0.0.1:{free_port()}", "mode": "pull", "bind": True}
    cfg = parse_config({"version": 1, "sources": [src], "channels": {"names": ["a", "b"], "rate_hz": 10.0},
                        "window": {"samples": 256, "hop_samples": 32}, "http": {"port": free_port()}})  # fmt: skip
    details: list[str] = []
    with caplog.at_level(logging.INFO):
        asyncio.run(_start_and_stop(cfg, details, timeout_s=60))
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "measuring" not in text and not any("measuring" in s for s in details), text
    assert "null calibration for window.samples=256: shipped" in text, text


@pytest.mark.slow  # measures a null table (window 96, 3,000 pairs): 10-60 s on 2 cores
def test_a_first_start_at_an_unshipped_window_says_measuring_and_then_measured(tmp_path, monkeypatch, caplog):
    """Window 96 (nothing shipped, empty cache): the daemon says it is measuring, /healthz's detail says so, and
    the calibration's line says "measured"; the next start's line says "cached"."""
    np.random.default_rng(2)  # nothing random here; seeded by convention
    monkeypatch.setenv("STREAMCORR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(changes, "_TABLES", {})
    src = {"type": "zmq", "endpoint": f"tcp://127.0.0.1:{free_port()}", "mode": "pull", "bind": True}
    cfg = parse_config({"version": 1, "sources": [src], "channels": {"names": ["a", "b"], "rate_hz": 10.0},
                        "window": {"samples": 96, "hop_samples": 8}, "http": {"port": free_port()}})  # fmt: skip

    details: list[str] = []
    with caplog.at_level(logging.INFO):
        asyncio.run(_start_and_stop(cfg, details, timeout_s=120))
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "measuring the change detector's null calibration" in text, text
    assert "null calibration for window.samples=96: measured" in text, text
    caplog.clear()
    monkeypatch.setattr(changes, "_TABLES", {})  # a new process: the table comes from the user's cache
    with caplog.at_level(logging.INFO):
        asyncio.run(_start_and_stop(cfg, [], timeout_s=120))
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "null calibration for window.samples=96: cached" in text and "measuring" not in text, text


def test_the_process_exits_within_a_second_of_saying_stopped(tmp_path):
    """`streamcorr run` stopped by SIGTERM logs "stopped" and the process is gone within a second."""
    cfg = {"version": 1, "sources": [{"type": "zmq", "endpoint": "tcp://127.0.0.1:0", "bind": True}],
           "channels": {"rate_hz": 50, "names": ["a", "b"]}, "window": {"samples": 128},
           "http": {"port": 0}}  # fmt: skip
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen([sys.executable, "-m", "streamcorr", "run", str(path)], stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if '"msg": "running:' in line:
                break
        proc.send_signal(signal.SIGTERM)
        stopped = next(json.loads(line)["t"] for line in proc.stderr if '"msg": "stopped"' in line)
        proc.wait(timeout=30)
        assert time.time() - stopped < 1.0
        assert proc.returncode == 0
    finally:
        proc.kill()
