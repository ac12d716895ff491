"""The scheduler: sweep configs, their expansion into cells, runs, and dispatch of their jobs.

A **sweep** (TOML under ``sweeps/``) names models (zoo names or ``tag:NAME``), dtypes, policies,
targets, ``repeats`` and per-cell overrides.  :func:`start_sweep` expands it for one pass revision,
creates the run and its job rows in the store, and dispatches the jobs:

* **embedded** (no ``AMPCI_BROKER_URL``): on a local pool of worker subprocesses in this process
  (:class:`LocalPool`), bounded by the CPU count; results go to SQLite unless
  ``AMPCI_DATABASE_URL`` says otherwise;
* **distributed**: one Celery message per job to the queue of its target.

The run records which of the two it is (``runs.dispatch``: ``local`` or ``broker``), so a
distributed ``ampci reconcile`` never re-sends the jobs of an embedded process that shares its
database.

This module never imports onnxruntime: job code runs only in worker (sub)processes.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from service.localpool import LocalPool
from service.settings import Settings
from service.sweeps import DTYPES as DTYPES  # re-exported: callers find sweeps through the scheduler
from service.sweeps import SWEEPS_DIR as SWEEPS_DIR
from service.sweeps import Override as Override
from service.sweeps import PlannedCell, SweepConfig, load_sweep, nightly_dedup_key
from service.sweeps import SweepConfigError as SweepConfigError

ProgressCallback = Callable[[Mapping[str, int]], None]


# -- runs -------------------------------------------------------------------------------------------
FINAL_JOB_STATUSES = frozenset({"done", "error", "crashed", "cancelled"})
PENDING_JOB_STATUSES = frozenset({"queued", "running"})


@dataclass(frozen=True)
class StartedRun:
    """A run that exists in the store with its jobs dispatched (or found by its dedup key)."""

    run_id: int
    revision: str
    baseline: str | None
    cells: int
    created: bool
    pool: Any = None  # the embedded LocalPool running its jobs, if any


_MIGRATE_LOCK = threading.Lock()


def dispatch_mode(settings: Settings) -> str:
    """How this process dispatches the jobs of the runs it creates (``runs.dispatch``): ``local``
    (embedded: its own :class:`LocalPool`) or ``broker`` (Celery).  ``ampci reconcile`` re-sends
    only ``broker`` jobs, so an embedded process sharing the database keeps its jobs."""
    return "local" if settings.embedded else "broker"


def open_store(settings: Settings) -> Any:
    """The Store of ``settings`` with its schema at head (migrated on first use; thread-safe).
    Runs created through it without an explicit dispatch (bisection steps) get :func:`dispatch_mode`."""
    from service.db import migrate
    from service.db.store import Store, thresholds_from_settings

    url = settings.effective_database_url
    store = Store.from_url(url, thresholds=thresholds_from_settings(settings),
                           run_dispatch=dispatch_mode(settings))
    with _MIGRATE_LOCK:  # Alembic's command API keeps module-global state
        if migrate.current(url) != migrate.head():
            store.upgrade()
    return store


def zoo_catalog(path: Path | None = None) -> dict[str, frozenset[str]]:
    """Zoo model name -> tags, from a manifest (default ``zoo.toml``); fetches nothing, no onnxruntime."""
    from workers.zoo.manifest import load_zoo

    return {name: frozenset(entry.tags) for name, entry in load_zoo(path).entries.items()}


def run_meta(cells: Iterable[PlannedCell], requested_revision: str) -> dict[str, Any]:
    """Run meta holding the cells' options compactly: the most common options once
    (``cell_defaults``) and, under ``options``, only the cells that differ from them."""
    cells = list(cells)
    counts: dict[str, int] = {}
    for c in cells:
        key = json.dumps(c.options(), sort_keys=True)
        counts[key] = counts.get(key, 0) + 1
    defaults = json.loads(max(counts, key=counts.__getitem__)) if counts else {}
    return {"cell_defaults": defaults, "requested_revision": requested_revision,
            "options": {"|".join(c.cell): c.options() for c in cells if c.options() != defaults}}


def cell_options(run: Any, cell: tuple[str, str, str, str]) -> dict[str, Any]:
    """The sweep options stored in ``run.meta`` for ``cell`` ({} when the run has none)."""
    meta = run.meta or {}
    return dict(meta.get("options", {}).get("|".join(cell), meta.get("cell_defaults", {})))


def record_result(store: Any, run: Any, job: Any, result: Any) -> str:
    """Write ``result`` for ``job`` (idempotent on (run, cell)); return the job's final status."""
    if result.cell != job.cell:  # a job runner returning another cell's result is our bug
        raise RuntimeError(f"job {job.id} is {job.cell} but its result is for {result.cell}")
    store.write_result(run.id, result, job_id=job.id)
    return "crashed" if result.status == "crashed" else "done"


