"""What regression detection reads: a run's results, each cell's baseline along the ancestry, earlier results
(nightly series, flaky lineage), the first-parent lookback of drift, and the earlier findings a run may resolve.

Every function takes an open connection and returns plain records of :mod:`service.regressions.stored` (or
:class:`service.db.records.RegressionInfo`): the rules never see a row.  The statements are built once, with
bound values (a statement object made afresh on every call costs its construction and its cache key each time).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import TypeAlias

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from service.db import models as m
from service.db.engine import DbRow
from service.db.models import DbTable
from service.db.queries import ancestors
from service.db.records import RegressionInfo
from service.db.result_queries import regression_info
from service.regressions.confirm import CONFIRM_TRIGGER
from service.regressions.detect import LINEAGE_TRIGGERS
from service.regressions.stored import BriefResult, Cell, HistoryResult, LineFinding, StoredResult
from workers.result import NOT_OF_THE_PASS

t_rev, t_run, t_res, t_reg = (m.Revision.__table__, m.Run.__table__, m.Result.__table__,
                              m.Regression.__table__)
CELL = (t_res.c.model, t_res.c.dtype, t_res.c.policy, t_res.c.target)
#: The result columns a StoredResult is built from, its sample summary ``sample_doc`` (what the rules read of
#: ``data``, already read: :func:`service.regressions.stored.sample_doc`) and, for a result stored without one
#: (before migration 0012), ``data`` whole *as text* (labelled ``doc``): :func:`service.regressions.stored.sample`
#: reads the summary, or the document's JSON paths (latency samples, convergence unit, graph figures) in
#: Python, parsing either only when a rule needs that result.  Not a dozen JSON-path
#: expressions on the server: ``results.data`` is ``json``, so each would re-parse the stored text there (6x the
#: query time), and one cast to ``jsonb`` to extract them from costs the server more than ``json.loads`` costs
#: the client (26 vs 19 us for a 2 kB document).  The cell comes first (:func:`stored`), the other columns in
#: the order of StoredResult's fields.
SAMPLE_COLS = (*CELL, t_res.c.id, t_res.c.run_id, t_res.c.revision_sha, t_res.c.status, t_res.c.max_abs,
               t_res.c.cosine, t_res.c.final_error, t_res.c.diverged, t_res.c.low_precision_fraction,
               t_res.c.casts_inserted, t_res.c.env_fingerprint, t_res.c.latency_p50_ms,
               sa.case((t_res.c.sample_doc.is_(None), sa.cast(t_res.c.data, sa.Text))).label("doc"),
               t_res.c.sample_doc.label("summary"))
#: The columns of a result read in brief (:class:`~service.regressions.stored.BriefResult`: :func:`line_briefs`).
BRIEF_COLS = (*CELL, t_res.c.id, t_res.c.run_id, t_res.c.revision_sha, t_res.c.status)
#: Results of confirmation runs time two revisions at once: never a baseline (:mod:`service.regressions.confirm`).
NOT_CONFIRMATION = t_res.c.run_id.not_in(sa.select(t_run.c.id).where(t_run.c.trigger == CONFIRM_TRIGGER))
#: Results that are not of the pass (ampci's failures, cells not run: :data:`workers.result.NOT_OF_THE_PASS`) are
#: never a baseline, never pooled with one, never in a drift line nor a flaky lineage.
OF_THE_PASS = t_res.c.status.not_in(sorted(NOT_OF_THE_PASS))


#: A row selected with SAMPLE_COLS: the cell, then the other fields of StoredResult in order (``doc`` as text).
SampleRow: TypeAlias = tuple[str, str, str, str, int, int, str, str, float | None, float | None, float | None,
                             bool | None, float | None, int | None, str | None, float | None, str | None,
                             str | None]


def stored(row: SampleRow) -> StoredResult:
    """The StoredResult of a row selected with SAMPLE_COLS (read by position: a Row's attribute lookup costs
    15x its index)."""
    return StoredResult(row[:4], *row[4:])  # a Row slice is a plain tuple


def _cell(row: DbRow) -> Cell:
    return (row.model, row.dtype, row.policy, row.target)


#: The other side of :func:`_same_cell`, built once (an alias copies every column of ``results`` when made).
_CUR = t_res.alias("cur")


def _same_cell(other: DbTable, run_id: int | sa.BindParameter[int]) -> sa.ColumnElement[bool]:
    """Join condition: ``other``'s cell is one of the cells of run ``run_id`` (no bound cell lists)."""
    cur = _CUR
    return sa.exists().where(cur.c.run_id == run_id, cur.c.model == other.c.model, cur.c.dtype == other.c.dtype,
                             cur.c.policy == other.c.policy, cur.c.target == other.c.target)


