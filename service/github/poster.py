"""Delivering what the outbox holds: :class:`OutboxPoster`, the half of the reporter that talks to GitHub.

It posts claimed items (:meth:`OutboxPoster.drain` in the calling thread; the background thread of
:meth:`OutboxPoster.start` on per-repository lanes, :mod:`service.github.lanes`) and settles each in
the outbox: landed, retried later (backoff, or GitHub's clamped delay), deferred while its credential
is rate limited (no request, no attempt counted), or dropped (a permanent error, or ``max_attempts``).
Every failure is one log line, never a traceback (:func:`log_failure` keeps tracebacks for bugs of
the reporter itself).  What to report is :class:`service.github.reporter.StatusReporter`'s business.
"""

from __future__ import annotations

import logging
import threading
import time

from service.github.client import (
    CheckRun,
    GitHubStatusClient,
    MalformedAnswerError,
    PermanentStatusError,
    RateLimitedError,
    Report,
    TransientStatusError,
    UnexpectedStatusError,
    backoff_delay,
)
from service.github.fallback import last_resort, shortened
from service.github.installations import Installations
from service.github.lanes import RateLimits, RepositoryLanes
from service.github.outbox import OutboxItem, StatusOutbox
from service.github.refusals import UNEXPECTED_ATTEMPTS

log = logging.getLogger("service.github.reporter")  # one log for the reporter and its poster


def log_failure(what: str, exc: BaseException, count: int | None = None) -> None:
    """Log a reporting failure: a database or Redis outage (:func:`service.github.intake.is_infrastructure`)
    is one WARNING line (the error's type and first line, URLs redacted, with the running ``count``);
    anything else is a bug and keeps its traceback (ERROR)."""
    from service.github.intake import is_infrastructure
    from service.settings import redact_url

    if not is_infrastructure(exc):
        log.error("%s", what, exc_info=exc)
        return
    text = str(exc).strip().splitlines()
    first = redact_url(f"{type(exc).__name__}: {text[0] if text else ''}")[:300]
    log.warning("%s: dependency unavailable%s: %s", what, f" ({count} so far)" if count is not None else "", first)


