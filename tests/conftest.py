"""Shared fixtures: the real Mosquitto broker on 127.0.0.1:1883 (skipped, visibly, where none answers, except in CI),
a topic prefix per test, a private Mosquitto a test may stop and restart, and a headless Chromium."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.brokers import free_port

BROKER = ("127.0.0.1", 1883)

# The network's ahead-of-time package (streamcorr.estimate.aot) is built once per machine in a background process; a
# test run would start that 30-s build beside timing-sensitive tests. Tests run the eager network (results agree within
# 1e-5 nats); tests/estimate/test_aot.py builds and checks the package itself. Daemons started by tests inherit this.
os.environ.setdefault("STREAMCORR_AOT", "0")

# Calibrations the suite measures go to a cache of this run (hermetic: nothing read from or written to the user's
# ~/.cache); shipped tables still load from the package. Daemons started by tests inherit it.
if "STREAMCORR_CACHE_DIR" not in os.environ:
    _RUN_CACHE = tempfile.mkdtemp(prefix="streamcorr-test-cache-")
    os.environ["STREAMCORR_CACHE_DIR"] = _RUN_CACHE
    atexit.register(shutil.rmtree, _RUN_CACHE, True)


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def mqtt_broker() -> tuple[str, int]:
    """(host, port) of a live Mosquitto; skip with the reason where none answers, fail under CI=true."""
    if not port_open(*BROKER):
        msg = f"no MQTT broker on {BROKER[0]}:{BROKER[1]} (start: mosquitto -d -c /etc/mosquitto/mosquitto.conf)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return BROKER


@pytest.fixture
def prefix(mqtt_broker):
    """A topic prefix of this test alone; its retained messages are cleared afterwards."""
    name = f"streamcorr-test/{uuid.uuid4().hex[:10]}"
    yield name
    for stream in ("snapshot", "pairs", "status"):
        subprocess.run(["mosquitto_pub", "-h", mqtt_broker[0], "-p", str(mqtt_broker[1]), "-t", f"{name}/{stream}",
                        "-r", "-n"], check=False, timeout=10)  # fmt: skip


@pytest.fixture
def private_broker():
    """A Mosquitto of this test alone (local-only on a free port), so that it can be stopped and restarted."""
    if shutil.which("mosquitto") is None:
        msg = "no mosquitto binary to start a private broker"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    port = free_port()
    procs: list[subprocess.Popen] = []

    def start() -> None:
        procs.append(subprocess.Popen(["mosquitto", "-p", str(port)], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))  # fmt: skip
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
            time.sleep(0.02)
        raise AssertionError("private mosquitto did not start")

    def stop() -> None:
        procs[-1].terminate()
        procs[-1].wait(5)

    start()
    yield port, start, stop
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


CHROMIUM = "/usr/bin/chromium"


@pytest.fixture
def chromium() -> Iterator[Any]:
    """A headless Debian Chromium driven by playwright; skip with the reason where missing, fail under CI=true."""
    reason = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        reason = "the playwright Python package is not installed (pip install playwright)"
    executable = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    if reason is None and executable is None:
        reason = f"no Chromium at {CHROMIUM} or on PATH (apt-get install chromium; playwright install is not needed)"
    if reason is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    with sync_playwright() as pw:
        # playwright passes --no-sandbox by default (chromium_sandbox=False), which Chromium needs as root
        browser = pw.chromium.launch(executable_path=executable, headless=True)
        try:
            yield browser
        finally:
            browser.close()
