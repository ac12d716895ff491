"""Alembic, configured programmatically so it works from an installed package (no alembic.ini).

``upgrade(url)`` brings any database (an empty one included) to head; ``downgrade(url, rev)``
goes back; ``current(url)`` names the revision the database is at.  On PostgreSQL the migration
holds an advisory lock, so concurrent upgrades from several processes run one after another.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from service.db.engine import connect, make_engine

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def _script_location() -> str:
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


def alembic_config(url: str) -> Config:
    """An Alembic Config for ``url`` with the packaged ``migrations`` directory."""
    cfg = Config()
    cfg.set_main_option("script_location", _script_location())
    cfg.attributes["url"] = url
    return cfg


def upgrade(url: str, revision: str = "head") -> str | None:
    """Upgrade the database at ``url`` to ``revision``; returns the revision it is at afterwards."""
    command.upgrade(alembic_config(url), revision)
    return current(url)


def downgrade(url: str, revision: str = "-1") -> str | None:
    """Downgrade the database at ``url`` to ``revision`` (``base`` empties it)."""
    command.downgrade(alembic_config(url), revision)
    return current(url)


def current(url: str) -> str | None:
    """The Alembic revision the database is at (None: not initialised)."""
    engine = make_engine(url)
    try:
        with connect(engine) as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def head() -> str | None:
    """The newest migration revision shipped with this code."""
    return ScriptDirectory.from_config(alembic_config("")).get_current_head()