class _Statements:
    """Detection's statements, with bound ``run_id`` (and the other values each names), built once."""

    def __init__(self) -> None:
        run_id: sa.BindParameter[int] = sa.bindparam("run_id")
        chunk = sa.select(*SAMPLE_COLS).where(t_res.c.revision_sha.in_(sa.bindparam("shas", expanding=True)),
                                              t_res.c.run_id != run_id, _same_cell(t_res, run_id), NOT_CONFIRMATION,
                                              OF_THE_PASS)
        branch = sa.select(t_rev.c.branch).where(t_rev.c.sha == sa.bindparam("sha")).scalar_subquery()
        run_ids = (sa.select(t_run.c.id).join(t_rev, t_rev.c.sha == t_run.c.revision_sha)
                   .where(t_run.c.id < run_id, t_run.c.trigger.in_(sa.bindparam("triggers", expanding=True)),
                          sa.or_(sa.func.coalesce(branch, "") == "", t_rev.c.branch == branch))
                   .order_by(t_run.c.id.desc()).limit(sa.bindparam("limit")))
        history = (sa.select(*CELL, t_res.c.run_id, t_res.c.id, t_res.c.status, t_res.c.latency_p50_ms,
                             t_res.c.env_fingerprint)
                   .where(t_res.c.run_id.in_(run_ids.scalar_subquery()), OF_THE_PASS).order_by(t_res.c.run_id))
        self.current = sa.select(*SAMPLE_COLS).where(t_res.c.run_id == run_id)
        self.chunk = chunk
        # the same rows in brief (drift judging fetches the few it samples whole: results_by_id)
        self.chunk_brief = chunk.with_only_columns(*BRIEF_COLS)
        self.by_id = sa.select(*SAMPLE_COLS).where(t_res.c.id.in_(sa.bindparam("ids", expanding=True)))
        self.chunk_before = chunk.where(t_res.c.run_id < sa.bindparam("before_run"))
        self.history = history.where(_same_cell(t_res, run_id))
        self.history_of_models = history.where(t_res.c.model.in_(sa.bindparam("models", expanding=True)))
        self.open_regressions = sa.select(t_reg).join(t_run, t_run.c.id == t_reg.c.run_id).where(
            t_run.c.trigger.in_(LINEAGE_TRIGGERS), t_reg.c.category == "regression",
            t_reg.c.state.in_(("open", "acknowledged")), t_reg.c.run_id < run_id,
            t_reg.c.baseline_result_id.is_not(None), _same_cell(t_reg, run_id))
        self.open_kinds = sa.select(t_reg.c.model, t_reg.c.dtype, t_reg.c.policy, t_reg.c.target, t_reg.c.kind).where(
            t_reg.c.run_id < run_id, t_reg.c.category == "regression", t_reg.c.state.in_(("open", "acknowledged")),
            _same_cell(t_reg, run_id))
        self.earlier_on_line = sa.select(*(t_reg.c[k] for k in ("model", "dtype", "policy", "target", "kind",
                                                               "metric", "revision_sha", "state"))).where(
            t_reg.c.run_id < run_id, t_reg.c.category == "regression", t_reg.c.state != "resolved",
            t_reg.c.revision_sha.in_(sa.bindparam("shas", expanding=True)), _same_cell(t_reg, run_id))
        self.pool = sa.select(*SAMPLE_COLS).where(t_res.c.revision_sha.in_(sa.bindparam("shas", expanding=True)),
                                                  t_res.c.run_id != run_id, _same_cell(t_res, run_id),
                                                  NOT_CONFIRMATION, OF_THE_PASS).order_by(t_res.c.id.desc())
        self.cells_of_run = sa.select(*CELL).where(t_res.c.run_id == run_id)


