"""Every code block of README.md, the docs site (docs/, read with its generated parts expanded as the build expands
them, and the model card and bench index it mounts) is executed or checked, so that a snippet that fails fails a
test (issue 29: the engine snippet raised NameError and never ran its coroutine).

- Python blocks run as scripts, each in a fresh namespace, in one interpreter (the model loads once); the two
  that need a peer run against one: the Subscriber snippet against a private Mosquitto and a real publisher,
  the envelope decoder on real envelopes as ``payload``.
- Shell blocks (bash, sh) must parse (``bash -n``); every ``streamcorr`` command line is parsed by the CLI's
  own argument parser, every ``pip`` extra exists in pyproject.toml and the torch pin is the installed one,
  every ``examples/`` path exists, other tools get their flags checked against their ``--help``; cheap commands
  run for real (``cp`` + ``streamcorr check``, ``promtool``, the ``python3 -c`` feeder for a moment).
- YAML blocks: a streamcorr config is validated by the config schema, a Kubernetes probe block names the
  daemon's health paths and port, a Prometheus block is parsed (tests/test_prometheus.py compares it with
  examples/prometheus/).
- pycon blocks (a module's doctest included by docs/hooks.py, titled with the module's path) run as doctests
  in that module's namespace.

A block of another language, or one no rule recognises, fails ``test_every_block_has_a_check``.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml

from streamcorr.config import Http, parse_config
from tests.helpers import USER_DOCS, hooks, make_event, make_snapshot

REPO = Path(__file__).resolve().parents[1]
DOCS = USER_DOCS  # README.md, docs/, models/README.md, bench/README.md
SHELL = ("bash", "sh")
NEEDS_PEER = ("Subscriber(", "msgpack.unpackb(payload")  # Python blocks run by their own tests below


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence
    lang: str
    code: str
    info: str = ""  # the rest of the fence's line: title="..." on an included doctest

    def __str__(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def _blocks() -> list[Block]:
    out = []
    expand = hooks().expand
    for path in DOCS:
        text = expand(path.read_text()) if path.parent.name == "docs" else path.read_text()
        for m in re.finditer(r"^```([\w+-]*)([^\n]*)\n(.*?)^```", text, flags=re.S | re.M):
            out.append(Block(path, text[: m.start()].count("\n") + 1, m.group(1), m.group(3), m.group(2).strip()))
    return out


BLOCKS = _blocks()


def _of(lang: tuple[str, ...]) -> list[Block]:
    return [b for b in BLOCKS if b.lang in lang]


def _plain_python() -> list[Block]:
    return [b for b in _of(("python",)) if not any(mark in b.code for mark in NEEDS_PEER)]


def _yaml_kind(block: Block) -> str | None:
    doc = yaml.safe_load(block.code)
    if isinstance(doc, dict) and ("version" in doc or "sources" in doc):
        return "config"
    if isinstance(doc, dict) and {"livenessProbe", "readinessProbe"} <= set(doc):
        return "probes"
    if isinstance(doc, dict) and "scrape_configs" in doc:
        return "prometheus"
    return None


def test_every_block_has_a_check():
    """Each fenced block is Python, shell or a YAML kind this module checks; the peer-needing Python blocks are
    each claimed by exactly one of their tests; none is left out."""
    np.random.default_rng(60)  # nothing random here; seeded by convention
    assert BLOCKS, "no code blocks found"
    unchecked = [str(b) for b in BLOCKS if b.lang not in ("python", *SHELL, "yaml", "pycon")]
    unchecked += [str(b) for b in _of(("yaml",)) if _yaml_kind(b) is None]
    assert unchecked == [], f"code blocks without a check (add one to {Path(__file__).name}): {unchecked}"
    for mark in NEEDS_PEER:
        assert len([b for b in _of(("python",)) if mark in b.code]) == 1, mark


# -- Python ------------------------------------------------------------------------------------------------------
_RUNNER = """
import runpy, sys, traceback
failed = []
for path in sys.argv[1:]:
    print(f"=== {path}", flush=True)
    try:
        runpy.run_path(path, run_name="__main__")
    except BaseException:
        traceback.print_exc()
        failed.append(path)
