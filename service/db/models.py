"""SQLAlchemy 2.x tables of the results store.

Core ``Table`` objects (one per class below, sharing ``Base.metadata``); Alembic migrations in ``migrations/`` mirror these tables exactly (a test
compares them with ``alembic.autogenerate.compare_metadata``).  Columns hold what is filtered,
sorted or compared; the complete result (raw latency samples, per-output metrics, environment)
lives in ``results.data`` as the stable JSON form of :class:`workers.result.JobResult`.

Vocabularies (plain strings, validated by the Store, not by database enums so they can grow
without a migration):

- ``runs.trigger``: push, pull_request, nightly, manual, bisect
- ``runs.status``: :data:`service.vocabulary.RUN_STATES` (awaiting_approval: a pull request run stored without
  jobs until a maintainer approves it; queued, running, complete, partial, failed, cancelled)
- ``runs.dispatch``: broker (one Celery message per job), local (the embedded pool of the process
  that created the run); set when the run is created, it tells ``ampci reconcile`` which jobs it owns
- ``jobs.status``: queued, running, done, error, crashed, cancelled
- ``regressions.category``: regression, improvement, flaky
- ``regressions.kind``: conversion, accuracy, convergence, coverage, latency
- ``regressions.state``: open, acknowledged, resolved, false_positive, and those of confirmation
  (:data:`service.regressions.rules.CONFIRMATION_STATES`: suspected, dismissed, suspected_resolved)
- ``confirm_budgets``: confirmation cells spent per pull request (:mod:`service.db.budgets`)
- ``baseline_pins``: the pinned drift reference of a branch (``""``: every branch; :mod:`service.db.pins`)
- ``webhook_deliveries.status``: pending (stored, not yet turned into a run), accepted, rejected, failed
  (the intake gave up after a bounded number of attempts), duplicate
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

if TYPE_CHECKING:
    from sqlalchemy.sql.base import ReadOnlyColumnCollection

#: A table of the schema, its columns of any Python type.
DbTable: TypeAlias = "Table[ReadOnlyColumnCollection[str, Column[object]]]"

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


metadata = MetaData(naming_convention=NAMING)


class Base:
    """What every table class shares: ``metadata`` (with a naming convention so migrations name
    constraints identically; Alembic's ``target_metadata``).  Each subclass holds its Core ``Table`` as
    ``__table__`` and each column as a class attribute (``Job.run_id``), as declarative classes did,
    without importing ``sqlalchemy.orm`` (~60 ms of every CLI query's start-up): nothing maps rows to
    objects, the store reads and writes with Core statements."""

    metadata = metadata
    __table__: DbTable

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        for column in cls.__table__.c:
            setattr(cls, column.name, column)


class Revision(Base):
    """A pass revision (git commit).  ``parents`` mirrors ``revision_parents`` for display."""

    __table__ = Table(
        "revisions", metadata,
        Column("sha", SHA, primary_key=True),
        Column("parents", JSON, default=list, nullable=False),
        Column("branch", NAME),
        Column("author", String(300)),
        Column("message", Text),
        Column("committed_at", TS),
        Column("created_at", TS, nullable=False),
    )


class RevisionParent(Base):
    """Parent links (one row per parent, ``position`` 0 is the first parent) for ancestry walks."""

    __table__ = Table(
        "revision_parents", metadata,
        Column("child_sha", SHA, primary_key=True),
        Column("position", Integer, primary_key=True),
        Column("parent_sha", SHA, index=True, nullable=False),
    )


class Run(Base):
    """All jobs of one sweep for one revision.  ``dispatch`` says how its jobs were dispatched when
    it was created: ``broker`` (also every run older than the column) or ``local``; ``local_owner`` is
    the process running a local run's jobs (:mod:`service.orchestration.orphans`)."""

    __table__ = Table(
        "runs", metadata,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("revision_sha", ForeignKey("revisions.sha"), nullable=False),
        Column("baseline_sha", SHA),
        Column("trigger", String(20), nullable=False),
        Column("status", String(20), index=True, nullable=False),
        Column("sweep", String(100), nullable=False),
        Column("dedup_key", String(200), unique=True),
        Column("meta", JSON, default=dict, nullable=False),
        Column("created_at", TS, index=True, nullable=False),
        Column("finished_at", TS),
        # a server default, so rows written by code older than the column (and existing rows) are broker
        Column("dispatch", String(16), default="broker", server_default="broker", nullable=False),
        # local runs: the process running their jobs, {"host", "pid", "start"}; NULL: none (orphans.py)
        Column("local_owner", JSON(none_as_null=True)),
        # the gate's verdict in brief as recorded when the run was judged (service.regressions.verdict); NULL: never
        Column("verdict", JSON(none_as_null=True)),
        # the whole verdict as decided when the run was judged (facts, decision, state), which every view of the
        # run rebuilds (service.regressions.verdict.RunVerdict.stored); NULL: judged before the column, or never
        Column("judgement", JSON(none_as_null=True)),
        Index("ix_runs_revision_created", "revision_sha", "created_at"),
    )


class Job(Base):
    """One cell of one run; ``attempts`` counts deliveries to workers (poison jobs end crashed)."""

    __table__ = Table(
        "jobs", metadata,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("run_id", ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        Column("model", NAME, nullable=False),
        Column("dtype", String(16), nullable=False),
        Column("policy", NAME, nullable=False),
        Column("target", String(16), nullable=False),
        Column("status", String(20), nullable=False),
        Column("attempts", Integer, default=0, nullable=False),
        Column("worker", NAME),
        Column("queued_at", TS, nullable=False),
        Column("started_at", TS),
        Column("finished_at", TS),
        Column("error", Text),
        UniqueConstraint("run_id", "model", "dtype", "policy", "target"),
        Index("ix_jobs_run_status", "run_id", "status"),  # per-run counts by status (dashboard, pending jobs)
    )


#: The covering index of results and its PostgreSQL ``INCLUDE`` columns (migration 0012).  The columns are not a
#: constructor argument of the ``Index``: SQLAlchemy validates a dialect keyword by importing that dialect
#: (~20-50 ms), which every process loading these models paid, SQLite's (the embedded commands) included;
#: :func:`postgresql_options` adds them where a PostgreSQL engine is made (``service.db.engine.make_engine``).
COVERING_INDEX, COVERING_INCLUDE = "ix_results_revision_cell", ("run_id", "status", "id")


class Result(Base):
    """What one job measured.  Unique per (run, cell): a redelivered write updates in place."""

    __table__ = Table(
        "results", metadata,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("run_id", ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        Column("job_id", ForeignKey("jobs.id", ondelete="SET NULL")),
        Column("revision_sha", SHA, nullable=False),
        Column("model", NAME, nullable=False),
        Column("dtype", String(16), nullable=False),
        Column("policy", NAME, nullable=False),
        Column("target", String(16), nullable=False),
        Column("status", String(20), nullable=False),
        Column("message", Text),
        Column("model_sha256", SHA),
        Column("cosine", Float),
        Column("max_abs", Float),
        Column("error_ratio", Float),
        Column("latency_p50_ms", Float),
        Column("fp32_p50_ms", Float),
        Column("speedup", Float),
        Column("low_precision_fraction", Float),
        Column("casts_inserted", Integer),
        Column("final_error", Float),
        Column("diverged", Boolean),
        Column("convert_s", Float),  # median worker-timed conversion seconds
        Column("convert_cpu_s", Float),  # median CPU seconds of the conversion process in those samples
        Column("pass_iterations", Integer),  # the pass's painting fixpoint iterations
        Column("env_fingerprint", String(64)),
        Column("data", JSON, nullable=False),
        # what regression detection reads of ``data`` (service.regressions.stored.sample_doc), written with it
        Column("sample_doc", Text),
        Column("created_at", TS, nullable=False),
        Column("updated_at", TS, nullable=False),
        UniqueConstraint("run_id", "model", "dtype", "policy", "target"),
        Index("ix_results_cell", "model", "dtype", "policy", "target", "id"),
        Index("ix_results_revision", "revision_sha", "id"),
        # a drift line read in brief (service.db.series.line_briefs) from the index alone on PostgreSQL
        # (INCLUDE COVERING_INCLUDE there: postgresql_options)
        Index(COVERING_INDEX, "revision_sha", "model", "dtype", "policy", "target"),
        Index("ix_results_run_status", "run_id", "status"),  # per-run counts by status, from the index alone
    )


class Regression(Base):
    """A detected change of one cell against its baseline: regression, improvement or flaky."""

    __table__ = Table(
        "regressions", metadata,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("run_id", ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        Column("revision_sha", SHA, nullable=False),
        Column("baseline_sha", SHA),
        Column("model", NAME, nullable=False),
        Column("dtype", String(16), nullable=False),
        Column("policy", NAME, nullable=False),
        Column("target", String(16), nullable=False),
        Column("kind", String(20), nullable=False),
        Column("category", String(20), nullable=False),
        Column("severity", String(20), nullable=False),
        Column("metric", String(50), nullable=False),
        Column("baseline_value", Float),
        Column("value", Float),
        Column("delta", Float),
        Column("ratio", Float),
        Column("p_value", Float),
        Column("detail", Text, nullable=False),
        Column("result_id", ForeignKey("results.id", ondelete="SET NULL")),
        Column("baseline_result_id", ForeignKey("results.id", ondelete="SET NULL")),
        Column("state", String(20), nullable=False),
        Column("state_by", NAME),
        Column("state_at", TS),
        Column("state_note", Text),
        Column("state_before", String(20)),  # open/acknowledged while a recovery awaits confirmation
        Column("resolved_by_result_id", ForeignKey("results.id", ondelete="SET NULL")),
        Column("created_at", TS, nullable=False),
        UniqueConstraint("run_id", "model", "dtype", "policy", "target", "kind", "category"),
        Index("ix_regressions_cell", "model", "dtype", "policy", "target", "kind", "state"),
        Index("ix_regressions_revision", "revision_sha"),
        Index("ix_regressions_state_created", "state", "created_at"),
    )


class ZooModel(Base):
    """A model zoo entry seen in results (name and the content hash it had)."""

    __table__ = Table(
        "zoo_models", metadata,
        Column("name", NAME, primary_key=True),
        Column("sha256", SHA),
        Column("source", Text),
        Column("meta", JSON, default=dict, nullable=False),
        Column("first_seen_at", TS, nullable=False),
        Column("last_seen_at", TS, nullable=False),
    )


class WebhookDelivery(Base):
    """A GitHub webhook delivery, keyed by its ``X-GitHub-Delivery`` id (dedup).

    A delivery that asks for a run is stored ``pending`` with ``payload`` (the validated, compact
    run request) by the webhook handler; the background intake turns it into a run and marks it
    ``accepted`` with ``run_id`` (clearing ``payload``).  ``ix_webhook_deliveries_pending`` finds
    the pending ones oldest first.
    """

    __table__ = Table(
        "webhook_deliveries", metadata,
        Column("delivery_id", String(100), primary_key=True),
        Column("event", String(50), nullable=False),
        Column("repository", NAME),
        Column("status", String(20), nullable=False),
        Column("reason", Text),
        Column("run_id", ForeignKey("runs.id", ondelete="SET NULL")),
        Column("received_at", TS, index=True, nullable=False),
        Column("payload", JSON),
        Index("ix_webhook_deliveries_pending", "status", "received_at"),
    )


class ConfirmBudget(Base):
    """Confirmation work spent on one pull request: ``cells`` counts the cells that confirmation runs of its
    runs timed (``repository`` lower-case ``owner/name``, ``pr_number`` the pull request's number).  Written
    only through :mod:`service.db.budgets`, which holds it to ``AMPCI_CONFIRM_MAX_PER_PR``."""

    __table__ = Table(
        "confirm_budgets", metadata,
        Column("repository", NAME, primary_key=True),
        Column("pr_number", Integer, primary_key=True),
        Column("cells", Integer, default=0, nullable=False),
        Column("updated_at", TS, nullable=False),
    )


class BaselinePin(Base):
    """A pinned baseline revision (``ampci baseline pin REV``): every run of ``branch`` (``""``: of every branch
    without a pin of its own) is also judged against its results for drift (:mod:`service.regressions.drift`).
    Written only through :mod:`service.db.pins`."""

    __table__ = Table(
        "baseline_pins", metadata,
        Column("branch", NAME, primary_key=True),
        Column("sha", SHA, ForeignKey("revisions.sha", ondelete="CASCADE"), nullable=False),
        Column("pinned_at", TS, nullable=False),
        Column("note", Text),
    )


TABLES = Base.metadata.tables


def postgresql_options() -> None:
    """Give the models their PostgreSQL-only options: the covering index's ``INCLUDE`` columns (idempotent;
    the PostgreSQL dialect is loaded by the caller's engine anyway)."""
    for index in Result.__table__.indexes:
        if index.name == COVERING_INDEX:
            index.dialect_options["postgresql"]["include"] = list(COVERING_INCLUDE)
