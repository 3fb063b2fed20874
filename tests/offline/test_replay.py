"""`streamcorr replay`: a CSV log equals a live daemon fed over ZeroMQ; MCAP and ROS 2 bags written with the
packages' own writers replay end to end; bad logs give one-line errors; Ctrl-C leaves readable output."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import yaml
import zmq

from streamcorr.cli.commands import main
from streamcorr.config import parse_config
from streamcorr.daemon.service import Daemon
from streamcorr.publish.subscriber import Subscriber
from tests.brokers import free_port, pearson_blind_rig

pq = pytest.importorskip("pyarrow.parquet")

RATE = 10.0
# the README's screenshot is refreshed on request (STREAMCORR_SCREENSHOT=1), so test runs leave the tree clean
REPORT_SCREENSHOT = Path(__file__).resolve().parents[2] / "bench" / "results" / "replay_report.png"
CHANNELS = ["a", "b", "c"]


def _write_csv(path: Path, t: np.ndarray, v: np.ndarray) -> None:
    lines = ["t," + ",".join(CHANNELS)]
    lines += [",".join(repr(float(x)) for x in (t[k], *v[:, k])) for k in range(len(t))]  # exact round trip
    path.write_text("\n".join(lines) + "\n")


def _timeline(outdir: Path) -> dict[int, dict[tuple[str, str], float]]:
    rows = pq.read_table(outdir / "timeline.parquet").to_pylist()
    out: dict[int, dict[tuple[str, str], float]] = {}
    for r in rows:
        out.setdefault(r["t_ns"], {})[(r["a"], r["b"])] = r["mi"]
    return out


def test_csv_replay_equals_a_live_daemon_fed_over_zeromq(tmp_path, capsys):
    """The same config file and samples: replay's matrices equal the live daemon's (1e-6) and its events come at
    the same stream times, with the same pairs and kinds."""
    t, v = pearson_blind_rig(60, seed=3)
    p_in, p_out, p_last = free_port(), free_port(), free_port()
    source = {"type": "zmq", "endpoint": f"tcp://127.0.0.1:{p_in}", "mode": "pull", "bind": True}
    source["channel_template"] = "{key}"
    zmq_out = {"endpoint": f"tcp://127.0.0.1:{p_out}", "snapshot_endpoint": f"tcp://127.0.0.1:{p_last}"}
    cfg_dict = {
        "version": 1,
        "sources": [source],
        "channels": {"names": CHANNELS, "rate_hz": RATE, "max_staleness_s": 0.05},
        "window": {"samples": 64, "hop_samples": 16, "skip_stale_hops": False},
        "outputs": {"zmq": zmq_out, "status_interval_s": 0.5},
        "http": {"port": 0},
        "logging": {"format": "text"},
    }
    cfg_path = tmp_path / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg_dict))
    log = tmp_path / "log.csv"
    _write_csv(log, t, v)

    async def live() -> tuple[list[Any], list[Any]]:
        daemon = Daemon(parse_config(cfg_dict))
        run = asyncio.create_task(daemon.run(install_signals=False))
        for _ in range(1200):  # the engine is prepared in a thread (model load): wait until it runs
            if daemon.phase == "running":
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        snaps: list[Any] = []
        events: list[Any] = []
        async with Subscriber(f"tcp://127.0.0.1:{p_out}", late_join=False) as sub:
            await asyncio.sleep(0.3)  # PUB/SUB: let the subscription reach the publisher

            async def take_snaps() -> None:
                async for s in sub.snapshots(quiet_s=5.0):
                    snaps.append(s)

            async def take_events() -> None:
                async for e in sub.events():  # until cancelled: events are sparse
                    events.append(e)

            drain = asyncio.create_task(take_snaps())
            take = asyncio.create_task(take_events())
            push = zmq.Context.instance().socket(zmq.PUSH)
            push.connect(f"tcp://127.0.0.1:{p_in}")
            for k in range(0, len(t), 10):  # paced like a live sensor, and never a ring buffer ahead of the engine
                deadline = asyncio.get_running_loop().time() + 120
                while t[k] - (snaps[-1].t_ns / 1e9 if snaps else t[0] + 6.3) > 10.0:  # a loaded machine's slow hops
                    assert asyncio.get_running_loop().time() < deadline, "the live daemon stopped evaluating"
                    await asyncio.sleep(0.05)
                chunk = {
                    "t": t[k : k + 10].tolist(),
                    "channels": {c: v[i, k : k + 10].tolist() for i, c in enumerate(CHANNELS)},
                }
                push.send_multipart([b"rig", msgpack.packb(chunk)])
                await asyncio.sleep(0.05)
            push.close(linger=2000)
            await drain  # 5 s without a snapshot: the daemon has evaluated everything
            take.cancel()
        daemon.stop()
        await run
        return snaps, events

    snaps, events = asyncio.run(live())
    out = tmp_path / "out"
    assert main(["replay", str(log), "-c", str(cfg_path), "-o", str(out), "--no-progress"]) == 0
    timeline = _timeline(out)
    assert len(timeline) == (len(t) - 64) // 16 + 1  # every hop, none skipped
    assert len(snaps) >= 0.8 * len(timeline)  # the live side may lose a few snapshots on PUB/SUB, not events
    hops = sorted(timeline)
    for s in snaps:
        mine = timeline[s.t_ns]
        for i, j in zip(*np.triu_indices(3, 1), strict=True):
            got, want = mine[(s.channels[i], s.channels[j])], float(s.mi[i, j])
            assert abs(got - want) <= 1e-6, (
                hops.index(s.t_ns),
                s.channels[i],
                s.channels[j],
                got,
                want,
                s.age_s,
                s.coverage,
            )
    # the detector's verdict and n_eff as the live daemon published them (float32 on the wire and on disk)
    rows = {(r["t_ns"], r["a"], r["b"]): r for r in pq.read_table(out / "timeline.parquet").to_pylist()}
    for s in snaps:
        assert s.dependent is not None and s.n_eff is not None
        for i, j in zip(*np.triu_indices(3, 1), strict=True):
            row = rows[(s.t_ns, s.channels[i], s.channels[j])]
            assert row["dependent"] == bool(s.dependent[i, j])
            np.testing.assert_array_equal(np.float32(row["n_eff"]), np.float32(s.n_eff[i, j]))
    replayed = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert [(e["t_ns"], (e["a"], e["b"]), e["change"], e["initial"]) for e in replayed] == [
        (e.t_ns, e.pair, e.kind, e.initial) for e in events
    ]
    assert ("a", "b") in {(e["a"], e["b"]) for e in replayed if e["change"] == "became-dependent"}
    ev_table = pq.read_table(out / "events.parquet")
    assert ev_table.column_names[:8] == ["time", "t_ns", "a", "b", "change", "previous", "current", "initial"]
    assert ev_table.num_rows == len(replayed)
    info = json.loads((out / "replay.json").read_text())
    assert info["hops"] == len(timeline) and not info["interrupted"]


def _mcap_json(path: Path, seconds: float, rate: float, seed: int) -> None:
    from mcap.writer import Writer

    rng = np.random.default_rng(seed)
    with path.open("wb") as f:
        w = Writer(f)
        w.start()
        sid = w.register_schema(name="Imu", encoding="jsonschema", data=b'{"type": "object"}')
        imu = w.register_channel(topic="/imu", message_encoding="json", schema_id=sid)
        motor = w.register_channel(topic="/motor", message_encoding="json", schema_id=sid)
        for k in range(int(seconds * rate)):
            t_ns = 1_700_000_000_000_000_000 + round(k * 1e9 / rate)
            x, y, noise = rng.standard_normal(3)
            msg = {"accel": {"x": x, "y": y}, "frame": "base", "ok": True, "gains": [1.0, 2.0]}
            w.add_message(imu, log_time=t_ns, data=json.dumps(msg).encode(), publish_time=t_ns)
            w.add_message(motor, log_time=t_ns, data=json.dumps({"current": x**2 + 0.1 * noise}).encode(),
                          publish_time=t_ns)  # fmt: skip
        w.finish()


def test_mcap_json_log_replays_end_to_end_and_lists_its_channels(tmp_path, capsys):
    """An MCAP file with JSON messages (mcap's own writer): fields become topic.field.subfield channels, --list
    shows them, and the quadratic dependence between two topics is found."""
    log = tmp_path / "run.mcap"
    _mcap_json(log, seconds=30, rate=20, seed=4)
    assert main(["replay", str(log), "--list"]) == 0
    listing = capsys.readouterr().out
    assert "topic /imu" in listing and "imu.accel.x" in listing and "motor.current" in listing
    assert "imu.frame" not in listing and "imu.ok" not in listing  # text and booleans are not channels
    out = tmp_path / "out"
    rc = main(
        ["replay", str(log), "--rate-hz", "20", "--window", "128", "--hop", "40", "-o", str(out), "--no-progress"]
    )
    assert rc == 0
    last = _timeline(out)[max(_timeline(out))]
    assert last[("imu.accel.x", "motor.current")] > 0.5
    assert last[("imu.accel.y", "motor.current")] < 0.3
    assert ("imu.gains.0", "imu.gains.1") in last  # short numeric arrays are channels (constant here: MI 0)


def _ros2_bag(path: Path, seconds: float, rate: float, seed: int) -> None:
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS2_HUMBLE)
    twist, vec = store.types["geometry_msgs/msg/Twist"], store.types["geometry_msgs/msg/Vector3"]
    rng = np.random.default_rng(seed)
    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as w:
        conn = w.add_connection("/cmd_vel", twist.__msgtype__, typestore=store)
        for k in range(int(seconds * rate)):
            x, y, z = rng.standard_normal(3)
            msg = twist(linear=vec(x=x, y=y, z=z), angular=vec(x=0.0, y=0.0, z=np.sin(2 * x) + 0.1 * z))
            w.write(
                conn, 1_700_000_000_000_000_000 + round(k * 1e9 / rate), store.serialize_cdr(msg, twist.__msgtype__)
            )


def test_ros2_bag_replays_end_to_end_and_its_mcap_reads_the_same(tmp_path):
    """A ROS 2 bag (rosbags' writer, MCAP storage) replays through rosbags; its .mcap file read directly (ROS 2
    CDR through mcap-ros2-support) gives the same channels and samples."""
    from streamcorr.offline.logs import open_log

    bag = tmp_path / "bag"
    _ros2_bag(bag, seconds=30, rate=20, seed=5)
    via_bag = open_log(bag)
    via_mcap = open_log(next(bag.glob("*.mcap")))
    assert via_bag.kind == "ROS 2 bag" and via_mcap.kind == "MCAP"
    assert list(via_bag.series) == list(via_mcap.series)
    assert "cmd_vel.linear.x" in via_bag.series and "cmd_vel.angular.z" in via_bag.series
    for name, s in via_bag.series.items():
        np.testing.assert_array_equal(s.values, via_mcap.series[name].values)
        np.testing.assert_array_equal(s.t, via_mcap.series[name].t)
    out = tmp_path / "out"
    rc = main(["replay", str(bag), "--channels", "cmd_vel.linear.x", "cmd_vel.linear.y", "cmd_vel.angular.z",
               "--rate-hz", "20", "--window", "128", "--hop", "40", "-o", str(out), "--no-progress"])  # fmt: skip
    assert rc == 0
    last = _timeline(out)[max(_timeline(out))]
    assert last[("cmd_vel.linear.x", "cmd_vel.angular.z")] > 0.5
    assert last[("cmd_vel.linear.x", "cmd_vel.linear.y")] < 0.3


def test_ros1_bag_replays_end_to_end(tmp_path):
    """A ROS 1 bag (rosbags' writer, Noetic types): Vector3Stamped fields become channels (its header is left
    out) and the dependence between two of them is found."""
    from rosbags.rosbag1 import Writer
    from rosbags.typesys import Stores, get_typestore

    store = get_typestore(Stores.ROS1_NOETIC)
    stamped, vec = store.types["geometry_msgs/msg/Vector3Stamped"], store.types["geometry_msgs/msg/Vector3"]
    header, stamp = store.types["std_msgs/msg/Header"], store.types["builtin_interfaces/msg/Time"]
    rng = np.random.default_rng(9)
    bag = tmp_path / "run.bag"
    with Writer(bag) as w:
        conn = w.add_connection("/accel", stamped.__msgtype__, typestore=store)
        for k in range(600):
            t_ns = 1_700_000_000_000_000_000 + k * 50_000_000
            x, y, z = rng.standard_normal(3)
            hdr = header(seq=k, stamp=stamp(sec=t_ns // 10**9, nanosec=t_ns % 10**9), frame_id="imu")
            msg = stamped(header=hdr, vector=vec(x=x, y=np.abs(x) + 0.1 * y, z=z))
            w.write(conn, t_ns, store.serialize_ros1(msg, stamped.__msgtype__))
    out = tmp_path / "out"
    flags = ["--rate-hz", "20", "--window", "128", "--hop", "40", "--no-progress"]
    assert main(["replay", str(bag), *flags, "-o", str(out)]) == 0
    last = _timeline(out)[max(_timeline(out))]
    assert set(last) == {("accel.vector.x", "accel.vector.y"), ("accel.vector.x", "accel.vector.z"),
                         ("accel.vector.y", "accel.vector.z")}  # fmt: skip
    assert last[("accel.vector.x", "accel.vector.y")] > 0.5 > last[("accel.vector.x", "accel.vector.z")]


def test_history_writes_the_verdict_n_eff_and_initial(tmp_path):
    """The timeline has each pair's dependent (null where the snapshot does not know it) and n_eff (NaN:
    none yet); events.parquet and events.jsonl carry initial."""
    from streamcorr.engine.changes import ChangeEvent
    from streamcorr.engine.matrix import MatrixState
    from streamcorr.publish.history import TIMELINE_COLUMNS, HistoryWriter

    rng = np.random.default_rng(31)
    state = MatrixState(["x", "y", "z"])
    i, j = np.array([0, 0, 1]), np.array([1, 2, 2])
    state.update(i, j, rng.uniform(0, 1, 3), np.ones(3), 10**9)
    n_eff = rng.uniform(20, 1000, 2)
    state.set_significance(i[:2], j[:2], np.array([True, False]), n_eff)  # y ~ z assessed, not yet judged
    judged = state.snapshot(10**9, 0)
    unknown = dataclasses.replace(state.snapshot(2 * 10**9, 0), dependent=None, n_eff=None)  # an older source
    events = [ChangeEvent(("x", "y"), 0.0, 0.8, 10**9, "became-dependent", initial=True),
              ChangeEvent(("x", "z"), 0.0, 0.5, 2 * 10**9, "became-dependent")]  # fmt: skip
    with HistoryWriter(tmp_path) as w:
        w.add(judged, events[:1])
        w.add(unknown, events[1:])
    table = pq.read_table(tmp_path / "timeline.parquet")
    assert tuple(table.column_names) == TIMELINE_COLUMNS
    assert str(table.schema.field("dependent").type) == "bool" and str(table.schema.field("n_eff").type) == "float"
    rows = {(r["t_ns"], r["a"], r["b"]): r for r in table.to_pylist()}
    assert [rows[(10**9, a, b)]["dependent"] for a, b in (("x", "y"), ("x", "z"), ("y", "z"))] == [True, False, False]
    np.testing.assert_allclose([rows[(10**9, "x", c)]["n_eff"] for c in "yz"], n_eff, rtol=1e-6)
    assert np.isnan(rows[(10**9, "y", "z")]["n_eff"])
    assert {rows[(2 * 10**9, a, b)]["dependent"] for a, b in (("x", "y"), ("y", "z"))} == {None}
    lines = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["initial"] for e in lines] == [True, False]
    assert pq.read_table(tmp_path / "events.parquet").column("initial").to_pylist() == [True, False]


def _judged_history(outdir: Path, rng: np.random.Generator, hops: int = 6) -> None:
    """A replay-shaped directory: x ~ y dependent from the start (an initial event), x ~ z never significant."""
    from streamcorr.engine.changes import ChangeEvent
    from streamcorr.engine.matrix import MatrixState
    from streamcorr.publish.history import HistoryWriter

    state = MatrixState(["x", "y", "z"])
    i, j = np.array([0, 0, 1]), np.array([1, 2, 2])
    with HistoryWriter(outdir) as w:
        for k in range(hops):
            t_ns = (k + 1) * 10**9
            state.update(i, j, np.array([0.9, 0.05, 0.3]) + rng.uniform(0, 0.01, 3), np.ones(3), t_ns)
            state.set_significance(i, j, np.array([True, False, k >= 3]), np.array([812.0, 640.0, 500.0]))
            events = [ChangeEvent(("x", "y"), 0.0, 0.9, t_ns, "became-dependent", initial=True)] if k == 0 else []
            if k == 3:
                events.append(ChangeEvent(("y", "z"), 0.3, 0.3, t_ns, "became-dependent"))
            w.add(state.snapshot(t_ns, 0), events)
    info = {"channels": ["x", "y", "z"], "t_start": 0.0, "t_end": float(hops)}
    (outdir / "replay.json").write_text(json.dumps(info))


def test_report_hatches_cells_not_significant_and_marks_initial_events(tmp_path):
    """The report hatches cells the detector did not find dependent (legend says so), gives n_eff in the cell
    tooltips and each line's share of dependent hops, and marks an initial event as initial (hollow marker)."""
    import html as html_mod

    from streamcorr.offline.report import write_report

    _judged_history(tmp_path / "out", np.random.default_rng(32))
    write_report(tmp_path / "out", tmp_path / "r.html", at=[6.0])
    text = html_mod.unescape((tmp_path / "r.html").read_text())
    assert "hatched: not significant" in text
    assert len(re.findall(r"<td [^>]*class='ns'", text)) == 2  # x ~ z at the last hop, both halves of the matrix
    assert "x ~ y: 0.9" in text and "; dependent; n_eff 812" in text and "x ~ z: 0.0" in text
    assert "; not significant; n_eff 640" in text
    assert "dependent in 100% of hops, n_eff 812" in text and "dependent in 0% of hops, n_eff 640" in text
    assert "dependent in 50% of hops" in text  # y ~ z: from the fourth of six hops on
    assert text.count("class='initial'") == 2  # the hollow marker on x ~ y's line and the table's tag
    assert "became-dependent (initial)" in text
    assert text.count("<rect class='dep'") == 2  # runs of dependent hops: x ~ y's and y ~ z's


