"""outputs.record: Parquet history rotated under a disk cap with an exact ledger; SIGKILL leaves readable files;
only its own files are touched, never through a symlink; a directory that cannot be written counts drops and
recovers."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import yaml
import zmq

from streamcorr.cli.commands import main
from streamcorr.engine.changes import ChangeEvent
from streamcorr.engine.matrix import MatrixState
from streamcorr.publish.record import ParquetRecorder
from tests.brokers import free_port

pq = pytest.importorskip("pyarrow.parquet")


def _rows_on_disk(d: Path, prefix: str) -> int:
    return sum(pq.read_metadata(p).num_rows for p in d.glob(f"{prefix}-*.parquet"))


def test_ten_minutes_under_the_disk_cap_keep_the_cap_and_an_exact_ledger(tmp_path, monkeypatch):
    """10 minutes of 24-channel snapshots (one a second) and events, rotated every 20 s under a 300 kB cap:
    the directory never exceeds the cap after a rotation, the oldest files go first, and rows written minus
    rows deleted is exactly what the files hold."""
    clock = {"now": 1_800_000_000.0}
    monkeypatch.setattr("streamcorr.publish.record.time.time", lambda: clock["now"])
    rng = np.random.default_rng(11)
    names = [f"ch{k:02d}" for k in range(24)]
    st = MatrixState(names)
    i, j = np.triu_indices(24, 1)
    rec = ParquetRecorder(directory=tmp_path / "rec", rotate_s=20, max_bytes=300_000)
    sizes = []

    async def run() -> None:
        for s in range(600):
            clock["now"] += 1.0
            t_ns = (1_700_000_000 + s) * 10**9
            st.update(i, j, rng.random(len(i)), np.ones(len(i)), t_ns)
            await rec.publish_snapshot(st.snapshot(t_ns, int(clock["now"] * 1e9)))
            await rec.publish_snapshot(st.snapshot(t_ns, int(clock["now"] * 1e9)))  # a repeat: skipped
            if s % 7 == 0:
                await rec.publish_event(ChangeEvent(("ch00", "ch01"), 0.0, 0.5, t_ns, "became-dependent"))
            if s % 20 == 0:
                sizes.append(sum(p.stat().st_size for p in (tmp_path / "rec").glob("*.parquet")))
        await rec.stop()

    asyncio.run(run())
    d = tmp_path / "rec"
    c = rec.counters
    assert c.sent["snapshot"] == 600 and c.rows_written == 600 * len(i)
    assert c.files_deleted > 0 and c.rows_deleted > 0
    assert max(sizes) <= 300_000 and c.bytes_on_disk <= 300_000
    assert c.rows_written - c.rows_deleted == _rows_on_disk(d, "timeline")
    assert c.events_written - c.events_deleted == _rows_on_disk(d, "events")
    kept = sorted(pq.read_table(p, columns=["t_ns"]).column("t_ns").to_numpy().min() for p in d.glob("timeline-*"))
    assert kept[-1] // 10**9 >= 1_700_000_000 + 580  # the newest files are the ones kept
    assert not list(d.glob("*.part"))
    html = tmp_path / "r.html"
    assert main(["report", str(d), "-o", str(html)]) == 0  # a recording makes a report too
    assert "ch00 ~ ch01" in html.read_text() and "became-dependent" in html.read_text()


def test_report_of_a_directory_without_history_is_a_one_line_error(tmp_path, capsys):
    """streamcorr report on a directory with neither a replay's nor a recording's files: exit 2, the fix named."""
    assert main(["report", str(tmp_path), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("streamcorr: error:") and "streamcorr replay" in err and "Traceback" not in err


def _recording_daemon(p_in: int, rec_dir: Path, http: dict[str, Any]) -> dict[str, Any]:
    """A daemon config: channels a, b, c at 20 Hz from a bound ZeroMQ PULL on p_in, recorded with 1-s rotation."""
    return {
        "version": 1,
        "sources": [{"type": "zmq", "endpoint": f"tcp://127.0.0.1:{p_in}", "mode": "pull", "bind": True,
                     "channel_template": "{key}"}],
        "channels": {"names": ["a", "b", "c"], "rate_hz": 20.0},
        "window": {"samples": 32, "hop_samples": 5},
        "outputs": {"record": {"directory": str(rec_dir), "rotate_s": 1.0}, "status_interval_s": 0.5},
        "http": http,
        "logging": {"format": "text"},
    }  # fmt: skip


def test_sigkill_leaves_every_parquet_file_readable(tmp_path):
    """`streamcorr run` recording with 1-s rotation, killed with SIGKILL mid-run: every *.parquet file in the
    directory reads back whole (an unfinished file is only ever a .part)."""
    p_in = free_port()
    rec_dir = tmp_path / "rec"
    cfg = _recording_daemon(p_in, rec_dir, {"enabled": False}) | {"logging": {"format": "text", "level": "WARNING"}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen([sys.executable, "-m", "streamcorr", "run", str(path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.connect(f"tcp://127.0.0.1:{p_in}")
    rng = np.random.default_rng(12)
    try:
        deadline = time.monotonic() + 120
        while len(list(rec_dir.glob("timeline-*.parquet"))) < 3:  # live: 10 samples per channel every 0.5 s
            assert time.monotonic() < deadline, "no recorded files within 120 s"
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            t = time.time() - 0.45 + np.arange(10) / 20
            chunk = {"t": t.tolist(), "channels": {c: rng.standard_normal(10).tolist() for c in "abc"}}
            push.send_multipart([b"x", msgpack.packb(chunk)])
            time.sleep(0.5)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        push.close(linger=0)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    files = sorted(rec_dir.glob("*.parquet"))
    assert len(files) >= 3
    for f in files:
        table = pq.read_table(f)
        assert table.num_rows > 0
        assert {"time", "a", "b"} <= set(table.column_names)


def _feed(rec: ParquetRecorder, st: MatrixState, clock: dict[str, float], n_s: int, rng: np.random.Generator) -> None:
    """One snapshot per (fake) second for `n_s` seconds, an event every 5th; the recorder rotates inline."""
    n = len(st.channels)
    i, j = np.triu_indices(n, 1)

    async def run() -> None:
        for _ in range(n_s):
            clock["now"] += 1.0
            t_ns = int(clock["now"] * 1e9)
            st.update(i, j, rng.random(len(i)), np.ones(len(i)), t_ns)
            await rec.publish_snapshot(st.snapshot(t_ns, t_ns))
            if int(clock["now"]) % 5 == 0:
                await rec.publish_event(ChangeEvent(("ch00", "ch01"), 0.0, 0.5, t_ns, "became-dependent"))

    asyncio.run(run())


def _fake_clock(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    clock = {"now": 1_800_000_000.0}
    monkeypatch.setattr("streamcorr.publish.record.time.time", lambda: clock["now"])
    return clock


def test_foreign_files_survive_rotation_and_the_disk_cap(tmp_path, monkeypatch):
    """Files the recorder did not name (a user's Parquet files, data.parquet, someone's .part, a directory with
    an own-looking name) are never counted, rotated or deleted, and the cap holds over the recorder's own files."""
    clock = _fake_clock(monkeypatch)
    d = tmp_path / "rec"
    d.mkdir()
    pa = pytest.importorskip("pyarrow")
    names = ("sales-2023.parquet", "data.parquet", "timeline-notes.parquet", "report.parquet.part",
             "timeline-x.parquet.0123456789abcdef.part")  # fmt: skip
    foreign = {name: d / name for name in names}
    for path in foreign.values():
        pq.write_table(pa.table({"x": np.arange(20_000)}), path)  # each alone near the cap
    before = {name: p.read_bytes() for name, p in foreign.items()}
    lookalike = d / "timeline-20000101T000000Z-000001.parquet"  # an own name, but a directory
    lookalike.mkdir()
    stale_part = d / "events-20000101T000000Z-000002.parquet.fedcba9876543210.part"  # an own crash leftover
    stale_part.write_bytes(b"half a file")
    rec = ParquetRecorder(directory=d, rotate_s=10, max_bytes=80_000)
    assert not stale_part.exists()
    _feed(rec, MatrixState([f"ch{k:02d}" for k in range(12)]), clock, 300, np.random.default_rng(3))
    asyncio.run(rec.stop())
    c = rec.counters
    assert c.files_deleted > 0 and rec.problem() is None and c.write_errors == 0
    assert {name: p.read_bytes() for name, p in foreign.items()} == before
    assert lookalike.is_dir()
    own = [p for p in d.iterdir() if p.is_file() and p.name not in foreign]
    assert all(p.name.startswith(("timeline-2", "events-2")) for p in own)
    assert c.bytes_on_disk == sum(p.stat().st_size for p in own) <= 80_000
    on_disk = sum(pq.read_metadata(p).num_rows for p in own if p.name.startswith("timeline-"))
    assert c.rows_written - c.rows_deleted == on_disk


