"""The life of one job after dispatch: its options, its recorded result, and its run's finish.

Shared by every execution path (the Celery tasks of :mod:`service.orchestration.tasks`, the embedded
:class:`service.orchestration.localpool.LocalPool` and :func:`service.orchestration.scheduler.wait_for_run`), so a result is
recorded, a poison job ended and a run finished the same way whoever ran the job.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol, TypeAlias

from service import run_meta
from service.json_types import JsonObject
from service.orchestration import baseline_runs
from service.orchestration.broker import enqueue
from service.orchestration.confirm_run import advance, confirmed_run
from service.orchestration.judge import detect_run, record_verdict, run_verdict
from service.orchestration.pass_repo import PASS_REPO as PASS_REPO  # re-exported: the run meta key
from service.orchestration.pass_repo import job_worker_config as job_worker_config  # re-exported
from service.orchestration.pass_repo import record_run_ancestry
from service.regressions.confirm_caps import ConfirmCaps
from service.settings import Settings

if TYPE_CHECKING:
    from service.db.records import Cell, JobInfo, RunInfo, RunRef
    from service.db.store import Store
    from workers.result import JobResult

    #: A job's run as the bookkeeping reads it: the :class:`RunRef` a delivery's start returned, or a
    #: :class:`RunInfo` read afterwards (both carry ``id``, ``revision_sha`` and ``meta``).
    JobRun: TypeAlias = RunRef | RunInfo

PENDING_JOB_STATUSES = frozenset({"queued", "running"})

_MIGRATE_LOCK = threading.Lock()


class JobSubmitter(Protocol):
    """Where jobs are handed to be run in this process: the embedded
    :class:`service.orchestration.localpool.LocalPool` (a protocol, not that class: its module imports this one)."""

    def submit(self, jobs: Iterable[JobInfo]) -> None:
        """Queue ``jobs`` to be run."""


def dispatch_mode(settings: Settings) -> str:
    """How this process dispatches the jobs of the runs it creates (``runs.dispatch``): ``local``
    (embedded: its own :class:`LocalPool`) or ``broker`` (Celery).  ``ampci reconcile`` re-sends
    only ``broker`` jobs, so an embedded process sharing the database keeps its jobs."""
    return "local" if settings.embedded else "broker"


def open_store(settings: Settings) -> Store:
    """The Store of ``settings`` with its schema at head (migrated on first use; thread-safe).
    Runs created through it without an explicit dispatch (bisection steps) get :func:`dispatch_mode`."""
    from service.db import migrate
    from service.db.store import Store, thresholds_from_settings

    url = settings.effective_database_url
    from service.db.engine import make_engine

    store = Store(make_engine(url, **settings.db_pool()), thresholds=thresholds_from_settings(settings),
                  run_dispatch=dispatch_mode(settings))
    with _MIGRATE_LOCK:  # Alembic's command API keeps module-global state
        if migrate.current(url) != migrate.head():
            store.upgrade()
    return store


def cell_options(run: JobRun, cell: Cell) -> JsonObject:
    """The sweep options stored in ``run.meta`` for ``cell`` ({} when the run has none), with the run's
    pass repository (:data:`PASS_REPO`) when its meta names one."""
    options = run_meta.cell_options(run.meta, cell)
    meta = run.meta or {}
    if isinstance(meta.get(PASS_REPO), dict):
        options[PASS_REPO] = dict(meta[PASS_REPO])
    return options


def redact_result(result: JobResult) -> JobResult:
    """``result`` with every string it holds redacted (:func:`workers.redact.redact_tree`) before it is stored:
    the message, the stderr tail and every string of the pass's report (``kept_fp32`` entries, notes, names) --
    credential shapes and the exact values, and their base64/hex spellings, of this process's own secrets
    (webhook secret, tokens, the passwords in its database and broker URLs).  Changes ``result`` in place and
    returns it."""
    redacted_document(result)
    return result


def redacted_document(result: JobResult) -> JsonObject:
    """:func:`redact_result` that also returns the redacted result's document (``result.to_dict()`` after the
    redaction), so the result write need not build it a second time."""
    import dataclasses

    from workers.redact import redact_tree
    from workers.result import JobResult as _JobResult

    data: JsonObject = result.to_dict()
    clean = redact_tree(data, _secret_forms(_own_secrets()))
    if clean == data or not isinstance(clean, dict):
        return data
    fresh = _JobResult.from_dict(clean)
    for f in dataclasses.fields(result):
        setattr(result, f.name, getattr(fresh, f.name))
    return result.to_dict()


def _own_secrets() -> tuple[str, ...]:
    """This process's secrets as its environment holds them now (read per job: cheap, and a changed
    environment is seen at once)."""
    import os
    from urllib.parse import urlsplit

    from service.settings import CREDENTIALS

    known = [os.environ.get(name, "") for name in CREDENTIALS if not name.endswith("_FILE")]
    key = os.environ.get("AMPCI_GITHUB_PRIVATE_KEY", "")
    known += [line for line in key.splitlines() if len(line) >= 16]  # a PEM key quoted line by line
    for name in ("DATABASE_URL", "BROKER_URL"):
        try:
            known.append(urlsplit(os.environ.get(f"AMPCI_{name}", "")).password or "")
        except ValueError:
            pass
    return tuple(known)


@functools.lru_cache(maxsize=4)
def _secret_forms(known: tuple[str, ...]) -> tuple[str, ...]:
    """The spellings of ``known`` that are redacted (:func:`workers.redact.encoded_forms`), computed once per
    set of secrets rather than once per job."""
    from workers.redact import encoded_forms

    return tuple(encoded_forms(known))


def record_result(store: Store, run: JobRun, job: JobInfo, result: JobResult) -> str:
    """Write ``result`` for ``job`` (idempotent on (run, cell)), its message redacted; return the job's final
    status."""
    if result.cell != job.cell:  # a job runner returning another cell's result is our bug
        raise RuntimeError(f"job {job.id} is {job.cell} but its result is for {result.cell}")
    redact_result(result)
    store.write_result(run.id, result, job_id=job.id)
    return "crashed" if result.status == "crashed" else "done"


def complete_job(store: Store, run: RunRef, job: JobInfo, result: JobResult) -> tuple[str, bool]:
    """The hot path of :func:`record_result` for a delivery started with ``Store.begin_job``: write
    ``result`` (redacted, its document built once) and end the job in one commit, then read whether the run
    still has pending jobs (on PostgreSQL both in one round trip: ``Store.complete_job``).  Returns (the job's final status, run still pending); only when the second is
    False does the caller need :func:`finish_if_complete`."""
    if result.cell != job.cell:  # a job runner returning another cell's result is our bug
        raise RuntimeError(f"job {job.id} is {job.cell} but its result is for {result.cell}")
    data = redacted_document(result)  # one document per job: redacted, then stored as it is
    pending = store.complete_job(run, job.id, result, data)
    return ("crashed" if result.status == "crashed" else "done"), pending


def record_crashed(store: Store, run: JobRun, job: JobInfo, attempts: int) -> str:
    """Mark a poison job: a ``crashed`` result and job status, saying how often it was delivered."""
    from workers.result import JobResult

    msg = f"worker died on every one of {attempts - 1} attempts; not retried"
    result = JobResult(model=job.model, dtype=job.dtype, policy=job.policy, target=job.target,
                       status="crashed", revision=run.revision_sha, message=msg)
    store.write_result(run.id, result, job_id=job.id)
    store.mark_job(job.id, "crashed", msg)
    return "crashed"


def finish_if_complete(store: Store, run_id: int, settings: Settings | None = None,
                       dispatch: Callable[[int], object] | None = None) -> bool:
    """If no job of the run is pending and no run it waits for is pending (a webhook run waits for the run
    of its baseline's missing cells: :mod:`service.orchestration.baseline_runs`; once a run finishes, the
    runs waiting for it are finished here too): detect its regressions, confirm suspected timing regressions
    (:func:`service.orchestration.confirm_run.advance`: while a confirmation run is pending the run stays
    unfinished and this returns False; it confirms within ``settings``' ``AMPCI_CONFIRM_MAX_CELLS`` and
    ``AMPCI_CONFIRM_MAX_PER_PR``, their defaults without ``settings``), then finish the run (all idempotent).
    Returns True once the run is finished.  With ``settings``, a webhook ``push`` run's history is read from git
    before it is judged (:func:`_record_push_history`).

    With ``settings`` (the worker paths: Celery tasks and the embedded pool) bisection continues
    too (:func:`service.orchestration.bisection.continue_bisection`): a finished ``bisect`` run advances its
    bisection one step and the next midpoint run is dispatched with ``dispatch`` (default:
    :func:`dispatcher` of ``settings``), until the first bad commit is found; with
    ``settings.auto_bisect`` a ``push``/``nightly`` run's regressions start bisections.  Safe when
    several workers finish runs at once (bisect runs are deduplicated; only their creator
    dispatches them).
    """
    if store.has_pending_jobs(run_id):  # one indexed read, not the run summary
        return False
    if baseline_runs.waiting(store, run_id):  # judged once its baseline's missing cells are in
        return False
    if settings is not None:
        _record_push_history(settings, store, run_id)
    detect_run(store, run_id)
    send = dispatch if dispatch is not None else dispatcher(settings, store) if settings is not None else None
    caps = ConfirmCaps.from_settings(settings) if settings is not None else None  # default caps otherwise
    if advance(store, run_id, send, caps):
        return False  # suspected timing regressions: the run finishes once its confirmation run is final
    judged = store.get_run(run_id).finished_at is not None  # finished before: judged then, its verdict stays
    store.finish_run(run_id)
    if judged:
        run_verdict(store, run_id)  # stores one only where none is stored yet (or the run's status changed)
    else:
        record_verdict(store, run_id)  # decided once, stored: every view of the run and the lists read it
    if settings is not None:
        from service.orchestration.bisection import continue_bisection

        continue_bisection(store, run_id, send, auto_start=settings.auto_bisect, settings=settings)
    parent = confirmed_run(store, run_id)
    if parent is not None:  # a confirmation run is over: its run decides and finishes now
        finish_if_complete(store, parent, settings, dispatch)
    for waiting in baseline_runs.dependents(store, run_id):  # runs judged against this run's cells
        finish_if_complete(store, waiting, settings, dispatch)
    return True


def _record_push_history(settings: Settings, store: Store, run_id: int) -> None:
    """Before a webhook ``push`` run is judged (its drift line, the nearest baselines past ``before``): its
    revision's first-parent history with all parent links, read with git from the repository it tests
    (:func:`record_run_ancestry`; a failure is one log line).  Runs here, in the
    worker or the finisher, never in the webhook request: the payload links none of its commits."""
    if store.get_run(run_id).trigger == "push":
        record_run_ancestry(settings, store, run_id)


def dispatcher(settings: Settings, store: Store, pool: JobSubmitter | None = None) -> Callable[[int], object] | None:
    """How a run created after the fact (a bisect step) gets its jobs dispatched, the way sweeps are:
    onto ``pool`` (the embedded :class:`LocalPool` that is running), or to Celery when a broker is
    configured; None in embedded mode without a pool (the run stays ``queued``)."""
    if pool is not None:
        return lambda run_id: pool.submit(store.jobs(run_id))
    if settings.embedded:
        return None
    return lambda run_id: enqueue(settings, store.get_run(run_id).revision_sha, store.jobs(run_id))
