"""Confirmation budgets of pull requests (table ``confirm_budgets``): what each one spent, and spending it.

Small keyword-only functions over a connection, called inside the caller's transaction: the confirmation of
a run (:mod:`service.orchestration.confirm_run`) locks the pull request's row with :func:`lock`, creates its
confirmation run and adds the cells it was granted with :func:`spend`, all in one transaction, so the cells
charged and the run that times them are committed together or not at all.  :func:`lock` holds the row until
that transaction ends (``SELECT … FOR UPDATE`` on PostgreSQL; SQLite transactions start ``BEGIN IMMEDIATE``,
one writer at a time), so concurrent runs of one pull request are granted from what the others left and
never more than the limit in all.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from service.db import models as m
from service.db.runs import dialect_insert

t_budget = m.ConfirmBudget.__table__


def _this(repository: str, pr_number: int) -> sa.ColumnElement[bool]:
    return sa.and_(t_budget.c.repository == repository, t_budget.c.pr_number == pr_number)


def lock(conn: Connection, *, repository: str, pr_number: int, now: datetime) -> int:
    """Lock the budget row of pull request ``repository#pr_number`` until ``conn``'s transaction ends (created
    with nothing spent when missing); returns the cells it has spent."""
    ins = dialect_insert(conn, t_budget)
    conn.execute(ins.on_conflict_do_nothing(index_elements=[t_budget.c.repository, t_budget.c.pr_number]),
                 {"repository": repository, "pr_number": pr_number, "cells": 0, "updated_at": now})
    return int(conn.execute(sa.select(t_budget.c.cells).where(_this(repository, pr_number))
                            .with_for_update()).scalar_one())


def spend(conn: Connection, *, repository: str, pr_number: int, cells: int, now: datetime) -> int:
    """Add ``cells`` to what pull request ``repository#pr_number`` spent (its row locked by :func:`lock` in this
    transaction); returns the new total."""
    return int(conn.execute(t_budget.update().where(_this(repository, pr_number))
                            .values(cells=t_budget.c.cells + cells, updated_at=now)
                            .returning(t_budget.c.cells)).scalar_one())


def spent(conn: Connection, *, repository: str, pr_number: int) -> int:
    """The cells pull request ``repository#pr_number`` has spent (0 when it never confirmed anything)."""
    got = conn.execute(sa.select(t_budget.c.cells).where(_this(repository, pr_number))).scalar()
    return int(got or 0)
