"""MkDocs hooks: the generated parts of the site, each from its one source.

A page asks for generated text with a marker line, ``<!-- generate: NAME [ARG] -->``. The text is kept in the page
below it, up to ``<!-- end generate -->``, so that the Markdown reads whole in the repository too:
``python docs/hooks.py`` writes it there (``--check`` lists pages whose text is out of date, as tests/test_docs.py
does), and the build's `expand` replaces each block with text generated afresh. The generators:

- ``config-reference``: every key of the YAML schema (`streamcorr.config.Config`) with its type, default, bounds
  and the comment or description written beside it in `streamcorr/config.py`.
- ``docstring MODULE``: a module's docstring as Markdown (the wire format of `streamcorr.publish.envelope`, the
  payloads of `streamcorr.ingest.payload`, ...); its ``>>>`` examples become ``pycon`` blocks titled with the
  module, which pytest's ``--doctest-modules`` runs.
- ``modules``: every module of the package with the first line of its docstring, read from the package itself.
- ``headlines`` and ``results``: the performance tables, read from ``bench/results/`` (figures from each result's
  JSON; date, commit and machine from its record).

The site also mounts files that live beside the code, at their repository paths: ``models/README.md`` (the
model card, with the training curves it shows), ``bench/README.md`` and ``bench/results/``. A docs page links
to them as ``../models/README.md`` (a path that works when the Markdown is read in the repository);
`on_page_markdown` drops the ``../`` for the site (and the ``docs/`` of a mounted file's link into docs/).

tests/test_docs.py builds the site with ``--strict``; tests/test_examples_readme.py runs the code blocks of the
expanded pages.
"""

from __future__ import annotations

import ast
import html
import importlib
import inspect
import io
import json
import math
import re
import tokenize
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "streamcorr"
RESULTS = REPO / "bench" / "results"
MARKER = re.compile(r"^<!-- generate: ([\w-]+)(?: ([\w.]+))? -->$")
END = "<!-- end generate -->"
MOUNTED = (  # besides bench/results/*.md and *.png
    "models/README.md",
    "bench/README.md",
    "training/runs/infonet-v1/loss.png",
    "training/runs/infonet-v2-round15/loss.png",
)


# -- markers -----------------------------------------------------------------------------------------------------
def generate(name: str, arg: str | None) -> str:
    """The text of one marker."""
    if name == "config-reference":
        return config_reference()
    if name == "docstring" and arg:
        return docstring_markdown(arg)
    if name == "modules":
        return module_table()
    if name == "headlines":
        return headline_table()
    if name == "results":
        return results_table()
    raise ValueError(f"unknown generation marker {name!r} {arg or ''}")


def _blocks(markdown: str, keep_markers: bool) -> str:
    """The page with each marker's block (the marker, its kept text and the end line; or a bare marker line)
    replaced by fresh text, framed by the marker and end lines if ``keep_markers``."""
    lines, out, k = markdown.split("\n"), [], 0
    while k < len(lines):
        m = MARKER.match(lines[k])
        if m is None:
            out.append(lines[k])
            k += 1
            continue
        end = next((q for q in range(k + 1, len(lines)) if lines[q] == END or MARKER.match(lines[q])), None)
        text = generate(m.group(1), m.group(2)).strip("\n")
        out += [lines[k], text, END] if keep_markers else [text]
        k = end + 1 if end is not None and lines[end] == END else k + 1
    return "\n".join(out)


def expand(markdown: str) -> str:
    """The page as the site shows it: every generated block replaced by text generated now."""
    return _blocks(markdown, keep_markers=False)


def refresh(markdown: str) -> str:
    """The page as committed: every generated block holding text generated now, between its marker lines."""
    return _blocks(markdown, keep_markers=True)