_Q = _Statements()


def current_results(conn: Connection, *, run_id: int) -> dict[Cell, StoredResult]:
    """The results of run ``run_id`` by cell."""
    return {(r := stored(row)).cell: r for row in conn.execute(_Q.current, {"run_id": run_id}).all()}


def cells_of_run(conn: Connection, *, run_id: int) -> list[Cell]:
    """The cells run ``run_id`` has a result of, sorted."""
    return sorted({_cell(r) for r in conn.execute(_Q.cells_of_run, {"run_id": run_id})})


def cells_with_results(conn: Connection, *, sha: str) -> set[Cell]:
    """The cells that have at least one result at revision ``sha`` (any run)."""
    return {_cell(r) for r in conn.execute(sa.select(*CELL).distinct().where(t_res.c.revision_sha == sha))}


def nearest(conn: Connection, *, start: str, include_self: bool, run_id: int, cells: Sequence[Cell],
            max_depth: int, before_run: int | None = None
            ) -> tuple[dict[Cell, StoredResult], dict[Cell, list[StoredResult]]]:
    """For each of ``cells`` (the cells of ``run_id``), the newest result at the nearest ancestor of ``start``
    that has one (results of ``run_id`` and of confirmation runs excluded; before run ``before_run`` when
    given), and every result of that cell at that revision the search fetched (the baseline included).

    Ancestors are searched in growing chunks (1, 4, 16, … revisions; the deep ancestry is only walked when the
    near one lacks a cell), so the usual case costs two small queries."""
    missing = set(cells)
    found: dict[Cell, StoredResult] = {}
    fetched: dict[tuple[Cell, str], list[StoredResult]] = defaultdict(list)
    anc = ancestors(conn, start, 4, include_self)
    deep = False
    i, size = 0, 1
    while missing:
        if i >= len(anc):
            if deep or not anc or anc[-1][1] < 4:
                break
            seen = {sha for sha, _ in anc}
            anc = anc + [a for a in ancestors(conn, start, max_depth, include_self) if a[0] not in seen]
            deep = True
            continue
        chunk = anc[i:i + size]
        depth = dict(chunk)
        i, size = i + size, size * 4
        params = {"shas": list(depth), "run_id": run_id, "before_run": before_run}
        best: dict[Cell, StoredResult] = {}
        for row in conn.execute(_Q.chunk if before_run is None else _Q.chunk_before, params).all():
            c = tuple(row[:4])
            if c not in missing:
                continue
            r = stored(row)
            fetched[r.cell, r.revision_sha].append(r)
            cur = best.get(r.cell)
            if cur is None or (depth[r.revision_sha], -r.id) < (depth[cur.revision_sha], -cur.id):
                best[r.cell] = r
        found.update(best)
        missing -= set(best)
    return found, {c: fetched[c, r.revision_sha] for c, r in found.items()}


def history(conn: Connection, *, run_id: int, sha: str, triggers: Sequence[str], limit: int,
            cells: Sequence[Cell] | None = None) -> dict[Cell, list[HistoryResult]]:
    """Results of run ``run_id``'s cells (or of ``cells`` only) in the last ``limit`` runs with one of
    ``triggers`` before it, oldest first; on the branch of revision ``sha`` (the run's) when it has one (else any
    branch).  One statement: the branch and the run ids are subqueries."""
    if limit <= 0 or (cells is not None and not cells):
        return {}
    wanted = None if cells is None else set(cells)
    params = {"run_id": run_id, "sha": sha, "triggers": list(triggers), "limit": limit,
              "models": sorted({c[0] for c in wanted or ()})}
    out: dict[Cell, list[HistoryResult]] = defaultdict(list)
    for r in conn.execute(_Q.history if wanted is None else _Q.history_of_models, params).all():
        c: Cell = tuple(r[:4])
        if wanted is None or c in wanted:
            out[c].append(HistoryResult(c, *r[4:]))
    return out


