"""The live web view: WebSocket JSON, the pair API, bounded outboxes, and the page in a real headless Chromium."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from scipy.stats import norm

from streamcorr.engine.changes import ChangeEvent
from streamcorr.engine.core import Engine, EngineConfig
from streamcorr.engine.matrix import Snapshot
from streamcorr.errors import ConfigError, InputError
from streamcorr.publish.sinks import Sink
from streamcorr.publish.web import EVENT_QUEUE_LEN, WebView

# the README's screenshot is refreshed on request (STREAMCORR_SCREENSHOT=1), so test runs leave the tree clean
SCREENSHOT = Path(__file__).resolve().parents[2] / "bench" / "results" / "web_view.png"
T = TypeVar("T")


def _snapshot(seq: int, channels: list[str], mi: np.ndarray, t_ns: int | None = None) -> Snapshot:
    n = len(channels)
    age = np.full((n, n), 0.5)
    age[np.isnan(mi)] = np.inf
    t = t_ns if t_ns is not None else seq * 1_000_000_000
    return Snapshot(seq, t, time.time_ns(), tuple(channels), mi, age, np.where(np.isnan(mi), np.nan, 1.0))


def _random_mi(rng: np.random.Generator, n: int) -> np.ndarray:
    m = np.abs(rng.normal(0.05, 0.03, (n, n)))
    m = (m + m.T) / 2
    np.fill_diagonal(m, np.nan)
    return m


def _run(coro_fn: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(asyncio.wait_for(coro_fn(), 20))


async def _receive_json(ws: aiohttp.ClientWebSocketResponse, kind: str) -> dict[str, Any]:
    while True:
        msg = await asyncio.wait_for(ws.receive_json(), 5)
        if msg["kind"] == kind:
            return msg


# -- HTTP and WebSocket -------------------------------------------------------------------------------------
def test_ws_pushes_snapshot_event_and_status_json() -> None:
    """A connected client receives a snapshot (NaN and inf as null), an event and a status line, as JSON text
    frames in the envelope's words (kind, change, state, counters); each frame is counted per stream."""
    rng = np.random.default_rng(1)
    mi = _random_mi(rng, 3)

    async def main() -> None:
        async with WebView(port=0) as view, aiohttp.ClientSession() as http:
            assert view.url.startswith("http://127.0.0.1:")
            async with http.ws_connect(view.url + "/ws") as ws:
                await asyncio.sleep(0.05)  # let the server register the client
                await view.publish_snapshot(_snapshot(7, ["a", "b", "c"], mi))
                snap = await _receive_json(ws, "snapshot")
                assert snap["seq"] == 7 and snap["t_ns"] == 7_000_000_000 and snap["channels"] == ["a", "b", "c"]
                assert snap["mi"][0][0] is None and snap["age_s"][1][1] is None and snap["coverage"][2][2] is None
                np.testing.assert_allclose(snap["mi"][0][1], mi[0, 1], atol=1e-4)
                assert snap["age_s"][0][1] == 0.5 and snap["coverage"][0][1] == 1.0
                await view.publish_event(ChangeEvent(("a", "b"), 0.01, 0.8, 123, "became-dependent"))
                ev = await _receive_json(ws, "event")
                assert ev == {"kind": "event", "pair": ["a", "b"], "previous": 0.01, "current": 0.8,
                              "change": "became-dependent", "t_ns": 123, "initial": False, "onset_t_ns": None,
                              "path": "window"}  # fmt: skip
                await view.publish_status("online", {"hops": 3, "channels": 3, "healthy": 1, "src.samples_handed": 9,
                                                     "src.dropped": 2, "engine.dropped.late": 1})  # fmt: skip
                status = await _receive_json(ws, "status")
                assert status == {"kind": "status", "state": "online", "counters": {
                    "channels": 3, "hops": 3, "healthy": "yes", "samples_dropped": 3, "messages_lost": 0,
                    "output_errors": 0}}  # fmt: skip
                await asyncio.sleep(0.05)
                assert view.queue_depth == 0
            assert view.counters.sent == {"snapshot": 1, "pairs": 0, "event": 1, "status": 1}
            assert view.counters_dict()["messages_sent"] == 3 == view.counters.extra["messages_sent"]

    _run(main)


def test_ws_snapshot_carries_the_verdict_and_n_eff_and_events_initial() -> None:
    """A snapshot's dependent (bools) and n_eff (null where NaN) reach the client as nested lists, null when the
    snapshot lacks them; an initial event says so."""
    import dataclasses

    rng = np.random.default_rng(11)
    mi = _random_mi(rng, 3)
    dependent = np.array([[False, True, False], [True, False, False], [False, False, False]])
    n_eff = np.where(np.isnan(mi), np.nan, rng.uniform(20, 1000, (3, 3)))
    judged = dataclasses.replace(_snapshot(1, ["a", "b", "c"], mi), dependent=dependent, n_eff=n_eff)

    async def main() -> None:
        async with (
            WebView(port=0) as view,
            aiohttp.ClientSession() as http,
            http.ws_connect(view.url + "/ws") as ws,
        ):
            await asyncio.sleep(0.05)  # let the server register the client
            await view.publish_snapshot(judged)
            snap = await _receive_json(ws, "snapshot")
            assert snap["dependent"] == dependent.tolist()
            assert snap["n_eff"][0][0] is None and snap["n_eff"][0][1] == round(float(n_eff[0, 1]), 1)
            await view.publish_snapshot(_snapshot(2, ["a", "b", "c"], mi))
            plain = await _receive_json(ws, "snapshot")
            assert plain["dependent"] is None and plain["n_eff"] is None
            await view.publish_event(ChangeEvent(("a", "b"), 0.0, 0.8, 5, "became-dependent", initial=True))
            assert (await _receive_json(ws, "event"))["initial"] is True

    _run(main)


