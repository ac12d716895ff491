"""runs.verdict: the gate's verdict of a run as recorded when it was judged, for the lists of runs

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05 10:00:00.000000

The runs page and ``ampci runs`` show each run's verdict first (issue 34).  Deciding it takes a dozen queries
per run (results, jobs, each cell's baseline along the ancestry, findings: :func:`service.orchestration.judge
.run_verdict`), so the run's finisher records its brief form (:meth:`RunVerdict.brief
<service.regressions.verdict.RunVerdict.brief>`: state, exit code, headline, counts) here when it judges the
run, and again when one of its findings is triaged; the lists read it with the run.  NULL: not judged since
the column exists (older runs, unfinished ones).  The downgrade drops the column.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0009'
down_revision: str | None = '0008'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SQLITE_DROP_COLUMN = (3, 35, 0)


def upgrade() -> None:
    with op.batch_alter_table('runs', schema=None, recreate='never') as batch_op:
        batch_op.add_column(sa.Column('verdict', sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    if op.get_bind().dialect.name == 'sqlite':
        import sqlite3

        if sqlite3.sqlite_version_info < SQLITE_DROP_COLUMN:
            raise RuntimeError(f"downgrading below 0009 needs SQLite >= 3.35 (this is {sqlite3.sqlite_version})")
    with op.batch_alter_table('runs', schema=None, recreate='never') as batch_op:
        batch_op.drop_column('verdict')
