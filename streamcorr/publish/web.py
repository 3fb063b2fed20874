"""The live web view, a :class:`~streamcorr.publish.sinks.Sink`: one HTML page, a WebSocket of snapshots,
events and status, and a pair-detail API.

Routes (mounted by :meth:`WebView.attach` on any aiohttp application, or served by :meth:`WebView.start`):

- ``GET /``              the page (``static/index.html``; scripts and styles under ``/static/``, nothing external)
- ``GET /ws``            JSON text messages, one per frame, in the envelope's words (:mod:`.envelope`):
  ``kind`` is ``"snapshot"`` (matrices as nested lists, null for NaN; ``dependent``, ``n_eff``, ``lag_s`` and
  ``mi_lag`` null when the snapshot lacks them), ``"event"`` (its ``change``: rise, fall, ..., lag-shift;
  ``initial``, ``onset_t_ns``, ``path``, and for a lag-shift ``lag_s`` and ``previous_lag_s``; the page outlines
  the pair's cell for 3 s as it arrives) or ``"status"`` (``state`` and ``counters``, the page's status line:
  ``status_line(counters)``, by default :func:`web_summary`)
- ``GET /api/pair?a=&b=`` the pair's MI history (from the snapshots this view has seen), its lookup table θ and
  ``lag``: ``lag_fn(a, b)``, the newest MI-against-lag curve (``LagCurve.as_dict()``), null: no lag_fn or search

Every client has its own outbox, bounded in bytes (``max_queue_bytes``, counting the frame being written):
the newest snapshot and the newest status replace unsent ones (a slow client skips frames, it never falls
behind); events queue up to ``EVENT_QUEUE_LEN``, and the oldest are dropped while the outbox is over its bytes.
The newest snapshot and status are always kept, so a client holds at most ``max(max_queue_bytes, the frame
being written + the newest snapshot + the newest status)`` (messages are ASCII JSON: characters are bytes).
A client stuck on one frame for ``SEND_TIMEOUT_S`` is closed, and its outbox freed. Every drop is counted in
:attr:`WebView.counters` (per stream, and in its ``extra`` ledger, with ``queued_bytes`` over all clients).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import WSMsgType, web

from ..config import Http
from ..engine.changes import ChangeEvent
from ..engine.matrix import Snapshot
from ..errors import ConfigError, InputError
from ..logutil import RateLimitedLog
from .outbox import EVENT_QUEUE_LEN, Outbox
from .sinks import SinkCounters, return_free_memory

log = logging.getLogger("streamcorr.publish.web")

__all__ = ["EVENT_QUEUE_LEN", "WebView", "web_summary"]

STATIC_DIR = Path(__file__).with_name("static")
RECENT_EVENTS = 50  # replayed to a client when it (re)connects, so its list is not empty
SEND_TIMEOUT_S = 10.0  # a client that cannot take one frame in this long is disconnected
DEFAULT_QUEUE_BYTES: int = Http.model_fields["web_max_queue_bytes"].default  # 8 MiB; 256 channels: 2 MiB a snapshot
MAX_TABLE_REQUESTS = 4  # table_fn calls running or waiting; more get 503 (each costs tens of ms of model time)

TableFn = Callable[[str, str], np.ndarray | None]
LagFn = Callable[[str, str], Mapping[str, Any] | None]  # cheap (a lookup): called on the event loop
StatusLine = Callable[[Mapping[str, float | int]], Mapping[str, float | int | str]]

# The view's own ledger, kept in SinkCounters.extra; counters_dict() returns it (the daemon's /metrics names).
# clients: connected now; rejected: over max_clients, or after stop(); timed_out: stuck SEND_TIMEOUT_S on one frame;
# snapshots/stats (status) dropped: replaced before sent; events dropped: oldest, from a full outbox; /api/pair:
# bad_requests (missing or unknown names), table_errors (table_fn raised, or not (G, G)), table_busy (answered 503);
# queued_bytes: waiting in the outboxes now, frames being written included (a gauge).
LEDGER = ("clients", "clients_total", "clients_rejected", "clients_timed_out", "messages_sent", "snapshots_dropped",
          "stats_dropped", "events_dropped", "bad_requests", "table_errors", "table_busy", "queued_bytes")  # fmt: skip


def web_summary(counters: Mapping[str, float | int]) -> dict[str, float | int | str]:
    """The web page's status line: the headline numbers and the losses summed (/metrics has each one)."""
    headline = ("channels", "hops", "hops_skipped", "pairs_evaluated", "publish_lag_s")
    out: dict[str, float | int | str] = {k: counters[k] for k in headline if k in counters}
    out["healthy"] = "yes" if counters.get("healthy") else "no"
    sources = {k.split(".", 1)[0] for k in counters if k.endswith(".samples_handed")}
    out["samples_dropped"] = sum(counters.get(f"{s}.dropped", 0) for s in sources) + sum(
        v for k, v in counters.items() if k.startswith("engine.dropped.")
    )
    out["messages_lost"] = sum(counters.get(f"{s}.seq_gaps", 0) for s in sources)
    out["output_errors"] = sum(v for k, v in counters.items() if k.startswith("output.") and ".errors." in k)
    return out