def test_api_pair_returns_history_and_table() -> None:
    """/api/pair returns the pair's MI over the snapshots seen (bounded to history_len) and table_fn's array."""
    rng = np.random.default_rng(2)
    table = rng.standard_normal((8, 8))
    calls: list[tuple[str, str]] = []

    def table_fn(a: str, b: str) -> np.ndarray | None:
        calls.append((a, b))
        return table if (a, b) == ("x", "y") else None

    async def main() -> None:
        async with WebView(port=0, history_len=4, table_fn=table_fn) as view, aiohttp.ClientSession() as http:
            values = []
            for seq in range(1, 7):
                mi = _random_mi(rng, 3)
                mi[0, 2] = mi[2, 0] = np.nan if seq == 5 else mi[0, 2]
                values.append(mi[0, 1])
                await view.publish_snapshot(_snapshot(seq, ["x", "y", "z"], mi))
            async with http.get(view.url + "/api/pair", params={"a": "x", "b": "y"}) as r:
                assert r.status == 200
                body = await r.json()
            assert body["history"]["t_ns"] == [k * 1_000_000_000 for k in (3, 4, 5, 6)]
            np.testing.assert_allclose(body["history"]["mi"], values[2:], atol=1e-4)
            assert body["grid"] == 8
            np.testing.assert_allclose(np.array(body["table"]), table, atol=1e-4)
            async with http.get(view.url + "/api/pair", params={"a": "x", "b": "z"}) as r:
                body = await r.json()
            assert body["table"] is None and body["history"]["mi"][2] is None  # seq 5 had no estimate
            assert calls == [("x", "y"), ("x", "z")]

    _run(main)


LAG_CHANNELS = ["drive.cmd", "drive.vel", "aux"]
LAG_S = 0.2  # drive.vel follows drive.cmd by this much


@pytest.fixture(scope="module")
def lagged_engine() -> Engine:
    """A real engine with lags on (±0.5 s at 100 Hz, window 256), fed 8 s where drive.vel repeats drive.cmd (a
    smooth AR(1) signal) 0.2 s later, plus noise, and aux is independent: its lag tracker holds every pair's curve."""
    rng = np.random.default_rng(70)
    rate, n, delay = 100.0, 800, round(LAG_S * 100)
    eng = Engine(EngineConfig(channels=LAG_CHANNELS, rate_hz=rate, window_len=256, hop_samples=100, max_lag_s=0.5,
                              skip_stale_hops=False, queue_size=1000))  # fmt: skip
    src, noise = np.zeros(n + 50), rng.standard_normal(n + 50)
    for k in range(1, n + 50):
        src[k] = 0.8 * src[k - 1] + noise[k]
    t = np.arange(n) / rate

    async def feed() -> None:
        await eng.start()
        eng.push("drive.cmd", t, src[50:])
        eng.push("drive.vel", t, src[50 - delay : n + 50 - delay] + 0.5 * rng.standard_normal(n))
        eng.push("aux", t, rng.standard_normal(n))
        await eng.flush()
        await eng.stop()

    asyncio.run(feed())
    assert eng.latest is not None and eng.lags is not None
    return eng


def _lag_fn(eng: Engine) -> Callable[[str, str], dict[str, Any] | None]:
    """The lag_fn the daemon and the demo give the view: the tracker's newest curve of the pair, as a dict."""

    def lag_fn(a: str, b: str) -> dict[str, Any] | None:
        curve = None if eng.lags is None else eng.lags.curve(a, b)
        return None if curve is None else curve.as_dict()

    return lag_fn


