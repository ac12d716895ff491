"""The light read path (service/db/light.py, issue 42) answers exactly as the store does.

On SQLite and PostgreSQL: the same runs (every filter, ordering, verdicts, meta, times) and the same "resolved
since" of each run; each read-only query command, enumerated from the CLI's parser, prints the same table,
JSON and CSV with the light path on and off, and the commands of ``LIGHT_COMMANDS`` answer without opening
the store.  A schema not at head, an unreachable database and an embedded store not created yet behave as
the store does (one-line error, exit 2 / 3; the embedded store created and upgraded)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from service.cli import query_cmd
from service.cli.main import COMMANDS, build_parser, main
from service.db import light, migrate
from service.db.records import RunInfo
from service.db.store import Store
from tests.service.factories import CELL, chain, make_result, migrated_store, run_with

QUERY_MODULE = "service.cli.query_cmd"


@pytest.fixture
def history(db_url: str) -> Iterator[tuple[str, dict[str, str]]]:
    """A store holding what the lists show: passing, regressed, resolving, unfinished and filtered runs."""
    store = migrated_store(db_url)
    shas = chain(store, 6)
    ids = {"first": run_with(store, shas[0], [make_result(CELL)]),
           "regressed": run_with(store, shas[1], [make_result(CELL, max_abs=0.5)]),
           "resolving": run_with(store, shas[2], [make_result(CELL)]),
           "nightly": run_with(store, shas[3], [make_result(CELL)], trigger="nightly"),
           "open": run_with(store, shas[4], [make_result(CELL, max_abs=0.5)]),  # a regression nobody resolved
           "queued": store.create_run(shas[5], "manual", cells=[CELL], meta={"note": "ünïcode"})}
    store.dispose()
    engine = sa.create_engine(db_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:  # two runs created at the same instant: the order falls back to their ids
        conn.execute(sa.text("UPDATE runs SET created_at = (SELECT created_at FROM runs WHERE id = :a) WHERE id = :b"),
                     {"a": ids["resolving"], "b": ids["nightly"]})
    engine.dispose()
    yield db_url, {"a": shas[0][:10], "b": shas[1][:10], "rev": shas[1][:8], **{k: str(v) for k, v in ids.items()},
                   "model": CELL[0]}


Listed = tuple[list[RunInfo], dict[int, tuple[int, tuple[int, ...]]]]


def _read_both(url: str, **filters: object) -> tuple[Listed, Listed]:
    from service.orchestration.judge import listed_verdicts

    store = Store.from_url(url)
    try:
        heavy = listed_verdicts(store, store.list_runs(**filters))  # type: ignore[arg-type]
    finally:
        store.dispose()
    reader = light.open_light(url, may_upgrade=False)
    assert reader is not None, f"the light path does not read {url}"
    with reader:
        runs = reader.list_runs(**filters)  # type: ignore[arg-type]
        return heavy, (runs, reader.resolved_since(r.id for r in runs))


@pytest.mark.parametrize("filters", [{}, {"limit": 2}, {"trigger": "nightly"}, {"status": "queued"},
                                     {"status": "complete", "trigger": "push"}, {"revision": "REV"}],
                         ids=lambda f: ",".join(f) or "all")
def test_runs_and_resolved_equal_the_stores(history: tuple[str, dict[str, str]], filters: dict[str, object]) -> None:
    url, ids = history
    filters = {k: ids["rev"] if v == "REV" else v for k, v in filters.items()}
    heavy, lite = _read_both(url, **filters)
    assert lite == heavy
    runs, resolved = lite
    assert runs, "the filter matched nothing: the comparison says little"
    if not filters:
        assert resolved == {int(ids["regressed"]): (1, (int(ids["resolving"]),))}
        assert {r.meta.get("note") for r in runs} >= {"ünïcode"}
        assert all(r.created_at.tzinfo is not None for r in runs)


def test_revision_errors_are_the_stores(history: tuple[str, dict[str, str]]) -> None:
    url, _ids = history
    store = Store.from_url(url)
    reader = light.open_light(url, may_upgrade=False)
    assert reader is not None
    with reader:
        for ref in ("0000", "zz", "c0ffee", "ffffffff"):
            with pytest.raises(Exception) as heavy:
                store.list_runs(revision=ref)
            with pytest.raises(Exception) as lite:
                reader.list_runs(revision=ref)
            assert (type(lite.value), str(lite.value)) == (type(heavy.value), str(heavy.value))
    store.dispose()


def _format_flags(parser: argparse.ArgumentParser) -> list[list[str]]:
    """The table, and --json / --csv where the command has them."""
    options = {s for a in parser._actions for s in a.option_strings}
    return [[]] + [[f] for f in ("--json", "--csv") if f in options]


def _read_only_query_commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser([QUERY_MODULE])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: sub.choices[name] for name, c in COMMANDS.items() if c.module == QUERY_MODULE and name != "ack"}


ARGVS = {"runs": ["runs"], "run": ["run", "{regressed}"], "results": ["results", "--run", "{regressed}"],
         "regressions": ["regressions", "--revision", "{b}"], "compare": ["compare", "{a}", "{b}"],
         "history": ["history", "{model}"]}


def test_every_read_only_query_command_has_a_probe() -> None:
    """The commands below are the parser's read-only query commands, and LIGHT_COMMANDS is among them."""
    assert set(ARGVS) == set(_read_only_query_commands())
    assert query_cmd.LIGHT_COMMANDS <= set(ARGVS) and "runs" in query_cmd.LIGHT_COMMANDS