# -- docstrings --------------------------------------------------------------------------------------------------
def docstring_markdown(module: str) -> str:
    """A module's docstring as Markdown: ``literal`` spans, RST roles and headings, ``::`` blocks (Python) and
    ``>>>`` examples (pycon, titled with the module's path) converted; Markdown tables and lists kept."""
    mod = importlib.import_module(module)
    doc = inspect.cleandoc(mod.__doc__ or "")
    path = Path(inspect.getfile(mod)).relative_to(REPO).as_posix()
    lines = doc.splitlines()
    out: list[str] = []
    k = 0
    while k < len(lines):
        line = lines[k]
        nxt = lines[k + 1] if k + 1 < len(lines) else ""
        if line.strip() and nxt and set(nxt) == {"-"} and len(nxt) >= len(line.strip()) - 2:  # RST heading
            out += [f"#### {_inline(line.strip())}", ""]
            k += 2
        elif line.rstrip().endswith("::"):  # a literal block follows: indented lines
            out += [_inline(line.rstrip()[:-1]), ""]
            k += 1
            block: list[str] = []
            while k < len(lines) and (not lines[k].strip() or lines[k].startswith("    ")):
                block.append(lines[k][4:])
                k += 1
            out += ["```python", *_trim(block), "```", ""]
        elif line.startswith(">>>"):
            block = []
            while k < len(lines) and lines[k].strip():
                block.append(lines[k])
                k += 1
            out += [f'```pycon title="{path}"', *block, "```"]
        else:
            indent = len(line) - len(line.lstrip())
            out.append(" " * (4 if indent == 3 else indent) + _inline(line.lstrip()))  # Markdown nests lists by 4
            k += 1
    return "\n".join(out).strip() + "\n"


def _inline(text: str) -> str:
    text = re.sub(r":(?:mod|class|func|meth|attr):`~?([^`]+)`", r"`\1`", text)
    return re.sub(r"``(.+?)``", r"`\1`", text)


def _trim(block: list[str]) -> list[str]:
    while block and not block[-1].strip():
        block.pop()
    while block and not block[0].strip():
        block.pop(0)
    return block


# -- configuration reference -------------------------------------------------------------------------------------
def _comments(source: str) -> tuple[dict[int, str], set[int]]:
    """Comment text by line, and the lines that hold nothing but a comment."""
    comments, alone = {}, set()
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code_lines.update(range(tok.start[0], tok.end[0] + 1))
    alone = {line for line in comments if line not in code_lines}
    return comments, alone


def field_comments(module: types.ModuleType) -> dict[tuple[str, str], str]:
    """(class, field) -> the comment written beside a field: the comment lines right above it and the comments
    on its own lines, joined."""
    source = inspect.getsource(module)
    comments, alone = _comments(source)
    out = {}
    for cls in ast.parse(source).body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for node in cls.body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            above, line = [], node.lineno - 1
            while line in alone:
                above.insert(0, comments[line])
                line -= 1
            own = [comments[n] for n in range(node.lineno, (node.end_lineno or node.lineno) + 1) if n in comments]
            text = " ".join([*above, *own]).strip()
            if text:
                out[(cls.name, node.target.id)] = text
    return out


def _is_model(tp: Any) -> bool:
    from pydantic import BaseModel

    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _show_value(value: Any, key: str = "") -> str:
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int) and key.endswith("_bytes") and value >= 1024:
        for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
            if value % (1 << shift) == 0:
                return f"{value >> shift} {unit}"
    if isinstance(value, float):
        return f"`{int(value)}`" if value.is_integer() and abs(value) < 1e6 else f"`{value:g}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, list | tuple):
        return "`" + json.dumps(list(value)) + "`"
    return f"`{value}`"


def _show_type(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None):
        return "null"
    if origin is typing.Annotated:
        return _show_type(args[0])
    if origin is typing.Literal:
        return " \\| ".join(f'"{a}"' if isinstance(a, str) else json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_show_type(a) for a in args)
    if origin is list:
        return f"list of {_show_type(args[0])}"
    if origin is tuple:
        return "[" + ", ".join(_show_type(a) for a in args) + "]"
    if _is_model(tp):
        return "section"
    return getattr(tp, "__name__", str(tp))