def _finite_list(a: np.ndarray, decimals: int) -> list[Any]:
    """Nested lists of rounded floats, None where not finite (JSON has no NaN or inf)."""
    rounded = np.round(np.asarray(a, dtype=np.float64), decimals)
    finite = np.isfinite(rounded)
    if finite.all():
        return rounded.tolist()
    obj = rounded.astype(object)
    obj[~finite] = None
    return obj.tolist()


def snapshot_message(snap: Snapshot) -> dict[str, Any]:
    """The WebSocket form of a snapshot: MI in nats (4 decimals), None for NaN (and for never-refreshed ages)."""
    return {
        "kind": "snapshot",
        "seq": snap.seq,
        "t_ns": snap.t_ns,
        "wall_ns": snap.wall_ns,
        "channels": list(snap.channels),
        "mi": _finite_list(snap.mi, 4),
        "age_s": _finite_list(snap.age_s, 3),
        "coverage": _finite_list(snap.coverage, 3),
        # per cell: 0 never assessed, 1 network estimate, 2 the screen's figure; None from older publishers
        "source": None if snap.source is None else np.asarray(snap.source, dtype=np.uint8).tolist(),
        # per cell: the change detector's verdict and the effective sample size (None where NaN); None: not sent
        "dependent": None if snap.dependent is None else np.asarray(snap.dependent, dtype=bool).tolist(),
        "n_eff": None if snap.n_eff is None else _finite_list(snap.n_eff, 1),
        # lead and lag (lags on): [i][j] > 0 when channel j follows channel i, seconds; the MI there; None: off
        "lag_s": None if snap.lag_s is None else _finite_list(snap.lag_s, 4),
        "mi_lag": None if snap.mi_lag is None else _finite_list(snap.mi_lag, 4),
    }


def event_message(ev: ChangeEvent) -> dict[str, Any]:
    """The WebSocket form of a change event: MI in nats (4 decimals), None where not finite; lag_s and
    previous_lag_s (seconds, > 0: the pair's second channel follows the first) on a lag-shift only."""
    previous, current = (_rounded(x, 4) for x in (ev.previous, ev.current))
    msg = dict(kind="event", pair=list(ev.pair), previous=previous, current=current, change=ev.kind, t_ns=ev.t_ns,
               initial=bool(ev.initial), onset_t_ns=ev.onset_t_ns, path=ev.path)  # fmt: skip
    if ev.lag_s is not None:
        msg["lag_s"], msg["previous_lag_s"] = _rounded(ev.lag_s, 5), _rounded(ev.previous_lag_s, 5)
    return msg


def _rounded(x: float | None, decimals: int) -> float | None:  # None where not finite
    return round(float(x), decimals) if x is not None and math.isfinite(x) else None


def _dumps(msg: dict[str, Any]) -> str:
    return json.dumps(msg, separators=(",", ":"), allow_nan=False)


class _History:
    """The last ``maxlen`` snapshots' MI matrices (float32), so any cell's history can be read back."""

    def __init__(self, maxlen: int) -> None:
        # (t_ns, channel name -> row, MI): consecutive snapshots with the same channels share one index
        self.entries: collections.deque[tuple[int, dict[str, int], np.ndarray]] = collections.deque(maxlen=maxlen)
        self._channels: tuple[str, ...] | None = None
        self._index: dict[str, int] = {}

    def add(self, snap: Snapshot) -> None:
        if snap.channels != self._channels:
            self._channels, self._index = snap.channels, {name: k for k, name in enumerate(snap.channels)}
        self.entries.append((snap.t_ns, self._index, np.asarray(snap.mi, dtype=np.float32)))

    def pair(self, a: str, b: str) -> tuple[list[int], list[float | None]]:
        times: list[int] = []
        values: list[float | None] = []
        for t_ns, index, mi in self.entries:
            i, j = index.get(a), index.get(b)
            if i is not None and j is not None:
                v = float(mi[i, j])
                times.append(t_ns)
                values.append(round(v, 4) if math.isfinite(v) else None)
        return times, values

    def known(self, name: str) -> bool:
        return bool(self.entries) and name in self.entries[-1][1]


