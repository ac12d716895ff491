"""The statements of a job's lifecycle writes (:class:`service.db.job_writes.JobWritesMixin`), built once.

SQLAlchemy statements for SQLite (cached per dialect and result columns), and plain SQL texts for
the PostgreSQL job bookkeeping, which psycopg prepares on first use on each connection.  Each
statement is atomic on its own: :func:`begin_job_statement` counts a delivery and returns the job
with its run in one ``UPDATE … RETURNING``; :func:`pg_complete_job` upserts the result (idempotent
on (run, cell)), ends the job and notifies :data:`JOB_END_CHANNEL` in one statement.  Column names
interpolated into SQL text come from the ``results`` table's own columns, never from input.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Protocol, cast

import sqlalchemy as sa

from service.db import models as m
from service.db.engine import DbSelect, DialectInsert
from service.db.queries import JobColumns
from service.db.runs import insert_for
from service.json_types import JsonObject
from service.vocabulary import FINAL_JOB_STATES

if TYPE_CHECKING:
    from psycopg import Pipeline
    from psycopg.rows import RowFactory

t_run, t_job, t_res = m.Run.__table__, m.Job.__table__, m.Result.__table__

class JobWithRun(JobColumns, Protocol):
    """A ``jobs`` row with its run's revision, options and status beside it (``run_*``: :func:`_run_columns`)."""

    @property
    def run_revision_sha(self) -> str: ...
    @property
    def run_meta(self) -> JsonObject | None: ...
    @property
    def run_status(self) -> str: ...


_FINAL = tuple(sorted(FINAL_JOB_STATES))
HAS_PENDING = sa.select(sa.exists().where(t_job.c.run_id == sa.bindparam("run_id"),
                                           t_job.c.status.in_(("queued", "running"))))
#: PostgreSQL channel on which ending a job (:meth:`~service.db.job_writes.JobWritesMixin.complete_job`) notifies its run id at commit.
JOB_END_CHANNEL = "ampci_job_end"


@functools.cache
def end_job_statement(postgresql: bool) -> sa.Update:
    """The job's final status (SQLite; PostgreSQL: :func:`pg_complete_job`)."""
    return (t_job.update().where(t_job.c.id == sa.bindparam("job_id"))
            .values(status=sa.bindparam("job_status"), finished_at=sa.bindparam("now")))


def _run_columns() -> list[sa.Label[object]]:
    """The run's revision, options and status beside a job row, as scalar subqueries labelled
    ``run_<name>`` (usable in RETURNING on PostgreSQL and SQLite alike)."""
    runs = t_run.alias("of_run")
    return [sa.select(getattr(runs.c, name)).where(runs.c.id == t_job.c.run_id).scalar_subquery()
            .label(f"run_{name}") for name in ("revision_sha", "meta", "status")]


@functools.cache
def begin_job_statement(postgresql: bool) -> sa.Update:
    """``UPDATE jobs … RETURNING`` the job and its run (SQLite; PostgreSQL: :data:`PG_BEGIN_JOB`)."""
    job_id: sa.BindParameter[int] = sa.bindparam("job_id")
    return (t_job.update().where(t_job.c.id == job_id, t_job.c.status.not_in(_FINAL))
            .values(attempts=t_job.c.attempts + 1, worker=sa.bindparam("worker"), started_at=sa.bindparam("now"),
                    status="running")
            .returning(*t_job.c, *_run_columns()))


@functools.cache
def job_with_run_statement() -> DbSelect:
    return sa.select(*t_job.c, *_run_columns()).where(t_job.c.id == sa.bindparam("job_id"))


# -- PostgreSQL job bookkeeping (JobWritesMixin._bookkeeping): plain SQL for psycopg, prepared on first use ------------
# (a worker runs these for every job: SQLAlchemy's statement execution cost 2-3 ms of CPU per job here,
# which a 2-core machine running 10-16 processes stretched to 10-30 ms of wall time)
_FINAL_SQL = ", ".join(f"'{s}'" for s in _FINAL)
_JOB_COLS_SQL = ", ".join(f"jobs.{c.name}" for c in t_job.c)
_RUN_COLS_SQL = ", ".join(f"(SELECT of_run.{n} FROM runs AS of_run WHERE of_run.id = jobs.run_id) AS run_{n}"
                          for n in ("revision_sha", "meta", "status"))
#: Count a delivery (params job_id, worker, now) and return the job and its run; a CTE of the same statement
#: turns a ``queued`` run ``running``.  No row: the job is unknown or already final.
PG_BEGIN_JOB = (
    "WITH run_started AS (UPDATE runs SET status = 'running' WHERE runs.id = (SELECT jobs.run_id FROM jobs "
    f"WHERE jobs.id = %(job_id)s AND jobs.status NOT IN ({_FINAL_SQL})) AND runs.status = 'queued') "
    "UPDATE jobs SET status = 'running', attempts = jobs.attempts + 1, worker = %(worker)s, started_at = %(now)s "
    f"WHERE jobs.id = %(job_id)s AND jobs.status NOT IN ({_FINAL_SQL}) RETURNING {_JOB_COLS_SQL}, {_RUN_COLS_SQL}")
PG_JOB_WITH_RUN = f"SELECT {_JOB_COLS_SQL}, {_RUN_COLS_SQL} FROM jobs WHERE jobs.id = %(job_id)s"
PG_HAS_PENDING = ("SELECT EXISTS (SELECT 1 FROM jobs WHERE jobs.run_id = %(run_id)s "
                   "AND jobs.status IN ('queued', 'running'))")


@functools.cache
def pg_complete_job(cols: tuple[str, ...]) -> str:
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
def job_row_factory() -> RowFactory[JobWithRun]:
    """Rows read by attribute, as SQLAlchemy rows are (:func:`~service.db.queries.job_info`): named tuples of the
    columns the bookkeeping statements return, which are a job's and its run's (:class:`JobWithRun`)."""
    from psycopg.rows import namedtuple_row

    return cast("RowFactory[JobWithRun]", namedtuple_row)


@functools.cache
def result_upsert(dialect: str, cols: tuple[str, ...]) -> DialectInsert:
    """The results upsert of :meth:`~service.db.job_writes.JobWritesMixin.complete_job` for these result columns (built once)."""
    ins = insert_for(dialect, t_res)
    return ins.on_conflict_do_update(
        index_elements=[t_res.c.run_id, t_res.c.model, t_res.c.dtype, t_res.c.policy, t_res.c.target],
        set_={k: getattr(ins.excluded, k) for k in (*cols, "job_id", "updated_at")})


def pipeline_sync(pipeline: Pipeline) -> None:
    """End the implicit transaction of the statements queued so far in ``pipeline`` (a Sync), without
    waiting for their results: in pipeline mode the statements up to a Sync are one transaction even in
    autocommit mode, and :meth:`psycopg.Pipeline.sync` would wait for the server (a round trip).  psycopg
    has no public call that only queues the Sync; where its internal one is missing (another psycopg
    version), this falls back to the waiting ``sync()``: one more round trip, the same semantics.
    ``tests/distributed/test_bookkeeping_cost.py`` checks that the statements after it run in a
    transaction of their own."""
    enqueue = getattr(pipeline, "_enqueue_sync", None)
    if callable(enqueue):
        enqueue()
    else:  # pragma: no cover - a psycopg without the internal call
        pipeline.sync()
