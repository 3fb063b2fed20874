"""Channels come and go, and their clocks step: churn of names stays bounded, silent channels retire and return,
``max_channels`` counts live channels, and a channel whose stamps step back (or forward past the receive clock)
is re-anchored instead of starved. Simulated time through ``Engine.push_ns``, evaluated hop by hop."""

from __future__ import annotations

import asyncio
import logging
import re
import time
import urllib.request
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
from scipy.signal import lfilter

from streamcorr.config import parse_config
from streamcorr.daemon.service import Daemon
from streamcorr.engine.core import Engine, EngineConfig
from streamcorr.estimate.estimator import Estimator
from tests.brokers import free_port

RATE = 20.0
PERIOD_NS = round(1e9 / RATE)
HOUR_NS = 3600 * 10**9
WINDOW = 64  # 3.2 s at 20 Hz


@pytest.fixture(scope="module")
def est() -> Estimator:
    return Estimator()


def _engine(est: Estimator, **kw: Any) -> Engine:
    base = dict(channels=[], rate_hz=RATE, window_len=WINDOW, hop_samples=20, max_staleness_s=0.1,
                skip_stale_hops=False)  # fmt: skip
    return Engine(EngineConfig(**(base | kw)), est)


def _second(sec: int, base_ns: int = 0) -> np.ndarray:
    """The stamps (int64 ns) of simulated second ``sec``: RATE samples on the clock's ticks, 1 ms after them."""
    return base_ns + (sec * int(RATE) + np.arange(int(RATE), dtype=np.int64)) * PERIOD_NS + 10**6


def _hops(eng: Engine) -> list[Any]:
    return [eng.evaluate(end)[0] for end in eng.due_windows()]


def test_churn_keeps_the_matrix_bounded_and_a_retired_channel_returns(est):
    """One new name a second for two simulated minutes beside three live channels keeps the live channels,
    the matrix and the per-pair state bounded by retire_after_s; a retired name that speaks again is back."""
    rng = np.random.default_rng(29)
    eng = _engine(est, retire_after_s=10.0, max_channels=2048, hop_samples=40)  # a hop every 2 s
    peak_channels = peak_pairs = peak_detector = 0
    snaps = []
    for sec in range(120):
        t = _second(sec)
        x = rng.standard_normal(len(t))
        eng.push_ns("a", t, x)
        eng.push_ns("b", t, x + 0.5 * rng.standard_normal(len(t)))
        eng.push_ns("c", t, rng.standard_normal(len(t)))
        eng.push_ns(f"burst{sec}", t, rng.standard_normal(len(t)))  # speaks for one second, then silent
        if sec == 20:
            eng.push_ns("burst0", t[:2], np.array([np.nan, np.nan]))  # drops a retired channel's ledger keeps
        snaps += _hops(eng)
        peak_channels = max(peak_channels, len(eng.intake.channels))
        peak_pairs = max(peak_pairs, len(eng._pairs))
        det = eng.detector
        peak_detector = max(peak_detector, len(det._dependent) + len(det._level) + len(det._streak))
    # 3 live + the names of the last retire_after_s (10 s) + those of one hop (2 s) before retirement runs
    assert peak_channels <= 3 + 13, peak_channels
    assert peak_pairs <= 16 * 15 // 2 and peak_detector <= 3 * 16 * 15 // 2
    assert eng.counters.channels_retired >= 100
    assert max(len(s.channels) for s in snaps) <= 16 and snaps[-1].mi.shape[0] <= 16
    assert eng.sample_drops()["nonfinite"] == 2  # burst0 retired twice; its drops stay in the ledger
    assert "burst5" not in eng.channels
    for sec in range(120, 130):  # burst5 speaks again: a new channel, at the end of the matrix, with values
        t = _second(sec)
        x = rng.standard_normal(len(t))
        for name, v in (("a", x), ("b", x), ("c", rng.standard_normal(len(t))), ("burst5", x)):
            eng.push_ns(name, t, v + 0.3 * rng.standard_normal(len(t)))
        snaps += _hops(eng)
    last = snaps[-1]
    assert last.channels[-1] == "burst5" and last.channels[:3] == ("a", "b", "c") and "burst110" not in last.channels
    k = last.channels.index("burst5")
    assert last.mi[0, k] > 0.3, last.mi[0, k]  # dependent on a, estimated afresh


