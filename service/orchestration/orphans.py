"""Jobs of ``local`` runs whose owning process is gone: recorded owners, clean hand-back, resumption.

A ``local`` run (``runs.dispatch``) has its jobs run by the embedded :class:`LocalPool` of one
process (``ampci serve`` or ``ampci sweep`` without a broker).  Its jobs live in that process's
memory queue; if the process stops, nothing else runs them.  This module makes that safe:

* **the owner is recorded**: when a pool takes a run's jobs (:meth:`LocalPool.submit`) it writes
  ``runs.local_owner = {"host", "pid", "start"}`` (``start``: the process's start time, so a
  recycled pid is not mistaken for the owner; a column since migration 0007, before it a key of
  ``runs.meta``) — one UPDATE per submit;
* **a clean stop hands the jobs back** (:meth:`LocalPool.shutdown`, called by the app's lifespan on
  SIGTERM): the job being run is re-queued (its interrupted attempt not counted), the queued ones
  stay queued, and ownership is released (``local_owner`` NULL);
* **the next process resumes them** (:func:`resume_orphans`: ``ampci serve`` at start-up, ``ampci
  reconcile --resume`` without a broker): the jobs of unfinished local runs whose owner was released
  or is a dead process *on this host* are claimed (under a row lock, re-checked, so two resumers
  never both take a run) and submitted to the caller's pool; a job left ``running`` by a process
  that died counts that attempt (a poison job still ends ``crashed``).

A live owner's jobs are never taken.  An owner on another host cannot be checked from here: its
runs are listed (:func:`find_orphans`, state ``other-host``) but resumed only when ``force`` says so.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from service.db import recovery
from service.json_types import JsonObject

if TYPE_CHECKING:
    from service.db.store import Store
    from service.orchestration.jobs import JobSubmitter

OWNER_KEY = "local_owner"  # the column of runs (migration 0007; a key of runs.meta before it)


def _start_time(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot, from /proc), None if unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def me() -> JsonObject:
    """This process as a run's owner."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "start": _start_time(os.getpid())}


def owner_state(owner: object) -> str:
    """``released`` (no owner), ``alive``, ``dead`` (a process of this host that is gone, or whose pid
    now belongs to a process started later) or ``other-host`` (cannot be checked from here)."""
    if not isinstance(owner, dict) or not owner:
        return "released"
    if owner.get("host") != socket.gethostname():
        return "other-host"
    recorded = owner.get("pid")
    if not isinstance(recorded, str | int | float):  # (what int() turns into a pid; anything else: TypeError)
        return "dead"
    try:
        pid = int(recorded)
    except (TypeError, ValueError):
        return "dead"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "dead"
    except PermissionError:
        pass  # exists, another user's
    start = owner.get("start")
    if start is not None and _start_time(pid) not in (None, start):
        return "dead"  # the pid was recycled
    return "alive"


def owner_of(store: Store, run_id: int) -> JsonObject | None:
    """The recorded owner of run ``run_id`` (``{"host", "pid", "start"}``), None when nobody owns it."""
    with store.transaction() as conn:
        owner = recovery.run_owner(conn, run_id=run_id)
    return owner if isinstance(owner, dict) and owner else None


def claim_runs(store: Store, run_ids: Iterable[int], owner: JsonObject | None = None) -> None:
    """Record ``owner`` (default: this process) as the owner of the local runs ``run_ids``."""
    ids = sorted({int(r) for r in run_ids})
    if ids:
        with store.transaction() as conn:
            recovery.set_run_owner(conn, run_ids=ids, owner=owner or me())


def release_runs(store: Store, run_ids: Iterable[int]) -> None:
    """Hand the runs ``run_ids`` back (owner null) where this process still owns them."""
    ids = sorted({int(r) for r in run_ids})
    if not ids:
        return
    mine = me()
    with store.transaction() as conn:
        ours = [run_id for run_id, owner in recovery.run_owners(conn, run_ids=ids).items() if _same(owner, mine)]
        if ours:
            recovery.set_run_owner(conn, run_ids=ours, owner=None)


def _same(a: object, b: JsonObject) -> bool:
    return isinstance(a, dict) and a.get("host") == b["host"] and a.get("pid") == b["pid"]


def requeue_job(store: Store, job_id: int, *, count_attempt: bool = False) -> bool:
    """A ``running`` job back to ``queued`` (worker and start cleared); its attempt is uncounted
    unless ``count_attempt`` (its worker died: the attempt stays, a poison job still ends crashed).
    True if it was running."""
    with store.transaction() as conn:
        return recovery.requeue_running_job(conn, job_id=job_id, count_attempt=count_attempt)


@dataclass(frozen=True)
class Orphan:
    """An unfinished local run with pending jobs, and whether its owner can be taken over."""

    run_id: int
    owner: JsonObject | None
    state: str          # released | dead | other-host | alive
    queued: int
    running: int

    def describe(self) -> str:
        """One line for people."""
        who = ("released by its process" if self.state == "released" else
               f"owner {self.owner.get('host')} pid {self.owner.get('pid')} {self.state}" if self.owner else self.state)
        return f"run {self.run_id}: {self.queued} queued, {self.running} running job(s); {who}"

    @property
    def resumable(self) -> bool:
        """True when no live process can be running its jobs (released or dead owner)."""
        return self.state in ("released", "dead")


def find_orphans(store: Store, *, include_alive: bool = False) -> list[Orphan]:
    """Unfinished ``local`` runs with queued or running jobs, oldest first, with their owner's state
    (runs of a live owner only with ``include_alive``)."""
    with store.transaction() as conn:
        runs = recovery.local_runs_with_pending_jobs(conn)
    out = []
    for r in runs:
        owner = r.owner
        state = owner_state(owner)
        if state == "alive" and not include_alive:
            continue
        out.append(Orphan(r.run_id, owner if isinstance(owner, dict) else None, state, r.queued, r.running))
    return out


def resume_orphans(store: Store, pool: JobSubmitter, *, force: bool = False) -> list[Orphan]:
    """Take over the resumable orphans (with ``force`` also those of other hosts) and submit their
    jobs to ``pool``; the orphans taken.  Each run is claimed under a row lock after re-checking its
    owner, so of two processes resuming at once exactly one takes it."""
    taken = []
    mine = me()
    for orphan in find_orphans(store):
        if not (orphan.resumable or (force and orphan.state == "other-host")):
            continue
        with store.transaction() as conn:
            now = owner_state(recovery.run_owner(conn, run_id=orphan.run_id, lock=True))
            if now == "alive" or (now == "other-host" and not force):
                continue  # taken meanwhile
            recovery.set_run_owner(conn, run_ids=[orphan.run_id], owner=mine)
        for job in store.jobs(orphan.run_id):
            if job.status == "running":  # its process died while running it: that attempt counts
                requeue_job(store, job.id, count_attempt=orphan.state != "released")
        queued = [j for j in store.jobs(orphan.run_id) if j.status == "queued"]
        if queued:
            pool.submit(queued)
        taken.append(orphan)
    return taken
