"""result conversion metrics: the worker-timed conversion seconds and the pass's fixpoint iterations

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 23:10:00.000000

``results.convert_s`` is the median of the conversion wall times the worker measured for the job
(``GraphFacts.convert_samples_s``, else its single ``convert_seconds``); ``results.pass_iterations`` the
painting fixpoint iterations the pass reported.  Both are columns so that ``ampci compare``, ``ampci
history`` and the dashboard show them like every other metric; results stored before 0004 keep NULL
(their figures were not measured this way).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0004'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# In place on SQLite (see 0003): results is referenced by regressions with foreign keys enforced.
SQLITE_DROP_COLUMN = (3, 35, 0)


def upgrade() -> None:
    with op.batch_alter_table('results', schema=None, recreate='never') as batch_op:
        batch_op.add_column(sa.Column('convert_s', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('pass_iterations', sa.Integer(), nullable=True))


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == 'sqlite':
        import sqlite3

        if sqlite3.sqlite_version_info < SQLITE_DROP_COLUMN:
            raise RuntimeError(f"downgrading below 0004 needs SQLite >= 3.35 (this is {sqlite3.sqlite_version})")
    with op.batch_alter_table('results', schema=None, recreate='never') as batch_op:
        batch_op.drop_column('pass_iterations')
        batch_op.drop_column('convert_s')
