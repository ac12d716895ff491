"""The dashboard's read queries: what the Store's query methods do not answer in one round trip.

- :func:`runs_overview` — recent runs with their revision and per-run counts, filterable by branch
  (three queries whatever the number of runs, instead of four per run through ``run_summary``);
- :func:`branches` — the branches revisions were seen on (for the filter);
- :func:`cell_history` — every plotted metric of one cell at each revision of a branch, one point
  per revision (the newest result there), with the latency range from the raw samples;
- :func:`cells_of` — the cells (policy/target) of a model and dtype that have results;
- :func:`cell_findings` — the findings of one cell at the plotted runs;
- :func:`baseline_results` — each cell's baseline result, found exactly as the detector finds it;
- :func:`bisect_runs` — the bisect runs (by dedup key) of a list of revisions for one cell;
- :func:`findings` — findings across runs (the regressions page), filtered by state, kind, category, model,
  dtype and time, newest first.

All are read-only: nothing here writes, queues or creates anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from service.db import models as m
from service.db.engine import DbRow
from service.db.queries import RUN_COLUMNS
from service.db.records import Cell, RegressionInfo, RevisionInfo, RunInfo, utc
from service.db.series import nearest
from service.db.store import Store, run_info
from service.regressions.detect import LINEAGE_TRIGGERS
from service.regressions.stored import StoredResult
from service.regressions.verdict import LATER_STATES
from service.vocabulary import EARLIEST, LATEST

t_rev, t_run, t_res, t_reg = (m.Revision.__table__, m.Run.__table__, m.Result.__table__,
                              m.Regression.__table__)
t_job = m.Job.__table__
#: Result statuses that mean the pass (or the job, or ampci: ``error``, ``unmeasured``) failed before accuracy could
#: be judged: never shown as a pass.
ERROR_STATUSES = frozenset({"convert_error", "timeout", "crash", "bad_model", "bad_spec", "reference_error",
                            "crashed", "error", "unmeasured"})


#: Finding states the runs page counts (as :meth:`Store.run_summary` and the verdict do): not a suspected, dismissed,
#: explained, resolved or false-positive one.
COUNTED_STATES = ("open", "acknowledged")


@dataclass(frozen=True)
class RunOverview:
    """One row of the runs page."""

    run: RunInfo
    revision: RevisionInfo
    cells: int
    passed: int
    failed: int            # converted but not accurate / diverged
    errors: int            # conversion or job errors
    pending: int           # jobs queued or running
    regressions: int       # regression findings its verdict counted (those later runs resolved too)
    regression_kinds: dict[str, int]
    flaky: int
    improvements: int

    @property
    def duration_s(self) -> float | None:
        """Seconds from creation to finish (None while unfinished)."""
        if self.run.finished_at is None:
            return None
        return (self.run.finished_at - self.run.created_at).total_seconds()


def _revision(r: _RevRow) -> RevisionInfo:
    return RevisionInfo(sha=r.sha, parents=tuple(r.parents or ()), branch=r.branch, author=r.author,
                        message=r.message, committed_at=utc(r.committed_at))


def _readable_time(col: sa.ColumnElement[datetime]) -> sa.ColumnElement[datetime | None]:
    """``col`` where it lies in 1970–2100, else NULL: a row stored before the intake refused such
    timestamps (e.g. year 0 in UTC) cannot break the page (the driver cannot read it back)."""
    return sa.case((col.between(EARLIEST, LATEST), col), else_=sa.null())


def branches(store: Store) -> list[str]:
    """Distinct non-empty branch names of known revisions, sorted."""
    with store.transaction() as conn:
        rows = conn.execute(sa.select(t_rev.c.branch).where(t_rev.c.branch.is_not(None)).distinct()).scalars()
        return sorted(b for b in rows if b)


def runs_overview(store: Store, limit: int = 50, branch: str | None = None,
                  trigger: str | None = None) -> list[RunOverview]:
    """The newest ``limit`` runs (optionally of one branch / trigger) with revision and counts."""
    q = (sa.select(*RUN_COLUMNS, t_rev.c.sha.label("r_sha"), t_rev.c.parents.label("r_parents"),
                   t_rev.c.branch.label("r_branch"), t_rev.c.author.label("r_author"),
                   t_rev.c.message.label("r_message"), _readable_time(t_rev.c.committed_at).label("r_committed_at"))
         .join(t_rev, t_rev.c.sha == t_run.c.revision_sha)
         .order_by(t_run.c.created_at.desc(), t_run.c.id.desc()).limit(limit))
    if branch:
        q = q.where(t_rev.c.branch == branch)
    if trigger:
        q = q.where(t_run.c.trigger == trigger)
    with store.transaction() as conn:
        rows = conn.execute(q).all()
        ids = [r.id for r in rows]
        results: dict[int, dict[str, int]] = {i: {} for i in ids}
        jobs: dict[int, dict[str, int]] = {i: {} for i in ids}
        found: dict[int, list[tuple[str, str, int]]] = {i: [] for i in ids}
        if ids:
            for run_id, status, n in conn.execute(
                    sa.select(t_res.c.run_id, t_res.c.status, sa.func.count())
                    .where(t_res.c.run_id.in_(ids)).group_by(t_res.c.run_id, t_res.c.status)):
                results[run_id][status] = n
            for run_id, status, n in conn.execute(
                    sa.select(t_job.c.run_id, t_job.c.status, sa.func.count())
                    .where(t_job.c.run_id.in_(ids)).group_by(t_job.c.run_id, t_job.c.status)):
                jobs[run_id][status] = n
            for run_id, category, kind, n in conn.execute(
                    sa.select(t_reg.c.run_id, t_reg.c.category, t_reg.c.kind, sa.func.count())
                    .where(t_reg.c.run_id.in_(ids),
                           sa.or_(t_reg.c.state.in_(COUNTED_STATES),  # and what the run's verdict counted
                                  sa.and_(t_reg.c.category == "regression", t_reg.c.state.in_(LATER_STATES))))
                    .group_by(t_reg.c.run_id, t_reg.c.category, t_reg.c.kind)):
                found[run_id].append((category, kind, n))
    out = []
    for r in rows:
        res, job, regs = results[r.id], jobs[r.id], found[r.id]
        rev = _revision(_RevRow(r))
        kinds = {k: n for c, k, n in regs if c == "regression"}
        out.append(RunOverview(
            run=run_info(r), revision=rev, cells=max(sum(job.values()), sum(res.values())),
            passed=res.get("pass", 0), failed=res.get("fail_accuracy", 0) + res.get("diverged", 0),
            errors=sum(n for s, n in res.items() if s in ERROR_STATUSES),
            pending=job.get("queued", 0) + job.get("running", 0), regressions=sum(kinds.values()),
            regression_kinds=kinds, flaky=sum(n for c, _, n in regs if c == "flaky"),
            improvements=sum(n for c, _, n in regs if c == "improvement")))
    return out


class _RevRow:
    """Adapts the ``r_*`` columns of a joined runs row to what :func:`_revision` reads."""

    def __init__(self, row: DbRow) -> None:
        self.sha: str = row.r_sha
        self.parents: list[str] | None = row.r_parents
        self.branch: str | None = row.r_branch
        self.author: str | None = row.r_author
        self.message: str | None = row.r_message
        self.committed_at: datetime | None = row.r_committed_at


@dataclass(frozen=True)
class HistoryRow:
    """One revision's result of a cell, with every plotted metric."""

    result_id: int
    run_id: int
    revision_sha: str
    message: str | None
    trigger: str
    created_at: datetime
    status: str
    cosine: float | None
    error_ratio: float | None
    max_abs: float | None
    latency_p50_ms: float | None
    latency_min_ms: float | None
    latency_max_ms: float | None
    speedup: float | None
    casts_inserted: int | None
    low_precision_fraction: float | None
    convert_s: float | None = None
    pass_iterations: int | None = None