def record_crashed(store: Any, run: Any, job: Any, attempts: int) -> str:
    """Mark a poison job: a ``crashed`` result and job status, saying how often it was delivered."""
    from workers.result import JobResult

    msg = f"worker died on every one of {attempts - 1} attempts; not retried"
    result = JobResult(model=job.model, dtype=job.dtype, policy=job.policy, target=job.target,
                       status="crashed", revision=run.revision_sha, message=msg)
    store.write_result(run.id, result, job_id=job.id)
    store.mark_job(job.id, "crashed", msg)
    return "crashed"


def finish_if_complete(store: Any, run_id: int, settings: Settings | None = None,
                       dispatch: Callable[[int], object] | None = None) -> bool:
    """If no job of the run is pending: finish the run and detect its regressions (both idempotent).

    With ``settings`` (the worker paths: Celery tasks and the embedded pool) bisection continues
    too (:func:`service.bisect.continue_bisection`): a finished ``bisect`` run advances its
    bisection one step and the next midpoint run is dispatched with ``dispatch`` (default:
    :func:`dispatcher` of ``settings``), until the first bad commit is found; with
    ``settings.auto_bisect`` a ``push``/``nightly`` run's regressions start bisections.  Safe when
    several workers finish runs at once (bisect runs are deduplicated; only their creator
    dispatches them).
    """
    counts = store.run_summary(run_id).job_status
    if any(counts.get(s) for s in PENDING_JOB_STATUSES):
        return False
    store.finish_run(run_id)
    store.detect_regressions(run_id)
    if settings is not None:
        from service.bisect import continue_bisection

        send = dispatch if dispatch is not None else dispatcher(settings, store)
        continue_bisection(store, run_id, send, auto_start=settings.auto_bisect)
    return True


def dispatcher(settings: Settings, store: Any, pool: Any = None) -> Callable[[int], object] | None:
    """How a run created after the fact (a bisect step) gets its jobs dispatched, the way sweeps are:
    onto ``pool`` (the embedded :class:`LocalPool` that is running), or to Celery when a broker is
    configured; None in embedded mode without a pool (the run stays ``queued``)."""
    if pool is not None:
        return lambda run_id: pool.submit(store.jobs(run_id))
    if settings.embedded:
        return None
    return lambda run_id: enqueue(settings, store.get_run(run_id).revision_sha, store.jobs(run_id))


def _describe_revision(settings: Settings, revision: str) -> tuple[str, str | None, dict[str, Any]]:
    """(sha-or-worktree-key, baseline, revision fields) for ``REV`` or ``WORKTREE``."""
    from workers import revisions as rv

    cache = rv.RevisionCache.from_settings(settings)
    if revision == rv.WORKTREE:
        local = Path(settings.pass_repo) if settings.pass_repo and Path(settings.pass_repo).is_dir() \
            else Path(rv.default_pass_repo())
        key = cache.snapshot(local)
        try:
            head = rv.git(["rev-parse", "--verify", "HEAD^{commit}"], cwd=local).strip()
        except rv.RevisionError:
            head = ""
        base = head if rv.SHA_RE.match(head) else None
        return key, base, {"parents": [base] if base else [], "branch": rv.WORKTREE,
                           "message": f"uncommitted working tree of {local}"}
    sha = cache.resolve(revision)
    cache.checkout(sha)  # fetches it; fails early for an unknown commit
    info = rv.describe(cache, sha)
    parents = list(info["parents"])  # type: ignore[arg-type]
    return sha, (parents[0] if parents else None), info