class OutboxPoster:
    """Posts the outbox's items to GitHub (module docstring); the base of the reporter.

    Guarantees: no item is posted by two lanes at once; a report of one repository never waits behind
    another repository's (lanes), nor behind a rate limit of another installation (:class:`RateLimits`);
    nothing sleeps on GitHub's behalf; an item is dropped after ``max_attempts`` failed posts."""

    def __init__(self, outbox: StatusOutbox, client: GitHubStatusClient | None, *, max_attempts: int = 12,
                 backoff_base: float = 2.0, backoff_cap: float = 600.0, lease: float = 60.0,
                 poll_interval: float = 1.0, workers: int = 4) -> None:
        self.outbox = outbox
        self.client = client
        self.max_attempts = max_attempts
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.lease = lease
        self.poll_interval = poll_interval
        self.workers = workers
        self.limits = RateLimits()
        self.installations = Installations()  # deleted/suspended installations, removed repositories
        self.outage_count = 0  # reporting failures caused by a database/Redis outage (one WARNING line each)
        self._lanes: RepositoryLanes | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _each_round(self) -> None:
        """Work of the background thread before each round of posting (the reporter's watch list)."""

    def _failed(self, what: str, exc: BaseException) -> None:
        from service.github.intake import is_infrastructure

        if is_infrastructure(exc):
            self.outage_count += 1
        log_failure(what, exc, self.outage_count if is_infrastructure(exc) else None)

    def _put(self, status: Report) -> None:
        try:
            self.outbox.put(status)
        except Exception as exc:  # noqa: BLE001 - reporting must never break the caller (the run is stored)
            self._failed(f"could not queue commit status for {status.key}", exc)
            return
        self._wake.set()

    def drain(self, limit: int = 50) -> int:
        """Post every due status once, in this thread; return how many landed.  Safe to call from many
        processes.  (The background thread posts on per-repository lanes instead: :meth:`dispatch`.)"""
        if self.client is None:
            return 0
        posted = 0
        for item in self.outbox.claim(time.time(), limit, self.lease):
            if self._post(item):
                posted += 1
        return posted

    def dispatch(self, limit: int = 50) -> int:
        """Hand every due item to its repository's lane (:class:`~service.github.lanes.RepositoryLanes`),
        so a slow, limited or broken repository never holds back another's report; how many were handed."""
        if self.client is None or self._lanes is None:
            return 0
        return sum(self._lanes.submit(item) for item in self.outbox.claim(time.time(), limit, self.lease))

    def _post(self, item: OutboxItem) -> bool:
        """Deliver one claimed item and settle it in the outbox; True when it landed.

        A rate-limited credential is not called: the item is put back for the end of its pause without
        counting an attempt.  Every failure is one log line (no traceback): permanent ones drop the item
        at once (so is one to a deleted or suspended installation, or a repository removed from its
        installation, without a request: :mod:`service.github.installations`; one refused with 422 is replaced by its shortened form, :func:`service.github.fallback.shortened`,
        until none is left; a check run's completion then gets its minimal form once,
        :func:`service.github.fallback.last_resort`, before it is dropped with a line naming the check run left
        open), the others (outage, deadline, rate limit, malformed answer, or an unexpected error)
        count an attempt and drop it after ``max_attempts`` (an undocumented 4xx: after
        :data:`~service.github.refusals.UNEXPECTED_ATTEMPTS`; a check run's completion: after its minimal form
        had as many)."""
        assert self.client is not None
        stopped = self.installations.stopped(item.status.repo, self.client.installation_of(item.status.repo))
        if stopped is not None:  # one log line said so when the installation changed
            self.outbox.drop(item, f"not sent: {stopped}")
            return False
        scope = self.client.limit_scope(item.status.repo)
        until = self.limits.paused_until(scope)
        if until is not None:
            self.outbox.defer(item, until)
            return False
        try:
            self.client.deliver(item.status)
        except PermanentStatusError as exc:
            short = shortened(item.status) if exc.status == 422 else None
            if short is not None:
                sent = self.outbox.replace(item, short)
                log.warning("commit status %s refused, %s: %s", item.status.key,
                            "a shortened form follows" if sent else "a newer report follows", exc)
                return False
            if not self._last_resort(item, str(exc)):
                self._drop(item, str(exc), str(exc))
            return False
        except Exception as exc:  # noqa: BLE001 - transient, or an answer nobody foresaw: an attempt, one line
            self._retry_later(item, exc, self.client.limit_scope(item.status.repo))  # the installation is known now
            return False
        self.outbox.complete(item, ok=True, next_due=0.0)
        self._note_check(item.status)
        return True

    def _note_check(self, report: Report) -> None:
        """After a check run of an ampci run landed: note whether GitHub now holds it open (a stage) or not (a
        completion), for the sweep of check runs left open.  Never raises."""
        if not isinstance(report, CheckRun) or not report.external_id.isdigit():
            return
        try:
            self.outbox.mark_check(int(report.external_id), open=report.conclusion is None)
        except Exception as exc:  # noqa: BLE001 - the report landed; the sweep is a safety net
            self._failed(f"could not note check run {report.key}", exc)

    def _last_resort(self, item: OutboxItem, why: str) -> bool:
        """Before a check run's completion is dropped: put its minimal form (:func:`~service.github.fallback.
        last_resort`) in its place, once; True when it did (or a newer report took the place).  One log line."""
        last = last_resort(item.status)
        if last is None:
            return False
        sent = self.outbox.replace(item, last)
        log.warning("check run %s not completed (%s), %s", item.status.key, why,
                    "its minimal form follows" if sent else "a newer report follows")
        return True

    def _drop(self, item: OutboxItem, reason: str, line: str) -> None:
        """Drop ``item`` with one ERROR line; a check run's completion says the check run is left open."""
        if isinstance(item.status, CheckRun) and item.status.conclusion is not None:
            log.error("check run %s left open: GitHub refused every form of its completion: %s",
                      item.status.key, line)
        else:
            log.error("commit status %s dropped: %s", item.status.key, line)
        self.outbox.drop(item, reason)

    def _retry_later(self, item: OutboxItem, exc: Exception, scope: str) -> None:
        """Count a failed attempt of ``item``: reschedule it (GitHub's clamped delay, else backoff) or,
        at ``max_attempts``, drop it; one log line either way."""
        what = str(exc).splitlines()[0][:300] if str(exc) else ""
        if not isinstance(exc, TransientStatusError):
            what = f"unexpected {type(exc).__name__}: {what}"
        elif isinstance(exc, MalformedAnswerError):
            what = f"malformed answer: {what}"
        elif isinstance(exc, UnexpectedStatusError):
            what = f"unexpected answer: {what}"
        limit = min(self.max_attempts, UNEXPECTED_ATTEMPTS) if isinstance(exc, UnexpectedStatusError) \
            else self.max_attempts
        if item.attempts + 1 >= limit:
            gave_up = f"gave up after {item.attempts + 1} attempts: {what}"
            if not self._last_resort(item, gave_up):
                self._drop(item, gave_up, f"after {item.attempts + 1} attempts: {what}")
            return
        retry_after = exc.retry_after if isinstance(exc, TransientStatusError) else None
        delay = backoff_delay(item.attempts, self.backoff_base, self.backoff_cap)
        if retry_after is not None:
            delay = min(max(delay, retry_after), max(self.backoff_cap, retry_after))
        if isinstance(exc, RateLimitedError):
            self.limits.pause(scope, exc.retry_after or delay)
        log.warning("commit status %s failed (attempt %d), retry in %.1fs: %s", item.status.key,
                    item.attempts + 1, delay, what)
        self.outbox.complete(item, ok=False, next_due=time.time() + delay)

    def start(self) -> None:
        """Start the background poster thread (idempotent)."""
        if self._thread is not None or self.client is None:
            return
        self._stop.clear()
        self._lanes = RepositoryLanes(self._post, self.workers)
        self._thread = threading.Thread(target=self._loop, name="ampci-status-reporter", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the background thread; unsent statuses stay in the outbox."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self._lanes is not None:
            self._lanes.close()
            self._lanes = None

    def close(self) -> None:
        """Stop and release the HTTP client."""
        self.stop()
        if self.client is not None:
            self.client.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._each_round()
                while self.dispatch() >= 50 and not self._stop.is_set():
                    pass
            except Exception as exc:  # noqa: BLE001 - the poster must survive Redis/DB hiccups
                self._failed("commit status poster iteration failed", exc)
            self._wake.wait(self.poll_interval)
            self._wake.clear()
