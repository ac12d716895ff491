"""SQLAlchemy 2.x models of the results store.

One declarative ``Base``; Alembic migrations in ``migrations/`` mirror these tables exactly (a test
compares them with ``alembic.autogenerate.compare_metadata``).  Columns hold what is filtered,
sorted or compared; the complete result (raw latency samples, per-output metrics, environment)
lives in ``results.data`` as the stable JSON form of :class:`workers.result.JobResult`.

Vocabularies (plain strings, validated by the Store, not by database enums so they can grow
without a migration):

- ``runs.trigger``: push, pull_request, nightly, manual, bisect
- ``runs.status``: queued, running, complete, partial, failed, cancelled
- ``runs.dispatch``: broker (one Celery message per job), local (the embedded pool of the process
  that created the run); set when the run is created, it tells ``ampci reconcile`` which jobs it owns
- ``jobs.status``: queued, running, done, error, crashed, cancelled
- ``regressions.category``: regression, improvement, flaky
- ``regressions.kind``: conversion, accuracy, convergence, coverage, latency
- ``regressions.state``: open, acknowledged, resolved, false_positive
- ``webhook_deliveries.status``: pending (stored, not yet turned into a run), accepted, rejected, failed
  (the intake gave up after a bounded number of attempts), duplicate
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

SHA = String(64)
NAME = String(200)
TS = DateTime(timezone=True)


class Base(DeclarativeBase):
    """Declarative base with a naming convention so migrations name constraints identically."""

    metadata = MetaData(naming_convention=NAMING)


class Revision(Base):
    """A pass revision (git commit).  ``parents`` mirrors ``revision_parents`` for display."""

    __tablename__ = "revisions"
    sha: Mapped[str] = mapped_column(SHA, primary_key=True)
    parents: Mapped[list[str]] = mapped_column(JSON, default=list)
    branch: Mapped[str | None] = mapped_column(NAME)
    author: Mapped[str | None] = mapped_column(String(300))
    message: Mapped[str | None] = mapped_column(Text)
    committed_at: Mapped[datetime | None] = mapped_column(TS)
    created_at: Mapped[datetime] = mapped_column(TS)


class RevisionParent(Base):
    """Parent links (one row per parent, ``position`` 0 is the first parent) for ancestry walks."""

    __tablename__ = "revision_parents"
    child_sha: Mapped[str] = mapped_column(SHA, primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    parent_sha: Mapped[str] = mapped_column(SHA, index=True)


class Run(Base):
    """All jobs of one sweep for one revision.  ``dispatch`` says how its jobs were dispatched when
    it was created: ``broker`` (also every run older than the column) or ``local``."""

    __tablename__ = "runs"
    __table_args__ = (Index("ix_runs_revision_created", "revision_sha", "created_at"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    revision_sha: Mapped[str] = mapped_column(ForeignKey("revisions.sha"))
    baseline_sha: Mapped[str | None] = mapped_column(SHA)
    trigger: Mapped[str] = mapped_column(String(20))
    status: Mapped[str] = mapped_column(String(20), index=True)
    sweep: Mapped[str] = mapped_column(String(100))
    dedup_key: Mapped[str | None] = mapped_column(String(200), unique=True)
    meta: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(TS, index=True)
    finished_at: Mapped[datetime | None] = mapped_column(TS)
    # a server default, so rows written by code older than the column (and existing rows) are broker
    dispatch: Mapped[str] = mapped_column(String(16), default="broker", server_default="broker")


class Job(Base):
    """One cell of one run; ``attempts`` counts deliveries to workers (poison jobs end crashed)."""

    __tablename__ = "jobs"
    __table_args__ = (UniqueConstraint("run_id", "model", "dtype", "policy", "target"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    model: Mapped[str] = mapped_column(NAME)
    dtype: Mapped[str] = mapped_column(String(16))
    policy: Mapped[str] = mapped_column(NAME)
    target: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(20))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(NAME)
    queued_at: Mapped[datetime] = mapped_column(TS)
    started_at: Mapped[datetime | None] = mapped_column(TS)
    finished_at: Mapped[datetime | None] = mapped_column(TS)
    error: Mapped[str | None] = mapped_column(Text)


class Result(Base):
    """What one job measured.  Unique per (run, cell): a redelivered write updates in place."""

    __tablename__ = "results"
    __table_args__ = (
        UniqueConstraint("run_id", "model", "dtype", "policy", "target"),
        Index("ix_results_cell", "model", "dtype", "policy", "target", "id"),
        Index("ix_results_revision", "revision_sha", "id"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"))
    revision_sha: Mapped[str] = mapped_column(SHA)
    model: Mapped[str] = mapped_column(NAME)
    dtype: Mapped[str] = mapped_column(String(16))
    policy: Mapped[str] = mapped_column(NAME)
    target: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(20))
    message: Mapped[str | None] = mapped_column(Text)
    model_sha256: Mapped[str | None] = mapped_column(SHA)
    cosine: Mapped[float | None] = mapped_column(Float)
    max_abs: Mapped[float | None] = mapped_column(Float)
    error_ratio: Mapped[float | None] = mapped_column(Float)
    latency_p50_ms: Mapped[float | None] = mapped_column(Float)
    fp32_p50_ms: Mapped[float | None] = mapped_column(Float)
    speedup: Mapped[float | None] = mapped_column(Float)
    low_precision_fraction: Mapped[float | None] = mapped_column(Float)
    casts_inserted: Mapped[int | None] = mapped_column(Integer)
    final_error: Mapped[float | None] = mapped_column(Float)
    diverged: Mapped[bool | None] = mapped_column(Boolean)
    convert_s: Mapped[float | None] = mapped_column(Float)  # median worker-timed conversion seconds
    pass_iterations: Mapped[int | None] = mapped_column(Integer)  # the pass's painting fixpoint iterations
    env_fingerprint: Mapped[str | None] = mapped_column(String(64))
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(TS)
    updated_at: Mapped[datetime] = mapped_column(TS)


class Regression(Base):
    """A detected change of one cell against its baseline: regression, improvement or flaky."""

    __tablename__ = "regressions"
    __table_args__ = (
        UniqueConstraint("run_id", "model", "dtype", "policy", "target", "kind", "category"),
        Index("ix_regressions_cell", "model", "dtype", "policy", "target", "kind", "state"),
        Index("ix_regressions_revision", "revision_sha"),
        Index("ix_regressions_state_created", "state", "created_at"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    revision_sha: Mapped[str] = mapped_column(SHA)
    baseline_sha: Mapped[str | None] = mapped_column(SHA)
    model: Mapped[str] = mapped_column(NAME)
    dtype: Mapped[str] = mapped_column(String(16))
    policy: Mapped[str] = mapped_column(NAME)
    target: Mapped[str] = mapped_column(String(16))
    kind: Mapped[str] = mapped_column(String(20))
    category: Mapped[str] = mapped_column(String(20))
    severity: Mapped[str] = mapped_column(String(20))
    metric: Mapped[str] = mapped_column(String(50))
    baseline_value: Mapped[float | None] = mapped_column(Float)
    value: Mapped[float | None] = mapped_column(Float)
    delta: Mapped[float | None] = mapped_column(Float)
    ratio: Mapped[float | None] = mapped_column(Float)
    p_value: Mapped[float | None] = mapped_column(Float)
    detail: Mapped[str] = mapped_column(Text)
    result_id: Mapped[int | None] = mapped_column(ForeignKey("results.id", ondelete="SET NULL"))
    baseline_result_id: Mapped[int | None] = mapped_column(ForeignKey("results.id", ondelete="SET NULL"))
    state: Mapped[str] = mapped_column(String(20))
    state_by: Mapped[str | None] = mapped_column(NAME)
    state_at: Mapped[datetime | None] = mapped_column(TS)
    state_note: Mapped[str | None] = mapped_column(Text)
    resolved_by_result_id: Mapped[int | None] = mapped_column(ForeignKey("results.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(TS)


class ZooModel(Base):
    """A model zoo entry seen in results (name and the content hash it had)."""

    __tablename__ = "zoo_models"
    name: Mapped[str] = mapped_column(NAME, primary_key=True)
    sha256: Mapped[str | None] = mapped_column(SHA)
    source: Mapped[str | None] = mapped_column(Text)
    meta: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    first_seen_at: Mapped[datetime] = mapped_column(TS)
    last_seen_at: Mapped[datetime] = mapped_column(TS)


class WebhookDelivery(Base):
    """A GitHub webhook delivery, keyed by its ``X-GitHub-Delivery`` id (dedup).

    A delivery that asks for a run is stored ``pending`` with ``payload`` (the validated, compact
    run request) by the webhook handler; the background intake turns it into a run and marks it
    ``accepted`` with ``run_id`` (clearing ``payload``).  ``ix_webhook_deliveries_pending`` finds
    the pending ones oldest first.
    """

    __tablename__ = "webhook_deliveries"
    __table_args__ = (Index("ix_webhook_deliveries_pending", "status", "received_at"),)
    delivery_id: Mapped[str] = mapped_column(String(100), primary_key=True)
    event: Mapped[str] = mapped_column(String(50))
    repository: Mapped[str | None] = mapped_column(NAME)
    status: Mapped[str] = mapped_column(String(20))
    reason: Mapped[str | None] = mapped_column(Text)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    received_at: Mapped[datetime] = mapped_column(TS, index=True)
    payload: Mapped[dict[str, Any] | None] = mapped_column(JSON)


TABLES = Base.metadata.tables