def start_sweep(settings: Settings, config: SweepConfig, revision: str = "WORKTREE", *,
                trigger: str = "manual", baseline: str | None = None, dedup_key: str | None = None,
                store: Any = None, catalog: Mapping[str, Iterable[str]] | None = None,
                local_workers: int | None = None) -> StartedRun:
    """Create the run of ``config`` at ``revision`` and dispatch its jobs; return without waiting.

    Guarantees: the run and all its job rows are committed before the first job is dispatched,
    the run recording how they are dispatched (:func:`dispatch_mode`); a ``dedup_key`` that
    already has a run dispatches nothing (``created`` False); embedded mode (no broker) starts a
    :class:`LocalPool` in this process (call ``pool.close()`` when done), distributed mode sends
    one Celery message per job to the queue named by its target.
    """
    store = store if store is not None else open_store(settings)
    cells = config.expand(catalog if catalog is not None else zoo_catalog(config.zoo_path()))
    sha, parent, info = _describe_revision(settings, revision)
    store.upsert_revision(sha, parents=info.get("parents", []), branch=info.get("branch"),
                          author=info.get("author"), message=info.get("message"))
    base = baseline or parent
    meta = run_meta(cells, revision)
    run_id, created = store.create_run_if_new(sha, trigger, base, config.name, [c.cell for c in cells],
                                              dedup_key, meta, dispatch=dispatch_mode(settings))
    if not created:
        return StartedRun(run_id, sha, base, len(cells), created=False)
    jobs = store.jobs(run_id)
    pool = None
    if settings.embedded:
        pool = LocalPool(settings, store, workers=local_workers)
        pool.submit(jobs)
    else:
        enqueue(settings, sha, jobs)
    return StartedRun(run_id, sha, base, len(cells), created=True, pool=pool)


def start_nightly(settings: Settings, sweep: str = "full", day: date | None = None,
                  ref: str = "HEAD") -> int | None:
    """Start the nightly ``sweep`` of the pass repository's ``ref``; at most once per (UTC date, sweep).

    Returns the new run's id, or None when that date's nightly run of this sweep already exists
    (a second beat instance or a restart).  The baseline is the previous nightly run's revision.
    """
    from datetime import UTC, datetime

    day = day or datetime.now(UTC).date()
    store = open_store(settings)
    previous = store.list_runs(limit=1, trigger="nightly")
    baseline = previous[0].revision_sha if previous else None
    started = start_sweep(settings, load_sweep(sweep=sweep), ref, trigger="nightly", baseline=baseline,
                          dedup_key=nightly_dedup_key(day, sweep), store=store)
    if started.pool is not None:  # embedded beat: run it here
        wait_for_run(store, started.run_id)
        started.pool.close()
    return started.run_id if started.created else None


_CELERY_APPS: dict[tuple[int, Settings], Any] = {}
_CELERY_APPS_LOCK = threading.Lock()


def celery_app(settings: Settings) -> Any:
    """The Celery app for ``settings``, built once per process and reused (thread-safe).

    Building one costs tens of milliseconds and its producer pool is what makes repeated sends
    cheap; settings are immutable, so one app per distinct ``Settings`` value is exact.  Keyed by
    process id too: a forked child (prefork worker) builds its own instead of sharing the
    parent's broker connections.
    """
    key = (os.getpid(), settings)
    app = _CELERY_APPS.get(key)
    if app is None:
        from workers.celery_app import make_app

        with _CELERY_APPS_LOCK:
            app = _CELERY_APPS.get(key)
            if app is None:
                app = _CELERY_APPS[key] = make_app(settings)
    return app


def enqueue(settings: Settings, revision: str, jobs: Iterable[Any], app: Any = None) -> int:
    """Send one ``ampci.run_job`` message per job to the queue of its target; return how many.

    ``app`` is the Celery app to send with (default: :func:`celery_app` of ``settings``, cached
    per process); all messages of one call share one producer (one broker connection).
    """
    from workers.celery_app import RUN_JOB_TASK

    app = app if app is not None else celery_app(settings)
    n = 0
    with app.producer_or_acquire() as producer:
        for job in jobs:
            app.send_task(RUN_JOB_TASK, args=[job.id, revision], queue=job.target, producer=producer)
            n += 1
    return n


def wait_for_run(store: Any, run_id: int, on_progress: ProgressCallback | None = None,
                 poll: float = 0.5, timeout: float | None = None) -> Any:
    """Block until no job of the run is pending, then finish it; return its final RunInfo.

    ``on_progress`` gets the job counts by status after every poll.  Raises TimeoutError after
    ``timeout`` seconds (the run is left as it is; workers keep going).
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        counts: dict[str, int] = {}
        for job in store.jobs(run_id):
            counts[job.status] = counts.get(job.status, 0) + 1
        if on_progress is not None:
            on_progress(counts)
        if not any(counts.get(s) for s in PENDING_JOB_STATUSES):
            finish_if_complete(store, run_id)
            return store.get_run(run_id)
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} still has pending jobs after {timeout:.0f}s")
        time.sleep(poll)


