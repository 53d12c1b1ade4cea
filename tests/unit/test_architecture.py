"""The layout holds: each folder imports only what the table of docs/architecture.md allows, the pure parts
import no I/O, no module imports itself back, private names stay home, each constant is defined once, and
the wiring stays in small functions.

The data flow is one folder per box (docs/architecture.md): `logs/` → `model/` → `metrics/` → `web/`, with
`sources/` read at scrape time, `guard/` in the request path and `diagnose/` reading whole logs.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest
from paths import REPO

ROOT = REPO
PACKAGE = ROOT / "exporter"

# What a pure module may not reach, directly or through the exporter modules it imports: the network, the
# web and exposition libraries, the clock, the filesystem, processes and threads.
IMPURE = frozenset(
    {
        "aiohttp",
        "asyncio",
        "datetime",
        "glob",
        "io",
        "logging",
        "os",
        "pathlib",
        "prometheus_client",
        "pynvml",
        "shutil",
        "socket",
        "subprocess",
        "tempfile",
        "threading",
        "time",
        "urllib",
        "watchdog",
    }
)
IMPURE_CALLS = frozenset({"open", "print", "input"})
# The parts that claim to be pure in their docstrings.
PURE = (
    "exporter.model",
    "exporter.status",
    "exporter.logs.events",
    "exporter.logs.batch",
    "exporter.logs.parse",
    "exporter.logs.rules",
    "exporter.logs.router_split",
    "exporter.guard.admission",
    "exporter.guard.preempt",
    "exporter.guard.sizing",
)
# The wiring: the package's top level (entry point, build, serve, settings).
WIRING_MAX_LINES = 60
MODULE_MAX_LINES = 600


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def _type_checking_only(tree: ast.Module) -> set[int]:
    """Line numbers of imports under `if TYPE_CHECKING:` (annotations only: no import at run time)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for inner in node.body:
                lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
    return lines


def imports(name: str, *, typing: bool = False) -> set[str]:
    """Modules `name` imports anywhere in its body (functions included), as dotted names."""
    tree = TREES[name]
    skip = set() if typing else _type_checking_only(tree)
    out: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES)
    return out


def internal(name: str, *, typing: bool = False) -> set[str]:
    return {m for m in imports(name, typing=typing) if m in MODULES and m != name and m != "exporter"}


def reach(start: str) -> set[str]:
    """Every exporter module `start` imports at run time, transitively (itself included)."""
    seen, todo = {start}, [start]
    while todo:
        for m in internal(todo.pop()):
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


# Who may import whom: importer folder → what it may import (a folder, or one module of a folder), run-time
# and TYPE_CHECKING imports alike. docs/architecture.md shows the same table (compared below). The top level
# (`exporter/*.py`) may import anything; every folder may import the top level's leaves (below).
ALLOWED: dict[str, frozenset[str]] = {
    "logs": frozenset({"logs"}),
    "model": frozenset({"model", "logs.events", "logs.event_class"}),
    "sources": frozenset({"sources", "model"}),
    "metrics": frozenset({"metrics", "model", "logs.events"}),
    "web": frozenset({"web"}),
    "guard": frozenset({"guard", "model", "metrics.catalogue", "web"}),
    "diagnose": frozenset({"diagnose", "logs", "model"}),
    "status": frozenset({"status", "model"}),
}
ARCHITECTURE_PAGE = ROOT / "docs" / "architecture.md"


def box(module: str) -> str | None:
    """The folder a module lives in (`logs`, `model`, …), or None for the top level (`exporter/*.py`)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else None


def import_targets(name: str) -> set[str]:
    """The exporter modules `name` imports, at run time or for annotations: `from a import b` is `a.b` where
    that is a module, else `a`."""
    out: set[str] = set()
    for node in ast.walk(TREES[name]):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in MODULES)
        elif isinstance(node, ast.ImportFrom) and node.module in MODULES and node.level == 0:
            for a in node.names:
                out.add(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module)
    out.discard(name)
    return out


def top_level_leaves() -> set[str]:
    """The top level's modules that reach no folder but the pure model (the version, `loops`, the settings,
    which build on the model's constants): any folder may use them without reaching the wiring."""
    top = {m for m in MODULES if box(m) is None}
    return {m for m in top if all(box(r) in (None, "model") for r in reach(m))}


def allowed(importer: str, imported: str, leaves: set[str]) -> bool:
    source, target = box(importer), box(imported)
    if source is None or target == source:
        return True
    if target is None:
        return imported in leaves
    short = imported.removeprefix("exporter.")
    return any(short == a or short.startswith(a + ".") for a in ALLOWED[source])