def test_max_channels_counts_live_channels(est):
    """With max_channels 4, a fifth name is refused while four channels live, and admitted once two of them
    have been silent for retire_after_s; configured channels never retire."""
    rng = np.random.default_rng(7)
    eng = _engine(est, channels=["cfg"], retire_after_s=5.0, max_channels=4)
    for sec in range(10):
        t = _second(sec)
        for name in ("cfg", "a", "b", "c"):
            eng.push_ns(name, t, rng.standard_normal(len(t))) if name != "cfg" or sec == 0 else None
        _hops(eng)
    assert eng.push_ns("late_comer", _second(10), rng.standard_normal(int(RATE))) == 0
    assert eng.sample_drops()["channel_limit"] == int(RATE)
    for sec in range(10, 30):  # only a speaks; b and c fall silent (cfg too, but it is configured)
        eng.push_ns("a", _second(sec), rng.standard_normal(int(RATE)))
        _hops(eng)
    assert eng.channels == ["cfg", "a"] and eng.counters.channels_retired == 2
    assert eng.push_ns("late_comer", _second(30), rng.standard_normal(int(RATE))) == int(RATE)
    assert eng.push_ns("another", _second(30), rng.standard_normal(int(RATE))) == int(RATE)


def test_a_channel_whose_clock_steps_back_an_hour_is_reanchored(est, caplog):
    """One channel's stamps jump back an hour: its samples are dropped as late (counted) for about
    reanchor_after_s, then it is re-anchored onto the stream clock, logged with the cause, and its pair with a
    dependent channel is estimated again in the snapshots that keep coming."""
    rng = np.random.default_rng(3)
    eng = _engine(est)
    snaps = []
    step_at = 30
    with caplog.at_level(logging.WARNING, logger="streamcorr"):
        for sec in range(60):
            t = _second(sec)
            x = rng.standard_normal(len(t))
            eng.push_ns("a", t, x)
            eng.push_ns("b", t, rng.standard_normal(len(t)))
            eng.push_ns("c", t - (HOUR_NS if sec >= step_at else 0), x + 0.3 * rng.standard_normal(len(t)))
            snaps += _hops(eng)
    assert eng.counters.channels_reanchored == 1
    late = eng.sample_drops()["late"]
    assert 0 < late <= 7 * RATE, late  # about reanchor_after_s (5 s) of samples, no more
    lines = [r.getMessage() for r in caplog.records if "re-anchored" in r.getMessage()]
    assert len(lines) == 1 and re.search(r"'c': stamps stepped back by 3600\.\d+ s; re-anchored", lines[0]), lines
    step_ns = step_at * 10**9
    after = [s for s in snaps if s.t_ns > step_ns]
    assert len(after) >= 25  # a snapshot every hop (1 s) throughout
    # within about a window plus reanchor_after_s of the step, c's cells are new network estimates again
    back = [s for s in after if s.network_age_s is not None and s.network_age_s[0, 2] == 0 and s.mi[0, 2] > 0.5]
    assert back and back[0].t_ns - step_ns <= (5 + 2 * WINDOW / RATE + 1) * 1e9, (back[0].t_ns - step_ns) / 1e9
    assert snaps[-1].channels == ("a", "b", "c") and snaps[-1].mi[0, 2] > 0.5


def test_a_new_device_stamping_seconds_since_boot_is_reanchored_not_churned(est, caplog):
    """A device whose clock counts from its boot joins a stream on the epoch clock: its samples, far behind the
    stream clock, are counted as late (not accepted into a channel that then retires at every hop), and once
    reanchor_after_s of its stamps has passed it is re-anchored, with a hint in the log, and its pair measured."""
    rng = np.random.default_rng(17)
    eng = _engine(est, retire_after_s=10.0)
    base = 1_700_000_000 * 10**9
    snaps = []
    with caplog.at_level(logging.WARNING, logger="streamcorr"):
        for sec in range(40):
            t = _second(sec, base)
            x = rng.standard_normal(len(t))
            eng.push_ns("a", t, x)
            eng.push_ns("boot", _second(sec, 100 * 10**9), x + 0.3 * rng.standard_normal(len(t)))
            snaps += _hops(eng)
    assert eng.counters.channels_retired == 0 and eng.counters.channels_reanchored == 1
    assert 0 < eng.sample_drops()["late"] <= 7 * RATE
    lines = [r.getMessage() for r in caplog.records if "re-anchored" in r.getMessage()]
    assert len(lines) == 1 and "'boot': stamps behind the stream clock by" in lines[0] and "boot" in lines[0], lines
    assert snaps[-1].channels == ("a", "boot") and snaps[-1].mi[0, 1] > 0.5


