"""Webhook deliveries in the store (mixed into :class:`service.db.store.Store`).

The webhook handler records every delivery it can identify with :meth:`receive_delivery`: one
``INSERT … ON CONFLICT DO NOTHING`` statement on the hot path (a second read only for an id that
already exists).  A delivery that asks for a run is stored ``pending`` with its compact payload;
the background intake (:mod:`service.github.intake`) claims pending deliveries oldest first with
:meth:`pending_deliveries` (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so several API processes
never work on the same one), creates their runs and marks them with :meth:`settle_deliveries`.

State rules (every writer follows them, so an old signed delivery cannot undo a newer outcome):
``pending`` and ``accepted`` rows are never overwritten by :meth:`receive_delivery`; a
``rejected`` row is (GitHub's "redeliver" of a rejected delivery is processed again); only a
``pending`` row is settled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from service.db import models as m
from service.db.records import DeliveryInfo, utc
from service.errors import NotFoundError, UserError

DELIVERY_STATES = ("pending", "accepted", "rejected", "duplicate")
t_del = m.WebhookDelivery.__table__


@dataclass(frozen=True)
class Received:
    """What :meth:`DeliveriesMixin.receive_delivery` did.

    ``stored`` is True when this call wrote the row (new id, or a ``rejected`` row replaced);
    otherwise ``existing`` is the row that stays as it was (``pending``/``accepted``/…).
    """

    stored: bool
    existing: DeliveryInfo | None = None


@dataclass(frozen=True)
class PendingDelivery:
    """A ``pending`` delivery claimed by the intake: its id, event, repository and payload."""

    delivery_id: str
    event: str
    repository: str | None
    payload: dict[str, Any] | None


@dataclass(frozen=True)
class Settlement:
    """The outcome the intake records for one pending delivery (``accepted`` or ``rejected``)."""

    delivery_id: str
    status: str
    reason: str | None = None
    run_id: int | None = None


def _check_status(status: str) -> None:
    if status not in DELIVERY_STATES:
        raise UserError(f"unknown delivery status {status!r}; expected one of {', '.join(DELIVERY_STATES)}")


def delivery_info(r: Any) -> DeliveryInfo:
    """DeliveryInfo from a webhook_deliveries row."""
    return DeliveryInfo(delivery_id=r.delivery_id, event=r.event, repository=r.repository, status=r.status,
                        reason=r.reason, run_id=r.run_id, received_at=utc(r.received_at))  # type: ignore[arg-type]


_INFO_COLS = (t_del.c.delivery_id, t_del.c.event, t_del.c.repository, t_del.c.status, t_del.c.reason,
              t_del.c.run_id, t_del.c.received_at)


class DeliveriesMixin:
    """Delivery methods; requires ``self._tx()`` and ``self.clock`` from Store."""

    def _tx(self):  # type: ignore[no-untyped-def]  # pragma: no cover - provided by Store
        raise NotImplementedError

    def receive_delivery(self, delivery_id: str, event: str, status: str, *, reason: str | None = None,
                         repository: str | None = None, payload: dict[str, Any] | None = None,
                         run_id: int | None = None) -> Received:
        """Record a delivery as it arrives; see :class:`Received`.

        The common case (a new id) is one ``INSERT … ON CONFLICT DO NOTHING`` statement.  An id
        already recorded costs one read more; only a ``rejected`` row is then replaced (guarded
        update, so of two racing redeliveries exactly one gets ``stored``).  Never waits for the
        intake's row locks.
        """
        _check_status(status)
        from service.db.store import dialect_insert

        values = {"delivery_id": delivery_id, "event": event, "status": status, "reason": reason,
                  "run_id": run_id, "repository": repository, "payload": payload,
                  "received_at": self.clock()}
        with self._tx() as conn:
            ins = dialect_insert(conn, t_del).values(**values)
            got = conn.execute(ins.on_conflict_do_nothing(index_elements=[t_del.c.delivery_id])
                               .returning(t_del.c.delivery_id)).scalar()
            if got is not None:
                return Received(True)
            row = conn.execute(sa.select(*_INFO_COLS).where(t_del.c.delivery_id == delivery_id)).first()
            if row is not None and row.status == "rejected":
                done = conn.execute(t_del.update().where(t_del.c.delivery_id == delivery_id,
                                                         t_del.c.status == "rejected")
                                    .values(**values).returning(t_del.c.delivery_id)).scalar()
                if done is not None:
                    return Received(True)
                row = conn.execute(sa.select(*_INFO_COLS).where(t_del.c.delivery_id == delivery_id)).first()
        return Received(False, delivery_info(row) if row is not None else None)

    def pending_deliveries(self, conn: Connection, limit: int, skip: Sequence[str] = ()) -> list[PendingDelivery]:
        """Up to ``limit`` pending deliveries, oldest first, read on ``conn`` (the caller's transaction).

        On PostgreSQL the rows are locked ``FOR UPDATE SKIP LOCKED`` until that transaction ends:
        another intake (another API process) skips them.  ``skip`` excludes ids (backing off).
        """
        q = (sa.select(t_del.c.delivery_id, t_del.c.event, t_del.c.repository, t_del.c.payload)
             .where(t_del.c.status == "pending").order_by(t_del.c.received_at, t_del.c.delivery_id).limit(limit))
        if skip:
            q = q.where(t_del.c.delivery_id.not_in(list(skip)))
        if conn.dialect.name == "postgresql":
            q = q.with_for_update(skip_locked=True)
        return [PendingDelivery(r.delivery_id, r.event, r.repository, r.payload) for r in conn.execute(q)]

    def count_pending_deliveries(self) -> int:
        """How many deliveries wait for the intake."""
        with self._tx() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(t_del)
                                    .where(t_del.c.status == "pending")).scalar() or 0)

    def settle_deliveries(self, conn: Connection, settlements: Sequence[Settlement]) -> int:
        """Record the intake's outcomes on ``conn``; only rows still ``pending`` change (payload cleared).

        One executemany of a guarded UPDATE; returns how many rows changed.
        """
        if not settlements:
            return 0
        for s in settlements:
            _check_status(s.status)
        stmt = (t_del.update().where(t_del.c.delivery_id == sa.bindparam("b_id"), t_del.c.status == "pending")
                .values(status=sa.bindparam("b_status"), reason=sa.bindparam("b_reason"),
                        run_id=sa.bindparam("b_run"), payload=sa.null()))
        res = conn.execute(stmt, [{"b_id": s.delivery_id, "b_status": s.status, "b_reason": s.reason,
                                   "b_run": s.run_id} for s in settlements])
        return int(res.rowcount or 0)

    # -- the original API (kept for callers and tests) -----------------------------------------
    def record_delivery(self, delivery_id: str, event: str, status: str, reason: str | None = None,
                        run_id: int | None = None, repository: str | None = None) -> bool:
        """Record a webhook delivery; True if new, False if the id was already recorded (left unchanged).

        Atomic: of two concurrent calls with one id exactly one gets True.
        """
        _check_status(status)
        from service.db.store import dialect_insert

        with self._tx() as conn:
            ins = dialect_insert(conn, t_del).values(
                delivery_id=delivery_id, event=event, status=status, reason=reason, run_id=run_id,
                repository=repository, received_at=self.clock())
            got = conn.execute(ins.on_conflict_do_nothing(index_elements=[t_del.c.delivery_id])
                               .returning(t_del.c.delivery_id)).scalar()
        return got is not None

    def update_delivery(self, delivery_id: str, *, status: str | None = None, reason: str | None = None,
                        run_id: int | None = None) -> DeliveryInfo:
        """Update fields of a recorded delivery (None leaves a field as it is)."""
        if status is not None:
            _check_status(status)
        values = {k: v for k, v in (("status", status), ("reason", reason), ("run_id", run_id)) if v is not None}
        with self._tx() as conn:
            if values:
                conn.execute(t_del.update().where(t_del.c.delivery_id == delivery_id).values(**values))
        got = self.get_delivery(delivery_id)
        if got is None:
            raise NotFoundError(f"no webhook delivery {delivery_id!r}")
        return got

    def get_delivery(self, delivery_id: str) -> DeliveryInfo | None:
        """The recorded delivery with this id, or None."""
        with self._tx() as conn:
            r = conn.execute(sa.select(*_INFO_COLS).where(t_del.c.delivery_id == delivery_id)).first()
        return None if r is None else delivery_info(r)
