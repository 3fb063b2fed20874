"""Shared fixtures: the real Mosquitto broker on 127.0.0.1:1883 (skipped, visibly, where none answers, except in CI)."""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import tempfile

import pytest

BROKER = ("127.0.0.1", 1883)

# The network's ahead-of-time package (streamcorr.estimate.aot) is built once per machine in a background process; a
# test run would start that 30-s build beside timing-sensitive tests. Tests run the eager network (results agree within
# 1e-5 nats); tests/test_aot.py builds and checks the package itself. Daemons started by tests inherit this.
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
