"""Alembic environment: the URL comes from ``config.attributes['url']`` (see service.db.migrate)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from service.db.engine import connect, make_engine
from service.db.models import Base

config = context.config
target_metadata = Base.metadata
LOCK_ID = 0x616D7063  # "ampc": serialises concurrent upgrades on PostgreSQL


def run_migrations_offline() -> None:
    """Emit SQL without a database (``alembic upgrade --sql``)."""
    context.configure(url=config.attributes.get("url") or config.get_main_option("sqlalchemy.url"),
                      target_metadata=target_metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run migrations on a live connection (the caller's, or one made from the URL)."""
    given = config.attributes.get("connection")
    if given is not None:
        _run(given)
        return
    engine = make_engine(config.attributes.get("url") or config.get_main_option("sqlalchemy.url"))
    try:
        with connect(engine) as conn:
            _run(conn)
            conn.commit()
    finally:
        engine.dispose()


def _run(conn: sa.Connection) -> None:
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": LOCK_ID})
    context.configure(connection=conn, target_metadata=target_metadata,
                      render_as_batch=conn.dialect.name == "sqlite", compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
