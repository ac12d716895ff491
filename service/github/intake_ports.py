"""What the webhook intake (:mod:`service.github.intake`) needs of its collaborators, as Protocols:
the delivery queue it claims from (the Store), the submitter that creates runs (the API's
``RunDispatcher``) and the status queue it reports to (the ``StatusReporter``).  The intake depends
on these shapes only, so it imports neither the API nor the database layer's engine.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol, TypeVar

from service.github.approval import Approval, Approved
from service.github.events import RunRequest

if TYPE_CHECKING:
    from service.db.deliveries import PendingDelivery, Settlement

ConnT = TypeVar("ConnT")


class DeliveryQueue(Protocol[ConnT]):
    """The ``webhook_deliveries`` work queue the intake claims from and settles into
    (:class:`service.db.Store`, see :mod:`service.db.deliveries`); ``ConnT`` is its transaction's connection."""

    def transaction(self) -> AbstractContextManager[ConnT]: ...

    def pending_deliveries(self, conn: ConnT, limit: int, skip: Sequence[str] = ()) -> list[PendingDelivery]: ...

    def settle_deliveries(self, conn: ConnT, settlements: Sequence[Settlement]) -> int: ...

    def claims_hold_row_locks(self) -> bool: ...

    def accepted_deliveries(self, run_ids: Iterable[int]) -> dict[int, set[str]]: ...


class SubmittedRun(Protocol):
    """What submitting one run request did (:class:`service.github.webhook.Submitted`)."""

    @property
    def run_id(self) -> int: ...

    @property
    def created(self) -> bool: ...

    @property
    def awaiting(self) -> bool: ...


class Submitter(Protocol):
    """Creates the runs of requests and dispatches their jobs, idempotent on the dedup key
    (:class:`service.api.dispatch.RunDispatcher`; see :class:`service.github.webhook.RunSubmitter`)."""

    def submit_many(self, items: Sequence[tuple[RunRequest, str]],
                    redispatch: bool = True) -> Sequence[SubmittedRun | BaseException]: ...

    def approve(self, approval: Approval, delivery: str) -> Approved: ...

    def approval_head(self, approval: Approval) -> tuple[int, str] | None: ...


class StatusQueue(Protocol):
    """Where the intake queues commit statuses (:class:`service.github.reporter.StatusReporter`)."""

    def queued(self, run_id: int, repo: str, sha: str, description: str = "queued",
               installation: int | None = None) -> None: ...

    def awaiting(self, run_id: int, repo: str, sha: str, installation: int | None = None,
                 description: str | None = None) -> None: ...

    def refused(self, repo: str, sha: str) -> None: ...
