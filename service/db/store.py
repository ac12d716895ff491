"""The results store: the one API the scheduler, webhook, HTTP API, dashboard and CLI write and read through.

``Store.from_url(url)`` (or ``Store(engine)``) is safe to share between threads and to create in
several processes at once: every method runs in its own short transaction, and every write that
may race with another process (revision upsert, deduplicated run creation, result write, attempt
counting, webhook delivery) is a single atomic statement (``INSERT … ON CONFLICT`` /
``UPDATE … RETURNING``), on PostgreSQL and on SQLite alike.  Revision and run writes (single and
batch) live in :mod:`service.db.runs`, a job's lifecycle (delivery counting, result write, the
PostgreSQL job bookkeeping) in :mod:`service.db.job_writes`, webhook deliveries in
:mod:`service.db.deliveries`.

Errors: an unreachable database raises ``DatabaseUnavailableError`` (URL redacted, exit 3); an
unknown revision, run, job, model or regression id raises ``NotFoundError`` (exit 2); other bad
arguments raise ``UserError`` (exit 2).  The schema must be at head (``ampci db upgrade`` or
``Store.upgrade()``); ``Store.from_settings`` upgrades the embedded SQLite default by itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TypedDict

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from service.db import models as m
from service.db import verdicts
from service.db.deliveries import DELIVERY_STATES, DeliveriesMixin
from service.db.engine import DbRow, make_engine, transaction
from service.db.job_writes import JobWritesMixin
from service.db.queries import QueriesMixin, run_info
from service.db.records import RunInfo, RunSummary, utc
from service.db.result_queries import ResultQueriesMixin
from service.db.runs import RunWritesMixin, check_sha, dialect_insert
from service.errors import NotFoundError, UserError
from service.json_types import JsonObject
from service.vocabulary import AWAITING_APPROVAL, JOB_STATES, RUN_STATES, TRIGGERS

if TYPE_CHECKING:
    from service.regressions.thresholds import Thresholds
    from service.settings import Settings


t_run, t_job = m.Run.__table__, m.Job.__table__
t_res, t_reg, t_zoo = m.Result.__table__, m.Regression.__table__, m.ZooModel.__table__


def _now() -> datetime:
    return datetime.now(UTC)


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


class Store(RunWritesMixin, JobWritesMixin, QueriesMixin, ResultQueriesMixin, DeliveriesMixin):
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


__all__ = ["Store", "TRIGGERS", "RUN_STATES", "JOB_STATES", "DELIVERY_STATES", "run_info", "check_sha"]
