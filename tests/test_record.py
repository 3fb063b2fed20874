"""outputs.record: Parquet history rotated under a disk cap with an exact ledger; SIGKILL leaves readable files."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import yaml
import zmq

from streamcorr.changes import ChangeEvent
from streamcorr.cli import main
from streamcorr.matrix import MatrixState
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


def test_sigkill_leaves_every_parquet_file_readable(tmp_path):
    """`streamcorr run` recording with 1-s rotation, killed with SIGKILL mid-run: every *.parquet file in the
    directory reads back whole (an unfinished file is only ever a .part)."""
    p_in = free_port()
    rec_dir = tmp_path / "rec"
    source = {"type": "zmq", "endpoint": f"tcp://127.0.0.1:{p_in}", "mode": "pull", "bind": True}
    source["channel_template"] = "{key}"
    cfg = {
        "version": 1,
        "sources": [source],
        "channels": {"names": ["a", "b", "c"], "rate_hz": 20.0},
        "window": {"samples": 32, "hop_samples": 5},
        "outputs": {"record": {"directory": str(rec_dir), "rotate_s": 1.0}, "status_interval_s": 0.5},
        "http": {"enabled": False},
        "logging": {"format": "text", "level": "WARNING"},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen([sys.executable, "-m", "streamcorr.cli", "run", str(path)],
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