def _floats(raw: object) -> list[float]:
    return [float(x) for x in raw if isinstance(x, int | float)] if isinstance(raw, list) else []


def cell_history(store: Store, cell: Cell, branch: str | None = "main", limit: int = 50) -> tuple[list[HistoryRow], int]:
    """(points oldest first, revisions available) for ``cell`` on ``branch`` (None: any branch).

    Only lineage runs (push, nightly, manual) count; each revision is one point, its newest result,
    placed where the revision was first tested (results ids grow with time).  The latency range is
    min–max of the raw samples.  At most ``limit`` newest revisions are returned.
    """
    model, dtype, policy, target = cell
    per_rev = (sa.select(t_res.c.revision_sha, sa.func.max(t_res.c.id).label("last"),
                         sa.func.min(t_res.c.id).label("first"))
               .join(t_run, t_run.c.id == t_res.c.run_id).join(t_rev, t_rev.c.sha == t_res.c.revision_sha)
               .where(t_res.c.model == model, t_res.c.dtype == dtype, t_res.c.policy == policy,
                      t_res.c.target == target, t_run.c.trigger.in_(LINEAGE_TRIGGERS))
               .group_by(t_res.c.revision_sha))
    if branch:
        per_rev = per_rev.where(t_rev.c.branch == branch)
    revs = per_rev.subquery("per_rev")
    with store.transaction() as conn:
        total = conn.execute(sa.select(sa.func.count()).select_from(revs)).scalar_one()
        picked = sa.select(revs.c.last, revs.c.first).order_by(revs.c.first.desc()).limit(limit).subquery()
        q = (sa.select(t_res.c.id, t_res.c.run_id, t_res.c.revision_sha, t_rev.c.message, t_run.c.trigger,
                       t_run.c.created_at, t_res.c.status, t_res.c.cosine, t_res.c.error_ratio, t_res.c.max_abs,
                       t_res.c.latency_p50_ms, t_res.c.speedup, t_res.c.casts_inserted,
                       t_res.c.low_precision_fraction, t_res.c.convert_s, t_res.c.pass_iterations, picked.c.first,
                       t_res.c.data[("latency", "samples_ms")].label("samples"),
                       t_res.c.data[("latency", "min_ms")].label("min_ms"))
             .join(picked, picked.c.last == t_res.c.id).join(t_run, t_run.c.id == t_res.c.run_id)
             .join(t_rev, t_rev.c.sha == t_res.c.revision_sha).order_by(picked.c.first))
        rows = conn.execute(q).all()
    out = []
    for r in rows:
        samples = _floats(r.samples)
        # an unmeasured latency (no samples: stored as p50 NULL, min_ms 0.0) has no range either, not "0"
        measured = r.latency_p50_ms is not None and isinstance(r.min_ms, int | float) and r.min_ms > 0
        lo = min(samples) if samples else (float(r.min_ms) if measured else None)
        out.append(HistoryRow(result_id=r.id, run_id=r.run_id, revision_sha=r.revision_sha, message=r.message,
                              trigger=r.trigger, created_at=utc(r.created_at),
                              status=r.status, cosine=r.cosine, error_ratio=r.error_ratio, max_abs=r.max_abs,
                              latency_p50_ms=r.latency_p50_ms,
                              latency_min_ms=lo, latency_max_ms=max(samples) if samples else None,
                              speedup=r.speedup, casts_inserted=r.casts_inserted,
                              low_precision_fraction=r.low_precision_fraction, convert_s=r.convert_s,
                              pass_iterations=r.pass_iterations))
    return out, int(total)


