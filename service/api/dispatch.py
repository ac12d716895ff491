"""Create runs for webhook and API requests and dispatch their jobs through the scheduler.

Unlike :func:`service.scheduler.start_sweep` this never touches git: the revision is the 40-hex
sha GitHub (or the API caller) gave, stored as sent; the worker checks it out when it runs a job.
So creating a run costs a few short database statements plus one broker message per job, which
keeps the webhook well under a second.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from service.github.events import RunRequest
from service.github.webhook import Submitted
from service.settings import Settings

log = logging.getLogger(__name__)

Planner = Callable[[str], Sequence[Any]]  # sweep name -> PlannedCell list (cell + options())
Dispatch = Callable[[Settings, str, Sequence[Any]], None]  # (settings, revision, jobs) -> enqueue


def sweep_planner() -> Planner:
    """Expand built-in sweeps over the zoo manifest, once per sweep name per process."""
    cache: dict[str, Sequence[Any]] = {}
    lock = threading.Lock()

    def plan(sweep: str) -> Sequence[Any]:
        with lock:
            if sweep not in cache:
                from service.scheduler import load_sweep, zoo_catalog

                cache[sweep] = load_sweep(sweep=sweep).expand(zoo_catalog())
            return cache[sweep]

    return plan


class CeleryDispatch:
    """Sends one ``ampci.run_job`` message per job to the queue named by its target.

    The same messages as :func:`service.scheduler.enqueue`, but over one Celery app (and its
    producer pool) built once per process instead of once per call: the webhook sends a run's
    messages in a few milliseconds.
    """

    def __init__(self) -> None:
        self._app: Any = None
        self._lock = threading.Lock()

    def __call__(self, settings: Settings, revision: str, jobs: Sequence[Any]) -> None:
        from workers.celery_app import RUN_JOB_TASK, make_app

        with self._lock:
            if self._app is None:
                self._app = make_app(settings)
        app = self._app
        with app.producer_or_acquire() as producer:
            for job in jobs:
                app.send_task(RUN_JOB_TASK, args=[job.id, revision], queue=job.target, producer=producer)


def embedded_dispatch(settings: Settings, revision: str, jobs: Sequence[Any]) -> None:
    """Embedded mode: a LocalPool of worker subprocesses in this process, closed by a background
    thread when its jobs are done (jobs never run in the request's thread)."""
    from service.scheduler import LocalPool, open_store

    pool = LocalPool(settings, open_store(settings))
    pool.submit(jobs)
    threading.Thread(target=pool.close, name="ampci-local-pool-closer", daemon=True).start()


class RunDispatcher:
    """Implements :class:`service.github.webhook.RunSubmitter` over a Store and the scheduler.

    Guarantees: the revisions and the run (with all its job rows) are committed before any job
    is dispatched; a dedup key that already has a run dispatches nothing (unless ``redispatch``
    and no job of it has started); jobs run elsewhere, never in the calling thread.
    """

    def __init__(self, settings: Settings, store: Any, planner: Planner | None = None,
                 dispatch: Dispatch | None = None) -> None:
        self.settings = settings
        self.store = store
        self.planner = planner or sweep_planner()
        self.dispatch = dispatch or (embedded_dispatch if settings.embedded else CeleryDispatch())

    def submit(self, request: RunRequest, dedup_key: str, redispatch: bool = False) -> Submitted:
        """Store the request's revisions and run, then dispatch its jobs (see class docstring)."""
        for rev in request.revisions:
            self.store.upsert_revision(rev.sha, parents=rev.parents, branch=rev.branch, author=rev.author,
                                       message=rev.message or None, committed_at=rev.committed_at)
        github = {"repo": request.repo, "branch": request.branch, "event": request.trigger}
        if request.pr_number is not None:
            github["pr"] = request.pr_number
            github["baseline_is_base_tip"] = True  # the merge base is resolved by the worker
        return self.create(request.head_sha, request.trigger, request.baseline_sha, request.sweep,
                           dedup_key, {"github": github}, redispatch)

    def create(self, sha: str, trigger: str, baseline: str | None, sweep: str, dedup_key: str | None,
               extra_meta: dict[str, Any] | None = None, redispatch: bool = False) -> Submitted:
        """Create (or find by ``dedup_key``) a run of ``sweep`` at ``sha`` and dispatch its jobs."""
        planned = self.planner(sweep)
        meta = {"options": {"|".join(c.cell): c.options() for c in planned}, "requested_revision": sha,
                **(extra_meta or {})}
        run_id, created = self.store.create_run_if_new(sha, trigger, baseline, sweep, [c.cell for c in planned],
                                                       dedup_key, meta)
        jobs = self.store.jobs(run_id)
        if not created and not (redispatch and all(j.status == "queued" and j.attempts == 0 for j in jobs)):
            return Submitted(run_id=run_id, created=False)
        self.dispatch(self.settings, sha, jobs)
        return Submitted(run_id=run_id, created=True)
