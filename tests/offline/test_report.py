"""The report's readability (issue 29): time axes with labelled intermediate ticks and units, and heatmaps that
give their value on hover (the MI matrix's cells and each lookup table's cells), hostile names kept as text."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamcorr.offline.report import time_ticks, write_report

HOSTILE = "<img src=x onerror=alert(1)>&'\""  # a channel name that must stay text


def _replay_output(d: Path, rng: np.random.Generator, minutes: float = 7.0) -> list[str]:
    """A replay output directory written by hand (the columns report_input reads): three channels, one hostile,
    one hop per 10 s over ``minutes``, an event half way and a 32 x 32 lookup table per pair."""
    names = ["arm.j1", "arm.j2", HOSTILE]
    t0 = 1_700_000_000.0
    hops = t0 + np.arange(10.0, minutes * 60 + 1e-9, 10.0)
    pairs = [(names[i], names[j]) for i, j in zip(*np.triu_indices(3, 1), strict=True)]
    rows: dict[str, list] = {"t_ns": [], "a": [], "b": [], "mi": [], "dependent": [], "n_eff": []}
    for t in hops:
        for k, (a, b) in enumerate(pairs):
            mi = float(0.8 if k == 0 else rng.uniform(0, 0.05))
            rows["t_ns"].append(int(t * 1e9))
            rows["a"].append(a)
            rows["b"].append(b)
            rows["mi"].append(mi)
            rows["dependent"].append(k == 0)
            rows["n_eff"].append(200.0)
    d.mkdir()
    pq.write_table(pa.table(rows), d / "timeline.parquet")
    mid = hops[len(hops) // 2]
    event = {"time": [float(mid)], "t_ns": [int(mid * 1e9)], "a": [names[0]], "b": [HOSTILE],
             "change": ["became-dependent"], "previous": [0.01], "current": [0.3], "initial": [False]}  # fmt: skip
    pq.write_table(pa.table(event), d / "events.parquet")
    info = {"log": "hand.csv", "log_kind": "csv", "channels": names, "rate_hz": 10, "window_len": 64,
            "hop_samples": 100, "hop_s": 10.0, "t_start": t0, "t_end": float(hops[-1])}  # fmt: skip
    (d / "replay.json").write_text(json.dumps(info))
    tables = [{"a": a, "b": b, "mi": 0.5, "table": rng.uniform(-1, 1, (32, 32)).round(4).tolist()} for a, b in pairs]
    (d / "tables.json").write_text(json.dumps({"time": float(hops[-1]), "pairs": tables}))
    return names


def test_time_ticks_are_round_steps_with_units_for_every_span():
    """Between 3 and 9 ticks at round steps, each labelled with its unit, from a fraction of a second to a year."""
    rng = np.random.default_rng(50)
    for span in [0.5, 7, 59, 420, 3600, 86_400 * 3, 3e7, *rng.uniform(1, 1e6, 20)]:
        ticks = time_ticks(0.0, float(span))
        assert 3 <= len(ticks) <= 9, (span, ticks)
        steps = np.diff([v for v, _ in ticks])
        assert np.allclose(steps, steps[0]) and ticks[-1][0] <= span, (span, ticks)
        assert all(re.fullmatch(r"\d+(\.\d+)? (s|min|h|d)", label) for _, label in ticks), (span, ticks)


def test_mi_over_time_plots_label_intermediate_ticks_with_units(tmp_path):
    """A 7-minute replay's MI lines and event strip each carry labelled ticks at every minute between the ends,
    placed in order along the axis."""
    rng = np.random.default_rng(51)
    _replay_output(tmp_path / "out", rng)
    write_report(tmp_path / "out", tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text()
    plots = re.findall(r"<svg viewBox='0 0 900 110'.*?</svg>", page)
    plots += re.findall(r"<svg id='event-strip'.*?</svg>", page)
    assert len(plots) >= 3
    for svg in plots:
        ticks = re.findall(r"<text class='tick' x='([\d.]+)' y='[\d.]+' text-anchor='\w+'>([^<]+)</text>", svg)
        labels = [label for _, label in ticks]
        assert labels == [f"{k} min" for k in range(1, 8)], labels  # the first hop is at 10 s
        xs = [float(x) for x, _ in ticks]
        assert xs == sorted(xs) and len(set(xs)) == len(xs)


def test_an_event_onset_is_marked_on_its_pair_and_listed(tmp_path):
    """An event with an estimated onset (a fast-path event) gets a dashed onset marker on its pair's line, reaching
    back from the event, and its row gives the onset and the detector; an event without one (older output) none."""
    rng = np.random.default_rng(52)
    names = _replay_output(tmp_path / "out", rng)
    ev = pq.read_table(tmp_path / "out" / "events.parquet").to_pylist()[0]
    onset = {**ev, "t_ns": ev["t_ns"] + 60 * 10**9, "time": ev["time"] + 60, "onset_t_ns": ev["t_ns"] + 57 * 10**9,
             "path": "fast", "a": names[0], "b": names[1], "change": "became-independent"}  # fmt: skip
    older = {**ev, "onset_t_ns": None, "path": None}
    pq.write_table(pa.Table.from_pylist([older, onset]), tmp_path / "out" / "events.parquet")
    write_report(tmp_path / "out", tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text()
    marks = re.findall(r"<line class='onset' x1='([\d.]+)' x2='([\d.]+)'", page)
    assert len(marks) == 2  # one event with an onset: its dashed span and its tick
    start, end = map(float, marks[0])
    assert start < end  # the onset is drawn before the detection
    assert "(fast path)" in page and ", began about" in page
    assert re.search(r"<td>\d+\.\d</td><td>fast</td>", page) and "<td></td><td>window</td>" in page


def test_a_time_outside_the_replay_is_shown_at_its_nearest_hop_and_says_so(tmp_path, capsys):
    """``streamcorr report --at`` with a time past the replay's end draws the last hop's matrix and prints a note
    naming the replay's span; a time inside it gives no note."""
    from streamcorr.cli import main

    _replay_output(tmp_path / "out", np.random.default_rng(56), minutes=2.0)
    assert main(["report", str(tmp_path / "out"), "--at", "30", "500"]) == 0
    err = capsys.readouterr().err
    assert "--at 500 is outside the replay's hops (10.0 to 120.0 s from its start)" in err
    assert "the matrix shown is at 120.0 s" in err and "--at 30 " not in err
    page = (tmp_path / "out" / "report.html").read_text()
    assert "t = 30.0 s" in page and "t = 120.0 s" in page


