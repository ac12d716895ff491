"""The results store: the one API the scheduler, webhook, HTTP API, dashboard and CLI write and read through.

``Store.from_url(url)`` (or ``Store(engine)``) is safe to share between threads and to create in
several processes at once: every method runs in its own short transaction, and every write that
may race with another process (revision upsert, deduplicated run creation, result write, attempt
counting, webhook delivery) is a single atomic statement (``INSERT … ON CONFLICT`` /
``UPDATE … RETURNING``), on PostgreSQL and on SQLite alike.  Revision and run writes (single and
batch) live in :mod:`service.db.runs`, webhook deliveries in :mod:`service.db.deliveries`.

Errors: an unreachable database raises ``DatabaseUnavailableError`` (URL redacted, exit 3); an
unknown revision, run, job, model or regression id raises ``NotFoundError`` (exit 2); other bad
arguments raise ``UserError`` (exit 2).  The schema must be at head (``ampci db upgrade`` or
``Store.upgrade()``); ``Store.from_settings`` upgrades the embedded SQLite default by itself.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol, TypedDict, cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from service.db import models as m
from service.db import verdicts
from service.db.deliveries import DELIVERY_STATES, DeliveriesMixin
from service.db.engine import (
    DbRow,
    DbSelect,
    DialectInsert,
    PgConnection,
    connect,
    make_engine,
    transaction,
    unavailable,
)
from service.db.extract import result_columns
from service.db.queries import JobColumns, QueriesMixin, job_info, run_info
from service.db.records import (
    Cell,
    JobInfo,
    JobStart,
    RunInfo,
    RunRef,
    RunSummary,
    utc,
)
from service.db.runs import (
    RunWritesMixin,
    check_cell,
    check_sha,
    dialect_insert,
    insert_for,
)
from service.errors import DatabaseUnavailableError, NotFoundError, UserError
from service.json_types import JsonObject
from service.vocabulary import AWAITING_APPROVAL, FINAL_JOB_STATES, JOB_STATES, RUN_STATES, TRIGGERS
from workers.result import JobResult

if TYPE_CHECKING:
    from psycopg.rows import RowFactory

    from service.regressions.thresholds import Thresholds
    from service.settings import Settings


t_rev, t_par, t_run, t_job = m.Revision.__table__, m.RevisionParent.__table__, m.Run.__table__, m.Job.__table__
t_res, t_reg, t_zoo = m.Result.__table__, m.Regression.__table__, m.ZooModel.__table__


def _now() -> datetime:
    return datetime.now(UTC)


class JobWithRun(JobColumns, Protocol):
    """A ``jobs`` row with its run's revision, options and status beside it (``run_*``: :func:`_run_columns`)."""

    @property
    def run_revision_sha(self) -> str: ...
    @property
    def run_meta(self) -> JsonObject | None: ...
    @property
    def run_status(self) -> str: ...


class ZooModel(TypedDict):
    """A model zoo entry as :meth:`Store.zoo_models` lists it (the ``zoo_models`` row, times in UTC)."""

    name: str
    sha256: str | None
    source: str | None
    meta: JsonObject
    first_seen_at: datetime
    last_seen_at: datetime


def thresholds_from_settings(settings: Settings) -> Thresholds | None:
    """Regression thresholds from ``AMPCI_THRESHOLDS_FILE`` (JSON/YAML), or None for the built-in ones."""
    if not settings.thresholds_file:
        return None
    from service.regressions.thresholds import Thresholds as _Thresholds

    return _Thresholds.load(settings.thresholds_file)


