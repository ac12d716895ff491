"""Alembic: empty → head → base → head on SQLite and PostgreSQL, with no drift from the models."""

from __future__ import annotations

import json
import multiprocessing
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from service.cli.main import main
from service.db import migrate
from service.db.engine import make_engine
from service.db.models import Base

#: the shipped revisions oldest first (each file's id is its 4-digit prefix) and the newest: tests follow
#: new migrations without edits
CHAIN = sorted(p.name[:4] for p in (migrate.MIGRATIONS_DIR / "versions").glob("[0-9][0-9][0-9][0-9]_*.py"))
HEAD = CHAIN[-1]


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
    assert migrate.upgrade(db_url) == migrate.head() == CHAIN[-1] == migrate.alembic_head()
    assert drift(db_url) == []
    assert tables(db_url) >= {"revisions", "revision_parents", "runs", "jobs", "results", "regressions",
                              "zoo_models", "webhook_deliveries"}
    assert migrate.downgrade(db_url, "base") is None
    assert tables(db_url) <= {"alembic_version"}
    assert migrate.upgrade(db_url) == HEAD
    assert drift(db_url) == []
    assert migrate.upgrade(db_url) == HEAD  # idempotent


def test_db_cli(sqlite_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AMPCI_DATABASE_URL", sqlite_url)
    assert main(["db", "current", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"head": HEAD, "revision": None, "url": sqlite_url}
    assert main(["db", "upgrade"]) == 0
    assert capsys.readouterr().out.strip() == f"{sqlite_url}: schema {HEAD} (head)"
    for below in reversed(CHAIN[:-1]):  # one step down at a time
        assert main(["db", "downgrade", "--yes"]) == 0
        assert capsys.readouterr().out.strip() == f"{sqlite_url}: schema {below} (behind head {HEAD})"
    assert main(["db", "downgrade", "--yes"]) == 0
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
    assert migrate.current(pg_url) == HEAD and drift(pg_url) == []


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
        assert migrate.upgrade(db_url, "0002") == "0002"
        assert migrate.upgrade(db_url) == migrate.head() and drift(db_url) == []
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



def _dispatch_by_sweep(engine: sa.Engine) -> dict[str, str]:
    with engine.connect() as conn:
        return dict(conn.execute(sa.text("SELECT sweep, dispatch FROM runs")).all())


def _count(engine: sa.Engine, table: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one())


OLD_RUN = ("INSERT INTO runs (revision_sha, trigger, status, sweep, meta, created_at) "
           "VALUES (:s, 'push', 'queued', :sweep, '{}', CURRENT_TIMESTAMP)")


def test_0003_records_run_dispatch_and_existing_runs_are_broker(db_url: str) -> None:
    """0002 → 0003 adds ``runs.dispatch``: runs (and their queued jobs) that existed before are
    ``broker``, so reconcile treats them as it always did; new runs record what they are given;
    runs written by code that predates the column get ``broker`` from the server default; going
    back to 0002 drops the column and keeps every run, job and result (on SQLite too, where a
    table copy would cascade-delete them)."""
    from service.db import Store
    from service.errors import UserError
    from tests.service.factories import make_result

    rev, cell = "a" * 40, ("m", "fp16", "default", "cpu")
    migrate.upgrade(db_url, "0002")
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO revisions (sha, parents, created_at) "
                                 "VALUES (:s, '[]', CURRENT_TIMESTAMP)"), {"s": rev})
            conn.execute(sa.text(OLD_RUN), {"s": rev, "sweep": "old"})
            conn.execute(sa.text("INSERT INTO jobs (run_id, model, dtype, policy, target, status, attempts, "
                                 "queued_at) SELECT id, 'm', 'fp16', 'default', 'cpu', 'queued', 0, "
                                 "CURRENT_TIMESTAMP FROM runs"))
        assert migrate.upgrade(db_url) == HEAD and drift(db_url) == []
        assert _dispatch_by_sweep(engine) == {"old": "broker"} and _count(engine, "jobs") == 1

        store = Store(engine)
        local = store.create_run_with_jobs(rev, "manual", sweep="local", cells=[cell], dispatch="local")
        store.create_run(rev, "manual", sweep="default", cells=[cell])
        Store(engine, run_dispatch="local").create_run(rev, "bisect", sweep="embedded", cells=[cell])
        store.write_result(local.run_id, make_result(cell), job_id=local.jobs[0].id)
        with pytest.raises(UserError, match="unknown dispatch 'celery'"):
            store.create_run(rev, "manual", cells=[cell], dispatch="celery")
        with engine.begin() as conn:  # a process still running code from before 0003
            conn.execute(sa.text(OLD_RUN), {"s": rev, "sweep": "legacy"})
        assert _dispatch_by_sweep(engine) == {"old": "broker", "local": "local", "default": "broker",
                                              "embedded": "local", "legacy": "broker"}
        engine.dispose()

        assert migrate.downgrade(db_url, "0002") == "0002"
        with engine.connect() as conn:
            assert "dispatch" not in {c["name"] for c in sa.inspect(conn).get_columns("runs")}
        assert (_count(engine, "runs"), _count(engine, "jobs"), _count(engine, "results")) == (5, 4, 1)
        engine.dispose()
        assert migrate.upgrade(db_url) == HEAD and drift(db_url) == []
        assert set(_dispatch_by_sweep(engine).values()) == {"broker"}  # what 0002 cannot hold is gone
    finally:
        engine.dispose()


