"""Celery tasks (thin named adapters) and the plain functions they call.

* :func:`run_cell` runs one cell at one revision in *this* process (:func:`workers.jobs.cell.run_cell`
  with the worker config of the settings) and returns its :class:`~workers.result.JobResult`.
* :func:`execute_job` is one delivery of one job end to end (the Celery path): skip it if the job
  already finished, count the attempt in the database, mark a poison job ``crashed`` once it has
  been delivered more than ``max_attempts`` times, otherwise run it and record the result
  idempotently; the last job of a run finishes the run.  Tests call it without a broker.

Recording results, counting attempts, finishing runs and reconciling are the service's business;
``workers`` only executes.  Job code (``workers.jobs.job``, onnxruntime) is imported inside
:func:`workers.jobs.cell.run_cell`, never at module import, so a Celery prefork parent that imports this
module initialises no CUDA.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from types import FrameType
from typing import TYPE_CHECKING

from celery import Task
from celery.signals import worker_process_init

from service.errors import DatabaseUnavailableError
from service.orchestration import reconcile, scheduler
from service.orchestration.celery_app import (
    CONTROL_TIME_LIMITS,
    NIGHTLY_TASK,
    RECONCILE_TASK,
    RUN_JOB_TASK,
    app,
    app_settings,
    time_limits,
)
from service.orchestration.jobs import PASS_REPO, complete_job, job_worker_config
from service.settings import Settings
from service.vocabulary import FINAL_JOB_STATES
from workers.jobs.cell import run_cell as _run_cell
from workers.result import JobResult

if TYPE_CHECKING:
    from service.db.records import JobInfo
    from service.db.store import Store
    from service.json_types import JsonObject, JsonValue
    from service.orchestration.jobs import JobRun

log = logging.getLogger(__name__)


@worker_process_init.connect  # type: ignore[untyped-decorator]  # celery publishes no types
def preload_job_code(**_: object) -> None:
    """In each Celery pool child, once, before its first job: fork the conversion fork server while
    the child has one thread (:func:`workers.sandbox.zygotes.start_forkserver`: numpy, onnx and onnx_ir
    imported once, each revision's zygote forked from it), then import the job code, so no job of
    this child pays those imports.  The prefork parent imports none of it."""
    from workers.sandbox.zygotes import start_forkserver

    start_forkserver()
    import workers.jobs.job  # noqa: F401 - onnxruntime and the job code, kept for all this child's jobs


def run_cell(cell: tuple[str, str, str, str], revision: str, settings: Settings,
             options: JsonObject | None = None) -> JobResult:
    """:func:`workers.jobs.cell.run_cell` with the worker config of ``settings`` for the job's pass repository
    (:func:`~service.orchestration.jobs.job_worker_config`: the webhook's repository when ``options`` name one;
    a module-level name, so a test worker can wrap it)."""
    return _run_cell(cell, revision, job_worker_config(settings, (options or {}).get(PASS_REPO)), options)


def execute_job(job_id: int, settings: Settings, worker: str | None = None,
                store: Store | None = None) -> str:
    """One delivery of job ``job_id``; returns the job's status afterwards.

    Guarantees: a job whose status is already final is left alone (redelivery after the result was
    written), except that its run is finished if it is complete (the delivery that wrote the result may have
    been killed before it could); every delivery increments ``attempts`` before anything runs; delivery number
    ``max_attempts + 1`` marks the job ``crashed`` with a ``crashed`` result instead of running it;
    the result write is idempotent on (run, cell); the run is finished once all its jobs are final;
    a delivery during which Celery's soft time limit fired is recorded as ``timeout`` (naming the
    limit) whatever the job code made of the exception (:func:`soft_limit_watch`).
    """
    store = store if store is not None else _process_store(settings)
    start = store.begin_job(job_id, worker or worker_name())  # one statement, one commit
    job, run, attempts = start.job, start.run, start.attempts
    if not start.started:
        if job.status in ("done", "crashed") and run is not None:
            # a worker killed after the result's commit and before it finished the run: its redelivery
            # finishes the run (idempotent), or nobody ever would
            scheduler.finish_if_complete(store, run.id, settings)
        return job.status
    if attempts > settings.max_attempts:
        status = scheduler.record_crashed(store, run, job, attempts)
        scheduler.finish_if_complete(store, run.id, settings)
        return status
    from celery.exceptions import SoftTimeLimitExceeded

    options = scheduler.cell_options(run, job.cell)
    partial: JobResult | None
    with soft_limit_watch() as fired:
        try:
            partial = run_cell(job.cell, run.revision_sha, settings, options)
        except SoftTimeLimitExceeded:
            fired.append(True)
            partial = None
    # (partial is None only when the limit fired)
    result = timeout_result(job, run, settings, partial) if fired or partial is None else partial
    status, pending = complete_job(store, run, job, result)  # write + commit, then a read: one round trip
    if not pending:
        scheduler.finish_if_complete(store, run.id, settings)  # the run's last job only
    return status


@contextlib.contextmanager
def soft_limit_watch() -> Iterator[list[bool]]:
    """Yield a list that gets an entry if Celery's soft time limit fires during the block.

    billiard's pool child raises ``SoftTimeLimitExceeded`` from its SIGUSR1 handler wherever the job
    happens to be, and job code that turns every exception into a result (``workers.jobs.job.run_job``
    makes it a ``crash``) would hide it; this wraps that handler to note the signal first, then lets
    it raise as before.  Where no handler is installed (solo pool, a thread, no SIGUSR1) there is no
    soft limit to watch and the list stays empty.
    """
    fired: list[bool] = []
    sig = getattr(signal, "SIGUSR1", None)
    previous = signal.getsignal(sig) if sig is not None else None
    if sig is None or not callable(previous) or threading.current_thread() is not threading.main_thread():
        yield fired
        return

    def noted(signum: int, frame: FrameType | None) -> object:
        fired.append(True)
        return previous(signum, frame)

    signal.signal(sig, noted)
    try:
        yield fired
    finally:
        signal.signal(sig, previous)


def timeout_result(job: JobInfo, run: JobRun, settings: Settings, partial: JobResult | None = None) -> JobResult:
    """The ``timeout`` result of a job stopped by the soft time limit: ``partial`` (what the job code
    returned after the exception, e.g. its timings) with its status replaced, the message naming the
    limit and keeping what the job said."""
    soft, hard = time_limits(settings)
    message = f"job exceeded the soft time limit of {soft:.0f}s (AMPCI_JOB_TIMEOUT {hard:.0f}s)"
    if partial is None or partial.cell != job.cell:
        return JobResult(model=job.model, dtype=job.dtype, policy=job.policy, target=job.target, status="timeout",
                         revision=run.revision_sha, message=message)
    if partial.message:
        message += f"; stopped in: {partial.message}"
    partial.status, partial.message = "timeout", message[:2000]
    return partial


_STORES: dict[tuple[int, str], Store] = {}


def _process_store(settings: Settings) -> Store:
    """One Store per (process, database URL): engines are never shared across a fork."""
    key = (os.getpid(), settings.effective_database_url)
    if key not in _STORES:
        _STORES[key] = scheduler.open_store(settings)
    return _STORES[key]


def worker_name() -> str:
    """``host:pid`` of this process (stored with each attempt)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def record_failure(job_id: int, settings: Settings, exc: BaseException) -> None:
    """After a delivery failed outside the job code: a time limit becomes a ``timeout`` result,
    anything else marks the job ``error`` (so the run can still finish).  Never raises."""
    from celery.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded
    store = None
    try:  # a fresh Store: this may run in the prefork parent, whose children must not share it
        store = scheduler.open_store(settings)
        job = store.get_job(job_id)
        if job.status in FINAL_JOB_STATES:
            return
        run = store.get_run(job.run_id)
        if isinstance(exc, SoftTimeLimitExceeded):  # raised outside execute_job's watch (recording it)
            scheduler.record_result(store, run, job, timeout_result(job, run, settings))
        elif isinstance(exc, TimeLimitExceeded):
            result = JobResult(model=job.model, dtype=job.dtype, policy=job.policy, target=job.target,
                               status="timeout", revision=run.revision_sha,
                               message=f"job exceeded the hard time limit of {settings.job_timeout:.0f}s")
            scheduler.record_result(store, run, job, result)
        else:
            store.mark_job(job_id, "error", f"{type(exc).__name__}: {exc}"[:2000])
        scheduler.finish_if_complete(store, run.id, settings)
    except Exception:  # noqa: BLE001 - the database may be what failed; the message is already settled
        log.exception("could not record the failure of job %s", job_id)
    finally:
        if store is not None:
            store.dispose()


