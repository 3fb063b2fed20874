"""MQTT over TLS with username and password, against a private Mosquitto with a throwaway CA."""

from __future__ import annotations

import asyncio
import getpass
import shutil
import subprocess
import uuid
from pathlib import Path

import numpy as np
import pytest

from streamcorr.config import MqttConnection, Tls
from streamcorr.ingest.mqtt import MqttSource
from streamcorr.ingest.payload import PayloadDecoder
from tests.brokers import PrivateBroker, stop, until


def _certificates(d: Path) -> None:
    """A CA and a server certificate for 127.0.0.1, made with the openssl CLI."""

    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
        "-keyout", "ca.key", "-out", "ca.crt")  # fmt: skip
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "server.key", "-out", "server.csr")
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    ssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
        "-extfile", "san.cnf", "-out", "server.crt")  # fmt: skip


@pytest.mark.skipif(shutil.which("openssl") is None or shutil.which("mosquitto_passwd") is None,
                    reason="needs the openssl and mosquitto_passwd commands")  # fmt: skip
def test_tls_with_password_reaches_the_engine_and_wrong_password_is_refused(tmp_path):
    """With the CA file and the right credentials the source connects over TLS and ingests; with a wrong
    password it keeps retrying and counts the failures instead of crashing."""
    _certificates(tmp_path)
    subprocess.run(["mosquitto_passwd", "-b", "-c", str(tmp_path / "pw"), "sensor", "s3cret"], check=True)
    broker = PrivateBroker(tmp_path)
    broker.conf.write_text(
        f"listener {broker.port} 127.0.0.1\nallow_anonymous false\npassword_file {tmp_path / 'pw'}\n"
        f"cafile {tmp_path / 'ca.crt'}\ncertfile {tmp_path / 'server.crt'}\nkeyfile {tmp_path / 'server.key'}\n"
        f"persistence false\nuser {getpass.getuser()}\n"  # as root it would drop to a user who cannot read tmp_path
    )
    broker.start()
    topic = f"tls-{uuid.uuid4().hex[:8]}/dev"
    tls = Tls(ca_file=str(tmp_path / "ca.crt"))
    rng = np.random.default_rng(5)
    try:
        received: list[tuple[str, int]] = []

        def sink(channel: str, t: np.ndarray, v: np.ndarray) -> int:
            received.append((channel, len(t)))
            return len(t)

        async def main() -> tuple[MqttSource, MqttSource]:
            good = MqttSource(
                settings=MqttConnection(port=broker.port, username="sensor", password="s3cret", tls=tls),
                topics=[topic], decoder=PayloadDecoder(channel_template="{key}"), sink=sink,
            )  # fmt: skip
            bad = MqttSource(
                settings=MqttConnection(port=broker.port, username="sensor", password="wrong", tls=tls,
                                      reconnect_min_s=0.05, reconnect_max_s=0.1),
                topics=[topic], decoder=PayloadDecoder(), sink=sink,
            )  # fmt: skip
            tasks = [asyncio.create_task(good.run()), asyncio.create_task(bad.run())]
            await until(lambda: good.connected, what="TLS connection")
            for _ in range(20):
                payload = f'{{"x": {rng.standard_normal():.6f}}}'
                cmd = ["mosquitto_pub", "-p", str(broker.port), "-h", "127.0.0.1", "--cafile", str(tmp_path / "ca.crt"),
                       "-u", "sensor", "-P", "s3cret", "-q", "1", "-t", topic, "-m", payload]  # fmt: skip
                subprocess.run(cmd, check=True, capture_output=True)
            await until(lambda: good.counters.messages >= 20, what="20 messages over TLS")
            await until(lambda: bad.counters.connect_failures >= 2, what="refused logins counted")
            for task in tasks:
                await stop(task)
            return good, bad

        good, bad = asyncio.run(main())
    finally:
        broker.stop()
    assert good.counters.messages == 20 and good.counters.dropped == 0
    assert sum(n for ch, n in received if ch == "x") == 20
    assert not bad.connected and bad.counters.connects == 0
