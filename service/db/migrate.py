"""Alembic, configured programmatically so it works from an installed package (no alembic.ini).

``upgrade(url)`` brings any database (an empty one included) to head; ``downgrade(url, rev)``
goes back; ``current(url)`` names the revision the database is at.  On PostgreSQL the migration
holds an advisory lock, so concurrent upgrades from several processes run one after another.

Checking that a database is current costs no Alembic import: :func:`current` reads the
``alembic_version`` table with SQLAlchemy and :func:`head` (:mod:`service.db.versions`) reads the
``revision`` and ``down_revision`` lines of the shipped migration files (tests/service/cli/test_cli_imports.py
holds it equal to Alembic's own head).  Alembic is imported only to upgrade or downgrade.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sqlalchemy as sa

from service.db.engine import connect, make_engine
from service.db.versions import MIGRATIONS_DIR, VERSION_TABLE, head, script_location

if TYPE_CHECKING:
    from alembic.config import Config

__all__ = ["MIGRATIONS_DIR", "VERSION_TABLE", "alembic_config", "alembic_head", "current", "downgrade", "head",
           "quiet_alembic", "script_location", "stored_revision", "upgrade"]


def alembic_config(url: str) -> Config:
    """An Alembic Config for ``url`` with the packaged ``migrations`` directory."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", script_location())
    cfg.attributes["url"] = url
    return cfg


def upgrade(url: str, revision: str = "head") -> str | None:
    """Upgrade the database at ``url`` to ``revision``; returns the revision it is at afterwards.

    A database already at head is left alone without importing Alembic, so a worker or server start logs
    nothing about migrations; when Alembic runs, its per-run "setup plugin" INFO lines are silenced
    (:func:`quiet_alembic`)."""
    if revision == "head":
        at = current(url)
        if at is not None and at == head():
            return at
    quiet_alembic()  # before the import: Alembic sets its plugins up when it is imported
    from alembic import command

    command.upgrade(alembic_config(url), revision)
    return current(url)


def quiet_alembic() -> None:
    """Alembic 1.16+ logs one INFO line per autogenerate plugin it sets up (``setup plugin
    alembic.autogenerate.schemas`` …) on every command: noise in every worker log, so WARNING and up only."""
    import logging

    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)


def downgrade(url: str, revision: str = "-1") -> str | None:
    """Downgrade the database at ``url`` to ``revision`` (``base`` empties it)."""
    quiet_alembic()
    from alembic import command

    command.downgrade(alembic_config(url), revision)
    return current(url)


def current(url: str) -> str | None:
    """The Alembic revision the database is at (None: not initialised)."""
    engine = make_engine(url)
    try:
        return stored_revision(engine)
    finally:
        engine.dispose()


def stored_revision(engine: sa.Engine) -> str | None:
    """The revision recorded in ``engine``'s ``alembic_version`` table (None: no table or no row), read
    with SQLAlchemy alone, as Alembic's ``MigrationContext.get_current_revision`` reads it; several rows
    (a branched history, which ampci never ships) raise RuntimeError."""
    with connect(engine) as conn:
        if not sa.inspect(conn).has_table(VERSION_TABLE):
            return None
        rows = [r[0] for r in conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}"))]
    if len(rows) > 1:
        raise RuntimeError(f"the database records several schema heads: {', '.join(sorted(rows))}")
    return rows[0] if rows else None


def alembic_head() -> str | None:
    """The newest revision as Alembic's script directory computes it (imports Alembic; what
    :func:`head` must equal)."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config("")).get_current_head()