def _ampci(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(argv)
    return rc, capsys.readouterr().out


def test_query_commands_print_the_same_on_both_paths(history: tuple[str, dict[str, str]], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Each read-only query command (from the parser) in each of its formats prints the same with the light
    path on and off; a LIGHT_COMMANDS command does not open the store when it is on."""
    url, ids = history
    monkeypatch.setenv("AMPCI_DATABASE_URL", url)
    monkeypatch.setenv("AMPCI_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    opened: list[str] = []
    real_open = query_cmd.open_store

    def recording_open() -> Store:
        opened.append("store")
        return real_open()
    monkeypatch.setattr(query_cmd, "open_store", recording_open)
    for name, parser in _read_only_query_commands().items():
        for flags in _format_flags(parser):
            argv = [w.format(**ids) for w in ARGVS[name]] + flags
            monkeypatch.setattr(query_cmd, "LIGHT_READS", False)
            heavy = _ampci(argv, capsys)
            monkeypatch.setattr(query_cmd, "LIGHT_READS", True)
            opened.clear()
            lite = _ampci(argv, capsys)
            assert lite == heavy, f"`ampci {' '.join(argv)}` differs on the light path"
            assert heavy[1].strip(), f"`ampci {' '.join(argv)}` printed nothing"
            if name in query_cmd.LIGHT_COMMANDS:
                assert not opened, f"`ampci {' '.join(argv)}` opened the store"
    rc, out = _ampci(["runs", "--json"], capsys)
    listed = json.loads(out)
    assert rc == 0 and [r["id"] for r in listed][-1] == int(ids["first"])
    assert next(r for r in listed if r["id"] == int(ids["regressed"]))["resolved_since"] == {
        "regressions": 1, "runs": [int(ids["resolving"])]}


def test_a_run_without_a_recorded_verdict_is_judged_by_the_store(
        sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A finished run whose verdict was never recorded is judged and recorded once (the store's path), then
    listed by the light path."""
    store = migrated_store(sqlite_url)
    (rev,) = chain(store, 1)
    run_id = run_with(store, rev, [make_result(CELL)], detect=False)
    assert store.get_run(run_id).verdict is None
    monkeypatch.setenv("AMPCI_DATABASE_URL", sqlite_url)
    rc, out = _ampci(["runs", "--json"], capsys)
    assert rc == 0 and json.loads(out)[0]["verdict"]["state"] == "success"
    assert store.get_run(run_id).verdict is not None
    store.dispose()
    monkeypatch.setattr(query_cmd, "open_store", lambda: pytest.fail("the store was opened"))
    assert _ampci(["runs", "--json"], capsys) == (rc, out)


def test_a_database_behind_the_schema_is_one_line(db_url: str, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A configured database not at head: exit 2, one line naming ``ampci db upgrade`` (the store's words)."""
    migrate.upgrade(db_url, "0001")
    monkeypatch.setenv("AMPCI_DATABASE_URL", db_url)
    assert main(["runs"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is at schema 0001" in err and "ampci db upgrade" in err, err
    engine = sa.create_engine(db_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM alembic_version"))
    engine.dispose()
    assert main(["runs"]) == 2
    assert "is at schema none" in capsys.readouterr().err


def test_an_unreachable_database_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing listening: exit 3, one line naming the URL without its password."""
    monkeypatch.setenv("AMPCI_DATABASE_URL", "postgresql://u:s3cret@127.0.0.1:9/none")
    assert main(["runs", "--json"]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "database unavailable at" in err and "s3cret" not in err, err


def test_embedded_store_is_created_and_upgraded_then_read_light(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing configured: the first ``ampci runs`` creates and upgrades the embedded SQLite (the store), the
    next reads it through the light path."""
    monkeypatch.delenv("AMPCI_DATABASE_URL", raising=False)
    monkeypatch.setenv("AMPCI_DATA_DIR", str(tmp_path))
    assert light.open_light(f"sqlite:///{tmp_path / 'ampci.sqlite3'}", may_upgrade=True) is None  # no file yet
    assert _ampci(["runs", "--json"], capsys) == (0, "[]\n")
    assert migrate.current(f"sqlite:///{tmp_path / 'ampci.sqlite3'}") == migrate.head()
    monkeypatch.setattr(query_cmd, "open_store", lambda: pytest.fail("the store was opened"))
    assert _ampci(["runs", "--json"], capsys) == (0, "[]\n")


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///x.db?mode=ro", "mysql://h/db", "sqlite:///:memory:",
                                 "postgresql://u@127.0.0.1/db?sslmode=disable"])
def test_urls_it_does_not_read_go_to_the_store(url: str) -> None:
    assert light.connect(url) is None


def test_a_timestamp_python_cannot_hold_is_read_by_the_store(pg_url: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """PostgreSQL holds ``0001-01-01 00:00:00+14`` (another tool wrote it), which Python cannot: the store reads
    it as None; the light path hands such a listing to the store, so ``ampci runs`` prints the same."""
    store = migrated_store(pg_url)
    (rev,) = chain(store, 1)
    run_id = run_with(store, rev, [make_result(CELL)])
    store.dispose()
    engine = sa.create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE runs SET finished_at = '0001-01-01 00:00:00+14' WHERE id = :i"), {"i": run_id})
    engine.dispose()
    monkeypatch.setenv("AMPCI_DATABASE_URL", pg_url)
    monkeypatch.setenv("AMPCI_DATA_DIR", str(tmp_path))
    reader = light.open_light(pg_url, may_upgrade=False)
    assert reader is not None
    with reader, pytest.raises(light.Unreadable):
        reader.list_runs()
    monkeypatch.setattr(query_cmd, "LIGHT_READS", False)
    heavy = _ampci(["runs", "--json"], capsys)
    monkeypatch.setattr(query_cmd, "LIGHT_READS", True)
    assert _ampci(["runs", "--json"], capsys) == heavy and heavy[0] == 0
    assert json.loads(heavy[1])[0]["finished_at"] is None