def arrows_not_in_the_table() -> list[str]:
    leaves = top_level_leaves()
    return [f"{m} → {t}" for m in sorted(MODULES) for t in sorted(import_targets(m)) if not allowed(m, t, leaves)]


def test_every_import_arrow_is_in_the_table() -> None:
    """The folders import one another only as docs/architecture.md draws it (run-time and annotation imports)."""
    assert arrows_not_in_the_table() == []


def page_table() -> dict[str, frozenset[str]]:
    """The table under "Who imports whom" in docs/architecture.md: importer → what it may import."""
    text = ARCHITECTURE_PAGE.read_text()
    assert "## Who imports whom" in text, f"{ARCHITECTURE_PAGE} shows no table of the imports"
    section = text.split("## Who imports whom", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, frozenset[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not cells[0].startswith("`"):
            continue
        importer = cells[0].strip("`").removesuffix("/")
        rows[importer] = frozenset(c.strip().strip("`").removesuffix("/") for c in cells[1].split(","))
    return rows


def test_the_metric_catalogue_is_a_leaf_over_the_model() -> None:
    """The guard renders its families from the catalogue: it reaches nothing of the collectors, only the model."""
    assert {box(m) for m in reach("exporter.metrics.catalogue") if not m.startswith("exporter.metrics.catalogue")} <= {
        "model",
        "logs",
    }
    assert not {
        m for m in reach("exporter.metrics.catalogue") if m.startswith("exporter.logs.") and not _event_types(m)
    }


def test_the_page_shows_the_tested_table() -> None:
    assert page_table() == ALLOWED


def test_the_page_names_the_pure_parts_the_test_checks() -> None:
    """The rule "the model is pure" names the same modules as PURE."""
    rule = ARCHITECTURE_PAGE.read_text().split("- **The model is pure.**", 1)[1].split(") reaches", 1)[0]
    paths = [p.removeprefix("exporter/").removesuffix(".py").removesuffix("/") for p in re.findall(r"`([^`]+)`", rule)]
    named = {"exporter." + p.replace("/", ".") for p in paths}
    assert named == set(PURE)


def test_the_page_names_every_module() -> None:
    """Every module of the package is on the page: by its path, by its folder's package (`logs/events/`), or by
    its name in its folder's row of "Where things are" (`guard/`: `sizing`, `admission`, …)."""
    page = ARCHITECTURE_PAGE.read_text()
    rows = [line for line in page.splitlines() if line.startswith("| `")]
    unnamed = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.name == "__init__.py" and len(rel.parts) <= 2:
            continue  # a folder's own package: the folder is what the page names
        named = f"`{rel.as_posix()}`" in page or (len(rel.parts) == 1 and f"`{rel.name}`" in page)
        named = named or (len(rel.parts) >= 3 and f"`{rel.parent.as_posix()}/`" in page)
        named = named or any(
            f"`{rel.parts[0]}/" in row and (f"`{rel.stem}`" in row or f"`{rel.name}`" in row) for row in rows
        )
        if not named:
            unnamed.append(rel.as_posix())
    assert unnamed == []


def test_the_page_names_the_top_level_leaves_the_folders_use() -> None:
    text = ARCHITECTURE_PAGE.read_text().split("## Who imports whom", 1)[1].split("\n## ", 1)[0]
    named = {t for m in MODULES if box(m) is not None for t in import_targets(m) if box(t) is None}
    named.discard("exporter")  # the version, in exporter/__init__.py
    missing = [m for m in sorted(named) if f"`{m.removeprefix('exporter.')}.py`" not in text]
    assert missing == []


def pure_modules() -> list[str]:
    return [m for m in MODULES if any(m == p or m.startswith(p + ".") for p in PURE)]


@pytest.mark.parametrize("name", pure_modules())
def test_the_pure_parts_import_no_io_nor_the_clock(name: str) -> None:
    for m in sorted(reach(name)):
        roots = {i.split(".")[0] for i in imports(m)}
        assert not roots & IMPURE, f"{name} reaches {m}, which imports {sorted(roots & IMPURE)}"
        calls = {
            n.func.id
            for n in ast.walk(TREES[m])
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in IMPURE_CALLS
        }
        assert not calls, f"{name} reaches {m}, which calls {sorted(calls)}"


def test_the_model_sits_below_metrics_web_sources_and_wiring() -> None:
    above = ("exporter.metrics", "exporter.web", "exporter.sources", "exporter.guard", "exporter.diagnose")
    for name in MODULES:
        if name.startswith("exporter.model"):
            bad = {m for m in internal(name, typing=True) if m.startswith(above)}
            assert not bad, f"{name} imports {sorted(bad)}: the model must not depend on the boxes after it"


# What the model may take from logs/: the event types (and how an event class is made); `exporter.logs` is
# the package itself, which `from exporter.logs import events` names.
MODEL_FROM_LOGS = frozenset({"exporter.logs", "exporter.logs.events", "exporter.logs.event_class"})


def _event_types(module: str) -> bool:
    """One of MODEL_FROM_LOGS, or a module of the events package (one per family of events)."""
    return module in MODEL_FROM_LOGS or module.startswith("exporter.logs.events.")


def test_logs_imports_no_model_and_the_model_only_the_event_types_from_logs() -> None:
    """lines → parse → events (logs/) → apply → ServerState (model/): the arrow between them points one way,
    and what crosses it is events. The router split and the parse are logs'; wiring them to a state is the
    top level's (`exporter/pipeline.py`). Annotations count too."""
    wrong = sorted(
        f"{name} imports {m}"
        for name in MODULES
        for m in internal(name, typing=True)
        if (name.startswith("exporter.logs") and m.startswith("exporter.model"))
        or (name.startswith("exporter.model") and m.startswith("exporter.logs") and not _event_types(m))
    )
    assert wrong == []


def _cycles(typing: bool) -> list[list[str]]:
    graph = {m: internal(m, typing=typing) for m in MODULES}
    cycles: list[list[str]] = []
    state: dict[str, int] = defaultdict(int)  # 0 new, 1 on the path, 2 done
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            # A package's __init__ importing its own submodules is how a package re-exports: not a cycle.
            if m != "exporter" and n.startswith(m + "."):
                continue
            if state[n] == 1:
                cycles.append([*path[path.index(n) :], n])
            elif state[n] == 0:
                visit(n)
        path.pop()
        state[m] = 2

    for m in sorted(MODULES):
        if state[m] == 0:
            visit(m)
    return cycles


def test_no_import_cycle() -> None:
    """No module imports, at run time, a module that imports it back (what `python -X importtime` would show
    as a partly initialised module). A name needed for an annotation only may come in under TYPE_CHECKING."""
    assert _cycles(typing=False) == []


def test_no_private_name_is_used_outside_its_module() -> None:
    """Neither imported (`from exporter.x import _name`) nor reached through a module (`x._name`)."""
    offenders = []
    for path in [*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]:
        tree = ast.parse(path.read_text())
        modules: set[str] = set()  # local names bound to exporter modules
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("exporter"):
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        offenders.append(f"{path.relative_to(ROOT)}: {node.module}.{a.name}")
                    if f"{node.module}.{a.name}" in MODULES:
                        modules.add(a.asname or a.name)
            elif isinstance(node, ast.Import):
                modules.update(a.asname for a in node.names if a.asname and a.name in MODULES)
        offenders += [
            f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ]
    assert offenders == []


def test_each_constant_is_defined_once() -> None:
    """The same constant (an upper-case module name bound to the same computed value) lives in one module."""
    seen: dict[str, list[str]] = defaultdict(list)
    for name, tree in TREES.items():
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id.lstrip("_").isupper()
                and isinstance(node.value, (ast.BinOp, ast.Call))
                and not (isinstance(node.value, ast.Call) and getattr(node.value.func, "id", "") == "TypeVar")
            ):
                constant = node.targets[0].id
                value = ast.dump(node.value)
                # One name, one value: MIB defined twice. One pattern under two names: a regex kept twice.
                seen[f"{constant.lstrip('_')} = {value}"].append(f"{name}.{constant}")
                if "re', ctx=Load()), attr='compile'" in value:
                    seen[value].append(f"{name}.{constant}")
    twice = [where for where in seen.values() if len(where) > 1]
    assert twice == []


def test_modules_and_wiring_functions_stay_readable() -> None:
    long_modules = [
        f"{m}: {len(p.read_text().splitlines())}"
        for m, p in MODULES.items()
        if len(p.read_text().splitlines()) > MODULE_MAX_LINES
    ]
    assert long_modules == []
    wiring = [m for m in MODULES if m.count(".") == 1]
    long_functions = [
        f"{m}.{n.name}: {(n.end_lineno or n.lineno) - n.lineno + 1} lines"
        for m in wiring
        for n in ast.walk(TREES[m])
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        and (n.end_lineno or n.lineno) - n.lineno + 1 > WIRING_MAX_LINES
    ]
    assert long_functions == []