def test_heatmap_cells_have_hover_text_with_names_and_value_escaped(tmp_path):
    """Every matrix cell has a title naming its pair and MI; every lookup-table cell has an SVG <title> with
    both channels' ranks and theta; the hostile name appears only escaped."""
    rng = np.random.default_rng(52)
    _replay_output(tmp_path / "out", rng)
    write_report(tmp_path / "out", tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text()
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;&amp;&#x27;&quot;" in page
    assert "title='arm.j1 ~ arm.j2: 0.800 nats; dependent; n_eff 200'" in page
    hover = re.findall(r"<svg class='hover'.*?</svg>", page)
    assert len(hover) == 3 and all(h.count("<rect ") == 32 * 32 for h in hover)
    assert re.search(r"<title>arm\.j1 rank 1\.00, arm\.j2 rank 0\.00: &theta; [+-]\d\.\d{3}</title>", hover[0])


def test_hovering_the_heatmaps_in_chromium_shows_names_and_values(tmp_path, chromium):
    """In a real browser, the element under the mouse on a matrix cell and on a lookup-table cell carries the
    hover text (title) with the pair's names as text, the hostile one unexecuted, and the value."""
    rng = np.random.default_rng(53)
    _replay_output(tmp_path / "out", rng)
    write_report(tmp_path / "out", tmp_path / "r.html")
    page = chromium.new_page(viewport={"width": 1280, "height": 900})
    dialogs: list[str] = []
    page.on("dialog", lambda dlg: (dialogs.append(dlg.message), dlg.dismiss()))
    try:
        page.goto((tmp_path / "r.html").as_uri())
        page.wait_for_load_state("load")
        under = """([x, y]) => { const e = document.elementFromPoint(x, y);
            return e.getAttribute('title') || (e.querySelector('title') || {}).textContent || ''; }"""
        cell = page.locator("figure.matrix table.mat tr").nth(3).locator("td").nth(0)  # hostile row, arm.j1 column
        cell.scroll_into_view_if_needed()
        box = cell.bounding_box()
        assert box is not None
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        tip = page.evaluate(under, [box["x"] + box["width"] / 2, box["y"] + box["height"] / 2])
        assert tip.startswith(f"{HOSTILE} ~ arm.j1: ") and " nats" in tip, tip
        theta = page.locator("figure.theta .cells").nth(0)
        theta.scroll_into_view_if_needed()
        box = theta.bounding_box()
        assert box is not None
        x, y = box["x"] + 1 + 180 * 2.5 / 32, box["y"] + 1 + 180 * 0.5 / 32  # column 2, top row
        page.mouse.move(x, y)
        tip = page.evaluate(under, [x, y])
        assert re.fullmatch(r"arm\.j1 rank 1\.00, arm\.j2 rank 0\.06: θ [+-]\d\.\d{3}", tip), tip
    finally:
        page.close()
    assert dialogs == []


@pytest.mark.parametrize("minutes", [0.5, 90.0])
def test_short_and_long_replays_get_ticks_in_fitting_units(tmp_path, minutes):
    """30 s of hops gets ticks in seconds, 90 minutes in minutes; never more than 9 labels per axis."""
    rng = np.random.default_rng(54)
    _replay_output(tmp_path / "out", rng, minutes=minutes)
    write_report(tmp_path / "out", tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text()
    svg = re.search(r"<svg id='event-strip'.*?</svg>", page)
    assert svg is not None
    labels = re.findall(r"<text class='tick'[^>]*>([^<]+)</text>", svg.group(0))
    assert 3 <= len(labels) <= 9 and all(s.endswith(" s" if minutes < 1 else " min") for s in labels), labels


def test_replay_with_lags_plots_each_lagged_pair_and_lists_its_lag_shift(tmp_path):
    """A 60-s recording at 100 Hz where drive.vel repeats drive.cmd 0.1 s later, then 0.3 s later from half way,
    replayed with --max-lag-s 0.5: the report's lead-and-lag section plots the pair (its lag rising at the step,
    the caption saying who follows whom), marks the lag shift and lists it in the events table; the same output
    without the lag columns (an older replay) gets no such section."""
    from streamcorr.cli.commands import main

    rng = np.random.default_rng(55)
    rate, n = 100.0, 6000
    src, noise = np.zeros(n + 100), rng.standard_normal(n + 100)
    for k in range(1, n + 100):  # a smooth AR(1) drive: its lag is sharp, its autocorrelation short
        src[k] = 0.8 * src[k - 1] + noise[k]
    x = rng.standard_normal((6, n))
    delay = np.where(np.arange(n) < n // 2, 10, 30)  # samples: 0.1 s, then 0.3 s
    x[0], x[1] = src[100:], src[100 + np.arange(n) - delay] + 0.5 * x[1]
    names = ["drive.cmd", "drive.vel", "fan.rpm", "fan.current", "cabinet.temp", "spare"]
    log = tmp_path / "lagged.csv"
    log.write_text("t," + ",".join(names) + "\n" + "".join(
        f"{k / rate!r}," + ",".join(repr(float(v)) for v in x[:, k]) + "\n" for k in range(n)))  # fmt: skip
    out, html_path = tmp_path / "out", tmp_path / "r.html"
    assert main(["replay", str(log), "--max-lag-s", "0.5", "--window", "512", "--no-progress", "-o", str(out)]) == 0
    assert main(["report", str(out), "-o", str(html_path)]) == 0
    page = html_path.read_text()
    assert "<h2>Lead and lag</h2>" in page
    figures = re.findall(r"<figure class='lag'>.*?</figure>", page)
    caption = re.search(r"<figcaption[^>]*>([^<]+) <span class='note'>([^<]+)</span>", figures[0] if figures else "")
    assert caption is not None and caption.group(1) == "drive.cmd ~ drive.vel"  # the strongest lagged pair first
    assert re.match(r"now drive\.vel follows drive\.cmd by (29\d|30\d|310) ms; MI at the lag", caption.group(2))
    points = [tuple(map(float, p.split(","))) for s in re.findall(r"points='([^']+)'", figures[0]) for p in s.split()]
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    assert xs == sorted(xs) and ys[-1] < ys[0] - 10  # later, higher up: drive.vel follows by more
    shift = re.search(r"<circle class='shift'[^>]*><title>([^<]+)</title>", figures[0])
    assert shift is not None
    m = re.search(r"lag-shift \+(\d+) -&gt; \+(\d+) ms \(drive\.vel follows drive\.cmd by (\d+) ms\)", shift.group(1))
    assert m is not None and abs(int(m.group(1)) - 100) <= 10 and abs(int(m.group(2)) - 300) <= 10, shift.group(1)
    listed = r"<td>drive\.cmd ~ drive\.vel</td><td [^>]*>lag-shift <span class='lag'>\+\d+ -&gt; \+\d+ ms \(drive\.vel"
    assert re.search(listed, page)

    timeline = pq.read_table(out / "timeline.parquet")
    pq.write_table(timeline.drop_columns(["lag_s", "mi_lag"]), out / "timeline.parquet")  # as an older replay wrote
    assert main(["report", str(out), "-o", str(html_path)]) == 0
    page = html_path.read_text()
    assert "Lead and lag" not in page and "<figure class='lag'>" not in page and re.search(listed, page)


def test_hops_not_evaluated_break_the_mi_lines_and_the_dependent_band(tmp_path):
    """Across a gap of the whole stream (no hops evaluated for a minute) and across hops where a pair's window lacked
    samples (coverage under min_coverage: its value only held), the pair's MI line and its dependent band stop and
    start again instead of drawing the held value through; a pair evaluated throughout keeps one line."""
    rng = np.random.default_rng(53)
    _replay_output(tmp_path / "out", rng)
    tab = pq.read_table(tmp_path / "out" / "timeline.parquet").to_pydict()
    t = np.array(tab["t_ns"])
    keep = (t < t.min() + 120 * 10**9) | (t > t.min() + 180 * 10**9)  # one minute of the stream not evaluated
    tab = {k: [v for v, ok in zip(col, keep, strict=True) if ok] for k, col in tab.items()}
    t = np.array(tab["t_ns"])
    late = t > t.min() + 300 * 10**9  # then the second pair's window lacks samples for a while: held values
    second = np.array([(a, b) == tuple(tab["a"][1:2] + tab["b"][1:2]) for a, b in zip(tab["a"], tab["b"], strict=True)])
    tab["coverage"] = np.where(second & late & (t < t.min() + 340 * 10**9), 0.4, 1.0).astype(np.float32).tolist()
    tab["mi"] = np.where(second, 0.7, tab["mi"]).tolist()  # drawn among the strongest
    tab["dependent"] = [bool(d or s) for d, s in zip(tab["dependent"], second, strict=True)]
    pq.write_table(pa.table(tab), tmp_path / "out" / "timeline.parquet")
    write_report(tmp_path / "out", tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text()
    figures = re.findall(r"<figure class='line'>.*?</figure>", page)
    lines = [len(re.findall("<polyline", f)) for f in figures]
    bands = [len(re.findall("class='dep'", f)) for f in figures]
    assert lines[:2] == [2, 3] and bands[:2] == [2, 3], (lines, bands)  # the gap; the gap and the held hops


def test_a_recording_gets_a_header_from_its_rows(tmp_path):
    """A recording's directory (outputs.record: rotated timeline and event files, no replay.json) gets a header
    with its channel count, span and start from its rows, and no unknown settings shown as '?'."""
    rng = np.random.default_rng(54)
    names = _replay_output(tmp_path / "rec", rng)
    d = tmp_path / "rec"
    (d / "timeline.parquet").rename(d / "timeline-20261130T000000Z-000001.parquet")
    (d / "events.parquet").rename(d / "events-20261130T000000Z-000001.parquet")
    (d / "replay.json").unlink()
    write_report(d, tmp_path / "r.html")
    header = re.findall(r"<table class='info'>.*?</table>", (tmp_path / "r.html").read_text())[0]
    assert "a recording (outputs.record)" in header and f"<td>{len(names)}</td>" in header
    assert "?" not in header and "from t = 1700000010.000" in header