def test_a_symlink_planted_at_a_part_or_file_name_is_never_followed(tmp_path, monkeypatch):
    """A symlink at the recorder's next .part name is skipped (a fresh name is drawn) and one at a final name is
    replaced, never written through: the files they point to keep their bytes, and the recording is complete."""
    from types import SimpleNamespace

    clock = _fake_clock(monkeypatch)
    tokens = iter(["0" * 16, "a" * 16, "b" * 16, "c" * 16])
    monkeypatch.setattr("streamcorr.publish.record.secrets", SimpleNamespace(token_hex=lambda n: next(tokens)))
    d = tmp_path / "rec"
    rec = ParquetRecorder(directory=d, rotate_s=1000)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(clock["now"]))
    victims = {"part": tmp_path / "victim-part", "final": tmp_path / "victim-final"}
    for v in victims.values():
        v.write_text("precious")
    planted_part = d / f"timeline-{stamp}-000001.parquet.{'0' * 16}.part"
    planted_part.symlink_to(victims["part"])
    planted_final = d / f"events-{stamp}-000001.parquet"
    planted_final.symlink_to(victims["final"])
    _feed(rec, MatrixState(["ch00", "ch01", "ch02"]), clock, 5, np.random.default_rng(4))
    rec.rotate()
    assert all(v.read_text() == "precious" for v in victims.values())
    assert planted_part.is_symlink()  # not the recorder's file: left as it was
    assert not planted_final.is_symlink() and pq.read_table(planted_final).num_rows == rec.counters.events_written
    assert pq.read_table(d / f"timeline-{stamp}-000001.parquet").num_rows == rec.counters.rows_written > 0
    assert rec.problem() is None and rec.counters.write_errors == 0


