"""webhook intake: pending deliveries carry their validated payload

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 10:00:00.000000

The webhook handler now stores a run-requesting delivery as ``pending`` with its compact,
validated payload in one statement and answers; a background intake creates the run later.
``payload`` holds that request until the delivery is accepted; the ``(status, received_at)``
index lets the intake find pending deliveries oldest first without scanning the table.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0002'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.add_column(sa.Column('payload', sa.JSON(), nullable=True))
        batch_op.create_index('ix_webhook_deliveries_pending', ['status', 'received_at'], unique=False)


def downgrade() -> None:
    # Pending deliveries cannot be represented without their payload: they become rejected, so a
    # redelivery from GitHub processes them again.
    op.execute("UPDATE webhook_deliveries SET status = 'rejected', "
               "reason = 'pending when the schema was downgraded; redeliver' WHERE status = 'pending'")
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.drop_index('ix_webhook_deliveries_pending')
        batch_op.drop_column('payload')