print("FAILED:", failed, flush=True)
sys.exit(1 if failed else 0)
"""


def test_python_blocks_run_as_scripts(tmp_path):
    """Every Python block that needs no peer runs to the end as a script of its own (fresh namespace, as pasted
    into a file), with no exception; the engine snippet prints its first snapshot."""
    np.random.default_rng(61)  # the blocks seed their own generators
    blocks = _plain_python()
    assert blocks
    paths = []
    for k, b in enumerate(blocks):
        path = tmp_path / f"block{k}_line{b.line}.py"
        path.write_text(b.code)
        paths.append(str(path))
    done = subprocess.run([sys.executable, "-c", _RUNNER, *paths], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    report = done.stdout + done.stderr
    assert done.returncode == 0, f"blocks {[str(b) for b in blocks]}:\n{report[-6000:]}"
    if any("Engine(cfg)" in b.code for b in blocks):
        assert "('ax', 'ay', 'temp')" in done.stdout, report[-3000:]


def test_subscriber_block_prints_snapshots_then_the_timeout(private_broker):
    """The README's Subscriber snippet, pointed at a private Mosquitto where a real publisher sends snapshots (the
    newest retained), prints them in order and, once the publisher stops (its status turns "offline"), the
    SubscriberTimeout message at once (a PublisherOffline, without waiting out the timeout); it exits 0."""
    from streamcorr.config import MqttConnection
    from streamcorr.publish.mqtt_sink import MqttPublisher

    rng = np.random.default_rng(62)
    port, _, _ = private_broker
    (block,) = [b for b in _of(("python",)) if "Subscriber(" in b.code]
    assert 'Subscriber("mqtt://127.0.0.1:1883")' in block.code and "timeout_s=120" in block.code
    code = block.code.replace("127.0.0.1:1883", f"127.0.0.1:{port}").replace("timeout_s=120", "timeout_s=60")
    stop = threading.Event()

    async def publish() -> None:
        async with MqttPublisher(settings=MqttConnection(host="127.0.0.1", port=port)) as pub:
            await pub.publish_status("online", {})
            seq = 1
            while not stop.is_set() and seq < 300:  # a hop every 0.2 s until the script has printed two
                await pub.publish_snapshot(make_snapshot(rng, seq=seq))
                seq += 1
                await asyncio.sleep(0.2)

    publisher = threading.Thread(target=lambda: asyncio.run(publish()))
    publisher.start()
    script = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert script.stdout is not None
        printed: list[str] = []
        while len([line for line in printed if re.match(r"\d+ \(", line)]) < 2 and script.poll() is None:
            printed.append(script.stdout.readline().rstrip("\n"))
        stop.set()
        stopped = time.monotonic()
        out, err = script.communicate(timeout=60)
        ended_s = time.monotonic() - stopped
    finally:
        stop.set()
        publisher.join(30)
        if script.poll() is None:
            script.kill()
    assert script.returncode == 0, "".join(printed) + out + err
    lines = [*printed, *out.splitlines()]
    seqs = [int(line.split()[0]) for line in lines if re.match(r"\d+ \(", line)]
    assert len(seqs) >= 2 and seqs == sorted(set(seqs)), lines
    assert f"the publisher at mqtt://127.0.0.1:{port}" in lines[-1] and "went offline" in lines[-1], lines
    assert ended_s < 30, ended_s  # not the 60-s timeout


def test_envelope_decoding_block_reads_real_envelopes():
    """The README's decoder, given streamcorr's own snapshot and event envelopes as ``payload``, recovers the
    MI matrix and the verdicts, and prints the event."""
    from streamcorr.publish.envelope import encode_event, encode_snapshot, encode_status

    rng = np.random.default_rng(63)
    (block,) = [b for b in _of(("python",)) if "msgpack.unpackb(payload" in b.code]
    snap = make_snapshot(rng, seq=3)
    scope: dict = {"payload": encode_snapshot(snap, seq=3)}
    exec(compile(block.code, str(block), "exec"), scope)
    np.testing.assert_array_equal(scope["mi"], snap.mi.astype(np.float32))
    if snap.dependent is not None:
        np.testing.assert_array_equal(scope["dependent"], snap.dependent)
    ev = make_event(rng)
    printed: list[str] = []
    scope = {"payload": encode_event(ev, seq=4), "print": lambda *a: printed.append(" ".join(map(str, a)))}
    exec(compile(block.code, str(block), "exec"), scope)
    assert printed and ev.pair[0] in printed[0] and ev.kind in printed[0], printed
    # what a client subscribed to {prefix}/# also receives: pairs-only snapshots and status messages
    printed.clear()
    scope = {"payload": encode_snapshot(snap, seq=5, top_k=2, pairs_only=True), "print": scope["print"]}
    exec(compile(block.code, str(block), "exec"), scope)
    assert len(printed) == 2 and "mi" not in scope, printed
    exec(compile(block.code, str(block), "exec"), {"payload": encode_status("online", {"hops": 1}, seq=6)})


# -- shell -------------------------------------------------------------------------------------------------------
def _commands(code: str) -> list[list[str]]:
    """The simple commands of a shell block (split at newlines outside quotes, ``&&``, ``|`` and ``;``)."""
    lines, buf = [], ""
    for line in code.splitlines():
        buf = f"{buf}\n{line}" if buf else line
        try:
            shlex.split(buf, comments=True)
        except ValueError:  # an open quote: the command goes on
            continue
        lines.append(buf)
        buf = ""
    assert not buf, f"unclosed quote in {code!r}"
    out: list[list[str]] = []
    for line in lines:
        lex = shlex.shlex(line, posix=True, punctuation_chars="|&;")
        lex.whitespace_split = True
        cur: list[str] = []
        for tok in lex:
            if set(tok) <= set("|&;"):
                out.append(cur) if cur else None
                cur = []
            else:
                cur.append(tok)
        if cur:
            out.append(cur)
    return out


def _help(argv: list[str]) -> str:
    done = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=120)
    return done.stdout + done.stderr


def _check_command(cmd: list[str], tmp_path: Path, missing: list[str]) -> None:
    """One command of a README shell block: checked as the module docstring says; tools not installed here are
    noted in ``missing``."""
    from streamcorr.cli.commands import _parser, main

    prog, args = cmd[0], cmd[1:]
    if prog == "streamcorr":
        try:
            _parser().parse_args(args)
        except SystemExit as exc:
            raise AssertionError(f"`{shlex.join(cmd)}`: the CLI refuses these arguments") from exc
        if args[:1] == ["check"]:
            assert main(["check", str(tmp_path / args[1])]) == 0, shlex.join(cmd)
    elif prog == "pip":
        extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
        for arg in args:
            if m := re.fullmatch(r"\.\[([\w,-]+)\]", arg):
                assert set(m.group(1).split(",")) <= set(extras), f"`{shlex.join(cmd)}`: extras of pyproject.toml"
            if arg.startswith("torch=="):
                import torch

                assert torch.__version__.split("+")[0] == arg.split("==")[1], (arg, torch.__version__)
    elif prog == "cp":
        shutil.copy(REPO / args[0], tmp_path / args[1])  # then `streamcorr check` reads it
    elif prog in ("python", "python3") and args[:1] == ["-c"]:
        feeder = subprocess.Popen([sys.executable, "-c", args[1]], stdout=subprocess.PIPE, text=True)
        try:
            assert feeder.stdout is not None
            first = json.loads(feeder.stdout.readline())  # one message, then it would go on forever
        finally:
            feeder.kill()
            feeder.wait()
        assert isinstance(first, dict) and all(isinstance(v, float) for v in first.values()), first
    elif prog == "promtool":
        if shutil.which(prog) is None:
            missing.append(prog)
            return
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"`{shlex.join(cmd)}`: {done.stdout}{done.stderr}"
    elif prog in ("ruff", "mypy", "pytest", "mosquitto_pub", "ray"):
        if shutil.which(prog) is None:
            missing.append(prog)
            return
        sub = [a for a in args[:1] if prog in ("ruff", "ray") and not a.startswith("-")]
        text = _help([prog, *sub])
        for flag in (a.split("=")[0] for a in args if a.startswith("-")):
            assert re.search(rf"(^|[\s,\[]){re.escape(flag)}\b", text), f"`{shlex.join(cmd)}`: {flag} not in --help"
    else:
        raise AssertionError(f"`{shlex.join(cmd)}`: no check for {prog!r}; add one to {Path(__file__).name}")


def _check_examples_paths(block: Block) -> None:
    """Every examples/ path the block names, in a command or a comment, exists."""
    for path in re.findall(r"\bexamples/[\w./-]*\w", block.code):
        assert (REPO / path).exists(), f"{block}: {path} does not exist"


@pytest.mark.parametrize("block", _of(SHELL), ids=str)
def test_shell_blocks_parse_and_their_commands_exist(block, tmp_path):
    """The block is valid shell; each command exists with the arguments shown (streamcorr's parsed by its own
    CLI), every examples/ path it names exists, and the cheap commands succeed when run."""
    np.random.default_rng(64)  # nothing random here; seeded by convention
    done = subprocess.run(["bash", "-n"], input=block.code, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    _check_examples_paths(block)
    missing: list[str] = []
    for cmd in _commands(block.code):
        _check_command(cmd, tmp_path, missing)
    if missing:
        pytest.skip(f"{block}: everything else checked; not installed here: {', '.join(sorted(set(missing)))}")


# -- YAML --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("block", _of(("yaml",)), ids=str)
def test_yaml_blocks_are_valid(block):
    """A streamcorr config block passes the config schema; probe blocks use the daemon's health endpoints on its
    default port; a Prometheus block parses with its rule file and scrape job."""
    np.random.default_rng(65)  # nothing random here; seeded by convention
    doc = yaml.safe_load(block.code)
    kind = _yaml_kind(block)
    if kind == "config":
        parse_config(doc)
    elif kind == "probes":
        port = Http().port
        for probe in doc.values():
            assert probe["httpGet"]["path"] in ("/livez", "/readyz", "/healthz") and probe["httpGet"]["port"] == port
    else:
        assert kind == "prometheus" and doc["rule_files"] and doc["scrape_configs"][0]["job_name"] == "streamcorr"


# -- doctests included from modules --------------------------------------------------------------------------------
@pytest.mark.parametrize("block", _of(("pycon",)), ids=str)
def test_included_doctests_pass(block):
    """A ``>>>`` example included from a module's docstring runs as a doctest in that module's namespace."""
    import doctest
    import importlib

    np.random.default_rng(67)  # the examples are deterministic
    m = re.fullmatch(r'title="(streamcorr/[\w/]+)\.py"', block.info)
    assert m, f"{block}: a pycon block names its module: {block.info!r}"
    module = importlib.import_module(m.group(1).replace("/", "."))
    test = doctest.DocTestParser().get_doctest(block.code, dict(vars(module)), str(block), str(block.path), block.line)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    assert runner.failures == 0 and runner.tries > 0, f"{block}: {runner.failures} of {runner.tries} failed"


def test_the_checks_catch_a_broken_block(tmp_path):
    """The checks fail on the mistakes they exist for: an undefined name in a Python block, an unknown streamcorr
    flag, a missing pip extra and an examples/ path that does not exist."""
    np.random.default_rng(66)  # nothing random here; seeded by convention
    path = tmp_path / "broken.py"
    path.write_text("print(t_chunk)\n")
    done = subprocess.run([sys.executable, "-c", _RUNNER, str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "NameError: name 't_chunk'" in done.stderr
    for cmd in (["streamcorr", "replay", "x.csv", "--no-such-flag"], ["pip", "install", "-e", ".[nosuchextra]"]):
        with pytest.raises(AssertionError):
            _check_command(cmd, tmp_path, [])
    with pytest.raises(AssertionError, match="does not exist"):
        _check_examples_paths(
            Block(REPO / "README.md", 1, "bash", "cp examples/nothing.yaml my.yaml  # or examples/x\n")
        )
