"""runs.judgement: a run's whole verdict as decided when it was judged, which every view of the run reads

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06 01:30:00.000000

The run page, the API, ``ampci regressions --run``, the pull-request comment and the check run decided a run's
verdict afresh on every read, so a later run that resolved its findings turned "gate fails" into "gate passes"
there while the lists (``runs.verdict``, 0009) still said "fails" (issue 39).  The run's finisher now stores the
facts it decided from, the gate's decision and the state here (:meth:`RunVerdict.stored
<service.regressions.verdict.RunVerdict.stored>`) beside the brief in ``runs.verdict``; every view rebuilds the
verdict from it and shows a later resolution beside it.  NULL: a run judged before this column (its verdict is
decided on its first read and stored then: :func:`service.orchestration.judge.run_verdict`), or not judged yet.
A column of its own, not ``runs.verdict``: the lists read that one for every run they show, and this one holds
every cell's outcome.  The downgrade drops the column.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0011'
down_revision: str | None = '0010'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SQLITE_DROP_COLUMN = (3, 35, 0)


def upgrade() -> None:
    with op.batch_alter_table('runs', schema=None, recreate='never') as batch_op:
        batch_op.add_column(sa.Column('judgement', sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    if op.get_bind().dialect.name == 'sqlite':
        import sqlite3

        if sqlite3.sqlite_version_info < SQLITE_DROP_COLUMN:
            raise RuntimeError(f"downgrading below 0011 needs SQLite >= 3.35 (this is {sqlite3.sqlite_version})")
    with op.batch_alter_table('runs', schema=None, recreate='never') as batch_op:
        batch_op.drop_column('judgement')
