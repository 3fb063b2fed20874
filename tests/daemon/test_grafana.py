"""Grafana and alert rules: per-pair MI and dependence gauges on /metrics with bounded label sets; the example
dashboard's queries and the example alert rules use exactly the names /metrics exports; the dashboard's variables
(data source, job, instance) and its one series per pair."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import msgpack
import numpy as np
import pytest
import yaml
import zmq
from prometheus_client import generate_latest

from streamcorr.config import parse_config
from streamcorr.daemon.service import Daemon
from tests.brokers import free_port

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DASHBOARD = EXAMPLES / "grafana_dashboard.json"
RULES = EXAMPLES / "prometheus" / "streamcorr.rules.yml"


def _metrics_of_a_running_daemon() -> str:
    """The /metrics body of a daemon with a ZeroMQ output that has published snapshots of 4 channels (one listed pair,
    top 2)."""
    p_in = free_port()
    source = {"type": "zmq", "endpoint": f"tcp://127.0.0.1:{p_in}", "mode": "pull", "bind": True}
    source["channel_template"] = "{key}"
    cfg = parse_config({
        "version": 1,
        "sources": [source],
        "channels": {"names": ["a", "b", "c", "d"], "rate_hz": 10.0},
        "window": {"samples": 64, "hop_samples": 16},
        "pairs": {"mode": "list", "pairs": [["c", "d"], ["a", "b"], ["a", "c"]]},
        "outputs": {"zmq": {"endpoint": f"tcp://127.0.0.1:{free_port()}", "snapshot_endpoint": None}},
        "http": {"enabled": False, "pair_metrics_top_k": 2, "pair_metrics_listed": 1},
        "logging": {"format": "text"},
    })  # fmt: skip
    rng = np.random.default_rng(13)

    async def main() -> str:
        daemon = Daemon(cfg)
        run = asyncio.create_task(daemon.run(install_signals=False))
        push = zmq.Context.instance().socket(zmq.PUSH)
        push.connect(f"tcp://127.0.0.1:{p_in}")
        t0 = 1_700_000_000.0
        try:
            for k in range(0, 300, 10):
                t = t0 + np.arange(k, k + 10) / 10
                x = rng.standard_normal((4, 10))
                x[1] = x[0] + 0.1 * x[1]  # a ~ b dependent
                chunk = {"t": t.tolist(), "channels": {c: x[n].tolist() for n, c in enumerate("abcd")}}
                push.send_multipart([b"x", msgpack.packb(chunk)])
                await asyncio.sleep(0.02)
            for _ in range(1200):
                eng = daemon._engine  # live: hops behind are skipped, so count those too
                if eng is not None and eng.latest is not None and eng.counters.hops + eng.counters.hops_skipped >= 10:
                    break
                await asyncio.sleep(0.05)
            return generate_latest(daemon.registry).decode()
        finally:
            push.close(linger=0)
            daemon.stop()
            await run

    return asyncio.run(main())


@pytest.fixture(scope="module")
def metrics_text() -> str:
    return _metrics_of_a_running_daemon()


def _series(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """{labels: value} of one metric family in a /metrics text."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line.rsplit(" ", 1)
            out[tuple(sorted(re.findall(r'(\w+)="([^"]*)"', labels)))] = float(value)
    return out


def _exported(text: str) -> set[str]:
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def _dashboard_exprs() -> list[str]:
    return [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]]


def _rule_exprs() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [r["expr"] for g in groups for r in g["rules"]]


def test_pair_gauges_are_bounded_and_carry_the_detectors_verdict(metrics_text):
    """streamcorr_pair_mi holds the listed pairs (up to pair_metrics_listed) and the top k, no more, each pair once;
    streamcorr_pair_dependent is 0 or 1 on the same label sets."""
    pairs = {(dict(lb)["a"], dict(lb)["b"]): dict(lb)["why"] for lb in _series(metrics_text, "streamcorr_pair_mi")}
    assert pairs[("c", "d")] == "listed"  # the first listed pair, always there
    assert pairs[("a", "b")] == "top"  # strong, and beyond pair_metrics_listed: there as one of the top 2
    assert len(pairs) <= 1 + 2
    dependent = _series(metrics_text, "streamcorr_pair_dependent")
    assert dependent, "no streamcorr_pair_dependent series"
    assert set(dependent) <= set(_series(metrics_text, "streamcorr_pair_mi"))
    assert set(dependent.values()) <= {0.0, 1.0}


