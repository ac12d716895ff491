"""Layers import downward and modules import in no circle.

* ``amp_pass`` imports no celery/sqlalchemy/onnxruntime/fastapi/redis; ``service`` no onnxruntime
  (checked by importing every module in a fresh interpreter);
* from the source's own import statements (module level, inside functions and under
  ``TYPE_CHECKING`` alike): the only allowed direction between the project's packages is
  ``service -> workers -> amp_pass`` (and ``migrations -> service.db``), and no two modules reach
  each other through imports (no cycle at module level, a package's ``__init__`` counting as a
  module);
* inside ``service``, the folders are floors: each imports only the floors below it, as the one
  table :data:`SERVICE_FLOORS` says (the root modules ``service/*.py`` are the bottom floor), and
  the floors' own import graph has no cycle;
* ``sqlalchemy`` is imported (by any import statement, at any depth) only under ``service/db/`` and
  ``migrations/``: every other floor reaches the database through ``service.db``.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("amp_pass", "workers", "service", "migrations")
#: package -> the project packages it may import (besides itself)
ALLOWED: dict[str, frozenset[str]] = {
    "amp_pass": frozenset(),
    "workers": frozenset({"amp_pass"}),
    "service": frozenset({"workers", "amp_pass"}),
    "migrations": frozenset({"service.db"}),
}


#: The floors of ``service/``, bottom to top: floor -> the floors it may import (besides itself).  A sub-folder of
#: ``service/`` is a floor; ``service`` stands for the root modules (``errors``, ``settings``, ``vocabulary``,
#: ``run_meta``), which import only each other (and ``workers``/``amp_pass``, as :data:`ALLOWED` says).
ROOT_FLOOR = "service"
SERVICE_FLOORS: dict[str, frozenset[str]] = {
    ROOT_FLOOR: frozenset(),
    "regressions": frozenset({ROOT_FLOOR}),
    "github_auth": frozenset({ROOT_FLOOR}),
    "db": frozenset({ROOT_FLOOR, "regressions"}),
    "orchestration": frozenset({ROOT_FLOOR, "regressions", "db", "github_auth"}),
    "github": frozenset({ROOT_FLOOR, "regressions", "github_auth", "db", "orchestration"}),
    "web": frozenset({ROOT_FLOOR, "db"}),
    "dashboard": frozenset({ROOT_FLOOR, "regressions", "db", "orchestration", "github", "web"}),
    "api": frozenset({ROOT_FLOOR, "regressions", "github_auth", "db", "orchestration", "github", "web",
                      "dashboard"}),
    "cli": frozenset({ROOT_FLOOR, "regressions", "github_auth", "db", "orchestration", "github", "web",
                      "dashboard", "api"}),
}
#: The floors of ``workers/``, bottom to top, as :data:`SERVICE_FLOORS` is for ``service/``: ``workers`` stands for
#: the root modules (``result``, ``infra``, ``redact``, ``timing``, ``tolerance``: what a job returns and whose failure
#: it is); ``sandbox`` is the sandbox and its zygotes; ``zoo`` the models; ``measure`` onnxruntime sessions, faithful
#: emulation, latency, references, convergence and metrics; ``revision`` the pass at a revision (its tree, its
#: sandboxed conversion, the canary); ``jobs`` the job that composes them.
WORKERS_FLOORS: dict[str, frozenset[str]] = {
    "workers": frozenset(),
    "sandbox": frozenset({"workers"}),
    "zoo": frozenset({"workers"}),
    "measure": frozenset({"workers", "zoo"}),
    "revision": frozenset({"workers", "sandbox", "zoo", "measure"}),
    "jobs": frozenset({"workers", "sandbox", "zoo", "measure", "revision"}),
}
#: package -> its floor table (the root floor is named as the package).
FLOOR_TABLES: dict[str, dict[str, frozenset[str]]] = {"service": SERVICE_FLOORS, "workers": WORKERS_FLOORS}
#: Largest module (lines) of a floored package.
MAX_MODULE_LINES = 400
#: Where ``sqlalchemy`` may be imported: path prefixes relative to the project root.
SQLALCHEMY_HOMES = ("service/db/", "migrations/")


def _modules(package: str) -> list[str]:
    pkg_dir = ROOT / package
    names = [package]
    for info in pkgutil.walk_packages([str(pkg_dir)], prefix=f"{package}."):
        names.append(info.name)
    return names


@pytest.mark.parametrize(
    ("package", "banned"),
    [
        ("amp_pass", ["celery", "sqlalchemy", "onnxruntime", "fastapi", "redis"]),
        ("service", ["onnxruntime"]),
    ],
)
def test_package_does_not_import_banned_layers(package: str, banned: list[str]) -> None:
    mods = _modules(package)
    assert len(mods) > 1, f"{package} has no modules"
    code = (
        "import importlib, sys\n"
        f"for m in {mods!r}:\n"
        "    importlib.import_module(m)\n"
        f"bad = sorted(b for b in {banned!r} if b in sys.modules)\n"
        "print(','.join(bad))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"{package} imports {proc.stdout.strip()}"


# -- the import graph, from the source ------------------------------------------------------------
def source_modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the project's packages under ``root``."""
    mods: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            mods[name] = path
    return mods