def _bounds(info: Any, key: str) -> str:
    parts = []
    for m in info.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            if getattr(m, attr, None) is not None:
                parts.append(f"{sign} {_show_value(getattr(m, attr), key).strip('`')}")
        if getattr(m, "min_length", None) is not None:
            parts.append(f"at least {m.min_length} item" + ("s" if m.min_length != 1 else ""))
        if getattr(m, "pattern", None) is not None:
            # an entity, not a bare |, which ends a table cell (GitHub) or shows its backslash in code (MkDocs)
            pattern = html.escape(m.pattern, quote=False).replace("|", "&#124;")
            parts.append(f"matches <code>{pattern}</code>")
    return ", ".join(parts)


def _default(info: Any, key: str) -> str:
    from pydantic_core import PydanticUndefined

    if info.default_factory is not None:
        value = info.default_factory()
    elif info.default is PydanticUndefined:
        return "required"
    else:
        value = info.default
    if _is_model(type(value)):
        return "its defaults"
    if isinstance(value, float) and not math.isfinite(value):
        return f"`{value}`"
    return _show_value(value, key)


@dataclass
class _Section:
    key: str  # the key path its rows start with ("" at the top level)
    title: str
    anchor: str
    intro: str = ""
    rows: list[tuple[str, str, str, str, str]] = field(default_factory=list)


def _owner(model: type, name: str) -> str:
    """The class of ``model``'s MRO that declares field ``name`` (its comment is written there)."""
    for cls in model.__mro__:
        if name in inspect.get_annotations(cls):
            return cls.__name__
    return model.__name__


def _describe(text: str) -> str:
    return re.sub(r"\bNone\b", "null", text)  # the file is YAML


def _sections(model: Any, key: str, title: str, comments: dict[tuple[str, str], str], out: list[_Section]) -> None:
    anchor = title.lower().replace(" ", "-").replace(":", "").replace("(", "").replace(")", "").replace("type-", "")
    section = _Section(key, title, anchor, inspect.getdoc(model) if model.__doc__ else "")
    out.append(section)
    nested: list[tuple[str, str, type]] = []
    for name, info in model.model_fields.items():
        path = f"{key}.{name}" if key else name
        tp = info.annotation
        models = [a for a in (typing.get_args(tp) or (tp,)) if _is_model(a)]
        text = _describe(info.description or comments.get((_owner(model, name), name), ""))
        if name == "sources":
            text = text or "one or more inputs, each with a `type`: [mqtt](#sources-mqtt) or [zmq](#sources-zmq)"
            tp_text, models = "list of sections", []
        else:
            tp_text = _show_type(tp)
        if models:
            sub_title = f"{title}: {name}" if title.startswith("sources") else path
            sub_anchor = sub_title.replace(" ", "-").replace(":", "").replace("(", "").replace(")", "")
            text = (text + "; " if text else "") + f"see [`{path}`](#{sub_anchor.replace('type-', '')})"
            nested += [(path, sub_title, m) for m in models]
        section.rows.append((f"`{path}`", tp_text, _default(info, name), _bounds(info, name), text))
    for path, sub_title, m in nested:
        _sections(m, path, sub_title, comments, out)


def config_reference() -> str:
    """Every key of the configuration file, one table per section, from `streamcorr.config`."""
    from streamcorr import config

    comments = field_comments(config)
    sections: list[_Section] = []
    _sections(config.Config, "", "Top level", comments, sections)
    sources: list[_Section] = []
    for source in typing.get_args(typing.get_args(config.Source)[0]):
        tag = typing.get_args(source.model_fields["type"].annotation)[0]
        _sections(source, "sources[]", f"sources (type: {tag})", comments, sources)
    sections[1:1] = sources  # after the top level, where `sources` is
    out = []
    for s in sections:
        out += [f"### {s.title} {{#{s.anchor}}}", ""]
        if s.intro:
            out += [s.intro.replace("\n", " "), ""]
        out += ["| key | type | default | bounds | meaning |", "|---|---|---|---|---|"]
        for row in s.rows:
            out.append("| " + " | ".join(_cell(cell) if k == 4 else cell for k, cell in enumerate(row)) + " |")
        out.append("")
    return "\n".join(out)