def test_the_whole_stream_stepping_back_keeps_snapshots_coming(est):
    """Every channel's stamps jump back an hour (the sender's clock stepped): each channel is re-anchored, and
    stream time and snapshots carry on in order instead of stopping for an hour."""
    rng = np.random.default_rng(11)
    eng = _engine(est, channels=["a", "b"])
    snaps = []
    for sec in range(50):
        t = _second(sec) - (HOUR_NS if sec >= 20 else 0)
        x = rng.standard_normal(len(t))
        eng.push_ns("a", t, x)
        eng.push_ns("b", t, x + 0.3 * rng.standard_normal(len(t)))
        snaps += _hops(eng)
    assert eng.counters.channels_reanchored == 2
    times = [s.t_ns for s in snaps]
    assert times == sorted(times) and len(set(times)) == len(times)
    after = [s for s in snaps if s.t_ns > 20 * 10**9]
    assert len(after) >= 20, len(after)  # 30 s of data after the step, less the 5 s before the re-anchor
    assert after[-1].mi[0, 1] > 0.5


def test_a_step_forward_past_the_receive_clock_is_reanchored(est, caplog):
    """A channel whose stamps jump an hour ahead of the receive clock (every sample dropped as future) is
    re-anchored onto the stream clock after reanchor_after_s of its stamps, like a step back."""
    rng = np.random.default_rng(5)
    eng = _engine(est, max_future_s=5.0)
    base = (time.time_ns() // PERIOD_NS) * PERIOD_NS - 300 * 10**9  # five minutes ago: on the receive clock
    with caplog.at_level(logging.WARNING, logger="streamcorr"):
        for sec in range(40):
            t = _second(sec, base)
            x = rng.standard_normal(len(t))
            eng.push_ns("a", t, x)
            eng.push_ns("c", t + (HOUR_NS if sec >= 15 else 0), x + 0.3 * rng.standard_normal(len(t)))
            snap = (_hops(eng) or [None])[-1]
    drops = eng.sample_drops()
    assert eng.counters.channels_reanchored == 1 and 0 < drops["future"] <= 7 * RATE, drops
    assert any("'c': stamps stepped forward by" in r.getMessage() for r in caplog.records)
    assert eng.channel_counters()["c"].accepted >= 30 * RATE
    assert snap is not None and snap.mi[0, 1] > 0.5


def test_daemon_over_zeromq_retires_churned_names_and_reanchors_a_clock_step():
    """A daemon fed over a real ZeroMQ PUSH socket: names that speak once retire (counted in /metrics), and after
    the sender's clock steps back an hour every channel is re-anchored and snapshots keep advancing; before the
    first window is full the channels heard are counted, though none is in the matrix yet."""
    p_in = free_port()
    cfg = parse_config({
        "version": 1,
        "sources": [{"type": "zmq", "endpoint": f"tcp://127.0.0.1:{p_in}", "mode": "pull", "bind": True,
                     "channel_template": "{key}"}],
        "channels": {"rate_hz": 10.0, "retire_after_s": 8.0},
        "window": {"samples": 64, "hop_samples": 10, "skip_stale_hops": False},
        "http": {"port": 0},
        "logging": {"format": "text"},
    })  # fmt: skip
    rng = np.random.default_rng(13)

    async def main() -> tuple[Daemon, str, list[int]]:
        daemon = Daemon(cfg)
        run = asyncio.create_task(daemon.run(install_signals=False))
        for _ in range(200):  # the model loads; the socket binds
            await asyncio.sleep(0.1)
            if daemon.engine_or_none is not None and daemon.engine_or_none.running:
                break
        push = zmq.Context.instance().socket(zmq.PUSH)
        push.connect(f"tcp://127.0.0.1:{p_in}")
        seen: list[int] = []
        for sec in range(70):  # 1,000 s after the epoch: in the past of any receive clock
            t = 1000.0 + sec + np.arange(10) / 10 - (3600 if sec >= 40 else 0)
            x = rng.standard_normal(10)
            chans = {"a": x.tolist(), "b": (x + 0.3 * rng.standard_normal(10)).tolist()}
            if sec < 30:
                chans[f"once{sec}"] = rng.standard_normal(10).tolist()
            push.send_multipart([b"rig", msgpack.packb({"t": t.tolist(), "channels": chans})])
            await asyncio.sleep(0.05)
            if sec == 3:  # before the first window is full: heard, not yet in the matrix
                early_url = f"{daemon.http_url}/metrics"
                early = await asyncio.to_thread(
                    lambda u=early_url: urllib.request.urlopen(u, timeout=10).read().decode()
                )
                assert re.search(r"^streamcorr_channels 0\.0$", early, re.M), early
                assert float(re.search(r"^streamcorr_channels_heard (\S+)$", early, re.M).group(1)) >= 2
            latest = daemon.engine_or_none.latest if daemon.engine_or_none else None
            if latest is not None:
                seen.append(latest.t_ns)
        await asyncio.sleep(1.0)
        assert daemon.http_url is not None
        url = f"{daemon.http_url}/metrics"  # fetched off the loop, which serves it
        metrics = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read().decode())
        push.close(linger=0)
        daemon.stop()
        await run
        return daemon, metrics, seen

    daemon, metrics, seen = asyncio.run(main())
    retired = float(re.search(r"^streamcorr_channels_retired_total (\S+)$", metrics, re.M).group(1))
    reanchored = float(re.search(r"^streamcorr_channels_reanchored_total (\S+)$", metrics, re.M).group(1))
    assert retired >= 20 and reanchored == 2, (retired, reanchored)
    assert max(seen) > 1000e9 + 55e9, (max(seen) - 1000e9) / 1e9  # snapshots went on past the step (at 40 s)
    engine = daemon.engine_or_none
    assert engine is not None and set(engine.channels) == {"a", "b"}


