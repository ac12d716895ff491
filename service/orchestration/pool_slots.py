"""The embedded local pool's worker subprocesses: one :class:`Slot` each, and the warm-up that starts them early.

A slot's subprocess is forked from multiprocessing's fork server (its job code's heavy dependencies preloaded once,
:data:`JOB_PRELOAD`; the server itself forked from the pool's sandbox template where there is one,
:mod:`service.orchestration.pool_template`) or spawned; it inherits none of this process's threads and sockets.
It runs requested cells one at a time (:func:`slot_main`) and stops its zygotes and fork server by pid when it
ends.  :func:`stop_idle_forkserver` stops multiprocessing's fork server by pid at exit once no slot is up.  This
module imports only the standard library and :mod:`service.orchestration.pool_template` at its top: a worker
subprocess unpickles :func:`slot_main` from here and pays for nothing else.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
import socket
import threading
from typing import TYPE_CHECKING, TypeAlias

from service.orchestration import pool_template

if TYPE_CHECKING:  # annotations only: a worker subprocess imports none of these for this module
    from multiprocessing.connection import Connection
    from multiprocessing.context import ForkServerContext, SpawnContext
    from multiprocessing.process import BaseProcess

    from service.json_types import JsonObject
    from workers.revision.config import WorkerConfig

    #: One job for a worker subprocess: (cell, revision, the worker config, the job's options).
    Request: TypeAlias = tuple[tuple[str, str, str, str], str, WorkerConfig, JsonObject]
    #: The pool's end of a worker's pipe: sends requests (None: stop), receives a result's JSON.
    PoolEnd: TypeAlias = Connection[Request | None, str]
    #: The worker subprocess's end of its pipe.
    WorkerEnd: TypeAlias = Connection[str, Request | None]


def slot_main(conn: WorkerEnd, template: socket.socket | None = None,
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
    """The request loop of :func:`slot_main` (after its fork server started)."""
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


class SlotDied(Exception):
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


#: Worker subprocesses of this process that are started and not yet stopped (guarded by SERVER_LOCK):
#: at exit, multiprocessing's fork server is stopped by pid when none is (:func:`stop_idle_forkserver`).
LIVE: set[object] = set()
SERVER_LOCK = threading.Lock()


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
    if not SERVER_LOCK.acquire(blocking=False):  # a worker is being started (its server may be preloading)
        return False
    try:
        with WARM_LOCK:
            if LIVE or WARM:
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
        SERVER_LOCK.release()
    return True


class Slot:
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
        with SERVER_LOCK:  # never while stop_idle_forkserver() stops the server it is forked from
            conn, child = ctx.Pipe()
            template = pool_template.template_connection()
            proc = ctx.Process(target=slot_main, args=(child, template, dict(os.environ)), daemon=True,
                               name="ampci-local-worker")
            try:
                proc.start()
            finally:
                if template is not None:
                    template.close()  # the worker has its own copy now
            LIVE.add(proc)
        child.close()
        with self._lock:  # both at once, only once it has a pid
            self.proc, self.conn, self._asked = proc, conn, False

    def ensure_started(self) -> None:
        """Start the subprocess unless it is running (thread-safe: a prestart and a job may race)."""
        with self._start_lock:
            if self._retired:
                raise SlotDied()
            if self.proc is None or not self.proc.is_alive():
                self.stop(kill=True)  # one that died: reaped, its pipe closed, before its successor starts
                self._start()

    def retire(self) -> None:
        """Stop the subprocess (once a start in progress is done) and never start it again."""
        with self._start_lock:
            self._retired = True
        self.stop(kill=True)

    def run(self, request: Request, timeout: float) -> str | None:
        """Result JSON, or None on timeout (the subprocess is killed); SlotDied if it died (or was stopped
        meanwhile by another thread)."""
        self.ensure_started()
        conn = self.conn
        if conn is None:  # stopped by another thread since (a pool's shutdown)
            raise SlotDied()
        try:
            conn.send(request)
            if conn.poll(timeout):
                return str(conn.recv())
        except (EOFError, OSError):  # OSError: BrokenPipeError, or the pipe closed by a concurrent stop()
            self.stop(kill=True)
            raise SlotDied() from None
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
            with SERVER_LOCK:
                LIVE.discard(proc)


#: Worker subprocesses started by :func:`warm_up`, idle, for the next :class:`LocalPool` of this process.
WARM: list[Slot] = []
WARM_LOCK = threading.Lock()
atexit.register(stop_idle_forkserver)


def warm_up(workers: int | None = None) -> None:
    """Start ``workers`` (default: CPU count) local worker subprocesses now, in the background, for the
    next :class:`LocalPool` of this process to take (:meth:`LocalPool.prestart` adopts them).

    Meant for the very start of a command that will run jobs here (``ampci sweep`` without a broker):
    the fork server's preload (numpy, onnx, onnx_ir) and each worker's job code import run on the other
    cores while the command imports its own layers and stores the run, instead of after it.  Costs the
    caller a thread and a few ms; a worker that no pool takes dies with this process (daemonic)."""
    want = max(1, workers or os.cpu_count() or 1)
    with WARM_LOCK:
        new = [Slot() for _ in range(max(0, want - len(WARM)))]
        WARM.extend(new)
    if new:
        threading.Thread(target=_start_all, args=(new,), daemon=True, name="ampci-pool-warm-up").start()


def _start_all(slots: list[Slot]) -> None:
    for slot in slots:  # the first start waits for the preloading server
        try:
            slot.ensure_started()
        except Exception:  # noqa: BLE001 - run() starts it again, and reports, when a job needs it
            pass


def take_warm(most: int) -> list[Slot]:
    """Up to ``most`` slots started by :func:`warm_up` (the others are stopped: no pool will want them)."""
    with WARM_LOCK:
        taken, rest = WARM[:most], WARM[most:]
        WARM.clear()
    for slot in rest:
        threading.Thread(target=slot.retire, daemon=True, name="ampci-pool-retire").start()
    return taken
