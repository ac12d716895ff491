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

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

from service import run_meta
from service.errors import UserError
from service.json_types import JsonValue
from service.orchestration.broker import celery_app as celery_app  # re-exported
from service.orchestration.broker import enqueue as enqueue
from service.orchestration.jobs import PENDING_JOB_STATUSES as PENDING_JOB_STATUSES
from service.orchestration.jobs import cell_options as cell_options
from service.orchestration.jobs import dispatch_mode as dispatch_mode
from service.orchestration.jobs import dispatcher as dispatcher
from service.orchestration.jobs import finish_if_complete as finish_if_complete
from service.orchestration.jobs import open_store as open_store
from service.orchestration.jobs import record_crashed as record_crashed
from service.orchestration.jobs import record_result as record_result
from service.orchestration.localpool import LocalPool
from service.orchestration.pass_repo import job_worker_config
from service.orchestration.pass_repo import record_ancestry as record_ancestry  # re-exported
from service.orchestration.sweeps import (
    DTYPES as DTYPES,  # re-exported: callers find sweeps through the scheduler
)
from service.orchestration.sweeps import SWEEPS_DIR as SWEEPS_DIR
from service.orchestration.sweeps import Override as Override
from service.orchestration.sweeps import PlannedCell, SweepConfig, load_sweep, nightly_dedup_key
from service.orchestration.sweeps import SweepConfigError as SweepConfigError
from service.regressions.power import check_repeats
from service.regressions.thresholds import Thresholds
from service.settings import Settings

if TYPE_CHECKING:
    from service.db.records import RunInfo
    from service.db.store import Store
    from workers.revision.revisions import RevisionCache

ProgressCallback = Callable[[Mapping[str, int]], None]
Cell = tuple[str, str, str, str]


# -- runs -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StartedRun:
    """A run that exists in the store with its jobs dispatched (or found by its dedup key)."""

    run_id: int
    revision: str
    baseline: str | None
    cells: int
    created: bool
    pool: LocalPool | None = None  # the embedded LocalPool running its jobs, if any


def zoo_catalog(path: Path | None = None, data_dir: Path | None = None) -> dict[str, frozenset[str]]:
    """Zoo model name -> tags, from a manifest (default ``zoo.toml`` merged with the user zoo under
    ``data_dir``); fetches nothing, no onnxruntime."""
    from workers.zoo.manifest import load_zoo

    return {name: frozenset(entry.tags) for name, entry in load_zoo(path, data_dir).entries.items()}


def _cache(settings: Settings, source: JsonValue = None) -> RevisionCache:
    from workers.revision import revisions as rv
    return rv.RevisionCache.from_config(job_worker_config(settings, source))


def resolve_revision(settings: Settings, revision: str, source: JsonValue = None) -> str:
    """The full sha of ``revision`` (branch, tag, full or short sha, ``HEAD``) of the pass repository (the one
    ``source`` names, a run's :data:`~service.orchestration.pass_repo.PASS_REPO` entry, when given);
    ``WORKTREE`` is returned unchanged.  Stores nothing; an unknown revision is a one-line UserError."""
    from workers.revision.git_commands import RevisionError
    from workers.revision.snapshots import WORKTREE
    if revision == WORKTREE:
        return revision
    try:
        return str(_cache(settings, source).resolve(revision))
    except RevisionError as exc:
        raise UserError(str(exc)) from None


def _worktree_dir(settings: Settings) -> Path:
    from workers.revision import revisions as rv
    if settings.pass_repo and Path(settings.pass_repo).is_dir():
        return Path(settings.pass_repo)
    return Path(rv.default_pass_repo())


def sweep_revisions(settings: Settings, revision: str, baseline: str | None) -> tuple[str, str | None]:
    """``(sha or WORKTREE key, baseline sha)`` a sweep of ``revision`` would use: both resolved
    through git (the default baseline is the first parent; for ``WORKTREE``, ``HEAD``).  Writes
    nothing to the store; UserError for an unknown revision or baseline."""
    sha, parent, _ = _describe_revision(settings, revision)
    return sha, (resolve_revision(settings, baseline) if baseline else parent)


@dataclass(frozen=True)
class RevisionFields:
    """What is stored about a revision a sweep runs (:meth:`Store.upsert_revision`): its parents, branch,
    author and subject (None: unknown)."""

    parents: tuple[str, ...] = ()
    branch: str | None = None
    author: str | None = None
    message: str | None = None

    @classmethod
    def from_git(cls, info: Mapping[str, object]) -> RevisionFields:
        """The fields of :func:`workers.revision.revisions.describe`'s answer (parents a list of shas, the others
        text or None); a value of another type counts as unknown."""
        parents = info.get("parents")

        def text(key: str) -> str | None:
            value = info.get(key)
            return value if isinstance(value, str) else None

        return cls(parents=tuple(p for p in parents if isinstance(p, str)) if isinstance(parents, list | tuple) else (),
                   branch=text("branch"), author=text("author"), message=text("message"))


