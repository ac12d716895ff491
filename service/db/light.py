"""Read-only queries over the store without SQLAlchemy: the quick path of ``ampci runs`` (issue 42).

Importing SQLAlchemy is most of a short query command's start-up (about 150 ms of ``ampci runs``'s 0.3-0.4 s),
so the command that lists runs reads them here through the database's own driver: the standard library's
:mod:`sqlite3` for a ``sqlite:///FILE`` URL (the embedded store), psycopg 3 for ``postgresql://`` (and
``postgresql+psycopg://``, ``postgres://``) URLs.

Guarantees:

- the same rows as the store: :meth:`LightReader.list_runs` returns what :meth:`Store.list_runs
  <service.db.store.Store.list_runs>` returns, and :meth:`LightReader.resolved_since` what
  :func:`service.db.verdicts.resolved_since` returns, for the same filters and database (the same SQL,
  ordering included; tests/service/db/test_light.py compares them, and the commands' whole output, on SQLite
  and PostgreSQL);
- read-only: nothing is written, nothing is created (a SQLite file that does not exist is not opened);
- the schema is checked first (:func:`open_light`): a database not at this code's head is refused with the
  one-line ConfigError the store gives (``run `ampci db upgrade```), or handed back to the store (None) when
  the store may upgrade it itself (the embedded SQLite); an unreachable database is a one-line
  :class:`~service.errors.DatabaseUnavailableError` naming the URL without its password;
- :func:`open_light` answers None for any URL it does not read (another driver, URL options): the caller then
  uses the store, which reads them all; a value it cannot read as the store does raises :class:`Unreadable`,
  and the caller asks the store too.

Only :mod:`service.db` speaks SQL (tests/test_layering.py); this module imports no SQLAlchemy, no Alembic
and no model stack (tests/service/cli/test_cli_imports.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from service.db.records import RunInfo, resolve_ref, revision_ref, utc
from service.db.versions import VERSION_TABLE, head
from service.errors import ConfigError, DatabaseUnavailableError
from service.settings import redact_url

if TYPE_CHECKING:
    from types import TracebackType

_PG_SCHEMES = ("postgresql://", "postgresql+psycopg://", "postgres://")
#: the columns of a runs row a RunInfo is made of (service.db.queries.RUN_COLUMNS less what RunInfo drops)
_RUN_SELECT = ("SELECT id, revision_sha, baseline_sha, trigger, status, sweep, dedup_key, meta, created_at, "
               "finished_at, verdict FROM runs")


class Unreadable(Exception):
    """A value this path cannot read as the store does (the store's engine reads PostgreSQL timestamps outside
    Python's range as None: :func:`service.db.engine._lenient_timestamps`): the caller asks the store instead."""


class _Cursor(Protocol):
    def execute(self, sql: str, params: Sequence[object] = ..., /) -> object: ...
    def fetchall(self) -> list[tuple[object, ...]]: ...


class LightReader:
    """An open, read-only connection to the store's database and the queries of the quick commands.  A context
    manager: leaving it closes the connection.  Parameters are written ``?`` and given to the driver in its
    own style."""

    def __init__(self, conn: object, *, postgres: bool, url: str) -> None:
        self._conn = conn
        self._postgres = postgres
        self.url = url

    def __enter__(self) -> LightReader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (idempotent)."""
        close = getattr(self._conn, "close", None)
        if callable(close):
            close()

    def _rows(self, sql: str, params: Sequence[object] = ()) -> list[tuple[object, ...]]:
        cur: _Cursor = self._conn.cursor()  # type: ignore[attr-defined]
        try:
            cur.execute(sql.replace("?", "%s") if self._postgres else sql, tuple(params))
            return list(cur.fetchall())
        except Exception as exc:
            if self._postgres and type(exc).__name__ == "OperationalError":  # the server went away
                raise _unavailable(self.url, exc) from None
            if self._postgres and type(exc).__name__ == "DataError":  # e.g. a timestamp Python cannot hold,
                raise Unreadable(str(exc)) from exc                   # which the store reads as None
            raise

    # -- the schema --------------------------------------------------------------------------------
    def schema_revision(self) -> str | None:
        """The revision recorded in ``alembic_version`` (None: no table or no row), as
        :func:`service.db.migrate.stored_revision` reads it (several rows raise RuntimeError)."""
        if self._postgres:
            present = self._rows("SELECT to_regclass(?) IS NOT NULL", (VERSION_TABLE,))[0][0]
        else:
            present = bool(self._rows("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                                      (VERSION_TABLE,)))
        if not present:
            return None
        rows = [str(r[0]) for r in self._rows(f"SELECT version_num FROM {VERSION_TABLE}")]
        if len(rows) > 1:
            raise RuntimeError(f"the database records several schema heads: {', '.join(sorted(rows))}")
        return rows[0] if rows else None

    # -- revisions and runs ------------------------------------------------------------------------
    def resolve_revision(self, ref: str) -> str:
        """The full sha of a known revision given as a sha or unique prefix, exactly as
        :meth:`Store.resolve_revision <service.db.queries.QueryMixin.resolve_revision>` answers (the same
        NotFoundError and UserError messages)."""
        ref = revision_ref(ref)
        found = [str(r[0]) for r in self._rows("SELECT sha FROM revisions WHERE sha LIKE ? ORDER BY sha LIMIT 6",
                                               (ref + "%",))]
        return resolve_ref(ref, found)

    def list_runs(self, limit: int = 50, revision: str | None = None, trigger: str | None = None,
                  status: str | None = None) -> list[RunInfo]:
        """Runs newest first, optionally for one revision / trigger / status (as ``Store.list_runs``)."""
        where: list[str] = []
        params: list[object] = []
        if revision:
            where.append("revision_sha = ?")
            params.append(self.resolve_revision(revision))
        if trigger:
            where.append("trigger = ?")
            params.append(trigger)
        if status:
            where.append("status = ?")
            params.append(status)
        sql = _RUN_SELECT + (" WHERE " + " AND ".join(where) if where else "")
        rows = self._rows(sql + " ORDER BY created_at DESC, id DESC LIMIT ?", [*params, int(limit)])
        return [_run_info(r) for r in rows]

    def resolved_since(self, run_ids: Iterable[int]) -> dict[int, tuple[int, tuple[int, ...]]]:
        """For each of ``run_ids`` with regressions a later run resolved: ``(how many, the resolving runs in
        ascending order)`` (as :func:`service.db.verdicts.resolved_since`); runs without any are absent."""
        ids = sorted({int(i) for i in run_ids})
        if not ids:
            return {}
        found: dict[int, list[int | None]] = {}
        for chunk in (ids[i:i + 500] for i in range(0, len(ids), 500)):
            marks = ", ".join("?" * len(chunk))
            for run_id, by in self._rows(
                    "SELECT g.run_id, r.run_id FROM regressions AS g LEFT OUTER JOIN results AS r "
                    f"ON r.id = g.resolved_by_result_id WHERE g.run_id IN ({marks}) "
                    "AND g.category = 'regression' AND g.state = 'resolved'", chunk):
                found.setdefault(int(str(run_id)), []).append(None if by is None else int(str(by)))
        return {run_id: (len(bys), tuple(sorted({b for b in bys if b is not None})))
                for run_id, bys in found.items()}


def _json(value: object) -> object:
    """A JSON column's value: psycopg hands PostgreSQL's JSON back decoded, SQLite as text."""
    if isinstance(value, str | bytes):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def _when(value: object) -> datetime | None:
    """A timestamp column's value as an aware UTC datetime (SQLite holds ISO text, naive UTC)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return utc(value)
    return utc(datetime.fromisoformat(str(value)))


def _run_info(r: tuple[object, ...]) -> RunInfo:
    """A RunInfo from a row of :data:`_RUN_SELECT`, as :func:`service.db.queries.run_info` makes it."""
    (id_, revision_sha, baseline_sha, trigger, status, sweep, dedup_key, meta, created_at, finished_at,
     verdict) = r
    meta_ = _json(meta)
    verdict_ = _json(verdict)
    created = _when(created_at)
    assert created is not None  # NOT NULL
    return RunInfo(id=int(str(id_)), revision_sha=str(revision_sha),
                   baseline_sha=None if baseline_sha is None else str(baseline_sha), trigger=str(trigger),
                   status=str(status), sweep=str(sweep), dedup_key=None if dedup_key is None else str(dedup_key),
                   created_at=created, finished_at=_when(finished_at),
                   meta=dict(meta_) if isinstance(meta_, dict) else {},
                   verdict=dict(verdict_) if isinstance(verdict_, dict) else None)


def _unavailable(url: str, exc: BaseException) -> DatabaseUnavailableError:
    """The one-line error of an unreachable database, its URL and the driver's words without a password."""
    text = str(exc).strip()
    reason = redact_url(text.splitlines()[0]) if text else type(exc).__name__
    return DatabaseUnavailableError(f"database unavailable at {redact_url(url)}: {reason}")


def _sqlite_path(url: str) -> Path | None:
    """The file of a plain ``sqlite:///FILE`` URL; None for any other SQLite URL (memory, options, URI)."""
    rest = url[len("sqlite:///"):] if url.startswith("sqlite:///") else ""
    if not rest or "?" in rest or rest == ":memory:" or rest.startswith("file:"):
        return None
    return Path(rest).expanduser()


def connect(url: str) -> LightReader | None:
    """A read-only :class:`LightReader` on ``url``; None when this module does not read such URLs, or (SQLite)
    the file does not exist yet (the store creates it).  An unreachable PostgreSQL is DatabaseUnavailableError."""
    if url.startswith("sqlite:"):
        path = _sqlite_path(url)
        if path is None or not path.is_file():
            return None
        import sqlite3

        try:
            # the store's busy timeout: wait out a writer rather than fail; nothing is written here
            conn = sqlite3.connect(path, timeout=30.0, isolation_level=None)
        except sqlite3.Error as exc:
            raise _unavailable(url, exc) from None
        return LightReader(conn, postgres=False, url=url)
    scheme = next((s for s in _PG_SCHEMES if url.startswith(s)), None)
    if scheme is None or "?" in url:  # options SQLAlchemy and libpq might read differently: the store's
        return None
    try:
        import psycopg
    except ImportError:
        return None
    try:
        pg = psycopg.connect("postgresql://" + url[len(scheme):], autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        raise _unavailable(url, exc) from None
    pg.read_only = True
    return LightReader(pg, postgres=True, url=url)


def open_light(url: str, *, may_upgrade: bool) -> LightReader | None:
    """A :class:`LightReader` on ``url`` whose schema is at this code's head, or None where the store must
    answer instead: a URL this module does not read, or a database not at head that the store upgrades
    itself (``may_upgrade``: the embedded SQLite).  A configured database not at head raises the store's
    ConfigError (``run `ampci db upgrade```)."""
    reader = connect(url)
    if reader is None:
        return None
    try:
        at, want = reader.schema_revision(), head()
    except BaseException:
        reader.close()
        raise
    if at != want:
        reader.close()
        if may_upgrade:
            return None
        raise ConfigError(f"database {redact_url(url)} is at schema {at or 'none'} but this ampci needs "
                          f"{want}; run `ampci db upgrade`")
    return reader
