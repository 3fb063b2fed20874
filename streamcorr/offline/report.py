"""`streamcorr report OUTDIR -o report.html`: one self-contained HTML file from a replay's output directory
(or an ``outputs.record`` directory: its ``timeline-*.parquet`` and ``events-*.parquet`` files).

Contract: the file needs nothing else to open (no script, style sheet, font or image is fetched: styles are
inline and every figure is inline SVG, so it opens offline and from an e-mail attachment); every name from
the log is HTML-escaped. It shows

* the MI matrix at chosen instants (``at``: stream times; default four instants spread over the replay), cells
  the change detector did not find dependent hatched (not significant), n_eff in each cell's tooltip,
* MI over time for the ``top`` strongest pairs (by their largest MI) and for every pair with events, with the
  events marked on each line (hollow: ``initial``, dependent from the pair's first assessment) and a band
  under the line where the pair was dependent; each caption gives its share of hops dependent and last n_eff,
* each pair's best lag over time, where the replay searched lags (``--max-lag-s``; none: no section): the ``top``
  pairs by MI at their lag and every pair with a ``lag-shift`` event, the shifts marked,
* every event on one timeline and in a table (time, pair, change, previous -> current, initial marked),
* the model's lookup table of the pairs replay kept (``tables.json``: pairs with events, then the strongest).

Reads ``timeline.parquet``, ``events.parquet``, ``replay.json`` and, when present, ``tables.json``. Output
without the ``dependent`` / ``n_eff`` columns (written before they existed) is drawn without those marks.
"""

from __future__ import annotations

import html
import itertools
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from .outfiles import write_file
from .report_input import load_output
from .report_theta import table_figure

__all__ = ["time_ticks", "write_report"]

# magma, reversed: light is independent, dark is strong
_STOPS = [(0.0, (252, 253, 191)), (0.25, (252, 137, 97)), (0.5, (183, 55, 121)), (0.75, (81, 18, 124)),
          (1.0, (0, 0, 4))]  # fmt: skip
_KIND_COLOR = {"became-dependent": "#c0392b", "became-independent": "#2471a3", "rise": "#e67e22", "fall": "#17a589",
               "lag-shift": "#8e44ad"}  # fmt: skip
_PAIR_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
MAX_MATRIX_CHANNELS = 48  # larger matrices show the channels of the drawn pairs only
_HATCH = "repeating-linear-gradient(135deg, {c} 0 3px, #ffffff 3px 5px)"  # a not-significant cell


def _color(x: float, vmax: float) -> str:
    if not np.isfinite(x):
        return "#e5e5e5"
    f = min(max(x / vmax, 0.0), 1.0) if vmax > 0 else 0.0
    for (f0, c0), (f1, c1) in itertools.pairwise(_STOPS):
        if f <= f1:
            w = (f - f0) / (f1 - f0)
            r, g, b = (round(a + w * (b_ - a)) for a, b_ in zip(c0, c1, strict=True))
            return f"#{r:02x}{g:02x}{b:02x}"
    return "#000004"


def write_report(outdir: str | Path, out: str | Path, *, top: int = 8, at: list[float] | None = None) -> list[str]:
    """Write the report (see the module docstring) of the replay in ``outdir`` to ``out``; returns notes on the
    request (a time in ``at`` outside the replay, shown at its nearest hop)."""
    d = Path(outdir)
    info, cols, events, tables = load_output(d)
    notes: list[str] = []
    try:
        page = _page(d, info, cols, events, tables, top, at, notes)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:  # what load_output let by
        raise InputError(f"cannot draw the replay output in {d}: {type(exc).__name__}: {str(exc)[:200]}") from None
    try:
        write_file(out, page.encode("utf-8"))
    except OSError as exc:
        raise InputError(f"cannot write {out}: {exc.strerror or exc} (-o FILE)") from None
    return notes


