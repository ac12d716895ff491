"""A job's lifecycle writes in the store (mixed into :class:`service.db.store.Store`).

Adding a run's jobs, counting each delivery of a job to a worker (:meth:`JobWritesMixin.begin_job`,
:meth:`JobWritesMixin.start_attempt`), recording its result and ending it
(:meth:`JobWritesMixin.complete_job`, :meth:`JobWritesMixin.write_result`), forcing its status, and
waiting for a run's jobs to end.  Every method runs in its own short transaction and is safe under
concurrent callers, in several threads and processes: every write that may race with another
(attempt counting, result write) is a single atomic statement (``INSERT … ON CONFLICT`` /
``UPDATE … RETURNING``), on PostgreSQL and on SQLite alike; a result write is idempotent on
(run, model, dtype, policy, target), so a redelivered task updates the same row.  On PostgreSQL a
worker's per-job bookkeeping runs as plain prepared SQL on a second pool of autocommitted
connections with asynchronous commit (:meth:`JobWritesMixin._bookkeeping` says what that may lose,
and why nothing is lost for good).  The statements live in :mod:`service.db.job_statements`.

Errors: an unreachable database raises ``DatabaseUnavailableError``; an unknown run or job raises
``NotFoundError``; an unknown job status ``UserError``.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from service.db import models as m
from service.db.engine import DbRow, PgConnection, connect, make_engine, unavailable
from service.db.extract import result_columns
from service.db.job_statements import (
    HAS_PENDING,
    JOB_END_CHANNEL,
    PG_BEGIN_JOB,
    PG_HAS_PENDING,
    PG_JOB_WITH_RUN,
    JobWithRun,
    begin_job_statement,
    end_job_statement,
    job_row_factory,
    job_with_run_statement,
    pg_complete_job,
    pipeline_sync,
    result_upsert,
)
from service.db.queries import job_info
from service.db.records import Cell, JobInfo, JobStart, RunRef
from service.db.runs import check_cell, dialect_insert
from service.errors import DatabaseUnavailableError, NotFoundError, UserError
from service.json_types import JsonObject
from service.vocabulary import FINAL_JOB_STATES, JOB_STATES
from workers.result import JobResult

t_run, t_job = m.Run.__table__, m.Job.__table__
t_res, t_zoo = m.Result.__table__, m.ZooModel.__table__


class JobWritesMixin:
    """Job lifecycle writes; requires ``self.engine``, ``self.clock``, ``self.transaction()``, ``self.run_row``
    and the bookkeeping pool's fields (Store, which sets them in ``__init__``) and ``jobs`` (QueriesMixin, after
    this class in Store's bases)."""

    engine: Engine
    clock: Callable[[], datetime]
    _bookkeeping_engine: Engine | None  # PostgreSQL job bookkeeping (see _bookkeeping)
    _bookkeeping_pid: int
    _bookkeeping_lock: threading.Lock

    def transaction(self) -> AbstractContextManager[Connection]:  # pragma: no cover - provided by Store
        raise NotImplementedError

    if TYPE_CHECKING:
        def run_row(self, conn: Connection, run_id: int) -> DbRow: ...  # provided by Store

        def jobs(self, run_id: int) -> list[JobInfo]: ...  # provided by QueriesMixin

    def add_jobs(self, run_id: int, cells: Iterable[Cell]) -> list[JobInfo]:
        """Add ``queued`` jobs for cells the run does not have yet; returns all the run's jobs."""
        now = self.clock()
        with self.transaction() as conn:
            self.run_row(conn, run_id)
            rows = [{"run_id": run_id, "model": c[0], "dtype": c[1], "policy": c[2], "target": c[3],
                     "status": "queued", "attempts": 0, "queued_at": now}
                    for c in dict.fromkeys(check_cell(c) for c in cells)]
            if rows:
                ins = dialect_insert(conn, t_job)
                conn.execute(ins.on_conflict_do_nothing(
                    index_elements=[t_job.c.run_id, t_job.c.model, t_job.c.dtype, t_job.c.policy, t_job.c.target]),
                    rows)
        return self.jobs(run_id)

    def start_attempt(self, job_id: int, worker: str) -> int:
        """Atomically count one more delivery of a job to ``worker``; return the new attempt count.

        The job becomes ``running`` unless it is already ``done``/``crashed``/``cancelled`` (a
        redelivery of a finished job only counts).  Its run becomes ``running`` if it was queued.
        The caller marks the job ``crashed`` when the count exceeds its limit.
        """
        now = self.clock()
        with self.transaction() as conn:
            keep = t_job.c.status.in_(("done", "crashed", "cancelled"))
            row = conn.execute(
                t_job.update().where(t_job.c.id == job_id)
                .values(attempts=t_job.c.attempts + 1, worker=worker, started_at=now,
                        status=sa.case((keep, t_job.c.status), else_=sa.literal("running")))
                .returning(t_job.c.attempts, t_job.c.run_id)).first()
            if row is None:
                raise NotFoundError(f"no job with id {job_id}")
            conn.execute(t_run.update().where(t_run.c.id == row.run_id, t_run.c.status == "queued")
                         .values(status="running"))
            return int(row.attempts)

    def begin_job(self, job_id: int, worker: str) -> JobStart:
        """Start one delivery of a job: :meth:`start_attempt` plus the job and its run's revision and
        options: on PostgreSQL one autocommitted statement on a bookkeeping connection (see
        :meth:`_bookkeeping`), on SQLite one transaction (a second statement while the run is still
        ``queued``).

        A job already ``done``/``error``/``crashed``/``cancelled`` is left alone (``started`` False,
        nothing counted).  Otherwise ``attempts`` is incremented, the job becomes ``running`` and its
        run ``running`` if it was ``queued``.  An unknown job raises NotFoundError.
        """
        params = {"job_id": job_id, "worker": worker, "now": self.clock()}
        row: JobWithRun | None
        if self.engine.dialect.name == "postgresql":
            with self._bookkeeping() as pg:
                cur = pg.cursor(row_factory=job_row_factory())
                row = cur.execute(PG_BEGIN_JOB, params, prepare=True).fetchone()
                started = row is not None
                if row is None:  # unknown, or final already (a redelivery): read it, count nothing
                    row = cur.execute(PG_JOB_WITH_RUN, params, prepare=True).fetchone()
        else:
            with self.transaction() as conn:
                row = conn.execute(begin_job_statement(False), params).first()
                started = row is not None
                if row is None:
                    row = conn.execute(job_with_run_statement(), params).first()
                elif row.run_status == "queued":
                    conn.execute(t_run.update().where(t_run.c.id == row.run_id, t_run.c.status == "queued")
                                 .values(status="running"))
        if row is None:
            raise NotFoundError(f"no job with id {job_id}")
        return JobStart(job=job_info(row), run=RunRef(row.run_id, row.run_revision_sha, dict(row.run_meta or {})),
                        attempts=int(row.attempts), started=started)

    def complete_job(self, run: RunRef, job_id: int, result: JobResult, data: JsonObject | None = None) -> bool:
        """Record a job's result and end the job; return whether its run still has pending jobs.

        One transaction: the result upsert (idempotent on (run, cell), as :meth:`write_result`; the
        run's revision is ``run.revision_sha``; ``data`` is ``result.to_dict()`` when the caller has it) and
        the job's status (``crashed`` for a crashed result, else ``done``); on PostgreSQL one autocommitted
        statement on a bookkeeping connection (:meth:`_bookkeeping`) that also notifies
        :data:`JOB_END_CHANNEL`, on SQLite two.  Then, on the same connection after the commit, one read of
        whether any job of the run is still ``queued``/``running``: of workers finishing a run's last jobs at
        once, at least the last to commit sees none (finishing is idempotent).  On PostgreSQL the two are
        sent together in one round trip (a pipeline with a Sync between them, :func:`pipeline_sync`: the
        read is its own transaction, its snapshot taken after the write's commit).  The model zoo entry is
        refreshed when the run finishes (:meth:`finish_run`).
        """
        cols = result_columns(result, data)
        now = self.clock()
        row = {"run_id": run.id, "job_id": job_id, "revision_sha": run.revision_sha, "model": result.model,
               "dtype": result.dtype, "policy": result.policy, "target": result.target, "created_at": now,
               "updated_at": now, **cols}
        # the job's final status goes under its own key: ``status`` in ``row`` is the result's
        job = {"job_id": job_id, "now": now, "run_key": str(run.id),
               "job_status": "crashed" if result.status == "crashed" else "done"}
        if self.engine.dialect.name == "postgresql":
            row["data"] = json.dumps(row["data"])  # what SQLAlchemy's JSON type sends (cast to json in the SQL)
            with self._bookkeeping() as pg:
                with pg.pipeline() as pipeline:
                    pg.execute(pg_complete_job(tuple(cols)), {**{f"r_{k}": v for k, v in row.items()}, **job},
                               prepare=True)
                    pipeline_sync(pipeline)  # the write commits before the read's snapshot
                    cur = pg.execute(PG_HAS_PENDING, {"run_id": run.id}, prepare=True)
                got = cur.fetchone()
                return bool(got[0]) if got is not None else False
        conn = connect(self.engine)
        try:
            with conn.begin():
                conn.execute(result_upsert(conn.dialect.name, tuple(cols)), row)
                conn.execute(end_job_statement(False), job)
            return bool(conn.execute(HAS_PENDING, {"run_id": run.id}).scalar())
        finally:
            conn.close()

    @contextmanager
    def _bookkeeping(self) -> Iterator[PgConnection]:
        """A psycopg connection for a worker's per-job bookkeeping on PostgreSQL (:meth:`begin_job`,
        :meth:`complete_job`): from a second pool of this process (same size limits as the Store's,
        connections opened on demand: one per thread doing bookkeeping at once), in autocommit mode
        (one statement, one round trip, one transaction) and with ``synchronous_commit`` off.

        Asynchronous commit is what keeps the bookkeeping at a few milliseconds on a busy disk (one
        ``fdatasync`` costs 6-12 ms on the development machine, two per job were most of the time a
        job spent outside its work): a commit is visible to every other session at once, as before,
        and is flushed by the WAL writer within ``3 x wal_writer_delay`` (0.6 s by default) or by the
        next synchronous commit of any session, whichever comes first.  Only a crash of the
        PostgreSQL server (or of its machine) inside that window forgets a job's start or end, and
        then nothing is lost for good: a forgotten start leaves the job as it was while its Celery
        message is still unacknowledged (redelivered); a forgotten end leaves the job ``running`` or
        ``queued`` without a message, which :mod:`service.orchestration.reconcile` re-sends after the
        lease, as for a worker that died.  Everything else the Store writes (run creation, a run's
        finish, findings, deliveries) stays on :attr:`engine`, synchronously committed; finishing a
        run flushes the WAL, so the results of a finished run are durable.  Statement texts are
        prepared on first use (parsed and planned once per connection).  A connection that fails
        is discarded and the call raises :class:`~service.errors.DatabaseUnavailableError`.
        """
        import psycopg

        engine = self._bookkeeping_pool()
        try:
            fairy = engine.raw_connection()
        except sa.exc.DBAPIError as exc:
            raise unavailable(engine, exc) from None
        except sa.exc.TimeoutError:
            raise DatabaseUnavailableError(f"database busy at {engine.url.render_as_string(hide_password=True)}: "
                                           "every bookkeeping connection this process may open is in use "
                                           "(AMPCI_DB_POOL_SIZE + AMPCI_DB_MAX_OVERFLOW); try again") from None
        try:
            pg = cast("PgConnection", fairy.driver_connection)  # a PostgreSQL engine's driver
            if fairy.info.get("ampci_bookkeeping") is not pg:  # set up once per connection
                pg.autocommit = True
                pg.execute("SET synchronous_commit TO off")
                fairy.info["ampci_bookkeeping"] = pg
            yield pg
        except psycopg.OperationalError as exc:  # the connection or the server went away
            fairy.invalidate(exc)
            raise unavailable(engine, exc) from None
        finally:
            fairy.close()

    def _bookkeeping_pool(self) -> Engine:
        """The engine of :meth:`_bookkeeping` for this process (a forked child makes its own)."""
        with self._bookkeeping_lock:
            engine, pid = self._bookkeeping_engine, os.getpid()
            if engine is None or self._bookkeeping_pid != pid:
                if engine is not None:  # inherited across a fork: leave the parent's sockets alone
                    engine.dispose(close=False)
                pool = self.engine.pool
                engine = make_engine(self.engine.url.render_as_string(hide_password=False),
                                     pool_size=pool.size() if hasattr(pool, "size") else 5,
                                     max_overflow=getattr(pool, "_max_overflow", 10))
                self._bookkeeping_engine, self._bookkeeping_pid = engine, pid
            return engine

    @contextmanager
    def job_end_listener(self, run_id: int) -> Iterator[Callable[[float], bool] | None]:
        """Yield ``wait(timeout) -> bool``: block until a job of ``run_id`` ends (True, as
        :meth:`complete_job` notifies on PostgreSQL) or ``timeout`` seconds pass (False).  Yields None
        on SQLite (no notifications: the caller polls).  Holds one dedicated connection meanwhile."""
        if self.engine.dialect.name != "postgresql":
            yield None
            return
        import psycopg

        url = self.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        try:
            listener = psycopg.connect(url, autocommit=True)
        except psycopg.Error:  # waiting still works by polling
            yield None
            return
        try:
            listener.execute(f"LISTEN {JOB_END_CHANNEL}")
            key = str(run_id)

            def wait(timeout: float) -> bool:
                return any(n.payload == key for n in listener.notifies(timeout=max(0.0, timeout)))

            yield wait
        finally:
            listener.close()

    def has_pending_jobs(self, run_id: int) -> bool:
        """Whether any job of the run is ``queued`` or ``running`` (one indexed read)."""
        with connect(self.engine) as conn:
            return bool(conn.execute(HAS_PENDING, {"run_id": run_id}).scalar())

    def mark_job(self, job_id: int, status: str, error: str | None = None) -> JobInfo:
        """Set a job's status (one of JOB_STATES); terminal states stamp ``finished_at``."""
        if status not in JOB_STATES:
            raise UserError(f"unknown job status {status!r}; expected one of {', '.join(JOB_STATES)}")
        values: dict[str, object] = {"status": status, "error": error}
        if status in FINAL_JOB_STATES:
            values["finished_at"] = self.clock()
        with self.transaction() as conn:
            row = conn.execute(t_job.update().where(t_job.c.id == job_id).values(**values)
                               .returning(*t_job.c)).first()
            if row is None:
                raise NotFoundError(f"no job with id {job_id}")
            return job_info(row)

    # -- results --------------------------------------------------------------------------------
    def write_result(self, run_id: int, result: JobResult, job_id: int | None = None) -> int:
        """Store ``result`` for its cell in ``run_id``; return the result id.

        Idempotent on (run, model, dtype, policy, target): a repeated write (a redelivered task)
        updates the same row in place, also when two writers race.  The cell's job (found by cell
        when ``job_id`` is None) is marked ``done`` (``crashed`` for a crashed result) and the model
        is recorded in the zoo table.  The run's own revision is authoritative.
        """
        cols = result_columns(result)
        now = self.clock()
        with self.transaction() as conn:
            run = self.run_row(conn, run_id)
            if job_id is None:
                job_id = conn.execute(sa.select(t_job.c.id).where(
                    t_job.c.run_id == run_id, t_job.c.model == result.model, t_job.c.dtype == result.dtype,
                    t_job.c.policy == result.policy, t_job.c.target == result.target)).scalar()
            ins = dialect_insert(conn, t_res).values(
                run_id=run_id, job_id=job_id, revision_sha=run.revision_sha, model=result.model,
                dtype=result.dtype, policy=result.policy, target=result.target, created_at=now,
                updated_at=now, **cols)
            update = {k: getattr(ins.excluded, k) for k in (*cols, "job_id", "updated_at")}
            rid = conn.execute(ins.on_conflict_do_update(
                index_elements=[t_res.c.run_id, t_res.c.model, t_res.c.dtype, t_res.c.policy, t_res.c.target],
                set_=update).returning(t_res.c.id)).scalar_one()
            if job_id is not None:
                conn.execute(t_job.update().where(t_job.c.id == job_id).values(
                    status="crashed" if result.status == "crashed" else "done", finished_at=now))
            zins = dialect_insert(conn, t_zoo).values(name=result.model, sha256=result.model_sha256, meta={},
                                                      first_seen_at=now, last_seen_at=now)
            conn.execute(zins.on_conflict_do_update(index_elements=[t_zoo.c.name], set_={
                "last_seen_at": zins.excluded.last_seen_at,
                "sha256": sa.func.coalesce(zins.excluded.sha256, t_zoo.c.sha256)}))
            return int(rid)
