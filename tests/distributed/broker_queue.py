"""A broker played by the test: job ids a dispatcher "sent" wait in a deque, and :func:`drain` runs them the way
a worker's task would (:func:`service.orchestration.tasks.execute_job`), including the jobs that finishing them
queues (bisection midpoints)."""

from __future__ import annotations

from collections import deque

from service.db import Store
from service.orchestration import tasks
from service.settings import Settings


def drain(queue: deque[int], settings: Settings, store: Store, limit: int = 20) -> int:
    """Run queued jobs until none are left; how many ran.  Fails past ``limit`` (a bisection that does not
    converge would queue for ever)."""
    n = 0
    while queue:
        tasks.execute_job(queue.popleft(), settings, "w1", store=store)
        n += 1
        assert n <= limit, "bisection does not converge"
    return n
