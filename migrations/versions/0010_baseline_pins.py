"""baseline_pins: a pinned drift reference per branch

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05 10:00:00.000000

Drift detection judges each run against its parent and against an older reference: a lookback window of the
cell's history and, when one is pinned (``ampci baseline pin REV``), that revision (:mod:`service.db.pins`).
The downgrade drops the table: the pins are forgotten.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0010'
down_revision: str | None = '0009'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('baseline_pins',
    sa.Column('branch', sa.String(length=200), nullable=False),
    sa.Column('sha', sa.String(length=64), nullable=False),
    sa.Column('pinned_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('note', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['sha'], ['revisions.sha'], name=op.f('fk_baseline_pins_sha_revisions'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('branch', name=op.f('pk_baseline_pins'))
    )


def downgrade() -> None:
    op.drop_table('baseline_pins')