def _page(
    d: Path, info: dict[str, Any], cols: dict[str, np.ndarray], events: list[dict[str, Any]], tables: dict[str, Any],
    top: int, at: list[float] | None, notes: list[str],
) -> str:  # fmt: skip
    t_ns, mi, dep, n_eff = cols["t_ns"], cols["mi"].astype(float), cols["dependent"], cols["n_eff"]
    # a value held while its pair's window lacked samples (coverage under min_coverage) was not evaluated then
    held = cols["coverage"] < float(info.get("calibration", {}).get("min_coverage", 0.9))  # NaN (absent): False
    line_mi, line_dep = np.where(held, np.nan, mi), np.where(held, -1, dep)
    pair_of, pairs = cols["pair"], [str(p) for p in cols["pairs"]]  # (rows,) index into the labels "a\x1fb"
    index = {p: k for k, p in enumerate(pairs)}
    judged = bool((dep >= 0).any())  # False for output written without the detector's verdict
    hops = np.unique(t_ns)
    t0 = float(info.get("t_start", hops[0] / 1e9))
    peak = np.full(len(pairs), -np.inf)
    np.maximum.at(peak, pair_of, np.nan_to_num(mi, nan=-np.inf))
    mi_events = [e for e in events if e["change"] != "lag-shift"]  # a lag shift is drawn on the pair's lag plot
    event_pairs = list(dict.fromkeys(f"{e['a']}\x1f{e['b']}" for e in mi_events))
    strongest = [pairs[k] for k in np.argsort(-peak, kind="stable")[:top]]
    drawn = list(dict.fromkeys(strongest + event_pairs))
    channels = [str(c) for c in info.get("channels", [])] or sorted({c for p in pairs for c in p.split("\x1f")})
    if len(channels) > MAX_MATRIX_CHANNELS:
        keep = {c for p in drawn for c in p.split("\x1f")}
        channels = [c for c in channels if c in keep]
    vmax = float(np.nanmax(np.where(np.isfinite(mi), mi, np.nan))) if np.isfinite(mi).any() else 1.0
    vmax = max(vmax, 0.2)

    instants = _instants(hops, at, t0, notes)
    if "t_start" not in info:  # a recording (outputs.record) has no replay.json: the facts its rows give
        info = {"log": "a recording", "log_kind": "outputs.record", "channels": channels, "t_start": t0,
                "t_end": hops[-1] / 1e9} | info  # fmt: skip
    parts = [_header(info, d, len(hops), len(events), len(pairs))]
    parts.append("<h2>Matrix at chosen instants</h2><div class='row'>")
    for tk in instants:
        parts.append(_matrix_html(tk, t_ns, pair_of, pairs, mi, dep, n_eff, channels, vmax, t0))
    parts.append("</div>" + _legend(vmax, judged))
    parts.append(f"<h2>MI over time</h2><p class='note'>The {len(strongest)} strongest pairs (largest MI in the "
                 f"replay) and every pair with MI events ({len(event_pairs)}; lag shifts: in the lag plots); "
                 "event markers: "
                 + " ".join(f"<span style='color:{c}'>&#9679; {k}</span>" for k, c in list(_KIND_COLOR.items())[:4])
                 + "; hollow: initial (dependent from the pair's first assessment, not an onset)"
                 + ("; the band under a line: hops where the pair was dependent" if judged else "")
                 + "</p>")  # fmt: skip
    order = np.argsort(t_ns, kind="stable")
    for n, p in enumerate(drawn):
        rows = order[pair_of[order] == index.get(p, -1)]
        pe = [e for e in mi_events if f"{e['a']}\x1f{e['b']}" == p]
        color = _PAIR_COLORS[n % len(_PAIR_COLORS)]
        parts.append(_line_svg(p, t_ns[rows], line_mi[rows], line_dep[rows], n_eff[rows], pe, hops, t0, color))
    if np.isfinite(lag_s := cols["lag_s"]).any():  # lead and lag: the top pairs by MI at their lag, and shifted ones
        best = np.full(len(pairs), -np.inf)
        np.maximum.at(best, pair_of, np.where(np.isfinite(lag_s), np.nan_to_num(cols["mi_lag"], nan=0.0), -np.inf))
        shifts = [e for e in events if e["change"] == "lag-shift" and e.get("lag_s") is not None]
        lagged = [pairs[k] for k in np.argsort(-best, kind="stable")[:top] if np.isfinite(best[k])]
        lim = max(float(np.nanmax(np.abs(lag_s))), 0.01)  # one scale for every pair's plot
        parts.append("<h2>Lead and lag</h2><p class='note'>Each pair's best lag over time (> 0: its second channel "
                     "follows the first; gaps: no significant lag; dots: lag shifts, hover them)</p>")  # fmt: skip
        for n, p in enumerate(dict.fromkeys(lagged + [f"{e['a']}\x1f{e['b']}" for e in shifts])):
            rows, pe = order[pair_of[order] == index[p]], [e for e in shifts if f"{e['a']}\x1f{e['b']}" == p]
            parts.append(_lag_svg(p, t_ns[rows], lag_s[rows], cols["mi_lag"][rows], pe, hops, t0, lim, n))
    parts.append(f"<h2>Events ({len(events)})</h2>")
    parts.append(_event_strip(events, hops, t0))
    parts.append(_event_table(events, t0))
    if tables.get("pairs"):
        when = float(tables.get("time", 0.0)) - t0
        parts.append(f"<h2>Lookup tables</h2><p class='note'>The model's table &theta; on the last window "
                     f"(t = {when:.1f} s) for the pairs with events and the strongest: rows are a's rank, "
                     "columns b's; red where the pair's values occur together more often than under "
                     "independence, blue less often, white as often.</p><div class='row'>")  # fmt: skip
        for tb in tables["pairs"]:
            parts.append(table_figure(tb))
        parts.append("</div>")
    page = _PAGE.replace("{{title}}", html.escape(f"streamcorr report: {Path(str(info.get('log', d))).name}"))
    return page.replace("{{body}}", "\n".join(parts))


