"""Create runs for webhook and API requests and dispatch their jobs through the scheduler.

Unlike :func:`service.orchestration.scheduler.start_sweep` this never touches git: the revision is the 40-hex
sha GitHub (or the API caller) gave, stored as sent; the worker checks it out when it runs a job.
The webhook intake hands it batches (:meth:`RunDispatcher.submit_many`): all revisions, runs and
job rows of a batch in one transaction of a few multi-row statements, then one broker message
per job over the process's cached Celery app.  Nothing here runs on the webhook's request path.

A pull request whose code may not run yet (:mod:`service.github.approval`) gets its run stored
``awaiting_approval``, without jobs and without baseline runs; :meth:`RunDispatcher.approve` starts it
(jobs, baseline runs, dispatch) as a trusted pull request's run would have been started.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from service import run_meta
from service.db.store import Store
from service.errors import UserError
from service.github.approval import Approval, Approved, head_when_written
from service.github.events import RunRequest, check_repository
from service.github.webhook import Submitted
from service.json_types import JsonObject
from service.orchestration.jobs import PASS_REPO
from service.settings import Settings
from service.vocabulary import AWAITING_APPROVAL

if TYPE_CHECKING:
    from service.db.engine import Connection
    from service.db.records import Cell, JobInfo, NewRun, RunInfo, RunSpec
    from service.orchestration.localpool import LocalPool
    from service.orchestration.sweeps import PlannedCell

log = logging.getLogger(__name__)

Planner = Callable[[str], Sequence["PlannedCell"]]  # sweep name -> PlannedCell list (cell + options())
Dispatch = Callable[[Settings, str, Sequence["JobInfo"]], None]  # (settings, revision, jobs) -> enqueue


def sweep_planner(data_dir: Path | None = None) -> Planner:
    """Expand built-in sweeps over the zoo manifest (merged with the user zoo under ``data_dir``), once
    per sweep name per process."""
    cache: dict[str, Sequence[PlannedCell]] = {}
    lock = threading.Lock()

    def plan(sweep: str) -> Sequence[PlannedCell]:
        with lock:
            if sweep not in cache:
                from service.orchestration.scheduler import zoo_catalog
                from service.orchestration.sweeps import load_sweep

                cache[sweep] = load_sweep(sweep=sweep).expand(zoo_catalog(None, data_dir))
            return cache[sweep]

    return plan


class CeleryDispatch:
    """Sends one ``ampci.run_job`` message per job to the queue named by its target.

    :func:`service.orchestration.scheduler.enqueue` over the process's cached Celery app
    (:func:`service.orchestration.scheduler.celery_app`, built once, its producer pool reused): a run's
    messages take a few milliseconds.
    """

    def __call__(self, settings: Settings, revision: str, jobs: Sequence[JobInfo]) -> None:
        from service.orchestration.broker import celery_app, enqueue

        enqueue(settings, revision, jobs, app=celery_app(settings))


_LOCAL_POOLS: dict[tuple[int, Settings], LocalPool] = {}
_LOCAL_POOLS_LOCK = threading.Lock()


def local_pool(settings: Settings) -> LocalPool:
    """This process's one embedded LocalPool for ``settings`` (made on first use): at most
    ``AMPCI_LOCAL_WORKERS`` subprocesses (default the CPU count) and one Store, so however many runs
    are dispatched the process holds at most ``AMPCI_DB_POOL_SIZE + AMPCI_DB_MAX_OVERFLOW``
    connections for its jobs.  Keyed by process id too (never shared across a fork)."""
    key = (os.getpid(), settings)
    with _LOCAL_POOLS_LOCK:
        pool = _LOCAL_POOLS.get(key)
        if pool is None:
            from service.orchestration.localpool import LocalPool
            from service.orchestration.scheduler import open_store

            pool = _LOCAL_POOLS[key] = LocalPool(settings, open_store(settings),
                                                 workers=settings.local_workers or None)
    return pool


def embedded_dispatch(settings: Settings, revision: str, jobs: Sequence[JobInfo]) -> None:
    """Embedded mode: queue the jobs on the process's :func:`local_pool` (jobs never run in the
    request's thread; idle subprocesses are reused by the next run)."""
    local_pool(settings).submit(jobs)


