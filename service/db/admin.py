"""Throw-away PostgreSQL databases for tests and benchmarks: create one next to an admin URL, drop it.

One implementation for ``tests/conftest.py`` and every ``bench/`` script.  Names are random
(``PREFIX_<hex>``), so concurrent runs never collide, and a drop names its own database only.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa


def _execute_autocommit(admin_url: str, statement: str) -> None:
    """Run one statement outside a transaction (CREATE/DROP DATABASE need that) on a throw-away engine."""
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            c.execute(sa.text(statement))
    finally:
        admin.dispose()


def create_database(admin_url: str, prefix: str = "ampci_tmp") -> str:
    """Create an empty database on the server of ``admin_url``; return its URL (same credentials)."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    _execute_autocommit(admin_url, f'CREATE DATABASE "{name}"')
    return admin_url.rsplit("/", 1)[0] + "/" + name


def drop_database(admin_url: str, url: str) -> None:
    """Drop the database of ``url`` (made by :func:`create_database`), closing its connections first."""
    name = url.rsplit("/", 1)[1]
    _execute_autocommit(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def temporary_database(admin_url: str, prefix: str = "ampci_tmp", keep: bool = False) -> Iterator[str]:
    """Yield the URL of a fresh database; drop it afterwards unless ``keep``."""
    url = create_database(admin_url, prefix)
    try:
        yield url
    finally:
        if not keep:
            drop_database(admin_url, url)