class WebView:
    """A live browser view of the MI matrix, served by aiohttp; a :class:`~streamcorr.publish.sinks.Sink`.

    Run it standalone (``async with WebView(port=0) as view: ...``, then open ``view.url``) or mount it on
    the daemon's application with :meth:`attach` before :meth:`start`. ``publish_*`` never wait for a client
    and must be called from the event loop that serves the view. ``status_line`` turns the counters of
    ``publish_status`` into the page's status line (by default :func:`web_summary`, for the daemon's counters).

    >>> import asyncio
    >>> async def main():
    ...     async with WebView(port=0) as view:
    ...         await view.publish_snapshot(Snapshot(1, 0, 0, ("a", "b"), np.array([[np.nan, 0.5], [0.5, np.nan]]),
    ...                                              np.zeros((2, 2)), np.ones((2, 2))))
    ...         return view.url.startswith("http://127.0.0.1:"), view.pair_history("a", "b"), view.problem()
    >>> asyncio.run(main())
    (True, ([0], [0.5]), None)
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 8050,
        history_len: int = 300,
        table_fn: TableFn | None = None,
        lag_fn: LagFn | None = None,
        max_clients: int = 16,
        max_queue_bytes: int = DEFAULT_QUEUE_BYTES,
        header_timeout_s: float = 10.0,
        status_line: StatusLine = web_summary,
    ) -> None:
        if not 0 <= port <= 65535:
            raise ConfigError(f"port must be in 0..65535 (0 picks a free one); got {port}")
        if history_len < 1:
            raise ConfigError(f"history_len must be >= 1 snapshot; got {history_len}")
        if max_clients < 1:
            raise ConfigError(f"max_clients must be >= 1; got {max_clients}")
        if max_queue_bytes < 1:
            raise ConfigError(f"max_queue_bytes must be a positive number of bytes per client; got {max_queue_bytes}")
        for name, fn in (("table_fn", table_fn), ("lag_fn", lag_fn), ("status_line", status_line)):
            if fn is not None and not callable(fn):
                raise ConfigError(f"{name} must be a function (see WebView's parameters); got {fn!r}")
        self.host = host
        self.port = port
        self.history_len = history_len
        self.table_fn = table_fn
        self.lag_fn = lag_fn  # (a, b) -> the pair's lag curve as a JSON-ready dict, or None (see the module docstring)
        self.max_clients = max_clients
        self.max_queue_bytes = max_queue_bytes  # per client (see the module docstring)
        self.header_timeout_s = header_timeout_s  # standalone server: time to send a request's headers
        self.status_line = status_line
        self.counters = SinkCounters(extra=dict.fromkeys(LEDGER, 0))
        self._history = _History(history_len)
        self._outboxes: dict[web.WebSocketResponse, Outbox] = {}
        self._latest_snapshot: Snapshot | None = None
        self._latest_snapshot_text: str | None = None  # encoded lazily: no clients, no encoding
        self._latest_status_text: str | None = None
        self._recent_events: collections.deque[str] = collections.deque(maxlen=RECENT_EVENTS)
        self._table_requests = 0
        self._attached = False  # mounted on someone else's application: start() binds nothing
        self._state = "not started"  # "serving", then "stopped"
        self._runner: web.AppRunner | None = None
        self._guard: Any = None  # HttpGuard of the standalone server
        self._warn = RateLimitedLog(log)
        self._url: str | None = None

    @property
    def url(self) -> str:
        """``http://host:port`` of the running standalone server (after :meth:`start`)."""
        if self._url is None:
            raise RuntimeError("WebView is not serving standalone: call start() (or use it with `async with`)")
        return self._url

    # -- the Sink protocol: publishing (event loop) ---------------------------------------------------
    async def publish_snapshot(self, snap: Snapshot) -> None:
        """Record the snapshot in the history and hand it to every client (replacing any unsent one)."""
        self._history.add(snap)
        self._latest_snapshot = snap
        self._latest_snapshot_text = None
        if self._outboxes:
            text = self._snapshot_text()
            for box in self._outboxes.values():
                box.put_latest("snapshot", text)

    async def publish_event(self, ev: ChangeEvent) -> None:
        """Hand a change event to every client; also kept among the recent events replayed on connect."""
        text = _dumps(event_message(ev))
        self._recent_events.append(text)
        for box in self._outboxes.values():
            box.put_event(text)

    async def publish_status(self, state: str, counters: Mapping[str, float | int]) -> None:
        """Hand ``status_line(counters)`` to every client; one JSON cannot carry (NaN) is counted, InputError."""
        try:
            text = _dumps({"kind": "status", "state": state, "counters": dict(self.status_line(counters))})
        except (TypeError, ValueError) as exc:
            self.counters.dropped["status"] += 1
            raise InputError(f"web view: status line not published: {exc}") from exc
        self._latest_status_text = text
        for box in self._outboxes.values():
            box.put_latest("status", text)

    def problem(self) -> str | None:
        """Why the view cannot publish now ("web view not started" / "web view stopped"); None while serving."""
        return None if self._state == "serving" else f"web view {self._state}"

    @property
    def queue_depth(self) -> int:
        """Messages waiting in the clients' outboxes."""
        return sum(len(box) for box in self._outboxes.values())

    def counters_dict(self) -> dict[str, int]:
        """The view's own ledger (``counters.extra``) as a plain dict, for /metrics."""
        return {name: int(self.counters.extra[name]) for name in LEDGER}

    def pair_history(self, a: str, b: str) -> tuple[list[int], list[float | None]]:
        """(t_ns, MI nats or None) of the pair over the snapshots kept, oldest first."""
        return self._history.pair(a, b)

    def _snapshot_text(self) -> str:
        if self._latest_snapshot_text is None:
            assert self._latest_snapshot is not None
            self._latest_snapshot_text = _dumps(snapshot_message(self._latest_snapshot))
        return self._latest_snapshot_text

    # -- serving ----------------------------------------------------------------------------------------
    def attach(self, app: web.Application) -> None:
        """Serve the routes on ``app`` (closing clients on its shutdown) instead of start()'s own listener."""
        self._attached = True
        self._mount(app)

    def _mount(self, app: web.Application) -> None:
        app.router.add_get("/", self._index)
        app.router.add_get("/ws", self._ws)
        app.router.add_get("/api/pair", self._pair)
        app.router.add_static("/static/", STATIC_DIR, follow_symlinks=False)
        app.on_shutdown.append(self._close_clients)

    async def start(self) -> None:
        """Serve on ``host:port`` (0: a free port; see :attr:`url`); when attached, the application serves it."""
        if self._runner is not None:
            raise RuntimeError("WebView already started")
        if self._attached:
            self._state = "serving"
            return
        from ..transport.http import HttpGuard  # the daemon's bounds: connections, and time to send headers

        self._guard = HttpGuard(max_connections=4 * self.max_clients + 16, header_timeout_s=self.header_timeout_s)
        app = web.Application(middlewares=[self._guard.middleware])
        self._mount(app)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        try:
            self.port = await self._guard.listen(runner.server, self.host, self.port)
        except OSError as exc:
            await runner.cleanup()
            raise ConfigError(f"cannot listen on {self.host}:{self.port}: {exc} (pick another port, or 0)") from exc
        self._runner = runner
        self._state = "serving"
        host = f"[{self.host}]" if ":" in self.host else self.host
        self._url = f"http://{host}:{self.port}"
        log.info("web view on %s", self._url)

    async def stop(self) -> None:
        """Close every client, and the listener when standalone; attached, later clients are turned away."""
        self._state = "stopped" if self._state == "serving" else self._state
        if self._runner is not None:
            await self._runner.cleanup()  # runs on_shutdown -> _close_clients
            self._runner = None
            self._url = None
        await self._close_clients()
        if self._guard is not None:
            await self._guard.close()
            self._guard = None

    async def __aenter__(self) -> WebView:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _close_clients(self, _app: web.Application | None = None) -> None:
        for ws in list(self._outboxes):
            with contextlib.suppress(Exception):
                await ws.close(code=1001, message=b"server shutting down")

    async def _index(self, _request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    async def _ws(self, request: web.Request) -> web.StreamResponse:
        ledger, stopped = self.counters.extra, self._state == "stopped"
        if stopped or len(self._outboxes) >= self.max_clients:
            ledger["clients_rejected"] += 1
            why = "web view stopped" if stopped else f"too many clients (max_clients={self.max_clients})"
            self._warn.warning("clients", "web view: client %s rejected: %s", request.remote, why)
            return web.json_response({"error": why}, status=503)
        # Clients only listen: a small frame limit keeps a misbehaving one from costing memory. No deflate:
        # it would compress every snapshot once per client on the engine's CPU.
        ws = web.WebSocketResponse(heartbeat=20.0, max_msg_size=4096, compress=False)
        await ws.prepare(request)
        box = Outbox(self.counters, self.max_queue_bytes)
        if self._latest_snapshot is not None:
            box.put_latest("snapshot", self._snapshot_text())
        for text in self._recent_events:
            box.put_event(text)
        if self._latest_status_text is not None:
            box.put_latest("status", self._latest_status_text)
        self._outboxes[ws] = box
        ledger["clients"] = len(self._outboxes)
        ledger["clients_total"] += 1
        sender = asyncio.create_task(self._send_loop(ws, box))
        try:
            async for msg in ws:  # reading keeps pings and close frames flowing; client text is ignored
                if msg.type == WSMsgType.ERROR:
                    break
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
            self._outboxes.pop(ws, None)
            ledger["clients"] = len(self._outboxes)
            box.clear()
            return_free_memory()  # a slow client's frames were freed: give the pages back
        return ws

    async def _send_loop(self, ws: web.WebSocketResponse, box: Outbox) -> None:
        while not ws.closed:
            await box.ready.wait()
            item = box.take()
            if item is None:
                continue
            stream, text = item
            try:
                await asyncio.wait_for(ws.send_str(text), SEND_TIMEOUT_S)
            except TimeoutError:
                self.counters.extra["clients_timed_out"] += 1
                self._warn.warning("timeout", "web view: client stuck for %.0f s, closing", SEND_TIMEOUT_S)
                await ws.close(code=1008, message=b"too slow")
                return
            except (ConnectionError, RuntimeError):  # closed under us: the reader's finally cleans up
                return
            finally:
                box.written(text)
            self.counters.sent[stream] += 1
            self.counters.extra["messages_sent"] += 1

    async def _pair(self, request: web.Request) -> web.Response:
        a, b = request.query.get("a"), request.query.get("b")
        if not a or not b:
            self.counters.extra["bad_requests"] += 1
            return web.json_response({"error": "give both channel names: /api/pair?a=NAME&b=NAME"}, status=400)
        unknown = [name for name in (a, b) if not self._history.known(name)]
        if unknown:
            self.counters.extra["bad_requests"] += 1
            return web.json_response({"error": f"unknown channel(s) {unknown} in the latest snapshot"}, status=404)
        times, values = self._history.pair(a, b)
        body: dict[str, Any] = {"a": a, "b": b, "history": {"t_ns": times, "mi": values}, "table": None}
        body.update(self._lag(a, b))
        if self.table_fn is not None:
            if self._table_requests >= MAX_TABLE_REQUESTS:
                self.counters.extra["table_busy"] += 1
                return web.json_response({**body, "error": "table computations busy; retry"}, status=503)
            self._table_requests += 1
            try:
                body.update(await self._table(a, b))
            finally:
                self._table_requests -= 1
        return web.json_response(body, dumps=_dumps)

    def _lag(self, a: str, b: str) -> dict[str, Any]:
        try:
            lag = None if self.lag_fn is None else self.lag_fn(a, b)
            _dumps({"lag": lag})  # a value JSON cannot carry (NaN, an object): the lag_fn's fault, not a 500
        except Exception as exc:
            self._warn.warning("lag", "lag_fn(%r, %r) failed: %r", a, b, exc)
            return {"lag": None, "lag_error": f"lag_fn failed: {exc!r}"}
        return {"lag": None if lag is None else dict(lag)}

    async def _table(self, a: str, b: str) -> dict[str, Any]:
        assert self.table_fn is not None
        try:
            table = await asyncio.get_running_loop().run_in_executor(None, self.table_fn, a, b)
        except Exception as exc:  # the model's problem must not take the page down; report it to the page
            self.counters.extra["table_errors"] += 1
            self._warn.warning("table", "table_fn(%r, %r) failed: %r", a, b, exc)
            return {"table_error": f"table_fn failed: {exc!r}"}
        if table is None:
            return {}
        arr = np.asarray(table, dtype=np.float64)
        if arr.ndim != 2 or arr.shape[0] != arr.shape[1] or arr.shape[0] < 2:
            self.counters.extra["table_errors"] += 1
            self._warn.warning("table_shape", "table_fn(%r, %r) returned shape %s, not (G, G)", a, b, arr.shape)
            return {"table_error": f"table_fn returned shape {arr.shape}; expected (G, G)"}
        return {"table": _finite_list(arr, 4), "grid": arr.shape[0]}