def test_a_directory_replaced_by_a_file_counts_drops_and_recovers(tmp_path, monkeypatch, caplog):
    """While the record directory is a regular file every rotation's snapshots and events are counted as dropped,
    health names the cause, one warning without traceback is logged for the whole streak, and the first
    rotation after the directory is usable again writes and clears the problem (even with nothing to write)."""
    clock = _fake_clock(monkeypatch)
    d = tmp_path / "rec"
    rec = ParquetRecorder(directory=d, rotate_s=10)
    st = MatrixState(["ch00", "ch01", "ch02"])
    rng = np.random.default_rng(5)
    caplog.set_level("INFO", logger="streamcorr.publish.record")
    _feed(rec, st, clock, 20, rng)
    written = rec.counters.sent["snapshot"]
    assert written > 0 and rec.problem() is None
    d.rename(tmp_path / "moved")
    d.write_text("not a directory")
    _feed(rec, st, clock, 40, rng)  # four rotations into the file
    c = rec.counters
    assert c.dropped["snapshot"] >= 30 and c.dropped["event"] >= 6 and c.rows_dropped == 3 * c.dropped["snapshot"]
    assert c.sent["snapshot"] == written and c.write_errors >= 8
    assert "Not a directory" in (rec.problem() or "")
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and warnings[0].exc_info is None and "cannot write" in warnings[0].getMessage()
    d.unlink()  # gone: the recorder makes it again
    clock["now"] += 10
    rec.rotate()  # nothing buffered: a probe notices the directory is usable
    assert rec.problem() is None and d.is_dir()
    _feed(rec, st, clock, 20, rng)
    asyncio.run(rec.stop())
    assert rec.counters.sent["snapshot"] + rec.counters.dropped["snapshot"] == 80
    assert rec.counters.rows_written - rec.counters.rows_deleted == _rows_on_disk(d, "timeline") + _rows_on_disk(
        tmp_path / "moved", "timeline"
    )
    assert any("again" in r.getMessage() for r in caplog.records if r.levelname == "INFO")