def test_report_of_output_without_the_verdict_draws_no_significance_marks(tmp_path):
    """Replay output written without dependent / n_eff / initial (an older streamcorr) still reports, plainly."""
    import pyarrow as pa

    from streamcorr.offline.report import write_report

    out = tmp_path / "out"
    _judged_history(out, np.random.default_rng(33))
    timeline = pq.read_table(out / "timeline.parquet").drop_columns(["dependent", "n_eff"])
    pq.write_table(timeline, out / "timeline.parquet")
    events = pq.read_table(out / "events.parquet").drop_columns(["initial"])
    pq.write_table(pa.table(events), out / "events.parquet")
    write_report(out, tmp_path / "r.html")
    text = (tmp_path / "r.html").read_text()
    assert "hatched" not in text and "class='ns'" not in text and "n_eff" not in text
    assert "(initial)" not in text and "class='initial'" not in text and "figure class='matrix'" in text


def test_long_parquet_log_replays_like_the_wide_csv(tmp_path):
    """The same samples as a long Parquet table (time, channel, value) and as a wide CSV give the same timeline."""
    import pyarrow as pa

    t, v = pearson_blind_rig(20, seed=6)
    wide = tmp_path / "wide.csv"
    _write_csv(wide, t, v)
    long = tmp_path / "long.parquet"
    n = len(t)
    pq.write_table(pa.table({"time": np.tile(t, 3), "channel": np.repeat(CHANNELS, n), "value": v.reshape(-1)}), long)
    flags = ["--rate-hz", "10", "--window", "64", "--hop", "32", "--no-progress"]
    assert main(["replay", str(wide), "-o", str(tmp_path / "w"), *flags]) == 0
    assert main(["replay", str(long), "-o", str(tmp_path / "l"), *flags]) == 0
    assert _timeline(tmp_path / "w") == _timeline(tmp_path / "l")


