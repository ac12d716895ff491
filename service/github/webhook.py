"""The webhook's decision procedure, independent of the web framework.

:meth:`WebhookProcessor.handle` takes the raw headers and body of one delivery and returns the
HTTP status and JSON body to answer with.  It verifies, validates and records; it never creates a
run, touches the broker, runs a job or calls GitHub on the request path.

Order of checks (each one stops the procedure):

1. body larger than ``webhook_max_body_bytes`` (25 MiB: GitHub's cap; declared or streamed; it is not
   read further): 401 without a well-formed signature header, else 413; nothing stored either way (a
   body that was not read cannot be verified, and unverified requests never write a row)
2. signature missing or wrong                    → 401, nothing stored or queued
3. ``X-GitHub-Delivery``/``X-GitHub-Event`` bad  → 400 (recorded when the delivery id is usable)
4. malformed JSON (also: not UTF-8, nested deeper than 64) / missing fields / bad sha / a value
   that could not be stored (control characters in a ref, a name longer than its column, a
   timestamp outside 1970–2100) → 400, recorded ``rejected`` with the reason (see
   :mod:`service.github.sanitize`: nothing answered 202 can fail later for its content)
5. repository not on the allowlist               → 403, recorded ``rejected``
6. ping → 200; ignored events/branches/actions   → 202, recorded ``accepted`` with the reason (an
   ``issue_comment`` other than an approval is ignored: :mod:`service.github.approval`); an
   ``installation`` or ``installation_repositories`` event → 202, recorded ``accepted``, and the
   reporter stops (or resumes) reporting to it (:mod:`service.github.installations`); a run request
   naming a deleted or suspended installation → 403, recorded ``rejected``, one log line
7. run request → the delivery is recorded ``pending`` with its validated, compact payload in one
   database statement (deduplicated on the delivery id) → 202 ``queued``.  The intake
   (:mod:`service.github.intake`) then creates the revisions and the run (dedup key
   ``github:<delivery>``), dispatches its jobs, queues the ``pending`` commit status and marks
   the delivery ``accepted`` with the run id (``GET /api/deliveries/<id>`` shows it).  An untrusted
   pull request's run is stored awaiting approval (no job), or not at all under
   ``AMPCI_FORK_POLICY=never`` (answer ``"approval": "required"``/``"refused"``); an approval (the label
   ampci:run, a ``/ampci run`` comment) is stored the same way and starts the approved run in the intake.  A database
   that is down is a 503 and nothing is recorded (GitHub shows the delivery as failed; redeliver).

A delivery of a change already delivered -- a signed body replayed under a new delivery id (GitHub
does not sign ``X-GitHub-Delivery``), GitHub's "redeliver", or the same change serialised anew (keys
reordered, a pull request's ``updated_at`` moved) -- is stored like any delivery, but the intake finds
its run by the change it names (the run's dedup key ``github-change:<sha256>`` of (repository, ref,
before, after) for a push, (repository, number, head sha, action class) for a pull request:
:func:`service.github.stored.change_key`), so it leads to the run the first copy made, never a second one.

A delivery id already recorded ``pending`` or ``accepted`` is answered 200 ``duplicate`` (with
its run id once known) and does nothing more; a ``rejected`` one is processed again (GitHub's
"redeliver").  Each outcome is one atomic statement, so of concurrent copies exactly one is
stored.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol
from urllib.parse import parse_qs

from service.github.approval import Approval, Approved
from service.github.events import (
    Ignored,
    PayloadError,
    Ping,
    RepositoryNotAllowedError,
    RunRequest,
    parse_event,
)
from service.github.installations import InstallationChange
from service.github.intake_ports import ConnT, DeliveryQueue
from service.github.signature import verify_signature
from service.json_types import JsonObject
from service.settings import Settings

if TYPE_CHECKING:
    from service.db.deliveries import DeliveryWrite, Received
    from service.db.records import DeliveryInfo
    from service.github.recorder import DeliveryRecorder
    from service.github.reporter import StatusReporter

log = logging.getLogger(__name__)

DELIVERY_RE = re.compile(r"^[A-Za-z0-9._:-]{1,100}$")
EVENT_RE = re.compile(r"^[a-z_]{1,50}$")
SIGNATURE_RE = re.compile(r"^sha256=[0-9a-fA-F]{64}$")


@dataclass(frozen=True)
class Submitted:
    """What :class:`RunSubmitter` did: the run id, False when the dedup key already existed, how
    many job messages were sent, and whether the run awaits approval (stored without jobs)."""

    run_id: int
    created: bool
    dispatched: int = 0
    awaiting: bool = False


class RunSubmitter(Protocol):
    """Stores the revisions and the runs for requests, then dispatches their jobs (never runs them inline).

    Must be idempotent on ``dedup_key``: when a run with that key exists it is returned with
    ``created=False`` and nothing is dispatched, unless ``redispatch`` is True (then only the
    jobs that never started are sent: a retried delivery whose first dispatch did not finish).
    """

    def submit(self, request: RunRequest, dedup_key: str, redispatch: bool = False) -> Submitted: ...

    def submit_many(self, items: Sequence[tuple[RunRequest, str]],
                    redispatch: bool = True) -> list[Submitted | BaseException]: ...

    def approve(self, approval: Approval, delivery: str) -> Approved:
        """Start the run ``approval`` approves (:mod:`service.github.approval`); idempotent per run."""
        ...

    def approval_head(self, approval: Approval) -> tuple[int, str] | None:
        """(run id, head sha) of the run ``approval`` concerns; None when it concerns none."""
        ...


class DeliveryLog(Protocol):
    """The ``webhook_deliveries`` part of :class:`service.db.Store` (see :mod:`service.db.deliveries`)."""

    def receive_deliveries(self, writes: Sequence[DeliveryWrite]) -> list[Received]: ...

    def get_delivery(self, delivery_id: str) -> DeliveryInfo | None: ...


class DeliveryStore(DeliveryLog, DeliveryQueue[ConnT], Protocol[ConnT]):
    """What :class:`WebhookProcessor` is given (:class:`service.db.Store`): the log it records deliveries in,
    and the queue its default intake claims them from (``ConnT``: the store's transaction connection)."""


class Intake(Protocol):
    """What the webhook and the app ask of the intake (:class:`~service.github.intake.WebhookIntake`)."""

    def notify(self) -> None: ...

    def start(self, warm_up: bool = True) -> None: ...

    def stop(self, timeout: float = 10.0) -> None: ...

    def drain(self, max_batches: int = 1000) -> int: ...

    @property
    def running(self) -> bool: ...


@dataclass
class Outcome:
    """The HTTP answer for one delivery."""

    status_code: int
    body: JsonObject = field(default_factory=dict)


def _err(code: int, error: str, message: str, **extra: object) -> Outcome:
    return Outcome(code, {"error": error, "message": message[:500], **extra})


@dataclass(frozen=True)
class Plan:
    """What :meth:`WebhookProcessor.plan` decided: the answer, the row to record (None: record
    nothing), whether an id already recorded makes it a ``duplicate`` answer, and whether a
    stored row wakes the intake."""

    outcome: Outcome
    write: DeliveryWrite | None = None
    duplicate_if_known: bool = False
    wakes_intake: bool = False


def _write(delivery: str, event: str, status: str, reason: str, repository: str | None = None) -> DeliveryWrite:
    from service.db.deliveries import DeliveryWrite

    return DeliveryWrite(delivery, event, status, reason=reason[:500], repository=repository)


class WebhookProcessor:
    """Handles GitHub deliveries (thread-safe; one per process).

    Refuses to exist without a webhook secret unless ``AMPCI_INSECURE_DEV`` is set
    (``ConfigError`` from :func:`check_webhook_config`).  ``intake`` turns the pending deliveries
    into runs (default: a :class:`~service.github.intake.WebhookIntake` over ``deliveries``,
    ``submitter`` and ``reporter``; its background thread is started by the app's lifespan, or
    call ``intake.drain()``).
    """

    def __init__(self, settings: Settings, deliveries: DeliveryStore[ConnT], submitter: RunSubmitter,
                 reporter: StatusReporter | None = None, intake: Intake | None = None) -> None:
        check_webhook_config(settings)
        self.settings = settings
        self.deliveries: DeliveryLog = deliveries
        self.submitter = submitter
        self.reporter = reporter
        if intake is None:
            from service.github.intake import WebhookIntake
            from service.github.permissions import ApproverCheck

            intake = WebhookIntake(deliveries, submitter, reporter,
                                   approvers=ApproverCheck(settings, reporter.client if reporter is not None else None))
        self.intake: Intake = intake

    def handle(self, headers: Mapping[str, str], body: bytes | None, too_large: bool = False) -> Outcome:
        """Decide and act on one delivery; see the module docstring for the guarantees."""
        plan = self.plan(headers, body, too_large)
        if plan.write is None:
            return plan.outcome
        return self._conclude(plan, self.deliveries.receive_deliveries([plan.write])[0])

    async def handle_async(self, headers: Mapping[str, str], body: bytes | None, too_large: bool = False,
                           recorder: DeliveryRecorder | None = None, signed: bool | None = None) -> Outcome:
        """:meth:`handle` for an event loop: the decision runs inline (in a worker thread for bodies
        over 64 KiB), the one write goes through ``recorder`` (a
        :class:`~service.github.recorder.DeliveryRecorder`: group commit with concurrent requests).
        ``signed``: whether the signature matched, when the caller fed the body into the HMAC as it
        arrived (:class:`~service.github.signature.SignatureStream`); None to check it here."""
        if body is not None and len(body) > 65536:
            from starlette.concurrency import run_in_threadpool

            plan = await run_in_threadpool(self.plan, headers, body, too_large, signed)
        else:
            plan = self.plan(headers, body, too_large, signed)
        if plan.write is None:
            return plan.outcome
        if recorder is None:
            from starlette.concurrency import run_in_threadpool

            got = (await run_in_threadpool(self.deliveries.receive_deliveries, [plan.write]))[0]
        else:
            got = await recorder.receive(plan.write)
        return self._conclude(plan, got)

    def plan(self, headers: Mapping[str, str], body: bytes | None, too_large: bool = False,
             signed: bool | None = None) -> Plan:
        """The decision for one delivery without touching the database: the row to record (if
        any) and the answer (see the module docstring for the order of checks).  ``signed``: the
        signature check already made over the streamed body (None: made here)."""
        delivery = (headers.get("x-github-delivery") or "").strip()
        event = (headers.get("x-github-event") or "").strip()
        usable_id = bool(DELIVERY_RE.match(delivery))
        if too_large or body is None:
            # the body was not read, so its signature cannot be checked: nothing is stored for it
            if not self.signature_present(headers):
                return Plan(_err(401, "unauthorized", "missing or invalid X-Hub-Signature-256"))
            return Plan(_err(413, "too_large", f"body larger than {self.settings.webhook_max_body_bytes} bytes "
                                               "(not read, nothing stored)"))
        if not (self._signature_ok(headers, body) if signed is None else signed):
            return Plan(_err(401, "unauthorized", "missing or invalid X-Hub-Signature-256"))
        if not usable_id:
            return Plan(_err(400, "bad_request", "missing or malformed X-GitHub-Delivery header"))
        if not EVENT_RE.match(event):
            reason = "missing or malformed X-GitHub-Event header"
            return Plan(_err(400, "bad_request", reason), _write(delivery, "unknown", "rejected", reason))
        try:
            decision = parse_event(event, _json_body(headers, body), self.settings)
        except RepositoryNotAllowedError as exc:
            return Plan(_err(403, "forbidden", str(exc)), _write(delivery, event, "rejected", str(exc)))
        except PayloadError as exc:
            return Plan(_err(400, "bad_request", str(exc)), _write(delivery, event, "rejected", str(exc)))
        if isinstance(decision, Ping):
            return Plan(Outcome(200, {"status": "pong", "zen": decision.zen}),
                        _write(delivery, event, "accepted", "ping", decision.repo), duplicate_if_known=True)
        if isinstance(decision, InstallationChange):
            if self.reporter is not None:
                self.reporter.installations.apply(decision)
            return Plan(Outcome(202, {"status": "installation", "reason": decision.reason}),
                        _write(delivery, event, "accepted", decision.reason), duplicate_if_known=True)
        gone = self.reporter.installations.gone(decision.installation) \
            if self.reporter is not None and isinstance(decision, RunRequest) else None
        if gone is not None and isinstance(decision, RunRequest):
            reason = f"installation {decision.installation} {gone}: its deliveries are refused"
            log.warning("webhook %s refused: %s", delivery, reason)
            return Plan(_err(403, "forbidden", reason), _write(delivery, event, "rejected", reason))
        if isinstance(decision, Ignored):
            return Plan(Outcome(202, {"status": "ignored", "reason": decision.reason}),
                        _write(delivery, event, "accepted", f"ignored: {decision.reason}"), duplicate_if_known=True)
        from service.db.deliveries import DeliveryWrite

        body_sha256 = hashlib.sha256(body).hexdigest()  # replay key (intake)
        if isinstance(decision, Approval):
            approval = replace(decision, body_sha256=body_sha256)
            write = DeliveryWrite(delivery, event, "pending", reason=f"approval by {approval.via} of "
                                  f"PR #{approval.pr_number}", repository=approval.repo, payload=approval.to_payload())
            return Plan(Outcome(202, {"status": "queued", "delivery": delivery, "approval": approval.via,
                                      "pr": approval.pr_number, "sha": approval.head_sha}),
                        write, duplicate_if_known=True, wakes_intake=True)
        request = replace(decision, body_sha256=body_sha256)
        write = DeliveryWrite(delivery, event, "pending", reason=f"{request.trigger} {request.branch}"[:300],
                              repository=request.repo, payload=request.to_payload())
        answer = {"status": "queued", "delivery": delivery, "sha": request.head_sha, "trigger": request.trigger,
                  "baseline": request.baseline_sha}
        if request.approval != "trusted":  # awaiting approval (stored without jobs), or not run at all
            answer["approval"] = request.approval
        return Plan(Outcome(202, answer), write, duplicate_if_known=True, wakes_intake=True)

    def _conclude(self, plan: Plan, got: Received) -> Outcome:
        """The answer once ``plan.write`` was recorded (``got``: a Received).  A rejection is
        answered as decided even when the id was already recorded (the row stays as it was).  A
        write the database refused for its content was recorded ``rejected`` instead: 400."""
        if got.rejected:
            return _err(400, "bad_request", got.rejected)
        if not got.stored and plan.duplicate_if_known:
            existing = got.existing
            return Outcome(200, {"status": "duplicate", "delivery": plan.write.delivery_id if plan.write else None,
                                 "run_id": existing.run_id if existing is not None else None})
        if plan.wakes_intake:
            self.intake.notify()
        return plan.outcome

    def signature_present(self, headers: Mapping[str, str]) -> bool:
        """True when the request carries a well-formed ``sha256=<64 hex>`` signature header (or no
        secret is configured, in development): only then can a body too large to read be answered
        413 rather than 401.  Nothing is stored either way."""
        if not self.settings.webhook_secret:
            return self.settings.insecure_dev
        return bool(SIGNATURE_RE.match(headers.get("x-hub-signature-256") or ""))

    def _signature_ok(self, headers: Mapping[str, str], body: bytes) -> bool:
        if not self.settings.webhook_secret:
            return self.settings.insecure_dev
        return verify_signature(self.settings.webhook_secret, body, headers.get("x-hub-signature-256"))


def _json_body(headers: Mapping[str, str], body: bytes) -> bytes:
    """The JSON document of a delivery: the body itself, or the ``payload`` field when the hook is
    configured with content type ``application/x-www-form-urlencoded`` (signed over the raw body)."""
    ctype = (headers.get("content-type") or "").split(";")[0].strip().lower()
    if ctype != "application/x-www-form-urlencoded":
        return body
    try:
        fields = parse_qs(body.decode("utf-8"), strict_parsing=True, max_num_fields=10)
    except (UnicodeDecodeError, ValueError) as exc:
        raise PayloadError(f"malformed form body: {exc}"[:200]) from None
    if len(fields.get("payload", [])) != 1:
        raise PayloadError("malformed form body: expected exactly one 'payload' field")
    return fields["payload"][0].encode("utf-8")


def check_webhook_config(settings: Settings) -> None:
    """Raise ConfigError when the webhook would run without a secret outside development."""
    from service.errors import ConfigError

    if not settings.webhook_secret and not settings.insecure_dev:
        raise ConfigError("AMPCI_WEBHOOK_SECRET is required for the webhook "
                          "(set AMPCI_INSECURE_DEV=1 to run without one in development)")
