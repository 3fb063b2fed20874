"""The CLI as a new user meets it: bad files, bad configs and ordinary mistakes get one clear line, never a
traceback (issue 10, classes 11, 14, 15, 17)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from streamcorr import __version__
from streamcorr.cli.commands import main
from tests.brokers import free_port

GOOD_SOURCE = {"type": "zmq", "endpoint": "tcp://127.0.0.1:1", "mode": "pull"}


def _laughs(levels: int = 9) -> str:
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for k in range(1, levels):
        lines.append(f"l{k}: &l{k} [" + ", ".join([f"*l{k - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def _bad_configs(d: Path, rng: np.random.Generator) -> list[str]:
    """Configuration files a user or an attacker could hand to `check` and `run`; none is valid."""
    files = {
        "empty.yaml": "",
        "list.yaml": "- 1\n- 2\n",
        "scalar.yaml": "hello\n",
        "bad_yaml.yaml": "version: 1\nsources: [\n",
        "tabs.yaml": "version: 1\n\tsources: []\n",
        "laughs_version.yaml": _laughs() + "version: *l8\n",
        "laughs_sources.yaml": _laughs(7) + "version: 1\nsources: *l6\n",
        "long_value.yaml": yaml.safe_dump({"version": 1, "sources": [{**GOOD_SOURCE, "bind": "y" * 200_000}]}),
        "long_key.yaml": yaml.safe_dump({"version": 1, "sources": [GOOD_SOURCE], "window": {"k" * 900: 1}}),
        "deep.yaml": "[" * 50_000 + "]" * 50_000 + "\n",
        "wrong_version.yaml": "version: [1, 2, 3]\n",
        "unknown_key.yaml": yaml.safe_dump({"version": 1, "sources": [GOOD_SOURCE], "windw": {}}),
        "bad_port.yaml": yaml.safe_dump({"version": 1, "sources": [{**GOOD_SOURCE, "type": "mqtt", "port": 1e9}]}),
        "nul.yaml": "version: 1\x00\n",
        "many_errors.yaml": yaml.safe_dump(
            {"version": 1, "sources": [GOOD_SOURCE], "channels": {"names": [1] * 50_000}}
        ),
    }
    paths = []
    for name, text in files.items():
        (d / name).write_text(text)
        paths.append(str(d / name))
    (d / "binary.yaml").write_bytes(rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
    (d / "huge.yaml").write_bytes(b"# " + b"x" * (2 << 20))
    return [*paths, str(d / "binary.yaml"), str(d / "huge.yaml"), str(d / "missing.yaml"), str(d), "/dev/zero"]


def _bad_tables(d: Path, rng: np.random.Generator) -> list[str]:
    """Data files for `estimate` and `matrix`: missing, empty, odd delimiters, text, NaN, binary, ragged."""
    x = rng.standard_normal(64)
    num = "\n".join(f"{a:.4f},{b:.4f}" for a, b in zip(x, x**2, strict=True))
    files = {
        "empty.csv": "",
        "header_only.csv": "x,y\n",
        "blank_lines.csv": "\n\n\n",
        "semicolon.csv": "x;y\n" + num.replace(",", ";") + "\n",
        "tabs.csv": "x\ty\n" + num.replace(",", "\t") + "\n",
        "text.csv": "x,y,label\n" + "\n".join(f"{line},w{k}" for k, line in enumerate(num.splitlines())) + "\n",
        "all_text.csv": "x,y\n" + "a,b\n" * 50,
        "nan_rows.csv": "x,y\n" + num + "\n" + "nan,\n" * 10 + ",1\n" * 5,
        "short.csv": "x,y\n1,2\n3,4\n",
        "ragged.csv": "x,y\n1\n2,3,4\n" + num + "\n",
        "one_column.csv": "x\n" + "\n".join(f"{v}" for v in x) + "\n",
        "quote.csv": 'x,y\n"1,2\n',
        "huge_field.csv": "x,y\n" + "9" * 300_000 + ",1\n",
        "no_header_numbers.csv": num + "\n",
        "decimal_comma.csv": "x;y\n"
        + "\n".join(f"{a:.4f};{b:.4f}".replace(".", ",") for a, b in zip(x, x**2, strict=True)),
        "spaces.csv": "x y\n" + num.replace(",", " ") + "\n",
    }
    paths = []
    for name, text in files.items():
        (d / name).write_text(text)
        paths.append(str(d / name))
    (d / "binary.csv").write_bytes(rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
    (d / "latin1.csv").write_bytes("x,y\n1,\xe9\n".encode("latin-1"))
    (d / "bad.parquet").write_bytes(b"PAR1 not really")
    extra = ("binary.csv", "latin1.csv", "bad.parquet", "missing.csv")
    return [*paths, *(str(d / name) for name in extra), str(d)]


def _run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out + err


def test_no_command_shows_a_traceback_on_a_corpus_of_bad_files(tmp_path, capsys):
    """`check`, `run`, `estimate` and `matrix` answer every bad config or data file with exit code 0 or 2 and a
    bounded message, never a traceback or an unexpected-error exit."""
    rng = np.random.default_rng(10)
    configs, tables = _bad_configs(tmp_path, rng), _bad_tables(tmp_path, rng)
    cases = [["check", c] for c in configs] + [["run", c] for c in configs]
    cases += [["estimate", t, "x", "y"] for t in tables]
    cases += [["matrix", t, "--no-png"] for t in tables] + [["matrix", t, "--no-png", "--start", "60"] for t in tables]
    for argv in cases:
        rc, text = _run_cli(argv, capsys)
        assert "Traceback" not in text, (argv, text[-3000:])
        assert rc in (0, 2), (argv, rc, text[-3000:])
        if rc == 2:
            assert "streamcorr: error:" in text and len(text) < 4000, (argv, text[:4000])
        if argv[0] in ("check", "run"):
            assert rc == 2, argv


def test_check_refuses_what_run_refuses_in_a_source_payload_naming_the_key(tmp_path, capsys):
    """A channel template with an unknown field or a time field that clashes with a reserved name passes the schema;
    `check` refuses it as `run` does, both naming the file and the source's key path, so a deploy gated on `check`
    holds."""
    for key, value, says in [("channel_template", "{topic[1]}.{kee}", "found ['kee']"),
                             ("time_field", "t0", "reserved name")]:  # fmt: skip
        path = tmp_path / f"{key}.yaml"
        path.write_text(yaml.safe_dump({"version": 1, "sources": [GOOD_SOURCE, {**GOOD_SOURCE, key: value}],
                                        "http": {"port": 0}}))  # fmt: skip
        for cmd in ("check", "run"):
            rc, text = _run_cli([cmd, str(path)], capsys)
            assert rc == 2 and f"error: {path}: sources.1.{key}" in text and says in text, (cmd, text)


def test_config_bombs_are_refused_quickly_with_short_messages(tmp_path, capsys):
    """A billion-laughs alias bomb, /dev/zero and a 200 kB value each give a one-line error of bounded length."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_laughs() + "version: *l8\n")
    rc, text = _run_cli(["check", str(bomb)], capsys)
    assert rc == 2 and "YAML aliases" in text and len(text) < 500
    rc, text = _run_cli(["check", "/dev/zero"], capsys)
    assert rc == 2 and "larger than" in text
    small = tmp_path / "small_bomb.yaml"
    small.write_text(_laughs(4) + "version: *l3\n")  # 6,561 values: under the bound, so echoed, but cut
    rc, text = _run_cli(["check", str(small)], capsys)
    assert rc == 2 and "version" in text and len(text) < 500


