"""Live terminal view of the engine: MI heatmap, latest change events, rates and drops (rich).

``render(snapshot, events, stats)`` builds one frame; ``TerminalView`` redraws it
in place with ``rich.live.Live`` at most ``refresh_hz`` times a second, or, when
the console is not a terminal (a pipe, a log file), prints one compact line per
snapshot and one per event instead.

Colours encode the informational coefficient of correlation
r_I = sqrt(1 - exp(-2 MI)) (Linfoot): it maps nats onto [0, 1) and equals |rho|
for a Gaussian pair, so the scale reads the same for 0.05 and 2 nats.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from rich.color import Color
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.style import Style
from rich.table import Table
from rich.text import Text

from ..engine.changes import ChangeEvent
from ..engine.matrix import Snapshot
from ..errors import ConfigError

__all__ = ["TerminalView", "compact_line", "mi_colour", "render", "short_labels"]

_CELL_W = 4  # a space and three characters: ".4", "1.7", "2.9"
NAN_CELL = " ░░░"  # never evaluated, or not enough coverage: MI is NaN
# Perceptually ordered anchors (dark blue -> teal -> green -> yellow): low MI recedes, high MI stands out.
_ANCHORS = np.array([(38, 24, 80), (49, 84, 140), (33, 145, 140), (94, 201, 98), (253, 231, 37)], dtype=float)
_LEGEND_NATS = (0.0, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0)
_EVENT_STYLE = {"became-dependent": "bold green", "became-independent": "bold red", "rise": "yellow", "fall": "cyan"}
_EVENT_MARK = {"became-dependent": "+", "became-independent": "-", "rise": "↑", "fall": "↓"}


def info_coefficient(mi: float) -> float:
    """Linfoot's informational coefficient of correlation, sqrt(1 - exp(-2 MI)), in [0, 1)."""
    return math.sqrt(1.0 - math.exp(-2.0 * max(mi, 0.0)))


def mi_colour(mi: float) -> Color:
    """Heatmap colour of an MI value in nats (see the module docstring for the scale)."""
    u = info_coefficient(mi) * (len(_ANCHORS) - 1)
    k = min(int(u), len(_ANCHORS) - 2)
    rgb = _ANCHORS[k] + (u - k) * (_ANCHORS[k + 1] - _ANCHORS[k])
    r, g, b = (round(float(c)) for c in rgb)
    return Color.from_rgb(r, g, b)


def _strip_common(names: Sequence[str]) -> list[str]:
    """Drop dot-separated segments that every name shares at its start or end (each name keeps at least one)."""
    segs = [n.split(".") for n in names]
    if len(segs) < 2:
        return list(names)
    shortest = min(len(s) for s in segs)
    pre = 0
    while pre < shortest - 1 and len({s[pre] for s in segs}) == 1:
        pre += 1
    post = 0
    while post < shortest - 1 - pre and len({s[-1 - post] for s in segs}) == 1:
        post += 1
    return [".".join(s[pre : len(s) - post]) for s in segs]


