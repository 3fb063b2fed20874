from pathlib import Path

import pytest
import yaml

from streamcorr.cli.commands import main
from streamcorr.config import load_config, parse_config
from streamcorr.engine.settings import EngineConfig
from streamcorr.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
MINIMAL = {"version": 1, "sources": [{"type": "zmq", "endpoint": "tcp://127.0.0.1:5555"}]}


@pytest.mark.parametrize("name", ["mqtt.yaml", "zmq.yaml"])
def test_example_configs_are_valid(name):
    """Every shipped example config validates and maps onto an engine configuration."""
    cfg = load_config(EXAMPLES / name)
    ec = EngineConfig.from_config(cfg)
    assert ec.window_len == cfg.window.samples and ec.hop_samples >= 1


def test_defaults_listen_on_loopback():
    """Without explicit hosts, every listener binds to 127.0.0.1."""
    cfg = parse_config({**MINIMAL, "outputs": {"zmq": {}}})
    assert cfg.http.host == "127.0.0.1"
    assert cfg.outputs.zmq is not None and "127.0.0.1" in cfg.outputs.zmq.endpoint


@pytest.mark.parametrize(
    ("patch", "expect"),
    [
        ({"sources": [{"type": "mqtt", "topics": ["a/#"], "port": 70000}]}, "sources.0.port"),
        (
            {"sources": [{"type": "mqtt", "topics": ["a/#"], "prot": 1}]},
            "sources.0.prot: unknown key: did you mean 'port'",
        ),
        (
            {"changes": {"false_alarm_per_hour": 2}},
            "changes.false_alarm_per_hour: unknown key: did you mean 'false_alarms_per",
        ),
        ({"outputs": {"mqtt": {"prefx": "a"}}}, "outputs.mqtt.prefx: unknown key: did you mean 'prefix'"),
        ({"lagz": {}}, "lagz: unknown key: did you mean 'lags'"),
        ({"estimator": {"qqqqqq": 1}}, "estimator.qqqqqq: unknown key: remove it or check its spelling"),
        ({"sources": [{"type": "kafka"}]}, "'type' must be 'mqtt' or 'zmq'"),
        ({"window": {"samples": 10}}, "window.samples"),
        ({"window": {"hop_s": 1, "hop_samples": 10}}, "not both"),
        ({"pairs": {"mode": "list"}}, "non-empty 'pairs'"),
        ({"version": 2}, "reads version 1"),
        ({"estimator": {"device": "tpu"}}, "estimator.device"),
    ],
)
def test_errors_name_the_key_path(patch, expect):
    """A bad value or unknown key is a ConfigError naming its key path and what to do."""
    with pytest.raises(ConfigError, match=expect.replace("(", r"\(")):
        parse_config({**MINIMAL, **patch})


def test_hop_in_seconds_converts_to_samples():
    """hop_s is turned into samples of the common clock; the default is one hop per second."""
    assert parse_config({**MINIMAL, "window": {"hop_s": 0.5}}).hop_samples() == 50
    assert parse_config(MINIMAL).hop_samples() == 100


def test_check_command(tmp_path, capsys, monkeypatch):
    """`streamcorr check` prints a summary for a good file and a keyed error (exit 2) for a bad one."""
    assert main(["check", str(EXAMPLES / "mqtt.yaml")]) == 0
    out = capsys.readouterr().out
    assert "source mqtt" in out and "receive buffer" in out  # fixed or auto-tuned, as this kernel allows
    assert "null calibration" not in out  # a shipped window: nothing to measure at the first start
    odd = tmp_path / "odd.yaml"  # a window no shipped file covers: the first start measures, and check says so
    odd.write_text((EXAMPLES / "mqtt.yaml").read_text() + "\n")
    cfg = yaml.safe_load(odd.read_text())
    cfg.setdefault("window", {})["samples"] = 300
    odd.write_text(yaml.safe_dump(cfg))
    monkeypatch.setenv("STREAMCORR_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["check", str(odd)]) == 0
    assert "measures the change detector's null calibration for window.samples=300" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nsources:\n  - type: zmq\n    endpoint: tcp://127.0.0.1:1\nwindow:\n  sampels: 64\n")
    assert main(["check", str(bad)]) == 2
    assert f"{bad}: window.sampels: unknown key: did you mean 'samples'?" in capsys.readouterr().err
    (tmp_path / "junk.yaml").write_text("version: [1\n")
    assert main(["check", str(tmp_path / "junk.yaml")]) == 2
    assert "not valid YAML" in capsys.readouterr().err