def test_a_channel_faster_than_the_clock_gets_a_buffer_that_holds_its_windows(est, caplog):
    """A 16x-faster channel (320 Hz on a 20 Hz clock, smooth, with jitter) beside one on the clock: its buffer grows
    until it spans a window, so the pair is estimated at full coverage and found dependent; a flood of samples
    nanoseconds apart grows its buffer only to the bound, and says so once in the log."""
    rng = np.random.default_rng(19)
    eng = _engine(est)
    base = 1_700_000_000 * 10**9
    fast_hz = 16 * RATE
    snaps = []
    with caplog.at_level(logging.WARNING, logger="streamcorr"):
        for sec in range(12):
            t_fast = (
                base
                + sec * 10**9
                + np.arange(int(fast_hz)) * round(1e9 / fast_hz)
                + rng.integers(0, 10**5, int(fast_hz))
            )
            x = lfilter([1.0], [1.0, -0.95], rng.standard_normal(len(t_fast)))  # a 60-ms time constant
            t = _second(sec, base)
            held = x[np.searchsorted(t_fast, t, side="right") - 1]
            eng.push_ns("imu", t_fast, x)
            eng.push_ns("slow", t, held + 0.2 * rng.standard_normal(len(t)))
            snaps += _hops(eng)
        grown = eng.intake.channels["imu"].buffer.capacity
        assert eng.intake.channels["slow"].buffer.capacity == eng.intake.capacity
        assert eng.intake.capacity < WINDOW * 16 <= grown <= 16 * eng.intake.capacity
        assert snaps[-1].coverage[0, 1] == 1.0 and snaps[-1].mi[0, 1] > 0.3 and snaps[-1].dependent[0, 1]
        flood = base + 12 * 10**9 + np.arange(200_000)  # 1 ns apart
        for k in range(0, len(flood), 20_000):
            eng.push_ns("imu", flood[k : k + 20_000], rng.standard_normal(20_000))
    assert eng.intake.channels["imu"].buffer.capacity <= 16 * eng.intake.capacity
    lines = [r.getMessage() for r in caplog.records if "faster than its buffer" in r.getMessage()]
    assert len(lines) == 1 and "'imu'" in lines[0], lines