def _targets(module: str, path: Path, node: ast.Import | ast.ImportFrom, known: Mapping[str, Path]) -> Iterable[str]:
    """The project modules one import statement names (``from pkg import mod`` names ``pkg.mod``)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            base = module.split(".")
            keep = len(base) - node.level + (1 if path.name == "__init__.py" else 0)
            prefix = ".".join(base[:keep] + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        names = [f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in known else prefix for alias in node.names]
    for name in names:
        while name and name not in known:  # `import a.b.c` of a non-module attribute -> nearest module
            name = name.rpartition(".")[0]
        if name and name != module:
            yield name


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere in its source (every import statement)."""
    known = source_modules(root)
    graph: dict[str, set[str]] = {m: set() for m in known}
    for module, path in known.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                graph[module].update(_targets(module, path, node, known))
    return graph


def upward_imports(graph: Mapping[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs that cross packages against :data:`ALLOWED`."""
    bad = []
    for src, targets in graph.items():
        src_pkg = src.split(".")[0]
        for dst in targets:
            dst_pkg = dst.split(".")[0]
            if dst_pkg == src_pkg:
                continue
            if not any(dst == ok or dst.startswith(ok + ".") for ok in ALLOWED[src_pkg]):
                bad.append((src, dst))
    return sorted(bad)


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return sorted(found)


def test_imports_point_down_only() -> None:
    graph = import_graph(ROOT)
    assert len(graph) > 100, "the source scan found too few modules"
    assert upward_imports(graph) == []


def test_no_import_cycles() -> None:
    assert cycles(import_graph(ROOT)) == []


def _tree(tmp_path: Path, files: Mapping[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for package in PACKAGES:
        (tmp_path / package).mkdir(exist_ok=True)
        (tmp_path / package / "__init__.py").touch()
    return tmp_path


# -- the floors of service/ and workers/ ----------------------------------------------------------
def floors(root: Path, package: str = ROOT_FLOOR) -> dict[str, str]:
    """``package`` module -> its floor: the sub-folder of ``package/`` it lives in, or ``package`` itself for
    the root modules (``package/*.py``)."""
    out = {}
    for module, path in source_modules(root).items():
        parts = path.relative_to(root).parts
        if parts[0] == package:
            out[module] = parts[1] if len(parts) > 2 else package
    return out


def floor_graph(root: Path, package: str = ROOT_FLOOR) -> dict[str, dict[str, list[str]]]:
    """Floor -> floor it imports -> the module imports (``a -> b``) that make that edge, from every import
    statement of the source under ``root``."""
    floor = floors(root, package)
    edges: dict[str, dict[str, list[str]]] = {f: {} for f in set(floor.values())}
    for src, targets in import_graph(root).items():
        for dst in targets:
            if src in floor and dst in floor and floor[src] != floor[dst]:
                edges[floor[src]].setdefault(floor[dst], []).append(f"{src} -> {dst}")
    return edges


def floor_violations(edges: Mapping[str, Mapping[str, list[str]]],
                     table: Mapping[str, frozenset[str]] = SERVICE_FLOORS) -> list[str]:
    """Every module import that crosses floors against ``table`` (a floor it lacks included)."""
    bad = []
    for a, targets in sorted(edges.items()):
        allowed = table.get(a)
        for b, why in sorted(targets.items()):
            if allowed is None or b not in allowed:
                bad += [f"{a} -> {b}: {w}" for w in sorted(why)]
    return bad


def sqlalchemy_imports(root: Path) -> list[str]:
    """``path:line`` of every import statement naming ``sqlalchemy`` outside :data:`SQLALCHEMY_HOMES`."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith(SQLALCHEMY_HOMES):
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = [node.module or ""] if not node.level else []
                else:
                    continue
                if any(name == "sqlalchemy" or name.startswith("sqlalchemy.") for name in names):
                    found.append(f"{rel}:{node.lineno}")
    return found


@pytest.mark.parametrize("package", sorted(FLOOR_TABLES))
def test_the_floor_table_is_a_dag_and_names_every_folder(package: str) -> None:
    folders = {p.name for p in (ROOT / package).iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders | {package} == set(FLOOR_TABLES[package]), f"place every folder of {package}/ in its floor table"
    table = {a: set(b) for a, b in FLOOR_TABLES[package].items()}
    assert cycles(table) == [] and all(a not in b for a, b in table.items())


@pytest.mark.parametrize("package", sorted(FLOOR_TABLES))
def test_floors_import_downward_only(package: str) -> None:
    edges = floor_graph(ROOT, package)
    assert set(edges) == set(FLOOR_TABLES[package]), "the scan found other floors than the table's"
    bad = floor_violations(edges, FLOOR_TABLES[package])
    assert bad == [], f"imports against the floors of {package}/:\n" + "\n".join(bad)


@pytest.mark.parametrize("package", sorted(FLOOR_TABLES))
def test_floors_form_no_cycle(package: str) -> None:
    edges = floor_graph(ROOT, package)
    assert cycles({a: set(targets) for a, targets in edges.items()}) == []


@pytest.mark.parametrize("folder", ["workers", "service/db"])
def test_modules_fit_the_line_guideline(folder: str) -> None:
    """Every module of ``workers/`` and of ``service/db/`` is at most :data:`MAX_MODULE_LINES` lines."""
    long = {path.relative_to(ROOT).as_posix(): n for path in sorted((ROOT / folder).rglob("*.py"))
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_sqlalchemy_is_imported_only_by_the_database_layer() -> None:
    found = sqlalchemy_imports(ROOT)
    assert found == [], "sqlalchemy imported outside service/db/ and migrations/:\n" + "\n".join(found)


def test_the_floor_checks_catch_an_upward_import_a_cycle_and_sql(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "service/vocabulary.py": "",
        "service/db/__init__.py": "",
        "service/db/store.py": "import sqlalchemy as sa\nfrom service import vocabulary\n",
        "service/regressions/__init__.py": "",
        "service/regressions/rules.py": "def f():\n    from sqlalchemy.exc import DataError\n",
        "service/regressions/detect.py": "from service.db import store\n",
        "service/web/__init__.py": "",
        "service/web/auth.py": "from service.vocabulary import X\n",
        "service/dashboard/__init__.py": "",
        "service/dashboard/routes.py": "from service.web import auth\nfrom service.api import app\n",
        "service/api/__init__.py": "",
        "service/api/app.py": "from service.dashboard import routes\nfrom service.web.auth import check\n",
        "migrations/env.py": "import sqlalchemy\nfrom service.db import store\n",
    })
    edges = floor_graph(root)
    assert floor_violations(edges) == ["dashboard -> api: service.dashboard.routes -> service.api.app",
                                       "regressions -> db: service.regressions.detect -> service.db.store"]
    assert cycles({a: set(t) for a, t in edges.items()}) == [["api", "dashboard"]]
    assert sqlalchemy_imports(root) == ["service/regressions/rules.py:2"]


def test_the_checks_catch_an_upward_import_and_a_cycle(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "workers/jobs/job.py": "def f():\n    from service.settings import Settings\n",
        "service/settings.py": "import typing\nif typing.TYPE_CHECKING:\n    from service.a import X\n",
        "service/a.py": "from service import settings\n",
        "service/db/__init__.py": "",
        "service/db/models.py": "",
        "migrations/env.py": "from service.db import models\nfrom service import a\n",
        "amp_pass/x.py": "from . import y\n",
        "amp_pass/y.py": "from amp_pass.x import thing\n",
    })
    graph = import_graph(root)
    assert upward_imports(graph) == [("migrations.env", "service.a"), ("workers.jobs.job", "service.settings")]
    assert cycles(graph) == [["amp_pass.x", "amp_pass.y"], ["service.a", "service.settings"]]


def test_the_real_tree_had_the_problems_this_test_guards(tmp_path: Path) -> None:
    """Sanity of the scan on this tree: a copy with one worker module importing the service again
    and one module pair importing each other is caught (so the two tests above can fail)."""
    graph = import_graph(ROOT)
    graph["workers.jobs.cell"] = graph["workers.jobs.cell"] | {"service.settings"}
    graph["service.regressions.thresholds"] = graph["service.regressions.thresholds"] | {"service.db.store"}
    assert ("workers.jobs.cell", "service.settings") in upward_imports(graph)
    # the cycle found holds both (and what store imports on the way to thresholds: extract, regressions.stored, ...)
    assert any({"service.db.store", "service.regressions.thresholds"} <= set(c) for c in cycles(graph))


def test_amp_pass_public_names_load_lazily() -> None:
    """Every public name of ``amp_pass`` resolves, and a light submodule does not pull in the converter."""
    import amp_pass

    for name in amp_pass.__all__:
        assert getattr(amp_pass, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        amp_pass.nope  # noqa: B018
    code = "import sys, amp_pass.policy, amp_pass.errors; print('onnx_ir' in sys.modules or 'amp_pass.converter' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


def test_the_tests_mirror_the_workers_floors() -> None:
    """``tests/workers/<floor>/`` exists for every floor of :data:`WORKERS_FLOORS` but the root, and every folder
    of ``tests/workers/`` names a floor."""
    floors = {name for name in WORKERS_FLOORS if name != "workers"}
    test_dirs = {p.name for p in (ROOT / "tests" / "workers").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert test_dirs == floors, f"tests/workers/ folders {sorted(test_dirs)} against floors {sorted(floors)}"


def test_the_tests_mirror_the_service_floors() -> None:
    """``tests/service/<floor>/`` exists for every floor of :data:`SERVICE_FLOORS` that has modules, and every
    folder of ``tests/service/`` names a floor: a test of ``service/<floor>/x.py`` lives in
    ``tests/service/<floor>/``."""
    floors = {name for name in SERVICE_FLOORS if name != ROOT_FLOOR}
    test_dirs = {p.name for p in (ROOT / "tests" / "service").iterdir() if p.is_dir() and p.name != "__pycache__"}
    untested = floors - test_dirs
    assert not untested, f"floors without a tests/service/<floor>/ folder: {sorted(untested)}"
    assert test_dirs <= floors, f"tests/service/ folders that name no floor: {sorted(test_dirs - floors)}"
