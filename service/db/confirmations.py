"""What confirmation of timing findings reads: the findings a run's confirmation decides, its confirmation run,
that run's results.

Each function takes an open connection and returns plain records (:class:`service.db.records.RegressionInfo`,
:class:`service.regressions.confirm.ConfirmResult`); the decisions are in :mod:`service.regressions.confirm`.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from service.db import models as m
from service.db.records import RegressionInfo
from service.db.result_queries import regression_info
from service.regressions.confirm import (
    CONFIRM_TRIGGER,
    SUSPECTED,
    SUSPECTED_RESOLVED,
    ConfirmResult,
    dedup_key,
)
from service.regressions.rules import CAPPED_BY

t_run, t_res, t_reg = m.Run.__table__, m.Result.__table__, m.Regression.__table__


@dataclass(frozen=True)
class ConfirmRun:
    """A run's confirmation run: its id and status."""

    id: int
    status: str


def _awaiting(run_id: int) -> sa.ColumnElement[bool]:
    """The findings run ``run_id``'s confirmation decides: its own suspected ones (but those a cap left out),
    and the earlier timing regressions whose recovery one of its results suspects."""
    not_capped = sa.or_(t_reg.c.state_by.is_(None), t_reg.c.state_by != CAPPED_BY)
    return sa.or_(sa.and_(t_reg.c.run_id == run_id, t_reg.c.state == SUSPECTED, not_capped),
                  sa.and_(t_reg.c.state == SUSPECTED_RESOLVED, t_reg.c.resolved_by_result_id.in_(
                      sa.select(t_res.c.id).where(t_res.c.run_id == run_id))))


def awaiting(conn: Connection, *, run_id: int) -> list[RegressionInfo]:
    """The findings run ``run_id``'s confirmation decides (see :func:`_awaiting`), by id."""
    return [regression_info(r) for r in conn.execute(sa.select(t_reg).where(_awaiting(run_id)).order_by(t_reg.c.id))]


def confirm_run(conn: Connection, *, run_id: int) -> ConfirmRun | None:
    """The confirmation run of run ``run_id`` (None: not created)."""
    row = conn.execute(sa.select(t_run.c.id, t_run.c.status).where(
        t_run.c.dedup_key == dedup_key(run_id), t_run.c.trigger == CONFIRM_TRIGGER)).first()
    return None if row is None else ConfirmRun(row.id, row.status)


def confirm_results(conn: Connection, *, confirm_run_id: int) -> dict[tuple[str, str, str, str], ConfirmResult]:
    """The results of confirmation run ``confirm_run_id`` by cell (the newest of a cell when it has several)."""
    rows = conn.execute(sa.select(t_res.c.id, t_res.c.model, t_res.c.dtype, t_res.c.policy, t_res.c.target,
                                  t_res.c.status, t_res.c.message, t_res.c.data)
                        .where(t_res.c.run_id == confirm_run_id).order_by(t_res.c.id))
    out = {}
    for r in rows:
        cell = (r.model, r.dtype, r.policy, r.target)
        out[cell] = ConfirmResult(r.id, cell, r.status, r.message, r.data or {})
    return out


def confirmed_run(conn: Connection, *, run_id: int) -> int | None:
    """The run that confirmation run ``run_id`` confirms (None when ``run_id`` is no confirmation run)."""
    row = conn.execute(sa.select(t_run.c.trigger, t_run.c.meta).where(t_run.c.id == run_id)).first()
    if row is None or row.trigger != CONFIRM_TRIGGER:
        return None
    parent = (row.meta or {}).get("confirms")
    return int(parent) if isinstance(parent, int) else None