# -- the module list ---------------------------------------------------------------------------------------------
def package_modules() -> list[str]:
    """Every module of the package as a path relative to the repository, ``__init__.py`` included."""
    return sorted(p.relative_to(REPO).as_posix() for p in PACKAGE.rglob("*.py"))


def module_table() -> str:
    """Each module of the package with the first line of its docstring, grouped by folder."""
    rows = ["| module | what it does |", "|---|---|"]
    for rel in package_modules():
        tree = ast.parse((REPO / rel).read_text())
        doc = (ast.get_docstring(tree) or "").strip().split("\n\n")[0].replace("\n", " ")
        rows.append(f"| `{rel}` | {_cell(_inline(doc))} |")
    return "\n".join(rows) + "\n"


# -- performance -------------------------------------------------------------------------------------------------
FOOTER = re.compile(
    r"_git (?P<sha>[\w-]+), (?P<cpu>.+?) \((?P<cores>\d+) cores\), torch (?P<torch>\S+) \((?P<threads>\d+) "
    r"threads\), numba \S+, (?P<date>\d{4}-\d\d-\d\d) \d\d:\d\d:\d\d UTC_"
)


@dataclass(frozen=True)
class Record:
    """Where and when a result file was measured, from its last line (bench.common.write_results)."""

    commit: str
    machine: str
    date: str


def record(stem: str) -> Record:
    text = (RESULTS / f"{stem}.md").read_text()
    m = FOOTER.search(text)
    if m is None:
        raise ValueError(f"bench/results/{stem}.md has no record line (_git SHA, CPU (N cores), ..., DATE UTC_)")
    machine = f"{m['cpu'].replace('(R)', '')} ({m['cores']} cores)"
    path = RESULTS / f"{stem}.json"
    device = json.loads(path.read_text()).get("env", {}).get("device") if path.exists() else None
    if device:
        machine = f"{device.split(' (')[0]}, {machine}"
    return Record(m["sha"], machine, m["date"])


@dataclass(frozen=True)
class Headline:
    """One row of the headline table: what was measured, the figures read from the result's JSON into
    ``template`` (each a path of keys and indices, and a format), the command that measures it and the model."""

    what: str
    stem: str
    command: str
    template: str
    figures: tuple[tuple[tuple[str | int, ...], str], ...]
    model: str = "—"  # the weights it ran with, where a model ran

    def measured(self) -> str:
        data = json.loads((RESULTS / f"{self.stem}.json").read_text())
        values = []
        for path, fmt in self.figures:
            value: Any = data
            for step in path:
                value = value[step]
            values.append(format(value, fmt))
        return self.template.format(*values)