def _instants(hops: np.ndarray, at: list[float] | None, t0: float, notes: list[str]) -> list[int]:
    """Hop times (ns) nearest to the requested stream times; seconds below the log's start count from it. A time
    outside the replay's hops adds a note."""
    if not at:
        idx = np.unique(np.linspace(0, len(hops) - 1, min(4, len(hops))).round().astype(int))
        return [int(hops[k]) for k in idx]
    out = []
    for s in at:
        t = (s + t0 if s < t0 else s) * 1e9
        near = int(hops[int(np.argmin(np.abs(hops.astype(np.float64) - t)))])
        if not hops[0] <= t <= hops[-1]:
            notes.append(
                f"--at {s:g} is outside the replay's hops ({hops[0] / 1e9 - t0:.1f} to "
                f"{hops[-1] / 1e9 - t0:.1f} s from its start): the matrix shown is at {near / 1e9 - t0:.1f} s"
            )
        out.append(near)
    return list(dict.fromkeys(out))


def _esc(s: str) -> str:
    return html.escape(s, quote=True)


def _header(info: dict[str, Any], d: Path, n_hops: int, n_events: int, n_pairs: int) -> str:
    span = float(info.get("t_end", 0)) - float(info.get("t_start", 0))
    clock = f"{info.get('rate_hz', '?')} Hz; window {info.get('window_len', '?')} samples"
    hop = f"hop {info.get('hop_samples', '?')} ({info.get('hop_s', '?')} s)"
    speed = f"{info.get('x_real_time', '?')}x real time ({info.get('wall_s', '?')} s)"
    rows = [("log", f"{info.get('log', '?')} ({info.get('log_kind', '?')})"),
            ("channels", str(len(info.get("channels", [])))), ("clock", f"{clock}, {hop}"),
            ("stream", f"{span:.1f} s from t = {float(info.get('t_start', 0)):.3f}"),
            ("evaluated", f"{n_hops} hops, {n_pairs} pairs, {n_events} events"),
            ("replay", speed + ("; stopped early (Ctrl-C)" if info.get("interrupted") else "")),
            ("output", str(d))]  # fmt: skip
    rows = [(k, v) for k, v in rows if "?" not in v or k in ("log", "output")]  # settings a recording does not keep
    cells = "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in rows)
    return f"<h1>streamcorr replay report</h1><table class='info'>{cells}</table>"