def cells_of(store: Store, model: str, dtype: str, policy: str | None = None,
             target: str | None = None) -> list[Cell]:
    """The cells with results for ``model``/``dtype`` (and ``policy``/``target`` when given), sorted."""
    q = sa.select(t_res.c.policy, t_res.c.target).where(t_res.c.model == model, t_res.c.dtype == dtype).distinct()
    if policy:
        q = q.where(t_res.c.policy == policy)
    if target:
        q = q.where(t_res.c.target == target)
    with store.transaction() as conn:
        return sorted((model, dtype, p, t) for p, t in conn.execute(q).all())


def cell_findings(store: Store, cell: Cell, run_ids: Sequence[int]) -> list[RegressionInfo]:
    """Findings (RegressionInfo) of ``cell`` stored by the given runs, oldest first."""
    if not run_ids:
        return []
    from service.db.result_queries import regression_info

    model, dtype, policy, target = cell
    with store.transaction() as conn:
        rows = conn.execute(sa.select(t_reg).where(
            t_reg.c.model == model, t_reg.c.dtype == dtype, t_reg.c.policy == policy, t_reg.c.target == target,
            t_reg.c.run_id.in_(list(run_ids))).order_by(t_reg.c.id)).all()
    return [regression_info(r) for r in rows]


def baseline_results(store: Store, run: RunInfo, cells: Sequence[Cell], depth: int = 500) -> dict[Cell, StoredResult]:
    """Each of ``cells``' baseline result in ``run`` (a :class:`~service.regressions.stored.StoredResult`), found
    by the detector's own :func:`~service.db.series.nearest`: from ``baseline_sha`` when the
    run has one (inclusive), else from the revision's ancestors (nightly: the revision itself
    included, earlier runs only)."""
    if not cells:
        return {}
    nightly = run.trigger == "nightly"
    start, include_self = (run.baseline_sha, True) if run.baseline_sha else (run.revision_sha, nightly)
    with store.transaction() as conn:
        return nearest(conn, start=start, include_self=include_self, run_id=run.id, cells=list(cells),
                       max_depth=depth, before_run=run.id if nightly else None)[0]


def bisect_runs(store: Store, keys: Sequence[str]) -> dict[str, RunInfo]:
    """Runs by dedup key for the given keys (missing keys are absent)."""
    if not keys:
        return {}
    with store.transaction() as conn:
        rows = conn.execute(sa.select(*RUN_COLUMNS).where(t_run.c.dedup_key.in_(list(keys)))).all()
    return {r.dedup_key: run_info(r) for r in rows}


def findings(store: Store, *, state: str | None = None, kind: str | None = None, category: str | None = None,
             model: str | None = None, dtype: str | None = None, since: datetime | None = None,
             limit: int = 200) -> list[RegressionInfo]:
    """At most ``limit`` findings of every run, newest first, each filter applied when given (``state``
    and ``category`` are checked by :meth:`Store.regressions`'s rules: UserError for an unknown state)."""
    from service.db.result_queries import REG_STATES, regression_info, regressions_query
    from service.errors import UserError

    if state is not None and state not in REG_STATES:
        raise UserError(f"unknown finding state {state!r}; expected one of {', '.join(REG_STATES)}")
    q = regressions_query(state=state, since=since, category=category, limit=limit)
    for col, value in (("kind", kind), ("model", model), ("dtype", dtype)):
        if value:
            q = q.where(t_reg.c[col] == value)
    with store.transaction() as conn:
        return [regression_info(r) for r in conn.execute(q)]
