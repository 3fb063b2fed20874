"""A real `streamcorr run` process seen from outside: every loss in /metrics and the status counters, /healthz
per part, /livez and /readyz for an orchestrator (the probes of docs/daemon.md, the systemd unit and its notifications),
HTTP bounds, exposure warnings, the last will's seq, Ctrl-C during the first start."""

from __future__ import annotations

import asyncio
import configparser
import json
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from contextlib import suppress
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from streamcorr.cli.commands import main
from streamcorr.publish.subscriber import Subscriber
from tests.brokers import PrivateBroker, free_port
from tests.helpers import daemon_process, http_get, metric, probe, wait_for

RATE = 10.0


def _config(sources: list[dict[str, Any]], outputs: dict[str, Any], http_port: int, **extra: Any) -> dict[str, Any]:
    return {
        "version": 1,
        "sources": sources,
        "channels": {"names": ["a", "b"], "rate_hz": RATE, "max_staleness_s": 0.2},
        "window": {"samples": 64, "hop_samples": 10},
        "outputs": {**outputs, "status_interval_s": 0.3},
        "http": {"port": http_port, **extra.pop("http", {})},
        "logging": {"format": "text"},
        **extra,
    }


def _health(port: int) -> tuple[int, dict[str, Any]]:
    return probe(port, "/healthz")


def _chunks(seqs: list[int], seed: int) -> list[bytes]:
    """JSON chunks of 10 samples of a, b (b = a^2 + noise), numbered with the given seq values."""
    rng = np.random.default_rng(seed)
    out = []
    for k, seq in enumerate(seqs):
        t = 1_700_000_000.0 + (k * 10 + np.arange(10)) / RATE
        a = rng.standard_normal(10)
        b = a**2 + 0.1 * rng.standard_normal(10)
        out.append(json.dumps({"seq": seq, "t": t.tolist(), "channels": {"a": a.tolist(), "b": b.tolist()}}).encode())
    return out


def test_every_loss_is_a_metric_and_a_status_counter_and_the_will_is_no_restart(mqtt_broker, tmp_path):
    """Lost and restarted seq numbers, accepted samples, output and web counters are Prometheus series and status
    counters; after SIGKILL the last will's "offline" is no restart to subscribers, and the retained snapshot a
    late subscriber gets says it comes from an offline publisher."""
    host, port = mqtt_broker
    prefix = f"ledger-{uuid.uuid4().hex[:8]}"
    http_port = free_port()
    src = {"type": "mqtt", "host": host, "port": port, "topics": [f"{prefix}/in"], "channel_template": "{key}"}
    out = {"mqtt": {"host": host, "port": port, "prefix": f"{prefix}/out"}}
    cfg = _config([src], out, http_port, http={"web": True})
    seqs = [*range(10), *range(13, 20), *range(0, 10)]  # 3 lost (10..12), then a publisher restart (back to 0)

    async def scenario(proc: Any) -> tuple[Subscriber, dict[str, Any], str]:
        import aiomqtt

        sub = Subscriber(f"mqtt://{host}:{port}", prefix=f"{prefix}/out", late_join=False)
        await sub.start()
        statuses: list[Any] = []

        async def collect() -> None:
            async for s in sub.statuses():
                statuses.append(s)

        collector = asyncio.create_task(collect())
        async with aiomqtt.Client(host, port) as client:
            for payload in _chunks(seqs, seed=7):
                await client.publish(f"{prefix}/in", payload, qos=1)
                await asyncio.sleep(0.02)
        deadline = time.monotonic() + 60
        while not any(
            s.state == "online" and s.counters.get("mqtt0.seq_resets") == 1 and s.counters["output.mqtt.sent.snapshot"]
            for s in statuses
        ):
            assert time.monotonic() < deadline, statuses[-1:] or "no status"
            await asyncio.sleep(0.1)
        online = [s for s in statuses if s.state == "online"]
        metrics = await asyncio.to_thread(lambda: http_get(f"http://127.0.0.1:{http_port}/metrics")[1])
        proc.send_signal(signal.SIGKILL)  # no goodbye: the broker publishes the last will
        while not statuses or statuses[-1].state != "offline":
            assert time.monotonic() < deadline + 30, "no offline status after SIGKILL"
            await asyncio.sleep(0.05)
        collector.cancel()
        await sub.aclose()
        return sub, online[-1].counters, metrics

    with daemon_process(tmp_path, cfg) as proc:
        wait_for(lambda: _health(http_port)[1]["sources_connected"].get("mqtt0"), "source connected", proc)
        sub, counters, metrics = asyncio.run(asyncio.wait_for(scenario(proc), 150))
    assert metric(metrics, 'streamcorr_source_seq_gaps_total{source="mqtt0"}') == 3
    assert metric(metrics, 'streamcorr_source_seq_resets_total{source="mqtt0"}') == 1
    assert metric(metrics, 'streamcorr_source_samples_accepted_total{source="mqtt0"}') > 0
    assert metric(metrics, 'streamcorr_output_sent_total{output="mqtt",stream="snapshot"}') > 0
    for series in ('streamcorr_output_dropped_total{output="mqtt",stream="event"}',
                   'streamcorr_output_errors_total{output="mqtt",stream="snapshot"}',
                   "streamcorr_web_events_dropped_total", "streamcorr_http_header_timeouts_total"):  # fmt: skip
        assert series in metrics
    assert sub.counters.restarts == 0, "the last will looked like a publisher restart"
    assert counters["mqtt0.seq_gaps"] == 3 and counters["mqtt0.seq_resets"] == 1
    assert counters["mqtt0.samples_accepted"] > 0 and counters["output.mqtt.sent.snapshot"] > 0
    assert "output.mqtt.dropped.snapshot" in counters and "output.mqtt.errors.snapshot" in counters
    assert "output.web.clients_rejected" in counters and "http.header_timeouts" in counters
    assert counters["hops"] > 0 and 0 < counters["last_hop_s"] < 30  # the newest hop's wall time, seconds

    async def late() -> Any:
        async with Subscriber(f"mqtt://{host}:{port}", prefix=f"{prefix}/out") as late_sub:
            return await anext(late_sub.snapshots(timeout_s=10))

    snap = asyncio.run(late())
    assert snap.origin == "offline"
    for stream in ("snapshot", "status"):
        subprocess.run(["mosquitto_pub", "-h", host, "-p", str(port), "-t", f"{prefix}/out/{stream}", "-r", "-n"],
                       check=False)  # fmt: skip


