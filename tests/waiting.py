"""Waiting in tests: poll until a condition holds; the deadline is a safety net, never the assertion.

A busy machine (a full suite at load 3-6 on 2 cores, next to other work) makes everything slower,
not wrong.  A test therefore waits for the state it needs (a row, a queue length, a process
answering) and asserts on that state; how long it took is for ``bench/``.  The deadline only turns a
hang into a failure with a message, so it is generous: :data:`SAFETY_NET_S` unless a test has a
reason for another figure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: Seconds after which a wait that never came true fails: far above what a loaded machine needs.
SAFETY_NET_S = 600.0


def wait_until(probe: Callable[[], T], what: str, timeout: float = SAFETY_NET_S, every: float = 0.1,
               detail: Callable[[], object] | None = None) -> T:
    """Call ``probe`` every ``every`` seconds until it returns something truthy, and return that.

    Guarantees: ``probe`` is called at least once and once more after the deadline passed, so a
    condition that became true while the machine was stalled is still seen; after ``timeout``
    seconds an AssertionError names ``what``, the probe's last value and ``detail()`` (e.g. a
    worker's log tail).
    """
    deadline = time.monotonic() + timeout
    while True:
        expired = time.monotonic() > deadline
        last = probe()
        if last:
            return last
        if expired:
            extra = f"\n{detail()}" if detail is not None else ""
            raise AssertionError(f"still waiting after {timeout:.0f} s for {what} (last: {last!r}){extra}")
        time.sleep(every)