class RunDispatcher:
    """Implements :class:`service.github.webhook.RunSubmitter` over a Store and the scheduler.

    Guarantees: the revisions and the run (with all its job rows) are committed before any job
    is dispatched, each run recording how its jobs are dispatched (``mode``: ``local`` for the
    embedded pool, ``broker`` for Celery; by default what ``dispatch`` does, else what the
    settings imply); a dedup key that already has a run dispatches nothing unless ``redispatch``,
    and then only the jobs that never started (queued, no attempt: a crash between creating a run
    and dispatching it loses nothing; a job may at worst get a second message, which the workers'
    attempt counting and idempotent result writes absorb); jobs run elsewhere, never in the
    calling thread.
    """

    def __init__(self, settings: Settings, store: Store, planner: Planner | None = None,
                 dispatch: Dispatch | None = None, mode: str | None = None) -> None:
        from service.orchestration.scheduler import dispatch_mode

        self.settings = settings
        self.store = store
        self.planner = planner or sweep_planner(settings.data_dir)
        self.dispatch = dispatch or (embedded_dispatch if settings.embedded else CeleryDispatch())
        # recorded on every run this creates (runs.dispatch): reconcile re-sends only broker jobs
        if mode is None:
            mode = ("local" if self.dispatch is embedded_dispatch else
                    "broker" if isinstance(self.dispatch, CeleryDispatch) else dispatch_mode(settings))
        self.mode = mode

    def warm_up(self, sweeps: Sequence[str] = ("smoke",)) -> None:
        """Do the one-time work (imports, the Celery app and its broker connection, sweep plans)
        now, at start-up, instead of in the first batch while requests are being answered.
        Never raises: a broker or config problem shows up (and is retried) when a run is sent."""
        try:
            for sweep in sweeps:
                self.planner(sweep)
            self._compile_statements()
            if isinstance(self.dispatch, CeleryDispatch):
                from service.orchestration.broker import celery_app

                app = celery_app(self.settings)
                with app.producer_or_acquire() as producer:
                    producer.connection.ensure_connection(max_retries=1)
        except Exception as exc:  # noqa: BLE001 - start-up must not fail on this
            log.warning("webhook dispatcher warm-up incomplete: %s: %s", type(exc).__name__, exc)

    def _compile_statements(self) -> None:
        """Run the batch statements once inside a transaction that is rolled back: SQLAlchemy
        compiles and caches them now (tens of milliseconds) rather than during a request burst."""
        from service.db.deliveries import Settlement
        from service.db.records import RevisionRow, RunSpec

        sha = "f" * 40
        with self.store.engine.connect() as conn:
            tx = conn.begin()
            try:
                self.store.upsert_revisions([RevisionRow(sha, (sha,), "warm-up")], conn=conn)
                self.store.create_runs([RunSpec(sha, "push", sha, "warm-up", (("m", "fp16", "default", "cpu"),),
                                                "warm-up:compile")], conn=conn)
                self.store.pending_deliveries(conn, 1)
                self.store.settle_deliveries(conn, [Settlement("warm-up:none", "accepted", "warm-up", None)])
            finally:
                tx.rollback()

    def submit(self, request: RunRequest, dedup_key: str, redispatch: bool = False) -> Submitted:
        """Store the request's revisions and run, then dispatch its jobs (see class docstring)."""
        (out,) = self.submit_many([(request, dedup_key)], redispatch=redispatch)
        if isinstance(out, BaseException):
            raise out
        return out

    def submit_many(self, items: Sequence[tuple[RunRequest, str]],
                    redispatch: bool = True) -> list[Submitted | BaseException]:
        """:meth:`submit` for many requests, with their database work batched.

        All revisions and runs are written in one transaction (a few multi-row statements); then
        each run's jobs are dispatched.  The answer holds, per item and in order, its
        :class:`Submitted` or the exception that stopped it (a planning error such as an unknown
        sweep, or a dispatch failure: the run then exists and a later call with ``redispatch``
        sends its jobs).  A database failure of the shared transaction raises for the whole batch.
        """
        from service.db.records import RevisionRow, RunSpec

        out: list[Submitted | BaseException | None] = [None] * len(items)
        specs: list[RunSpec] = []
        spec_of: list[int] = []
        revisions: list[RevisionRow] = []
        plans: dict[int, Sequence[PlannedCell]] = {}
        for i, (request, dedup_key) in enumerate(items):
            if request.approval == "refused":  # the intake never submits these: nothing of it may run
                out[i] = UserError("not run: untrusted pull request (AMPCI_FORK_POLICY=never)")
                continue
            if request.rerun_of_push and not self.store.pushed_head(request.repo, request.branch, request.head_sha):
                out[i] = UserError(f"not run: re-run of {request.head_sha[:12]}, which ampci never ran as a push to "
                                   f"{request.branch} (a fork's pull request names its own branch; it waits for "
                                   "approval)")
                continue
            try:
                planned = self.planner(request.sweep)
            except Exception as exc:  # noqa: BLE001 - reported per item
                out[i] = exc
                continue
            plans[i] = planned
            revisions.extend(RevisionRow(r.sha, tuple(r.parents), r.branch, r.author, r.message or None,
                                         r.committed_at) for r in request.revisions)
            github: JsonObject = {"repo": request.repo, "branch": request.branch, "event": request.trigger}
            if request.installation is not None:  # the App installation to report with (service.github_auth.app)
                github["installation"] = request.installation
            if request.pr_number is not None:
                github["pr"] = request.pr_number
                if request.pushed_at is not None:  # when GitHub saw this head pushed: what a comment approves
                    github["pushed_at"] = request.pushed_at
                github["baseline_is_base_tip"] = True  # the merge base is resolved by the worker
            awaiting = request.approval == "required"
            if awaiting:
                github.update(approval="required", untrusted=request.untrusted)
            specs.append(RunSpec(request.head_sha, request.trigger, request.baseline_sha, request.sweep,
                                 tuple(c.cell for c in planned), dedup_key,
                                 {**run_meta.encode(planned, request.head_sha), "github": github,
                                  "confirm_pairs": self.settings.confirm_pairs, **_pass_repo_meta(request)},
                                 self.mode,
                                 AWAITING_APPROVAL if awaiting else "queued"))
            spec_of.append(i)
        baseline_runs: list[tuple[str, NewRun]] = []
        if specs:
            with self.store.transaction() as conn:
                self.store.upsert_revisions(revisions, conn=conn)
                if self.settings.baseline_runs:  # a run awaiting approval gets its baseline runs when approved
                    specs, baseline_runs = self._with_baseline_runs(conn, specs, [plans[i] for i in spec_of])
                created = self.store.create_runs(specs, conn=conn)
            for sha, new in baseline_runs:  # the baseline's missing cells go first (ampci sweep's order)
                try:
                    self._dispatch(sha, new, redispatch)
                except Exception as exc:  # noqa: BLE001 - reconcile re-sends; the run waits for it meanwhile
                    log.warning("baseline run %s not dispatched yet: %s: %s", new.run_id, type(exc).__name__, exc)
            for i, spec, new in zip(spec_of, specs, created, strict=True):
                try:
                    out[i] = self._dispatch(spec.revision_sha, new, redispatch)
                except Exception as exc:  # noqa: BLE001 - the run exists; a retry redispatches
                    out[i] = exc
                time.sleep(0)  # let request threads and the event loop take the GIL between runs
        return cast("list[Submitted | BaseException]", out)  # every item got its answer above

    def _with_baseline_runs(self, conn: Connection, specs: list[RunSpec], plans: list[Sequence[PlannedCell]]) -> \
            tuple[list[RunSpec], list[tuple[str, NewRun]]]:
        """Create (in ``conn``'s transaction) a ``manual`` run of each baseline revision for the cells of
        ``specs`` it has no result for (:mod:`service.orchestration.baseline_runs`, as ``ampci sweep`` does),
        and return ``specs`` with the runs each waits for in its meta, and the baseline runs created."""
        from dataclasses import replace

        from service.db.records import RunSpec
        from service.orchestration import baseline_runs as br

        wanted: dict[str, list[Cell]] = {}
        for spec in specs:
            if spec.status != "queued":  # awaiting approval: none of its work starts before that
                continue
            if spec.baseline_sha and spec.baseline_sha != spec.revision_sha:  # never its own baseline
                wanted.setdefault(spec.baseline_sha, []).extend(spec.cells)
        needs = br.plan(conn, wanted)
        base_specs: list[RunSpec] = []
        base_of: list[int] = []
        for k, (spec, planned) in enumerate(zip(specs, plans, strict=True)):
            need = needs.get(spec.baseline_sha or "")
            if need is None or spec.baseline_sha == spec.revision_sha or spec.status != "queued":
                continue
            missing = [c for c in need.missing if c in set(spec.cells)]
            if missing:
                cells = br.cells_of(planned, missing)
                base_specs.append(RunSpec(need.baseline, "manual", None, spec.sweep, tuple(c.cell for c in cells),
                                          br.BaselineNeed(need.baseline, tuple(missing), ()).dedup_key(spec.sweep),
                                          {**run_meta.encode(cells, need.baseline), "baseline_for": spec.revision_sha,
                                           "confirm_pairs": self.settings.confirm_pairs,
                                           **_same_pass_repo(spec.meta)}, self.mode))
                base_of.append(k)
        made = self.store.create_runs(base_specs, conn=conn) if base_specs else []
        extra: dict[int, list[int]] = {}
        for k, new in zip(base_of, made, strict=True):
            extra.setdefault(k, []).append(new.run_id)
        out = []
        for k, spec in enumerate(specs):
            need = needs.get(spec.baseline_sha or "") if spec.status == "queued" else None
            waits = sorted({*(need.running if need is not None else ()), *extra.get(k, [])})
            out.append(replace(spec, meta={**spec.meta, br.AWAITS: waits}) if waits else spec)
        return out, [(s.revision_sha, new) for s, new in zip(base_specs, made, strict=True) if new.created]

    def create(self, sha: str, trigger: str, baseline: str | None, sweep: str, dedup_key: str | None,
               extra_meta: JsonObject | None = None, redispatch: bool = False) -> Submitted:
        """Create (or find by ``dedup_key``) a run of ``sweep`` at ``sha`` and dispatch its jobs."""
        planned = self.planner(sweep)
        meta = {**run_meta.encode(planned, sha), "confirm_pairs": self.settings.confirm_pairs, **(extra_meta or {})}
        new = self.store.create_run_with_jobs(sha, trigger, baseline, sweep, [c.cell for c in planned],
                                              dedup_key, meta, dispatch=self.mode)
        return self._dispatch(sha, new, redispatch)

    def approve(self, approval: Approval, delivery: str) -> Approved:
        """Start the run ``approval`` approves, as a trusted pull request's run is started (its jobs, the
        runs of its baseline's missing cells, their dispatch), and record who approved it.

        The run: a label's, the newest run of that head (none yet: the head's run is created and started
        at once); a comment's, the newest run of the pull request.  Only a run ``awaiting_approval`` is
        started, atomically (of concurrent approvals exactly one starts it); any other is left as it is
        (``started`` False), except that a retry of the delivery that started it re-sends the jobs that
        never started (a dispatch that failed after the commit).  ``delivery`` is the approving delivery's id.
        """
        from dataclasses import replace

        from service.db.records import NewRun, RunSpec

        what = f"PR #{approval.pr_number} ({approval.via} by {approval.by or 'unknown'})"
        run, refusal = self.approved_run(approval)
        if refusal is not None:
            return Approved(None, False, None, f"{what}: {refusal}")
        if run is None and approval.request is not None:  # the approved head has no run yet: start one
            request = replace(RunRequest.from_payload(approval.request), approval="trusted", untrusted=None,
                              body_sha256=approval.body_sha256)
            sub = self.submit(request, request.dedup_key or f"github:{delivery}", redispatch=True)
            return Approved(sub.run_id, sub.created, request.head_sha,
                            f"{what}: approved head {request.head_sha[:12]} had no run; run {sub.run_id} started")
        if run is None:
            return Approved(None, False, None, f"{what}: no run awaits approval")
        if run.status != AWAITING_APPROVAL:
            gh = run.meta.get("github") or {}
            mine = gh.get("approved_delivery") == delivery or (
                approval.body_sha256 is not None and run.dedup_key == f"github-body:{approval.body_sha256}")
            if mine and run.status == "queued":  # a retry: its dispatch may have failed after the commit
                self._dispatch(run.revision_sha, NewRun(run.id, False, tuple(self.store.jobs(run.id))), True)
            return Approved(run.id, False, run.revision_sha,
                            f"{what}: run {run.id} of {run.revision_sha[:12]} is {run.status}, not awaiting approval")
        planned = self.planner(run.sweep)
        github = {**(run.meta.get("github") or {}), "approval": "approved", "approved_by": approval.by,
                  "approved_via": approval.via, "approved_delivery": delivery}
        spec = RunSpec(run.revision_sha, run.trigger, run.baseline_sha, run.sweep, tuple(c.cell for c in planned),
                       None, {**run.meta, **run_meta.encode(planned, run.revision_sha), "github": github,
                              "confirm_pairs": self.settings.confirm_pairs}, self.mode)
        try:
            with self.store.transaction() as conn:
                baseline_runs: list[tuple[str, NewRun]]
                specs, baseline_runs = [spec], []
                if self.settings.baseline_runs:
                    specs, baseline_runs = self._with_baseline_runs(conn, specs, [planned])
                new = self.store.approve_run(run.id, specs[0].cells, specs[0].meta, conn=conn)
                if new is None:  # approved meanwhile by another delivery: roll the baseline runs made here back
                    raise _ApprovedMeanwhile
        except _ApprovedMeanwhile:
            return Approved(run.id, False, run.revision_sha, f"{what}: run {run.id} was approved meanwhile")
        for sha, base in baseline_runs:  # the baseline's missing cells go first (as in submit_many)
            try:
                self._dispatch(sha, base, False)
            except Exception as exc:  # noqa: BLE001 - reconcile re-sends; the run waits for it meanwhile
                log.warning("baseline run %s not dispatched yet: %s: %s", base.run_id, type(exc).__name__, exc)
        self._dispatch(run.revision_sha, new, False)
        return Approved(run.id, True, run.revision_sha,
                        f"{what}: approved head {run.revision_sha[:12]}; run {run.id} started")

    def approved_run(self, approval: Approval) -> tuple[RunInfo | None, str | None]:
        """(the run of the head ``approval`` approves, None), or (None, why it approves none: one line).

        A label approves its event's head.  A comment approves the head the pull request had when it was
        written: of the pull request's runs, the one whose head was pushed last strictly before the comment's
        ``written_at`` (``meta.github.pushed_at``, GitHub's clock; for rows without it, the run's creation);
        a head pushed after the comment is never chosen, even one ampci heard of first.  A sha the comment
        names must be a prefix of that head (:mod:`service.github.approval`)."""
        if approval.via != "comment":
            return self.store.newest_pull_request_run(repo=approval.repo, pr=approval.pr_number,
                                                      head_sha=approval.head_sha), None
        runs = self.store.pull_request_runs(repo=approval.repo, pr=approval.pr_number)
        chosen, refusal = head_when_written([(r.meta, r.created_at, r.id, r.revision_sha) for r in runs], approval)
        return next((r for r in runs if r.id == chosen), None), refusal

    def approval_head(self, approval: Approval) -> tuple[int, str] | None:
        """(run id, head sha) of the run ``approval`` concerns, None when it concerns none."""
        run, _ = self.approved_run(approval)
        return (run.id, run.revision_sha) if run is not None else None

    def _dispatch(self, sha: str, new: NewRun, redispatch: bool) -> Submitted:

        if new.status == AWAITING_APPROVAL:  # no jobs until approved (approve)
            return Submitted(run_id=new.run_id, created=new.created, awaiting=True)
        if new.created:
            jobs = list(new.jobs)
        elif redispatch:
            jobs = [j for j in new.jobs if j.status == "queued" and j.attempts == 0]
        else:
            return Submitted(run_id=new.run_id, created=False)
        if jobs:
            self.dispatch(self.settings, sha, jobs)
        return Submitted(run_id=new.run_id, created=new.created, dispatched=len(jobs))


