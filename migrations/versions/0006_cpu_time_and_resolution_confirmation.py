"""conversion CPU time beside wall time; the state a regression returns to when its resolution is not confirmed

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 21:40:00.000000

``results.convert_cpu_s`` is the median of the user + system CPU seconds the conversion process itself
spent in each conversion-time sample (``GraphFacts.convert_cpu_s``: what the pass computed, without the
waiting a busy machine adds to wall time); NULL for results stored before 0006 or measured without it.

``regressions.state_before`` holds the state (``open`` or ``acknowledged``) of a timing regression while
a later run's recovery of it awaits confirmation (state ``suspected_resolved``): an unconfirmed recovery
puts it back exactly as it was (:mod:`service.regressions.confirm`); NULL otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0006'
down_revision: str | None = '0005'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# In place on SQLite (see 0003): results is referenced by regressions with foreign keys enforced.
SQLITE_DROP_COLUMN = (3, 35, 0)


def upgrade() -> None:
    with op.batch_alter_table('results', schema=None, recreate='never') as batch_op:
        batch_op.add_column(sa.Column('convert_cpu_s', sa.Float(), nullable=True))
    with op.batch_alter_table('regressions', schema=None, recreate='never') as batch_op:
        batch_op.add_column(sa.Column('state_before', sa.String(length=20), nullable=True))


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == 'sqlite':
        import sqlite3

        if sqlite3.sqlite_version_info < SQLITE_DROP_COLUMN:
            raise RuntimeError(f"downgrading below 0006 needs SQLite >= 3.35 (this is {sqlite3.sqlite_version})")
    with op.batch_alter_table('regressions', schema=None, recreate='never') as batch_op:
        batch_op.drop_column('state_before')
    with op.batch_alter_table('results', schema=None, recreate='never') as batch_op:
        batch_op.drop_column('convert_cpu_s')
