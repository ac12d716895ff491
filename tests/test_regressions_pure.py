"""``service/regressions`` is pure rules over plain data: none of its modules imports the database layer, the
job lifecycle or a surface (every import statement, those inside functions and under TYPE_CHECKING too)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BANNED = ("sqlalchemy", "service.db", "service.orchestration", "service.github", "service.api", "service.cli",
          "service.dashboard")


def imported(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted name) of every module and name imported anywhere in ``tree``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out += [(node.lineno, node.module), *((node.lineno, f"{node.module}.{a.name}") for a in node.names)]
    return out


def banned_imports(root: Path, folder: str = "service/regressions") -> list[str]:
    """``path:line: name`` of each import under ``root/folder`` of a module in BANNED (or below one)."""
    return [f"{p.relative_to(root)}:{line}: {name}" for p in sorted((root / folder).rglob("*.py"))
            for line, name in imported(ast.parse(p.read_text(), str(p)))
            if any(name == b or name.startswith(b + ".") for b in BANNED)]


def test_regressions_imports_no_store_no_lifecycle_no_surface() -> None:
    assert banned_imports(ROOT) == []


def test_the_scan_sees_imports_inside_functions(tmp_path: Path) -> None:
    pkg = tmp_path / "service" / "regressions"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text("def f():\n    from service import db\n    import sqlalchemy as sa\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from service.orchestration.jobs import x\n")
    assert banned_imports(tmp_path) == ["service/regressions/a.py:2: service.db", "service/regressions/a.py:3: sqlalchemy",
                   "service/regressions/b.py:3: service.orchestration.jobs",
                   "service/regressions/b.py:3: service.orchestration.jobs.x"]
