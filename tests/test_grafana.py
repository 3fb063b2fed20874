"""Grafana: per-pair MI gauges on /metrics with bounded label sets; the example dashboard's queries use exactly the
names /metrics exports."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import msgpack
import numpy as np
import zmq
from prometheus_client import generate_latest

from streamcorr.config import parse_config
from streamcorr.daemon import Daemon
from tests.brokers import free_port

DASHBOARD = Path(__file__).resolve().parents[1] / "examples" / "grafana_dashboard.json"


def _metrics_of_a_running_daemon() -> str:
    """The /metrics body of a daemon that has published snapshots of 4 channels (one listed pair, top 2)."""
    p_in = free_port()
    source = {"type": "zmq", "endpoint": f"tcp://127.0.0.1:{p_in}", "mode": "pull", "bind": True}
    source["channel_template"] = "{key}"
    cfg = parse_config({
        "version": 1,
        "sources": [source],
        "channels": {"names": ["a", "b", "c", "d"], "rate_hz": 10.0},
        "window": {"samples": 64, "hop_samples": 16},
        "pairs": {"mode": "list", "pairs": [["c", "d"], ["a", "b"], ["a", "c"]]},
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


def test_pair_gauges_are_bounded_and_the_dashboard_queries_exported_names():
    """streamcorr_pair_mi holds the listed pairs (up to pair_metrics_listed) and the top k, no more; every metric name
    in the example dashboard's queries is one that /metrics exports."""
    text = _metrics_of_a_running_daemon()
    pair_lines = [line for line in text.splitlines() if line.startswith("streamcorr_pair_mi{")]
    labels = {tuple(re.findall(r'(\w+)="([^"]*)"', line)) for line in pair_lines}
    pairs = {(dict(lb)["a"], dict(lb)["b"]): dict(lb)["why"] for lb in labels}
    assert pairs[("c", "d")] == "listed"  # the first listed pair, always there
    assert pairs[("a", "b")] == "top"  # strong, and beyond pair_metrics_listed: there as one of the top 2
    assert len(pairs) <= 1 + 2
    exported = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {name for e in exprs for name in re.findall(r"\bstreamcorr_[a-z0-9_]+", e)}
    assert used, "the dashboard queries nothing"
    assert used <= exported, f"not exported by /metrics: {sorted(used - exported)}"