def test_0007_moves_the_local_owner_from_meta_to_its_column_and_back(db_url: str) -> None:
    """0006 → 0007 moves ``runs.meta["local_owner"]`` to ``runs.local_owner`` (out of meta, the rest of
    meta kept; an empty owner becomes NULL); going back to 0006 puts it back in meta and drops the column."""
    from service.orchestration import orphans

    rev = "b" * 40
    owner = {"host": "h1", "pid": 4242, "start": "99"}
    metas = {"owned": {"local_owner": owner, "cell_defaults": {"repeats": 6}}, "released": {"local_owner": None},
             "plain": {"requested_revision": "HEAD"}}
    migrate.upgrade(db_url, "0006")
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO revisions (sha, parents, created_at) "
                                 "VALUES (:s, '[]', CURRENT_TIMESTAMP)"), {"s": rev})
            for sweep, meta in metas.items():
                conn.execute(sa.text("INSERT INTO runs (revision_sha, trigger, status, sweep, meta, created_at, "
                                     "dispatch) VALUES (:s, 'manual', 'queued', :sweep, :meta, CURRENT_TIMESTAMP, "
                                     "'local')"), {"s": rev, "sweep": sweep, "meta": json.dumps(meta)})

        def rows() -> dict[str, tuple[Any, Any]]:
            with engine.connect() as conn:
                cols = {c["name"] for c in sa.inspect(conn).get_columns("runs")}
                q = f"SELECT sweep, meta{', local_owner' if 'local_owner' in cols else ''} FROM runs"
                out = {}
                for r in conn.execute(sa.text(q)):
                    meta = json.loads(r[1]) if isinstance(r[1], str) else r[1]
                    value = r[2] if len(r) > 2 else "no column"
                    out[r[0]] = (meta, json.loads(value) if isinstance(value, str) and value != "no column"
                                 else value)
            engine.dispose()
            return out

        assert migrate.upgrade(db_url) == HEAD and drift(db_url) == []
        got = rows()
        assert got["owned"] == ({"cell_defaults": {"repeats": 6}}, owner)
        assert got["released"] == ({}, None) and got["plain"] == ({"requested_revision": "HEAD"}, None)
        from service.db import Store

        store = Store(engine)
        ids = {r.sweep: r.id for r in store.list_runs(limit=10)}
        assert orphans.owner_of(store, ids["owned"]) == owner and orphans.owner_of(store, ids["plain"]) is None
        found = {o.run_id: o.state for o in orphans.find_orphans(store, include_alive=True)}
        assert found == {}  # no pending jobs: nothing to adopt
        engine.dispose()

        assert migrate.downgrade(db_url, "0006") == "0006"
        got = rows()
        assert got["owned"] == ({"cell_defaults": {"repeats": 6}, "local_owner": owner}, "no column")
        assert got["plain"] == ({"requested_revision": "HEAD"}, "no column")
        assert migrate.upgrade(db_url) == HEAD and rows()["owned"][1] == owner
    finally:
        engine.dispose()