def test_healthz_reports_each_part_and_503s_when_the_broker_is_gone(tmp_path):
    """/healthz is 200 with source and output up, 503 naming both while their broker is stopped, and 200 again
    after it restarts; a refused broker connection is logged with its config key and a hint to start Mosquitto."""
    broker = PrivateBroker(tmp_path)
    broker.start()
    http_port = free_port()
    conn = {"port": broker.port, "reconnect_min_s": 0.1, "reconnect_max_s": 0.3}
    src = {"type": "mqtt", "topics": ["in/#"], **conn}
    cfg = _config([src], {"mqtt": {**conn, "prefix": "h"}}, http_port)
    try:
        with daemon_process(tmp_path, cfg) as proc:
            wait_for(lambda: _health(http_port)[0] == 200, "healthy", proc)
            _, body = _health(http_port)
            assert body["status"] == "ok" and body["sources_connected"] == {"mqtt0": True}
            assert body["outputs_alive"] == {"mqtt": True}
            broker.stop()
            both = ("source mqtt0 not connected", "output mqtt: not connected")  # each part notices on its own
            _, body = wait_for(lambda: (h := _health(http_port))[0] == 503 and all(p in h[1]["problems"] for p in both)
                            and h, "503 naming both parts", proc, 30)  # fmt: skip
            assert body["status"] == "degraded"
            broker.start()
            wait_for(lambda: _health(http_port)[0] == 200, "healthy again", proc, 60)
    finally:
        broker.stop()
    refused = PrivateBroker(tmp_path)  # a port with nothing behind it
    cfg = _config([{"type": "mqtt", "topics": ["x"], "port": refused.port}], {}, free_port())
    with daemon_process(tmp_path, cfg) as proc:
        hint = "sources.0.host / sources.0.port"  # the daemon names the keys; the loop's own line names the broker
        text = wait_for(lambda: hint in (t := proc.log_path.read_text()) and t, "the broker hint", proc, 60)
    assert "mosquitto -d" in text and f"127.0.0.1:{refused.port}" in text


