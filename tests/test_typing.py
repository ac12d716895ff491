"""``Any`` only where a value is arbitrary JSON, and the type checker covers all of ``service/``.

Reads the source of truth: every ``service/**/*.py`` file's syntax tree (each ``Any``, written bare or as
``typing.Any``) and ``pyproject.toml``'s ``[tool.mypy]`` (what ``python3 dev.py typecheck`` checks).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVICE = ROOT / "service"
#: the module that names arbitrary JSON (JsonValue, JsonObject, JsonList): the only one allowed ``Any``
JSON_TYPES = SERVICE / "json_types.py"


def any_uses(source: str) -> list[int]:
    """Lines of ``source`` that name ``Any`` (a bare name, ``typing.Any`` or ``t.Any``)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and node.id == "Any":
            lines.append(node.lineno)
        elif isinstance(node, ast.Attribute) and node.attr == "Any":
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and any(a.name == "Any" for a in node.names):
            lines.append(node.lineno)
    return sorted(set(lines))


def test_any_is_written_only_in_the_json_types_module() -> None:
    found = [f"{p.relative_to(ROOT)}:{line}" for p in sorted(SERVICE.rglob("*.py")) if p != JSON_TYPES
             for line in any_uses(p.read_text())]
    assert found == [], "Any outside service/json_types.py (use JsonObject/JsonValue for JSON, else a type): " \
        + ", ".join(found[:40])


def test_the_check_finds_every_spelling() -> None:
    src = "from typing import Any\nimport typing\nx: typing.Any\ndef f(a: 'int') -> Any: ...\n"
    assert any_uses(src) == [1, 3, 4]
    assert any_uses("from typing import Mapping\nAnyway = 1\n") == []


def test_mypy_checks_all_of_service_strictly_without_explicit_any() -> None:
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert "service" in conf["files"], conf["files"]
    assert conf["strict"] is True and conf["disallow_any_explicit"] is True
    exempt = [o for o in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"].get("overrides", [])
              if o.get("disallow_any_explicit") is False]
    assert [o["module"] for o in exempt] == [["service.json_types"]]
