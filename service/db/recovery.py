"""Queries of recovery: jobs a broker may have lost, jobs whose lease ran out, and the owners of ``local`` runs.

Small keyword-only functions over a connection, called inside the caller's transaction by
:mod:`service.orchestration.reconcile` (which decides what is lost and re-sends it) and
:mod:`service.orchestration.orphans` (which decides whose process is gone and resumes its runs).
Nothing here decides: each function reads or writes exactly what its name says.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from service.db import models as m
from service.db.engine import DbSelect
from service.db.queries import job_info
from service.db.records import JobInfo
from service.json_types import JsonObject, JsonValue

t_job, t_run = m.Job.__table__, m.Run.__table__
_UNFINISHED_RUN = ("queued", "running")


def _jobs_in_unfinished_runs(dispatch: str) -> DbSelect:
    return (sa.select(*t_job.c, t_run.c.revision_sha.label("run_revision"))
            .join(t_run, t_run.c.id == t_job.c.run_id)
            .where(t_run.c.status.in_(_UNFINISHED_RUN), t_run.c.finished_at.is_(None), t_run.c.dispatch == dispatch)
            .order_by(t_job.c.id))


def undelivered_jobs(conn: Connection, *, queued_before: datetime, dispatch: str) -> list[tuple[JobInfo, str]]:
    """(job, its run's revision) for every job ``queued`` with no attempt since before ``queued_before``,
    in an unfinished, uncancelled run dispatched by ``dispatch``; oldest first."""
    q = _jobs_in_unfinished_runs(dispatch).where(t_job.c.status == "queued", t_job.c.attempts == 0,
                                                 t_job.c.queued_at <= queued_before)
    return [(job_info(r), r.run_revision) for r in conn.execute(q).all()]


def running_jobs_started_before(conn: Connection, *, started_before: datetime,
                                dispatch: str) -> list[tuple[JobInfo, str]]:
    """(job, its run's revision) for every job ``running`` whose last delivery started before
    ``started_before``, in an unfinished, uncancelled run dispatched by ``dispatch``; oldest first."""
    q = _jobs_in_unfinished_runs(dispatch).where(t_job.c.status == "running", t_job.c.started_at.is_not(None),
                                                 t_job.c.started_at <= started_before)
    return [(job_info(r), r.run_revision) for r in conn.execute(q).all()]


# -- owners of local runs ---------------------------------------------------------------------------
def run_owner(conn: Connection, *, run_id: int, lock: bool = False) -> JsonValue:
    """The stored ``runs.local_owner`` of run ``run_id`` as it is (None when unset or no such run);
    with ``lock`` the row stays locked until ``conn``'s transaction ends (PostgreSQL ``FOR UPDATE``)."""
    q = sa.select(t_run.c.local_owner).where(t_run.c.id == run_id)
    if lock and conn.dialect.name == "postgresql":
        q = q.with_for_update()
    return conn.execute(q).scalar_one_or_none()


def run_owners(conn: Connection, *, run_ids: Iterable[int]) -> dict[int, JsonValue]:
    """Run id -> its stored ``local_owner`` as it is, for the existing runs of ``run_ids``."""
    rows = conn.execute(sa.select(t_run.c.id, t_run.c.local_owner).where(t_run.c.id.in_(list(run_ids)))).all()
    return {r.id: r.local_owner for r in rows}


def set_run_owner(conn: Connection, *, run_ids: Iterable[int], owner: JsonObject | None) -> None:
    """Record ``owner`` (None or ``{}``: released) as the owner of the runs ``run_ids``."""
    conn.execute(t_run.update().where(t_run.c.id.in_(list(run_ids))).values(local_owner=owner or None))


def requeue_running_job(conn: Connection, *, job_id: int, count_attempt: bool) -> bool:
    """Job ``job_id`` from ``running`` back to ``queued`` (worker and start cleared), its attempt taken
    back unless ``count_attempt``; True if it was running."""
    values: dict[str, object] = {"status": "queued", "worker": None, "started_at": None}
    if not count_attempt:
        values["attempts"] = sa.case((t_job.c.attempts > 0, t_job.c.attempts - 1), else_=0)
    done = conn.execute(t_job.update().where(t_job.c.id == job_id, t_job.c.status == "running").values(**values))
    return bool(done.rowcount)


@dataclass(frozen=True)
class PendingLocalRun:
    """A ``local`` run with queued or running jobs, and its stored owner as it is."""

    run_id: int
    owner: JsonValue
    queued: int
    running: int


def local_runs_with_pending_jobs(conn: Connection) -> list[PendingLocalRun]:
    """Every ``local`` run with queued or running jobs, by id, with its job counts and stored owner."""
    counts: dict[int, dict[str, int]] = {}
    for run_id, status, n in conn.execute(
            sa.select(t_job.c.run_id, t_job.c.status, sa.func.count().label("n"))
            .where(t_job.c.status.in_(("queued", "running"))).group_by(t_job.c.run_id, t_job.c.status)):
        counts.setdefault(run_id, {})[status] = int(n)
    if not counts:
        return []
    rows = conn.execute(sa.select(t_run.c.id, t_run.c.local_owner)
                        .where(t_run.c.id.in_(sorted(counts)), t_run.c.dispatch == "local")
                        .order_by(t_run.c.id)).all()
    return [PendingLocalRun(r.id, r.local_owner, counts[r.id].get("queued", 0), counts[r.id].get("running", 0))
            for r in rows]