def test_http_bounds_half_sent_requests_and_connection_floods(tmp_path):
    """Half-sent requests are closed after http.header_timeout_s, connections beyond http.max_connections are
    closed at once, /healthz still answers, and the counts are in /metrics; a listener beyond loopback is
    warned about at start."""
    http_port = free_port()
    cfg = _config(
        [{"type": "zmq", "endpoint": f"tcp://127.0.0.1:{free_port()}", "mode": "pull", "bind": True}], {},
        http_port, http={"host": "0.0.0.0", "max_connections": 20, "header_timeout_s": 1.0},
    )  # fmt: skip
    with daemon_process(tmp_path, cfg) as proc:
        wait_for(lambda: _health(http_port)[1].get("status") is not None, "http up", proc)
        socks = []
        for _ in range(60):
            s = socket.create_connection(("127.0.0.1", http_port), timeout=5)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # headers never finished
            socks.append(s)
        deadline = time.monotonic() + 30
        for s in socks:  # every one is closed by the server: recv sees the end, or a reset
            s.settimeout(max(0.1, deadline - time.monotonic()))
            with suppress(ConnectionResetError):
                assert s.recv(1024) == b""
            s.close()
        assert _health(http_port)[1]["status"] is not None
        text = http_get(f"http://127.0.0.1:{http_port}/metrics")[1]
        assert metric(text, "streamcorr_http_header_timeouts_total") >= 1
        assert metric(text, "streamcorr_http_connections_rejected_total") >= 1
        log_text = proc.log_path.read_text()
    assert "listening beyond loopback: http.host '0.0.0.0'" in log_text
    assert len(log_text.splitlines()) < 200, "log volume not bounded"


def test_check_warns_about_listeners_beyond_loopback(tmp_path, capsys):
    """`streamcorr check` names each key that listens beyond loopback (HTTP on 0.0.0.0, ZeroMQ on *), and is
    silent for the loopback defaults."""
    cfg = {
        "version": 1,
        "sources": [{"type": "zmq", "endpoint": "tcp://0.0.0.0:7001", "mode": "pull", "bind": True}],
        "outputs": {"zmq": {"endpoint": "tcp://*:7002", "snapshot_endpoint": "tcp://[::]:7003"}},
        "http": {"host": "::"},
    }
    path = tmp_path / "exposed.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    for key in ("http.host", "outputs.zmq.endpoint", "outputs.zmq.snapshot_endpoint", "sources.0.endpoint"):
        assert f"warning: listening beyond loopback: {key}" in out, out
    local = {"version": 1, "sources": [{"type": "zmq", "endpoint": "tcp://127.0.0.1:7001", "bind": True}],
             "outputs": {"zmq": {}}, "http": {"host": "localhost"}}  # fmt: skip
    path.write_text(yaml.safe_dump(local))
    assert main(["check", str(path)]) == 0
    assert "warning" not in capsys.readouterr().out


def test_ctrl_c_during_the_first_start_is_clean_and_healthz_says_starting(tmp_path):
    """On a first start (empty calibration cache) /healthz answers "starting" (503) at once, a log line says what
    is measured and for how long, and SIGINT stops the process with exit 0 and no traceback."""
    http_port = free_port()
    src = {"type": "zmq", "endpoint": f"tcp://127.0.0.1:{free_port()}", "mode": "pull", "bind": True}
    cfg = _config([src], {}, http_port)
    cfg["window"] = {"samples": 4096}  # a calibration that takes far longer than this test
    env = {"STREAMCORR_CACHE_DIR": str(tmp_path / "cache")}
    with daemon_process(tmp_path, cfg, env) as proc:
        code, body = wait_for(lambda: _health(http_port), "/healthz during calibration", proc, 30)
        assert code == 503 and body["status"] == "starting"
        assert probe(http_port, "/livez")[0] == 200  # alive: an orchestrator must not restart a calibration
        code, body = probe(http_port, "/readyz")
        assert code == 503 and body["status"] == "not ready" and body["problems"][0].startswith("starting")
        wait_for(lambda: "null calibration" in proc.log_path.read_text(), "the progress line", proc, 30)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        text = proc.log_path.read_text()
    assert "Traceback" not in text and "KeyboardInterrupt" not in text and "terminate called" not in text
    assert "pairs of independent smooth and white signals" in text and "Ctrl-C stops" in text


