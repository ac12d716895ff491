"""initial schema

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-29 09:00:10.603792
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('revision_parents',
    sa.Column('child_sha', sa.String(length=64), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('parent_sha', sa.String(length=64), nullable=False),
    sa.PrimaryKeyConstraint('child_sha', 'position', name=op.f('pk_revision_parents'))
    )
    with op.batch_alter_table('revision_parents', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_revision_parents_parent_sha'), ['parent_sha'], unique=False)

    op.create_table('revisions',
    sa.Column('sha', sa.String(length=64), nullable=False),
    sa.Column('parents', sa.JSON(), nullable=False),
    sa.Column('branch', sa.String(length=200), nullable=True),
    sa.Column('author', sa.String(length=300), nullable=True),
    sa.Column('message', sa.Text(), nullable=True),
    sa.Column('committed_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('sha', name=op.f('pk_revisions'))
    )
    op.create_table('zoo_models',
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=True),
    sa.Column('source', sa.Text(), nullable=True),
    sa.Column('meta', sa.JSON(), nullable=False),
    sa.Column('first_seen_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_seen_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_zoo_models'))
    )
    op.create_table('runs',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('revision_sha', sa.String(length=64), nullable=False),
    sa.Column('baseline_sha', sa.String(length=64), nullable=True),
    sa.Column('trigger', sa.String(length=20), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('sweep', sa.String(length=100), nullable=False),
    sa.Column('dedup_key', sa.String(length=200), nullable=True),
    sa.Column('meta', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['revision_sha'], ['revisions.sha'], name=op.f('fk_runs_revision_sha_revisions')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_runs')),
    sa.UniqueConstraint('dedup_key', name=op.f('uq_runs_dedup_key'))
    )
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_runs_created_at'), ['created_at'], unique=False)
        batch_op.create_index('ix_runs_revision_created', ['revision_sha', 'created_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_runs_status'), ['status'], unique=False)

    op.create_table('jobs',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('model', sa.String(length=200), nullable=False),
    sa.Column('dtype', sa.String(length=16), nullable=False),
    sa.Column('policy', sa.String(length=200), nullable=False),
    sa.Column('target', sa.String(length=16), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('worker', sa.String(length=200), nullable=True),
    sa.Column('queued_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_jobs_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_jobs')),
    sa.UniqueConstraint('run_id', 'model', 'dtype', 'policy', 'target', name=op.f('uq_jobs_run_id'))
    )
    op.create_table('webhook_deliveries',
    sa.Column('delivery_id', sa.String(length=100), nullable=False),
    sa.Column('event', sa.String(length=50), nullable=False),
    sa.Column('repository', sa.String(length=200), nullable=True),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('run_id', sa.Integer(), nullable=True),
    sa.Column('received_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_webhook_deliveries_run_id_runs'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('delivery_id', name=op.f('pk_webhook_deliveries'))
    )
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_webhook_deliveries_received_at'), ['received_at'], unique=False)

    op.create_table('results',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('job_id', sa.Integer(), nullable=True),
    sa.Column('revision_sha', sa.String(length=64), nullable=False),
    sa.Column('model', sa.String(length=200), nullable=False),
    sa.Column('dtype', sa.String(length=16), nullable=False),
    sa.Column('policy', sa.String(length=200), nullable=False),
    sa.Column('target', sa.String(length=16), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('message', sa.Text(), nullable=True),
    sa.Column('model_sha256', sa.String(length=64), nullable=True),
    sa.Column('cosine', sa.Float(), nullable=True),
    sa.Column('max_abs', sa.Float(), nullable=True),
    sa.Column('error_ratio', sa.Float(), nullable=True),
    sa.Column('latency_p50_ms', sa.Float(), nullable=True),
    sa.Column('fp32_p50_ms', sa.Float(), nullable=True),
    sa.Column('speedup', sa.Float(), nullable=True),
    sa.Column('low_precision_fraction', sa.Float(), nullable=True),
    sa.Column('casts_inserted', sa.Integer(), nullable=True),
    sa.Column('final_error', sa.Float(), nullable=True),
    sa.Column('diverged', sa.Boolean(), nullable=True),
    sa.Column('env_fingerprint', sa.String(length=64), nullable=True),
    sa.Column('data', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_results_job_id_jobs'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_results_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_results')),
    sa.UniqueConstraint('run_id', 'model', 'dtype', 'policy', 'target', name=op.f('uq_results_run_id'))
    )
    with op.batch_alter_table('results', schema=None) as batch_op:
        batch_op.create_index('ix_results_cell', ['model', 'dtype', 'policy', 'target', 'id'], unique=False)
        batch_op.create_index('ix_results_revision', ['revision_sha', 'id'], unique=False)

    op.create_table('regressions',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('revision_sha', sa.String(length=64), nullable=False),
    sa.Column('baseline_sha', sa.String(length=64), nullable=True),
    sa.Column('model', sa.String(length=200), nullable=False),
    sa.Column('dtype', sa.String(length=16), nullable=False),
    sa.Column('policy', sa.String(length=200), nullable=False),
    sa.Column('target', sa.String(length=16), nullable=False),
    sa.Column('kind', sa.String(length=20), nullable=False),
    sa.Column('category', sa.String(length=20), nullable=False),
    sa.Column('severity', sa.String(length=20), nullable=False),
    sa.Column('metric', sa.String(length=50), nullable=False),
    sa.Column('baseline_value', sa.Float(), nullable=True),
    sa.Column('value', sa.Float(), nullable=True),
    sa.Column('delta', sa.Float(), nullable=True),
    sa.Column('ratio', sa.Float(), nullable=True),
    sa.Column('p_value', sa.Float(), nullable=True),
    sa.Column('detail', sa.Text(), nullable=False),
    sa.Column('result_id', sa.Integer(), nullable=True),
    sa.Column('baseline_result_id', sa.Integer(), nullable=True),
    sa.Column('state', sa.String(length=20), nullable=False),
    sa.Column('state_by', sa.String(length=200), nullable=True),
    sa.Column('state_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('state_note', sa.Text(), nullable=True),
    sa.Column('resolved_by_result_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['baseline_result_id'], ['results.id'], name=op.f('fk_regressions_baseline_result_id_results'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['resolved_by_result_id'], ['results.id'], name=op.f('fk_regressions_resolved_by_result_id_results'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['result_id'], ['results.id'], name=op.f('fk_regressions_result_id_results'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_regressions_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_regressions')),
    sa.UniqueConstraint('run_id', 'model', 'dtype', 'policy', 'target', 'kind', 'category', name=op.f('uq_regressions_run_id'))
    )
    with op.batch_alter_table('regressions', schema=None) as batch_op:
        batch_op.create_index('ix_regressions_cell', ['model', 'dtype', 'policy', 'target', 'kind', 'state'], unique=False)
        batch_op.create_index('ix_regressions_revision', ['revision_sha'], unique=False)
        batch_op.create_index('ix_regressions_state_created', ['state', 'created_at'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('regressions', schema=None) as batch_op:
        batch_op.drop_index('ix_regressions_state_created')
        batch_op.drop_index('ix_regressions_revision')
        batch_op.drop_index('ix_regressions_cell')

    op.drop_table('regressions')
    with op.batch_alter_table('results', schema=None) as batch_op:
        batch_op.drop_index('ix_results_revision')
        batch_op.drop_index('ix_results_cell')

    op.drop_table('results')
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_webhook_deliveries_received_at'))

    op.drop_table('webhook_deliveries')
    op.drop_table('jobs')
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_runs_status'))
        batch_op.drop_index('ix_runs_revision_created')
        batch_op.drop_index(batch_op.f('ix_runs_created_at'))

    op.drop_table('runs')
    op.drop_table('zoo_models')
    op.drop_table('revisions')
    with op.batch_alter_table('revision_parents', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_revision_parents_parent_sha'))

    op.drop_table('revision_parents')
