"""The webhook's decision procedure, independent of the web framework.

:meth:`WebhookProcessor.handle` takes the raw headers and body of one delivery and returns the
HTTP status and JSON body to answer with.  It verifies, validates and records; it never creates a
run, touches the broker, runs a job or calls GitHub on the request path.

Order of checks (each one stops the procedure):

1. body larger than ``max_body_bytes``           → 400, delivery recorded ``rejected``
2. signature missing or wrong                    → 401, nothing stored or queued
3. ``X-GitHub-Delivery``/``X-GitHub-Event`` bad  → 400 (recorded when the delivery id is usable)
4. malformed JSON / missing fields / bad sha     → 400, recorded ``rejected`` with the reason
5. repository not on the allowlist               → 403, recorded ``rejected``
6. ping → 200; ignored events/branches/actions   → 202, recorded ``accepted`` with the reason
7. run request → the delivery is recorded ``pending`` with its validated, compact payload in one
   database statement (deduplicated on the delivery id) → 202 ``queued``.  The intake
   (:mod:`service.github.intake`) then creates the revisions and the run (dedup key
   ``github:<delivery>``), dispatches its jobs, queues the ``pending`` commit status and marks
   the delivery ``accepted`` with the run id (``GET /api/deliveries/<id>`` shows it).  A database
   that is down is a 503 and nothing is recorded (GitHub shows the delivery as failed; redeliver).

A delivery id already recorded ``pending`` or ``accepted`` is answered 200 ``duplicate`` (with
its run id once known) and does nothing more; a ``rejected`` one is processed again (GitHub's
"redeliver").  Each outcome is one atomic statement, so of concurrent copies exactly one is
stored.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qs

from service.github.events import (
    Ignored,
    PayloadError,
    Ping,
    RepositoryNotAllowedError,
    RunRequest,
    parse_event,
)
from service.github.signature import verify_signature
from service.settings import Settings

if TYPE_CHECKING:
    from service.github.intake import WebhookIntake
    from service.github.reporter import StatusReporter

log = logging.getLogger(__name__)

DELIVERY_RE = re.compile(r"^[A-Za-z0-9._:-]{1,100}$")
EVENT_RE = re.compile(r"^[a-z_]{1,50}$")


@dataclass(frozen=True)
class Submitted:
    """What :class:`RunSubmitter` did: the run id, False when the dedup key already existed, and
    how many job messages were sent."""

    run_id: int
    created: bool
    dispatched: int = 0


class RunSubmitter(Protocol):
    """Stores the revisions and the runs for requests, then dispatches their jobs (never runs them inline).

    Must be idempotent on ``dedup_key``: when a run with that key exists it is returned with
    ``created=False`` and nothing is dispatched, unless ``redispatch`` is True (then only the
    jobs that never started are sent: a retried delivery whose first dispatch did not finish).
    """

    def submit(self, request: RunRequest, dedup_key: str, redispatch: bool = False) -> Submitted: ...

    def submit_many(self, items: Sequence[tuple[RunRequest, str]],
                    redispatch: bool = True) -> list[Submitted | BaseException]: ...


class DeliveryLog(Protocol):
    """The ``webhook_deliveries`` part of :class:`service.db.Store` (see :mod:`service.db.deliveries`)."""

    def receive_delivery(self, delivery_id: str, event: str, status: str, *, reason: str | None = None,
                         repository: str | None = None, payload: dict[str, Any] | None = None,
                         run_id: int | None = None) -> Any: ...

    def get_delivery(self, delivery_id: str) -> Any: ...


@dataclass
class Outcome:
    """The HTTP answer for one delivery."""

    status_code: int
    body: dict[str, Any] = field(default_factory=dict)


def _err(code: int, error: str, message: str, **extra: Any) -> Outcome:
    return Outcome(code, {"error": error, "message": message[:500], **extra})


class WebhookProcessor:
    """Handles GitHub deliveries (thread-safe; one per process).

    Refuses to exist without a webhook secret unless ``AMPCI_INSECURE_DEV`` is set
    (``ConfigError`` from :func:`check_webhook_config`).  ``intake`` turns the pending deliveries
    into runs (default: a :class:`~service.github.intake.WebhookIntake` over ``deliveries``,
    ``submitter`` and ``reporter``; its background thread is started by the app's lifespan, or
    call ``intake.drain()``).
    """

    def __init__(self, settings: Settings, deliveries: DeliveryLog, submitter: RunSubmitter,
                 reporter: StatusReporter | None = None, intake: WebhookIntake | None = None) -> None:
        check_webhook_config(settings)
        self.settings = settings
        self.deliveries = deliveries
        self.submitter = submitter
        self.reporter = reporter
        if intake is None:
            from service.github.intake import WebhookIntake

            intake = WebhookIntake(deliveries, submitter, reporter)
        self.intake = intake

    def handle(self, headers: Mapping[str, str], body: bytes | None, too_large: bool = False) -> Outcome:
        """Decide and act on one delivery; see the module docstring for the guarantees."""
        delivery = (headers.get("x-github-delivery") or "").strip()
        event = (headers.get("x-github-event") or "").strip()
        usable_id = bool(DELIVERY_RE.match(delivery))
        if too_large or body is None:
            reason = f"body larger than {self.settings.max_body_bytes} bytes"
            if usable_id:
                self._record(delivery, event[:50] or "unknown", "rejected", reason=reason)
            return _err(400, "too_large", reason)
        if not self._signature_ok(headers, body):
            return _err(401, "unauthorized", "missing or invalid X-Hub-Signature-256")
        if not usable_id:
            return _err(400, "bad_request", "missing or malformed X-GitHub-Delivery header")
        if not EVENT_RE.match(event):
            self._record(delivery, "unknown", "rejected", reason="missing or malformed X-GitHub-Event header")
            return _err(400, "bad_request", "missing or malformed X-GitHub-Event header")
        try:
            decision = parse_event(event, _json_body(headers, body), self.settings)
        except RepositoryNotAllowedError as exc:
            return self._reject(delivery, event, 403, "forbidden", str(exc))
        except PayloadError as exc:
            return self._reject(delivery, event, 400, "bad_request", str(exc))
        if isinstance(decision, Ping):
            return self._finish(delivery, event, Outcome(200, {"status": "pong", "zen": decision.zen}), "ping")
        if isinstance(decision, Ignored):
            return self._finish(delivery, event, Outcome(202, {"status": "ignored", "reason": decision.reason}),
                                f"ignored: {decision.reason}")
        return self._accept_run(delivery, event, decision)

    def _accept_run(self, delivery: str, event: str, request: RunRequest) -> Outcome:
        got = self.deliveries.receive_delivery(delivery, event, "pending", repository=request.repo,
                                               reason=f"{request.trigger} {request.branch}"[:300],
                                               payload=request.to_payload())
        if not got.stored:
            return self._duplicate(delivery, got.existing.run_id if got.existing is not None else None)
        self.intake.notify()
        return Outcome(202, {"status": "queued", "delivery": delivery, "sha": request.head_sha,
                             "trigger": request.trigger, "baseline": request.baseline_sha})

    def _duplicate(self, delivery: str, run_id: int | None) -> Outcome:
        return Outcome(200, {"status": "duplicate", "delivery": delivery, "run_id": run_id})

    def _reject(self, delivery: str, event: str, code: int, error: str, reason: str) -> Outcome:
        self._record(delivery, event, "rejected", reason=reason)
        return _err(code, error, reason)

    def _finish(self, delivery: str, event: str, outcome: Outcome, reason: str) -> Outcome:
        """Record an accepted delivery that needs no run; a copy already recorded is a duplicate."""
        if not self._record(delivery, event, "accepted", reason=reason):
            return self._duplicate(delivery, None)
        return outcome

    def _signature_ok(self, headers: Mapping[str, str], body: bytes) -> bool:
        if not self.settings.webhook_secret:
            return self.settings.insecure_dev
        return verify_signature(self.settings.webhook_secret, body, headers.get("x-hub-signature-256"))

    def _record(self, delivery: str, event: str, status: str, *, repository: str | None = None,
                reason: str | None = None) -> bool:
        """Record a delivery's outcome in one statement; False when the id is already recorded
        ``pending``/``accepted`` (left as it is).  A ``rejected`` row is replaced (a redelivery), so
        an unsigned oversized request cannot undo a real delivery but a fixed one is processed."""
        return bool(self.deliveries.receive_delivery(delivery, event, status, reason=reason,
                                                     repository=repository).stored)


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
