"""Which sockets a configuration opens beyond loopback (``streamcorr check`` and the daemon's start-up warn of each)."""

from __future__ import annotations

import ipaddress
import logging

from ..config import Config

__all__ = ["exposed_listeners", "warn_exposed"]

_LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost", "lo"})


def _is_loopback(host: str) -> bool:
    h = host.strip().strip("[]").lower()
    if h in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:  # "*", "0.0.0.0"-like names, a hostname or an interface: assume reachable
        return False


def _tcp_host(endpoint: str) -> str | None:
    """The host part of a tcp:// endpoint (``*``, an address, an interface name); None for ipc/inproc."""
    if not endpoint.startswith("tcp://"):
        return None
    return endpoint[len("tcp://") :].rsplit(":", 1)[0]


def exposed_listeners(cfg: Config) -> list[str]:
    """One line per socket this configuration opens beyond loopback, naming the key and what it exposes."""
    out = []
    fix = "set it to 127.0.0.1 unless other hosts must reach it (docs/security.md)"
    h = cfg.http
    if h.enabled and not _is_loopback(h.host):
        what = "/metrics, /healthz" + (" and the web view" if h.web else "")
        out.append(f"http.host {h.host!r} serves {what} on port {h.port} to every host that can reach it: {fix}")
    z = cfg.outputs.zmq
    if z is not None:
        host = _tcp_host(z.endpoint)
        if z.bind and host is not None and not _is_loopback(host):
            out.append(f"outputs.zmq.endpoint {z.endpoint!r} publishes snapshots and events beyond loopback: {fix}")
        host = _tcp_host(z.snapshot_endpoint) if z.snapshot_endpoint else None
        if host is not None and not _is_loopback(host):
            out.append(f"outputs.zmq.snapshot_endpoint {z.snapshot_endpoint!r} answers anyone who asks: {fix}")
    for k, src in enumerate(cfg.sources):
        if src.type == "zmq" and src.bind:
            host = _tcp_host(src.endpoint)
            if host is not None and not _is_loopback(host):
                out.append(f"sources.{k}.endpoint {src.endpoint!r} accepts samples from any host: {fix}")
    return out


def warn_exposed(cfg: Config, log: logging.Logger) -> None:
    """One warning per socket the configuration opens beyond loopback."""
    for line in exposed_listeners(cfg):
        log.warning("listening beyond loopback: %s", line)
