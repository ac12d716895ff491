"""confirm_budgets: confirmation cells spent per pull request

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04 10:00:00.000000

A timing regression is confirmed by a confirmation run that times the suspected cells interleaved; code of a
pull request decides how many cells are suspected, so each pull request (repository, number) gets a budget of
confirmed cells across all its runs (``AMPCI_CONFIRM_MAX_PER_PR``).  This table counts what each one spent
(:mod:`service.db.budgets`).  The downgrade drops it: budgets start from zero again after an upgrade.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0008'
down_revision: str | None = '0007'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('confirm_budgets',
    sa.Column('repository', sa.String(length=200), nullable=False),
    sa.Column('pr_number', sa.Integer(), nullable=False),
    sa.Column('cells', sa.Integer(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('repository', 'pr_number', name=op.f('pk_confirm_budgets'))
    )


def downgrade() -> None:
    op.drop_table('confirm_budgets')
