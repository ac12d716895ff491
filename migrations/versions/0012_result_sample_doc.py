"""results.sample_doc: the parts of a result's document regression detection reads, stored beside it

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06 04:30:00.000000

Detection of a 200-cell run decoded ~600 whole result documents (``results.data``, ~2 kB each: accuracy per
output, environment, timings, ...) to read their latency, conversion-time and graph samples (issue 42).  The
store now writes, in the same statement as ``data``, its projection on the paths the rules read
(:func:`service.regressions.stored.sample_doc`, ~0.6 kB of compact JSON text), and detection reads that
instead: the same samples by construction.  Results stored before 0012 keep NULL and detection reads their
whole document (``coalesce(sample_doc, data)``): the same samples, only slower, so nothing is backfilled.

Drift judging reads the nearest 16 revisions of each cell's first-parent line in brief (cell, id, run, status:
3,200 rows for a 200-cell run); ``ix_results_revision_cell`` (revision, cell; on PostgreSQL with run, status and
id included) serves that read from the index alone, where ``ix_results_revision`` made it visit ~2,000 heap
pages of wide rows.  The downgrade drops the index and the column.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0012'
down_revision: str | None = '0011'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# In place on SQLite (see 0003): results is referenced by regressions with foreign keys enforced.
SQLITE_DROP_COLUMN = (3, 35, 0)


def upgrade() -> None:
    with op.batch_alter_table('results', schema=None, recreate='never') as batch_op:
        batch_op.add_column(sa.Column('sample_doc', sa.Text(), nullable=True))
    op.create_index('ix_results_revision_cell', 'results', ['revision_sha', 'model', 'dtype', 'policy', 'target'],
                    unique=False, postgresql_include=['run_id', 'status', 'id'])


def downgrade() -> None:
    if op.get_bind().dialect.name == 'sqlite':
        import sqlite3

        if sqlite3.sqlite_version_info < SQLITE_DROP_COLUMN:
            raise RuntimeError(f"downgrading below 0012 needs SQLite >= 3.35 (this is {sqlite3.sqlite_version})")
    op.drop_index('ix_results_revision_cell', table_name='results')
    with op.batch_alter_table('results', schema=None, recreate='never') as batch_op:
        batch_op.drop_column('sample_doc')