class Store(RunWritesMixin, QueriesMixin, DeliveriesMixin):
    """Results store over one SQLAlchemy engine.  See the module docstring for guarantees."""

    def __init__(self, engine: Engine, clock: Callable[[], datetime] = _now,
                 thresholds: Thresholds | None = None, run_dispatch: str = "broker") -> None:
        self.engine = engine
        self.clock = clock
        self.thresholds = thresholds  # default rule knobs for detect_regressions (None: built-in)
        self.run_dispatch = run_dispatch  # runs.dispatch of runs created without one (RunWritesMixin)
        self._bookkeeping_engine: Engine | None = None  # PostgreSQL job bookkeeping (see _bookkeeping)
        self._bookkeeping_pid = 0
        self._bookkeeping_lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, clock: Callable[[], datetime] = _now,
                 thresholds: Thresholds | None = None, run_dispatch: str = "broker") -> Store:
        """A Store for ``url`` (no connection is made until the first call)."""
        return cls(make_engine(url), clock=clock, thresholds=thresholds, run_dispatch=run_dispatch)

    @classmethod
    def from_settings(cls, settings: Settings) -> Store:
        """The Store of ``settings.effective_database_url``; the embedded SQLite default is upgraded to head.
        Runs it creates without an explicit dispatch are ``local`` in embedded mode, else ``broker``."""
        url = settings.effective_database_url
        store = cls.from_url(url, run_dispatch="local" if settings.embedded else "broker")
        store.thresholds = thresholds_from_settings(settings)
        if not settings.database_url:
            store.upgrade()
        return store

    def upgrade(self) -> None:
        """Bring the schema to head (idempotent; serialised across processes on PostgreSQL)."""
        from service.db.migrate import upgrade

        upgrade(self.engine.url.render_as_string(hide_password=False))

    def dispose(self) -> None:
        """Close pooled connections (call before forking or at exit)."""
        self.engine.dispose()
        if self._bookkeeping_engine is not None:
            self._bookkeeping_engine.dispose()
            self._bookkeeping_engine = None

    def transaction(self) -> AbstractContextManager[Connection]:
        """A connection in one transaction (committed on success, rolled back on error), for the
        methods taking ``conn=`` (e.g. :meth:`upsert_revisions` and :meth:`create_runs` together)."""
        return transaction(self.engine)

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
                cur = pg.cursor(row_factory=_namedtuple_row())
                row = cur.execute(_PG_BEGIN_JOB, params, prepare=True).fetchone()
                started = row is not None
                if row is None:  # unknown, or final already (a redelivery): read it, count nothing
                    row = cur.execute(_PG_JOB_WITH_RUN, params, prepare=True).fetchone()
        else:
            with self.transaction() as conn:
                row = conn.execute(_begin_job_statement(False), params).first()
                started = row is not None
                if row is None:
                    row = conn.execute(_job_with_run_statement(), params).first()
                elif row.run_status == "queued":
                    conn.execute(t_run.update().where(t_run.c.id == row.run_id, t_run.c.status == "queued")
                                 .values(status="running"))
        if row is None:
            raise NotFoundError(f"no job with id {job_id}")
        return JobStart(job=job_info(row), run=RunRef(row.run_id, row.run_revision_sha, dict(row.run_meta or {})),
                        attempts=int(row.attempts), started=started)

    def complete_job(self, run: RunRef, job_id: int, result: JobResult) -> bool:
        """Record a job's result and end the job; return whether its run still has pending jobs.

        One transaction: the result upsert (idempotent on (run, cell), as :meth:`write_result`; the
        run's revision is ``run.revision_sha``) and the job's status (``crashed`` for a crashed
        result, else ``done``); on PostgreSQL one autocommitted statement on a bookkeeping connection
        (:meth:`_bookkeeping`) that also notifies :data:`JOB_END_CHANNEL`, on SQLite two.  Then, on the
        same connection after the commit, one read of whether any job of the run is still
        ``queued``/``running``: of workers finishing a run's last jobs at once, at least the last to
        commit sees none (finishing is idempotent).  The model zoo entry is refreshed when the run
        finishes (:meth:`finish_run`).
        """
        cols = result_columns(result)
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
                pg.execute(_pg_complete_job(tuple(cols)), {**{f"r_{k}": v for k, v in row.items()}, **job},
                           prepare=True)
                got = pg.execute(_PG_HAS_PENDING, {"run_id": run.id}, prepare=True).fetchone()
                return bool(got[0]) if got is not None else False
        conn = connect(self.engine)
        try:
            with conn.begin():
                conn.execute(_result_upsert(conn.dialect.name, tuple(cols)), row)
                conn.execute(_end_job_statement(False), job)
            return bool(conn.execute(_HAS_PENDING, {"run_id": run.id}).scalar())
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
            return bool(conn.execute(_HAS_PENDING, {"run_id": run_id}).scalar())

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

    def finish_run(self, run_id: int) -> RunInfo:
        """Derive the run's status from its jobs and store it.

        Any job queued/running: ``queued`` (none started) or ``running``, no finish time.
        Otherwise (finish time stamped): all ``done`` → ``complete``; all ``cancelled`` →
        ``cancelled``; none ``done`` → ``failed``; else ``partial``.  A run without jobs is
        ``complete``.  A run awaiting approval is left as it is (it has no jobs yet).  Idempotent.
        """
        with self.transaction() as conn:
            row = self.run_row(conn, run_id)
            if row.status == AWAITING_APPROVAL:
                return run_info(row)  # no jobs until approved: nothing to derive
            counts: dict[str, int] = dict(conn.execute(sa.select(t_job.c.status, sa.func.count()).where(
                t_job.c.run_id == run_id).group_by(t_job.c.status)).all())
            total = sum(counts.values())
            pending = counts.get("queued", 0) + counts.get("running", 0)
            finished_at = None
            if pending:
                status = "queued" if counts.get("queued", 0) == total else "running"
            else:
                finished_at = self.clock()
                done = counts.get("done", 0)
                if done == total:
                    status = "complete"
                elif counts.get("cancelled", 0) == total:
                    status = "cancelled"
                else:
                    status = "failed" if done == 0 else "partial"
            conn.execute(t_run.update().where(t_run.c.id == run_id)
                         .values(status=status, finished_at=finished_at))
            if finished_at is not None:
                self._record_run_models(conn, run_id, finished_at)
        return self.get_run(run_id)

    def _record_run_models(self, conn: Connection, run_id: int, now: datetime) -> None:
        """The models of a finished run's results into the zoo table (once per run, not per job)."""
        seen = conn.execute(sa.select(t_res.c.model, sa.func.max(t_res.c.model_sha256))
                            .where(t_res.c.run_id == run_id).group_by(t_res.c.model)).all()
        if seen:
            zins = dialect_insert(conn, t_zoo)
            conn.execute(zins.on_conflict_do_update(index_elements=[t_zoo.c.name], set_={
                "last_seen_at": zins.excluded.last_seen_at,
                "sha256": sa.func.coalesce(zins.excluded.sha256, t_zoo.c.sha256)}),
                [{"name": name, "sha256": sha, "meta": {}, "first_seen_at": now, "last_seen_at": now}
                 for name, sha in seen])

    def record_verdict(self, run_id: int, verdict: JsonObject | None, judgement: JsonObject | None = None) -> None:
        """Store run ``run_id``'s verdict in brief (``runs.verdict``: what the lists of runs show) and whole
        (``runs.judgement``: what every view of the run rebuilds; :mod:`service.db.verdicts`); the caller decides
        it (:func:`service.orchestration.judge.record_verdict`).  NotFoundError for an unknown run."""
        with self.transaction() as conn:
            self.run_row(conn, run_id)
            verdicts.record(conn, run_id=run_id, brief=verdict, judgement=judgement)

    def set_run_status(self, run_id: int, status: str) -> RunInfo:
        """Force a run status (e.g. ``cancelled``); prefer :meth:`finish_run` otherwise."""
        if status not in RUN_STATES:
            raise UserError(f"unknown run status {status!r}; expected one of {', '.join(RUN_STATES)}")
        with self.transaction() as conn:
            self.run_row(conn, run_id)
            conn.execute(t_run.update().where(t_run.c.id == run_id).values(status=status))
        return self.get_run(run_id)

    def run_summary(self, run_id: int) -> RunSummary:
        """Counts of a run's jobs, results and findings (regressions counted unless resolved/false positive)."""
        with self.transaction() as conn:
            run = self.run_row(conn, run_id)
            jobs: dict[str, int] = dict(conn.execute(sa.select(t_job.c.status, sa.func.count()).where(
                t_job.c.run_id == run_id).group_by(t_job.c.status)).all())
            res: dict[str, int] = dict(conn.execute(sa.select(t_res.c.status, sa.func.count()).where(
                t_res.c.run_id == run_id).group_by(t_res.c.status)).all())
            found = conn.execute(sa.select(t_reg.c.category, t_reg.c.kind, sa.func.count()).where(
                t_reg.c.run_id == run_id, t_reg.c.state.in_(("open", "acknowledged")))
                .group_by(t_reg.c.category, t_reg.c.kind)).all()
            cells = max(sum(jobs.values()), sum(res.values()))
        regs = {k: n for c, k, n in found if c == "regression"}
        return RunSummary(run_id=run_id, status=run.status, cells=cells, job_status=jobs, result_status=res,
                          regressions=regs, improvements=sum(n for c, _, n in found if c == "improvement"),
                          flaky=sum(n for c, _, n in found if c == "flaky"))

    # -- model zoo (webhook deliveries: service.db.deliveries) ------------------------------------
    def record_model(self, name: str, sha256: str | None = None, source: str | None = None,
                     meta: JsonObject | None = None) -> None:
        """Record (or refresh) a model zoo entry seen by a sweep."""
        now = self.clock()
        with self.transaction() as conn:
            ins = dialect_insert(conn, t_zoo).values(name=name, sha256=sha256, source=source, meta=meta or {},
                                                     first_seen_at=now, last_seen_at=now)
            conn.execute(ins.on_conflict_do_update(index_elements=[t_zoo.c.name], set_={
                "last_seen_at": now, "sha256": sa.func.coalesce(ins.excluded.sha256, t_zoo.c.sha256),
                "source": sa.func.coalesce(ins.excluded.source, t_zoo.c.source)}))

    def zoo_models(self) -> list[ZooModel]:
        """All model zoo entries seen, by name."""
        with self.transaction() as conn:
            rows = conn.execute(sa.select(t_zoo).order_by(t_zoo.c.name)).mappings().all()
        return [ZooModel(name=r["name"], sha256=r["sha256"], source=r["source"], meta=r["meta"],
                         first_seen_at=utc(r["first_seen_at"]), last_seen_at=utc(r["last_seen_at"])) for r in rows]

    # -- helpers --------------------------------------------------------------------------------
    def run_row(self, conn: Connection, run_id: int) -> DbRow:
        row = conn.execute(sa.select(t_run).where(t_run.c.id == run_id)).first()
        if row is None:
            raise NotFoundError(f"no run with id {run_id}")
        return row