def test_ctrl_c_stops_cleanly_with_what_was_done_written(tmp_path, monkeypatch, capsys):
    """A KeyboardInterrupt part way returns 130 and leaves timeline and events readable up to the last hop done."""
    from streamcorr.engine.core import Engine

    t, v = pearson_blind_rig(30, seed=7)
    log = tmp_path / "log.csv"
    _write_csv(log, t, v)
    real = Engine.evaluate
    calls = {"n": 0}

    def evaluate(self: Engine, end_tick: int) -> Any:
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return real(self, end_tick)

    monkeypatch.setattr(Engine, "evaluate", evaluate)
    out = tmp_path / "out"
    assert main(["replay", str(log), "--rate-hz", "10", "--window", "64", "--hop", "16", "-o", str(out),
                 "--no-progress"]) == 130  # fmt: skip
    assert "stopped (Ctrl-C or SIGTERM) after 3 hops" in capsys.readouterr().out
    assert len(_timeline(out)) == 3
    assert pq.read_table(out / "events.parquet").num_rows == 0
    assert json.loads((out / "replay.json").read_text())["interrupted"] is True


@pytest.mark.parametrize(
    ("name", "content", "args", "expect"),
    [
        ("missing.csv", None, [], "no such file"),
        ("empty.csv", "", [], "is empty"),
        ("notime.csv", "x,y\n1,2\n3,4\n", [], "which column is time"),
        ("badtime.csv", "t,x\n1,2\n", ["--time-column", "when"], "no column 'when'"),
        ("text.csv", "t,x\n1,a\n2,b\n", [], "no numeric channel"),
        ("short.csv", "t,x,y\n" + "".join(f"{k / 100},{k},{k * k}\n" for k in range(50)), [], "use a smaller --window"),
        ("junk.mcap", b"\x89MCAP0\r\n" + b"\x00" * 40, [], "not a readable MCAP file"),
        ("junk.bag", b"#ROSBAG V2.0\n" + b"\x01" * 64, [], "not a readable ROS bag"),
        ("junk.parquet", b"PAR1 not really", [], "cannot read"),
        ("binary.csv", b"\xff\xfe\x00garbage\n", [], "not UTF-8"),
        ("good.csv", "t,x,y\n" + "".join(f"{k / 100},{k},{k * k}\n" for k in range(50)), ["--channels", "z"], "not in"),
    ],
)
def test_bad_logs_give_one_line_errors(tmp_path, capsys, name, content, args, expect):
    """Unreadable, empty, mis-specified or too short logs: exit code 2 and a message naming the fix, no traceback."""
    path = tmp_path / name
    if isinstance(content, str):
        path.write_text(content)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    rc = main(["replay", str(path), "-o", str(tmp_path / "out"), "--no-progress", *args])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("streamcorr: error:") and expect in err, err
    assert "Traceback" not in err


