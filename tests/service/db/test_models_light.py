"""The models load no SQL dialect they do not use (issue 42, the sandbox's smoke sweep at 352d2e5's cost): the
covering index's PostgreSQL ``INCLUDE`` columns are added where a PostgreSQL engine is made, not at import, and
a migrated PostgreSQL database has them, with no drift against the models."""

from __future__ import annotations

import subprocess
import sys

import sqlalchemy as sa

from service.db import migrate
from service.db.engine import make_engine
from service.db.models import COVERING_INCLUDE, COVERING_INDEX, Result


def test_the_models_do_not_import_the_postgresql_dialect() -> None:
    code = ("import sys, service.db.models, service.db.engine as e; e.make_engine('sqlite://');"
            "print('sqlalchemy.dialects.postgresql' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_a_postgresql_engine_gives_the_covering_index_its_include_columns(pg_url: str) -> None:
    engine = make_engine(pg_url)
    try:
        index = next(i for i in Result.__table__.indexes if i.name == COVERING_INDEX)
        assert index.kwargs.get("postgresql_include") == list(COVERING_INCLUDE)
        migrate.upgrade(pg_url)
        with engine.connect() as conn:
            ddl = conn.execute(sa.text("select indexdef from pg_indexes where indexname = :n"),
                               {"n": COVERING_INDEX}).scalar_one()
        assert "INCLUDE (run_id, status, id)" in ddl, ddl
    finally:
        engine.dispose()
