import asyncio
import io

import numpy as np
import pytest
from rich.console import Console

from streamcorr.demo.terminal import NAN_CELL, TerminalView, compact_line, render, short_labels
from streamcorr.engine.changes import ChangeEvent
from streamcorr.engine.matrix import Snapshot
from streamcorr.errors import ConfigError


def _snapshot(rng: np.random.Generator, names: list[str], seq: int = 7, t_s: float = 61.2) -> Snapshot:
    n = len(names)
    mi = rng.uniform(0.0, 0.04, (n, n))
    mi = (mi + mi.T) / 2
    np.fill_diagonal(mi, np.nan)
    mi[0, 1] = mi[1, 0] = 1.73
    mi[2, 3] = mi[3, 2] = 0.64
    mi[0, n - 1] = mi[n - 1, 0] = np.nan  # never evaluated
    age = np.zeros((n, n))
    return Snapshot(seq, int(t_s * 1e9), 0, tuple(names), mi, age, np.ones((n, n)))


def _text(renderable: object, width: int = 140) -> str:
    console = Console(record=True, width=width, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def _events() -> list[ChangeEvent]:
    return [
        ChangeEvent(("a0", "a1"), 0.02, 1.73, int(50e9), "became-dependent"),
        ChangeEvent(("a2", "a3"), 1.5, 0.64, int(55e9), "fall"),
    ]


def test_render_shows_labels_values_nan_legend_events_and_stats():
    """A rendered frame holds every channel label, the strong MI values, a distinct NaN cell, the legend in nats,
    the events newest first, and the stats line."""
    rng = np.random.default_rng(0)
    names = [f"a{k}" for k in range(6)]
    snap = _snapshot(rng, names)
    events = list(reversed(_events()))  # newest first
    stats = {"pairs_per_s": 190.4, "samples_per_s": 1000, "drops": {"late": 2, "nonfinite": 3}}
    out = _text(render(snap, events, stats))
    for name in names:
        assert name in out
    assert "1.7" in out and ".6" in out
    assert out.count(NAN_CELL.strip()) == 3  # the two cells of the NaN pair, and the legend
    assert "MI (nats)" in out and "not evaluated" in out
    assert out.index("a2 ~ a3") < out.index("a0 ~ a1")  # newest first
    assert "became-dependent" in out and "0.02 → 1.73" in out
    assert "seq 7" in out and "pairs/s 190" in out and "samples/s 1000" in out and "drops 5" in out


def test_render_bounds_the_event_list():
    """Only the first max_events events are drawn."""
    rng = np.random.default_rng(1)
    snap = _snapshot(rng, ["x", "y", "z", "w"])
    events = [ChangeEvent(("x", "y"), 0.0, 0.5, int(k * 1e9), "became-dependent") for k in range(30, 0, -1)]
    out = _text(render(snap, events, {}, max_events=5))
    assert "30.0" in out and "26.0" in out and "25.0" not in out


def test_render_fits_twenty_four_long_channel_names():
    """With 24 long channel names the heatmap fits 120 columns: labels are shortened, unique, and no row wraps."""
    rng = np.random.default_rng(2)
    names = [f"plant.line{k // 6}.sensor{k}.temperature" for k in range(24)]
    snap = _snapshot(rng, names)
    out = _text(render(snap, [], {}), width=120)
    labels = short_labels(names, 12)
    assert len(set(labels)) == 24 and max(map(len, labels)) <= 12
    rows = [line for line in out.splitlines() if any(line.lstrip().startswith(lab) for lab in labels)]
    assert len(rows) == 24
    assert max(len(line.rstrip()) for line in out.splitlines()) <= 120


def test_pearson_blind_cells_are_listed():
    """Given a Pearson matrix, pairs with high MI but |r| < 0.1 are named with their MI and r."""
    rng = np.random.default_rng(3)
    names = ["j3.cmd", "j3.hall", "c", "d"]
    snap = _snapshot(rng, names)
    pearson = np.eye(4)
    pearson[0, 1] = pearson[1, 0] = 0.02  # MI 1.73: blind
    pearson[2, 3] = pearson[3, 2] = 0.8  # MI 0.64 but correlated: not blind
    out = _text(render(snap, [], {"pearson": pearson}))
    assert "Pearson-blind: j3.cmd ~ j3.hall MI 1.73 r +0.02" in out
    assert "c ~ d" not in out
    # a Pearson matrix of the wrong shape (a channel just joined) is ignored, not an error
    assert "Pearson-blind:" not in _text(render(snap, [], {"pearson": np.eye(3)}))


def test_render_before_the_first_snapshot():
    """Without a snapshot the frame says it is waiting, and still shows stats and events."""
    np.random.default_rng(4)
    out = _text(render(None, _events()[:1], {"samples_per_s": 12}))
    assert "waiting for the first snapshot" in out and "samples/s 12" in out and "a0 ~ a1" in out


def test_compact_line_names_the_strongest_pairs():
    """The one-line form gives seq, stream time, the strongest pairs first, NaN count, rates and total drops."""
    rng = np.random.default_rng(5)
    snap = _snapshot(rng, ["p", "q", "r", "s"], seq=3, t_s=12.5)
    line = compact_line(snap, {"pairs_per_s": 6, "drops": {"late": 1, "duplicate": 2}})
    assert line.startswith("seq=3 t=12.5s top: p~q 1.73, r~s 0.64")
    assert "nan=1" in line and "pairs/s=6" in line and "drops=3" in line


def test_view_prints_lines_when_not_a_terminal():
    """Off a terminal, the view prints one line per snapshot and one per event, and keeps only the newest events."""
    rng = np.random.default_rng(6)
    buf = io.StringIO()
    view = TerminalView(Console(file=buf, width=200), max_events=3)
    assert not view.live_mode
    with view:
        for k in range(5):
            view.update(snapshot=_snapshot(rng, ["a0", "a1", "a2", "a3"], seq=k + 1))
        for ev in _events() * 3:
            view.update(event=ev)
    lines = buf.getvalue().splitlines()
    assert sum(line.startswith("seq=") for line in lines) == 5
    assert sum(line.startswith("event ") for line in lines) == 6
    assert len(view.events) == 3 and view.events_seen == 6


def test_initial_verdicts_are_marked_as_such():
    """A became-dependent event with initial=True (dependent when first assessed, not an onset) is marked in the
    printed line and in the events table; an onset is not."""
    np.random.default_rng(8)  # nothing random here; seeded by convention
    onset = ChangeEvent(("a0", "a1"), 0.02, 1.73, int(50e9), "became-dependent")
    verdict = ChangeEvent(("a2", "a3"), 0.0, 0.9, int(11e9), "became-dependent", initial=True)
    buf = io.StringIO()
    with TerminalView(Console(file=buf, width=200)) as view:
        view.update(event=onset)
        view.update(event=verdict)
    first, second = [line for line in buf.getvalue().splitlines() if line.startswith("event ")]
    assert "initial" not in first and "a2~a3" in second and "(initial" in second
    table = _text(render(None, [verdict, onset], {}))
    assert "became-dependent (initial)" in table and table.count("(initial)") == 1


def test_live_view_redraws_at_most_refresh_hz():
    """On a terminal, a burst of updates is drawn at most refresh_hz times a second, and the final state is drawn
    on exit."""
    rng = np.random.default_rng(7)
    console = Console(file=io.StringIO(), width=120, force_terminal=True, record=True)
    view = TerminalView(console, refresh_hz=2.0)
    assert view.live_mode
    with view:
        for k in range(200):
            view.update(snapshot=_snapshot(rng, ["a0", "a1", "a2", "a3"], seq=k + 1))
    assert view.redraws <= 3  # first update, plus at most one per 0.5 s of the burst, plus the final flush
    assert view.redraws_skipped >= 190
    assert "seq 200" in console.export_text()


def test_run_consumes_both_iterators_until_they_end():
    """run() shows every snapshot and event from two async iterators and returns when both are exhausted."""
    rng = np.random.default_rng(8)
    snaps = [_snapshot(rng, ["a0", "a1", "a2", "a3"], seq=k + 1) for k in range(4)]

    async def gen(items):
        for item in items:
            await asyncio.sleep(0)
            yield item

    buf = io.StringIO()
    view = TerminalView(Console(file=buf, width=200))
    calls = []

    def stats():
        calls.append(1)
        return {"samples_per_s": 50.0}

    asyncio.run(asyncio.wait_for(view.run(gen(snaps), gen(_events()), stats), timeout=5))
    assert view.snapshots_seen == 4 and view.events_seen == 2 and len(calls) == 4
    assert "samples/s=50" in buf.getvalue()


def test_bad_view_settings_raise_config_error():
    """A non-positive refresh rate or event limit, or a label width under 4, is refused with ConfigError."""
    np.random.default_rng(9)
    with pytest.raises(ConfigError):
        TerminalView(Console(file=io.StringIO()), refresh_hz=0)
    with pytest.raises(ConfigError):
        TerminalView(Console(file=io.StringIO()), max_events=0)
    with pytest.raises(ConfigError):
        short_labels(["abc"], width=3)
