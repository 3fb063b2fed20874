import json
import os
import subprocess
import sys


def test_paper_gaussian_table_quick(tmp_path):
    """The quick Gaussian sanity table runs end to end (smoke test, not timing) and writes md, json and png."""
    env = os.environ | {"STREAMCORR_BENCH_RESULTS": str(tmp_path)}
    subprocess.run([sys.executable, "-m", "bench.paper", "gaussian", "--quick"], check=True, env=env,
                   capture_output=True, timeout=300)  # fmt: skip
    data = json.loads((tmp_path / "paper_gaussian.json").read_text())
    assert set(data["curves"]) == {"InfoNet", "KSG-5", "MINE-500"}
    assert (tmp_path / "paper_gaussian.png").stat().st_size > 0
    assert "mean abs error" in (tmp_path / "paper_gaussian.md").read_text()


def test_lag_bench_quick(tmp_path):
    """bench.lag --quick runs end to end (smoke test, not timing): its tables name every method and section."""
    env = os.environ | {"STREAMCORR_BENCH_RESULTS": str(tmp_path)}
    subprocess.run([sys.executable, "-m", "bench.lag", "--quick"], check=True, env=env, capture_output=True,
                   timeout=300)  # fmt: skip
    text = next(tmp_path.glob("lag*.md")).read_text()
    for words in ("Pearson cross-correlation", "KSG", "Independent pairs", "drifting lag", "Engine cost"):
        assert words in text, words


def test_live_mqtt_config_parses_and_scoring_matches_events_to_the_script():
    """bench.live_mqtt's daemon config is a valid streamcorr config with the fast path and hop as asked, and its scoring
    takes each expected event's first match after the scripted change, counting misses and stable-pair events."""
    import yaml

    from bench.live_mqtt import config, score
    from streamcorr.config import parse_config
    from streamcorr.demo.rig import Rig
    from streamcorr.engine.changes import ChangeEvent

    rig = Rig(0, 50.0)
    cfg = parse_config(yaml.safe_load(config("p", "127.0.0.1", 1883, rig.channels, fast=False, hop=25)))
    assert cfg.changes.fast is False and cfg.window.samples == 512 and cfg.channels.names == list(rig.channels)
    assert cfg.hop_samples() == 25
    t0 = 1_800_000_000.0
    change = rig.script[0]
    (pair, kind), *_ = change.expected
    hit = ChangeEvent(pair, 0.0, 0.5, int((t0 + change.t_s + 2.0) * 1e9), kind, path="fast")
    early = ChangeEvent(pair, 0.0, 0.5, int((t0 + change.t_s - 5.0) * 1e9), kind)
    stable = ChangeEvent(rig.stable_pairs()[0], 0.0, 0.5, int((t0 + 10) * 1e9), "became-dependent")
    r = score(rig, [(t0 + change.t_s + 2.5, hit), (t0, early), (t0 + 10.5, stable)], t0)
    first = r["expected"][0]
    assert (first["stream_delay_s"], first["wall_delay_s"], first["path"]) == (2.0, 2.5, "fast")
    assert r["missing"] == len(r["expected"]) - 1 and r["false_on_stable"] == 1 and r["fast_events"] == 1


def test_mqtt_burst_daemon_quick(tmp_path, mqtt_broker):
    """bench.mqtt_burst --daemon runs a small burst into a real streamcorr run process beside mosquitto_sub (smoke
    test, not timing): the daemon's /metrics ledger closes and both subscribers are counted."""
    env = os.environ | {"STREAMCORR_BENCH_RESULTS": str(tmp_path)}
    subprocess.run([sys.executable, "-m", "bench.mqtt_burst", "--daemon", "--messages", "4000", "--repeats", "1",
                    "--broker", f"{mqtt_broker[0]}:{mqtt_broker[1]}"], check=True, env=env, capture_output=True,
                   timeout=300)  # fmt: skip
    data = json.loads((tmp_path / "mqtt_burst_daemon.json").read_text())
    (run,) = data["runs"]
    assert data["subscriber"] == "daemon" and run["published"] == 4008
    assert run["ledger_ok"] and run["source_messages"] + run["source_seq_gaps"] == run["published"]
    assert run["mosquitto_sub"] > 0 and run["source_messages"] > 0


def test_fold_tail_quick():
    """bench.fold_tail --quick scores independent pairs' folded innovations and prints the engine's bars."""
    out = subprocess.run([sys.executable, "-m", "bench.fold_tail", "--quick"], check=True, capture_output=True,
                         text=True, timeout=300).stdout  # fmt: skip
    assert "| normal, two-sided |" in out and "| 512 | 396 |" in out