class JobTask(Task):  # type: ignore[misc]  # celery publishes no types: Task is Any to mypy
    """Base of ``ampci.run_job``: failures (also hard time limits, handled in the pool parent) are
    recorded on the job instead of leaving it ``running``."""

    def on_failure(self, exc: BaseException, task_id: str, args: Sequence[JsonValue], kwargs: Mapping[str, JsonValue],
                   einfo: object) -> None:
        if args:
            record_failure(int(args[0]), app_settings(app), exc)


@app.task(name=RUN_JOB_TASK, base=JobTask, acks_late=True, bind=True, ignore_result=True,  # type: ignore[untyped-decorator]  # celery publishes no types
          autoretry_for=(DatabaseUnavailableError,), retry_backoff=5, retry_backoff_max=300,
          retry_kwargs={"max_retries": 30})
def run_job_task(self: JobTask, job_id: int, revision: str) -> str:
    """Celery adapter of :func:`execute_job` (``revision`` is carried for logs and routing only).
    An unreachable database is retried with backoff (the attempt was not counted)."""
    return execute_job(int(job_id), app_settings(app), worker=f"{self.request.hostname}:{os.getpid()}")


@app.task(name=NIGHTLY_TASK, acks_late=True, soft_time_limit=CONTROL_TIME_LIMITS[0],  # type: ignore[untyped-decorator]  # celery publishes no types
          time_limit=CONTROL_TIME_LIMITS[1])
def nightly_sweep_task(sweep: str) -> int | None:
    """Celery adapter of :func:`service.orchestration.scheduler.start_nightly` (deduplicated per UTC date)."""
    return scheduler.start_nightly(app_settings(app), sweep)


@app.task(name=RECONCILE_TASK, ignore_result=True, soft_time_limit=CONTROL_TIME_LIMITS[0],  # type: ignore[untyped-decorator]  # celery publishes no types
          time_limit=CONTROL_TIME_LIMITS[1])
def reconcile_task() -> list[int]:
    """Celery adapter of :func:`service.orchestration.reconcile.resend_lost_jobs` (grace ``AMPCI_RECONCILE_GRACE``),
    run by beat on the control queue; returns the ids re-sent.  A broker that cannot be inspected
    is logged as one line and nothing is sent; the next period tries again."""
    settings = app_settings(app)
    try:
        report = reconcile.reconcile(settings, _process_store(settings), app=app)
    except reconcile.BrokerInspectionError as exc:
        log.error("reconcile: %s", exc)
        return []
    log.info("reconcile: %s", report.skipped or f"{len(report.inspection.candidates)} queued job(s) past "
             f"the grace period, {len(report.resent)} re-sent {list(report.resent)}")
    return list(report.resent)
