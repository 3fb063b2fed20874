"""The documentation: the MkDocs site builds with ``--strict`` (no broken link, anchor or generation marker),
the README stays a front page, the generated pages cover what they claim to, and no user-facing document
tells the story of how the project was built (results state what was measured, on what, when, at which
commit).

The code blocks of these pages are run by tests/test_examples_readme.py.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import typing
from types import ModuleType

import numpy as np
import pytest

from tests.helpers import README, REPO, USER_DOCS, hooks

# Words that narrate how the project got here rather than state what it is; each a regex, case-insensitive.
HISTORY = [
    r"\bsessions?\b",
    r"\brounds? \d+",
    r"\bearlier (?:run|session|version|result|code|model)s?\b",
    r"\bprevious (?:run|session|version|result|round)s?\b",
    r"\bthis (?:session|round)\b",
    r"\bwe (?:fixed|changed|added|tried|made|switched|replaced)\b",
    r"\b(?:before|after) (?:this|the) (?:change|fix|redesign|rewrite)\b",
    r"\bused to be\b",
    r"\bthe default then\b",
    r"\bat the time\b",
    r"\bthis (?:2-core )?machine\b",
    r"\bsince (?:commit|version|v\d)",
    r"\bwas (?:slower|faster)\b",
]


def test_the_site_builds_strictly(tmp_path):
    """`mkdocs build --strict` succeeds: every page, link, anchor, mounted file and generation marker resolves.
    Skipped where MkDocs is not installed, except under CI=true, where a missing MkDocs fails."""
    np.random.default_rng(80)  # nothing random here; seeded by convention
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        if os.environ.get("CI") == "true":
            pytest.fail('MkDocs Material is missing: pip install -e ".[dev]"')
        pytest.skip('MkDocs Material is not installed (pip install -e ".[dev]")')
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    for page in ("configuration", "wire-format", "architecture", "performance", "models", "bench/results/replay.md"):
        path = tmp_path / "site" / page
        assert path.exists() or path.with_suffix("").exists(), page


def test_the_readme_is_a_front_page():
    """README.md is at most 300 lines and every docs/ page it links to exists."""
    np.random.default_rng(81)  # nothing random here; seeded by convention
    text = README.read_text()
    assert len(text.splitlines()) <= 300, len(text.splitlines())
    links = re.findall(r"\]\((docs/[^)#]+)", text)
    assert links, "the README links into docs/"
    assert [link for link in links if not (REPO / link).exists()] == []


def test_no_user_facing_document_tells_history():
    """README.md, docs/ (with its generated text), models/README.md and bench/README.md state results, not the
    story of how they came about: none of the history patterns occurs."""
    np.random.default_rng(82)  # nothing random here; seeded by convention
    gen = hooks()
    found = []
    for path in USER_DOCS:
        text = path.read_text()
        if path.parent.name == "docs":
            text = gen.expand(text)
        for pattern in HISTORY:
            for m in re.finditer(pattern, text, flags=re.I):
                line = text[: m.start()].count("\n") + 1
                found.append(f"{path.relative_to(REPO)}:{line}: {m.group(0)!r}")
    assert found == [], "history in user-facing documents:\n" + "\n".join(found)


def test_generated_blocks_in_the_docs_pages_are_current():
    """Each docs/ page holds its generated text (configuration reference, wire format, results tables) as the build
    makes it, so the Markdown reads whole in the repository; `python docs/hooks.py` rewrites the stale ones."""
    np.random.default_rng(84)  # nothing random here; seeded by convention
    gen = hooks()
    pages = sorted((REPO / "docs").glob("*.md"))
    assert sum(gen.END in p.read_text() for p in pages) >= 6
    stale = [p.name for p in pages if gen.refresh(p.read_text()) != p.read_text()]
    assert stale == [], f"generated text out of date in {stale}: run `python docs/hooks.py`"


def test_the_history_check_catches_a_narrative():
    """The patterns catch the narratives they exist for."""
    np.random.default_rng(83)  # nothing random here; seeded by convention
    for sentence in ("measured in session 7", "round 15 ships", "an earlier run was slower", "we fixed it"):
        assert any(re.search(p, sentence, flags=re.I) for p in HISTORY), sentence


def _leaf_keys(model: typing.Any, prefix: str) -> set[str]:
    keys = set()
    for name, info in model.model_fields.items():
        path = f"{prefix}.{name}" if prefix else name
        models = [a for a in (typing.get_args(info.annotation) or (info.annotation,)) if hasattr(a, "model_fields")]
        keys.add(path)
        for sub in models if name != "sources" else []:
            keys |= _leaf_keys(sub, path)
    return keys


def test_the_configuration_reference_has_every_key():
    """The generated reference lists every key of the schema, sources' keys under `sources[]`, each with a
    type, a default and a meaning (the comment beside the key in streamcorr/config.py: a new key needs one),
    and its defaults are the schema's."""
    from streamcorr import config

    np.random.default_rng(84)  # nothing random here; seeded by convention
    reference = hooks().config_reference()
    keys = _leaf_keys(config.Config, "")
    for source in typing.get_args(typing.get_args(config.Source)[0]):
        keys |= _leaf_keys(source, "sources[]")
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([^`]+)` \|.*$", reference, flags=re.M)}
    assert sorted(keys - set(rows)) == []
    unexplained = [key for key, row in rows.items() if row.rstrip().endswith("|  |")]
    assert unexplained == [], f"write a comment beside these keys in streamcorr/config.py: {unexplained}"
    assert "| `window.samples` | int | `1024` | ≥ 32" in rows["window.samples"]
    assert "8 MiB" in rows["outputs.zmq.max_queue_bytes"]


def test_the_comment_beside_a_key_is_its_description():
    """Comments are read from the source: the lines right above a field and those on its own lines."""
    np.random.default_rng(85)  # nothing random here; seeded by convention
    module = ModuleType("example")
    source = "class A:\n    # above\n    # more\n    x: int = 1  # beside\n\n    # not mine\n\n    y: int = 2\n"
    exec(compile(source, "<example>", "exec"), module.__dict__)
    gen = hooks()
    import inspect

    original = inspect.getsource
    try:
        inspect.getsource = lambda obj: source  # type: ignore[assignment]
        assert gen.field_comments(module) == {("A", "x"): "above more beside"}
    finally:
        inspect.getsource = original


def test_every_result_file_records_when_where_and_at_which_commit():
    """Every bench/results/*.md ends with its record (commit, machine, date), which the performance tables
    show beside each figure; every headline figure reads from its result."""
    np.random.default_rng(86)  # nothing random here; seeded by convention
    gen = hooks()
    for path in sorted((REPO / "bench" / "results").glob("*.md")):
        record = gen.record(path.stem)
        assert re.fullmatch(r"[0-9a-f]{7,}(-dirty)?", record.commit) and record.machine and record.date, path.name
    table = gen.headline_table()
    assert table.count("\n") == len(gen.HEADLINES) + 2


def test_the_readme_headline_figures_are_their_results():
    """Each result the README's headline figures cite is named with the date and commit its file records, and
    every number of its row appears in that file."""
    np.random.default_rng(87)  # nothing random here; seeded by convention
    gen = hooks()
    section = README.read_text().split("## Headline figures", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|") and "](bench/results/" in line]
    assert len(rows) == 4, rows
    for row in rows:
        stem = re.search(r"bench/results/([\w.-]+)\.md", row).group(1)
        record = gen.record(stem)
        assert f"`{record.commit}`" in row and record.date in row, (row, record)
        text = (REPO / "bench" / "results" / f"{stem}.md").read_text().replace(",", "")
        figures = re.sub(r"\(.*?\)|`[^`]*`|\d{4}-\d\d-\d\d", "", row.split("|")[2])
        for number in re.findall(r"\d[\d,]*\.?\d*", figures):
            assert number.replace(",", "") in text, (stem, number)


def test_ci_runs_the_readme_test_command():
    """The README's two commands are the demo and the test command, and .ci/run runs the test command verbatim."""
    np.random.default_rng(88)  # nothing random here; seeded by convention
    blocks = re.findall(r"^```bash\n(.*?)^```", README.read_text(), flags=re.S | re.M)
    demo, test = blocks[0].strip(), blocks[1].strip()
    assert demo.endswith("streamcorr demo") and test.endswith("pytest -q -n 2"), (demo, test)
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert test in ci, ".ci/run must run the README's test command verbatim"
