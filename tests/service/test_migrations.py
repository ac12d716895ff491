"""Alembic: empty → head → base → head on SQLite and PostgreSQL, with no drift from the models."""

from __future__ import annotations

import json
import multiprocessing

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from service.cli.main import main
from service.db import migrate
from service.db.engine import make_engine
from service.db.models import Base


def drift(url: str) -> list:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
            return compare_metadata(ctx, Base.metadata)
    finally:
        engine.dispose()


def tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_round_trip_without_drift(db_url: str) -> None:
    assert migrate.current(db_url) is None
    assert migrate.upgrade(db_url) == migrate.head() == "0002"
    assert drift(db_url) == []
    assert tables(db_url) >= {"revisions", "revision_parents", "runs", "jobs", "results", "regressions",
                              "zoo_models", "webhook_deliveries"}
    assert migrate.downgrade(db_url, "base") is None
    assert tables(db_url) <= {"alembic_version"}
    assert migrate.upgrade(db_url) == "0002"
    assert drift(db_url) == []
    assert migrate.upgrade(db_url) == "0002"  # idempotent


def test_db_cli(sqlite_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AMPCI_DATABASE_URL", sqlite_url)
    assert main(["db", "current", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"head": "0002", "revision": None, "url": sqlite_url}
    assert main(["db", "upgrade"]) == 0
    assert capsys.readouterr().out.strip() == f"{sqlite_url}: schema 0002 (head)"
    assert main(["db", "downgrade"]) == 0
    assert capsys.readouterr().out.strip() == f"{sqlite_url}: schema 0001 (behind head 0002)"
    assert main(["db", "downgrade"]) == 0
    assert capsys.readouterr().out.strip() == f"{sqlite_url}: schema (none) (empty)"


def test_embedded_default_is_sqlite_under_data_dir(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("AMPCI_DATABASE_URL", raising=False)
    monkeypatch.setenv("AMPCI_DATA_DIR", str(tmp_path / "data"))
    assert main(["runs", "--json"]) == 0  # the embedded database is created and upgraded on first use
    assert json.loads(capsys.readouterr().out) == []
    assert (tmp_path / "data" / "ampci.sqlite3").is_file()


def test_configured_database_behind_head_is_a_clear_error(sqlite_url: str, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AMPCI_DATABASE_URL", sqlite_url)
    assert main(["runs"]) == 2
    assert "run `ampci db upgrade`" in capsys.readouterr().err


def _upgrade(url: str) -> None:
    migrate.upgrade(url)


@pytest.mark.postgres
def test_concurrent_upgrades_are_serialised(pg_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_upgrade, args=(pg_url,)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert migrate.current(pg_url) == "0002" and drift(pg_url) == []


def test_0002_keeps_deliveries_and_a_downgrade_loses_no_pending_one(db_url: str) -> None:
    """0001 → 0002 keeps recorded deliveries; going back turns pending ones into rejected ones
    (so GitHub's redeliver processes them again) instead of dropping their payload silently."""
    from service.db import Store

    migrate.upgrade(db_url, "0001")
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO webhook_deliveries (delivery_id, event, status, received_at) "
                                 "VALUES ('old', 'push', 'accepted', CURRENT_TIMESTAMP)"))
        assert migrate.upgrade(db_url) == "0002" and drift(db_url) == []
        store = Store(engine)
        assert store.get_delivery("old").status == "accepted"
        assert store.receive_delivery("new", "push", "pending", payload={"v": 1}).stored
        assert store.count_pending_deliveries() == 1
        engine.dispose()
        assert migrate.downgrade(db_url, "0001") == "0001"
        with engine.connect() as conn:
            rows = dict(conn.execute(sa.text("SELECT delivery_id, status FROM webhook_deliveries")).all())
        assert rows == {"old": "accepted", "new": "rejected"}
    finally:
        engine.dispose()