def open_kinds(conn: Connection, *, run_id: int) -> set[tuple[Cell, str]]:
    """(cell, kind) of each regression open or acknowledged before run ``run_id`` on one of its cells."""
    return {(_cell(r), r.kind) for r in conn.execute(_Q.open_kinds, {"run_id": run_id})}


def baseline_pools(conn: Connection, *, run_id: int, base: dict[Cell, StoredResult],
                   limit: int) -> dict[Cell, list[StoredResult]]:
    """For each baseline result in ``base``, up to ``limit - 1`` more results of the same cell at the same
    revision, newest first (run ``run_id``, confirmation runs and the baseline results excluded)."""
    if limit <= 1 or not base:
        return {}
    used = {b.id for b in base.values()}
    out: dict[Cell, list[StoredResult]] = defaultdict(list)
    for row in conn.execute(_Q.pool, {"run_id": run_id, "shas": sorted({b.revision_sha for b in base.values()})}):
        r = stored(row)
        b = base.get(r.cell)
        if b is None or r.id in used or r.revision_sha != b.revision_sha or len(out[r.cell]) >= limit - 1:
            continue
        out[r.cell].append(r)
    return out


def line_results(conn: Connection, *, run_id: int, shas: Sequence[str]) -> list[StoredResult]:
    """The results at revisions ``shas`` of run ``run_id``'s cells (its own and confirmation runs' excluded)."""
    return [stored(r) for r in conn.execute(_Q.chunk, {"shas": list(shas), "run_id": run_id}).all()]


def line_briefs(conn: Connection, *, run_id: int, shas: Sequence[str]) -> list[BriefResult]:
    """The results of :func:`line_results` in brief: cell, id, run, revision and status, the rest left on the
    server (:func:`results_by_id` reads it: :class:`service.regressions.stored.Samples`)."""
    rows = conn.execute(_Q.chunk_brief, {"shas": list(shas), "run_id": run_id}).all()  # one fetch, not one a row
    new = tuple.__new__  # the NamedTuple's own __new__ is a Python call per row (3,200 rows: 0.3 ms)
    return [new(BriefResult, (r[:4], r[4], r[5], r[6], r[7])) for r in rows]


def earlier_on_line(conn: Connection, *, run_id: int, shas: Sequence[str]) -> list[LineFinding]:
    """The unresolved regressions of run ``run_id``'s cells found before it at revisions ``shas``."""
    rows = conn.execute(_Q.earlier_on_line, {"run_id": run_id, "shas": list(shas)}).all()
    return [LineFinding(_cell(r), r.kind, r.metric, r.revision_sha, r.state) for r in rows]


def open_regressions(conn: Connection, *, run_id: int) -> list[RegressionInfo]:
    """The regressions of ``push``/``nightly``/``manual`` runs before run ``run_id`` on its cells that are open
    or acknowledged and have a baseline result (those a later result may resolve)."""
    return [regression_info(r) for r in conn.execute(_Q.open_regressions, {"run_id": run_id}).all()]


def results_by_id(conn: Connection, *, ids: Iterable[int]) -> dict[int, StoredResult]:
    """The results with ids ``ids`` (those that exist)."""
    return {(r := stored(row)).id: r for row in conn.execute(_Q.by_id, {"ids": sorted(set(ids))}).all()}


def cell_results(conn: Connection, *, cell: Cell, shas: Sequence[str],
                 ids: Iterable[int]) -> dict[int, StoredResult]:
    """The results of ``cell`` at revisions ``shas``, and those with ids ``ids``, by id."""
    q = sa.select(*SAMPLE_COLS).where(
        t_res.c.model == cell[0], t_res.c.dtype == cell[1], t_res.c.policy == cell[2], t_res.c.target == cell[3],
        sa.or_(t_res.c.revision_sha.in_(shas), t_res.c.id.in_(tuple(ids))))
    return {(r := stored(row)).id: r for row in conn.execute(q)}
