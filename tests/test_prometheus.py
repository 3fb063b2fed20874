"""examples/prometheus: the scrape config and alert rules pass the real promtool (syntax and unit tests), the
alerting blocks of docs/alerting.md are the example's and run, and a real Prometheus scraping a real daemon
fires StreamcorrDependenceGained when a listed pair becomes dependent."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
import zmq

from tests.brokers import free_port

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "prometheus"
RULES = EXAMPLE / "streamcorr.rules.yml"


def _tool(name: str) -> str:
    """The path of a Prometheus binary; skip with the reason where it is missing, fail under CI=true."""
    path = shutil.which(name)
    if path is None:
        msg = f"{name} not found (Debian: apt-get install prometheus)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)


def test_the_scrape_config_and_the_rules_pass_promtool_check():
    """`promtool check config` accepts prometheus.yml with its rule file, and `promtool check rules` the rules."""
    promtool = _tool("promtool")
    for argv in (
        [promtool, "check", "config", str(EXAMPLE / "prometheus.yml")],
        [promtool, "check", "rules", str(RULES)],
    ):
        done = _run(argv)
        assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(_alert_names())} rules found" in done.stdout


def test_the_rules_pass_their_promtool_unit_tests():
    """Every alert of the rules fires when and only when its unit test expects (`promtool test rules`)."""
    done = _run([_tool("promtool"), "test", "rules", str(EXAMPLE / "streamcorr.rules.test.yml")])
    assert done.returncode == 0, done.stdout + done.stderr
    tested = set(re.findall(r"alertname: (\w+)", (EXAMPLE / "streamcorr.rules.test.yml").read_text()))
    assert tested == _alert_names(), "every alert has a unit test"


def _alert_names() -> set[str]:
    return {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}


def _alerting_page() -> str:
    """docs/alerting.md, the page that documents the rules."""
    return (REPO / "docs" / "alerting.md").read_text()


def test_the_alerting_page_is_the_example_and_its_commands_pass():
    """The Alerting page (docs/alerting.md) names every alert of the rules, its YAML block is the example's rule
    file and scrape job, and each line of its shell block exits 0."""
    section = _alerting_page()
    assert set(re.findall(r"`(Streamcorr[A-Za-z]+)`", section)) == _alert_names()
    (yaml_block,) = re.findall(r"```yaml\n(.*?)```", section, flags=re.S)
    example = yaml.safe_load((EXAMPLE / "prometheus.yml").read_text())
    block = yaml.safe_load(yaml_block)
    assert block == {"rule_files": example["rule_files"], "scrape_configs": example["scrape_configs"]}
    (sh_block,) = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    lines = [line for line in sh_block.splitlines() if line.strip()]
    assert lines
    for line in lines:
        argv = shlex.split(line)
        done = _run([_tool(argv[0]), *argv[1:]])
        assert done.returncode == 0, f"{line}: {done.stdout}{done.stderr}"


# -- a real Prometheus scraping a real daemon -------------------------------------------------------------------
RATE = 20.0


@contextmanager
def _process(argv: list[str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A subprocess with its output in log_path, terminated (then killed) on exit."""
    with log_path.open("w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _api(port: int, path: str, **params: str) -> Any:
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/{path}{query}", timeout=5) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]


def _wait(cond: Callable[[], Any], what: str, procs: dict[str, Any], send: Callable[[], None], timeout_s: float) -> Any:
    """Call send() and cond() every 0.1 s until cond() is truthy; fail naming `what`, with each process's log."""
    deadline = time.monotonic() + timeout_s
    while True:
        send()
        try:
            got = cond()
        except (OSError, urllib.error.URLError):
            got = None
        if got:
            return got
        logs = "\n".join(f"--- {name}:\n{path.read_text()[-2000:]}" for name, (_, path) in procs.items())
        for name, (proc, _) in procs.items():
            assert proc.poll() is None, f"{name} exited\n{logs}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{logs}"
        time.sleep(0.1)


@pytest.mark.slow  # a daemon and a Prometheus: 10-16 s here with the calibration cached, 37 s without
def test_a_real_prometheus_fires_dependence_gained_when_a_listed_pair_becomes_dependent(tmp_path):
    """Prometheus, run with the example's scrape job and rules (scrape and evaluation every 1 s), scrapes a daemon
    whose listed pair a ~ b is first independent and then dependent: StreamcorrDependenceGained fires for a ~ b
    (and not for a ~ c) within a minute, and every dashboard query runs there, one series per pair."""
    prometheus = _tool("prometheus")
    http_port, in_port, prom_port = free_port(), free_port(), free_port()
    daemon_cfg = {
        "version": 1,
        "sources": [{"type": "zmq", "endpoint": f"tcp://127.0.0.1:{in_port}", "mode": "pull", "bind": True,
                     "channel_template": "{key}"}],
        "channels": {"names": ["a", "b", "c"], "rate_hz": RATE},
        "window": {"samples": 64, "hop_samples": 16},
        "pairs": {"mode": "list", "pairs": [["a", "b"], ["a", "c"]]},
        "http": {"port": http_port},
        "logging": {"format": "text"},
    }  # fmt: skip
    (tmp_path / "daemon.yaml").write_text(yaml.safe_dump(daemon_cfg))
    prom_cfg = yaml.safe_load((EXAMPLE / "prometheus.yml").read_text())
    prom_cfg["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    prom_cfg["rule_files"] = [str(EXAMPLE / name) for name in prom_cfg["rule_files"]]
    (job,) = prom_cfg["scrape_configs"]
    job["static_configs"] = [{"targets": [f"127.0.0.1:{http_port}"]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(prom_cfg))

    push = zmq.Context.instance().socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(f"tcp://127.0.0.1:{in_port}")
    rng = np.random.default_rng(29)
    coupled = False
    tick = int(time.time() * RATE)

    def send() -> None:
        """Samples of a, b, c up to now on the 20 Hz grid; b follows a once `coupled`."""
        nonlocal tick
        now = int(time.time() * RATE)
        if now <= tick:
            return
        x = rng.standard_normal((3, now - tick))
        if coupled:
            x[1] = x[0] + 0.1 * x[1]
        t = np.arange(tick, now) / RATE
        chunk = {"t": t.tolist(), "channels": {c: x[k].tolist() for k, c in enumerate("abc")}}
        push.send_multipart([b"in", json.dumps(chunk).encode()])
        tick = now

    def verdict(a: str, b: str) -> float | None:
        """a ~ b's streamcorr_pair_dependent as Prometheus has it now."""
        got = _api(prom_port, "query", query=f'streamcorr_pair_dependent{{a="{a}", b="{b}", why="listed"}}')
        return float(got["result"][0]["value"][1]) if got["result"] else None

    def firing() -> dict[tuple[str, str], set[str]]:
        """{(a, b): alert names} of the firing alerts that carry pair labels."""
        out: dict[tuple[str, str], set[str]] = {}
        for alert in _api(prom_port, "alerts")["alerts"]:
            lb = alert["labels"]
            if alert["state"] == "firing" and "a" in lb:
                out.setdefault((lb["a"], lb["b"]), set()).add(lb["alertname"])
        return out

    daemon_argv = [sys.executable, "-m", "streamcorr", "run", str(tmp_path / "daemon.yaml")]
    prom_argv = [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{prom_port}"]  # fmt: skip
    try:
        with (
            _process(daemon_argv, tmp_path / "daemon.log") as daemon,
            _process(prom_argv, tmp_path / "prometheus.log") as prom,
        ):
            procs = {"daemon": (daemon, tmp_path / "daemon.log"), "prometheus": (prom, tmp_path / "prometheus.log")}
            target = _wait(lambda: _api(prom_port, "targets")["activeTargets"], "the target", procs, send, 30)
            assert target[0]["labels"]["job"] == "streamcorr"
            # independent first, so that Prometheus holds a 0 for a ~ b before the verdict turns
            _wait(lambda: verdict("a", "b") == 0.0, "a ~ b judged independent", procs, send, 90)
            assert not firing()
            coupled = True
            alerts = _wait(lambda: firing().get(("a", "b")), "StreamcorrDependenceGained", procs, send, 60)
            assert alerts == {"StreamcorrDependenceGained"}
            assert ("a", "c") not in firing() and verdict("a", "c") == 0.0
            _check_dashboard_queries(prom_port, instance=f"127.0.0.1:{http_port}")
    finally:
        push.close()


def _check_dashboard_queries(prom_port: int, instance: str) -> None:
    """Each dashboard query, its variables filled in, runs on Prometheus; a per-pair one returns each pair once."""
    dashboard = json.loads((REPO / "examples" / "grafana_dashboard.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"].replace("$job", "streamcorr").replace("$instance", instance)
            expr = expr.replace("$__rate_interval", "1m")
            result = _api(prom_port, "query", query=expr)["result"]
            if "streamcorr_pair_" in expr:
                pairs = [(r["metric"]["a"], r["metric"]["b"]) for r in result]
                assert pairs and len(pairs) == len(set(pairs)), (panel["title"], pairs)