def _matrix_html(
    tk: int, t_ns: np.ndarray, pair_of: np.ndarray, pairs: list[str], mi: np.ndarray, dep: np.ndarray,
    n_eff: np.ndarray, channels: list[str], vmax: float, t0: float,
) -> str:  # fmt: skip
    idx = {c: k for k, c in enumerate(channels)}
    n = len(channels)
    m, ne, d = np.full((n, n), np.nan), np.full((n, n), np.nan), np.full((n, n), -1, dtype=np.int8)
    for k in np.flatnonzero(t_ns == tk):
        a, b = pairs[pair_of[k]].split("\x1f")
        i, j = idx.get(a), idx.get(b)
        if i is not None and j is not None:
            m[i, j] = m[j, i] = mi[k]
            ne[i, j] = ne[j, i] = n_eff[k]
            d[i, j] = d[j, i] = dep[k]
    head = "".join(f"<th class='v'><div>{_esc(c)}</div></th>" for c in channels)
    body = []
    for i, c in enumerate(channels):
        cells = []
        for j, c2 in enumerate(channels):
            v, color = m[i, j], _color(m[i, j], vmax)
            tip = f"{c} ~ {c2}: " + ("-" if not np.isfinite(v) else f"{v:.3f} nats")
            tip += {1: "; dependent", 0: "; not significant"}.get(int(d[i, j]), "")
            tip += f"; n_eff {ne[i, j]:.0f}" if np.isfinite(ne[i, j]) else ""
            ns = np.isfinite(v) and d[i, j] == 0
            attrs = f"style='background:{_HATCH.format(c=color)}' class='ns'" if ns else f"style='background:{color}'"
            cells.append(f"<td {attrs} title='{_esc(tip)}'></td>")
        body.append(f"<tr><th class='h'>{_esc(c)}</th>{''.join(cells)}</tr>")
    return (f"<figure class='matrix'><figcaption>t = {tk / 1e9 - t0:.1f} s</figcaption><table class='mat'>"
            f"<tr><th></th>{head}</tr>{''.join(body)}</table></figure>")  # fmt: skip


def _legend(vmax: float, judged: bool) -> str:
    stops = "".join(f"<span style='background:{_color(vmax * k / 10, vmax)}'></span>" for k in range(11))
    hatch = (f"; <span class='ns' style='background:{_HATCH.format(c=_color(vmax / 2, vmax))}'></span> hatched: "
             "not significant (the change detector did not find the pair dependent; n_eff, the effective sample "
             "size, in each cell's tooltip)") if judged else ""  # fmt: skip
    return f"<div class='legend'>0 {stops} {vmax:.2f} nats (grey: not evaluated){hatch}</div>"


_W, _H, _PAD_L, _PAD_B = 900, 110, 48, 18


def _x(t_ns: float, hops: np.ndarray) -> float:
    lo, hi = float(hops[0]), float(hops[-1])
    return _PAD_L + (t_ns - lo) / (hi - lo) * (_W - _PAD_L - 10) if hi > lo else _PAD_L


# tick steps in seconds, and the unit each is labelled in (so labels stay short: "90 s", "15 min", "6 h")
_STEPS_S = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
MAX_TICKS = 9  # labelled ticks on a time axis at most (labels of 5-7 characters on 850 px)