def _describe_revision(settings: Settings, revision: str) -> tuple[str, str | None, RevisionFields]:
    """(sha-or-worktree-key, default baseline, revision fields) for ``REV`` or ``WORKTREE``."""
    from workers.revision import revisions as rv
    from workers.revision.git_commands import SHA_RE, RevisionError, git
    from workers.revision.snapshots import WORKTREE
    cache = _cache(settings)
    if revision == WORKTREE:
        local = _worktree_dir(settings)
        key = cache.snapshot(local)
        try:
            head = git(["rev-parse", "--verify", "HEAD^{commit}"], cwd=local).strip()
        except RevisionError:
            head = ""
        base = resolve_revision(settings, head) if SHA_RE.match(head) else None
        return key, base, RevisionFields(parents=(base,) if base else (), branch=WORKTREE,
                                         message=f"uncommitted working tree of {local}")
    sha = resolve_revision(settings, revision)
    try:
        cache.checkout(sha)  # fails early for a commit that cannot be checked out
        info = RevisionFields.from_git(rv.describe(cache, sha))
    except RevisionError as exc:
        raise UserError(str(exc)) from None
    return sha, (info.parents[0] if info.parents else None), info


def start_sweep(settings: Settings, config: SweepConfig, revision: str = "WORKTREE", *,
                trigger: str = "manual", baseline: str | None = None, dedup_key: str | None = None,
                store: Store | None = None, catalog: Mapping[str, Iterable[str]] | None = None,
                local_workers: int | None = None, only_cells: Iterable[Cell] | None = None) -> StartedRun:
    """Create the run of ``config`` at ``revision`` and dispatch its jobs; return without waiting.

    Guarantees: ``revision`` and ``baseline`` (branch, tag, full or short sha) are resolved to full
    shas through the pass repository before anything is stored (unknown: UserError, nothing stored);
    the revision's and the baseline's first-parent ancestry is recorded from git
    (:func:`record_ancestry`); ``only_cells`` restricts the run to those cells of the sweep; the run
    and all its job rows are committed before the first job is dispatched, the run recording how
    they are dispatched (:func:`dispatch_mode`); a ``dedup_key`` that already has a run dispatches
    nothing (``created`` False); embedded mode (no broker) starts a :class:`LocalPool` in this
    process (call ``pool.close()`` when done), distributed mode sends one Celery message per job
    to the queue named by its target.
    """
    store = store if store is not None else open_store(settings)
    cells = config.expand(catalog if catalog is not None else zoo_catalog(config.zoo_path(), settings.data_dir))
    check_repeats(config.name, [(c.cell, c.repeats) for c in cells], store.thresholds or Thresholds())
    if only_cells is not None:
        wanted = set(only_cells)
        cells = [c for c in cells if c.cell in wanted]
    pool = None
    if settings.embedded and cells:  # its workers start up while the revision is described and stored
        pool = LocalPool(settings, store, workers=local_workers)
        pool.prestart(len(cells))
    try:
        return _start_run(settings, store, config, cells, revision, trigger, baseline, dedup_key, pool)
    except BaseException:
        if pool is not None:
            pool.close()
        raise


def _start_run(settings: Settings, store: Store, config: SweepConfig, cells: list[PlannedCell], revision: str,
               trigger: str, baseline: str | None, dedup_key: str | None, pool: LocalPool | None) -> StartedRun:
    """The rest of :func:`start_sweep`, with its (prestarted) local pool, if any."""
    sha, parent, info = _describe_revision(settings, revision)
    base = resolve_revision(settings, baseline) if baseline else parent
    from workers.revision.git_commands import SHA_RE

    # a commit's own chain covers its parents; a WORKTREE key's parent is HEAD
    roots = [sha] if SHA_RE.match(sha) else list(info.parents[:1])
    for root in dict.fromkeys(r for r in [*roots, base] if r and SHA_RE.match(r)):
        record_ancestry(settings, store, root)
    store.upsert_revision(sha, parents=info.parents, branch=info.branch, author=info.author, message=info.message)
    meta = run_meta.encode(cells, revision)
    meta["confirm_pairs"] = settings.confirm_pairs  # timing regressions are confirmed before the run ends
    # [[nodes]] regexes matching nothing
    meta.update(config.warnings_meta(cells, settings.cache_dir, settings.data_dir))
    run_id, created = store.create_run_if_new(sha, trigger, base, config.name, [c.cell for c in cells],
                                              dedup_key, meta, dispatch=dispatch_mode(settings))
    if not created:
        if pool is not None:
            pool.close()
        return StartedRun(run_id, sha, base, len(cells), created=False)
    jobs = store.jobs(run_id)
    if settings.embedded:
        if pool is None:
            pool = LocalPool(settings, store)
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


def wait_for_run(store: Store, run_id: int, on_progress: ProgressCallback | None = None,
                 poll: float = 0.5, timeout: float | None = None,
                 wake: Callable[[float], object] | None = None) -> RunInfo:
    """Block until no job of the run is pending and its confirmation (if any) is over, then finish it;
    return its final RunInfo.

    ``on_progress`` gets the job counts by status after every poll.  Raises TimeoutError after
    ``timeout`` seconds (the run is left as it is; workers keep going).  ``wake`` (e.g.
    :meth:`LocalPool.wait_for_change`) blocks until a job ends or its timeout passes: the next poll
    then follows each job's end at once instead of after a sleep (``poll`` bounds the wait).
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        counts: dict[str, int] = {}
        for job in store.jobs(run_id):
            counts[job.status] = counts.get(job.status, 0) + 1
        if on_progress is not None:
            on_progress(counts)
        if not any(counts.get(s) for s in PENDING_JOB_STATUSES) and finish_if_complete(store, run_id):
            return store.get_run(run_id)  # (not before its suspected timing regressions are confirmed)
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} still has pending jobs after {timeout:.0f}s")
        if wake is not None:
            wake(poll)
        else:
            time.sleep(poll)


