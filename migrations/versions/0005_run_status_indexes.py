"""run status indexes: the per-run status counts of the dashboard's front page read an index, not the table

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02 17:30:00.000000

``/`` lists the 50 newest runs with their result and job counts by status (``GROUP BY run_id, status``
over those runs).  Without an index holding both columns PostgreSQL reads the whole ``results`` and
``jobs`` tables for it, so the page grew with the history (17 -> 69 ms from 10k to 100k results);
``ix_results_run_status`` and ``ix_jobs_run_status`` let it count the shown runs' rows from the index
alone (an index-only scan), whatever the size of the history.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op


revision: str = '0005'
down_revision: str | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index('ix_results_run_status', 'results', ['run_id', 'status'], unique=False)
    op.create_index('ix_jobs_run_status', 'jobs', ['run_id', 'status'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_jobs_run_status', table_name='jobs')
    op.drop_index('ix_results_run_status', table_name='results')
