"""runs.local_owner: the process running a local run's jobs, a column instead of a key of runs.meta

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 21:45:00.000000

The embedded pool records which process runs a ``local`` run's jobs (``{"host", "pid", "start"}``; NULL:
nobody, e.g. handed back by a clean stop) so that a later ``ampci serve``/``sweep``/``reconcile --resume``
adopts the jobs of a dead owner and never a live one's (:mod:`service.orchestration.orphans`).  Until
0006 it lived in ``runs.meta["local_owner"]``, where every claim rewrote the run's whole meta and the
API showed it as run metadata.  The upgrade moves each stored owner to the column (and out of meta); the
downgrade moves it back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0007'
down_revision: str | None = '0006'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KEY = 'local_owner'
SQLITE_DROP_COLUMN = (3, 35, 0)
runs = sa.table('runs', sa.column('id', sa.Integer), sa.column('meta', sa.JSON),
                sa.column(KEY, sa.JSON(none_as_null=True)))


def _meta(value: object) -> dict:
    if isinstance(value, str):  # a driver that hands JSON back as text
        value = json.loads(value)
    return dict(value) if isinstance(value, dict) else {}


def upgrade() -> None:
    with op.batch_alter_table('runs', schema=None, recreate='never') as batch_op:
        batch_op.add_column(sa.Column(KEY, sa.JSON(none_as_null=True), nullable=True))
    conn = op.get_bind()
    # the few runs that have the key (local runs): read in Python, so it works alike on every dialect
    has_key = sa.cast(runs.c.meta, sa.Text).like(f'%"{KEY}"%')
    for run_id, meta in conn.execute(sa.select(runs.c.id, runs.c.meta).where(has_key)).all():
        meta = _meta(meta)
        if KEY not in meta:
            continue
        owner = meta.pop(KEY)
        conn.execute(runs.update().where(runs.c.id == run_id).values(
            meta=meta, **{KEY: owner if isinstance(owner, dict) and owner else None}))


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name == 'sqlite':
        import sqlite3

        if sqlite3.sqlite_version_info < SQLITE_DROP_COLUMN:
            raise RuntimeError(f"downgrading below 0007 needs SQLite >= 3.35 (this is {sqlite3.sqlite_version})")
    for run_id, meta, owner in conn.execute(sa.select(runs.c.id, runs.c.meta, runs.c[KEY])
                                            .where(runs.c[KEY].isnot(None))).all():
        meta = _meta(meta)
        meta[KEY] = owner
        conn.execute(runs.update().where(runs.c.id == run_id).values(meta=meta))
    with op.batch_alter_table('runs', schema=None, recreate='never') as batch_op:
        batch_op.drop_column(KEY)
