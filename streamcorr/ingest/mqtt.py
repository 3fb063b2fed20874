"""MQTT plumbing shared by the source and the publishing sink: settings, client factory, backoff."""

from __future__ import annotations

import random
import ssl
from collections.abc import Iterator
from dataclasses import dataclass

import aiomqtt

__all__ = ["MqttSettings", "MqttTls", "jittered_backoff", "make_client"]


@dataclass(frozen=True)
class MqttTls:
    ca_file: str | None = None  # None: the system trust store
    cert_file: str | None = None  # client certificate, for brokers that require one
    key_file: str | None = None
    insecure: bool = False  # skip host-name verification (test brokers only)

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        if self.insecure:
            ctx.check_hostname = False
        return ctx


@dataclass(frozen=True)
class MqttSettings:
    host: str = "127.0.0.1"
    port: int = 1883
    client_id: str | None = None  # None: the broker assigns one
    username: str | None = None
    password: str | None = None
    tls: MqttTls | None = None
    keepalive_s: int = 30
    qos: int = 0
    timeout_s: float = 10.0
    reconnect_min_s: float = 0.5
    reconnect_max_s: float = 30.0


def make_client(
    settings: MqttSettings, *, will: aiomqtt.Will | None = None, max_queued_in: int | None = None
) -> aiomqtt.Client:
    """A fresh client for one connection attempt (aiomqtt clients are not reusable after a failure)."""
    return aiomqtt.Client(
        settings.host,
        settings.port,
        identifier=settings.client_id,
        username=settings.username,
        password=settings.password,
        tls_context=settings.tls.context() if settings.tls else None,
        tls_insecure=settings.tls.insecure if settings.tls else None,
        keepalive=settings.keepalive_s,
        timeout=settings.timeout_s,
        will=will,
        max_queued_incoming_messages=max_queued_in,
    )


def jittered_backoff(min_s: float, max_s: float, rng: random.Random | None = None) -> Iterator[float]:
    """Delays before reconnect attempts: exponential up to max_s, each drawn uniformly in [d/2, d]."""
    rng = rng or random.Random()
    delay = min_s
    while True:
        yield rng.uniform(delay / 2, delay)
        delay = min(max_s, delay * 2)