def test_a_config_without_sources_is_enough_for_replay(tmp_path):
    """replay -c accepts a config file without 'sources'; 'run' still requires them."""
    from streamcorr.config import load_config
    from streamcorr.errors import ConfigError

    p = tmp_path / "c.yaml"
    p.write_text("version: 1\nwindow: {samples: 64, hop_samples: 16}\n")
    assert load_config(p, need_sources=False).sources == []
    with pytest.raises(ConfigError, match="sources"):
        load_config(p)


def test_report_of_a_7_minute_replay_renders_offline_in_chromium(tmp_path, chromium):
    """streamcorr report on a 7-minute replay: one HTML file that headless Chromium renders with no request
    beyond the file itself and no console error, showing matrices, MI lines, events and lookup tables."""
    rng = np.random.default_rng(8)
    n = 7 * 60 * 10
    t = np.arange(n) / 10.0
    x = rng.standard_normal((6, n))
    x[1] = 0.8 * x[0] + 0.6 * x[1]  # dependent throughout
    x[3, n // 2 :] = x[2, n // 2 :] ** 2 + 0.2 * x[3, n // 2 :]  # from 3.5 min on: events
    names = ["arm.j1", "arm.j2", "fan.rpm", "fan.current", "cabinet.temp", "spare<in>&"]  # one needing escapes
    log = tmp_path / "seven.csv"
    log.write_text("t," + ",".join(names) + "\n" + "".join(
        f"{float(t[k])!r}," + ",".join(repr(float(v)) for v in x[:, k]) + "\n" for k in range(n)))  # fmt: skip
    out = tmp_path / "out"
    flags = ["--rate-hz", "10", "--window", "64", "--hop", "100", "--no-progress"]
    assert main(["replay", str(log), *flags, "-o", str(out)]) == 0
    html_path = tmp_path / "report.html"
    assert main(["report", str(out), "-o", str(html_path), "--at", "60", "400"]) == 0
    text = html_path.read_text()
    assert "spare&lt;in&gt;&amp;" in text and "<in>&" not in text
    assert "http://" not in text and "https://" not in text

    page = chromium.new_page(viewport={"width": 1280, "height": 900})
    requests: list[str] = []
    problems: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.on("console", lambda m: problems.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
    try:
        page.goto(html_path.as_uri())
        page.wait_for_load_state("load")
        assert page.locator("figure.matrix").count() == 2  # the two instants asked for
        assert page.locator("figure.line").count() >= 2
        assert page.locator("figure.theta img").count() >= 1
        assert page.locator("table.events tr").count() >= 2  # header + at least one event
        lines = page.locator("figure.line figcaption").all_inner_texts()
        assert any("fan.rpm ~ fan.current" in s for s in lines) and any("arm.j1 ~ arm.j2" in s for s in lines)
        assert all(page.evaluate("[...document.images].every(i => i.complete && i.naturalWidth > 0)") for _ in [0])
        if os.environ.get("STREAMCORR_SCREENSHOT"):
            page.screenshot(path=str(REPORT_SCREENSHOT), full_page=False)
    finally:
        page.close()
    others = [u for u in requests if u != html_path.as_uri() and not u.startswith("data:")]
    assert others == [], others
    assert problems == [], problems


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_sigint_to_a_running_replay_writes_what_was_done(tmp_path, signame):
    """A real SIGINT (Ctrl-C) or SIGTERM (`timeout`, a service manager) to `streamcorr replay` part way: exit 130,
    and the timeline, events and replay.json hold every hop done before it."""
    import signal
    import subprocess
    import sys
    import time

    rng = np.random.default_rng(10)
    n = 60_000  # 10 minutes at 100 Hz: far more hops than the seconds this test waits
    v = rng.standard_normal((3, n))
    log = tmp_path / "long.csv"
    np.savetxt(log, np.vstack([np.arange(n) / 100, v]).T, delimiter=",", header="t,a,b,c", comments="", fmt="%.9g")
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamcorr", "replay", str(log), "--rate-hz", "100", "--window", "256",
         "--hop", "10", "--no-progress", "-o", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline().startswith("replaying"), "the replay did not start"
        deadline = time.monotonic() + 120
        while not list(out.glob(".streamcorr-*/events.jsonl")):  # made once the engine is ready (model, calibration)
            assert proc.poll() is None and time.monotonic() < deadline, "the engine did not start"
            time.sleep(0.1)
        time.sleep(2.0)
        proc.send_signal(getattr(signal, signame))
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    done = int(stdout.split("stopped (Ctrl-C or SIGTERM) after ")[1].split(" hops")[0])
    assert 0 < done < (n - 256) // 10
    assert len(_timeline(out)) == done
    assert json.loads((out / "replay.json").read_text())["interrupted"] is True
    pq.read_table(out / "events.parquet")  # readable (empty or not)


def test_mcap_with_topics_microseconds_apart_replays_like_the_csv_of_the_same_samples(tmp_path):
    """Independent channels on two MCAP topics stamped a few microseconds apart give the same timeline as the
    CSV of the same samples (each on its own stamp), and read as independent: no dependence from alignment."""
    from mcap.writer import Writer

    rng = np.random.default_rng(29)
    rate, n = 50.0, 3000
    base = 1_732_700_000_000_000_000 + np.arange(n) * round(1e9 / rate)
    stamps = {"a": base + 3_000, "b": base + 7_000 + rng.integers(-2_000, 2_000, n), "c": base + 11_000}
    values = {c: rng.standard_normal(n) for c in stamps}
    mcap = tmp_path / "log.mcap"
    with mcap.open("wb") as f:
        w = Writer(f)
        w.start()
        sid = w.register_schema(name="S", encoding="jsonschema", data=b'{"type": "object"}')
        chans = {c: w.register_channel(topic=f"/{c}", message_encoding="json", schema_id=sid) for c in stamps}
        for k in range(n):
            for c in stamps:
                t = int(stamps[c][k])
                w.add_message(chans[c], log_time=t, publish_time=t, data=json.dumps({"v": values[c][k]}).encode())
        w.finish()
    csv = tmp_path / "log.csv"  # long form: one row per sample, its own stamp in float seconds
    lines = ["t,channel,value"] + [
        f"{float(stamps[c][k]) / 1e9!r},{c}.v,{float(values[c][k])!r}" for k in range(n) for c in stamps
    ]
    csv.write_text("\n".join(lines) + "\n")
    outs = {}
    for log in (mcap, csv):
        out = tmp_path / log.suffix[1:]
        rc = main(["replay", str(log), "--rate-hz", "50", "--window", "256", "--hop", "50", "-o", str(out),
                   "--no-progress"])  # fmt: skip
        assert rc == 0
        outs[log.suffix] = _timeline(out)
    a, b = outs[".mcap"], outs[".csv"]
    assert a.keys() == b.keys() and len(a) > 40
    diffs = [abs(a[t][p] - b[t][p]) for t in a for p in a[t] if np.isfinite(a[t][p])]
    assert np.quantile(diffs, 0.95) <= 0.02
    assert max(v for hop in a.values() for v in hop.values() if np.isfinite(v)) < 0.15


def test_channels_slower_than_the_staleness_limit_are_named_with_the_setting_that_fixes_them(tmp_path, capsys):
    """A CSV with two 100 Hz channels and a 10 Hz one replayed at the defaults (max_staleness_s 0.05): the 10 Hz
    channel's pairs are never estimated, and a note on stderr and in replay.json names it and the setting; with
    channels.max_staleness_s from the note in a -c config, every pair is estimated and there is no note."""
    from streamcorr.cli.commands import main

    rng = np.random.default_rng(57)
    n = 3000  # 30 s at 100 Hz
    a = rng.standard_normal(n)
    rows = [f"{1.7e9 + k / 100 + 3e-4 * rng.random():.6f},{a[k]:.6g},{rng.standard_normal():.6g},"
            + (f"{a[k] + 0.3 * rng.standard_normal():.6g}" if k % 10 == 4 else "") for k in range(n)]  # fmt: skip
    log = tmp_path / "mixed.csv"
    log.write_text("t,imu.a,imu.b,env.temp\n" + "\n".join(rows) + "\n")
    out = tmp_path / "out"
    assert main(["replay", str(log), "--window", "512", "--no-progress", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    note = "1 channel(s) sample less often than channels.max_staleness_s (0.05 s)"
    assert note in err and "'env.temp' (a sample every 0.1 s; 2 pairs)" in err, err
    setting = re.search(r"set channels.max_staleness_s to ([0-9.]+) or more", err)
    assert setting is not None and float(setting.group(1)) >= 0.15
    assert any(note in x for x in json.loads((out / "replay.json").read_text())["notes"])

    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"version: 1\nchannels:\n  max_staleness_s: {setting.group(1)}\n")
    assert main(["replay", str(log), "-c", str(cfg), "--window", "512", "--no-progress", "-o", str(out)]) == 0
    assert "max_staleness_s" not in capsys.readouterr().err
    rows_out = _timeline(out)
    last = max(rows_out)
    assert all(np.isfinite(mi) for mi in rows_out[last].values())

    # a time column that counts samples: every channel a second apart, and the note offers the clock's rate too
    index = tmp_path / "index.csv"
    index.write_text("sample,x,y\n" + "".join(f"{k},{a[k]:.6g},{a[k] ** 2:.6g}\n" for k in range(60)))
    argv = ["replay", str(index), "--time-column", "sample", "--window", "256", "--no-progress"]
    assert main([*argv, "-o", str(tmp_path / "o2")]) == 0
    assert "replay on a clock at their rate: --rate-hz 1;" in capsys.readouterr().err
