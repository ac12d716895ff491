"""Where the shipped migrations are and which revision is their head, read without SQLAlchemy or Alembic.

:func:`head` reads the ``revision`` / ``down_revision`` lines of ``migrations/versions/*.py`` (a test holds it
equal to Alembic's own head: tests/service/cli/test_cli_imports.py), so a schema check -- the store's
(:mod:`service.db.migrate`) or the light read path's (:mod:`service.db.light`) -- imports neither.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"
VERSION_TABLE = "alembic_version"  # Alembic's default; migrations/env.py does not rename it
_REVISION_LINE = re.compile(r"^(revision|down_revision)\s*(?::[^=]*)?=\s*(.+?)\s*$", re.MULTILINE)


def script_location() -> str:
    """``migrations/`` next to the ``service`` package (source tree or installed side by side)."""
    if (MIGRATIONS_DIR / "env.py").is_file():
        return str(MIGRATIONS_DIR)
    # installed as a package (pyproject includes migrations*); located, not imported: migrations
    # import service.db, never the other way round
    spec = importlib.util.find_spec("migrations")
    for entry in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(entry) / "env.py").is_file():
            return str(Path(entry))
    raise RuntimeError("the ampci migrations directory is missing from this installation")


def head() -> str | None:
    """The newest migration revision shipped with this code, read from the ``revision`` /
    ``down_revision`` lines of ``migrations/versions/*.py`` without importing Alembic: the one revision
    no other names as its ``down_revision`` (None without migrations; several such heads raise
    RuntimeError, as Alembic's ``get_current_head`` does)."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in sorted((Path(script_location()) / "versions").glob("*.py")):
        found = {m.group(1): m.group(2) for m in _REVISION_LINE.finditer(path.read_text(encoding="utf-8"))}
        if "revision" not in found:
            continue
        revisions.add(ast.literal_eval(found["revision"]))
        down = ast.literal_eval(found.get("down_revision", "None"))
        parents.update((down,) if isinstance(down, str) else (down or ()))
    heads = sorted(revisions - parents)
    if len(heads) > 1:
        raise RuntimeError(f"the migrations have several heads: {', '.join(heads)}")
    return heads[0] if heads else None