def test_csv_mistakes_get_clear_messages(tmp_path, capsys):
    """Text columns are skipped (and said so), NaN rows are counted, `;` files are read, a missing file and a
    --start past the end name the problem instead of advising a longer window."""
    rng = np.random.default_rng(15)
    x = rng.standard_normal(400)
    rows = [f"{a:.5f};{b:.5f};{'on' if k % 2 else 'off'}" for k, (a, b) in enumerate(zip(x, x**2, strict=True))]
    rows[:7] = ["nan;1;off", ";2;on", "x;3;off", "1;;on", "NaN;;off", "-;4;on", "?;5;off"]
    path = tmp_path / "log.csv"
    path.write_text("x;y;state\n" + "\n".join(rows) + "\n")
    rc, text = _run_cli(["estimate", str(path), "x", "y"], capsys)
    assert rc == 0 and "7 of 400 rows dropped" in text
    assert float(text.split()[0]) > 0.5  # stdout first: the MI
    rc, text = _run_cli(["matrix", str(path), "--no-png"], capsys)
    assert rc == 0 and "skipped columns without numbers: 'state'" in text and "longer window" not in text
    rc, text = _run_cli(["matrix", str(path), "--no-png", "--start", "400"], capsys)
    assert rc == 2 and "--start 400 is outside the file: it has 400 data rows" in text
    rc, text = _run_cli(["estimate", str(path), "x", "state"], capsys)
    assert rc == 2 and "'state' not in" in text and "no numbers" in text
    rc, text = _run_cli(["estimate", str(tmp_path / "nope.csv"), "x", "y"], capsys)
    assert rc == 2 and "No such file" in text


