"""The webhook intake: turns ``pending`` deliveries into runs, in batches, off the request path.

The webhook handler (:mod:`service.github.webhook`) only verifies, validates and stores a
run-requesting delivery as ``pending`` with its compact payload, then answers 202.  A
:class:`WebhookIntake` — a background thread started with the app's lifespan — claims pending
deliveries oldest first, creates their revisions, runs and job rows in one transaction
(:meth:`service.api.dispatch.RunDispatcher.submit_many`), dispatches their jobs, queues the
``pending`` commit status, and marks them ``accepted`` with the run id.  An untrusted pull request's
run is stored awaiting approval (its status says so) or, under ``AMPCI_FORK_POLICY=never``, not stored
(an ``error`` status says so); an approval starts the run it approves (:mod:`service.github.approval`).

Guarantees:

* **nothing is lost**: a delivery stays ``pending`` until its run exists and its jobs were handed
  to the broker; a crash, a database or broker outage just leaves it for the next attempt (this
  process retries with backoff; on start-up the intake picks up what an earlier process left).
* **exactly one run per change**: the run's dedup key ``github-change:<sha256>`` of the change the
  delivery names (a push's repository, ref, before and after; a pull request's repository, number,
  head sha and action class), ``github-body:<sha256 of the raw body>`` for rows stored before
  change keys and for label approvals, ``github:<delivery>`` for rows stored without either, makes
  creation atomic; a retry finds the run and sends only the jobs that never started, and another
  delivery of the same change (a replay, a redelivery, a re-serialised copy) is accepted with the
  existing run (no status re-posted).  There is no time window: the same change is one run at any age.
* **one worker per delivery**: on PostgreSQL a batch holds its deliveries ``FOR UPDATE SKIP
  LOCKED`` until they are settled, so several API processes share the work without overlap; on
  SQLite (the single-process embedded mode) one lock per process serialises batches.
* **nothing retried forever**: a delivery that can never become a run (unreadable payload,
  unknown sweep, a value the database refuses: :data:`service.db.deliveries.CONTENT_ERRORS`) is
  marked ``rejected`` with the reason at once; an unexpected error (a bug) is retried at most
  ``max_attempts`` times, then the delivery is marked ``failed`` with the reason.  Only
  infrastructure failures (database or broker unreachable: :func:`is_infrastructure`) are
  retried without bound, with backoff, since they heal.  Attempts are counted per process.
* **requests first**: while deliveries keep arriving (one less than ``idle_s`` ago) the intake
  waits, but at most ``max_delay_s``, then takes a small batch (``busy_batch_size``), so a burst
  is answered at full speed and still makes progress; when quiet it takes ``batch_size``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic

from service.errors import UserError
from service.github.approval import Approval
from service.github.events import PayloadError, RunRequest, stored_request
from service.github.intake_ports import ConnT, DeliveryQueue, StatusQueue, SubmittedRun, Submitter
from service.github.permissions import ApproverCheck, PermissionUnknownError

if TYPE_CHECKING:
    from service.db.deliveries import PendingDelivery, Settlement

log = logging.getLogger(__name__)

#: The commit status of a run whose approval waits because GitHub could not be asked for the approver's permission.
UNCHECKED_DESCRIPTION = "approval received; waiting: GitHub did not answer whether its author has write access"
_INFRA_MODULES = ("kombu", "redis", "amqp", "celery", "socket", "ssl")


def is_infrastructure(exc: BaseException) -> bool:
    """True for failures of the database or broker connection (they heal; retried without bound):
    OS/connection errors, the database being unreachable (:func:`service.db.errors.is_database_down`),
    and errors of the broker and driver libraries that are not about a value."""
    from service.db.errors import is_database_down

    if isinstance(exc, OSError | TimeoutError) or is_database_down(exc):
        return True
    return type(exc).__module__.split(".")[0] in _INFRA_MODULES


def is_permanent(exc: BaseException) -> bool:
    """True when retrying the same delivery cannot help: a user error or a value the database refuses."""
    from service.db.deliveries import CONTENT_ERRORS

    return isinstance(exc, (UserError, *CONTENT_ERRORS))


@dataclass(frozen=True)
class BatchOutcome:
    """What one :meth:`WebhookIntake.process_batch` did: deliveries claimed, accepted, rejected and
    left pending for a retry."""

    claimed: int = 0
    accepted: int = 0
    rejected: int = 0   # rejected or failed
    retry: int = 0


class WebhookIntake(Generic[ConnT]):
    """Processes pending webhook deliveries (see the module docstring); thread-safe, one per app.

    ``store`` is a :class:`service.db.Store`; ``submitter`` has ``submit_many`` like
    :class:`service.api.dispatch.RunDispatcher`; ``reporter`` (optional) gets ``queued(run_id,
    repo, sha)`` for every accepted delivery.  ``approvers`` decides who may approve
    (:mod:`service.github.permissions`); without one no approval starts anything.
    """

    def __init__(self, store: DeliveryQueue[ConnT], submitter: Submitter, reporter: StatusQueue | None = None, *,
                 approvers: ApproverCheck | None = None, batch_size: int = 50,
                 busy_batch_size: int = 4, idle_s: float = 0.25, max_delay_s: float = 2.0,
                 poll_s: float = 2.0, retry_base_s: float = 1.0, retry_cap_s: float = 60.0,
                 max_attempts: int = 5) -> None:
        self.store = store
        self.submitter = submitter
        self.reporter = reporter
        self.batch_size = batch_size
        self.busy_batch_size = busy_batch_size
        self.idle_s = idle_s
        self.max_delay_s = max_delay_s
        self.poll_s = poll_s
        self.retry_base_s = retry_base_s
        self.retry_cap_s = retry_cap_s
        self.max_attempts = max_attempts
        self.approvers = approvers
        self._unchecked: set[str] = set()  # approvals whose "could not be checked" status was queued
        self._attempts: dict[str, int] = {}  # failed attempts of deliveries not settled yet (this process)
        self._batch_lock = threading.Lock()
        self._work = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_notify = 0.0
        self._retry: dict[str, tuple[float, float]] = {}  # delivery -> (not before, last delay)

    # -- called by the webhook handler --------------------------------------------------------
    def notify(self) -> None:
        """A pending delivery was stored: wake the intake (cheap; never blocks)."""
        self._last_notify = time.monotonic()
        self._work.set()

    # -- processing ---------------------------------------------------------------------------
    def process_batch(self, limit: int | None = None) -> BatchOutcome:
        """Claim up to ``limit`` pending deliveries and settle them; see the module docstring.

        Raises only when the database fails for the batch as a whole (everything stays pending).
        """
        limit = limit or self.batch_size
        with self._batch_lock:
            now = time.monotonic()
            if len(self._retry) > 1000:  # forget backoffs long due (settled elsewhere, or retried anyway)
                self._retry = {d: v for d, v in self._retry.items() if v[0] > now - 3600}
                self._attempts = {d: n for d, n in self._attempts.items() if d in self._retry}
            skip = [d for d, (due, _) in self._retry.items() if due > now]
            if self._holds_row_locks():
                with self.store.transaction() as claim:
                    pending = self.store.pending_deliveries(claim, limit, skip)
                    settlements, outcome = self._work_on(pending)
                    self.store.settle_deliveries(claim, settlements)
                return outcome
            with self.store.transaction() as conn:
                pending = self.store.pending_deliveries(conn, limit, skip)
            settlements, outcome = self._work_on(pending)
            if settlements:
                with self.store.transaction() as conn:
                    self.store.settle_deliveries(conn, settlements)
            return outcome

    def drain(self, max_batches: int = 1000) -> int:
        """Process batches until no pending delivery is left that is not backing off; return how
        many were settled (accepted or rejected).  Safe while the background thread runs."""
        settled = 0
        for _ in range(max_batches):
            out = self.process_batch()
            settled += out.accepted + out.rejected
            if out.claimed == 0 or out.accepted + out.rejected == 0:
                break
        return settled

    def _holds_row_locks(self) -> bool:
        return self.store.claims_hold_row_locks()

    def _work_on(self, pending: list[PendingDelivery]) -> tuple[list[Settlement], BatchOutcome]:
        """Settle ``pending`` in order: runs are submitted together, up to each approval, which then
        sees the runs of the deliveries before it (:mod:`service.github.approval`)."""
        from service.db.deliveries import Settlement

        settlements: list[Settlement] = []
        retry = 0
        items: list[tuple[str, RunRequest]] = []

        def flush() -> None:
            nonlocal retry
            done, again = self._settle_runs(items)
            settlements.extend(done)
            retry += again
            items.clear()

        for p in pending:
            try:
                request = stored_request(p.payload)
            except PayloadError as exc:
                settlements.append(Settlement(p.delivery_id, "rejected", reason=str(exc)[:300]))
                continue
            if isinstance(request, Approval):
                flush()
                settlement = self._approve(p.delivery_id, request)
                if settlement is None:
                    retry += 1
                else:
                    settlements.append(settlement)
            elif request.approval == "refused":
                settlements.append(self._refuse(p.delivery_id, request))
            else:
                items.append((p.delivery_id, request))
        flush()
        accepted = sum(s.status == "accepted" for s in settlements)
        return settlements, BatchOutcome(len(pending), accepted, len(settlements) - accepted, retry)

    def _settle_runs(self, items: list[tuple[str, RunRequest]]) -> tuple[list[Settlement], int]:
        """Submit run requests; (their settlements, how many are left pending for a retry)."""
        from service.db.deliveries import Settlement

        settlements: list[Settlement] = []
        results, replays = self._submit(items)
        retry = 0
        for (delivery, request), result in zip(items, results, strict=True):
            if isinstance(result, BaseException):
                settlement = self._failure(delivery, result)
                if settlement is None:
                    retry += 1
                else:
                    settlements.append(settlement)
            else:
                self._forget(delivery)
                reason = f"{request.trigger} {request.branch}" + (
                    f": awaiting approval ({request.untrusted})" if result.awaiting else "") + (
                    " (replay: same change as an earlier delivery; its run)" if delivery in replays else "")
                settlements.append(Settlement(delivery, "accepted", run_id=result.run_id, reason=reason[:300]))
                # a replay sends nothing and must not reset the status of its (maybe finished) run
                if self.reporter is not None and delivery not in replays:
                    if result.awaiting:
                        self.reporter.awaiting(result.run_id, request.repo, request.head_sha,
                                               installation=request.installation)
                    else:
                        self.reporter.queued(result.run_id, request.repo, request.head_sha,
                                             installation=request.installation)
        return settlements, retry

    def _approve(self, delivery: str, approval: Approval) -> Settlement | None:
        """Settle an approval (``submitter.approve``) when its author may approve (asked of GitHub:
        :mod:`service.github.permissions`); None to retry it later (GitHub could not be asked: the run
        keeps waiting, and its status says why, once per delivery)."""
        from service.db.deliveries import Settlement

        what = f"PR #{approval.pr_number} ({approval.via} by {approval.by or 'unknown'})"
        try:
            if self.approvers is None:
                allowed, why = False, "no approver check configured"
            else:
                verdict = self.approvers.check(approval.repo, approval.by, approval.installation)
                allowed, why = verdict.allowed, verdict.why
        except PermissionUnknownError as exc:
            self._say_unchecked(delivery, approval)
            self._back_off(delivery, exc)
            return None
        except Exception as exc:  # noqa: BLE001 - settled or retried as a run request's failure is
            return self._failure(delivery, exc)
        if not allowed:
            self._forget(delivery)
            log.info("%s not approved: %s", what, why)
            return Settlement(delivery, "accepted", reason=f"{what}: not approved: {why}"[:300])
        try:
            got = self.submitter.approve(approval, delivery)
        except Exception as exc:  # noqa: BLE001 - settled or retried as a run request's failure is
            return self._failure(delivery, exc)
        self._forget(delivery)
        if got.started and self.reporter is not None and got.run_id is not None and got.sha is not None:
            self.reporter.queued(got.run_id, approval.repo, got.sha)
        return Settlement(delivery, "accepted", run_id=got.run_id, reason=got.reason[:300])

    def _say_unchecked(self, delivery: str, approval: Approval) -> None:
        """Queue, once per delivery, the ``pending`` status of the run ``approval`` concerns saying that the
        approver's permission could not be asked of GitHub yet (best effort: a failure is logged)."""
        if self.reporter is None or delivery in self._unchecked:
            return
        try:
            head = self.submitter.approval_head(approval)
        except Exception as exc:  # noqa: BLE001 - the status is a courtesy; the approval is retried anyway
            log.warning("approval %s: its run not found for the status: %s", delivery, type(exc).__name__)
            return
        if head is None:
            return
        if len(self._unchecked) > 1000:
            self._unchecked.clear()
        self._unchecked.add(delivery)
        self.reporter.awaiting(head[0], approval.repo, head[1], installation=approval.installation,
                               description=UNCHECKED_DESCRIPTION)

    def _refuse(self, delivery: str, request: RunRequest) -> Settlement:
        """Settle an untrusted pull request under ``AMPCI_FORK_POLICY=never``: no run, an ``error`` status."""
        from service.db.deliveries import Settlement

        self._forget(delivery)
        if self.reporter is not None:
            self.reporter.refused(request.repo, request.head_sha)
        return Settlement(delivery, "accepted", reason=f"{request.trigger} {request.branch}: not run "
                          f"({request.untrusted}; AMPCI_FORK_POLICY=never)"[:300])

    def _submit(self, items: list[tuple[str, RunRequest]]) -> tuple[list[SubmittedRun | BaseException], set[str]]:
        """Submit the batch; (the result per item, the deliveries found to be replays).

        Runs are keyed by the change (or the body hash), so a change delivered again under a new
        delivery id (GitHub does not sign X-GitHub-Delivery) finds the run its first copy made.  A
        run that already existed is re-dispatched (its never-started jobs sent again) only for a
        retry of the delivery that made it, never for a replay: one whose run was created by another
        item of this batch or already belongs to another accepted delivery.
        """
        if not items:
            return [], set()
        pairs = [(request, request.dedup_key or f"github:{delivery}") for delivery, request in items]
        results = self._submit_pairs(pairs, redispatch=False)
        created_here = {r.run_id for r in results if not isinstance(r, BaseException) and r.created}
        # (index, run id) of the items whose run already existed
        existing = [(i, r.run_id) for i, r in enumerate(results) if not isinstance(r, BaseException) and not r.created]
        held = self._runs_of_other_deliveries([(items[i][0], run_id) for i, run_id in existing])
        owned = {existing[k][0] for k in held}
        replays = {items[i][0] for i, run_id in existing if run_id in created_here or i in owned}
        retries = [i for i, _ in existing if items[i][0] not in replays]
        if retries:
            again = self._submit_pairs([pairs[i] for i in retries], redispatch=True)
            for i, result in zip(retries, again, strict=True):
                results[i] = result
        return results, replays

    def _runs_of_other_deliveries(self, pairs: list[tuple[str, int]]) -> set[int]:
        """Indexes into ``pairs`` (delivery, run id) whose run another delivery was accepted with."""
        if not pairs:
            return set()
        holders = self.store.accepted_deliveries(run_id for _, run_id in pairs)
        return {i for i, (delivery, run_id) in enumerate(pairs) if holders.get(run_id, set()) - {delivery}}

    def _submit_pairs(self, pairs: list[tuple[RunRequest, str]], redispatch: bool) -> list[SubmittedRun | BaseException]:
        """``submit_many`` for ``pairs``; when the shared transaction fails, each pair on its own (so
        one bad delivery cannot hold the others back)."""
        try:
            return list(self.submitter.submit_many(pairs, redispatch=redispatch))
        except Exception as exc:  # noqa: BLE001 - isolate below
            if len(pairs) == 1:
                return [exc]
        out: list[SubmittedRun | BaseException] = []
        for pair in pairs:
            try:
                out.extend(self.submitter.submit_many([pair], redispatch=redispatch))
            except Exception as exc:  # noqa: BLE001 - retried later (UserError: rejected)
                out.append(exc)
        return out

    def _failure(self, delivery: str, exc: BaseException) -> Settlement | None:
        """The settlement for a delivery whose submission raised ``exc``, or None to retry it later."""
        from service.db.deliveries import Settlement, error_line

        if isinstance(exc, UserError):
            self._forget(delivery)
            return Settlement(delivery, "rejected", reason=f"not dispatched: {exc}".splitlines()[0][:300])
        if is_permanent(exc):
            self._forget(delivery)
            log.warning("webhook delivery %s rejected: %s", delivery, error_line(exc))
            return Settlement(delivery, "rejected", reason=f"cannot be stored: {error_line(exc)}")
        if not is_infrastructure(exc):
            attempts = self._attempts.get(delivery, 0) + 1
            self._attempts[delivery] = attempts
            if attempts >= self.max_attempts:
                self._forget(delivery)
                log.error("webhook delivery %s failed %d times; giving up: %s", delivery, attempts, error_line(exc))
                return Settlement(delivery, "failed", reason=f"failed after {attempts} attempts: {error_line(exc)}")
        self._back_off(delivery, exc)
        return None

    def _forget(self, delivery: str) -> None:
        self._retry.pop(delivery, None)
        self._attempts.pop(delivery, None)

    def _back_off(self, delivery: str, exc: BaseException) -> None:
        _, last = self._retry.get(delivery, (0.0, 0.0))
        delay = min(self.retry_cap_s, max(self.retry_base_s, last * 2))
        self._retry[delivery] = (time.monotonic() + delay, delay)
        log.warning("webhook delivery %s not processed yet (retry in %.0fs): %s: %s", delivery, delay,
                    type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "")

    # -- the background thread ----------------------------------------------------------------
    def start(self, warm_up: bool = True) -> None:
        """Start the background thread (idempotent); it first picks up deliveries left pending.

        ``warm_up`` first lets the submitter do its one-time work (``submitter.warm_up()``, when it
        has one: imports, broker connection) so the first batch does not stall requests.
        """
        if self._thread is not None:
            return
        if warm_up and hasattr(self.submitter, "warm_up"):
            self.submitter.warm_up()
        self._stop.clear()
        self._work.set()
        self._thread = threading.Thread(target=self._loop, name="ampci-webhook-intake", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread after its current batch; unprocessed deliveries stay pending."""
        self._stop.set()
        self._work.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def running(self) -> bool:
        """True while the background thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        delay = 0.0
        while not self._stop.is_set():
            self._work.wait(self.poll_s)  # a timeout polls: another process may have left work
            self._work.clear()
            limit = self._yield_to_requests()
            if self._stop.is_set():
                break
            try:
                out = self.process_batch(limit)
                delay = 0.0
            except Exception as exc:  # noqa: BLE001 - the intake must survive database hiccups
                delay = min(self.retry_cap_s, max(self.retry_base_s, delay * 2))
                if is_infrastructure(exc):  # an outage: one line per retry, not a traceback
                    log.warning("webhook intake batch failed; retrying in %.0fs: %s: %s", delay,
                                type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "")
                else:
                    log.exception("webhook intake batch failed; retrying in %.0fs", delay)
                self._stop.wait(delay)
                self._work.set()
                continue
            if out.claimed >= limit:
                self._work.set()  # probably more

    def _yield_to_requests(self) -> int:
        """Wait while deliveries keep arriving, at most ``max_delay_s``; the batch size to take."""
        started = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if now - self._last_notify >= self.idle_s:
                return self.batch_size
            if now - started >= self.max_delay_s:
                return self.busy_batch_size
            self._stop.wait(self.idle_s)
        return 0