def test_check_fails_when_the_record_directory_cannot_be_written(tmp_path, capsys):
    """`streamcorr check` exits 2 naming outputs.record.directory when its parent is a regular file, and lists the
    recording when the directory can be made."""
    (tmp_path / "file").write_text("x")
    cfg = {"version": 1, "sources": [{"type": "zmq", "endpoint": "tcp://127.0.0.1:7001", "bind": True}],
           "outputs": {"record": {"directory": str(tmp_path / "file" / "rec")}}}  # fmt: skip
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "outputs.record.directory" in err and "is not a directory" in err and "Traceback" not in err
    cfg["outputs"]["record"]["directory"] = str(tmp_path / "new" / "rec")
    path.write_text(yaml.safe_dump(cfg))
    assert main(["check", str(path)]) == 0
    assert "record: " in capsys.readouterr().out and not (tmp_path / "new").exists()


def test_a_daemon_whose_record_directory_breaks_reports_drops_and_recovers(tmp_path):
    """`streamcorr run` recording while its directory is replaced by a file: /metrics counts the record output's
    dropped snapshots, /healthz is 503 naming the cause while /readyz stays 200, one warning without traceback
    is logged, and once the directory can be made again files are written and /healthz is 200."""
    from tests.helpers import daemon_process as _daemon
    from tests.helpers import http_get as _get
    from tests.helpers import metric as _metric
    from tests.helpers import probe as _probe
    from tests.helpers import wait_for as _wait

    p_in, http_port = free_port(), free_port()
    rec_dir = tmp_path / "rec"
    cfg = _recording_daemon(p_in, rec_dir, {"port": http_port})
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(f"tcp://127.0.0.1:{p_in}")
    rng = np.random.default_rng(13)
    dropped = 'streamcorr_output_dropped_total{output="record",stream="snapshot"}'

    def feeding(cond: Any) -> Any:
        def step() -> Any:  # 10 samples per channel every call, stamped now: input keeps flowing
            t = time.time() - 0.45 + np.arange(10) / 20
            push.send_multipart([b"x", msgpack.packb({"t": t.tolist(), "channels": {c: rng.standard_normal(10).tolist()
                                                                                    for c in "abc"}})])  # fmt: skip
            time.sleep(0.2)
            return cond()

        return step

    try:
        with _daemon(tmp_path, cfg) as proc:
            _wait(feeding(lambda: list(rec_dir.glob("timeline-*.parquet"))), "a recorded file", proc, 120)
            rec_dir.rename(tmp_path / "moved")
            rec_dir.write_text("a file where the directory was")

            def record_problem() -> bool:
                code, body = _probe(http_port, "/healthz")
                return code == 503 and any(p.startswith("output record: cannot write to") for p in body["problems"])

            _wait(feeding(record_problem), "503 naming the record output", proc, 30)
            _wait(feeding(lambda: _metric(_get(f"http://127.0.0.1:{http_port}/metrics")[1], dropped) > 0),
                  "dropped snapshots in /metrics", proc, 30)  # fmt: skip
            assert _probe(http_port, "/readyz")[0] == 200  # input is still taken
            rec_dir.unlink()
            _wait(feeding(lambda: _probe(http_port, "/healthz")[0] == 200), "healthy again", proc, 30)
            # the first file after the recovery is written at its rotation (rotate_s), which a loaded machine delays
            _wait(feeding(lambda: list(rec_dir.glob("timeline-*.parquet"))), "files written again", proc, 30)
            text = proc.log_path.read_text()
    finally:
        push.close()
    assert text.count("outputs.record: cannot write to") == 1 and "Traceback" not in text
    assert "outputs.record: writing to" in text and "again" in text
