"""Issue 29: `streamcorr replay`, `report`, `matrix` and the log readers against hostile files: time spans
bounded by gaps skipped, outputs never written through planted links, readers bounded in bytes and samples,
named errors instead of unexpected ones, one bad message skipped rather than the file, and no silent
misreads."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from streamcorr.cli.commands import main
from streamcorr.offline.logs import ReadLimits, open_log

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

FAST = ["--rate-hz", "10", "--window", "64", "--hop", "10", "--no-progress"]
MIB = 1 << 20


def _wide_csv(path: Path, t: np.ndarray, rng: np.random.Generator, extra: str = "") -> None:
    x = rng.standard_normal(len(t))
    y = x + 0.5 * rng.standard_normal(len(t))
    lines = ["t,x,y"] + [f"{a!r},{b:.6f},{c:.6f}" for a, b, c in zip(t.tolist(), x, y, strict=True)]
    path.write_text("\n".join(lines) + "\n" + extra)


def _cli(argv: list[str], timeout_s: float) -> tuple[int, str, float, float]:
    """`streamcorr ARGV` in a child of a fresh process: (exit code, stdout + stderr, peak RSS in MiB, wall s).
    The fresh parent makes RUSAGE_CHILDREN the command's own peak, not that of earlier tests' children."""
    wrapper = ("import resource, subprocess, sys\n"
               "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
               "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
               "sys.stderr.write(p.stdout + p.stderr)\n")  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", wrapper, sys.executable, "-m", "streamcorr", *argv],
                          capture_output=True, text=True, timeout=timeout_s)  # fmt: skip
    rc, rss_kib = proc.stdout.split()[:2]
    return int(rc), proc.stderr, int(rss_kib) / 1024, time.monotonic() - t0


# -- class 1: time span ------------------------------------------------------------------------------------
def test_a_stray_stamp_far_ahead_is_a_gap_skipped_not_hops_iterated(tmp_path):
    """A CSV of 30 s with one row stamped 1e9 s replays in about the time of its 30 s: the gap is skipped,
    listed in replay.json and on stderr, and the hops before it are those of the log without the stray row."""
    rng = np.random.default_rng(2901)
    t = np.arange(300) / 10
    clean, stray = tmp_path / "clean.csv", tmp_path / "stray.csv"
    _wide_csv(clean, t, rng)
    stray.write_text(clean.read_text() + "1000000000.0,1.0,2.0\n")
    rc, text, _, wall_s = _cli(["replay", str(stray), "-o", str(tmp_path / "s"), *FAST], timeout_s=300)
    assert rc == 0, text
    assert "gap(s) without samples longer than --max-gap-s 25.6 skipped" in text
    info = json.loads((tmp_path / "s" / "replay.json").read_text())
    assert info["gaps"]["count"] == 1 and info["gaps"]["first"][0]["to"] == 1e9
    assert info["gaps"]["hops_skipped"] > 10**8
    assert main(["replay", str(clean), "-o", str(tmp_path / "c"), *FAST]) == 0
    assert info["hops"] == json.loads((tmp_path / "c" / "replay.json").read_text())["hops"]
    assert wall_s < 240, wall_s  # process start and model load included; the gap costs nothing


def test_gaps_shorter_than_max_gap_are_evaluated_and_longer_ones_skipped(tmp_path):
    """--max-gap-s decides: a 20 s pause is evaluated hop by hop under the default (4 windows, 25.6 s) and
    skipped with --max-gap-s 10; after a skip the hops continue on the same grid."""
    rng = np.random.default_rng(2902)
    t = np.concatenate([np.arange(200) / 10, 40 + np.arange(200) / 10])
    log = tmp_path / "pause.csv"
    _wide_csv(log, t, rng)
    assert main(["replay", str(log), "-o", str(tmp_path / "a"), *FAST]) == 0
    assert main(["replay", str(log), "-o", str(tmp_path / "b"), "--max-gap-s", "10", *FAST]) == 0
    a = json.loads((tmp_path / "a" / "replay.json").read_text())
    b = json.loads((tmp_path / "b" / "replay.json").read_text())
    assert a["gaps"]["count"] == 0 and b["gaps"]["count"] == 1
    assert a["channel_gaps"]["count"] == 0  # the whole stream paused: no channel's gap of its own
    assert b["hops"] + b["gaps"]["hops_skipped"] == a["hops"]
    ends_a = set(pq.read_table(tmp_path / "a" / "timeline.parquet")["t_ns"].to_pylist())
    ends_b = set(pq.read_table(tmp_path / "b" / "timeline.parquet")["t_ns"].to_pylist())
    assert ends_b < ends_a  # the same grid, fewer hops


def test_a_gap_in_one_channel_is_noted_and_its_pairs_wait_for_coverage(tmp_path, capsys):
    """One column of three is empty for 4 s of a 30-s log (a window is 6.4 s): the replay notes the gap with its
    times (stderr and replay.json) and counts the pair evaluations it left out; the other pair is unaffected."""
    rng = np.random.default_rng(2904)
    t = np.arange(300) / 10
    x = rng.standard_normal(300)
    y = np.where((t >= 15) & (t < 19), np.nan, x + 0.5 * rng.standard_normal(300))
    rows = [f"{a!r},{b:.6f},{'' if np.isnan(c) else f'{c:.6f}'},{d:.6f}"
            for a, b, c, d in zip(t.tolist(), x, y, rng.standard_normal(300), strict=True)]  # fmt: skip
    log = tmp_path / "gap.csv"
    log.write_text("t,x,y,z\n" + "\n".join(rows) + "\n")
    assert main(["replay", str(log), "-o", str(tmp_path / "o"), *FAST]) == 0
    assert "1 gap(s) of 0.64 s or more in single channels" in capsys.readouterr().err
    gaps = json.loads((tmp_path / "o" / "replay.json").read_text())["channel_gaps"]
    assert gaps["count"] == 1 and gaps["first"][0]["channel"] == "y" and gaps["pairs_low_coverage"] > 0
    assert 14.8 < gaps["first"][0]["from"] < 15 and 19 <= gaps["first"][0]["to"] < 19.2


@pytest.mark.parametrize(("scale", "unit"), [(1e9, "ns"), (1e6, "us"), (1e3, "ms")])
def test_epoch_times_in_a_finer_unit_than_read_get_a_named_error(tmp_path, capsys, scale, unit):
    """Epoch nanoseconds, microseconds or milliseconds read as seconds are refused with the --time-unit to pass."""
    rng = np.random.default_rng(2903)
    log = tmp_path / f"epoch_{unit}.csv"
    t = np.round((1.7e9 + np.arange(400) / 10) * scale).astype(np.int64)
    log.write_text("t,x\n" + "".join(f"{a},{b:.5f}\n" for a, b in zip(t, rng.standard_normal(400), strict=True)))
    assert main(["replay", str(log), "--list"]) == 2
    err = capsys.readouterr().err
    assert f"pass --time-unit {unit}" in err and err.count("\n") == 1, err
    assert main(["replay", str(log), "--list", "--time-unit", unit]) == 0


def test_parquet_times_beyond_int64_nanoseconds_are_left_out_and_counted(tmp_path, capsys):
    """A uint64 time of 2**64 - 1 ms, or a timestamp[ms] of 2**63 - 1, among ordinary ones: that row is left
    out and counted, the rest read."""
    t = np.arange(100, dtype=np.uint64) * 100
    t[50] = 2**64 - 1
    stamps = pa.array(np.where(np.arange(100) == 50, 2**63 - 1, np.arange(100) * 100)).cast(pa.timestamp("ms"))
    pq.write_table(pa.table({"t": pa.array(t, pa.uint64()), "x": np.arange(100.0)}), tmp_path / "t.parquet")
    pq.write_table(pa.table({"t": stamps, "x": np.arange(100.0)}), tmp_path / "ts.parquet")
    for rec in (open_log(tmp_path / "t.parquet", time_unit="ms"), open_log(tmp_path / "ts.parquet")):
        assert len(rec.series["x"].t_ns) == 99 and rec.t_end == 9.9
        assert rec.skipped == {"rows without a usable time (empty, not finite, or beyond int64 nanoseconds)": 1}


# -- class 2: links ---------------------------------------------------------------------------------------
def test_replay_and_report_replace_planted_links_and_leave_their_targets_alone(tmp_path):
    """Symlinks planted in the output directory under every name replay and report write are replaced by
    the outputs; the files they pointed to are unchanged, and a dangling link creates nothing."""
    rng = np.random.default_rng(2904)
    log = tmp_path / "log.csv"
    _wide_csv(log, np.arange(300) / 10, rng)
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    names = ["replay.json", "tables.json", "timeline.parquet", "events.parquet", "events.jsonl", "report.html"]
    for name in names:
        (elsewhere / name).write_text("precious")
        (out / name).symlink_to(elsewhere / name)
    (out / "dangling.html").symlink_to(elsewhere / "created.html")
    assert main(["replay", str(log), "-o", str(out), *FAST]) == 0
    assert main(["report", str(out)]) == 0
    assert main(["report", str(out), "-o", str(out / "dangling.html")]) == 0
    for name in names:
        assert (elsewhere / name).read_text() == "precious", name
        assert (out / name).is_file() and not (out / name).is_symlink(), name
    assert not (elsewhere / "created.html").exists()
    assert sorted(p.name for p in out.iterdir()) == sorted([*names, "dangling.html"])  # no staging left


# -- class 3: bounds --------------------------------------------------------------------------------------
def _rec(op: int, body: bytes) -> bytes:
    return struct.pack("<BQ", op, len(body)) + body


def _s(text: str) -> bytes:
    return struct.pack("<I", len(text)) + text.encode()


def _mcap(records: list[bytes], footer: bool = True) -> bytes:
    magic = b"\x89MCAP0\r\n"
    head = _rec(0x01, _s("") + _s("test"))
    tail = _rec(0x02, struct.pack("<QQI", 0, 0, 0)) + magic if footer else b""
    return magic + head + b"".join(records) + tail


def _json_channel(cid: int, topic: str) -> bytes:
    return _rec(0x04, struct.pack("<HH", cid, 0) + _s(topic) + _s("json") + struct.pack("<I", 0))


def _message(cid: int, t_ns: int, data: bytes) -> bytes:
    return _rec(0x05, struct.pack("<HIQQ", cid, 0, t_ns, t_ns) + data)


def _zstd_chunk(size: int, declared: int | None = None) -> bytes:
    """A zstd chunk record holding a message of ``size`` zero bytes (a multiple of 8 MiB); it declares
    ``declared`` bytes (default: the truth)."""
    import zstandard

    inner = _json_channel(1, "/big") + struct.pack("<BQ", 0x05, size + 22) + struct.pack("<HIQQ", 1, 0, 1, 1)
    z = zstandard.ZstdCompressor(level=1).compressobj()
    parts = [z.compress(inner)]
    zeros = bytes(8 * MIB)
    for _ in range(size // len(zeros)):
        parts.append(z.compress(zeros))
    parts.append(z.flush())
    data = b"".join(parts)
    declared = len(inner) + size if declared is None else declared
    return _rec(0x06, struct.pack("<QQQI", 1, 1, declared, 0) + _s("zstd") + struct.pack("<Q", len(data)) + data)


def _zstd_bomb(path: Path, size: int, declared: int | None = None) -> None:
    path.write_bytes(_mcap([_zstd_chunk(size, declared)]))


def test_small_hostile_files_are_refused_within_a_gigabyte_with_the_flag_to_raise(tmp_path):
    """A 768 MiB zstd chunk in a small MCAP (declared, or declared 1 MiB), a Parquet of 96 million constant
    rows, a CSV header of 400,000 columns, a 150 MB line of commas for `matrix` and a timeline of 6 million
    repeated rows for `report`: each stops with a named one-line error (the MCAP and Parquet ones name their
    flag) at a peak RSS under 1 GiB."""
    declared, small = tmp_path / "declared.mcap", tmp_path / "small.mcap"
    _zstd_bomb(declared, 768 * MIB)
    _zstd_bomb(small, 768 * MIB, MIB)
    assert declared.stat().st_size < MIB
    rows = tmp_path / "rows.parquet"
    block = pa.table({"t": np.zeros(1_500_000), "x": np.ones(1_500_000)})
    with pq.ParquetWriter(rows, block.schema) as w:
        for _ in range(64):
            w.write_table(block)
    assert rows.stat().st_size < 4 * MIB
    wide = tmp_path / "wide.csv"
    wide.write_text(",".join(f"c{k}" for k in range(400_000)) + "\n" + "," * 399_999 + "\n")
    many = tmp_path / "many"  # a replay's output directory whose timeline repeats one row 6 million times
    many.mkdir()
    row = pa.table({"t_ns": np.zeros(1_500_000, np.int64), "a": ["x"] * 1_500_000, "b": ["y"] * 1_500_000,
                    "mi": np.zeros(1_500_000)})  # fmt: skip
    with pq.ParquetWriter(many / "timeline.parquet", row.schema) as w:
        for _ in range(4):
            w.write_table(row)
    line = tmp_path / "line.csv"
    with line.open("w") as f:
        f.write("a,b\n1,2\n")
        for _ in range(150):
            f.write("," * 1_000_000)
        f.write("\n")
    cases = [
        (["replay", str(declared), "--list"], "--max-mb"),
        (["replay", str(small), "--list"], "damaged chunks skipped"),
        (["replay", str(rows), "--list"], "--max-samples"),
        (["replay", str(wide), "--list"], "--max-channels"),
        (["matrix", str(line), "--no-png"], "a row is longer than"),
        (["report", str(many)], "more than 5,000,000 rows"),
    ]
    for argv, expect in cases:
        rc, text, peak_mib, _ = _cli(argv, timeout_s=300)
        assert rc == 2 and expect in text and "Traceback" not in text, (argv, text[-2000:])
        assert peak_mib < 1024, (argv, peak_mib)


def test_a_burst_of_samples_nanoseconds_apart_gets_capped_buffers_not_gigabytes(tmp_path):
    """A channel whose samples are mostly 1 ns apart replays with ring buffers capped (a note says so) at a
    peak RSS under 1 GiB, instead of asking for buffers of tens of GiB."""
    rng = np.random.default_rng(2905)
    burst = 10**9 + np.arange(3000)  # ns
    spread = 2 * 10**9 + np.arange(200) * 10**8
    t = np.concatenate([burst, spread])
    log = tmp_path / "burst.csv"
    x, y = rng.standard_normal((2, len(t)))
    log.write_text("t,x,y\n" + "".join(f"{a},{b:.5f},{c:.5f}\n" for a, b, c in zip(t, x, y, strict=True)))
    rc, text, peak_mib, _ = _cli(["replay", str(log), "--time-unit", "ns", "-o", str(tmp_path / "o"), *FAST], 300)
    assert rc == 0, text[-3000:]
    assert "faster than the clock: buffers are capped" in text
    assert peak_mib < 1024, peak_mib


def test_limits_hold_in_process_with_their_flags(tmp_path, capsys):
    """--max-samples, --max-channels and --max-mb bound CSV, long Parquet and MCAP reads and name themselves;
    MCAP chunks may decompress to at most 256 times the file in all; message fields of channels beyond
    --max-channels, or named longer than 1024 characters, are left out and counted, not fatal."""
    rng = np.random.default_rng(2906)
    log = tmp_path / "log.csv"
    _wide_csv(log, np.arange(300) / 10, rng)
    assert main(["replay", str(log), "--list", "--max-samples", "500"]) == 2
    assert "--max-samples" in capsys.readouterr().err
    assert main(["replay", str(log), "--list", "--max-channels", "1"]) == 2
    assert "--max-channels" in capsys.readouterr().err
    assert main(["replay", str(log), "--list", "--max-channels", "1", "--channels", "y"]) == 0
    capsys.readouterr()
    names = [f"c{k}" for k in range(50)]
    long = tmp_path / "long.parquet"
    pq.write_table(pa.table({"t": np.arange(500) / 10, "channel": names * 10, "value": rng.standard_normal(500)}), long)
    assert main(["replay", str(long), "--list", "--max-channels", "20"]) == 2
    assert "names 50 channels" in capsys.readouterr().err
    mcap = tmp_path / "wide.mcap"
    msg = json.dumps({f"f{k}": float(k) for k in range(30)}).encode()
    mcap.write_bytes(_mcap([_json_channel(1, "/w"), *(_message(1, 10**9 + k * 10**8, msg) for k in range(100))]))
    rec = open_log(mcap, limits=ReadLimits(max_channels=10))
    assert len(rec.series) == 10 and rec.skipped["values of channels beyond --max-channels (10)"] == 2000
    chunks = tmp_path / "chunks.mcap"  # each chunk within --max-mb, together hundreds of times the file
    chunks.write_bytes(_mcap([_zstd_chunk(8 * MIB)] * 40))
    assert main(["replay", str(chunks), "--list", "--max-mb", "16"]) == 2
    assert "decompress to more than 256 times the file's size" in capsys.readouterr().err
    named = tmp_path / "named.mcap"
    msg = json.dumps({"k" * 2000: 1.0, "v": 2.0}).encode()
    named.write_bytes(_mcap([_json_channel(1, "/n"), *(_message(1, 10**9 + k * 10**8, msg) for k in range(50))]))
    rec = open_log(named)
    assert list(rec.series) == ["n.v"] and rec.skipped["values of fields named longer than 1024 characters"] == 50


# -- class 4: named errors --------------------------------------------------------------------------------
def _replay_output(tmp_path: Path) -> Path:
    rng = np.random.default_rng(2907)
    log = tmp_path / "good.csv"
    _wide_csv(log, np.arange(300) / 10, rng)
    out = tmp_path / "good"
    assert main(["replay", str(log), "-o", str(out), *FAST]) == 0
    return out


def test_bad_inputs_give_named_one_line_errors_not_unexpected_ones(tmp_path, capsys):
    """Duplicate CSV columns, --rate-hz inf or nan, and report directories with wrong types, missing columns,
    nulls or malformed JSON: exit 2, one line, no traceback."""
    import shutil

    dup = tmp_path / "dup.csv"
    dup.write_text("t,x,x\n" + "".join(f"{k / 10},{k},{k}\n" for k in range(400)))
    cases: list[list[str]] = [["replay", str(dup), "--list"], ["matrix", str(dup), "--no-png"]]
    log = tmp_path / "ok.csv"
    _wide_csv(log, np.arange(300) / 10, np.random.default_rng(2908))
    cases += [["replay", str(log), "--rate-hz", v, "-o", str(tmp_path / "x"), "--no-progress"]
              for v in ("inf", "nan", "-1", "1e-300")]  # fmt: skip
    good = _replay_output(tmp_path)
    broken = {
        "timeline.parquet": [pa.table({"t_ns": ["a"], "a": [1], "b": [2], "mi": ["x"]}),
                             pa.table({"t_ns": [1], "a": ["x"]}),
                             pa.table({"t_ns": [1, None], "a": ["x", "y"], "b": ["y", "z"], "mi": [0.1, 0.2]})],
        "events.parquet": [pa.table({"t_ns": [1], "a": ["x"]}),
                           pa.table({"time": ["x"], "t_ns": [1], "a": ["x"], "b": ["y"], "change": ["rise"],
                                     "previous": [0.1], "current": [None]})],
        "replay.json": ["[1, 2]", '{"t_start": "soon"}', '{"t_start": 1e999}', '{"channels": 5}', "{"],
        "tables.json": ['{"pairs": [{"a": 1}]}', '{"pairs": 3}', '{"pairs": [{"a": "x", "b": "y", "mi": 0.1, '
                        '"table": [[1, 2]]}]}'],
    }  # fmt: skip
    for k, (name, variants) in enumerate(broken.items()):
        for j, content in enumerate(variants):
            d = tmp_path / f"bad{k}_{j}"
            shutil.copytree(good, d)
            if isinstance(content, str):
                (d / name).write_text(content)
            else:
                pq.write_table(content, d / name)
            cases.append(["report", str(d)])
    capsys.readouterr()
    for argv in cases:
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 2, (argv, err)
        assert err.startswith("streamcorr: error:") and err.count("\n") == 1 and "Traceback" not in err, (argv, err)
    assert main(["replay", str(dup), "--list"]) == 2
    assert "'x' appear more than once" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "no_such_dir")]) == 2
    assert "no_such_dir is not a directory" in capsys.readouterr().err


# -- class 5: one bad message -----------------------------------------------------------------------------
def _mcap_log(n: int, rng: np.random.Generator) -> list[bytes]:
    out = [_json_channel(1, "/a"), _json_channel(2, "/b")]
    for k in range(n):
        x = float(rng.standard_normal())
        out.append(_message(1, 10**9 + k * 10**8, json.dumps({"v": x}).encode()))
        out.append(_message(2, 10**9 + k * 10**8 + 1000, json.dumps({"v": x + 0.1}).encode()))
    return out


def test_one_unreadable_message_is_skipped_and_counted_not_the_file(tmp_path, capsys):
    """One 401-digit integer, one 100-deep nesting and one undecodable JSON among 1,200 MCAP messages: those
    three are skipped and counted (notes and replay.json), the rest replay."""
    rng = np.random.default_rng(2909)
    records = _mcap_log(600, rng)
    records[100] = _message(1, 10**9 + 49 * 10**8, b'{"v": 1' + b"0" * 400 + b"}")
    records[200] = _message(1, 10**9 + 99 * 10**8, b'{"v": ' + b"[" * 100 + b"1" + b"]" * 100 + b"}")
    records[300] = _message(1, 10**9 + 149 * 10**8, b'{"v": 1.0')
    log = tmp_path / "log.mcap"
    log.write_bytes(_mcap(records))
    assert main(["replay", str(log), "-o", str(tmp_path / "o"), *FAST]) == 0
    err = capsys.readouterr().err
    assert "topic /a: messages skipped (a number beyond float range): 1" in err
    assert "topic /a: messages skipped (fields nested deeper than 32): 1" in err
    assert "topic /a: messages skipped (undecodable: JSONDecodeError): 1" in err
    info = json.loads((tmp_path / "o" / "replay.json").read_text())
    assert sum(info["log_skipped"].values()) == 3
    assert info["samples"]["in_log"] == 1200 - 3


def test_a_truncated_mcap_replays_up_to_the_cut_with_a_note(tmp_path, capsys):
    """An MCAP cut part way (no footer, the last record incomplete), as a crashed recorder leaves it, is read
    up to the cut: a note names the byte, and the messages before it replay."""
    rng = np.random.default_rng(2910)
    whole = _mcap(_mcap_log(600, rng))
    cut = tmp_path / "cut.mcap"
    cut.write_bytes(whole[: int(len(whole) * 0.6)])
    rec = open_log(cut)
    assert 650 < rec.n_samples < 740
    assert any("the file ends inside a record" in n or "runs past the end" in n for n in rec.notes), rec.notes
    assert main(["replay", str(cut), "-o", str(tmp_path / "o"), *FAST]) == 0
    assert "a recording cut short?" in capsys.readouterr().err
    empty = tmp_path / "header_only.mcap"
    empty.write_bytes(whole[:40])
    assert main(["replay", str(empty), "--list"]) == 2
    assert "not a readable MCAP file" in capsys.readouterr().err


# -- class 6: silent misreads -----------------------------------------------------------------------------
def test_a_dictionary_encoded_channel_column_reads_as_names(tmp_path):
    """A long Parquet table whose channel column is dictionary-encoded reads the same channels as plain text."""
    rng = np.random.default_rng(2911)
    t = np.repeat(np.arange(200) / 10, 3)
    names = ["a", "b", "c"] * 200
    vals = rng.standard_normal(600)
    plain, coded = tmp_path / "plain.parquet", tmp_path / "coded.parquet"
    pq.write_table(pa.table({"time": t, "channel": names, "value": vals}), plain)
    pq.write_table(pa.table({"time": t, "channel": pa.array(names).dictionary_encode(), "value": vals}), coded)
    a, b = open_log(plain), open_log(coded)
    assert list(b.series) == ["a", "b", "c"] and b.kind == "Parquet (long)"
    for n in a.series:
        assert np.array_equal(a.series[n].t_ns, b.series[n].t_ns)
        assert np.array_equal(a.series[n].values, b.series[n].values)


def test_time_going_backwards_is_replayed_in_order_and_counted(tmp_path, capsys):
    """Rows stamped earlier than one before them are sorted into time order, counted per channel, and said so
    in the notes and replay.json (a live daemon would refuse them as late)."""
    rng = np.random.default_rng(2912)
    t = np.arange(300) / 10
    t[100:110] = t[100:110][::-1]  # ten rows in reverse: nine are earlier than one before them
    log = tmp_path / "back.csv"
    _wide_csv(log, t, rng)
    rec = open_log(log)
    assert rec.reordered == {"x": 9, "y": 9}
    assert (np.diff(rec.series["x"].t_ns) > 0).all()
    assert main(["replay", str(log), "-o", str(tmp_path / "o"), *FAST]) == 0
    assert "18 samples of 2 channels are stamped earlier" in capsys.readouterr().err
    info = json.loads((tmp_path / "o" / "replay.json").read_text())
    assert info["log_reordered"] == {"samples": 18, "by_channel": {"x": 9, "y": 9}}


def test_matrix_reads_like_replay_and_leaves_the_time_column_out(tmp_path, capsys):
    """`streamcorr matrix` reads a CSV with the replay's table reader: the time column `t` is not a channel
    (a note says so; --columns can still pick it), and cells that are not numbers count as missing."""
    rng = np.random.default_rng(2913)
    log = tmp_path / "m.csv"
    _wide_csv(log, np.arange(300) / 10, rng, extra="30.0,oops,1.0\n")
    assert main(["matrix", str(log), "--no-png"]) == 0
    out, err = capsys.readouterr()
    assert "column 't' is time, left out of the matrix" in err
    header = out.splitlines()[2].split()
    assert header == ["x", "y"]
    assert "'x': 1 of 301 rows missing" in err
    assert main(["matrix", str(log), "--no-png", "--columns", "t", "x"]) == 0


def test_matrix_reads_through_the_replay_reader_within_the_same_bounds(tmp_path, capsys):
    """`matrix` reads a CSV through the replay's table reader (the time column left out, text cells missing); more
    cells than --max-samples is a named error, and a 5 MiB row of empty fields is left out with a note."""
    rng = np.random.default_rng(2914)
    log = tmp_path / "m.csv"
    _wide_csv(log, np.arange(300) / 10, rng, extra="30.0,oops,1.0\n")
    assert main(["matrix", str(log), "--no-png"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[2].split() == ["x", "y"] and "'x': 1 of 301 rows missing" in err
    assert main(["matrix", str(log), "--no-png", "--max-samples", "100"]) == 2
    assert "--max-samples" in capsys.readouterr().err
    long = tmp_path / "long.csv"
    long.write_text("a,b\n1,2\n" + "," * (5 * MIB) + "\n")
    assert main(["matrix", str(long), "--no-png"]) == 2
    err = capsys.readouterr().err
    assert "1 rows of" in err and "do not have 2 fields" in err and "needs at least 32" in err