_FINAL = tuple(sorted(FINAL_JOB_STATES))
_HAS_PENDING = sa.select(sa.exists().where(t_job.c.run_id == sa.bindparam("run_id"),
                                           t_job.c.status.in_(("queued", "running"))))
#: PostgreSQL channel on which ending a job (:meth:`Store.complete_job`) notifies its run id at commit.
JOB_END_CHANNEL = "ampci_job_end"


@functools.cache
def _end_job_statement(postgresql: bool) -> sa.Update:
    """The job's final status (SQLite; PostgreSQL: :func:`_pg_complete_job`)."""
    return (t_job.update().where(t_job.c.id == sa.bindparam("job_id"))
            .values(status=sa.bindparam("job_status"), finished_at=sa.bindparam("now")))


def _run_columns() -> list[sa.Label[object]]:
    """The run's revision, options and status beside a job row, as scalar subqueries labelled
    ``run_<name>`` (usable in RETURNING on PostgreSQL and SQLite alike)."""
    runs = t_run.alias("of_run")
    return [sa.select(getattr(runs.c, name)).where(runs.c.id == t_job.c.run_id).scalar_subquery()
            .label(f"run_{name}") for name in ("revision_sha", "meta", "status")]


@functools.cache
def _begin_job_statement(postgresql: bool) -> sa.Update:
    """``UPDATE jobs … RETURNING`` the job and its run (SQLite; PostgreSQL: :data:`_PG_BEGIN_JOB`)."""
    job_id: sa.BindParameter[int] = sa.bindparam("job_id")
    return (t_job.update().where(t_job.c.id == job_id, t_job.c.status.not_in(_FINAL))
            .values(attempts=t_job.c.attempts + 1, worker=sa.bindparam("worker"), started_at=sa.bindparam("now"),
                    status="running")
            .returning(*t_job.c, *_run_columns()))