def short_labels(names: Sequence[str], width: int = 12) -> list[str]:
    """Unique labels of at most `width` characters for a matrix's rows.

    Segments every name shares (``plant.`` ... ``.temperature``) are dropped; names that still do not fit keep a
    head and a longer tail (sensor names usually differ at the end); clashes get a numbered suffix.

    >>> short_labels(["motor.temperature.winding", "motor.temperature.bearing", "fan"], width=12)
    ['mot~.winding', 'mot~.bearing', 'fan']
    >>> short_labels(["plant.line1.temp", "plant.line2.temp"], width=8)
    ['line1', 'line2']
    >>> short_labels(["rack1.sensor.temp", "rack2.sensor.temp", "rack3.sensor.temp"], width=4)
    ['r~k1', 'r~k2', 'r~k3']
    """
    if width < 4:
        raise ConfigError(f"label width must be >= 4 characters; got {width}")
    head = max(1, (width - 1) // 3)
    out: list[str] = []
    used: set[str] = set()
    for name in _strip_common(names):
        label = name if len(name) <= width else name[:head] + "~" + name[-(width - head - 1) :]
        n = 1
        base = label
        while label in used:
            n += 1
            suffix = f"#{n}"
            label = base[: width - len(suffix)] + suffix
        used.add(label)
        out.append(label)
    return out


def _cell(mi: float, blind: bool) -> Text:
    if not math.isfinite(mi):
        return Text(NAN_CELL, style="grey50 on grey11")
    value = "" if mi < 0.05 else f"{mi:.1f}".removeprefix("0")[: _CELL_W - 1]
    base = Style(color="white" if info_coefficient(mi) < 0.75 else "black", bgcolor=mi_colour(mi))
    cell = Text(" " * (_CELL_W - len(value)), style=base)
    cell.append(value, style=base + Style(bold=True, underline=True) if blind else base)
    return cell


def _blind_mask(snapshot: Snapshot, pearson: np.ndarray | None, blind_mi: float, blind_r: float) -> np.ndarray:
    n = len(snapshot.channels)
    if pearson is None or np.shape(pearson) != (n, n):
        return np.zeros((n, n), dtype=bool)
    with np.errstate(invalid="ignore"):
        return (np.abs(pearson) < blind_r) & (snapshot.mi >= blind_mi)


def _heatmap(snapshot: Snapshot, blind: np.ndarray, label_w: int) -> Table:
    names = snapshot.channels
    labels = short_labels(names, label_w)
    table = Table.grid(padding=(0, 0))
    table.add_column(justify="right", no_wrap=True)
    for _ in names:
        table.add_column(width=_CELL_W, no_wrap=True)
    header = [Text("")] + [Text(f"{k + 1:>{_CELL_W}}", style="dim") for k in range(len(names))]
    table.add_row(*header)
    for i, label in enumerate(labels):
        row: list[Text] = [Text(f"{label} {i + 1:>2} ", style="bold")]
        for j in range(len(names)):
            row.append(
                Text(" ╲".ljust(_CELL_W), style="grey30")
                if i == j
                else _cell(float(snapshot.mi[i, j]), bool(blind[i, j]))
            )
        table.add_row(*row)
    return table


def _legend() -> Text:
    t = Text("MI (nats) ")
    for v in _LEGEND_NATS:
        t.append(
            f" {v:g} ", style=Style(color="white" if info_coefficient(v) < 0.75 else "black", bgcolor=mi_colour(v))
        )
    t.append("  ")
    t.append(NAN_CELL.strip(), style="grey50 on grey11")
    t.append(" not evaluated   ")
    t.append("1.2", style=Style(bold=True, underline=True))
    t.append(" Pearson-blind (|r| small, MI high)")
    return t


def _blind_line(snapshot: Snapshot, pearson: np.ndarray | None, blind: np.ndarray, limit: int = 4) -> Text | None:
    if pearson is None or not blind.any():
        return None
    picked = [(i, j, mi) for i, j, mi in snapshot.top_pairs() if blind[i, j]]
    t = Text("Pearson-blind: ", style="bold")
    names = snapshot.channels
    for n, (i, j, mi) in enumerate(picked[:limit]):
        t.append(f"{'; ' if n else ''}{names[i]} ~ {names[j]} MI {mi:.2f} r {pearson[i, j]:+.2f}")
    if len(picked) > limit:
        t.append(f"; +{len(picked) - limit} more")
    return t


def _events_table(events: Iterable[ChangeEvent], limit: int) -> Table:
    table = Table(title="latest change events (newest first)", title_justify="left", box=None, padding=(0, 1))
    for col, justify in (("t (s)", "right"), ("kind", "left"), ("pair", "left"), ("nats", "right")):
        table.add_column(col, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    shown = 0
    for ev in events:
        if shown >= limit:
            break
        style = _EVENT_STYLE.get(ev.kind, "")
        table.add_row(
            f"{ev.t_ns / 1e9:.1f}",
            Text(
                ev.kind + (" (initial)" if ev.initial else "") + (" (fast)" if ev.path == "fast" else ""), style=style
            ),
            f"{ev.pair[0]} ~ {ev.pair[1]}",
            f"{ev.previous:.2f} → {ev.current:.2f}",
        )
        shown += 1
    if shown == 0:
        table.add_row("", Text("none yet", style="dim"), "", "")
    return table


def _drops(value: Any) -> str:
    if isinstance(value, Mapping):
        total = sum(int(v) for v in value.values())
        detail = ", ".join(f"{k} {int(v)}" for k, v in value.items() if int(v))
        return f"{total}" + (f" ({detail})" if detail else "")
    return f"{int(value)}"


def _stats_line(snapshot: Snapshot | None, stats: Mapping[str, Any]) -> Text:
    parts: list[str] = []
    if snapshot is not None:
        n = len(snapshot.channels)
        finite_age = snapshot.age_s[np.isfinite(snapshot.age_s)]
        parts += [f"seq {snapshot.seq}", f"t {snapshot.t_ns / 1e9:.1f} s", f"{n} channels"]
        if finite_age.size:
            parts.append(f"oldest cell {float(finite_age.max()):.1f} s")
    for key, label, fmt in (("pairs_per_s", "pairs/s", "{:.0f}"), ("samples_per_s", "samples/s", "{:.0f}")):
        if key in stats:
            parts.append(f"{label} {fmt.format(float(stats[key]))}")
    if "drops" in stats:
        parts.append(f"drops {_drops(stats['drops'])}")
    for key, value in stats.items():  # anything else the caller wants shown, if it is a plain scalar
        if key not in ("pairs_per_s", "samples_per_s", "drops", "pearson", "title") and isinstance(value, int | float):
            parts.append(f"{key} {value:g}")
    return Text(" | ".join(parts), style="bold")


def render(
    snapshot: Snapshot | None,
    events: Iterable[ChangeEvent] = (),
    stats: Mapping[str, Any] | None = None,
    *,
    max_events: int = 8,
    label_width: int = 12,
    blind_mi: float = 0.2,
    blind_r: float = 0.1,
) -> RenderableType:
    """One frame: heatmap of snapshot.mi with labels and legend, events (give them newest first), stats.

    stats keys, all optional: ``pairs_per_s``, ``samples_per_s``, ``drops`` (int or {name: count}),
    ``pearson`` ((N, N) Pearson r in snapshot.channels order, for the Pearson-blind marker), ``title``;
    other int/float entries are shown by name.
    """
    stats = stats or {}
    title = Text(str(stats.get("title", "streamcorr: live mutual information")), style="bold underline")
    parts: list[RenderableType] = [title, _stats_line(snapshot, stats)]
    if snapshot is None:
        parts.append(Text("waiting for the first snapshot…", style="dim"))
    else:
        pearson = stats.get("pearson")
        pearson_arr = None if pearson is None else np.asarray(pearson, dtype=float)
        blind = _blind_mask(snapshot, pearson_arr, blind_mi, blind_r)
        parts += [_heatmap(snapshot, blind, label_width), _legend()]
        line = _blind_line(snapshot, pearson_arr, blind)
        if line is not None:
            parts.append(line)
    parts.append(_events_table(events, max_events))
    return Group(*parts)


def compact_line(snapshot: Snapshot, stats: Mapping[str, Any] | None = None, top: int = 3) -> str:
    """One line per snapshot for logs and pipes: sequence, stream time, strongest pairs, rates, drops."""
    stats = stats or {}
    names = snapshot.channels
    # threshold 0: a slightly negative estimate is noise around independence, not a strong pair
    strongest = ", ".join(f"{names[i]}~{names[j]} {mi:.2f}" for i, j, mi in snapshot.top_pairs(top, threshold=0.0))
    ii, jj = np.triu_indices(len(names), 1)
    n_nan = int(np.isnan(snapshot.mi[ii, jj]).sum())
    line = f"seq={snapshot.seq} t={snapshot.t_ns / 1e9:.1f}s top: {strongest or '-'}"
    if n_nan:
        line += f" nan={n_nan}"
    for key, label in (("pairs_per_s", "pairs/s"), ("samples_per_s", "samples/s")):
        if key in stats:
            line += f" {label}={float(stats[key]):.0f}"
    if "drops" in stats:
        line += f" drops={_drops(stats['drops']).split(' ')[0]}"
    return line


class TerminalView:
    """Redraws `render(...)` in place, at most refresh_hz times a second; line mode when not a terminal.

    >>> import io
    >>> view = TerminalView(Console(file=io.StringIO(), width=100), refresh_hz=10)
    >>> view.live_mode
    False
    >>> with view:
    ...     view.update(stats={"samples_per_s": 1000})
    >>> view.snapshots_seen, view.events_seen
    (0, 0)
    """

    def __init__(
        self,
        console: Console | None = None,
        *,
        refresh_hz: float = 4.0,
        max_events: int = 8,
        live: bool | None = None,
        label_width: int = 12,
    ) -> None:
        if not refresh_hz > 0:
            raise ConfigError(f"refresh_hz must be > 0; got {refresh_hz}")
        if max_events < 1:
            raise ConfigError(f"max_events must be >= 1; got {max_events}")
        self.console = console or Console()
        self.refresh_hz = refresh_hz
        self.max_events = max_events
        self.label_width = label_width
        self.live_mode = self.console.is_terminal if live is None else live
        self.snapshot: Snapshot | None = None
        self.stats: dict[str, Any] = {}
        self.events: deque[ChangeEvent] = deque(maxlen=max_events)  # newest first; older ones fall off
        self.snapshots_seen = 0
        self.events_seen = 0
        self.redraws = 0
        self.redraws_skipped = 0  # updates folded into a later redraw by the refresh limit
        self._live: Live | None = None
        self._last_draw = -math.inf
        self._pending = False

    def frame(self) -> RenderableType:
        """The current frame, as `render` builds it."""
        return render(self.snapshot, self.events, self.stats, max_events=self.max_events, label_width=self.label_width)

    # -- lifecycle -------------------------------------------------------------------------------------
    def __enter__(self) -> TerminalView:
        if self.live_mode and self._live is None:
            self._live = Live(self.frame(), console=self.console, auto_refresh=False, redirect_stderr=False)
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            if self._pending:
                self._draw()
            self._live.stop()
            self._live = None

    # -- updates ---------------------------------------------------------------------------------------
    def update(
        self,
        *,
        snapshot: Snapshot | None = None,
        event: ChangeEvent | None = None,
        stats: Mapping[str, Any] | None = None,
    ) -> None:
        """Record new state; redraw if the refresh limit allows (live), or print its line (line mode)."""
        if stats is not None:
            self.stats = dict(stats)
        if event is not None:
            self.events.appendleft(event)
            self.events_seen += 1
            if not self.live_mode:
                self.console.print(self._event_line(event), highlight=False, soft_wrap=True)
        if snapshot is not None:
            self.snapshot = snapshot
            self.snapshots_seen += 1
            if not self.live_mode:
                self.console.print(compact_line(snapshot, self.stats), highlight=False, soft_wrap=True)
        if self.live_mode:
            self._pending = True
            if time.monotonic() - self._last_draw >= 1.0 / self.refresh_hz:
                self._draw()
            else:
                self.redraws_skipped += 1

    def _draw(self) -> None:
        self._last_draw = time.monotonic()
        self._pending = False
        self.redraws += 1
        if self._live is not None:
            self._live.update(self.frame(), refresh=True)

    @staticmethod
    def _event_line(ev: ChangeEvent) -> Text:
        t = Text(f"event t={ev.t_ns / 1e9:.1f}s ")
        t.append(f"{_EVENT_MARK.get(ev.kind, ev.kind)} {ev.kind}", style=_EVENT_STYLE.get(ev.kind, ""))
        t.append(f" {ev.pair[0]}~{ev.pair[1]} {ev.previous:.2f}->{ev.current:.2f}")
        if ev.initial:
            t.append(" (initial: dependent when first assessed)", style="dim")
        if ev.onset_t_ns is not None:
            fast = " (fast path)" if ev.path == "fast" else ""
            t.append(f" began {(ev.t_ns - ev.onset_t_ns) / 1e9:.1f}s before{fast}", style="dim")
        return t

    async def run(
        self,
        snapshots: AsyncIterator[Snapshot],
        events: AsyncIterator[ChangeEvent] | None = None,
        stats: Any = None,
    ) -> None:
        """Show snapshots and events as they arrive, until both iterators end (or the task is cancelled).

        ``stats`` is an optional zero-argument callable returning the stats mapping, polled at each snapshot.
        """

        async def pump_snapshots() -> None:
            async for snap in snapshots:
                self.update(snapshot=snap, stats=stats() if callable(stats) else None)

        async def pump_events() -> None:
            if events is not None:
                async for ev in events:
                    self.update(event=ev)

        with self:
            await asyncio.gather(pump_snapshots(), pump_events())