def test_api_pair_and_messages_carry_lead_and_lag(lagged_engine: Engine) -> None:
    """/api/pair's "lag" is lag_fn's curve in the order asked (drive.vel follows drive.cmd: +0.2 s, and -0.2 s
    asked the other way round; aux: searched, no significant lag), null without a lag_fn or lag_fn's error; the
    snapshot message carries lag_s (antisymmetric, null for NaN) and mi_lag, null when the snapshot lacks them;
    a lag-shift event carries its lags, other events none."""
    snap = lagged_engine.latest
    assert snap is not None and snap.lag_s is not None

    def broken(a: str, b: str) -> dict[str, Any]:
        return {"lag_s": float("nan")}

    async def main() -> None:
        async with (
            WebView(port=0, lag_fn=_lag_fn(lagged_engine)) as view,
            WebView(port=0) as plain,
            WebView(port=0, lag_fn=broken) as bad,
            aiohttp.ClientSession() as http,
            http.ws_connect(view.url + "/ws") as ws,
        ):
            await asyncio.sleep(0.05)  # let the server register the client
            for v in (view, plain, bad):
                await v.publish_snapshot(snap)
            msg = await _receive_json(ws, "snapshot")
            assert msg["lag_s"][0][1] == pytest.approx(LAG_S, abs=0.02) and msg["lag_s"][1][0] == -msg["lag_s"][0][1]
            assert msg["lag_s"][0][0] is None and msg["lag_s"][0][2] is None  # no significant lag with aux
            assert msg["mi_lag"][0][1] == msg["mi_lag"][1][0] > 0.5
            bodies = {}
            for a, b in (("drive.cmd", "drive.vel"), ("drive.vel", "drive.cmd"), ("drive.cmd", "aux")):
                async with http.get(view.url + "/api/pair", params={"a": a, "b": b}) as r:
                    assert r.status == 200
                    bodies[a, b] = (await r.json())["lag"]
            ahead, behind = bodies["drive.cmd", "drive.vel"], bodies["drive.vel", "drive.cmd"]
            assert ahead["lag_s"] == pytest.approx(LAG_S, abs=0.02) and behind["lag_s"] == -ahead["lag_s"]
            assert ahead["mi_lag"] > ahead["threshold"] and 0 < ahead["t_ns"] <= snap.t_ns  # searched every 2 s
            lags = np.array(ahead["lags_s"])
            assert lags[0] == -0.5 and lags[-1] == 0.5 and len(lags) == len(ahead["scan_mi"]) == 101
            assert np.all(np.diff(lags) > 0) and np.all(np.diff(behind["lags_s"]) > 0)
            k = int(np.argmax([v or 0.0 for v in ahead["scan_mi"]]))  # the scan peaks at the lag
            assert lags[k] == pytest.approx(LAG_S, abs=0.015)
            assert len(ahead["points_s"]) == len(ahead["points_mi"]) >= 1
            assert max(ahead["points_mi"]) == pytest.approx(ahead["mi_lag"], abs=1e-4)
            assert bodies["drive.cmd", "aux"]["lag_s"] is None and bodies["drive.cmd", "aux"]["threshold"] > 0
            for v in (plain, bad):
                async with http.get(v.url + "/api/pair", params={"a": "drive.cmd", "b": "drive.vel"}) as r:
                    body = await r.json()
                    assert r.status == 200 and body["lag"] is None
            assert "lag_error" not in (await (await http.get(plain.url + "/api/pair?a=aux&b=drive.cmd")).json())
            assert "lag_fn failed" in body["lag_error"]
            await view.publish_snapshot(_snapshot(2, LAG_CHANNELS, snap.mi))  # lags off
            off = await _receive_json(ws, "snapshot")
            assert off["lag_s"] is None and off["mi_lag"] is None
            shift = ChangeEvent(("drive.cmd", "drive.vel"), 1.1, 1.2, 9, "lag-shift", lag_s=0.3, previous_lag_s=0.1)
            await view.publish_event(shift)
            ev = await _receive_json(ws, "event")
            assert ev["change"] == "lag-shift" and ev["lag_s"] == 0.3 and ev["previous_lag_s"] == 0.1
            await view.publish_event(ChangeEvent(("drive.cmd", "aux"), 0.0, 0.5, 10, "rise"))
            assert "lag_s" not in await _receive_json(ws, "event")

    _run(main)


def test_api_pair_reports_bad_requests_and_table_failures() -> None:
    """Missing or unknown names get 400/404; a failing or misshapen table_fn gives a table_error, never a 500."""
    rng = np.random.default_rng(3)

    def table_fn(a: str, b: str) -> np.ndarray | None:
        if a == "a":
            raise RuntimeError("model not loaded")
        return np.zeros((3, 4))

    async def main() -> None:
        async with WebView(port=0, table_fn=table_fn) as view, aiohttp.ClientSession() as http:
            await view.publish_snapshot(_snapshot(1, ["a", "b", "c"], _random_mi(rng, 3)))
            url = view.url + "/api/pair"
            async with http.get(url, params={"a": "a"}) as r:
                assert r.status == 400 and "a=NAME&b=NAME" in (await r.json())["error"]
            async with http.get(url, params={"a": "a", "b": "nope"}) as r:
                assert r.status == 404 and "nope" in (await r.json())["error"]
            async with http.get(url, params={"a": "a", "b": "b"}) as r:
                body = await r.json()
                assert r.status == 200 and body["table"] is None and "model not loaded" in body["table_error"]
                assert len(body["history"]["mi"]) == 1
            async with http.get(url, params={"a": "b", "b": "c"}) as r:
                body = await r.json()
                assert r.status == 200 and "(3, 4)" in body["table_error"]
            assert view.counters_dict()["bad_requests"] == 2 and view.counters_dict()["table_errors"] == 2

    _run(main)


def test_slow_client_gets_only_newest_snapshot() -> None:
    """Snapshots published faster than a client reads replace the unsent one: it gets the newest, drops counted."""
    rng = np.random.default_rng(4)

    async def main() -> None:
        async with WebView(port=0) as view, aiohttp.ClientSession() as http:
            async with http.ws_connect(view.url + "/ws") as ws:
                await asyncio.sleep(0.05)
                for seq in range(1, 11):  # publish_* never yield: the sender does not run in between
                    await view.publish_snapshot(_snapshot(seq, ["a", "b"], _random_mi(rng, 2)))
                for k in range(EVENT_QUEUE_LEN + 5):
                    await view.publish_event(ChangeEvent(("a", "b"), 0.0, float(k), k, "rise"))
                assert view.queue_depth == EVENT_QUEUE_LEN + 1
                first = await asyncio.wait_for(ws.receive_json(), 5)
                assert first["kind"] == "event" and first["t_ns"] == 5  # the oldest five were dropped
                for _ in range(EVENT_QUEUE_LEN - 1):
                    assert (await asyncio.wait_for(ws.receive_json(), 5))["kind"] == "event"
                snap = await _receive_json(ws, "snapshot")
                assert snap["seq"] == 10
            ledger = view.counters_dict()
            assert ledger["snapshots_dropped"] == 9 and ledger["events_dropped"] == 5
            assert view.counters.dropped == {"snapshot": 9, "pairs": 0, "event": 5, "status": 0}

    _run(main)


