"""The package's import graph keeps data moving one way (transports in -> engine -> outputs, estimation below
the engine, the faces above): the stages are subpackages in a fixed order and no module imports from a later
stage; there are no cycles; at most 12 modules sit at the top; no module grows past what one sitting can read.

Every import counts: at module level, inside functions and under ``if TYPE_CHECKING:`` (a type-only import is
still a dependency a reader must follow).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "streamcorr"
MAX_LINES = 460  # "a few hundred lines"
MAX_TOP_MODULES = 12
# each stage may import from itself and the stages before it; "" is the top level (errors, config, ...)
STAGES = ("", "estimate", "compute", "engine", "transport", "ingest", "publish", "offline", "daemon", "demo", "cli")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Package modules that ``path`` imports anywhere (module level, inside functions, type-only)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def resolve(target: str) -> None:
        while target and target not in modules:  # "streamcorr.engine.matrix.Snapshot" -> "streamcorr.engine.matrix"
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.startswith("streamcorr"):
                        resolve(alias.name)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - (child.level - 1)]
                    stem = ".".join([*base, child.module] if child.module else base)
                else:
                    stem = child.module or ""
                if stem.startswith("streamcorr"):
                    for alias in child.names:
                        resolve(f"{stem}.{alias.name}")
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def _graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    return {_module_name(p): _imports(p, modules) for p in paths}


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, stack = set(), [start]
    while stack:
        for nxt in graph[stack.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def _is(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _stage(module: str) -> int:
    if module == "streamcorr.__main__":  # `python -m streamcorr`: the command line
        return STAGES.index("cli")
    parts = module.split(".")
    return STAGES.index(parts[1]) if len(parts) > 2 or (len(parts) == 2 and parts[1] in STAGES) else 0


def test_the_stages_are_the_subpackages():
    """Every subpackage of streamcorr is a stage of the order (a new one must be placed in it)."""
    found = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert found == set(STAGES) - {""}


def test_the_tests_mirror_the_package():
    """A test module lives in the folder of the stage it tests (tests/engine/ for streamcorr/engine/), or at the
    top when it checks the repository as a whole; bench/ and training/ have their own folders."""
    tests = Path(__file__).resolve().parent
    folders = {p.parent.name for p in tests.glob("*/test_*.py")}
    assert folders <= (set(STAGES) - {""}) | {"bench", "training"}, sorted(folders)
    assert not list(tests.glob("*/*/test_*.py")), "one folder level per stage"


def test_nothing_imports_from_a_later_stage():
    """Data moves one way: no module imports from a stage after its own (the package's lazy public API, which
    names every stage, is the one exception)."""
    bad = sorted(
        f"{m} -> {d}" for m, deps in _graph().items() if m != "streamcorr" for d in deps if _stage(d) > _stage(m)
    )
    assert not bad, f"imports from a later stage: {bad}"


def test_at_most_twelve_modules_at_the_top():
    """The top of the package holds the shared basics only; everything else lives in its stage."""
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, top


@pytest.mark.parametrize("statement", ["import streamcorr", "from streamcorr import Subscriber"])
def test_the_public_api_loads_no_torch(statement):
    """Importing the package or its Subscriber starts neither torch nor numba."""
    code = f"import sys; {statement}; print('torch' in sys.modules, 'numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_the_import_graph_has_no_cycles():
    """No module reaches itself through its imports, type-only ones included (Tarjan's strongly connected
    components)."""
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    assert not cycles, f"import cycles: {cycles}"


@pytest.mark.parametrize(
    "core", ["streamcorr.engine.core", "streamcorr.engine.matrix", "streamcorr.engine.changes", "streamcorr.config"]
)
def test_the_core_reaches_nothing_on_the_output_side(core):
    """The engine (and the state and settings it is built from) never imports an output, the daemon or the CLI."""
    downstream = ("streamcorr.publish", "streamcorr.daemon", "streamcorr.cli", "streamcorr.demo", "streamcorr.offline",
                  "streamcorr.ingest", "streamcorr.transport")  # fmt: skip
    bad = sorted(m for m in _reach(_graph(), core) if _is(m, *downstream))
    assert not bad, f"{core} reaches {bad}"


def test_outputs_import_nothing_from_ingest():
    """Outputs share transport plumbing with sources through streamcorr.transport, never through ingest."""
    graph = _graph()
    bad = {m: sorted(d for d in deps if _is(d, "streamcorr.ingest")) for m, deps in graph.items()}
    bad = {m: d for m, d in bad.items() if d and _is(m, "streamcorr.publish")}
    assert not bad, f"outputs importing ingest: {bad}"


def test_ingest_imports_nothing_from_outputs():
    """Sources never reach into outputs either."""
    graph = _graph()
    bad = {m: sorted(d for d in deps if _is(d, "streamcorr.publish")) for m, deps in graph.items()}
    bad = {m: d for m, d in bad.items() if d and _is(m, "streamcorr.ingest", "streamcorr.transport")}
    assert not bad, f"ingest importing outputs: {bad}"


def test_no_module_is_longer_than_one_sitting():
    """Each package module stays small enough to read in one sitting."""
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_the_architecture_page_names_every_module():
    """docs/architecture.md names every package module (its module table is generated from the package when the
    site is built), and every module its data path names by hand exists."""
    from tests.helpers import hooks

    gen = hooks()
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    prose = page.split("<!-- generate: modules -->", 1)[0]
    named = {n for n in re.findall(r"`(?:streamcorr/)?([\w/]+\.py)", prose) if not n.startswith("tests/")}
    names = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    for short in named:  # "transport/zmq.py" or "buffers.py" name the package's module of that path
        found = [n for n in names if n == short or n.endswith("/" + short)]
        assert found, f"the data path names {short}, which is not a module of the package"
    table = gen.expand(page).split("## Every module", 1)[1]
    listed = set(re.findall(r"^\| `(streamcorr/[\w/]+\.py)` \|", table, flags=re.M))
    assert listed == {p.relative_to(PACKAGE.parent).as_posix() for p in PACKAGE.rglob("*.py")}