HEADLINES = (
    Headline(
        "live engine: 64 channels at 100 Hz, window 1024, all 2,016 pairs every 1-s hop, 300 s",
        "engine_live_64ch_1024",
        "python -m bench.engine_throughput live",
        "{} pairs/s, {} hops skipped; hop to publish p50 {} s, p99 {} s",
        (
            (("pairs_refreshed_per_s_after_first_window",), ",.0f"),
            (("hops_skipped",), "d"),
            (("latency_p50_s",), ".2f"),
            (("latency_p99_s",), ".2f"),
        ),
        "infonet-v1",
    ),
    Headline(
        "live engine, every pair dependent (screening cannot help): 64 channels, window 1024, 150 s",
        "engine_live_64ch_1024_all_dependent",
        "python -m bench.engine_throughput live --all-dependent --duration-s 150",
        "{} pairs/s, {} of {} hops skipped; p99 {} s",
        (
            (("pairs_refreshed_per_s_after_first_window",), ",.0f"),
            (("hops_skipped",), "d"),
            (("hops",), "d"),
            (("latency_p99_s",), ".2f"),
        ),
        "infonet-v2",
    ),
    Headline(
        "live, sparse graph: `streamcorr run` fed 256 channels at 50 Hz over ZeroMQ, window 512, 1 % of the "
        "pairs dependent, screening on, 150 s",
        "live_sparse_256ch",
        "python -m bench.live_sparse",
        "{} of hops published, p99 {} s; dependent pairs refreshed in {} of snapshots; new dependence reported "
        "within {} s",
        (
            (("snapshot_per_hop",), ".0%"),
            (("latency_p99_s",), ".2f"),
            (("dependent_ok_min",), ".0%"),
            (("event_delay_max_s",), ".1f"),
        ),
        "infonet-v1",
    ),
    Headline(
        "`streamcorr replay`: 24 channels at 100 Hz, window 1024, 1-s hop, every pair by the network",
        "replay",
        "python -m bench.replay",
        "{}x real time ({} pairs/s)",
        ((("runs", 0, "x_real_time"), ".1f"), (("runs", 0, "pairs_per_s"), ",d")),
        "infonet-v1",
    ),
    Headline(
        "ingest into the engine, 2 min per transport",
        "ingest_load",
        "python -m bench.ingest_load all",
        "ZeroMQ {} samples/s; MQTT through Mosquitto {} messages/s, {} lost, {}% of a core",
        (
            (("runs", 0, "steady_samples_per_s"), ",.0f"),
            (("runs", 1, "steady_msg_per_s"), ",.0f"),
            (("runs", 1, "lost_messages"), "d"),
            (("runs", 1, "consumer_cpu_pct"), ".0f"),
        ),
    ),
    Headline(
        "MQTT burst: 300,000 JSON messages (8 topics, QoS 0) as fast as a paho publisher sends them, beside "
        "`mosquitto_sub`",
        "mqtt_burst",
        "python -m bench.mqtt_burst --repeats 5",
        "the source took a median {} of what mosquitto_sub took",
        ((("median_share",), ".1%"),),
    ),
    Headline(
        "MQTT burst into `streamcorr run` (its engine evaluating every hop): 300,000 JSON messages (8 topics, QoS 0) "
        "as fast as a paho publisher sends them, beside `mosquitto_sub`",
        "mqtt_burst_daemon",
        "python -m bench.mqtt_burst --daemon --repeats 5",
        "the daemon took a median {} of what mosquitto_sub took",
        ((("median_share",), ".1%"),),
    ),
    Headline(
        "estimator at T = 2000, batched, against KSG-3 (scikit-learn, k = 3)",
        "speed",
        "python -m bench.speed",
        "{} pairs/s, {}x KSG-3; cold start {} s",
        (
            (("rows", 3, "infonet_batch_pairs_per_s"), ",.0f"),
            (("rows", 3, "batch_over_ksg"), ".1f"),
            (("startup", "in_process_s"), ".1f"),
        ),
        "infonet-v2",
    ),
    Headline(
        "CPU network path, window 1024, 2,048 pairs: the ahead-of-time package (the default) against eager",
        "cpu_path",
        "python -m bench.cpu_path",
        "{} pairs/s, {}x eager",
        (
            (("rows", "aot package, batch 128 (the default)", "pairs_per_s"), ",.0f"),
            (("rows", "aot package, batch 128 (the default)", "speedup"), ".2f"),
        ),
        "infonet-v1",
    ),
    Headline(
        "CUDA path, window 1024, all pairs of one window, the network as fused Triton kernels",
        "gpu_path_nvidia-h200",
        "bash bench/gpu_check.sh",
        "{} pairs/s at {} channels (MFU {} of the measured bf16 peak), {} at {}; the torch-compiled network "
        "in the same run: {} at 1,024",
        (
            (("rows", 2, "pairs_per_s"), ",.0f"),
            (("rows", 2, "channels"), ",d"),
            (("rows", 2, "mfu_measured_peak"), ".1%"),
            (("rows", 1, "pairs_per_s"), ",.0f"),
            (("rows", 1, "channels"), ",d"),
            (("variants", 0, "pairs_per_s"), ",.0f"),
        ),
        "infonet-v2",
    ),
    Headline(
        "Ray scale-out: all pairs of a 512-sample window, 256 channels, 2 local Ray workers",
        "ray_scaling",
        "python -m bench.ray_scaling",
        "Ray's overhead {} of the hop; {} pairs/s per CPU worker; {} s of head time per tile",
        (
            (("capacity", "overhead_share"), ".1%"),
            (("capacity", "per_worker_pairs_per_s"), ",.0f"),
            (("capacity", "tile_head_s"), ".4f"),
        ),
        "infonet-v1",
    ),
    Headline(
        "accuracy, paper Table 2 protocol: T = 2000, 1,000 held-out mixtures, the default `infonet-v2`",
        "estimator_v2_v2",
        "python -m bench.estimator_v2 --weights models/infonet-v2.safetensors --tag v2",
        "MAE {} nats (KSG-3 {}; the true density {}); {}x faster than KSG-3",
        (
            (("table2", "candidate (jitter)", "2000", "mae"), ".4f"),
            (("table2", "KSG-3", "2000", "mae"), ".4f"),
            (("table2_known_density", "2000", "mae"), ".4f"),
            (("speed", "ratio"), ".1f"),
        ),
        "infonet-v2",
    ),
)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def headline_table() -> str:
    """The headline figures, each read from its result file, with the date, commit and machine it records."""
    rows = ["| what | model | measured | date | commit | machine | command → result |", "|---|---|---|---|---|---|---|"]
    for h in HEADLINES:
        r, link = record(h.stem), f"[{h.stem}.md](bench/results/{h.stem}.md)"
        cells = (h.what, h.model, h.measured(), r.date, f"`{r.commit}`", r.machine, f"`{h.command}` → {link}")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def results_table() -> str:
    """Every result file: its title, date, commit and machine."""
    rows = ["| result | what | date | commit | machine |", "|---|---|---|---|---|"]
    for path in sorted(RESULTS.glob("*.md")):
        title = next((line.lstrip("#").strip() for line in path.read_text().splitlines() if line.startswith("#")), "")
        r = record(path.stem)
        link = f"[{path.name}](bench/results/{path.name})"
        rows.append(f"| {link} | {_cell(_inline(title))} | {r.date} | `{r.commit}` | {r.machine} |")
    return "\n".join(rows) + "\n"


