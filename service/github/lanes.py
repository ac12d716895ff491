"""Per-repository delivery lanes: a report never waits behind another repository's.

The reporter claims due items from the outbox and hands them to :class:`RepositoryLanes`, which
posts them on a small pool of threads, one lane per repository: items of one repository are posted
one after another (in claim order), lanes of different repositories in parallel.  A repository
whose GitHub is slow (every call up to its deadline), limited or broken holds up only its own lane
and one thread; with ``workers`` threads, ``workers - 1`` such repositories leave the others posting.

:class:`RateLimits` remembers, per credential scope (a GitHub App installation, or a repository),
until when GitHub asked not to be called, so the items of a limited scope are put back in the
outbox without a request and nothing sleeps.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from service.github.outbox import OutboxItem

log = logging.getLogger(__name__)


def lane_of(item: OutboxItem) -> str:
    """The lane of an item: its repository, case-insensitively."""
    return item.status.repo.lower()


class RepositoryLanes:
    """Posts items with ``post`` on ``workers`` threads, serially per repository (module docstring).

    Guarantees: an item whose key is already waiting or in flight is not taken twice (a lease that
    ran out while it waited); ``post`` never runs twice at once for one repository; an exception of
    ``post`` is logged on one line and the lane goes on.  :meth:`close` does not wait for calls in
    flight (each is bounded by the client's deadline)."""

    def __init__(self, post: Callable[[OutboxItem], object], workers: int = 4) -> None:
        self._post = post
        self._lock = threading.Lock()
        self._queues: dict[str, deque[OutboxItem]] = {}
        self._keys: set[str] = set()
        self._active: set[str] = set()
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="ampci-report-lane")

    def submit(self, item: OutboxItem) -> bool:
        """Queue ``item`` on its repository's lane; False when its key is already queued or in flight."""
        lane = lane_of(item)
        with self._lock:
            if item.status.key in self._keys:
                return False
            self._keys.add(item.status.key)
            self._queues.setdefault(lane, deque()).append(item)
            if lane in self._active:
                return True
            self._active.add(lane)
        self._pool.submit(self._run, lane)
        return True

    def in_flight(self) -> int:
        """Items queued or being posted."""
        with self._lock:
            return len(self._keys)

    def _run(self, lane: str) -> None:
        while True:
            with self._lock:
                queue = self._queues.get(lane)
                if not queue:
                    self._queues.pop(lane, None)
                    self._active.discard(lane)
                    return
                item = queue.popleft()
            try:
                self._post(item)
            except Exception as exc:  # noqa: BLE001 - one line; the item's lease brings it back
                log.warning("report %s not posted: %s: %s", item.status.key, type(exc).__name__,
                            str(exc).splitlines()[0][:200] if str(exc) else "")
            finally:
                with self._lock:
                    self._keys.discard(item.status.key)

    def close(self) -> None:
        """Stop taking items; queued ones stay in the outbox (their leases run out)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


class RateLimits:
    """Until when each credential scope must not call GitHub (thread-safe; in this process)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._until: dict[str, float] = {}

    def pause(self, scope: str, seconds: float) -> float:
        """GitHub limited ``scope`` for ``seconds`` (finite, clamped by the client); the time it ends."""
        until = self._clock() + seconds
        with self._lock:
            self._until[scope] = max(until, self._until.get(scope, 0.0))
            return self._until[scope]

    def paused_until(self, scope: str) -> float | None:
        """The end of ``scope``'s pause, or None when it may call now."""
        with self._lock:
            until = self._until.get(scope)
            if until is not None and until <= self._clock():
                del self._until[scope]
                return None
            return until
