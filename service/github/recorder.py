"""Group commit for the webhook's one database write per delivery.

:class:`DeliveryRecorder` lets concurrent requests on one asyncio event loop share database round
trips: each request awaits :meth:`DeliveryRecorder.receive`; writes that arrive while a flush is
running are collected and go together in the next flush — one multi-row ``INSERT … ON CONFLICT
DO NOTHING RETURNING`` in a worker thread (:meth:`service.db.Store.receive_deliveries`).  Under
load this turns N statements, N commits and N thread hops into one of each; a lone request waits
for nothing (its flush starts at once).

Guarantees: a request is answered only after its row is committed (or the write failed, which
raises in that request: a database that is down is a 503 for everyone in the flush, and nothing is
half-recorded: each flush is one transaction); a row whose content the database refuses affects no
other row of the flush (the store writes them one by one and records that delivery ``rejected``:
:attr:`service.db.deliveries.Received.rejected`); each write gets the answer
:meth:`~service.db.Store.receive_delivery` would have given.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.db.deliveries import DeliveryWrite, Received
    from service.db.store import Store


class DeliveryRecorder:
    """Batches ``receive_deliveries`` calls of one event loop (create it on the loop that uses it)."""

    def __init__(self, store: Store, max_batch: int = 500) -> None:
        self.store = store
        self.max_batch = max_batch
        self._queue: list[tuple[DeliveryWrite, asyncio.Future[Received]]] = []
        self._flushing = False

    async def receive(self, write: DeliveryWrite) -> Received:
        """Record ``write`` (a :class:`service.db.deliveries.DeliveryWrite`) and return its
        :class:`service.db.deliveries.Received` once committed."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Received] = loop.create_future()
        self._queue.append((write, fut))
        if not self._flushing:
            self._flushing = True
            loop.create_task(self._flush_all())
        return await fut

    async def _flush_all(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._queue:
                batch, self._queue = self._queue[:self.max_batch], self._queue[self.max_batch:]
                try:
                    results = await loop.run_in_executor(None, self.store.receive_deliveries,
                                                         [w for w, _ in batch])
                except BaseException as exc:  # noqa: BLE001 - every waiting request gets the error
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                    continue
                for (_, fut), result in zip(batch, results, strict=True):
                    if not fut.done():
                        fut.set_result(result)
        finally:
            self._flushing = False
            if self._queue:  # arrived after the loop's last check (cannot happen without an await, kept safe)
                self._flushing = True
                loop.create_task(self._flush_all())