@functools.cache
def _job_with_run_statement() -> DbSelect:
    return sa.select(*t_job.c, *_run_columns()).where(t_job.c.id == sa.bindparam("job_id"))


# -- PostgreSQL job bookkeeping (Store._bookkeeping): plain SQL for psycopg, prepared on first use ------------
# (a worker runs these for every job: SQLAlchemy's statement execution cost 2-3 ms of CPU per job here,
# which a 2-core machine running 10-16 processes stretched to 10-30 ms of wall time)
_FINAL_SQL = ", ".join(f"'{s}'" for s in _FINAL)
_JOB_COLS_SQL = ", ".join(f"jobs.{c.name}" for c in t_job.c)
_RUN_COLS_SQL = ", ".join(f"(SELECT of_run.{n} FROM runs AS of_run WHERE of_run.id = jobs.run_id) AS run_{n}"
                          for n in ("revision_sha", "meta", "status"))
#: Count a delivery (params job_id, worker, now) and return the job and its run; a CTE of the same statement
#: turns a ``queued`` run ``running``.  No row: the job is unknown or already final.
_PG_BEGIN_JOB = (
    "WITH run_started AS (UPDATE runs SET status = 'running' WHERE runs.id = (SELECT jobs.run_id FROM jobs "
    f"WHERE jobs.id = %(job_id)s AND jobs.status NOT IN ({_FINAL_SQL})) AND runs.status = 'queued') "
    "UPDATE jobs SET status = 'running', attempts = jobs.attempts + 1, worker = %(worker)s, started_at = %(now)s "
    f"WHERE jobs.id = %(job_id)s AND jobs.status NOT IN ({_FINAL_SQL}) RETURNING {_JOB_COLS_SQL}, {_RUN_COLS_SQL}")
