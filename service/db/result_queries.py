"""Read-side queries of results and findings (mixed into :class:`service.db.store.Store`).

Results by run, revision and cell, one stored :class:`~workers.result.JobResult`, two revisions
compared cell by cell, a model's metric history, and the stored findings (regressions,
improvements, flaky cells) with their acknowledgement.  Each method reads in one short
transaction (so is safe under concurrent writers and callers); :meth:`ResultQueriesMixin.ack` is
one ``UPDATE``.  Unknown revisions, runs, models and ids raise ``NotFoundError`` (an unknown model
names the closest stored ones); an unknown finding state raises ``UserError``.  Revisions,
ancestry, runs and jobs: :mod:`service.db.queries`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from service.db import models as m
from service.db.engine import DbRow, DbSelect
from service.db.records import CompareRow, HistoryPoint, RegressionInfo, ResultRow, RunInfo, utc
from service.errors import NotFoundError, UserError
from service.regressions.measured import stored_error_unit
from service.vocabulary import METRICS, metric_column
from workers.result import JobResult

t_run, t_job = m.Run.__table__, m.Job.__table__
t_res, t_reg = m.Result.__table__, m.Regression.__table__

REG_STATES = ("open", "acknowledged", "resolved", "false_positive", "suspected", "dismissed", "suspected_resolved",
              "explained")
RESULT_COLS = [t_res.c[f] for f in ResultRow.__dataclass_fields__]

#: The convergence error unit a stored result records (NULL for results stored before units existed).
ERROR_UNIT = t_res.c.data[("convergence", "error_unit")].as_string()


def result_row(r: DbRow) -> ResultRow:
    """ResultRow from a row selected with RESULT_COLS."""
    d = dict(r._mapping)
    d["updated_at"] = utc(d["updated_at"])
    return ResultRow(**d)


def regression_info(r: DbRow) -> RegressionInfo:
    """RegressionInfo from a regressions row."""
    d = dict(r._mapping)
    d["created_at"], d["state_at"] = utc(d["created_at"]), utc(d["state_at"])
    return RegressionInfo(**d)


def regressions_query(state: str | None = None, since: datetime | None = None, revision_sha: str | None = None,
                      run_id: int | None = None, category: str | None = None, limit: int = 1000) -> DbSelect:
    """The statement behind :meth:`ResultQueriesMixin.regressions` (whole ``regressions`` rows newest first, at most
    ``limit``, filtered by each given value), for a caller already inside a transaction."""
    q = sa.select(t_reg).order_by(t_reg.c.created_at.desc(), t_reg.c.id.desc()).limit(limit)
    if state:
        q = q.where(t_reg.c.state == state)
    if since is not None:
        q = q.where(t_reg.c.created_at >= since)
    if revision_sha:
        q = q.where(t_reg.c.revision_sha == revision_sha)
    if run_id is not None:
        q = q.where(t_reg.c.run_id == run_id)
    if category:
        q = q.where(t_reg.c.category == category)
    return q



def stored_model_names(conn: Connection, limit: int) -> list[str]:
    """The distinct model names of stored results and jobs (at most ``limit`` of each), sorted."""
    names = {str(m) for (m,) in conn.execute(sa.select(t_res.c.model).distinct().limit(limit))}
    names |= {str(m) for (m,) in conn.execute(sa.select(t_job.c.model).distinct().limit(limit))}
    return sorted(names)


class ResultQueriesMixin:
    """Result and finding queries; requires ``self.transaction()`` and ``self.clock`` (Store) and
    ``get_run``/``resolve_revision`` (QueriesMixin, before this class in Store's bases)."""

    engine: Engine
    clock: Callable[[], datetime]

    def transaction(self) -> AbstractContextManager[Connection]:  # pragma: no cover - provided by Store
        raise NotImplementedError

    if TYPE_CHECKING:  # provided by QueriesMixin
        def get_run(self, run_id: int) -> RunInfo: ...

        def resolve_revision(self, ref: str) -> str: ...

    # -- results ----------------------------------------------------------------------------------
    def results(self, run_id: int | None = None, revision: str | None = None, model: str | None = None,
                dtype: str | None = None, policy: str | None = None, target: str | None = None,
                status: str | None = None, latest_only: bool = True, limit: int = 5000) -> list[ResultRow]:
        """Results filtered, ordered by cell.  With ``revision`` and ``latest_only`` only the newest
        result of each cell at that revision is kept.  An unknown model is a NotFoundError."""
        q = sa.select(*RESULT_COLS)
        if run_id is not None:
            self.get_run(run_id)
            q = q.where(t_res.c.run_id == run_id)
        if revision:
            q = q.where(t_res.c.revision_sha == self.resolve_revision(revision))
        for col, val in (("model", model), ("dtype", dtype), ("policy", policy), ("target", target),
                         ("status", status)):
            if val:
                q = q.where(t_res.c[col] == val)
        q = q.order_by(t_res.c.model, t_res.c.dtype, t_res.c.policy, t_res.c.target, t_res.c.id.desc()).limit(limit)
        with self.transaction() as conn:
            rows = [result_row(r) for r in conn.execute(q)]
            if not rows and model:
                self._check_model(conn, model)
        if revision and latest_only:
            seen: set[tuple[str, str, str, str]] = set()
            newest = []
            for r in rows:
                if r.cell not in seen:
                    seen.add(r.cell)
                    newest.append(r)
            rows = newest
        return rows

    def get_result(self, result_id: int) -> JobResult:
        """The complete stored JobResult (NotFoundError if unknown)."""
        with self.transaction() as conn:
            data = conn.execute(sa.select(t_res.c.data).where(t_res.c.id == result_id)).scalar()
        if data is None:
            raise NotFoundError(f"no result with id {result_id}")
        return JobResult.from_dict(data)

    def _check_model(self, conn: Connection, model: str) -> None:
        """NotFoundError when no job or result has ``model``, naming the closest stored model names."""
        hit = conn.execute(sa.select(t_res.c.id).where(t_res.c.model == model).limit(1)).first()
        if hit is None and conn.execute(sa.select(t_job.c.id).where(t_job.c.model == model).limit(1)).first() is None:
            import difflib

            close = difflib.get_close_matches(model, stored_model_names(conn, 10_000), n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            raise NotFoundError(f"unknown model {model!r} (no job or result has it){hint}")

    def compare(self, rev_a: str, rev_b: str) -> list[CompareRow]:
        """Cell-by-cell comparison of the newest results at two revisions, with ``b - a`` deltas
        (``final_error`` has none when the two convergence errors are in different units)."""
        a, b = self.resolve_revision(rev_a), self.resolve_revision(rev_b)
        ra = {r.cell: r for r in self.results(revision=a)}
        rb = {r.cell: r for r in self.results(revision=b)}
        units = self._convergence_units([r.id for r in (*ra.values(), *rb.values()) if r.final_error is not None])
        out = []
        for cell in sorted(set(ra) | set(rb)):
            x, y = ra.get(cell), rb.get(cell)
            deltas: dict[str, float | None] = {}
            for metric in METRICS:
                va = getattr(x, metric) if x else None
                vb = getattr(y, metric) if y else None
                if metric == "final_error" and x and y and units.get(x.id) != units.get(y.id):
                    va = vb = None  # errors in different units: no delta
                deltas[metric] = (vb - va) if va is not None and vb is not None else None
            out.append(CompareRow(model=cell[0], dtype=cell[1], policy=cell[2], target=cell[3], a=x, b=y,
                                  deltas=deltas))
        return out

    def _convergence_units(self, result_ids: list[int]) -> dict[int, str]:
        """The convergence error unit of each given result (``absolute`` when its stored result predates
        ``ConvergenceStats.error_unit``)."""
        if not result_ids:
            return {}
        with self.transaction() as conn:
            rows = conn.execute(sa.select(t_res.c.id, ERROR_UNIT.label("unit")).where(t_res.c.id.in_(result_ids))).all()
        return {r.id: stored_error_unit(r.unit) for r in rows}

    def history(self, model: str, dtype: str | None = None, policy: str | None = None, target: str | None = None,
                metric: str = "cosine", limit: int = 200) -> list[HistoryPoint]:
        """The last ``limit`` values of a metric of a model (optionally one dtype, policy, target: every
        cell of the model otherwise), oldest first; ``final_error`` points carry their unit
        (``HistoryPoint.unit``).  An unknown model is a NotFoundError naming the closest known ones."""
        metric = metric_column(metric)
        col = t_res.c[metric]
        unit = ERROR_UNIT if metric == "final_error" else sa.null()
        q = (sa.select(t_res.c.id, t_res.c.run_id, t_res.c.revision_sha, t_run.c.trigger, t_run.c.created_at,
                       t_res.c.status, t_res.c.dtype, t_res.c.policy, t_res.c.target, col.label("value"),
                       unit.label("unit"))
             .join(t_run, t_run.c.id == t_res.c.run_id)
             .where(t_res.c.model == model))
        if dtype:
            q = q.where(t_res.c.dtype == dtype)
        if policy:
            q = q.where(t_res.c.policy == policy)
        if target:
            q = q.where(t_res.c.target == target)
        q = q.order_by(t_res.c.id.desc()).limit(limit)
        with self.transaction() as conn:
            rows = conn.execute(q).all()
            if not rows:
                self._check_model(conn, model)
        return [HistoryPoint(result_id=r.id, run_id=r.run_id, revision_sha=r.revision_sha, trigger=r.trigger,
                             created_at=utc(r.created_at), status=r.status, policy=r.policy,
                             target=r.target, value=r.value, dtype=r.dtype,
                             unit=stored_error_unit(r.unit) if metric == "final_error" and r.value is not None
                             else None) for r in reversed(rows)]

    # -- regressions ------------------------------------------------------------------------------
    def regressions(self, state: str | None = None, since: datetime | None = None, revision: str | None = None,
                    run_id: int | None = None, category: str | None = None, limit: int = 1000) -> list[RegressionInfo]:
        """Stored findings newest first; ``state='open'`` gives open ones only."""
        if state is not None and state not in REG_STATES:
            raise UserError(f"unknown regression state {state!r}; expected one of {', '.join(REG_STATES)}")
        q = regressions_query(state=state, since=since, revision_sha=self.resolve_revision(revision) if revision
                              else None, run_id=run_id, category=category, limit=limit)
        with self.transaction() as conn:
            return [regression_info(r) for r in conn.execute(q)]

    def get_regression(self, regression_id: int) -> RegressionInfo:
        """A finding by id (NotFoundError if unknown)."""
        with self.transaction() as conn:
            r = conn.execute(sa.select(t_reg).where(t_reg.c.id == regression_id)).first()
        if r is None:
            raise NotFoundError(f"no regression with id {regression_id}")
        return regression_info(r)

    def ack(self, regression_id: int, by: str | None = None, false_positive: bool = False,
            note: str | None = None) -> RegressionInfo:
        """Mark a finding ``acknowledged`` (or ``false_positive``), recording who and when."""
        state = "false_positive" if false_positive else "acknowledged"
        with self.transaction() as conn:
            n = conn.execute(t_reg.update().where(t_reg.c.id == regression_id).values(
                state=state, state_by=by, state_at=self.clock(), state_note=note)).rowcount
        if not n:
            raise NotFoundError(f"no regression with id {regression_id}")
        return self.get_regression(regression_id)
