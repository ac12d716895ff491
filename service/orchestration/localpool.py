"""The embedded local pool: runs a run's jobs in spawned worker subprocesses of this process.

Used when no broker is configured.  The parent is the only database writer; job code (and so
onnxruntime) is imported only in the subprocesses.  This module imports only the standard library and
:mod:`service.settings` at its top (the bookkeeping of :mod:`service.orchestration.jobs`, and with it
SQLAlchemy, is imported where it is used): a worker subprocess unpickles :func:`_slot_main` from here and
does not pay for a database layer it never touches, and :func:`warm_up` can start the workers before its
caller imports anything heavy.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import queue
import signal
import socket
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, TypeAlias

from service.orchestration import pool_template
from service.orchestration.pool_handback import HandedBack, JobLedger
from service.settings import Settings

if TYPE_CHECKING:  # annotations only: a worker subprocess imports none of these for this module
    from multiprocessing.connection import Connection
    from multiprocessing.context import ForkServerContext, SpawnContext
    from multiprocessing.process import BaseProcess

    from service.db.records import JobInfo
    from service.db.store import Store
    from service.json_types import JsonObject
    from workers.revision.config import WorkerConfig

    #: One job for a worker subprocess: (cell, revision, the worker config, the job's options).
    Request: TypeAlias = tuple[tuple[str, str, str, str], str, WorkerConfig, JsonObject]
    #: The pool's end of a worker's pipe: sends requests (None: stop), receives a result's JSON.
    PoolEnd: TypeAlias = Connection[Request | None, str]
    #: The worker subprocess's end of its pipe.
    WorkerEnd: TypeAlias = Connection[str, Request | None]


def _slot_main(conn: WorkerEnd, template: socket.socket | None = None,
               environ: dict[str, str] | None = None) -> None:
    """Body of one local worker subprocess: run requested cells one at a time until told to stop.

    Its environment is ``environ``, the pool process's (a worker forked from the template's job server
    starts with the template's allow-listed one: :mod:`service.orchestration.pool_template`).
    First, while it has one thread, it takes its connection to the pool's sandbox template (``template``:
    numpy, onnx and onnx_ir imported once for every worker of the pool, :mod:`workers.sandbox.template`), or, given
    none, starts a fork server of its own (:func:`workers.sandbox.zygotes.start_forkserver`).  Then it imports the job code once for all
    its jobs, in a thread, while it waits for its first request, and starts that request's revision's
    conversion zygote in another (:func:`_prewarm`): the zygote imports the pass in its own process while
    this one imports onnxruntime and then runs the first job's steps before its conversion (fetch, load,
    reference), instead of after them, on the first job's path; the conversion finds the zygote up, or
    waits for the start in progress (:func:`workers.sandbox.zygotes.zygote_for` starts one per pass root).
    When it ends (told to stop, or its parent gone) it stops its zygotes and its fork server by pid."""
    from workers.sandbox import zygotes
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    if template is not None:
        zygotes.use_template(template)
    else:
        zygotes.start_forkserver()
    try:
        _serve_requests(conn)
    finally:  # its conversion processes end with it, by pid: zygotes (process groups), then their fork server
        zygotes.shutdown()
        zygotes.stop_forkserver()


def _serve_requests(conn: WorkerEnd) -> None:
    """The request loop of :func:`_slot_main` (after its fork server started)."""
    import importlib

    # onnxruntime and the job code, once per worker, before its first job
    importer = threading.Thread(target=importlib.import_module, args=("workers.jobs.job",), daemon=True)
    importer.start()
    try:
        request = conn.recv()
    except EOFError:
        return
    if request is not None:  # the zygote starts while the first job loads its model and reference
        threading.Thread(target=_prewarm, args=(request,), daemon=True, name="ampci-prewarm").start()
    importer.join()
    from workers.jobs.cell import run_cell  # the only place the service side reaches job code

    while request is not None:
        (model, dtype, policy, target), revision, config, options = request
        conn.send(run_cell((model, dtype, policy, target), revision, config, options).to_json())
        try:
            request = conn.recv()
        except EOFError:
            return


def _prewarm(request: Request) -> None:
    """Start the conversion zygote of ``request``'s revision (the first job's conversion then finds it up);
    any failure is left for the job to meet and report."""
    try:
        from workers.revision.convert import prewarm
        from workers.revision.revisions import RevisionCache

        revision, config = request[1], request[2]
        prewarm(RevisionCache.from_config(config).checkout(revision), config.sandbox_policy())
    except Exception:  # noqa: BLE001 - the job reports what went wrong
        pass


class _SlotDied(Exception):
    pass


#: What the job code imports that multiprocessing's fork server preloads for every worker: numpy and onnx,
#: not onnx_ir (and its sympy, ~0.5 s of CPU here): only the pass needs that, and the pass's dependencies are
#: the sandbox template's to import (:mod:`workers.sandbox.template`), not the workers'.
JOB_PRELOAD = ("numpy", "onnx")


def _context() -> ForkServerContext | SpawnContext:
    """The multiprocessing context of worker subprocesses: ``forkserver`` with the job code's heavy
    dependencies preloaded (:data:`JOB_PRELOAD`: imported once in the server, not once per worker; forked
    from it, a worker inherits none of this process's threads and sockets), ``spawn`` where there is no
    fork server."""
    try:
        ctx = multiprocessing.get_context("forkserver")
    except ValueError:
        return multiprocessing.get_context("spawn")
    ctx.set_forkserver_preload(list(JOB_PRELOAD))
    pool_template.use_template_for_workers()  # the server forked from the sandbox template where it can
    return ctx


#: Worker subprocesses of this process that are started and not yet stopped (guarded by _SERVER_LOCK):
#: at exit, multiprocessing's fork server is stopped by pid when none is (:func:`stop_idle_forkserver`).
_LIVE: set[object] = set()
_SERVER_LOCK = threading.Lock()


def stop_idle_forkserver() -> bool:
    """Stop multiprocessing's fork server of this process now, by its pid, when no local worker
    subprocess is started (none live, none warming up): True when one was stopped.  Runs at this
    process's exit (``atexit``); a later worker start would start a new server.

    The server is this process's child and would otherwise end only after this process exited and it
    noticed, in a full interpreter teardown with numpy, onnx and onnx_ir loaded (0.1-0.3 s), holding
    this process's stdout and stderr open meanwhile: a caller reading them (CI, ``$(ampci sweep ...)``)
    waited for it.  Its workers are stopped and reaped before (their exit status comes through it), so
    nothing is left behind; with a worker still up, or one being started, it is left to end as before
    (this never waits for a start in progress: an early error exit is not held up by the server's preload)."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    if not _SERVER_LOCK.acquire(blocking=False):  # a worker is being started (its server may be preloading)
        return False
    try:
        with _WARM_LOCK:
            if _LIVE or _WARM:
                return False
        if server is None or not hasattr(server, "_stop_unlocked"):
            pool_template.stop_template()
            return False
        with server._lock:
            if pool_template.stop_job_server(server):  # the template's child: killed, then the template
                pool_template.stop_template()
                return True
            pool_template.stop_template()  # no worker is up: nothing forks from the sandbox template any more
            pid = server._forkserver_pid
            if pid is None:
                return False
            try:
                os.kill(pid, signal.SIGKILL)  # nothing of its teardown is needed: its workers are gone
            except ProcessLookupError:
                pass
            try:
                server._stop_unlocked()  # closes its "alive" pipe, reaps it, removes its socket file
            except OSError:  # its socket file went with multiprocessing's temp dir (its exit handler ran first)
                server._forkserver_pid = server._forkserver_address = None
    finally:
        _SERVER_LOCK.release()
    return True


class _Slot:
    """One worker subprocess (forked from a clean preloaded server, or spawned: the parent's threads
    and sockets are not inherited).

    Its process and pipe are taken and set under one lock (``_lock``): :meth:`stop` may be called by
    several threads at once (a pool's shutdown and the slot's own job thread) and ends the subprocess once."""

    def __init__(self) -> None:
        self.proc: BaseProcess | None = None
        self.conn: PoolEnd | None = None
        self._start_lock = threading.Lock()
        self._lock = threading.Lock()  # guards proc, conn and _asked (never held while waiting on them)
        self._retired = False
        self._asked = False  # told to stop (ask_to_stop) and not yet joined

    def _start(self) -> None:
        ctx = _context()
        with _SERVER_LOCK:  # never while stop_idle_forkserver() stops the server it is forked from
            conn, child = ctx.Pipe()
            template = pool_template.template_connection()
            proc = ctx.Process(target=_slot_main, args=(child, template, dict(os.environ)), daemon=True,
                               name="ampci-local-worker")
            try:
                proc.start()
            finally:
                if template is not None:
                    template.close()  # the worker has its own copy now
            _LIVE.add(proc)
        child.close()
        with self._lock:  # both at once, only once it has a pid
            self.proc, self.conn, self._asked = proc, conn, False

    def ensure_started(self) -> None:
        """Start the subprocess unless it is running (thread-safe: a prestart and a job may race)."""
        with self._start_lock:
            if self._retired:
                raise _SlotDied()
            if self.proc is None or not self.proc.is_alive():
                self.stop(kill=True)  # one that died: reaped, its pipe closed, before its successor starts
                self._start()

    def retire(self) -> None:
        """Stop the subprocess (once a start in progress is done) and never start it again."""
        with self._start_lock:
            self._retired = True
        self.stop(kill=True)

    def run(self, request: Request, timeout: float) -> str | None:
        """Result JSON, or None on timeout (the subprocess is killed); _SlotDied if it died (or was stopped
        meanwhile by another thread)."""
        self.ensure_started()
        conn = self.conn
        if conn is None:  # stopped by another thread since (a pool's shutdown)
            raise _SlotDied()
        try:
            conn.send(request)
            if conn.poll(timeout):
                return str(conn.recv())
        except (EOFError, OSError):  # OSError: BrokenPipeError, or the pipe closed by a concurrent stop()
            self.stop(kill=True)
            raise _SlotDied() from None
        self.stop(kill=True)
        return None

    def ask_to_stop(self) -> None:
        """Tell an idle subprocess to end after its current request, without waiting: :meth:`stop` then
        joins it (several are asked first and joined after, so their exits overlap)."""
        with self._lock:
            if self.proc is None or self.conn is None or self._asked:  # (both are set together)
                return
            conn, self._asked = self.conn, True
        try:
            conn.send(None)
        except OSError:  # gone already, or its pipe closed by a concurrent stop()
            pass

    def stop(self, kill: bool = False) -> None:
        """End the subprocess (asked, then killed after 5 s; ``kill``: at once) and reap it.

        Idempotent and thread-safe: the first of concurrent calls takes the subprocess and its pipe (under
        the slot's lock) and ends them outside it; the others find none and return at once."""
        with self._lock:
            proc, conn, asked = self.proc, self.conn, self._asked
            self.proc = self.conn = None
            self._asked = False
        if proc is None:
            return
        try:
            if not kill:
                if not asked and conn is not None:
                    try:
                        conn.send(None)
                    except OSError:
                        pass
                proc.join(5)
            if proc.is_alive():
                proc.kill()
            proc.join(5)
        finally:
            if conn is not None:  # (set with proc)
                conn.close()
            with _SERVER_LOCK:
                _LIVE.discard(proc)


#: Worker subprocesses started by :func:`warm_up`, idle, for the next :class:`LocalPool` of this process.
_WARM: list[_Slot] = []
_WARM_LOCK = threading.Lock()
atexit.register(stop_idle_forkserver)


def warm_up(workers: int | None = None) -> None:
    """Start ``workers`` (default: CPU count) local worker subprocesses now, in the background, for the
    next :class:`LocalPool` of this process to take (:meth:`LocalPool.prestart` adopts them).

    Meant for the very start of a command that will run jobs here (``ampci sweep`` without a broker):
    the fork server's preload (numpy, onnx, onnx_ir) and each worker's job code import run on the other
    cores while the command imports its own layers and stores the run, instead of after it.  Costs the
    caller a thread and a few ms; a worker that no pool takes dies with this process (daemonic)."""
    want = max(1, workers or os.cpu_count() or 1)
    with _WARM_LOCK:
        new = [_Slot() for _ in range(max(0, want - len(_WARM)))]
        _WARM.extend(new)
    if new:
        threading.Thread(target=_start_all, args=(new,), daemon=True, name="ampci-pool-warm-up").start()


def _start_all(slots: list[_Slot]) -> None:
    for slot in slots:  # the first start waits for the preloading server
        try:
            slot.ensure_started()
        except Exception:  # noqa: BLE001 - run() starts it again, and reports, when a job needs it
            pass


def _take_warm(most: int) -> list[_Slot]:
    """Up to ``most`` slots started by :func:`warm_up` (the others are stopped: no pool will want them)."""
    with _WARM_LOCK:
        taken, rest = _WARM[:most], _WARM[most:]
        _WARM.clear()
    for slot in rest:
        threading.Thread(target=slot.retire, daemon=True, name="ampci-pool-retire").start()
    return taken


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
        self._slots: list[_Slot] = []
        self._idle: list[_Slot] = []   # subprocesses of threads that ran out of jobs, kept for the next submit
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
        warm = _take_warm(max(0, want - len(self._idle)))  # started by warm_up() already, if any
        with self._lock:
            self._slots.extend(warm)
            self._idle.extend(warm)
            new = list(warm)  # (their start, if still in progress, is waited for below)
            while len(self._idle) < want:
                slot = _Slot()
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
                slot = self._idle.pop() if self._idle else _Slot()
                if slot not in self._slots:
                    self._slots.append(slot)
                t = threading.Thread(target=self._loop, args=(slot, len(self._threads)), daemon=True)
                self._threads.append(t)
                self._active += 1
                t.start()

    def _next_job(self, slot: _Slot) -> JobInfo | None:
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

    def _loop(self, slot: _Slot, index: int) -> None:
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

    def _run_one(self, slot: _Slot, job: JobInfo, worker: str) -> None:
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
            except _SlotDied:
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
