"""The results store: the one API the scheduler, webhook, HTTP API, dashboard and CLI write and read through.

``Store.from_url(url)`` (or ``Store(engine)``) is safe to share between threads and to create in
several processes at once: every method runs in its own short transaction, and every write that
may race with another process (revision upsert, deduplicated run creation, result write, attempt
counting, webhook delivery) is a single atomic statement (``INSERT … ON CONFLICT`` /
``UPDATE … RETURNING``), on PostgreSQL and on SQLite alike.

Errors: an unreachable database raises ``DatabaseUnavailableError`` (URL redacted, exit 3); an
unknown revision, run, job, model or regression id raises ``NotFoundError`` (exit 2); other bad
arguments raise ``UserError`` (exit 2).  The schema must be at head (``ampci db upgrade`` or
``Store.upgrade()``); ``Store.from_settings`` upgrades the embedded SQLite default by itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from service.db import models as m
from service.db.deliveries import DELIVERY_STATES, DeliveriesMixin
from service.db.engine import make_engine, transaction
from service.db.extract import result_columns
from service.db.queries import QueriesMixin, job_info, run_info
from service.db.records import (
    Cell,
    JobInfo,
    NewRun,
    RevisionInfo,
    RevisionRow,
    RunInfo,
    RunSpec,
    RunSummary,
    utc,
)
from service.errors import NotFoundError, UserError
from workers.result import JobResult

if TYPE_CHECKING:
    from service.regressions.detect import Regression
    from service.regressions.thresholds import Thresholds
    from service.settings import Settings

TRIGGERS = ("push", "pull_request", "nightly", "manual", "bisect")
RUN_STATES = ("queued", "running", "complete", "partial", "failed", "cancelled")
JOB_STATES = ("queued", "running", "done", "error", "crashed", "cancelled")
JOB_TERMINAL = frozenset({"done", "error", "crashed", "cancelled"})
_SHA = re.compile(r"^[0-9a-f]{7,64}$")

t_rev, t_par, t_run, t_job = m.Revision.__table__, m.RevisionParent.__table__, m.Run.__table__, m.Job.__table__
t_res, t_reg, t_zoo = m.Result.__table__, m.Regression.__table__, m.ZooModel.__table__


def dialect_insert(conn: Connection, table: sa.Table) -> Any:
    """An INSERT supporting ``on_conflict_do_*`` for the connection's dialect."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    elif conn.dialect.name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    else:  # pragma: no cover - only PostgreSQL and SQLite are supported
        raise UserError(f"unsupported database dialect {conn.dialect.name!r}; use PostgreSQL or SQLite")
    return insert(table)


def _now() -> datetime:
    return datetime.now(UTC)


def check_sha(sha: str) -> str:
    """A full-enough lower-case hex sha (7–64 digits) or UserError."""
    s = (sha or "").strip().lower()
    if not _SHA.match(s):
        raise UserError(f"not a git sha: {sha!r} (expected 7-64 hex digits)")
    return s


def thresholds_from_settings(settings: Settings) -> Thresholds | None:
    """Regression thresholds from ``AMPCI_THRESHOLDS_FILE`` (JSON/YAML), or None for the built-in ones."""
    if not settings.thresholds_file:
        return None
    from service.regressions.thresholds import Thresholds as _Thresholds

    return _Thresholds.load(settings.thresholds_file)


class Store(QueriesMixin, DeliveriesMixin):
    """Results store over one SQLAlchemy engine.  See the module docstring for guarantees."""

    def __init__(self, engine: Engine, clock: Callable[[], datetime] = _now,
                 thresholds: Thresholds | None = None) -> None:
        self.engine = engine
        self.clock = clock
        self.thresholds = thresholds  # default rule knobs for detect_regressions (None: built-in)

    @classmethod
    def from_url(cls, url: str, clock: Callable[[], datetime] = _now,
                 thresholds: Thresholds | None = None) -> Store:
        """A Store for ``url`` (no connection is made until the first call)."""
        return cls(make_engine(url), clock=clock, thresholds=thresholds)

    @classmethod
    def from_settings(cls, settings: Settings) -> Store:
        """The Store of ``settings.effective_database_url``; the embedded SQLite default is upgraded to head."""
        url = settings.effective_database_url
        store = cls.from_url(url)
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

    def _tx(self):  # type: ignore[no-untyped-def]
        return transaction(self.engine)

    def transaction(self) -> AbstractContextManager[Connection]:
        """A connection in one transaction (committed on success, rolled back on error), for the
        methods taking ``conn=`` (e.g. :meth:`upsert_revisions` and :meth:`create_runs` together)."""
        return transaction(self.engine)

    # -- revisions ------------------------------------------------------------------------------
    def upsert_revision(self, sha: str, parents: Sequence[str] = (), branch: str | None = None,
                        author: str | None = None, message: str | None = None,
                        committed_at: datetime | None = None) -> RevisionInfo:
        """Insert or update a revision.  Fields given as None keep their stored value; non-empty
        ``parents`` replace the stored parent links (position 0 = first parent)."""
        sha = check_sha(sha)
        self.upsert_revisions([RevisionRow(sha, tuple(parents), branch, author, message, committed_at)])
        return self.get_revision(sha)

    def upsert_revisions(self, rows: Iterable[RevisionRow], conn: Connection | None = None) -> int:
        """Insert or update many revisions in one transaction (``conn``'s, or a new one).

        The same rules as :meth:`upsert_revision` for each row; several rows for one sha are merged
        first (later non-None fields and non-empty parents win), so the revisions table takes one
        ``INSERT … ON CONFLICT DO UPDATE`` statement whatever the number of rows, and parent links
        at most two more (stale positions deleted, the given ones upserted).  Returns the number of
        distinct shas.
        """
        merged: dict[str, RevisionRow] = {}
        for r in rows:
            row = RevisionRow(check_sha(r.sha), tuple(check_sha(p) for p in r.parents), r.branch, r.author,
                              r.message, r.committed_at)
            prev = merged.get(row.sha)
            merged[row.sha] = row if prev is None else prev.merged(row)
        if not merged:
            return 0
        if conn is None:
            with self._tx() as own:
                return self._upsert_revisions(own, list(merged.values()))
        return self._upsert_revisions(conn, list(merged.values()))

    def _upsert_revisions(self, conn: Connection, rows: list[RevisionRow]) -> int:
        now = self.clock()
        for chunk in _chunks(rows, _ROWS_PER_STATEMENT):
            ins = dialect_insert(conn, t_rev).values(
                [{"sha": r.sha, "parents": list(r.parents), "branch": r.branch, "author": r.author,
                  "message": r.message, "committed_at": r.committed_at, "created_at": now} for r in chunk])
            ex = ins.excluded
            update: dict[str, Any] = {c: sa.func.coalesce(getattr(ex, c), getattr(t_rev.c, c))
                                      for c in ("branch", "author", "message", "committed_at")}
            # an empty parent list keeps the stored links (as in upsert_revision)
            update["parents"] = sa.case((sa.func.json_array_length(ex.parents) > 0, ex.parents),
                                        else_=t_rev.c.parents)
            conn.execute(ins.on_conflict_do_update(index_elements=[t_rev.c.sha], set_=update))
        with_parents = [r for r in rows if r.parents]
        for chunk in _chunks(with_parents, _ROWS_PER_STATEMENT):
            conn.execute(t_par.delete().where(sa.or_(*(
                sa.and_(t_par.c.child_sha == r.sha, t_par.c.position >= len(r.parents)) for r in chunk))))
            pins = dialect_insert(conn, t_par).values(
                [{"child_sha": r.sha, "position": i, "parent_sha": p} for r in chunk for i, p in enumerate(r.parents)])
            conn.execute(pins.on_conflict_do_update(index_elements=[t_par.c.child_sha, t_par.c.position],
                                                    set_={"parent_sha": pins.excluded.parent_sha}))
        return len(rows)

    def _ensure_revision(self, conn: Connection, sha: str) -> None:
        ins = dialect_insert(conn, t_rev).values(sha=sha, parents=[], created_at=self.clock())
        conn.execute(ins.on_conflict_do_nothing(index_elements=[t_rev.c.sha]))

    # -- runs and jobs --------------------------------------------------------------------------
    def create_run(self, revision_sha: str, trigger: str, baseline_sha: str | None = None,
                   sweep: str = "smoke", cells: Iterable[Cell] = (), dedup_key: str | None = None,
                   meta: dict[str, Any] | None = None) -> int:
        """Create a run with one ``queued`` job per distinct cell; return its id.

        A revision not yet known is inserted bare (sha only).  When ``dedup_key`` is given and a
        run with that key exists, **the existing run's id is returned** and nothing is created
        (use :meth:`create_run_if_new` to learn which happened).  Safe under concurrent callers.
        """
        return self.create_run_if_new(revision_sha, trigger, baseline_sha, sweep, cells, dedup_key, meta)[0]

    def create_run_if_new(self, revision_sha: str, trigger: str, baseline_sha: str | None = None,
                          sweep: str = "smoke", cells: Iterable[Cell] = (), dedup_key: str | None = None,
                          meta: dict[str, Any] | None = None) -> tuple[int, bool]:
        """Like :meth:`create_run`; returns ``(run_id, created)`` (created False: dedup hit)."""
        new = self.create_run_with_jobs(revision_sha, trigger, baseline_sha, sweep, cells, dedup_key, meta)
        return new.run_id, new.created

    def create_run_with_jobs(self, revision_sha: str, trigger: str, baseline_sha: str | None = None,
                             sweep: str = "smoke", cells: Iterable[Cell] = (), dedup_key: str | None = None,
                             meta: dict[str, Any] | None = None) -> NewRun:
        """Like :meth:`create_run_if_new`, also returning the run's job rows (read in the same transaction)."""
        spec = RunSpec(revision_sha, trigger, baseline_sha, sweep, tuple(cells), dedup_key, meta or {})
        return self.create_runs([spec])[0]

    def create_runs(self, specs: Sequence[RunSpec], conn: Connection | None = None) -> list[NewRun]:
        """Create many runs with their ``queued`` jobs in one transaction (``conn``'s, or a new one).

        Each spec behaves as :meth:`create_run_with_jobs` (a dedup key that already has a run, in
        the database or earlier in ``specs``, returns that run with ``created`` False), in the
        order given.  Runs with dedup keys take one multi-row ``INSERT … ON CONFLICT DO NOTHING``
        and their jobs one more, whatever their number.  Bad arguments raise UserError before
        anything is written.  Safe under concurrent callers.
        """
        checked = [self._check_spec(s) for s in specs]
        if not checked:
            return []
        if conn is None:
            with self._tx() as own:
                return self._create_runs(own, checked)
        return self._create_runs(conn, checked)

    def _check_spec(self, s: RunSpec) -> RunSpec:
        if s.trigger not in TRIGGERS:
            raise UserError(f"unknown trigger {s.trigger!r}; expected one of {', '.join(TRIGGERS)}")
        return RunSpec(check_sha(s.revision_sha), s.trigger, check_sha(s.baseline_sha) if s.baseline_sha else None,
                       s.sweep, tuple(dict.fromkeys(_check_cell(c) for c in s.cells)), s.dedup_key, s.meta or {})

    def _create_runs(self, conn: Connection, specs: list[RunSpec]) -> list[NewRun]:
        now = self.clock()
        shas = list(dict.fromkeys(s.revision_sha for s in specs))
        for chunk in _chunks(shas, _ROWS_PER_STATEMENT):
            ins = dialect_insert(conn, t_rev).values([{"sha": sha, "parents": [], "created_at": now} for sha in chunk])
            conn.execute(ins.on_conflict_do_nothing(index_elements=[t_rev.c.sha]))

        def row(s: RunSpec) -> dict[str, Any]:
            return {"revision_sha": s.revision_sha, "baseline_sha": s.baseline_sha, "trigger": s.trigger,
                    "status": "queued", "sweep": s.sweep, "dedup_key": s.dedup_key, "meta": s.meta,
                    "created_at": now}

        ids: dict[int, int] = {}        # spec index -> run id
        created: set[int] = set()       # spec indexes whose run this call created
        first_by_key: dict[str, int] = {}
        keyed = []
        for i, s in enumerate(specs):
            if s.dedup_key is None:
                ids[i] = int(conn.execute(t_run.insert().values(**row(s)).returning(t_run.c.id)).scalar_one())
                created.add(i)
            elif s.dedup_key not in first_by_key:
                first_by_key[s.dedup_key] = i
                keyed.append(i)
        for chunk in _chunks(keyed, _ROWS_PER_STATEMENT):
            ins = dialect_insert(conn, t_run).values([row(specs[i]) for i in chunk])
            got = dict(conn.execute(ins.on_conflict_do_nothing(index_elements=[t_run.c.dedup_key])
                                    .returning(t_run.c.dedup_key, t_run.c.id)).all())
            for i in chunk:
                if specs[i].dedup_key in got:
                    ids[i] = int(got[specs[i].dedup_key])
                    created.add(i)
        missing = [specs[i].dedup_key for i in keyed if i not in ids]
        for chunk in _chunks(missing, _ROWS_PER_STATEMENT):
            found = dict(conn.execute(sa.select(t_run.c.dedup_key, t_run.c.id)
                                      .where(t_run.c.dedup_key.in_(chunk))).all())
            for key in chunk:
                ids[first_by_key[key]] = int(found[key])  # type: ignore[index]
        for i, s in enumerate(specs):
            if i not in ids:  # a repeated key within specs
                ids[i] = ids[first_by_key[s.dedup_key]]  # type: ignore[index]
        jobs: dict[int, list[JobInfo]] = {}
        job_rows = [{"run_id": ids[i], "model": c[0], "dtype": c[1], "policy": c[2], "target": c[3],
                     "status": "queued", "attempts": 0, "queued_at": now}
                    for i in sorted(created) for c in specs[i].cells]
        for chunk in _chunks(job_rows, _ROWS_PER_STATEMENT):
            for r in conn.execute(t_job.insert().values(chunk).returning(*t_job.c)):
                jobs.setdefault(r.run_id, []).append(job_info(r))
        existing = sorted({ids[i] for i in range(len(specs)) if i not in created})
        for chunk in _chunks(existing, _ROWS_PER_STATEMENT):
            for r in conn.execute(sa.select(t_job).where(t_job.c.run_id.in_(chunk)).order_by(t_job.c.id)):
                jobs.setdefault(r.run_id, []).append(job_info(r))
        return [NewRun(ids[i], i in created, tuple(sorted(jobs.get(ids[i], []), key=lambda j: j.id)))
                for i in range(len(specs))]

    def add_jobs(self, run_id: int, cells: Iterable[Cell]) -> list[JobInfo]:
        """Add ``queued`` jobs for cells the run does not have yet; returns all the run's jobs."""
        now = self.clock()
        with self._tx() as conn:
            self._run_row(conn, run_id)
            rows = [{"run_id": run_id, "model": c[0], "dtype": c[1], "policy": c[2], "target": c[3],
                     "status": "queued", "attempts": 0, "queued_at": now}
                    for c in dict.fromkeys(_check_cell(c) for c in cells)]
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
        with self._tx() as conn:
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

    def mark_job(self, job_id: int, status: str, error: str | None = None) -> JobInfo:
        """Set a job's status (one of JOB_STATES); terminal states stamp ``finished_at``."""
        if status not in JOB_STATES:
            raise UserError(f"unknown job status {status!r}; expected one of {', '.join(JOB_STATES)}")
        values: dict[str, Any] = {"status": status, "error": error}
        if status in JOB_TERMINAL:
            values["finished_at"] = self.clock()
        with self._tx() as conn:
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
        with self._tx() as conn:
            run = self._run_row(conn, run_id)
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
        ``complete``.  Idempotent.
        """
        with self._tx() as conn:
            self._run_row(conn, run_id)
            counts = dict(conn.execute(sa.select(t_job.c.status, sa.func.count()).where(
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
        return self.get_run(run_id)

    def set_run_status(self, run_id: int, status: str) -> RunInfo:
        """Force a run status (e.g. ``cancelled``); prefer :meth:`finish_run` otherwise."""
        if status not in RUN_STATES:
            raise UserError(f"unknown run status {status!r}; expected one of {', '.join(RUN_STATES)}")
        with self._tx() as conn:
            self._run_row(conn, run_id)
            conn.execute(t_run.update().where(t_run.c.id == run_id).values(status=status))
        return self.get_run(run_id)

    def run_summary(self, run_id: int) -> RunSummary:
        """Counts of a run's jobs, results and findings (regressions counted unless resolved/false positive)."""
        with self._tx() as conn:
            run = self._run_row(conn, run_id)
            jobs = dict(conn.execute(sa.select(t_job.c.status, sa.func.count()).where(
                t_job.c.run_id == run_id).group_by(t_job.c.status)).all())
            res = dict(conn.execute(sa.select(t_res.c.status, sa.func.count()).where(
                t_res.c.run_id == run_id).group_by(t_res.c.status)).all())
            found = conn.execute(sa.select(t_reg.c.category, t_reg.c.kind, sa.func.count()).where(
                t_reg.c.run_id == run_id, t_reg.c.state.in_(("open", "acknowledged")))
                .group_by(t_reg.c.category, t_reg.c.kind)).all()
            cells = max(sum(jobs.values()), sum(res.values()))
        regs = {k: n for c, k, n in found if c == "regression"}
        return RunSummary(run_id=run_id, status=run.status, cells=cells, job_status=jobs, result_status=res,
                          regressions=regs, improvements=sum(n for c, _, n in found if c == "improvement"),
                          flaky=sum(n for c, _, n in found if c == "flaky"))

    def detect_regressions(self, run_id: int, thresholds: Thresholds | None = None) -> list[Regression]:
        """Compare every result of the run with its baseline, store findings, resolve fixed ones.

        See :func:`service.regressions.detect.detect_run` for the rules and guarantees
        (idempotent: running it twice stores each finding once).
        """
        from service.regressions.detect import detect_run

        return detect_run(self, run_id, thresholds if thresholds is not None else self.thresholds)

    # -- model zoo (webhook deliveries: service.db.deliveries) ------------------------------------
    def record_model(self, name: str, sha256: str | None = None, source: str | None = None,
                     meta: dict[str, Any] | None = None) -> None:
        """Record (or refresh) a model zoo entry seen by a sweep."""
        now = self.clock()
        with self._tx() as conn:
            ins = dialect_insert(conn, t_zoo).values(name=name, sha256=sha256, source=source, meta=meta or {},
                                                     first_seen_at=now, last_seen_at=now)
            conn.execute(ins.on_conflict_do_update(index_elements=[t_zoo.c.name], set_={
                "last_seen_at": now, "sha256": sa.func.coalesce(ins.excluded.sha256, t_zoo.c.sha256),
                "source": sa.func.coalesce(ins.excluded.source, t_zoo.c.source)}))

    def zoo_models(self) -> list[dict[str, Any]]:
        """All model zoo entries seen, by name."""
        with self._tx() as conn:
            rows = conn.execute(sa.select(t_zoo).order_by(t_zoo.c.name)).mappings().all()
        return [{**r, "first_seen_at": utc(r["first_seen_at"]), "last_seen_at": utc(r["last_seen_at"])}
                for r in rows]

    # -- helpers --------------------------------------------------------------------------------
    def _run_row(self, conn: Connection, run_id: int) -> Any:
        row = conn.execute(sa.select(t_run).where(t_run.c.id == run_id)).first()
        if row is None:
            raise NotFoundError(f"no run with id {run_id}")
        return row


_ROWS_PER_STATEMENT = 100  # rows per multi-row INSERT (keeps SQLite under its bound-parameter limit)


def _chunks(items: list[Any], n: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


def _check_cell(cell: Sequence[str]) -> Cell:
    if len(cell) != 4 or not all(isinstance(x, str) and x.strip() for x in cell):
        raise UserError(f"a cell is (model, dtype, policy, target) of non-empty strings, got {cell!r}")
    return (cell[0], cell[1], cell[2], cell[3])


__all__ = ["Store", "TRIGGERS", "RUN_STATES", "JOB_STATES", "DELIVERY_STATES", "run_info", "check_sha"]