def test_healthz_503s_when_input_flows_but_no_snapshot_comes(tmp_path):
    """Samples arriving only for channels the config does not take (a wrong `channels.names`, auto_add off) make
    /healthz 503 "degraded" once a window and `http.snapshot_stale_s` have passed without a snapshot."""
    import zmq

    http_port, in_port = free_port(), free_port()
    src = {"type": "zmq", "endpoint": f"tcp://127.0.0.1:{in_port}", "mode": "pull", "bind": True,
           "channel_template": "{key}"}  # fmt: skip
    cfg = _config([src], {}, http_port, http={"snapshot_stale_s": 1.0})
    cfg["channels"]["auto_add"] = False
    cfg["window"] = {"samples": 32, "hop_samples": 5}
    with daemon_process(tmp_path, cfg) as proc:
        wait_for(lambda: _health(http_port)[1].get("status") in ("ok", "degraded"), "running", proc)
        push = zmq.Context.instance().socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(f"tcp://127.0.0.1:{in_port}")
        try:
            t = time.time() - 60
            deadline = time.monotonic() + 60
            while True:
                push.send(json.dumps({"t": t, "x": 1.0, "y": 2.0}).encode())  # x, y: not channels a, b
                t += 1 / RATE
                code, body = _health(http_port)
                if code == 503 and any("no snapshot" in problem for problem in body["problems"]):
                    break
                assert time.monotonic() < deadline and proc.poll() is None, body
                time.sleep(0.05)
        finally:
            push.close()
    assert body["status"] == "degraded" and body["last_snapshot_seq"] is None


def test_log_volume_is_bounded_per_template_and_in_all():
    """The daemon's log filter lets through at most its limit per message template and ten times that in all,
    so neither one repeated error nor a flood of distinct lines can fill a disk, and a quiet template still logs."""
    import logging

    from streamcorr.logutil import RepeatLimitFilter

    f = RepeatLimitFilter(max_per_window=5, window_s=3600)

    def record(msg: str, *args: object) -> logging.LogRecord:
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, args, None)

    assert sum(f.filter(record("socket.accept() out of system resource: %s", k)) for k in range(10_000)) == 5
    assert f.filter(record("a rare line"))
    assert sum(f.filter(record(f"distinct line {k}")) for k in range(10_000)) == 50 - 6


def test_standalone_web_view_closes_half_sent_requests():
    """The demo's standalone web view bounds header time too: a half-sent request is closed, the page still
    loads."""
    from streamcorr.publish.web import WebView

    async def main() -> tuple[bytes, int]:
        async with WebView(port=0, header_timeout_s=0.5) as view:
            port = int(view.url.rsplit(":", 1)[1])
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")  # never finished
            await writer.drain()
            try:
                closed = await asyncio.wait_for(reader.read(), 30)
            except ConnectionResetError:  # an abort may reset rather than end the stream: closed all the same
                closed = b""
            writer.close()
            code = await asyncio.to_thread(lambda: http_get(f"http://127.0.0.1:{port}/")[0])
            return closed, code

    closed, code = asyncio.run(main())
    assert closed == b"" and code == 200


REPO = Path(__file__).resolve().parents[2]


def _docs_probes() -> dict[str, Any]:
    """The Kubernetes probes of the YAML block that holds a livenessProbe in docs/daemon.md."""
    blocks = re.findall(r"```yaml\n(.*?)```", (REPO / "docs" / "daemon.md").read_text(), flags=re.S)
    probes = [yaml.safe_load(b) for b in blocks if "livenessProbe:" in b]
    assert len(probes) == 1, "one probe block in docs/daemon.md"
    return probes[0]


