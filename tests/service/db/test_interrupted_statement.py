"""A statement interrupted in flight (a job's soft time limit, a signal) on the real PostgreSQL.

Before the fix the exception that interrupted the statement was replaced by psycopg's "another command
is already in progress" (the rollback of a busy connection), so a soft time limit read as a database
error, and the busy connection went back to the pool.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from types import FrameType

import pytest
import sqlalchemy as sa

from service.db.engine import make_engine, transaction
from tests.conftest import fresh_pg_database
from tests.waiting import wait_until

pytestmark = pytest.mark.postgres


class Interrupted(Exception):
    """What the SIGALRM handler raises: a stand-in for Celery's SoftTimeLimitExceeded (an Exception)."""


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from fresh_pg_database()


def _raise(_sig: int, _frame: FrameType | None) -> None:
    raise Interrupted("soft time limit")


def _sleepers(engine: sa.Engine, tag: str) -> int:
    with transaction(engine) as conn:
        return int(conn.execute(sa.text(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE :q AND pid <> pg_backend_pid()"),
            {"q": f"%{tag}%"}).scalar_one())


def test_an_interrupted_statement_raises_the_interruption_and_leaves_no_busy_connection(pg_url: str) -> None:
    engine = make_engine(pg_url, pool_size=1, max_overflow=0)  # one connection: a busy one would be reused
    tag = "ampci_interrupt_probe"
    previous = signal.signal(signal.SIGALRM, _raise)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(Interrupted), transaction(engine) as conn:
            conn.execute(sa.text(f"SELECT pg_sleep(60) /* {tag} */"))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    with transaction(engine) as conn:  # the pool's one connection works at once
        assert conn.execute(sa.text("SELECT 41 + 1")).scalar_one() == 42
    wait_until(lambda: _sleepers(engine, tag) == 0, timeout=30, what="the interrupted query cancelled on the server")
    engine.dispose()


def test_an_exception_between_statements_keeps_the_connection(pg_url: str) -> None:
    engine = make_engine(pg_url, pool_size=1, max_overflow=0)
    with pytest.raises(Interrupted), transaction(engine) as conn:
        conn.execute(sa.text("SELECT 1"))
        first = conn.connection.dbapi_connection
        raise Interrupted("after the statement")
    with transaction(engine) as conn:  # rolled back normally: the same pooled connection serves again
        assert conn.connection.dbapi_connection is first
    engine.dispose()