def time_ticks(lo_s: float, hi_s: float) -> list[tuple[float, str]]:
    """(seconds, label) of the ticks on a time axis from lo_s to hi_s: the first step of ``_STEPS_S`` that gives
    at most MAX_TICKS, labelled with their unit.

    >>> [label for _, label in time_ticks(0, 400)]
    ['0 min', '1 min', '2 min', '3 min', '4 min', '5 min', '6 min']
    >>> [label for _, label in time_ticks(2.5, 9)]
    ['3 s', '4 s', '5 s', '6 s', '7 s', '8 s', '9 s']
    """
    span = hi_s - lo_s
    step = next((st for st in _STEPS_S if span / st <= MAX_TICKS - 1), 0.0)
    if not step:  # beyond 8 days: 1, 2 or 5 times a power of ten days
        days = span / (MAX_TICKS - 1) / 86400
        power = 10 ** np.floor(np.log10(days))
        step = 86400 * power * next(m for m in (1, 2, 5, 10) if m * power >= days)
    unit, name = next(u for u in ((86400, "d"), (3600, "h"), (60, "min"), (1, "s")) if step >= u[0] or u[0] == 1)
    first = np.ceil(lo_s / step - 1e-9) * step + 0.0  # + 0.0: never -0
    ticks = np.arange(first, hi_s + step * 1e-9, step)
    return [(float(v), f"{v / unit:.6f}".rstrip("0").rstrip(".") + f" {name}") for v in ticks]


def _time_axis(hops: np.ndarray, t0: float, y_line: float, y_text: float) -> str:
    """The time axis under a plot: a base line and, at each of ``time_ticks``, a tick, a faint grid line and
    its label (stream seconds from the log's start)."""
    out = [f"<line x1='{_PAD_L}' y1='{y_line}' x2='{_W - 10}' y2='{y_line}' stroke='#999'/>"]
    for v, label in time_ticks(hops[0] / 1e9 - t0, hops[-1] / 1e9 - t0):
        x = _x((v + t0) * 1e9, hops)
        anchor = "end" if x > _W - 30 else "start" if x < _PAD_L + 10 else "middle"
        out.append(f"<line class='tick' x1='{x:.1f}' y1='2' x2='{x:.1f}' y2='{y_line + 3}' stroke='#eee'/>"
                   f"<text class='tick' x='{x:.1f}' y='{y_text}' text-anchor='{anchor}'>{label}</text>")  # fmt: skip
    return "".join(out)