def test_a_wide_log_of_columns_on_their_own_times_points_to_replay(tmp_path, capsys):
    """Two columns stamped at interleaved times share no row: `estimate` and `matrix` exit 2 saying so and name
    `streamcorr replay`, which aligns them; `matrix` writes no heatmap of empty cells."""
    rng = np.random.default_rng(16)
    rows = [line for k in range(200) for line in (f"{k / 100:.3f},{rng.standard_normal():.4f},",
                                                   f"{k / 100 + 0.003:.3f},,{rng.standard_normal():.4f}")]  # fmt: skip
    path = tmp_path / "wide.csv"
    path.write_text("t,a,b\n" + "\n".join(rows) + "\n")
    rc, text = _run_cli(["estimate", str(path), "a", "b"], capsys)
    assert rc == 2 and f"`streamcorr replay {path}` aligns them" in text
    rc, text = _run_cli(["matrix", str(path)], capsys)
    assert rc == 2 and f"`streamcorr replay {path}` aligns them" in text and "heatmap written" not in text
    assert not (tmp_path / "wide_mi.png").exists()


def test_broken_pipe_exits_quietly(tmp_path):
    """`streamcorr matrix ... | head` (the reader gone before the output) exits without a traceback."""
    rng = np.random.default_rng(16)
    path = tmp_path / "d.csv"
    np.savetxt(path, rng.standard_normal((200, 6)), delimiter=",", header="a,b,c,d,e,f", comments="")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamcorr", "matrix", str(path), "--no-png"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # like `| head -0`: nobody reads
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_version_flag_and_bare_command_help(capsys):
    """`streamcorr --version` prints the version; `streamcorr` alone prints the help with every command."""
    rc, text = _run_cli(["--version"], capsys)
    assert rc == 0 and __version__ in text
    rc, text = _run_cli([], capsys)
    assert rc == 0 and "required: " not in text and "usage: streamcorr" in text
    for cmd in ("run", "check", "demo", "matrix", "estimate"):
        assert cmd in text


@pytest.mark.parametrize("taken_by", ["http.port", "outputs.zmq", "sources.0"])
def test_run_with_a_busy_port_is_a_clear_error(taken_by, tmp_path, capsys):
    """`streamcorr run` whose HTTP, ZeroMQ output or ZeroMQ source port is taken says which key of which file to
    change, with no traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        free = {"http": 0, "zmq": free_port(), "last": free_port(), "src": free_port()}
        cfg = {
            "version": 1,
            "sources": [{**GOOD_SOURCE, "endpoint": f"tcp://127.0.0.1:{free['src']}", "bind": True}],
            "window": {"samples": 64},
            "http": {"port": free["http"]},
            "outputs": {"zmq": {"endpoint": f"tcp://127.0.0.1:{free['zmq']}",
                                "snapshot_endpoint": f"tcp://127.0.0.1:{free['last']}"}},
        }  # fmt: skip
        if taken_by == "http.port":
            cfg["http"]["port"] = port
        elif taken_by == "outputs.zmq":
            cfg["outputs"]["zmq"]["endpoint"] = f"tcp://127.0.0.1:{port}"
        else:
            cfg["sources"][0]["endpoint"] = f"tcp://127.0.0.1:{port}"
        path = tmp_path / "busy.yaml"
        path.write_text(yaml.safe_dump(cfg))
        rc, text = _run_cli(["run", str(path)], capsys)
    assert rc == 2 and "Traceback" not in text, text[-3000:]
    assert f"streamcorr: error: {path}: {taken_by}" in text and str(port) in text, text[-3000:]