class _ApprovedMeanwhile(Exception):
    """Rolls back an approval's transaction when another approval started the run first."""


def _pass_repo_meta(request: RunRequest) -> JsonObject:
    """``{"pass_repo": {"url", "repo", "installation"}}`` for a request that carries its repository's clone URL
    (``AMPCI_PASS_REPO`` unset: the worker clones it, :func:`service.orchestration.jobs.job_worker_config`),
    else ``{}``.  No credential is ever stored: the worker mints one for the installation when it needs it."""
    if not request.clone_url:
        return {}
    return {PASS_REPO: {"url": request.clone_url, "repo": request.repo, "installation": request.installation}}


def manual_pass_repo(settings: Settings, store: Store, repository: str) -> JsonObject:
    """The pass repository entry (:data:`~service.orchestration.pass_repo.PASS_REPO`: ``{"url", "repo",
    "installation"}``) of a manual run that names ``repository`` (``owner/name``): the clone URL an allow-listed
    webhook delivery of it named before (kept with its runs), as a webhook run of it gets.

    Refused, with a one-line error: under ``AMPCI_PASS_REPO`` (every run tests that repository: UserError, 400);
    a repository outside ``AMPCI_ALLOWED_REPOS`` (RepositoryNotAllowedError, 403); one no delivery has named
    (UserError, 400); a recorded URL these settings no longer let workers clone (UserError, 400)."""
    from workers.revision.pass_source import CloneUrlError, check_clone_url

    if settings.pass_repo:
        raise UserError("repository: this deployment tests AMPCI_PASS_REPO in every run; leave repository out")
    check_repository(repository, settings)
    source = store.recorded_pass_repo(repository)
    if source is None:
        raise UserError(f"repository {repository}: no webhook delivery has named its clone URL yet; push to it "
                        "(or redeliver one of its webhooks) first")
    try:
        url = check_clone_url(source.get("url"), allow_file=settings.pass_repo_allow_file, repo=repository)
    except CloneUrlError as exc:
        raise UserError(f"repository {repository}: its recorded clone URL may not be cloned: {exc}") from None
    installation = source.get("installation")
    return {"url": url, "repo": str(source.get("repo") or repository),
            "installation": installation if type(installation) is int else None}


def _same_pass_repo(meta: JsonObject) -> JsonObject:
    """The pass repository entry of ``meta`` (a baseline run tests the same repository as the run it serves)."""
    return {PASS_REPO: meta[PASS_REPO]} if meta.get(PASS_REPO) else {}

