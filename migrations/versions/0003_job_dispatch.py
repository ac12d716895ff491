"""job dispatch: a run records whether its jobs went to the broker or to a local pool

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 13:40:00.000000

``runs.dispatch`` is ``broker`` (one Celery message per job) or ``local`` (the embedded pool of the
process that created the run).  ``ampci reconcile`` re-sends only the jobs of ``broker`` runs, so an
embedded-mode sweep pointed at the distributed deployment's database no longer has its jobs
re-sent to Celery workers.  Existing runs were dispatched through the broker as far as anything
can tell (reconcile treated them so), so the column's server default fills them with ``broker``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0003'
down_revision: str | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# Never by copying the table on SQLite: ``runs`` is referenced by jobs and results with ON DELETE
# CASCADE and foreign keys are enforced, so dropping the old copy would delete them all.  SQLite
# adds and (from 3.35) drops a plain column in place.
SQLITE_DROP_COLUMN = (3, 35, 0)


def upgrade() -> None:
    with op.batch_alter_table('runs', schema=None, recreate='never') as batch_op:
        batch_op.add_column(sa.Column('dispatch', sa.String(length=16), server_default='broker', nullable=False))


def downgrade() -> None:
    # Without the column every queued job looks like a broker job again: a distributed reconcile
    # may re-send the jobs of local runs (the behaviour before 0003).
    bind = op.get_bind()
    if bind.dialect.name == 'sqlite':
        import sqlite3

        if sqlite3.sqlite_version_info < SQLITE_DROP_COLUMN:
            raise RuntimeError(f"downgrading below 0003 needs SQLite >= 3.35 (this is {sqlite3.sqlite_version}): "
                               "dropping runs.dispatch by copying the table would delete every job and result")
    with op.batch_alter_table('runs', schema=None, recreate='never') as batch_op:
        batch_op.drop_column('dispatch')
