"""Webhook deliveries in the store (mixed into :class:`service.db.store.Store`).

The webhook handler records every delivery it can identify with :meth:`receive_delivery`: one
``INSERT … ON CONFLICT DO NOTHING`` statement on the hot path (a second read only for an id that
already exists).  A delivery that asks for a run is stored ``pending`` with its compact payload;
the background intake (:mod:`service.github.intake`) claims pending deliveries oldest first with
:meth:`pending_deliveries` (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so several API processes
never work on the same one), creates their runs and marks them with :meth:`settle_deliveries`.

State rules (every writer follows them, so an old signed delivery cannot undo a newer outcome):
``pending`` and ``accepted`` rows are never overwritten by :meth:`receive_delivery`; a
``rejected`` or ``failed`` row is (GitHub's "redeliver" of such a delivery is processed again);
only a ``pending`` row is settled.  ``rejected``: its content can never become a run; ``failed``:
the intake gave up after a bounded number of attempts (the reason says why).

Per-delivery isolation: a batch of writes that the database refuses for the content of one row
(:data:`CONTENT_ERRORS`: a value too long, a NUL byte, an unencodable string) is written again one
by one, and a row that still cannot be stored is recorded ``rejected`` with the reason instead
(:attr:`Received.rejected`); the other deliveries of the batch are stored as asked.  Reasons are
made storable before they are written, so recording an outcome never fails for its text.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from service.db import models as m
from service.db.engine import DbRow, DialectInsert, connect
from service.db.records import DeliveryInfo, utc
from service.errors import NotFoundError, UserError
from service.json_types import JsonObject

if TYPE_CHECKING:
    from sqlalchemy.sql.dml import ReturningInsert

DELIVERY_STATES = ("pending", "accepted", "rejected", "failed", "duplicate")
REDELIVERABLE = ("rejected", "failed")
#: errors a row's content causes (retrying the same values cannot help); others are infrastructure
CONTENT_ERRORS: tuple[type[BaseException], ...] = (sa.exc.DataError, sa.exc.IntegrityError, UnicodeError)
t_del = m.WebhookDelivery.__table__


def storable(text: str | None, limit: int = 2000) -> str | None:
    """``text`` fit for a text column of any backend: NUL removed, lone surrogates replaced, at
    most ``limit`` characters."""
    if text is None:
        return None
    return text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")[:limit]


def error_line(exc: BaseException) -> str:
    """The first line of an error (the driver's message for a database error), storable."""
    text = str(getattr(exc, "orig", None) or exc) or type(exc).__name__
    return storable(f"{type(exc).__name__}: {text.splitlines()[0] if text.strip() else text}", 300) or ""


@dataclass(frozen=True)
class Received:
    """What :meth:`DeliveriesMixin.receive_delivery` did.

    ``stored`` is True when this call wrote the row (new id, or a ``rejected`` row replaced);
    otherwise ``existing`` is the row that stays as it was (``pending``/``accepted``/…).
    ``rejected`` is set when the write could not be stored as asked (its content was refused by the
    database): the row was then recorded ``rejected`` with this reason (if ``stored``).
    """

    stored: bool
    existing: DeliveryInfo | None = None
    rejected: str | None = None


@dataclass(frozen=True)
class DeliveryWrite:
    """One delivery to record with :meth:`DeliveriesMixin.receive_deliveries`."""

    delivery_id: str
    event: str
    status: str
    reason: str | None = None
    repository: str | None = None
    payload: JsonObject | None = None
    run_id: int | None = None

    def values(self, received_at: datetime) -> dict[str, object]:
        """The row's column values."""
        return {"delivery_id": self.delivery_id, "event": self.event, "status": self.status,
                "reason": storable(self.reason), "run_id": self.run_id, "repository": self.repository,
                "payload": self.payload, "received_at": received_at}

    def as_rejected(self, reason: str) -> DeliveryWrite:
        """This delivery recorded ``rejected`` with ``reason`` and nothing of its content."""
        return DeliveryWrite(self.delivery_id, storable(self.event, 50) or "unknown", "rejected", reason=reason)


@dataclass(frozen=True)
class PendingDelivery:
    """A ``pending`` delivery claimed by the intake: its id, event, repository and payload."""

    delivery_id: str
    event: str
    repository: str | None
    payload: JsonObject | None


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


def delivery_info(r: DbRow) -> DeliveryInfo:
    """DeliveryInfo from a webhook_deliveries row."""
    return DeliveryInfo(delivery_id=r.delivery_id, event=r.event, repository=r.repository, status=r.status,
                        reason=r.reason, run_id=r.run_id, received_at=utc(r.received_at))


_COLS = ("delivery_id", "event", "status", "reason", "run_id", "repository", "payload", "received_at")


def _dialect_insert(dialect: str) -> DialectInsert:
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(t_del)
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(t_del)


@functools.cache
def _insert_new(dialect: str) -> ReturningInsert[str]:
    """``INSERT … ON CONFLICT (delivery_id) DO NOTHING RETURNING delivery_id`` with bind parameters,
    built once per dialect (the hot path pays no statement construction)."""
    return (_dialect_insert(dialect).values({c: sa.bindparam(c, type_=t_del.c[c].type) for c in _COLS})
            .on_conflict_do_nothing(index_elements=[t_del.c.delivery_id]).returning(t_del.c.delivery_id))


@contextmanager
def _autocommit(engine: Engine) -> Iterator[Connection]:
    conn = connect(engine)
    try:
        yield conn.execution_options(isolation_level="AUTOCOMMIT")
    finally:
        conn.close()


_INFO_COLS = (t_del.c.delivery_id, t_del.c.event, t_del.c.repository, t_del.c.status, t_del.c.reason,
              t_del.c.run_id, t_del.c.received_at)


class DeliveriesMixin:
    """Delivery methods; requires ``self.transaction()``, ``self.clock`` and ``self.engine`` from Store."""

    engine: Engine
    clock: Callable[[], datetime]

    def transaction(self) -> AbstractContextManager[Connection]:  # pragma: no cover - provided by Store
        raise NotImplementedError

    def receive_delivery(self, delivery_id: str, event: str, status: str, *, reason: str | None = None,
                         repository: str | None = None, payload: JsonObject | None = None,
                         run_id: int | None = None) -> Received:
        """Record a delivery as it arrives; see :class:`Received`.

        The common case (a new id) is one ``INSERT … ON CONFLICT DO NOTHING`` statement (autocommit
        on PostgreSQL: one round trip).  An id already recorded costs one read more; only a
        ``rejected`` row is then replaced (guarded update, so of two racing redeliveries exactly
        one gets ``stored``).  Never waits for the intake's row locks.
        """
        write = DeliveryWrite(delivery_id, event, status, reason, repository, payload, run_id)
        return self.receive_deliveries([write])[0]

    def receive_deliveries(self, writes: Sequence[DeliveryWrite]) -> list[Received]:
        """:meth:`receive_delivery` for many deliveries at once (the webhook's group commit): new ids
        take one multi-row ``INSERT … ON CONFLICT DO NOTHING RETURNING`` statement together; the
        answers are in the order of ``writes`` (a later write of an id repeated within ``writes``
        sees the earlier one as existing)."""
        for w in writes:
            _check_status(w.status)
        now = self.clock()
        first: dict[str, int] = {}
        for i, w in enumerate(writes):
            first.setdefault(w.delivery_id, i)
        rows = [writes[i].values(now) for i in first.values()]
        inserted: set[str] = set()
        try:
            with self._single_statement() if len(rows) == 1 else self.transaction() as conn:
                stmt = _insert_new(conn.dialect.name)
                if len(rows) == 1:
                    got = conn.execute(stmt, rows[0]).scalar()
                    inserted.update([got] if got is not None else [])
                else:  # SQLAlchemy's "insertmanyvalues": multi-row statements in one transaction
                    inserted.update(conn.execute(stmt, rows).scalars())
        except CONTENT_ERRORS as exc:
            if len(writes) > 1:  # isolate: one by one, so only the offending delivery is affected
                return [self.receive_deliveries([w])[0] for w in writes]
            reason = f"cannot be stored: {error_line(exc)}"
            kept = self.receive_deliveries([writes[0].as_rejected(reason)])[0]
            return [Received(kept.stored, kept.existing, rejected=reason)]
        out: list[Received] = []
        for i, w in enumerate(writes):
            if first[w.delivery_id] == i and w.delivery_id in inserted:
                out.append(Received(True))
            else:
                out.append(self._receive_existing(w.values(now)))
        return out

    def _receive_existing(self, values: dict[str, object]) -> Received:
        delivery_id = values["delivery_id"]
        with self.transaction() as conn:
            row = conn.execute(sa.select(*_INFO_COLS).where(t_del.c.delivery_id == delivery_id)).first()
            if row is None:  # not there after all (deleted meanwhile): insert it
                stmt = _insert_new(conn.dialect.name)
                if conn.execute(stmt, values).scalar() is not None:
                    return Received(True)
                row = conn.execute(sa.select(*_INFO_COLS).where(t_del.c.delivery_id == delivery_id)).first()
            elif row.status in REDELIVERABLE:
                done = conn.execute(t_del.update().where(t_del.c.delivery_id == delivery_id,
                                                         t_del.c.status.in_(REDELIVERABLE))
                                    .values(**values).returning(t_del.c.delivery_id)).scalar()
                if done is not None:
                    return Received(True)
                row = conn.execute(sa.select(*_INFO_COLS).where(t_del.c.delivery_id == delivery_id)).first()
        return Received(False, delivery_info(row) if row is not None else None)

    def _single_statement(self) -> AbstractContextManager[Connection]:
        """A connection for one atomic statement: autocommit on PostgreSQL (one round trip instead
        of BEGIN, statement, COMMIT); a normal transaction elsewhere."""
        if self.engine.dialect.name == "postgresql":
            return _autocommit(self.engine)
        return self.transaction()

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

    def claims_hold_row_locks(self) -> bool:
        """True when :meth:`pending_deliveries` locks the rows it returns until the claiming transaction
        ends (PostgreSQL), so the claim and the settlement must share one transaction."""
        return bool(self.engine.dialect.name == "postgresql")

    def accepted_deliveries(self, run_ids: Iterable[int]) -> dict[int, set[str]]:
        """Run id -> the ids of the ``accepted`` deliveries recorded with that run, for ``run_ids``
        (runs no accepted delivery names are absent)."""
        ids = sorted(set(run_ids))
        if not ids:
            return {}
        holders: dict[int, set[str]] = {}
        with self.transaction() as conn:
            for run_id, delivery in conn.execute(sa.select(t_del.c.run_id, t_del.c.delivery_id)
                                                 .where(t_del.c.run_id.in_(ids), t_del.c.status == "accepted")):
                holders.setdefault(run_id, set()).add(delivery)
        return holders

    def count_pending_deliveries(self) -> int:
        """How many deliveries wait for the intake."""
        with self.transaction() as conn:
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
        res = conn.execute(stmt, [{"b_id": s.delivery_id, "b_status": s.status, "b_reason": storable(s.reason),
                                   "b_run": s.run_id} for s in settlements])
        return int(res.rowcount or 0)

    # -- the original API (kept for callers and tests) -----------------------------------------
    def record_delivery(self, delivery_id: str, event: str, status: str, reason: str | None = None,
                        run_id: int | None = None, repository: str | None = None) -> bool:
        """Record a webhook delivery; True if new, False if the id was already recorded (left unchanged).

        Atomic: of two concurrent calls with one id exactly one gets True.
        """
        _check_status(status)
        from service.db.runs import dialect_insert

        with self.transaction() as conn:
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
        with self.transaction() as conn:
            if values:
                conn.execute(t_del.update().where(t_del.c.delivery_id == delivery_id).values(**values))
        got = self.get_delivery(delivery_id)
        if got is None:
            raise NotFoundError(f"no webhook delivery {delivery_id!r}")
        return got

    def list_deliveries(self, status: str | None = None, limit: int = 100) -> list[DeliveryInfo]:
        """Recorded deliveries, newest first, optionally of one status (``UserError`` for an unknown one)."""
        q = sa.select(*_INFO_COLS).order_by(t_del.c.received_at.desc(), t_del.c.delivery_id.desc()).limit(limit)
        if status is not None:
            _check_status(status)
            q = q.where(t_del.c.status == status)
        with self.transaction() as conn:
            return [delivery_info(r) for r in conn.execute(q)]

    def get_delivery(self, delivery_id: str) -> DeliveryInfo | None:
        """The recorded delivery with this id, or None."""
        with self.transaction() as conn:
            r = conn.execute(sa.select(*_INFO_COLS).where(t_del.c.delivery_id == delivery_id)).first()
        return None if r is None else delivery_info(r)