def _line_svg(
    pair: str, t: np.ndarray, mi: np.ndarray, dep: np.ndarray, n_eff: np.ndarray, events: list[dict[str, Any]],
    hops: np.ndarray, t0: float, color: str,
) -> str:  # fmt: skip
    a, b = pair.split("\x1f")
    top = max(float(np.nanmax(mi)) if np.isfinite(mi).any() else 0.0, 0.2) * 1.1

    def y(v: float) -> float:
        return 6 + (1 - v / top) * (_H - _PAD_B - 6)

    lines = _polylines(t, mi, hops, y, color)
    marks = "".join(
        f"<circle cx='{_x(e['t_ns'], hops):.1f}' cy='{y(e['current']):.1f}' r='4' "
        + (f"fill='#fff' stroke='{c}' stroke-width='2' class='initial'" if e.get("initial") else f"fill='{c}'")
        + f"><title>{_esc(_event_text(e, t0))}</title></circle>"
        for e in events for c in [_KIND_COLOR.get(e["change"], "#000")]
    )  # fmt: skip
    onsets = "".join(  # a dashed line from the estimated onset to the event: how late it was seen
        f"<line class='onset' x1='{_x(e['onset_t_ns'], hops):.1f}' x2='{_x(e['t_ns'], hops):.1f}' "
        f"y1='{y(e['current']):.1f}' y2='{y(e['current']):.1f}' stroke='{c}' stroke-dasharray='3 2'>"
        f"<title>{_esc('onset of ' + _event_text(e, t0))}</title></line>"
        f"<line class='onset' x1='{_x(e['onset_t_ns'], hops):.1f}' x2='{_x(e['onset_t_ns'], hops):.1f}' "
        f"y1='{y(e['current']) - 5:.1f}' y2='{y(e['current']) + 5:.1f}' stroke='{c}' stroke-width='2'/>"
        for e in events if e.get("onset_t_ns") is not None for c in [_KIND_COLOR.get(e["change"], "#000")]
    )  # fmt: skip
    band = _dependent_band(t, dep, hops, color)
    axis = (_time_axis(hops, t0, _H - _PAD_B, _H - 4)
            + f"<text x='{_PAD_L - 4}' y='{y(0) + 4:.0f}' text-anchor='end'>0</text>"
            f"<text x='{_PAD_L - 4}' y='{y(top / 1.1) + 4:.0f}' text-anchor='end'>{top / 1.1:.2f}</text>")  # fmt: skip
    name = _esc(f"{a} ~ {b}")
    known = dep >= 0
    sig = ""
    if known.any():  # the share of judged hops, and n_eff at the last hop that had one
        sig = f", dependent in {100 * float(np.mean(dep[known] == 1)):.0f}% of hops"
        sig += f", n_eff {n_eff[np.isfinite(n_eff)][-1]:.0f}" if np.isfinite(n_eff).any() else ""
    return (f"<figure class='line'><figcaption style='color:{color}'>{name} <span class='note'>peak "
            f"{np.nanmax(mi) if np.isfinite(mi).any() else float('nan'):.3f} nats, {len(events)} MI events{sig}</span>"
            f"</figcaption><svg viewBox='0 0 {_W} {_H}' width='{_W}' height='{_H}' role='img' aria-label='{name}'>"
            f"{axis}{band}{lines}{onsets}{marks}</svg></figure>")  # fmt: skip


def _breaks(t: np.ndarray, hops: np.ndarray) -> np.ndarray:
    """(len(t),) True where a row follows a gap of hops not evaluated (over 1.5 times the usual hop)."""
    step = float(np.median(np.diff(hops))) if len(hops) > 1 else np.inf
    return np.r_[False, np.diff(t) > 1.5 * step]


def _polylines(t: np.ndarray, v: np.ndarray, hops: np.ndarray, y: Any, color: str) -> str:
    """The series (t ns, v) as SVG polylines, broken where v is not finite and across hops not evaluated."""
    segs: list[list[str]] = [[]]
    for tt, vv, gap in zip(t, v, _breaks(t, hops), strict=True):
        if gap and segs[-1]:
            segs.append([])
        if np.isfinite(vv):
            segs[-1].append(f"{_x(float(tt), hops):.1f},{y(float(vv)):.1f}")
        elif segs[-1]:
            segs.append([])
    return "".join(f"<polyline fill='none' stroke='{color}' stroke-width='1.5' points='{' '.join(s)}'/>"
                   for s in segs if s)  # fmt: skip