def test_hops_that_fall_behind_are_skipped_with_a_warning_that_says_what_to_try(est, caplog):
    """Ten seconds of samples arriving at once with skip_stale_hops: the hops they make due but that the engine has
    no time for are skipped, counted, and logged once (rate-limited) with what to try."""
    rng = np.random.default_rng(23)
    eng = _engine(est, skip_stale_hops=True)
    with caplog.at_level(logging.WARNING, logger="streamcorr"):
        for sec in (0, 1, 2, 3):
            eng.push_ns("a", _second(sec), rng.standard_normal(int(RATE)))
        _hops(eng)
        t = np.concatenate([_second(sec) for sec in range(4, 14)])
        eng.push_ns("a", t, rng.standard_normal(len(t)))
        assert len(_hops(eng)) == 1  # the newest due hop only
    assert eng.counters.hops_skipped >= 8
    lines = [r.getMessage() for r in caplog.records if "hop(s) skipped" in r.getMessage()]
    assert len(lines) == 1 and "estimator.threads: 1" in lines[0], lines


@pytest.mark.parametrize("jump_s", [60, 1_796_000_000])  # a pause of the whole stream; boot stamps, then epoch ones
def test_a_jump_of_the_stream_clock_is_a_gap_not_compute_falling_behind(est, caplog, jump_s):
    """Samples that resume more than a window after the stream's newest stamp (a pause of every channel, or a
    device whose stamps count from its boot and then from the epoch) pass over the hops inside the gap: counted
    in hops_in_gaps, said once with the channel and the jump, while hops_skipped (compute falling behind) stays
    0 and the windows before and after the gap are evaluated."""
    rng = np.random.default_rng(24)
    eng = _engine(est, skip_stale_hops=True)
    ends = []
    with caplog.at_level(logging.WARNING, logger="streamcorr"):
        for sec in range(5):
            for name in ("a", "b"):
                eng.push_ns(name, _second(sec), rng.standard_normal(int(RATE)))
            ends += _hops(eng)
        for sec in range(jump_s, jump_s + 6):
            for name in ("b", "a"):
                eng.push_ns(name, _second(sec), rng.standard_normal(int(RATE)))
            ends += _hops(eng)
    assert eng.counters.hops_skipped == 0
    gap_hops = (jump_s - 5) * int(RATE) // 20  # hops of 20 ticks (1 s) whose windows end in the gap, about
    assert abs(eng.counters.hops_in_gaps - gap_hops) <= 4, (eng.counters.hops_in_gaps, gap_hops)
    times = [snap.t_ns / 1e9 for snap in ends]
    assert min(times) < 5 and max(times) > jump_s + 3  # windows before and after the gap
    lines = [r.getMessage() for r in caplog.records if "jumped" in r.getMessage()]
    assert len(lines) == 1 and "'b'" in lines[0] and "hops_in_gaps" in lines[0], lines
    assert not [r for r in caplog.records if "hop(s) skipped" in r.getMessage()]


def test_a_channel_slower_than_the_staleness_limit_is_named_once_with_the_setting(est, caplog):
    """A 5 Hz channel with max_staleness_s 0.1 (stale between its samples, its pairs never estimated) is named
    once in the log with a max_staleness_s that fixes it, whether its samples come in batches or one by one; a
    channel on the 20 Hz clock is not, nor a 10 Hz one whose median interval is a hair over max_staleness_s (a
    clock 0.2% slow, 1 ms jitter: stale for slivers, its pairs estimated)."""
    rng = np.random.default_rng(29)
    eng = _engine(est)
    base = 1_700_000_000 * 10**9
    drift = base + np.round(np.arange(120) * 100.2e6 + rng.uniform(-1e6, 1e6, 120)).astype(np.int64)
    with caplog.at_level(logging.WARNING, logger="streamcorr"):
        for sec in range(12):
            eng.push_ns("clock", _second(sec, base), rng.standard_normal(int(RATE)))
            eng.push_ns("batch5hz", _second(sec, base)[::4], rng.standard_normal(5))
            for t in _second(sec, base)[1::4]:
                eng.push_ns("single5hz", np.array([t]), rng.standard_normal(1))
            eng.push_ns("drift10hz", drift[10 * sec : 10 * sec + 10], rng.standard_normal(10))
            _hops(eng)
    assert np.median(np.diff(drift)) > 0.1e9  # the median interval is over max_staleness_s
    lines = [r.getMessage() for r in caplog.records if "less often than channels.max_staleness_s" in r.getMessage()]
    assert sorted(line.split("'")[1] for line in lines) == ["batch5hz", "single5hz"], lines
    assert all("samples every 0.2 s" in line and "max_staleness_s to 0.3 or more" in line for line in lines), lines