def test_a_bound_zeromq_source_without_a_sender_is_live_ready_and_healthy(tmp_path):
    """A daemon whose only source is a bound ZeroMQ PULL socket that no sender connects to answers /livez,
    /readyz (each probe path of docs/daemon.md) and /healthz 200 within 60 s, with the source "listening"; under a
    Type=notify unit it says READY=1, pings the watchdog, and says STOPPING=1 on SIGTERM."""
    from streamcorr.config import Http

    http_port = free_port()
    src = {"type": "zmq", "endpoint": f"tcp://127.0.0.1:{free_port()}", "mode": "pull", "bind": True}
    sock_dir = tempfile.mkdtemp(prefix="sd-", dir="/tmp")  # an AF_UNIX path must stay under 108 bytes
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(f"{sock_dir}/notify")
    notify.settimeout(0.2)
    env = {"NOTIFY_SOCKET": f"{sock_dir}/notify", "WATCHDOG_USEC": "1000000"}
    said: list[str] = []

    def heard() -> list[str]:
        with suppress(TimeoutError):
            while True:
                said.extend(notify.recv(4096).decode().splitlines())
        return said

    try:
        with daemon_process(tmp_path, _config([src], {}, http_port), env) as proc:
            t0 = time.monotonic()
            wait_for(lambda: probe(http_port, "/readyz")[0] == 200, "/readyz 200", proc, 60)
            assert time.monotonic() - t0 < 60
            code, live = probe(http_port, "/livez")
            assert code == 200 and live["status"] == "alive" and live["phase"] == "running"
            code, ready = probe(http_port, "/readyz")
            assert ready == {"status": "ready", "problems": [], "sources": {"zmq0": "listening"}}
            code, health = _health(http_port)
            assert code == 200 and health["status"] == "ok" and health["sources"] == {"zmq0": "listening"}
            probes = _docs_probes()
            assert probes["livenessProbe"]["httpGet"]["path"] == "/livez"
            assert probes["readinessProbe"]["httpGet"]["path"] == "/readyz"
            for spec in probes.values():
                assert spec["httpGet"]["port"] == Http().port  # the default http.port
                assert probe(http_port, spec["httpGet"]["path"])[0] == 200
            metrics = http_get(f"http://127.0.0.1:{http_port}/metrics")[1]
            assert metric(metrics, "streamcorr_ready") == 1 and metric(metrics, "streamcorr_up") == 1
            wait_for(lambda: heard().count("WATCHDOG=1") >= 2, "two watchdog pings", proc, 10)
            assert "READY=1" in said
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
            assert "STOPPING=1" in heard()
    finally:
        notify.close()
        shutil.rmtree(sock_dir, ignore_errors=True)


def test_an_mqtt_source_without_a_broker_is_live_but_not_ready(tmp_path):
    """A daemon whose MQTT source points at a port where no broker listens answers /livez 200 and /readyz 503
    with a JSON body naming the source, its key and the broker's address; once a broker starts there, /readyz
    is 200."""
    broker = PrivateBroker(tmp_path)  # its port, not yet started: nothing listens there
    http_port = free_port()
    src = {"type": "mqtt", "topics": ["in/#"], "port": broker.port, "reconnect_min_s": 0.1, "reconnect_max_s": 0.3}
    try:
        with daemon_process(tmp_path, _config([src], {}, http_port)) as proc:
            why = f"source mqtt0 (sources.0): no MQTT broker answers at 127.0.0.1:{broker.port}"

            def named() -> Any:
                code, body = probe(http_port, "/readyz")
                return body["problems"] and body["problems"][0].startswith(why) and (code, body)

            code, ready = wait_for(named, "503 naming the broker", proc, 60)
            assert code == 503 and ready["status"] == "not ready" and ready["sources"] == {"mqtt0": "not connected"}
            code, live = probe(http_port, "/livez")
            assert code == 200 and live["status"] == "alive"
            assert _health(http_port)[0] == 503
            broker.start()
            wait_for(lambda: probe(http_port, "/readyz")[0] == 200, "ready once the broker answers", proc, 30)
    finally:
        broker.stop()


def test_the_systemd_unit_is_valid_and_hardened():
    """examples/streamcorr.service passes `systemd-analyze verify` (where systemd is installed) and runs
    `streamcorr run /etc/streamcorr/config.yaml` as Type=notify with a dedicated user, a watchdog, restart on
    failure and the sandbox settings docs/daemon.md promises."""
    unit = REPO / "examples" / "streamcorr.service"
    parser = configparser.ConfigParser(strict=False, interpolation=None, comment_prefixes=("#",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string(unit.read_text())
    svc = parser["Service"]
    assert svc["Type"] == "notify" and svc["ExecStart"] == "streamcorr run /etc/streamcorr/config.yaml"
    assert svc["User"] == "streamcorr" and svc["Restart"] == "on-failure" and int(svc["WatchdogSec"]) > 0
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "PrivateDevices"):
        assert svc[key] == "yes", key
    assert svc["ProtectSystem"] == "strict" and svc["StateDirectory"] == svc["CacheDirectory"] == "streamcorr"
    assert parser["Install"]["WantedBy"] == "multi-user.target"
    analyze, exe = shutil.which("systemd-analyze"), shutil.which("streamcorr")
    if analyze is None or exe is None:
        pytest.skip("no systemd-analyze here: the unit was parsed, not verified")
    with tempfile.TemporaryDirectory() as d:  # verify checks ExecStart exists: point it at this install
        copy = Path(d) / "streamcorr.service"
        copy.write_text(unit.read_text().replace("ExecStart=streamcorr", f"ExecStart={exe}"))
        out = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True, check=False)
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr
