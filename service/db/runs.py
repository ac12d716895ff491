"""Writing revisions and runs (mixed into :class:`service.db.store.Store`).

Single and batch forms share one code path: :meth:`RunWritesMixin.upsert_revisions` and
:meth:`RunWritesMixin.create_runs` take any number of rows in one transaction, each table written
by one cached statement executed for all rows (SQLAlchemy sends an executemany of an INSERT as
one multi-row statement), and run creation returns the job rows it wrote so callers need no
further query to dispatch them.  Every write is atomic and safe under concurrent callers: a run's
``dedup_key`` is unique, so of concurrent creators exactly one gets ``created``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from service.db import models as m
from service.db.engine import DialectInsert
from service.db.models import DbTable
from service.db.queries import job_info
from service.db.records import Cell, JobInfo, NewRun, RevisionInfo, RevisionRow, RunSpec
from service.errors import UserError
from service.json_types import JsonObject
from service.vocabulary import AWAITING_APPROVAL, NEW_RUN_STATES, TRIGGERS

DISPATCH_MODES = ("broker", "local")  # runs.dispatch: Celery messages, or the creating process's local pool
_SHA = re.compile(r"^[0-9a-f]{7,64}$")
t_rev, t_par, t_run, t_job = m.Revision.__table__, m.RevisionParent.__table__, m.Run.__table__, m.Job.__table__


def dialect_insert(conn: Connection, table: DbTable) -> DialectInsert:
    """An INSERT supporting ``on_conflict_do_*`` for the connection's dialect."""
    if conn.dialect.name not in ("postgresql", "sqlite"):  # pragma: no cover - only these two are supported
        raise UserError(f"unsupported database dialect {conn.dialect.name!r}; use PostgreSQL or SQLite")
    return insert_for(conn.dialect.name, table)


def check_sha(sha: str) -> str:
    """A full-enough lower-case hex sha (7–64 digits) or UserError."""
    s = (sha or "").strip().lower()
    if not _SHA.match(s):
        raise UserError(f"not a git sha: {sha!r} (expected 7-64 hex digits)")
    return s


def check_cell(cell: Sequence[str]) -> Cell:
    """``cell`` as a (model, dtype, policy, target) tuple of non-empty strings, or UserError."""
    if len(cell) != 4 or not all(isinstance(x, str) and x.strip() for x in cell):
        raise UserError(f"a cell is (model, dtype, policy, target) of non-empty strings, got {cell!r}")
    return (cell[0], cell[1], cell[2], cell[3])


class RunWritesMixin:
    """Revision and run writes; requires ``self.transaction()`` and ``self.clock`` (Store) and ``get_revision``
    (QueriesMixin, after this class in Store's bases).

    ``run_dispatch`` is how runs created without an explicit ``dispatch`` are dispatched (recorded
    in ``runs.dispatch``): ``broker`` unless the Store was opened for an embedded process (see
    :func:`service.orchestration.scheduler.open_store`), so runs a process creates on its own (bisection steps)
    are recorded with its mode.
    """

    run_dispatch: str = "broker"

    engine: Engine
    clock: Callable[[], datetime]

    def transaction(self) -> AbstractContextManager[Connection]:  # pragma: no cover - provided by Store
        raise NotImplementedError

    if TYPE_CHECKING:  # provided by QueriesMixin
        def get_revision(self, sha: str) -> RevisionInfo: ...

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
            with self.transaction() as own:
                return self._upsert_revisions(own, list(merged.values()))
        return self._upsert_revisions(conn, list(merged.values()))

    def _upsert_revisions(self, conn: Connection, rows: list[RevisionRow]) -> int:
        now = self.clock()
        # executemany of one cached statement: SQLAlchemy sends it as one multi-row INSERT
        conn.execute(_revision_upsert(conn.dialect.name),
                     [{"sha": r.sha, "parents": list(r.parents), "branch": r.branch, "author": r.author,
                       "message": r.message, "committed_at": r.committed_at, "created_at": now} for r in rows])
        with_parents = [r for r in rows if r.parents]
        if with_parents:
            conn.execute(t_par.delete().where(t_par.c.child_sha == sa.bindparam("c"),
                                              t_par.c.position >= sa.bindparam("n")),
                         [{"c": r.sha, "n": len(r.parents)} for r in with_parents])
            conn.execute(_parent_upsert(conn.dialect.name),
                         [{"child_sha": r.sha, "position": i, "parent_sha": p}
                          for r in with_parents for i, p in enumerate(r.parents)])
        return len(rows)

    # -- runs and jobs --------------------------------------------------------------------------
    def create_run(self, revision_sha: str, trigger: str, baseline_sha: str | None = None,
                   sweep: str = "smoke", cells: Iterable[Cell] = (), dedup_key: str | None = None,
                   meta: JsonObject | None = None, dispatch: str | None = None) -> int:
        """Create a run with one ``queued`` job per distinct cell; return its id.

        A revision not yet known is inserted bare (sha only).  When ``dedup_key`` is given and a
        run with that key exists, **the existing run's id is returned** and nothing is created
        (use :meth:`create_run_if_new` to learn which happened).  ``dispatch`` (``broker`` or
        ``local``; default ``run_dispatch``) records how its jobs will be dispatched.  Safe under
        concurrent callers.
        """
        return self.create_run_if_new(revision_sha, trigger, baseline_sha, sweep, cells, dedup_key, meta,
                                      dispatch)[0]

    def create_run_if_new(self, revision_sha: str, trigger: str, baseline_sha: str | None = None,
                          sweep: str = "smoke", cells: Iterable[Cell] = (), dedup_key: str | None = None,
                          meta: JsonObject | None = None, dispatch: str | None = None) -> tuple[int, bool]:
        """Like :meth:`create_run`; returns ``(run_id, created)`` (created False: dedup hit)."""
        new = self.create_run_with_jobs(revision_sha, trigger, baseline_sha, sweep, cells, dedup_key, meta,
                                        dispatch)
        return new.run_id, new.created

    def create_run_with_jobs(self, revision_sha: str, trigger: str, baseline_sha: str | None = None,
                             sweep: str = "smoke", cells: Iterable[Cell] = (), dedup_key: str | None = None,
                             meta: JsonObject | None = None, dispatch: str | None = None) -> NewRun:
        """Like :meth:`create_run_if_new`, also returning the run's job rows (read in the same transaction)."""
        spec = RunSpec(revision_sha, trigger, baseline_sha, sweep, tuple(cells), dedup_key, meta or {}, dispatch)
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
            with self.transaction() as own:
                return self._create_runs(own, checked)
        return self._create_runs(conn, checked)

    def _check_spec(self, s: RunSpec) -> RunSpec:
        if s.trigger not in TRIGGERS:
            raise UserError(f"unknown trigger {s.trigger!r}; expected one of {', '.join(TRIGGERS)}")
        dispatch = s.dispatch if s.dispatch is not None else self.run_dispatch
        if dispatch not in DISPATCH_MODES:
            raise UserError(f"unknown dispatch {dispatch!r}; expected one of {', '.join(DISPATCH_MODES)}")
        if s.status not in NEW_RUN_STATES:
            raise UserError(f"a run cannot be created {s.status!r}; expected one of {', '.join(NEW_RUN_STATES)}")
        return RunSpec(check_sha(s.revision_sha), s.trigger, check_sha(s.baseline_sha) if s.baseline_sha else None,
                       s.sweep, tuple(dict.fromkeys(check_cell(c) for c in s.cells)), s.dedup_key, s.meta or {},
                       dispatch, s.status)

    def _create_runs(self, conn: Connection, specs: list[RunSpec]) -> list[NewRun]:
        now = self.clock()
        seen_at = self.clock()  # a revision first seen here (bare: sha only)
        ins = dialect_insert(conn, t_rev)
        conn.execute(ins.on_conflict_do_nothing(index_elements=[t_rev.c.sha]),
                     [{"sha": sha, "parents": [], "created_at": seen_at}
                      for sha in dict.fromkeys(s.revision_sha for s in specs)])

        def row(s: RunSpec) -> dict[str, object]:
            return {"revision_sha": s.revision_sha, "baseline_sha": s.baseline_sha, "trigger": s.trigger,
                    "status": s.status, "sweep": s.sweep, "dedup_key": s.dedup_key, "meta": s.meta,
                    "created_at": now, "dispatch": s.dispatch}

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
        if keyed:
            ins = dialect_insert(conn, t_run)
            stmt = ins.on_conflict_do_nothing(index_elements=[t_run.c.dedup_key]).returning(
                t_run.c.dedup_key, t_run.c.id)
            got: dict[str | None, int] = dict(conn.execute(stmt, [row(specs[i]) for i in keyed]).all())
            for i in keyed:
                if specs[i].dedup_key in got:
                    ids[i] = int(got[specs[i].dedup_key])
                    created.add(i)
        missing = [key for i in keyed if i not in ids and (key := specs[i].dedup_key) is not None]
        status_of: dict[int, str] = {ids[i]: specs[i].status for i in created}
        if missing:
            found = {key: (run_id, status) for key, run_id, status in conn.execute(
                sa.select(t_run.c.dedup_key, t_run.c.id, t_run.c.status).where(t_run.c.dedup_key.in_(missing)))}
            for key in missing:
                ids[first_by_key[key]], status = found[key]
                status_of[ids[first_by_key[key]]] = status
        for i, s in enumerate(specs):
            if i not in ids and s.dedup_key is not None:  # a repeated key within specs (keyless: all have ids)
                ids[i] = ids[first_by_key[s.dedup_key]]
        jobs: dict[int, list[JobInfo]] = {}
        job_rows = [{"run_id": ids[i], "model": c[0], "dtype": c[1], "policy": c[2], "target": c[3],
                     "status": "queued", "attempts": 0, "queued_at": now}
                    for i in sorted(created) if specs[i].status == "queued" for c in specs[i].cells]
        if job_rows:
            for r in conn.execute(t_job.insert().returning(*t_job.c), job_rows):
                jobs.setdefault(r.run_id, []).append(job_info(r))
        made = {ids[i] for i in created}
        existing = sorted({ids[i] for i in range(len(specs))} - made)
        if existing:
            for r in conn.execute(sa.select(t_job).where(t_job.c.run_id.in_(existing)).order_by(t_job.c.id)):
                jobs.setdefault(r.run_id, []).append(job_info(r))
        return [NewRun(ids[i], i in created, tuple(sorted(jobs.get(ids[i], []), key=lambda j: j.id)),
                       status_of[ids[i]]) for i in range(len(specs))]

    def approve_run(self, run_id: int, cells: Iterable[Cell], meta: JsonObject,
                    conn: Connection | None = None) -> NewRun | None:
        """Start a run awaiting approval: atomically, only while it is ``awaiting_approval``, it becomes
        ``queued`` with ``meta`` and one ``queued`` job per distinct cell (in ``conn``'s transaction, or a
        new one).  Returns the run with its jobs (``created`` True: this call started it), or None when the
        run is not awaiting approval (already approved, by a concurrent caller too, or never awaiting):
        of concurrent approvers exactly one starts it.  An unknown run is None as well."""
        checked = tuple(dict.fromkeys(check_cell(c) for c in cells))
        if conn is None:
            with self.transaction() as own:
                return self._approve_run(own, run_id, checked, meta)
        return self._approve_run(conn, run_id, checked, meta)

    def _approve_run(self, conn: Connection, run_id: int, cells: tuple[Cell, ...], meta: JsonObject) -> NewRun | None:
        now = self.clock()
        started = conn.execute(t_run.update().where(t_run.c.id == run_id, t_run.c.status == AWAITING_APPROVAL)
                               .values(status="queued", meta=meta).returning(t_run.c.id)).first()
        if started is None:
            return None
        rows = [{"run_id": run_id, "model": c[0], "dtype": c[1], "policy": c[2], "target": c[3], "status": "queued",
                 "attempts": 0, "queued_at": now} for c in cells]
        jobs = [job_info(r) for r in conn.execute(t_job.insert().returning(*t_job.c), rows)] if rows else []
        return NewRun(run_id, True, tuple(sorted(jobs, key=lambda j: j.id)), "queued")


@functools.cache
def _revision_upsert(dialect: str) -> DialectInsert:
    """The revisions upsert of :meth:`Store.upsert_revisions` (built once per dialect; executemany)."""
    ins = insert_for(dialect, t_rev)
    ex = ins.excluded
    update: dict[str, sa.ColumnElement[object]] = {c: sa.func.coalesce(getattr(ex, c), getattr(t_rev.c, c))
                                                   for c in ("branch", "author", "message", "committed_at")}
    # an empty parent list keeps the stored links (as in upsert_revision)
    update["parents"] = sa.case((sa.func.json_array_length(ex.parents) > 0, ex.parents), else_=t_rev.c.parents)
    return ins.on_conflict_do_update(index_elements=[t_rev.c.sha], set_=update)


@functools.cache
def _parent_upsert(dialect: str) -> DialectInsert:
    ins = insert_for(dialect, t_par)
    return ins.on_conflict_do_update(index_elements=[t_par.c.child_sha, t_par.c.position],
                                     set_={"parent_sha": ins.excluded.parent_sha})


def insert_for(dialect: str, table: DbTable) -> DialectInsert:
    """``INSERT INTO table`` of ``dialect``: PostgreSQL's, or SQLite's for any other name."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table)
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(table)