def test_late_client_gets_latest_state_and_recent_events() -> None:
    """A client connecting after publishing gets the latest snapshot, the recent events and the latest stats."""
    rng = np.random.default_rng(5)

    async def main() -> None:
        async with WebView(port=0) as view, aiohttp.ClientSession() as http:
            await view.publish_snapshot(_snapshot(1, ["a", "b"], _random_mi(rng, 2)))
            await view.publish_snapshot(_snapshot(2, ["a", "b"], _random_mi(rng, 2)))
            await view.publish_event(ChangeEvent(("a", "b"), 0.0, 0.5, 1, "became-dependent"))
            await view.publish_status("online", {"hops": 1})
            async with http.ws_connect(view.url + "/ws") as ws:
                kinds = [(await asyncio.wait_for(ws.receive_json(), 5)) for _ in range(3)]
            assert [m["kind"] for m in kinds] == ["event", "snapshot", "status"]
            assert kinds[1]["seq"] == 2
            assert view.counters_dict()["snapshots_dropped"] == 0  # nothing is encoded or queued while nobody listens

    _run(main)


def test_clients_over_limit_are_rejected_and_counted() -> None:
    """With max_clients=1 a second WebSocket gets HTTP 503 and the rejection is counted."""
    np.random.default_rng(6)

    async def main() -> None:
        async with WebView(port=0, max_clients=1) as view, aiohttp.ClientSession() as http:
            async with http.ws_connect(view.url + "/ws"):
                await asyncio.sleep(0.05)
                with pytest.raises(aiohttp.WSServerHandshakeError) as exc:
                    await http.ws_connect(view.url + "/ws")
                assert exc.value.status == 503
            assert view.counters_dict()["clients_rejected"] == 1
            await asyncio.sleep(0.05)
            assert view.counters_dict()["clients"] == 0

    _run(main)


def test_bad_status_and_config_are_refused_and_counted() -> None:
    """A status line JSON cannot carry (NaN, an object) raises InputError and counts a dropped status; a
    "kind" key in it cannot reroute the message; bad constructor values raise ConfigError."""
    np.random.default_rng(7)
    view = WebView(port=0, status_line=dict)  # the counters as they are: the page shows each one
    for bad in ({"x": object()}, {"x": float("nan")}):
        with pytest.raises(InputError):
            _run(lambda bad=bad: view.publish_status("online", bad))
    assert view._latest_status_text is None and view.counters.dropped["status"] == 2
    _run(lambda: view.publish_status("online", {"kind": "event", "hops": 3}))
    msg = {"kind": "status", "state": "online", "counters": {"kind": "event", "hops": 3}}
    assert json.loads(view._latest_status_text or "{}") == msg
    for kw in (
        {"port": -1},
        {"history_len": 0},
        {"max_clients": 0},
        {"table_fn": 3},
        {"lag_fn": 3},
        {"status_line": 3},
    ):
        with pytest.raises(ConfigError):
            WebView(**kw)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def _attached(view: WebView, app: web.Application | None = None) -> AsyncIterator[tuple[web.AppRunner, str]]:
    """The view attached to an aiohttp app of its own (as the daemon mounts it), served on a free port."""
    app = app or web.Application()
    view.attach(app)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner, f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def test_attach_mounts_on_existing_app_and_page_is_offline() -> None:
    """attach() adds the view beside the daemon's own routes; the page and its assets reference nothing external."""
    np.random.default_rng(8)

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/healthz", healthz)
        view = WebView()
        async with _attached(view, app) as (runner, base), aiohttp.ClientSession() as http:
            async with http.get(base + "/healthz") as r:
                assert await r.text() == "ok"
            texts = []
            for path in ("/", "/static/app.js", "/static/app.css"):
                async with http.get(base + path) as r:
                    assert r.status == 200, path
                    texts.append(await r.text())
            assert '<canvas id="heatmap"' in texts[0]
            for text in texts:
                assert not re.search(r"(src|href)=[\"']?(https?:)?//", text)  # no CDN, works offline
                assert "https://" not in text and "http://" not in text
            async with http.ws_connect(base + "/ws") as ws:
                await asyncio.sleep(0.05)
                assert view.counters_dict()["clients"] == 1
                await runner.cleanup()  # the app's shutdown closes the view's clients
                msg = await asyncio.wait_for(ws.receive(), 5)
                assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)

    _run(main)


def test_attached_view_is_a_sink_started_and_stopped_by_its_owner() -> None:
    """As a Sink on someone else's app: start() binds nothing (no url) and makes problem() None; stop() closes
    the clients, turns later ones away (503, counted) and problem() says why; the ledger's names are unchanged."""
    np.random.default_rng(11)

    async def main() -> None:
        view = WebView()
        async with _attached(view) as (_, base):
            assert isinstance(view, Sink) and view.problem() == "web view not started"
            ws_url = base + "/ws"
            await view.start()
            assert view.problem() is None and view.queue_depth == 0
            with pytest.raises(RuntimeError):
                _ = view.url  # attached: the application's listener, not one of the view's own
            async with aiohttp.ClientSession() as http, http.ws_connect(ws_url) as ws:
                await asyncio.sleep(0.05)
                await view.stop()
                msg = await asyncio.wait_for(ws.receive(), 5)
                assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
                with pytest.raises(aiohttp.WSServerHandshakeError) as exc:
                    await http.ws_connect(ws_url)
                assert exc.value.status == 503
            assert view.problem() == "web view stopped"
            assert list(view.counters_dict()) == [
                "clients", "clients_total", "clients_rejected", "clients_timed_out", "messages_sent",
                "snapshots_dropped", "stats_dropped", "events_dropped", "bad_requests", "table_errors", "table_busy",
                "queued_bytes",
            ]  # fmt: skip
            assert view.counters_dict()["clients_rejected"] == 1 and view.counters.extra == view.counters_dict()

    _run(main)


