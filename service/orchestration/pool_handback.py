"""The jobs a local pool holds ``running`` in the database, and the gate its clean shutdown closes.

:meth:`LocalPool.shutdown <service.orchestration.localpool.LocalPool.shutdown>` must leave no job of
its own ``running`` when it returns, whatever its job threads are doing: on a loaded machine a thread
whose subprocess was killed may not run again before the process exits.  So every database write a
job thread makes about a job goes through one :class:`JobLedger`, which

* knows the jobs the pool's threads began (``running``) and have not ended yet, and
* once :meth:`JobLedger.close` ran, lets no such write begin again (:class:`HandedBack` instead),
  after waiting for the ones in flight.

The shutdown then re-queues the jobs :meth:`JobLedger.close` returned, itself: a thread that wakes up
later writes nothing over a job that was handed back (the next process may be running it already).

Standard library only (imported where :mod:`service.orchestration.localpool` is: see its docstring).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class HandedBack(Exception):
    """A job thread's write was refused: its pool handed its jobs back (:meth:`JobLedger.close`)."""


class JobLedger:
    """The jobs a pool's threads have begun and not ended, and whether they may still write about them.

    Guarantees: after :meth:`close` returns, no write entered through :meth:`write` begins, and every
    write that had begun has ended (unless it outlasted ``timeout``); the jobs it returns are exactly
    those begun (``begins``) and not yet ended (``ends``) by a write that completed or was in flight."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._closed = False
        self._writing = 0            # writes in flight (guarded by _cond)
        self._running: set[int] = set()  # jobs begun and not ended (guarded by _cond)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        with self._cond:
            return self._closed

    @contextmanager
    def write(self, job_id: int, *, begins: bool = False, ends: bool = False) -> Iterator[None]:
        """Around one database write of a job thread about job ``job_id``: raises :class:`HandedBack`
        (before the body runs) once the ledger is closed.  ``begins``: the write may make the job
        ``running`` (it is counted running from before the write); ``ends``: the write ends the job
        here (it is no longer counted once the body returned without an exception)."""
        with self._cond:
            if self._closed:
                raise HandedBack(job_id)
            self._writing += 1
            if begins:
                self._running.add(job_id)
        ok = False
        try:
            yield
            ok = True
        finally:
            with self._cond:
                self._writing -= 1
                if ok and ends:
                    self._running.discard(job_id)
                self._cond.notify_all()

    def ended(self, job_id: int) -> None:
        """Job ``job_id`` is no longer running here (e.g. its start found it final already)."""
        with self._cond:
            self._running.discard(job_id)

    def close(self, timeout: float) -> list[int]:
        """Refuse every later write, wait up to ``timeout`` seconds for the writes in flight, and return
        the jobs begun and not ended, by id (idempotent: a second call returns them again)."""
        with self._cond:
            self._closed = True
            self._cond.wait_for(lambda: self._writing == 0, timeout)
            return sorted(self._running)
