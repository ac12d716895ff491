"""The embedded local pool: runs a run's jobs in spawned worker subprocesses of this process.

Used when no broker is configured.  The parent is the only database writer; job code (and so
onnxruntime) is imported only in the subprocesses.  Its worker subprocesses are
:mod:`service.orchestration.pool_slots`' (which a worker unpickles its body from, paying for no database layer);
this module imports only the standard library and :mod:`service.settings` at its top (the bookkeeping of
:mod:`service.orchestration.jobs`, and with it SQLAlchemy, is imported where it is used), so :func:`warm_up`
can start the workers before its caller imports anything heavy.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from service.orchestration import pool_slots
from service.orchestration.pool_handback import HandedBack, JobLedger
from service.orchestration.pool_slots import stop_idle_forkserver, warm_up
from service.settings import Settings

if TYPE_CHECKING:
    from service.db.records import JobInfo
    from service.db.store import Store

__all__ = ["LocalPool", "stop_idle_forkserver", "warm_up"]


class LocalPool:
    """Runs jobs in ``workers`` local subprocesses (default: CPU count), recording like a Celery worker.

    Guarantees: the same attempt counting as distributed mode (a job whose subprocess dies is
    retried; past ``max_attempts`` it ends ``crashed``, without touching other jobs); a job running
    past ``job_timeout`` gets a ``timeout`` result; this process writes every result (one writer,
    so SQLite is fine) and finishes the run after its last job.  With ``continue_bisections`` (the
    default) a finished ``bisect`` run advances its bisection and the next midpoint runs on this pool;
    without it the caller drives the bisection (:mod:`service.orchestration.bisect_run`).
    """

    def __init__(self, settings: Settings, store: Store, workers: int | None = None,
                 continue_bisections: bool = True) -> None:
        self.settings = settings
        self.store = store
        self.workers = max(1, workers or os.cpu_count() or 1)
        self.continue_bisections = continue_bisections
        self._queue: queue.Queue[JobInfo] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._slots: list[pool_slots.Slot] = []
        self._idle: list[pool_slots.Slot] = []   # subprocesses of threads that ran out of jobs, kept for the next submit
        self._active = 0               # threads taking jobs (guarded by _lock, as are the queue's gets)
        self._lock = threading.Lock()
        self._cancelled = threading.Event()
        self._changed = threading.Condition()  # notified whenever a job of this pool ends
        self._ended = 0                        # jobs ended so far (guarded by _changed)
        self._prestart: threading.Thread | None = None
        self.errors: list[BaseException] = []
        self._owned: set[int] = set()          # runs this pool recorded itself the owner of (orphans.py)
        self._stopping = threading.Event()     # shutdown(): interrupted jobs are re-queued, not cancelled
        self._hand_back: set[int] = set()      # adopted runs: cancel() hands their jobs back, never cancels them
        self._ledger = JobLedger()             # the threads' job writes; shutdown() closes it and hands back

    def prestart(self, jobs: int | None = None) -> None:
        """Start up to ``workers`` (at most ``jobs``) worker subprocesses now, idle, so that their
        start-up (imports, fork server) overlaps what the caller does before :meth:`submit`."""
        want = min(self.workers, self.workers if jobs is None else max(0, jobs))
        warm = pool_slots.take_warm(max(0, want - len(self._idle)))  # started by warm_up() already, if any
        with self._lock:
            self._slots.extend(warm)
            self._idle.extend(warm)
            new = list(warm)  # (their start, if still in progress, is waited for below)
            while len(self._idle) < want:
                slot = pool_slots.Slot()
                self._slots.append(slot)
                self._idle.append(slot)
                new.append(slot)

        def start() -> None:  # in the background: the first start waits for the preloading server
            for slot in new:
                try:
                    slot.ensure_started()
                except Exception:  # noqa: BLE001 - run() starts it again, and reports, when a job needs it
                    pass

        self._prestart = threading.Thread(target=start, daemon=True, name="ampci-pool-prestart")
        self._prestart.start()

    def wait_for_change(self, timeout: float) -> bool:
        """Block until a job of this pool ends (True) or ``timeout`` seconds pass (False): a waiter
        learns of finished jobs at once instead of sleeping between polls."""
        with self._changed:
            seen = self._ended
            return self._changed.wait_for(lambda: self._ended != seen, timeout)

    def _job_ended(self) -> None:
        with self._changed:
            self._ended += 1
            self._changed.notify_all()

    def submit(self, jobs: Iterable[JobInfo]) -> None:
        """Queue jobs and make sure up to ``workers`` threads (each with its subprocess) take them,
        also after earlier jobs are done (an idle subprocess is reused)."""
        jobs = list(jobs)
        new_runs = {job.run_id for job in jobs} - self._owned
        if new_runs:  # record this process as their owner: a later process resumes them if it dies
            from service.orchestration.orphans import claim_runs

            claim_runs(self.store, new_runs)
            self._owned |= new_runs
        with self._lock:
            for job in jobs:
                self._queue.put(job)
            while self._active < min(self.workers, self._active + self._queue.qsize()):
                slot = self._idle.pop() if self._idle else pool_slots.Slot()
                if slot not in self._slots:
                    self._slots.append(slot)
                t = threading.Thread(target=self._loop, args=(slot, len(self._threads)), daemon=True)
                self._threads.append(t)
                self._active += 1
                t.start()

    def _next_job(self, slot: pool_slots.Slot) -> JobInfo | None:
        """The next queued job, or None after this thread stopped taking jobs (its slot idle)."""
        with self._lock:
            job = None
            if not self._cancelled.is_set():
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    pass
            if job is None:
                self._active -= 1
                self._idle.append(slot)
            return job

    def _loop(self, slot: pool_slots.Slot, index: int) -> None:
        name = f"local-{os.getpid()}-{index}"
        while True:
            job = self._next_job(slot)
            if job is None:
                return
            try:
                self._run_one(slot, job, name)
            except HandedBack:  # shutdown() handed the job back: nothing more to write about it
                pass
            except BaseException as exc:  # noqa: BLE001 - keep the pool alive, report at the end
                self.errors.append(exc)
                try:
                    with self._ledger.write(job.id, ends=True):
                        self.store.mark_job(job.id, "error", f"{type(exc).__name__}: {exc}")
                except HandedBack:
                    pass
            finally:
                self._job_ended()

    def _run_one(self, slot: pool_slots.Slot, job: JobInfo, worker: str) -> None:
        """Run ``job`` in ``slot`` to its end.  Every write about the job goes through the pool's
        :class:`JobLedger` (:class:`HandedBack` once :meth:`shutdown` handed the job back)."""
        from service.orchestration.jobs import (
            PASS_REPO,
            cell_options,
            complete_job,
            dispatcher,
            finish_if_complete,
            job_worker_config,
            record_crashed,
        )
        from service.orchestration.orphans import requeue_job
        from workers.result import JobResult

        book = self._ledger.write
        pending: bool | None = None  # whether the run still has pending jobs after this one (None: ask)
        while True:
            with book(job.id, begins=True):  # the attempt, the job and its run: one statement
                start = self.store.begin_job(job.id, worker)
            if not start.started:  # final already (e.g. cancelled meanwhile): nothing to run
                self._ledger.ended(job.id)
                break
            if self._stopping.is_set():  # shutdown() began meanwhile: hand the job back at once
                with book(job.id, ends=True):
                    requeue_job(self.store, job.id)
                return
            run, attempts = start.run, start.attempts
            if attempts > self.settings.max_attempts:
                with book(job.id, ends=True):
                    record_crashed(self.store, run, job, attempts)
                break
            options = cell_options(run, job.cell)
            request = (job.cell, run.revision_sha, job_worker_config(self.settings, options.get(PASS_REPO)), options)
            try:
                text = slot.run(request, timeout=self.settings.job_timeout)
            except pool_slots.SlotDied:
                if self._stopping.is_set() or (self._cancelled.is_set() and job.run_id in self._hand_back):
                    # a clean stop, or an adopted run's job at cancel(): back to the queue, uncounted
                    with book(job.id, ends=True):
                        requeue_job(self.store, job.id)
                    return
                if self._cancelled.is_set():
                    with book(job.id, ends=True):
                        self.store.mark_job(job.id, "cancelled", "sweep interrupted")
                    break
                continue
            if text is None:
                result = JobResult(model=job.model, dtype=job.dtype, policy=job.policy, target=job.target,
                                   status="timeout", revision=run.revision_sha,
                                   message=f"job exceeded {self.settings.job_timeout:.0f}s; worker killed")
            else:
                result = JobResult.from_json(text)
            with book(job.id, ends=True):
                _, pending = complete_job(self.store, run, job, result)
            break
        if pending is None:
            pending = self.store.has_pending_jobs(job.run_id)
        if pending:  # not the run's last job: nothing to finish
            return
        if not self.continue_bisections:
            finish_if_complete(self.store, job.run_id)
            return
        # a finished bisect run queues its next midpoint run on this pool (see finish_if_complete)
        finish_if_complete(self.store, job.run_id, self.settings, dispatcher(self.settings, self.store, self))

    def close(self) -> None:
        """Wait for the queued jobs' threads and stop every subprocess."""
        self.finish()
        self.stop_workers()

    def finish(self) -> None:
        """Wait for the prestart and for the queued jobs' threads: every job queued so far has ended and its
        result is written (the subprocesses stay up; :meth:`stop_workers` or :meth:`close` stops them)."""
        if self._prestart is not None:
            self._prestart.join()
        for t in self._threads:
            t.join()

    def stop_workers(self) -> None:
        """Stop every subprocess of this pool, all told at once and then each reaped (killed after 5 s).
        Call it after :meth:`finish`: a job still running is cut short."""
        for slot in self._slots:  # all asked first: their exits overlap
            slot.ask_to_stop()
        for slot in self._slots:
            slot.stop()

    def shutdown(self, timeout: float = 8.0) -> None:
        """Stop cleanly (the server is going down): take no more jobs, re-queue the ones being run
        (their subprocesses are killed; the interrupted attempt is not counted), leave the queued ones
        ``queued`` and release this process's ownership of their runs, so that the next ``ampci
        serve`` (or ``ampci reconcile --resume``) on the database resumes them
        (:mod:`service.orchestration.orphans`).

        The hand-back is done here, before this returns, whatever the job threads are doing: when it
        returns no job this pool began is ``running`` (barring a database write of a job thread still in
        flight after ``timeout``), and no job thread writes about a job afterwards (:class:`JobLedger`).
        Waiting for the threads and subprocesses after that only frees them; it returns within about
        ``timeout`` seconds for each of the prestart, the threads and the writes in flight."""
        from service.orchestration.orphans import release_runs, requeue_job

        self._stopping.set()
        self._cancelled.set()
        while True:  # the queued jobs stay queued in the database
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        for job_id in self._ledger.close(timeout):  # none of this pool's threads writes about a job from here
            requeue_job(self.store, job_id)  # (only where it is still running: a job that ended stays so)
        release_runs(self.store, self._owned)
        if self._prestart is not None:
            self._prestart.join(timeout)
        for slot in list(self._slots):  # their threads see the subprocess die (their jobs are handed back above)
            proc = slot.proc
            if proc is not None and proc.is_alive():
                proc.kill()
        for t in self._threads:
            t.join(timeout)
        for slot in self._slots:
            slot.stop(kill=True)

    def hand_back_on_cancel(self, run_ids: Iterable[int]) -> None:
        """Mark ``run_ids`` as adopted (another process's orphaned runs): :meth:`cancel` leaves their jobs
        ``queued`` (the running one re-queued, its attempt uncounted) and releases them, as
        :meth:`shutdown` does, instead of cancelling them -- interrupting this process must not end
        runs it merely took over."""
        self._hand_back |= {int(r) for r in run_ids}

    @property
    def adopted_runs(self) -> frozenset[int]:
        """The runs marked with :meth:`hand_back_on_cancel`."""
        return frozenset(self._hand_back)

    def cancel(self) -> None:
        """Stop now (e.g. Ctrl-C): kill the subprocesses, mark unfinished jobs ``cancelled``, finish the run;
        the jobs of adopted runs (:meth:`hand_back_on_cancel`) are handed back instead."""
        from service.orchestration.jobs import finish_if_complete

        self._cancelled.set()
        run_ids = set()
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job.run_id in self._hand_back:  # stays queued for the next process
                continue
            run_ids.add(job.run_id)
            self.store.mark_job(job.id, "cancelled", "sweep interrupted")
        if self._prestart is not None:
            self._prestart.join()
        for slot in list(self._slots):  # the running threads see EOF and mark their jobs cancelled
            proc = slot.proc
            if proc is not None and proc.is_alive():
                proc.kill()
        for t in self._threads:
            t.join(30)
        for slot in self._slots:
            slot.stop(kill=True)
        for run_id in run_ids:
            finish_if_complete(self.store, run_id)
        if self._hand_back:
            from service.orchestration.orphans import release_runs

            release_runs(self.store, self._hand_back)