def _lag_svg(pair: str, t: np.ndarray, lag: np.ndarray, mi: np.ndarray, shifts: list[dict[str, Any]],
             hops: np.ndarray, t0: float, lim: float, n: int) -> str:  # fmt: skip
    (a, b), color, ok, c = pair.split("\x1f"), _PAIR_COLORS[n % 8], np.isfinite(lag), _KIND_COLOR["lag-shift"]

    def y(v: float) -> float:  # lag +1.15 lim at the top, -1.15 lim at the bottom
        return 6 + (1.15 * lim - v) / (2.3 * lim) * (_H - _PAD_B - 12)

    marks = "".join(f"<circle class='shift' cx='{_x(e['t_ns'], hops):.1f}' cy='{y(e['lag_s']):.1f}' r='4' fill='{c}'>"
                    f"<title>{_esc(_event_text(e, t0))}</title></circle>" for e in shifts)  # fmt: skip
    axis = _time_axis(hops, t0, _H - _PAD_B, _H - 4) + "".join(  # the zero line and the scale's ends, ms
        f"<line x1='{_PAD_L}' y1='{y(v):.1f}' x2='{_W - 10}' y2='{y(v):.1f}' stroke='#ddd'/><text x='2' "
        f"y='{y(v) + 4:.0f}'>{f'{v * 1e3:+.0f} ms' if v else '0'}</text>" for v in (lim, 0, -lim))  # fmt: skip
    now = f"now {_lead(a, b, float(lag[ok][-1]))}" if ok[-1] else "no significant lag at the end"
    note = _esc(f"{now}; MI at the lag up to {np.nanmax(mi):.3f} nats; lag shifts: {len(shifts)}")
    return (f"<figure class='lag'><figcaption style='color:{color}'>{_esc(f'{a} ~ {b}')} <span class='note'>{note}"
            f"</span></figcaption><svg viewBox='0 0 {_W} {_H}' width='{_W}' height='{_H}' role='img' aria-label="
            f"'lag {_esc(f'{a} ~ {b}')}'>{axis}{_polylines(t, lag, hops, y, color)}{marks}</svg></figure>")  # fmt: skip


def _lead(a: str, b: str, lag_s: float) -> str:
    """Who follows whom: lag_s > 0 when b, the pair's second channel, follows a."""
    first, second, ms = (a, b, lag_s * 1e3) if lag_s > 0 else (b, a, -lag_s * 1e3)
    return f"{a} and {b} in step" if round(ms) == 0 else f"{second} follows {first} by {ms:.0f} ms"


def _dependent_band(t: np.ndarray, dep: np.ndarray, hops: np.ndarray, color: str) -> str:
    """Rectangles along the axis over the runs of hops where the pair was dependent."""
    out, k, gap = [], 0, _breaks(t, hops)
    while k < len(t):
        if dep[k] != 1:
            k += 1
            continue
        start = k
        k += 1
        while k < len(t) and dep[k] == 1 and not gap[k]:
            k += 1
        x0, x1 = _x(float(t[start]), hops), _x(float(t[k - 1]), hops)
        out.append(f"<rect class='dep' x='{x0:.1f}' y='{_H - _PAD_B - 4}' width='{max(x1 - x0, 2):.1f}' height='4' "
                   f"fill='{color}' fill-opacity='0.35'><title>dependent</title></rect>")  # fmt: skip
    return "".join(out)


def _event_text(e: dict[str, Any], t0: float) -> str:
    if e["change"] == "lag-shift" and e.get("lag_s") is not None:
        return f"{e['time'] - t0:.1f} s: lag-shift {_lag_move(e)}, MI {e['previous']:.3f} -> {e['current']:.3f}"
    initial = " (initial)" if e.get("initial") else ""
    fast = " (fast path)" if e.get("path") == "fast" else ""
    onset = "" if e.get("onset_t_ns") is None else f", began about {e['onset_t_ns'] / 1e9 - t0:.1f} s"
    return f"{e['time'] - t0:.1f} s: {e['change']}{initial}{fast} {_levels(e, '->')}{onset}"


def _levels(e: dict[str, Any], arrow: str = "&rarr;") -> str:
    """previous -> current; an initial event's previous is its first assessment, not a level it left."""
    first = " (first assessed)" if e.get("initial") else ""
    return f"{e['previous']:.3f}{first} {arrow} {e['current']:.3f}"