def test_the_dashboard_and_the_alert_rules_query_only_exported_names(metrics_text):
    """Every streamcorr_* and process_* name in the example dashboard's queries and in the example alert rules is
    one that /metrics exports."""
    exported = _exported(metrics_text)
    for what, exprs in (("dashboard", _dashboard_exprs()), ("alert rules", _rule_exprs())):
        used = {name for e in exprs for name in re.findall(r"\b(?:streamcorr|process)_[a-z0-9_]+", e)}
        assert used, f"the {what} query nothing"
        assert used <= exported, f"{what}: not exported by /metrics: {sorted(used - exported)}"


def _labels(snap_dependent: np.ndarray | None, network_age_s: np.ndarray) -> dict[str, dict[tuple[str, ...], float]]:
    """{family: {(a, b, why): value}} of the pair gauges for 3 channels, pairs.pairs [[a, b], [b, c]], top 1."""
    from streamcorr.daemon.observe import _pair_metrics
    from streamcorr.engine.matrix import Snapshot

    cfg = parse_config({
        "version": 1, "sources": [{"type": "zmq", "endpoint": "tcp://127.0.0.1:1"}],
        "pairs": {"mode": "list", "pairs": [["a", "b"], ["b", "c"]]},
        "http": {"pair_metrics_top_k": 1},
    })  # fmt: skip
    nan = np.nan
    mi = np.array([[nan, 0.1, 0.9], [0.1, nan, nan], [0.9, nan, nan]])
    snap = Snapshot(1, 0, 0, ("a", "b", "c"), mi, np.zeros((3, 3)), np.ones((3, 3)),
                    network_age_s=network_age_s, dependent=snap_dependent)  # fmt: skip
    return {f.name: {tuple(s.labels.values()): s.value for s in f.samples} for f in _pair_metrics(snap, cfg)}


def test_pair_dependent_is_exported_only_where_the_detector_judged_the_pair():
    """streamcorr_pair_dependent is 1/0 for pairs with a network estimate, absent for a listed pair never estimated
    (its MI is NaN) and absent altogether from a snapshot without verdicts."""
    inf = np.inf
    age = np.array([[inf, 0.0, 0.0], [0.0, inf, inf], [0.0, inf, inf]])  # b ~ c never estimated
    dep = np.zeros((3, 3), dtype=bool)
    dep[0, 2] = dep[2, 0] = True
    got = _labels(dep, age)
    assert got["streamcorr_pair_dependent"] == {("a", "b", "listed"): 0.0, ("a", "c", "top"): 1.0}
    assert set(got["streamcorr_pair_mi"]) == {("a", "b", "listed"), ("b", "c", "listed"), ("a", "c", "top")}
    assert "streamcorr_pair_dependent" not in _labels(None, age)


# each selector of a dashboard query: a metric name and its {matchers}, if any
_SELECTOR = re.compile(r"\b(streamcorr_[a-z0-9_]+|ALERTS)\b(\{[^}]*\})?")


def test_the_dashboard_has_a_data_source_variable_and_filters_every_query_by_job_and_instance():
    """The dashboard's panels use the data source of a `datasource` template variable DS_PROMETHEUS (so
    `${DS_PROMETHEUS}` resolves under file provisioning), job and instance variables list streamcorr daemons, and
    every metric selector of every query carries job="$job" and instance="$instance"."""
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource" and variables["DS_PROMETHEUS"]["query"] == "prometheus"
    assert variables["job"]["query"] == "label_values(streamcorr_up, job)"
    assert variables["instance"]["query"] == 'label_values(streamcorr_up{job="$job"}, instance)'
    ds = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
    for var in (variables["job"], variables["instance"]):
        assert var["datasource"] == ds and var["type"] == "query"
    assert "__inputs" not in dashboard  # an import's inputs would pin one data source; the variable picks it
    for panel in dashboard["panels"]:
        assert panel["datasource"] == ds, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == ds, panel["title"]
            selectors = _SELECTOR.findall(target["expr"])
            assert selectors, target["expr"]
            for name, matchers in selectors:
                assert 'job="$job"' in matchers and 'instance="$instance"' in matchers, (panel["title"], name)


def test_the_dashboard_shows_each_pair_once():
    """Every dashboard query of a per-pair gauge aggregates by (a, b), so a pair never shows as two series (its
    why="top" and why="listed" label sets, or a restart that moved it between them)."""
    pair_exprs = [e for e in _dashboard_exprs() if "streamcorr_pair_" in e]
    assert pair_exprs
    for expr in pair_exprs:
        for name, _ in _SELECTOR.findall(expr):
            if name.startswith("streamcorr_pair_"):
                assert re.search(rf"max by \(a, b\) \({name}\{{", expr), expr
