"""What a new user reads must be right: example comments, log lines for bad payloads, the demo's rates, the
README's subscriber snippet (issue 10, classes 16 and 17)."""

from __future__ import annotations

import logging
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import yaml

from streamcorr.config import parse_config
from streamcorr.demo import RecentRate
from streamcorr.engine.changes import calibration_eta_s
from streamcorr.engine.settings import EngineConfig
from streamcorr.errors import ConfigError
from streamcorr.ingest.payload import PayloadDecoder

REPO = Path(__file__).resolve().parents[1]
FEED = re.compile(r"#\s+(mosquitto_pub .+?)\s+->\s+(.+)$")


def test_example_config_comments_name_the_channels_the_daemon_makes():
    """Every `mosquitto_pub ... -> channels` line in examples/*.yaml gives exactly those channel names when its
    payload is decoded with that file's source settings."""
    checked = 0
    for path in sorted((REPO / "examples").glob("*.yaml")):
        text = path.read_text()
        cfg = parse_config(yaml.safe_load(text))
        src = cfg.sources[0]
        decoder = PayloadDecoder(channel_template=src.channel_template, format=src.format)
        for line in text.splitlines():
            m = FEED.search(line)
            if not m:
                continue
            argv = shlex.split(m.group(1))
            topic, payload = argv[argv.index("-t") + 1], argv[argv.index("-m") + 1]
            got = {b.channel for b in decoder.decode(topic, payload.encode(), 1_700_000_000.0)}
            assert got == {c.strip() for c in m.group(2).split(",")}, (path.name, line, got)
            checked += 1
    assert checked >= 3


def test_an_undecodable_payload_is_logged_in_words_a_user_can_act_on(caplog):
    """`hello` on a source topic is logged as not JSON, msgpack or a number, with the payload's start, not as
    msgpack's ExtraData."""
    decoder = PayloadDecoder()
    with caplog.at_level(logging.WARNING, logger="streamcorr.ingest"):
        assert decoder.decode("sensors/dev1", b"hello", 0.0) == []
    text = caplog.text
    assert "not JSON, msgpack or a bare number" in text and "b'hello'" in text
    assert "ExtraData" not in text and "unpack" not in text
    assert decoder.counters.drops == {"decode": 1}


def test_demo_rate_is_recent_not_an_average_since_start():
    """After a slow start (the first window, the model's warm-up) a steady pair rate reads as itself at once,
    where an average since the start would still climb."""
    rate = RecentRate(window_s=10.0)
    total, t, readings = 0, 0.0, []
    for step in range(60):  # 30 s of nothing, then 170 pairs/s, read every second
        t = float(step)
        total += 0 if step < 30 else 170
        readings.append(rate.update(total, now=t))
    assert abs(readings[-1] - 170) < 1e-9
    assert total / t < 100  # the since-start average the demo showed before


def test_readme_subscriber_snippet_waits_longer_than_a_cold_first_snapshot():
    """The README's `iter_snapshots(timeout_s=...)` outlasts the documented first snapshot of examples/mqtt.yaml:
    one window plus, on the first start, the null calibration."""
    readme = (REPO / "README.md").read_text()
    timeout_s = float(re.search(r"iter_snapshots\(timeout_s=(\d+)", readme).group(1))
    ec = EngineConfig.from_config(parse_config(yaml.safe_load((REPO / "examples" / "mqtt.yaml").read_text())))
    cold_s = ec.window_len / ec.rate_hz + 1 + calibration_eta_s(ec.window_len)
    assert timeout_s > cold_s, (timeout_s, cold_s)
    assert "snap.origin" in readme  # and the snippet shows how a stale retained snapshot is told apart


def test_common_windows_start_without_measuring_a_calibration(tmp_path, monkeypatch):
    """The null calibrations shipped for windows 256-2048 match the shipped weights (v1 and v2), and a first start
    with an empty cache takes them instead of measuring (nothing is written to the cache)."""
    from streamcorr.engine import changes
    from streamcorr.estimate.estimator import Estimator
    from streamcorr.estimate.weights import SHIPPED_WEIGHTS

    shipped = sorted(changes.SHIPPED_NULL_DIR.glob("*.json"))
    fingerprints = {Estimator(name, device="cpu").fingerprint for name in SHIPPED_WEIGHTS}
    assert {p.name.split("-")[1] for p in shipped} == {f.split("-")[0] for f in fingerprints}, "recompute them"
    monkeypatch.setenv("STREAMCORR_CACHE_DIR", str(tmp_path / "cache"))
    for name in SHIPPED_WEIGHTS:
        est = Estimator(name, device="cpu")
        prefix = f"nulltable-{est.fingerprint}-"  # the fingerprint ends "-jitter": split after it
        windows = {p.name.removeprefix(prefix).removesuffix(".json") for p in shipped if p.name.startswith(prefix)}
        assert windows >= {"256", "512", "1024", "2048"}, name
        monkeypatch.setattr(changes, "_TABLES", {})
        table = changes.cached_calibration(est.fingerprint, est.estimate_batch, 256, est.ties)
        assert table.window_len == 256 and table.n_windows >= 6000
    assert not (tmp_path / "cache").exists()


def test_an_mqtt_source_that_would_read_the_daemons_own_output_is_a_config_error():
    """A source subscribed (on the output's broker) to a filter that matches the MQTT output's topics would ingest
    the daemon's own snapshots and events: parse_config says which filter and topic, and how to fix it; the same
    filter on another broker, or an output prefix outside the filters, is fine."""
    np.random.default_rng(97)
    base = {"version": 1, "outputs": {"mqtt": {"prefix": "plant/streamcorr"}}}
    for filt in ("#", "plant/#", "plant/+/event", "+/streamcorr/status"):
        with pytest.raises(ConfigError, match=re.escape(f"sources.0.topics: '{filt}' matches the MQTT output's topic")):
            parse_config(base | {"sources": [{"type": "mqtt", "topics": [filt]}]})
    parse_config(base | {"sources": [{"type": "mqtt", "topics": ["plant/sensors/#", "streamcorr/#"]}]})
    parse_config(base | {"sources": [{"type": "mqtt", "topics": ["#"], "port": 1884}]})
    with pytest.raises(ConfigError, match="matches the MQTT output's topic"):  # the same broker by another name
        parse_config(base | {"sources": [{"type": "mqtt", "topics": ["#"], "host": "LocalHost"}]})