def _event_strip(events: list[dict[str, Any]], hops: np.ndarray, t0: float) -> str:
    h = 40
    ticks = "".join(f"<line x1='{x:.1f}' y1='6' x2='{x:.1f}' y2='{h - 14}' "
                    f"stroke='{_KIND_COLOR.get(e['change'], '#000')}' stroke-width='2'><title>"
                    f"{_esc(e['a'] + ' ~ ' + e['b'] + ': ' + _event_text(e, t0))}</title></line>"
                    for e in events for x in [_x(e["t_ns"], hops)])  # fmt: skip
    axis = _time_axis(hops, t0, h - 14, h - 2)
    return f"<svg id='event-strip' viewBox='0 0 {_W} {h}' width='{_W}' height='{h}'>{axis}{ticks}</svg>"


def _event_table(events: list[dict[str, Any]], t0: float) -> str:
    if not events:
        return "<p class='note'>No change events in this replay.</p>"
    initial = " <span class='initial' title='dependent from the first assessment, not an onset'>(initial)</span>"
    rows = "".join(
        f"<tr><td>{e['time'] - t0:.1f}</td><td>{_esc(e['a'])} ~ {_esc(e['b'])}</td>"
        f"<td style='color:{_KIND_COLOR.get(e['change'], '#000')}'>{_esc(e['change'])}"
        + (initial if e.get("initial") else "")
        + (f" <span class='lag'>{_esc(_lag_move(e))}</span>" if e["change"] == "lag-shift" and e.get("lag_s") else "")
        + f"</td><td>{_levels(e)}</td>"
        f"<td>{'' if e.get('onset_t_ns') is None else format(e['onset_t_ns'] / 1e9 - t0, '.1f')}</td>"
        f"<td>{_esc(e.get('path') or 'window')}</td></tr>" for e in events
    )  # fmt: skip
    return ("<table class='events'><tr><th>t (s)</th><th>pair</th><th>change</th><th>MI (nats)</th>"
            f"<th>onset (s)</th><th>seen by</th></tr>{rows}</table>")  # fmt: skip


def _lag_move(e: dict[str, Any]) -> str:
    """A lag shift in words: "+100 -> +300 ms (b follows a by 300 ms)"."""
    before = "?" if e.get("previous_lag_s") is None else f"{e['previous_lag_s'] * 1e3:+.0f}"
    return f"{before} -> {e['lag_s'] * 1e3:+.0f} ms ({_lead(e['a'], e['b'], e['lag_s'])})"


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:">
<title>{{title}}</title><style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; max-width: 1200px; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; }
.note { color: #666; font-size: 12px; } .row { display: flex; flex-wrap: wrap; gap: 18px; }
table.info th { text-align: left; padding-right: 12px; color: #555; font-weight: 600; }
table.mat { border-collapse: collapse; } table.mat td { width: 14px; height: 14px; padding: 0; border: 1px solid #fff; }
table.mat th.h { font-size: 10px; text-align: right; padding-right: 4px; font-weight: normal; white-space: nowrap; }
table.mat th.v { height: 90px; vertical-align: bottom; font-size: 10px; font-weight: normal; }
table.mat th.v div { writing-mode: vertical-rl; transform: rotate(180deg); white-space: nowrap; }
.legend span { display: inline-block; width: 18px; height: 10px; } .legend { font-size: 12px; margin-top: 6px; }
.initial { color: #666; font-size: 12px; } figure { margin: 0; } figcaption { font-weight: 600; margin-bottom: 4px; }
svg text { font-size: 11px; fill: #555; } figure.line, figure.lag { margin-bottom: 10px; }
figure.theta .cells { position: relative; width: 182px; height: 182px; }
figure.theta img { image-rendering: pixelated; border: 1px solid #ccc; position: absolute; left: 0; top: 0; }
svg.hover { position: absolute; left: 1px; top: 1px; } svg.hover rect { fill: transparent; }
svg.hover rect:hover { stroke: #000; stroke-width: 0.08; } table.events { border-collapse: collapse; font-size: 13px; }
table.events td, table.events th { padding: 2px 10px; border-bottom: 1px solid #eee; text-align: left; }
</style></head><body>
{{body}}
<p class="note">Written by streamcorr report; self-contained (no network requests).</p></body></html>
"""