_PG_JOB_WITH_RUN = f"SELECT {_JOB_COLS_SQL}, {_RUN_COLS_SQL} FROM jobs WHERE jobs.id = %(job_id)s"
_PG_HAS_PENDING = ("SELECT EXISTS (SELECT 1 FROM jobs WHERE jobs.run_id = %(run_id)s "
                   "AND jobs.status IN ('queued', 'running'))")


@functools.cache
def _pg_complete_job(cols: tuple[str, ...]) -> str:
    """The result upsert (a CTE) and the job's final status in one statement, atomic on its own; the same
    statement notifies :data:`JOB_END_CHANNEL` with the run id (delivered at commit, so a waiter wakes at
    once instead of sleeping between polls).  Params: the result row's columns prefixed ``r_`` (``r_data``
    JSON text), job_id, now, job_status, run_key."""
    names = ("run_id", "job_id", "revision_sha", "model", "dtype", "policy", "target", "created_at", "updated_at",
             *cols)
    for name in names:
        if name not in t_res.c:  # the names are ours (result_columns), never user input; keep it that way
            raise RuntimeError(f"results has no column {name!r}")
    values = ", ".join(f"%(r_{k})s::json" if k == "data" else f"%(r_{k})s" for k in names)
    update = ", ".join(f"{k} = excluded.{k}" for k in (*cols, "job_id", "updated_at"))
    return (f"WITH stored AS (INSERT INTO results ({', '.join(names)}) VALUES ({values}) "
            f"ON CONFLICT (run_id, model, dtype, policy, target) DO UPDATE SET {update} RETURNING results.id) "
            "UPDATE jobs SET status = %(job_status)s, finished_at = %(now)s WHERE jobs.id = %(job_id)s "
            f"AND (SELECT pg_notify('{JOB_END_CHANNEL}', %(run_key)s)) IS NOT NULL")


@functools.cache
def _namedtuple_row() -> RowFactory[JobWithRun]:
    """Rows read by attribute, as SQLAlchemy rows are (:func:`~service.db.queries.job_info`): named tuples of the
    columns the bookkeeping statements return, which are a job's and its run's (:class:`JobWithRun`)."""
    from psycopg.rows import namedtuple_row

    return cast("RowFactory[JobWithRun]", namedtuple_row)


@functools.cache
def _result_upsert(dialect: str, cols: tuple[str, ...]) -> DialectInsert:
    """The results upsert of :meth:`Store.complete_job` for these result columns (built once)."""
    ins = insert_for(dialect, t_res)
    return ins.on_conflict_do_update(
        index_elements=[t_res.c.run_id, t_res.c.model, t_res.c.dtype, t_res.c.policy, t_res.c.target],
        set_={k: getattr(ins.excluded, k) for k in (*cols, "job_id", "updated_at")})


__all__ = ["Store", "TRIGGERS", "RUN_STATES", "JOB_STATES", "DELIVERY_STATES", "run_info", "check_sha"]