# -- MkDocs hooks ------------------------------------------------------------------------------------------------
def on_files(files: Any, config: Any) -> Any:
    """Mount the model card, the bench README and bench/results/ at their repository paths."""
    from mkdocs.structure.files import File

    results = [p.relative_to(REPO).as_posix() for p in sorted(RESULTS.iterdir()) if p.suffix in (".md", ".png")]
    paths = [*MOUNTED, *results]
    for rel in paths:
        files.append(File(rel, str(REPO), config["site_dir"], config["use_directory_urls"]))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Expand the generation markers; links out of docs/ to mounted files lose their ``../``, and mounted files'
    links into docs/ lose their ``docs/``."""
    if page.file.src_uri.startswith(("models/", "bench/", "training/")):
        return re.sub(r"\]\(((?:\.\./)+)docs/", r"](\1", markdown)
    markdown = expand(markdown)
    return re.sub(r"\]\(\.\./((?:models|bench)/[^)]*)\)", r"](\1)", markdown)


def main(argv: list[str] | None = None) -> int:
    """Write each docs/ page's generated blocks (``--check``: list the pages out of date, exit 1 if any)."""
    import sys

    sys.path.insert(0, str(REPO))  # this checkout's package, whatever else is installed
    check = "--check" in (sys.argv[1:] if argv is None else argv)
    stale = []
    for page in sorted((REPO / "docs").glob("*.md")):
        text = page.read_text()
        if (new := refresh(text)) != text:
            stale.append(page.relative_to(REPO).as_posix())
            if not check:
                page.write_text(new)
    print(("out of date: " if check else "written: ") + (", ".join(stale) or "none"))
    return 1 if check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
