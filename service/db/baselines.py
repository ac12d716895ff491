"""Queries of baseline runs: what a baseline revision already has or is measuring, and which runs wait.

Small keyword-only functions over a connection for :mod:`service.orchestration.baseline_runs`, which
plans the baseline runs of webhook runs and decides when a run may be judged.
"""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from service.db import models as m
from service.db.records import Cell
from service.json_types import JsonObject
from service.vocabulary import FINAL_RUN_STATES
from workers.result import NOT_OF_THE_PASS

t_run, t_res, t_job = m.Run.__table__, m.Result.__table__, m.Job.__table__
#: Runs whose results are never a baseline (they time two revisions at once) nor measure the baseline's cells.
NOT_BASELINE_TRIGGERS = ("confirm",)


def measured_cells(conn: Connection, *, shas: Iterable[str]) -> dict[str, set[Cell]]:
    """Revision -> the cells with a result there (results of confirmation runs, and results that are not of the pass,
    :data:`workers.result.NOT_OF_THE_PASS`, do not count: such a cell is measured again), for ``shas``."""
    shas = list(shas)
    have: dict[str, set[Cell]] = {s: set() for s in shas}
    not_special = sa.and_(t_res.c.run_id.not_in(sa.select(t_run.c.id).where(t_run.c.trigger.in_(NOT_BASELINE_TRIGGERS))),
                          t_res.c.status.not_in(sorted(NOT_OF_THE_PASS)))
    for r in conn.execute(sa.select(t_res.c.revision_sha, t_res.c.model, t_res.c.dtype, t_res.c.policy,
                                    t_res.c.target).distinct().where(t_res.c.revision_sha.in_(shas), not_special)):
        have[r.revision_sha].add((r.model, r.dtype, r.policy, r.target))
    return have


def cells_being_measured(conn: Connection, *, shas: Iterable[str]) -> dict[str, dict[Cell, int]]:
    """Revision -> cell -> the unfinished run (not a confirmation run) with a queued or running job of
    that cell there, for ``shas``."""
    shas = list(shas)
    busy: dict[str, dict[Cell, int]] = {s: {} for s in shas}
    rows = conn.execute(sa.select(t_run.c.revision_sha, t_run.c.id, t_job.c.model, t_job.c.dtype, t_job.c.policy,
                                  t_job.c.target).join(t_job, t_job.c.run_id == t_run.c.id)
                        .where(t_run.c.revision_sha.in_(shas), t_run.c.status.not_in(FINAL_RUN_STATES),
                               t_run.c.trigger.not_in(NOT_BASELINE_TRIGGERS),
                               t_job.c.status.in_(("queued", "running"))))
    for r in rows:
        busy[r.revision_sha][(r.model, r.dtype, r.policy, r.target)] = r.id
    return busy


def count_final_runs(conn: Connection, *, run_ids: Iterable[int]) -> int:
    """How many of the runs ``run_ids`` are final (:data:`service.vocabulary.FINAL_RUN_STATES`)."""
    return int(conn.execute(sa.select(sa.func.count()).where(t_run.c.id.in_(list(run_ids)),
                                                             t_run.c.status.in_(FINAL_RUN_STATES))).scalar_one())


def unfinished_runs_judged_against(conn: Connection, *, sha: str) -> list[tuple[int, JsonObject]]:
    """(id, meta) of every run not final whose baseline is revision ``sha``, oldest first."""
    rows = conn.execute(sa.select(t_run.c.id, t_run.c.meta).where(
        t_run.c.baseline_sha == sha, t_run.c.status.not_in(FINAL_RUN_STATES)).order_by(t_run.c.id)).all()
    return [(r.id, r.meta) for r in rows]
