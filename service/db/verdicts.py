"""A run's stored verdict: written once when the run is judged, read by every view of the run.

``runs.verdict`` holds the brief the lists of runs show (:meth:`RunVerdict.brief
<service.regressions.verdict.RunVerdict.brief>`), ``runs.judgement`` the whole verdict (:meth:`RunVerdict.stored
<service.regressions.verdict.RunVerdict.stored>`: the facts it was decided from, the gate's decision and the
state), which the run page, the API, the CLI and the GitHub reports rebuild.  :func:`resolved_since` reads, for
the lists and the views, which later runs resolved a run's regressions: shown beside the stored verdict, never
written into it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from service.db import models as m
from service.db.records import RegressionInfo
from service.db.result_queries import regression_info, regressions_query
from service.json_types import JsonObject

t_run, t_reg, t_res = m.Run.__table__, m.Regression.__table__, m.Result.__table__


def record(conn: Connection, *, run_id: int, brief: JsonObject | None, judgement: JsonObject | None) -> None:
    """Store run ``run_id``'s verdict: its ``brief`` and its whole ``judgement`` (None clears them)."""
    conn.execute(t_run.update().where(t_run.c.id == run_id).values(verdict=brief, judgement=judgement))


def judgement(conn: Connection, *, run_id: int) -> JsonObject | None:
    """Run ``run_id``'s stored whole verdict (None: none stored, or the run is unknown)."""
    value = conn.execute(sa.select(t_run.c.judgement).where(t_run.c.id == run_id)).scalar()
    if isinstance(value, str):  # a driver may hand JSON back as text
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return dict(value) if isinstance(value, dict) else None


def resolved_since(conn: Connection, *, run_ids: Iterable[int]) -> dict[int, tuple[int, tuple[int, ...]]]:
    """For each of ``run_ids`` with regressions a later run resolved: ``(how many, the resolving runs in
    ascending order)``; runs without any are absent.  One query whatever the number of runs."""
    ids = sorted(set(run_ids))
    if not ids:
        return {}
    q = (sa.select(t_reg.c.run_id, t_res.c.run_id.label("by"))
         .select_from(t_reg.outerjoin(t_res, t_res.c.id == t_reg.c.resolved_by_result_id))
         .where(t_reg.c.run_id.in_(ids), t_reg.c.category == "regression", t_reg.c.state == "resolved"))
    found: dict[int, list[int | None]] = {}
    for run_id, by in conn.execute(q):
        found.setdefault(int(run_id), []).append(None if by is None else int(by))
    return {run_id: (len(bys), tuple(sorted({b for b in bys if b is not None})))
            for run_id, bys in found.items()}


def resolved_by(conn: Connection, *, run_id: int) -> list[RegressionInfo]:
    """The earlier regressions run ``run_id`` resolved (or suspects resolved, awaiting confirmation): the
    findings whose ``resolved_by_result_id`` is one of its results, newest first."""
    mine = sa.select(t_res.c.id).where(t_res.c.run_id == run_id).scalar_subquery()
    q = regressions_query().where(t_reg.c.resolved_by_result_id.in_(mine),
                                  t_reg.c.state.in_(("resolved", "suspected_resolved")))
    return [regression_info(r) for r in conn.execute(q)]
