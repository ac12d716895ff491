"""Engine creation and the translation of connection failures into ``DatabaseUnavailableError``.

Guarantees: an unreachable or unopenable database raises
:class:`service.errors.DatabaseUnavailableError` whose message names the URL with its password
redacted; SQLite engines enforce foreign keys, use WAL and wait (busy timeout) instead of failing
when another process writes; PostgreSQL engines check a pooled connection before use when it
sat idle for more than ``IDLE_PING_SECONDS`` (a connection reused within that time, the hot path
under load, costs no extra round trip), replacing a dead one transparently, and never hold more
than ``pool_size + max_overflow`` connections (``AMPCI_DB_POOL_SIZE`` / ``AMPCI_DB_MAX_OVERFLOW``
through :meth:`service.settings.Settings.db_pool`); a caller that finds them all busy waits up to
``POOL_TIMEOUT_S`` and then gets DatabaseUnavailableError (503 in the API), not a new connection.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection as Connection  # re-exported: the floors above annotate with it
from sqlalchemy.engine import Engine, Row
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

from service.errors import ConfigError, DatabaseUnavailableError
from service.settings import redact_url

if TYPE_CHECKING:
    import sqlite3

    import psycopg
    from psycopg.abc import AdaptContext, Buffer
    from psycopg.abc import Loader as AnyLoader
    from sqlalchemy.dialects.postgresql import Insert as PgInsert
    from sqlalchemy.dialects.sqlite import Insert as SqliteInsert
    from sqlalchemy.engine.interfaces import DBAPIConnection
    from sqlalchemy.pool import ConnectionPoolEntry, PoolProxiedConnection

#: An INSERT of one of the two supported dialects, with ``on_conflict_do_*`` and ``excluded``.
DialectInsert: TypeAlias = "PgInsert | SqliteInsert"
#: A row of any statement, its columns read by name (``row.id``, typed by the column read) or position.
DbRow: TypeAlias = "Row[*tuple[object, ...]]"
#: A SELECT of any columns.
DbSelect: TypeAlias = "sa.Select[*tuple[object, ...]]"
#: A psycopg connection whose rows are plain tuples (the default row factory).
PgConnection: TypeAlias = "psycopg.Connection[tuple[object, ...]]"

SQLITE_BUSY_MS = 30_000
IDLE_PING_SECONDS = 5.0  # a pooled PostgreSQL connection idle longer than this is checked before use
DEFAULT_POOL_SIZE = 5     # AMPCI_DB_POOL_SIZE's default
DEFAULT_MAX_OVERFLOW = 10  # AMPCI_DB_MAX_OVERFLOW's default
POOL_TIMEOUT_S = 30.0     # how long a checkout waits for a busy pool before giving up


def _sqlite_file(url: sa.URL) -> Path | None:
    db = url.database
    if not db or db == ":memory:" or db.startswith("file:"):
        return None
    return Path(db).expanduser()


def make_engine(url: str, pool_size: int = DEFAULT_POOL_SIZE, max_overflow: int = DEFAULT_MAX_OVERFLOW) -> Engine:
    """Create an engine for ``url`` (no connection is made yet) holding at most ``pool_size +
    max_overflow`` PostgreSQL connections (SQLite ignores both).

    A SQLite file URL gets its parent directory created; ``postgresql://`` / ``postgres://`` mean
    psycopg 3.  A malformed URL or a missing driver is a ``ConfigError`` (exit 2) naming the
    redacted URL.
    """
    try:
        parsed = sa.make_url(url)
    except ArgumentError:
        raise ConfigError(f"not a database URL: {redact_url(url)!r}") from None
    if parsed.drivername in ("postgresql", "postgres"):  # the installed driver is psycopg 3
        parsed = parsed.set(drivername="postgresql+psycopg")
    try:
        if parsed.get_backend_name() == "sqlite":
            path = _sqlite_file(parsed)
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
            engine = sa.create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_MS / 1000})
            event.listen(engine, "connect", _sqlite_pragmas)
            # Let SQLAlchemy emit BEGIN itself so transactions take locks predictably.
            event.listen(engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN IMMEDIATE"))
            return engine
        engine = sa.create_engine(parsed, pool_size=max(1, pool_size), max_overflow=max(0, max_overflow),
                                  pool_timeout=POOL_TIMEOUT_S)
        from service.db.models import postgresql_options

        postgresql_options()  # the covering index's INCLUDE columns (only where the dialect is loaded)
        event.listen(engine, "connect", _lenient_timestamps)
        _ping_when_idle(engine, IDLE_PING_SECONDS)
        return engine
    except (NoSuchModuleError, ImportError, ArgumentError) as exc:
        raise ConfigError(f"cannot use database URL {redact_url(url)}: {exc}") from None


def _lenient_timestamps(dbapi_conn: PgConnection, _record: ConnectionPoolEntry) -> None:
    """Timestamps PostgreSQL holds but Python cannot (before year 1 or after 9999 once in UTC, e.g.
    ``0001-01-01 00:00:00+14`` written by another tool) read back as None, so a page or API answer
    showing such a row renders it as missing ("–") instead of failing with psycopg's DataError.
    The webhook refuses such values at intake; this covers what is already stored."""
    from psycopg import DataError
    from psycopg.adapt import Loader
    from psycopg.pq import Format

    for name in ("timestamptz", "timestamp", "date"):
        oid = dbapi_conn.adapters.types[name].oid
        for fmt in (Format.TEXT, Format.BINARY):
            base: type[AnyLoader] | None = dbapi_conn.adapters.get_loader(oid, fmt)
            if base is None or getattr(base, "_ampci_lenient", False):
                continue
            inner: type[AnyLoader] = base

            class Lenient(Loader):  # wraps the (C) loader: psycopg's compiled loaders cannot be subclassed
                _ampci_lenient = True
                format = fmt
                inner_class = inner

                def __init__(self, oid: int, context: AdaptContext | None = None) -> None:
                    super().__init__(oid, context)
                    self._inner = self.inner_class(oid, context)

                def load(self, data: Buffer) -> date | None:  # a date or datetime; None where Python has none
                    try:
                        loaded: date = self._inner.load(data)
                    except DataError:
                        return None
                    return loaded

            dbapi_conn.adapters.register_loader(oid, Lenient)


def _ping_when_idle(engine: Engine, idle: float) -> None:
    """Pessimistic disconnect handling without a round trip per checkout: ping only connections
    that sat in the pool longer than ``idle`` seconds; a failed ping makes the pool retry with a
    fresh connection (SQLAlchemy's ``DisconnectionError`` protocol)."""

    @event.listens_for(engine, "checkin")
    def _checkin(_dbapi_conn: DBAPIConnection, record: ConnectionPoolEntry) -> None:
        record.info["ampci_idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_conn: DBAPIConnection, record: ConnectionPoolEntry, _proxy: PoolProxiedConnection) -> None:
        since = record.info.get("ampci_idle_since")
        if since is None or time.monotonic() - since <= idle:
            return
        try:
            cur = dbapi_conn.cursor()
            try:
                cur.execute("SELECT 1")
            finally:
                cur.close()
            dbapi_conn.rollback()
        except Exception as exc:  # noqa: BLE001 - any failure means: use another connection
            raise sa.exc.DisconnectionError(str(exc)) from exc


def _sqlite_pragmas(dbapi_conn: sqlite3.Connection, _record: ConnectionPoolEntry) -> None:
    dbapi_conn.isolation_level = None  # autocommit at the driver; SQLAlchemy's "begin" event starts txns
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_MS}")
    try:
        cur.execute("PRAGMA journal_mode=WAL")
    except Exception:  # noqa: BLE001 - read-only or in-memory databases keep their journal mode
        pass
    cur.close()


def unavailable(engine: Engine, exc: BaseException) -> DatabaseUnavailableError:
    """A DatabaseUnavailableError for ``engine`` whose message carries no password."""
    url = engine.url.render_as_string(hide_password=True)
    reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    reason = redact_url(reason)
    if engine.url.password:
        reason = reason.replace(str(engine.url.password), "***")
    return DatabaseUnavailableError(f"database unavailable at {url}: {reason}")


def connect(engine: Engine) -> Connection:
    """Open a connection, translating connection failures into DatabaseUnavailableError."""
    try:
        return engine.connect()
    except DBAPIError as exc:
        raise unavailable(engine, exc) from None
    except sa.exc.TimeoutError:
        raise DatabaseUnavailableError(f"database busy at {engine.url.render_as_string(hide_password=True)}: every "
                                       "connection this process may open is in use (AMPCI_DB_POOL_SIZE + "
                                       "AMPCI_DB_MAX_OVERFLOW); try again") from None


def ping(engine: Engine) -> str:
    """``SELECT 1`` over a new connection of ``engine`` (raising whatever connecting or the query
    raises, untranslated); the engine's URL with its password hidden."""
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT 1"))
    return engine.url.render_as_string(hide_password=True)


@contextmanager
def transaction(engine: Engine) -> Iterator[Connection]:
    """A connection inside one transaction: committed on success, rolled back on error.

    An exception raised while a statement is still in flight (a job's soft time limit or a signal
    arriving mid-query) propagates as itself: the connection, busy with a command it can neither
    finish nor roll back, has that command cancelled and is discarded from the pool instead of
    being rolled back (which would fail with "another command is already in progress" and hide
    the original exception)."""
    conn = connect(engine)
    try:
        with conn.begin():
            try:
                yield conn
            except BaseException:
                if statement_in_flight(conn):
                    discard_busy(conn)
                raise
    finally:
        conn.close()


def statement_in_flight(conn: Connection) -> bool:
    """Whether ``conn``'s driver connection is still executing a command (psycopg's ``ACTIVE``
    state); False for SQLite and for a connection already closed or invalidated."""
    if conn.invalidated or conn.closed:
        return False
    dbapi = conn.connection.dbapi_connection
    info = getattr(dbapi, "info", None)
    status = getattr(info, "transaction_status", None)
    return status is not None and getattr(status, "name", "") == "ACTIVE"


def discard_busy(conn: Connection) -> None:
    """Cancel the command ``conn`` is running (best effort: the server stops it) and invalidate the
    connection, so the pool opens a fresh one rather than reuse a busy one."""
    dbapi = conn.connection.dbapi_connection
    cancel = getattr(dbapi, "cancel", None)
    if callable(cancel):
        try:
            cancel()
        except Exception:  # noqa: BLE001 - the connection is being discarded whatever the cancel does
            pass
    conn.invalidate()
