"""The runnable examples: each demonstrates what it claims, end to end over real sockets and a real broker."""

from __future__ import annotations

import doctest
import importlib.util
import re
import socket
import sys
import uuid
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from tests.brokers import free_port

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _load(name: str) -> ModuleType:
    """examples/ is not a package: load the script as a module."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(module)
    return module


def _pairs_under(heading: str, out: str) -> list[tuple[str, str]]:
    """The (a, b) pairs printed in the list that follows a heading line."""
    section = out.split(heading, 1)[1].split(":\n", 1)[1]
    lines = re.match(r"(?:\s+\S+ ~ \S+\s+[\d.]+ nats\n)*", section)
    assert lines is not None
    return re.findall(r"(\S+) ~ (\S+)", lines.group(0))


def _events(out: str) -> list[tuple[str, str, str]]:
    """(kind, a, b) of every change-event line printed."""
    return re.findall(r"^\s+t=\s*[\d.-]+ s\s+(\S+)\s+(\S+) ~ (\S+):", out, flags=re.MULTILINE)


@pytest.mark.parametrize("name", ["robot_imu_zmq", "iot_mqtt", "react_to_events"])
def test_example_doctests_pass(name):
    """The simulators' and helpers' docstring examples run and hold."""
    np.random.default_rng(0)  # the doctests seed their own generators
    module = _load(name)
    failures, tried = doctest.testmod(module, verbose=False)
    assert tried > 0 and failures == 0


def test_robot_imu_example_detects_the_clamp_break(capsys):
    """The robot example sees the tool's gyro decouple after the break, and the rigid and centripetal couplings
    stay among the strongest pairs; it exits 0."""
    seed = int(np.random.default_rng(10).integers(0, 1000))
    robot = _load("robot_imu_zmq")
    rc = robot.main(["--seconds", "30", "--speed", "8", "--seed", str(seed)])
    out = capsys.readouterr().out
    assert rc == 0, out
    events = _events(out)
    assert any(k == "became-independent" and (a, b) in robot.BROKEN_PAIRS for k, a, b in events), out
    top = _pairs_under("strongest pairs of the latest snapshot", out)
    assert robot.RIGID_PAIR in top and robot.CENTRIPETAL_PAIR in top, out
    assert not any(("tool" in a) != ("tool" in b) for a, b in top[:5]), out  # the loose tool follows nothing else
    assert "0 dropped, 0 lost" in out, out


def test_iot_mqtt_example_finds_the_fan_failure_and_the_common_cause(mqtt_broker, capsys):
    """Through Mosquitto, the IoT example reports lab-2's fan decoupling from its temperature and the two lab
    devices' shared heater; it exits 0."""
    host, port = mqtt_broker
    seed = int(np.random.default_rng(11).integers(0, 1000))
    iot = _load("iot_mqtt")
    site = f"site-{uuid.uuid4().hex[:8]}"  # private topics: other tests may use the same broker
    argv = [
        "--host",
        host,
        "--port",
        str(port),
        "--site",
        site,
        "--seconds",
        "400",
        "--fail-at",
        "150",
        "--speed",
        "80",
    ]
    rc = iot.main([*argv, "--seed", str(seed)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert ("became-independent", *iot.FAN_PAIR) in _events(out), out
    # about one window after the failure (device seconds, not wall time): not the 159 s of 128-sample windows
    # with skipped hops (issue 10)
    delay_s = float(re.search(r"fan failure was detected (\d+) s after", out).group(1))
    assert delay_s <= 90, out
    cross = _pairs_under("strongest pairs across devices", out)
    assert iot.COMMON_CAUSE_PAIR in cross, out
    assert all({a.split(".")[0], b.split(".")[0]} == {"lab-1", "lab-2"} for a, b in cross), out  # only the heater
    assert "0 dropped, 0 lost" in out, out


def test_iot_mqtt_example_without_a_broker_says_so_and_exits_2(capsys):
    """With nothing listening on the port, the IoT example tells the user to start Mosquitto and exits 2."""
    np.random.default_rng(12)  # nothing random here; seeded by convention
    iot = _load("iot_mqtt")
    assert iot.main(["--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert "No MQTT broker answers" in err and "Mosquitto" in err


def test_react_example_raises_one_alert_and_one_all_clear(capsys):
    """The watcher alerts once when the bearing damage couples vibration to load and clears once after the
    repair; it exits 0."""
    seed = int(np.random.default_rng(13).integers(0, 1000))
    react = _load("react_to_events")
    rc = react.main(["--phase", "35", "--speed", "30", "--seed", str(seed)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.count("ALERT ") == 1 and out.count("RESOLVED ") == 1, out
    assert out.index("ALERT ") < out.index("RESOLVED "), out


@pytest.mark.parametrize(
    ("name", "argv"),
    [
        ("robot_imu_zmq", ["--speed", "0"]),
        ("robot_imu_zmq", ["--seconds", "12"]),
        ("iot_mqtt", ["--site", "a/b"]),
        ("react_to_events", ["--phase", "5"]),
    ],
)
def test_examples_reject_bad_options_with_usage_errors(name, argv, capsys):
    """Options the simulation cannot honour end with argparse's usage error (exit 2) naming the fix."""
    np.random.default_rng(14)  # nothing random here; seeded by convention
    with pytest.raises(SystemExit) as exc:
        _load(name).main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "need" in err or "--site must" in err


def test_robot_imu_example_refuses_a_port_in_use(capsys):
    """An explicit port that something already listens on is a usage error, before any model is loaded."""
    np.random.default_rng(15)  # nothing random here; seeded by convention
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(SystemExit) as exc:
            _load("robot_imu_zmq").main(["--port", str(busy.getsockname()[1])])
    assert exc.value.code == 2
    assert "in use" in capsys.readouterr().err