# -- the page in a real browser ------------------------------------------------------------------------------
class _ViewThread:
    """A WebView served from its own event loop in a background thread (playwright's sync API owns the test's)."""

    def __init__(self, view: WebView) -> None:
        self.view = view
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)  # type: ignore[arg-type]

    def call(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        async def wrapper() -> None:
            await fn(*args)

        self.run(wrapper())

    def close(self) -> None:
        self.run(self.view.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


ARM_CHANNELS = [
    "arm.j1.gyro", "arm.j1.torque", "arm.j2.gyro", "arm.j2.torque", "arm.j3.gyro", "arm.j3.torque",
    "base.imu.ax", "base.imu.gz", "gripper.force", "gripper.pos", "mains.current", "cabinet.temp",
]  # fmt: skip
STRONG = {("arm.j1.gyro", "arm.j2.gyro"): 1.3, ("arm.j2.torque", "arm.j3.torque"): 0.9,
          ("gripper.force", "arm.j3.torque"): 0.6, ("mains.current", "arm.j1.torque"): 0.45}  # fmt: skip


def _arm_mi(rng: np.random.Generator, drift: float) -> np.ndarray:
    idx = {c: k for k, c in enumerate(ARM_CHANNELS)}
    mi = _random_mi(rng, len(ARM_CHANNELS))
    for (a, b), v in STRONG.items():
        mi[idx[a], idx[b]] = mi[idx[b], idx[a]] = v + drift + rng.normal(0, 0.02)
    k = idx["cabinet.temp"]  # a slow channel with no estimate yet: grey cells
    mi[k, :] = mi[:, k] = np.nan
    return mi


def _gaussian_theta(a: str, b: str) -> np.ndarray | None:
    """θ of a Gaussian copula with the pair's strength: the log density ratio on a 64-node rank grid, clipped
    to ±5 nats like the shipped model's tables (whose tails are bounded by what one window can show)."""
    if "cabinet.temp" in (a, b):
        return None
    mi = STRONG.get((a, b), STRONG.get((b, a), 0.03))
    rho = np.sqrt(1 - np.exp(-2 * mi))  # Gaussian MI = -0.5 log(1 - rho^2)
    z = norm.ppf((np.arange(64) + 0.5) / 64)
    x, y = np.meshgrid(z, z, indexing="ij")  # (G, G)
    log_ratio = -0.5 * np.log(1 - rho**2) - (rho**2 * (x**2 + y**2) - 2 * rho * x * y) / (2 * (1 - rho**2))
    return np.clip(log_ratio, -5.0, 5.0)


@contextlib.contextmanager
def _page_on(chromium: Any, view: WebView, height: int = 820) -> Iterator[tuple[_ViewThread, Any]]:
    """The view started and served from a background loop, and a Chromium page; both closed afterwards."""
    served = _ViewThread(view)
    page = chromium.new_page(viewport={"width": 1280, "height": height})
    try:
        served.run(view.start())
        yield served, page
    finally:
        page.close()
        with contextlib.suppress(Exception):  # a test may have stopped the server itself
            served.close()


def _hover_cell(page: Any, i: int, j: int) -> None:
    """Move the mouse over heatmap cell (i, j), by the geometry the page publishes on the canvas."""
    geo = page.eval_on_selector("#heatmap", "c => ({x0: +c.dataset.x0, y0: +c.dataset.y0, cell: +c.dataset.cell})")
    box = page.locator("#heatmap").bounding_box()
    page.mouse.move(box["x"] + geo["x0"] + (j + 0.5) * geo["cell"], box["y"] + geo["y0"] + (i + 0.5) * geo["cell"])


def test_screened_cells_are_marked_in_chromium(chromium: Any) -> None:
    """Cells holding the screen's figure (snapshot source 2) carry a corner mark that network estimates lack,
    the legend explains it, and the detail line of such a pair says it is not a network estimate."""
    import dataclasses

    rng = np.random.default_rng(19)
    with _page_on(chromium, WebView(port=0, table_fn=_gaussian_theta)) as (served, page):
        view = served.view
        n = len(ARM_CHANNELS)
        mi = _arm_mi(rng, 0.0)
        source = np.ones((n, n), dtype=np.uint8)
        screened = rng.uniform(size=(n, n)) < 0.4
        screened = np.triu(screened, 1) | np.triu(screened, 1).T
        source[screened] = 2
        np.fill_diagonal(source, 0)
        snap = dataclasses.replace(_snapshot(1, ARM_CHANNELS, mi), source=source)
        served.call(view.publish_snapshot, snap)
        page.goto(view.url + "/")
        page.wait_for_selector("#heatmap[data-seq='1']", timeout=5000)
        assert int(page.get_attribute("#heatmap", "data-screened") or -1) == int(screened.sum())
        corner_js = """([i, j]) => {
            const c = document.getElementById('heatmap'), d = c.dataset, r = window.devicePixelRatio || 1;
            const x = (+d.x0 + j * +d.cell + 1) * r, y = (+d.y0 + i * +d.cell + 1) * r;
            return Array.from(c.getContext('2d').getImageData(Math.floor(x), Math.floor(y), 1, 1).data).slice(0, 3);
        }"""
        mark = [0xC8, 0xCE, 0xD6]
        si, sj = map(int, np.argwhere(screened)[0])
        ni, nj = map(int, np.argwhere(np.triu(source == 1, 1))[0])
        assert page.evaluate(corner_js, [si, sj]) == mark and page.evaluate(corner_js, [ni, nj]) != mark
        assert page.get_attribute("#legend", "data-screen") == "true"
        _hover_cell(page, si, sj)
        page.wait_for_selector("#detail-meta[data-source='2']", timeout=5000)
        assert "screen figure" in page.inner_text("#detail-meta")
        _hover_cell(page, ni, nj)
        page.wait_for_selector("#detail-meta[data-source='1']", timeout=5000)
        assert "network estimate" in page.inner_text("#detail-meta")


def test_cells_not_significant_are_hatched_and_hover_shows_n_eff_in_chromium(chromium: Any) -> None:
    """Cells with MI the detector does not find dependent are drawn dimmed and hatched (darker than a dependent
    cell of the same MI), the legend explains them, the hover line gives the verdict and n_eff, and an initial
    event is listed as initial."""
    import dataclasses

    rng = np.random.default_rng(20)
    with _page_on(chromium, WebView(port=0, table_fn=_gaussian_theta)) as (served, page):
        view = served.view
        n = len(ARM_CHANNELS)
        mi = _arm_mi(rng, 0.0)
        dep_pair = (ARM_CHANNELS.index("arm.j1.gyro"), ARM_CHANNELS.index("arm.j2.gyro"))
        ns_pair = (ARM_CHANNELS.index("gripper.force"), ARM_CHANNELS.index("arm.j3.torque"))
        for i, j in (dep_pair, ns_pair):  # the same MI: only the verdict differs
            mi[i, j] = mi[j, i] = 0.6
        dependent = np.triu(rng.uniform(size=(n, n)) < 0.5, 1)
        dependent = dependent | dependent.T
        dependent[dep_pair] = dependent[dep_pair[::-1]] = True
        dependent[ns_pair] = dependent[ns_pair[::-1]] = False
        n_eff = np.where(np.isnan(mi), np.nan, 812.0)
        n_eff[ns_pair] = n_eff[ns_pair[::-1]] = 640.0
        snap = dataclasses.replace(_snapshot(1, ARM_CHANNELS, mi), dependent=dependent, n_eff=n_eff)
        served.call(view.publish_snapshot, snap)
        page.goto(view.url + "/")
        page.wait_for_selector("#heatmap[data-seq='1']", timeout=5000)
        expected = int((~dependent & np.isfinite(mi)).sum())
        assert int(page.get_attribute("#heatmap", "data-insignificant") or -1) == expected
        assert page.get_attribute("#legend", "data-insignificant") == "true"
        color_js = """([i, j]) => {
            const c = document.getElementById('heatmap'), d = c.dataset, r = window.devicePixelRatio || 1;
            const px = [];  // a 5 x 5 patch around the centre: the mean colour, hatch stripes included
            for (let dy = -2; dy <= 2; dy++) for (let dx = -2; dx <= 2; dx++) {
                const x = (+d.x0 + (j + 0.5) * +d.cell) * r + dx, y = (+d.y0 + (i + 0.5) * +d.cell) * r + dy;
                px.push(Array.from(c.getContext('2d').getImageData(Math.floor(x), Math.floor(y), 1, 1).data));
            }
            return px.reduce((s, p) => s + 0.3 * p[0] + 0.59 * p[1] + 0.11 * p[2], 0) / px.length;
        }"""
        if int(page.get_attribute("#heatmap", "data-cell") or 0) >= 34:  # numbers drawn: sample beside them
            color_js = color_js.replace("(i + 0.5)", "(i + 0.2)")
        lit, dim = page.evaluate(color_js, list(dep_pair)), page.evaluate(color_js, list(ns_pair))
        assert dim < 0.8 * lit, (lit, dim)
        _hover_cell(page, *ns_pair)
        page.wait_for_selector("#detail-meta[data-dependent='false']", timeout=5000)
        assert "not significant" in page.inner_text("#detail-meta") and "n_eff 640" in page.inner_text("#detail-meta")
        _hover_cell(page, *dep_pair)
        page.wait_for_selector("#detail-meta[data-dependent='true']", timeout=5000)
        assert "· dependent" in page.inner_text("#detail-meta") and "n_eff 812" in page.inner_text("#detail-meta")
        served.call(view.publish_event, ChangeEvent(("arm.j1.gyro", "arm.j2.gyro"), 0.0, 0.6, 1, "became-dependent",
                                                    initial=True))  # fmt: skip
        page.wait_for_selector("#events li[data-initial='1']", timeout=5000)
        assert "became-dependent (initial)" in page.inner_text("#events li[data-initial='1']")


def test_a_fast_event_flashes_its_cell_and_says_when_it_began_in_chromium(chromium: Any) -> None:
    """A change event outlines its pair's cell at once (no new snapshot needed), the outline goes after a few
    seconds, and the event list says how long before detection the change began and that the fast path saw it."""
    rng = np.random.default_rng(21)
    with _page_on(chromium, WebView(port=0, table_fn=_gaussian_theta)) as (served, page):
        view = served.view
        served.call(view.publish_snapshot, _snapshot(1, ARM_CHANNELS, _arm_mi(rng, 0.0)))
        page.goto(view.url + "/")
        page.wait_for_selector("#heatmap[data-seq='1'][data-flashing='0']", timeout=5000)
        i, j = ARM_CHANNELS.index("arm.j2.torque"), ARM_CHANNELS.index("arm.j3.torque")
        outline_js = """([i, j]) => {
            const c = document.getElementById('heatmap'), d = c.dataset, r = window.devicePixelRatio || 1;
            const x = (+d.x0 + j * +d.cell + 2) * r, y = (+d.y0 + (i + 0.5) * +d.cell) * r;
            return Array.from(c.getContext('2d').getImageData(Math.floor(x), Math.floor(y), 1, 1).data).slice(0, 3);
        }"""
        before = page.evaluate(outline_js, [i, j])
        t0 = time.monotonic()
        ev = ChangeEvent(("arm.j2.torque", "arm.j3.torque"), 0.9, 0.02, 5_400_000_000, "became-independent",
                         onset_t_ns=4_200_000_000, path="fast")  # fmt: skip
        served.call(view.publish_event, ev)
        page.wait_for_selector("#heatmap[data-flashing='1']", timeout=5000)
        assert time.monotonic() - t0 < 1.0  # within the second
        assert page.evaluate(outline_js, [i, j]) == [0xFF, 0x9F, 0x1C] != before
        item = page.inner_text("#events li[data-path='fast']")
        assert "became-independent" in item and "began 1.2 s before (fast)" in item
        page.wait_for_selector("#heatmap[data-flashing='0']", timeout=8000)
        assert page.evaluate(outline_js, [i, j]) == before


def test_page_updates_live_in_chromium(chromium: Any, tmp_path: Path) -> None:
    """In headless Chromium the heatmap follows snapshots, events list newest first, hover shows the pair's
    detail and table, the page reconnects after the server restarts; the page is captured as a screenshot."""
    rng = np.random.default_rng(9)
    with _page_on(chromium, WebView(port=0, table_fn=_gaussian_theta)) as (served, page):
        view = served.view
        t0 = time.time_ns() - 60_000_000_000
        seq = 0

        def publish(drift: float = 0.0) -> np.ndarray:
            nonlocal seq
            seq += 1
            mi = _arm_mi(rng, drift)
            served.call(view.publish_snapshot, _snapshot(seq, ARM_CHANNELS, mi, t0 + seq * 2_000_000_000))
            return mi

        for k in range(20):  # some history before the page opens
            publish(0.1 * np.sin(k / 3))
        page.goto(view.url + "/")
        page.wait_for_selector("#heatmap[data-seq='20']", timeout=5000)
        assert page.inner_text("#nch") == "12 channels"

        i, j = ARM_CHANNELS.index("arm.j1.gyro"), ARM_CHANNELS.index("arm.j2.gyro")
        color_js = """([i, j]) => {
            const c = document.getElementById('heatmap'), d = c.dataset, r = window.devicePixelRatio || 1;
            const x = (+d.x0 + (j + 0.5) * +d.cell) * r, y = (+d.y0 + (i + 0.5) * +d.cell) * r;
            return Array.from(c.getContext('2d').getImageData(Math.floor(x) - 8, Math.floor(y), 1, 1).data);
        }"""  # sampled left of the centre, away from the number drawn in the cell
        strong = page.evaluate(color_js, [i, j])
        weak = page.evaluate(color_js, [0, ARM_CHANNELS.index("base.imu.ax")])
        grey = page.evaluate(color_js, [0, ARM_CHANNELS.index("cabinet.temp")])
        assert strong != weak and grey[:3] == [0x4A, 0x50, 0x5A]  # NaN cells are the fixed grey

        mi = _arm_mi(rng, 0.0)
        mi[i, j] = mi[j, i] = 0.02  # the strong pair collapses: its cell must recolour
        seq += 1
        served.call(view.publish_snapshot, _snapshot(seq, ARM_CHANNELS, mi, t0 + seq * 2_000_000_000))
        page.wait_for_selector(f"#heatmap[data-seq='{seq}']", timeout=5000)
        assert page.evaluate(color_js, [i, j]) != strong

        ev_t = t0 + seq * 2_000_000_000
        served.call(
            view.publish_event, ChangeEvent(("arm.j1.gyro", "arm.j2.gyro"), 1.3, 0.02, ev_t, "became-independent")
        )
        served.call(view.publish_event, ChangeEvent(("gripper.force", "arm.j3.torque"), 0.6, 0.95, ev_t, "rise"))
        page.wait_for_selector("#events li[data-change='rise']", timeout=5000)
        items = page.locator("#events li")
        assert items.count() == 2
        assert "gripper.force × arm.j3.torque" in items.nth(0).inner_text()  # newest first
        assert "became-independent" in items.nth(1).inner_text()

        a, b = "arm.j2.torque", "arm.j3.torque"
        ia, ib = ARM_CHANNELS.index(a), ARM_CHANNELS.index(b)
        _hover_cell(page, ia, ib)
        page.wait_for_selector(f"#table[data-pair='{a}|{b}'][data-grid='64']", timeout=5000)
        assert page.inner_text("#detail-pair") == f"{a} × {b}"
        assert page.inner_text("#detail-mi") == f"{round(mi[ia, ib], 4):.3f} nats"
        assert int(page.get_attribute("#spark", "data-points") or 0) == seq  # the view's history, all kept
        assert f"rank of {a}" in page.inner_text("#table-note")

        served.run(view.stop())  # the server goes away: the page says so, then reconnects by itself
        page.wait_for_selector("#status[data-state='closed']", timeout=5000)
        served.run(view.start())  # same port: start() recorded the one it bound
        page.wait_for_selector("#status[data-state='live']", timeout=8000)
        for k in range(3):
            publish(0.05 * k)
        for pair, previous, current, dt_s in [(("mains.current", "arm.j1.torque"), 0.05, 0.45, 0),
                                              (("arm.j1.gyro", "arm.j2.gyro"), 0.02, 1.3, 6)]:  # fmt: skip
            ev = ChangeEvent(pair, previous, current, ev_t + dt_s * 1_000_000_000, "became-dependent")
            served.call(view.publish_event, ev)
        served.call(view.publish_status, "online", {"channels": 12, "hops": seq, "pairs_evaluated": 66 * seq})
        page.wait_for_selector(f"#heatmap[data-seq='{seq}']", timeout=5000)
        page.wait_for_selector("#stats[data-state='online'] span[data-key='pairs_evaluated']", timeout=5000)
        assert page.locator("#events li").count() == 4  # replayed on reconnect (2) plus the two new ones
        page.mouse.move(0, 0)  # the detail stays on the last hovered pair
        shot = SCREENSHOT if os.environ.get("STREAMCORR_SCREENSHOT") == "1" else tmp_path / "web_view.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.read_bytes()[:4] == b"\x89PNG"


def test_page_renders_64_channels_quickly(chromium: Any) -> None:
    """With 64 channels (2016 pairs) the page renders each snapshot in well under the 1 s snapshot period."""
    rng = np.random.default_rng(10)
    channels = [f"cell{k // 8}.j{k % 8}.gyro" for k in range(64)]
    import dataclasses

    def judged(seq: int) -> Snapshot:  # half the cells not significant: hatched, the slowest cells to draw
        dependent = np.triu(rng.uniform(size=(64, 64)) < 0.5, 1)
        snap = _snapshot(seq, channels, _random_mi(rng, 64))
        return dataclasses.replace(snap, dependent=dependent | dependent.T, n_eff=np.full((64, 64), 500.0))

    with _page_on(chromium, WebView(port=0), height=1000) as (served, page):
        served.call(served.view.publish_snapshot, judged(1))
        page.goto(served.view.url + "/")
        page.wait_for_selector("#heatmap[data-seq='1'][data-n='64']", timeout=5000)
        render_ms = []
        for seq in range(2, 12):
            served.call(served.view.publish_snapshot, judged(seq))
            page.wait_for_selector(f"#heatmap[data-seq='{seq}']", timeout=5000)
            render_ms.append(float(page.get_attribute("#heatmap", "data-render-ms") or "nan"))
        assert int(page.get_attribute("#heatmap", "data-cell") or 0) >= 6  # every cell is still visible
        # 250 ms: a quarter of the snapshot period, loose for a shared 2-core machine (typically ~10 ms)
        assert max(render_ms) < 250, render_ms


def test_hovering_a_lagged_pair_shows_its_lag_curve_and_leader_in_chromium(
    chromium: Any, lagged_engine: Engine
) -> None:
    """With lags on, hovering a pair shows its MI-against-lag curve (the scan, the network's dots, the reported
    lag) and says which channel leads, the same whichever of its two cells is hovered; the detail line gives the
    signed lag, a pair without a significant lag says so, and a lag-shift event reads as the lag's move."""
    snap = lagged_engine.latest
    assert snap is not None
    cmd, vel, aux = (LAG_CHANNELS.index(c) for c in ("drive.cmd", "drive.vel", "aux"))
    ink_js = """() => {  // pixels of the curve's canvas that are not the panel's background
        const c = document.getElementById('lag'), d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0;
        for (let k = 0; k < d.length; k += 4) n += d[k + 3] > 0 ? 1 : 0;
        return n;
    }"""
    with _page_on(chromium, WebView(port=0, lag_fn=_lag_fn(lagged_engine))) as (served, page):
        view = served.view
        served.call(view.publish_snapshot, snap)
        page.goto(view.url + "/")
        page.wait_for_selector(f"#heatmap[data-seq='{snap.seq}']", timeout=5000)
        assert not page.is_visible("#lag-box")  # nothing hovered yet
        for i, j, sign in ((cmd, vel, 1), (vel, cmd, -1)):
            _hover_cell(page, i, j)
            pair = f"{LAG_CHANNELS[i]}|{LAG_CHANNELS[j]}"
            page.wait_for_selector(f"#lag[data-pair='{pair}'][data-points='3']", timeout=5000)
            assert page.is_visible("#lag-box") and page.evaluate(ink_js) > 500
            lag_s = float(page.get_attribute("#lag", "data-lag-s") or "nan")
            assert sign * lag_s == pytest.approx(LAG_S, abs=0.02)
            note = page.inner_text("#lag-note")
            m = re.search(r"drive\.vel follows drive\.cmd by (\d+) ms", note)
            assert m is not None and abs(int(m.group(1)) - 1000 * LAG_S) <= 20, note
            assert f"lag {'+' if sign > 0 else '−'}{m.group(1)} ms" in page.inner_text("#detail-meta")
        _hover_cell(page, cmd, aux)
        page.wait_for_selector("#lag[data-pair='drive.cmd|aux'][data-lag-s='']", timeout=5000)
        assert "no significant lag" in page.inner_text("#lag-note")
        ev = ChangeEvent(("drive.cmd", "drive.vel"), 1.1, 1.2, 9, "lag-shift", lag_s=0.3, previous_lag_s=0.1)
        served.call(view.publish_event, ev)
        page.wait_for_selector("#events li[data-change='lag-shift']", timeout=5000)
        item = page.inner_text("#events li[data-change='lag-shift']")
        assert "lag 0.10 s → 0.30 s (drive.vel follows drive.cmd by 300 ms)" in item, item
