"""uvicorn's HTTP/1.1 protocol with the limits a public endpoint needs (``ampci serve``).

uvicorn bounds the idle time between requests of a kept-alive connection (``timeout_keep_alive``)
and, with ``limit_concurrency``, answers 503 past a number of connections; it does not bound how
long a client may take to send a request's headers, nor how many connections one client holds, so
20 connections trickling a byte at a time were held open indefinitely.  :class:`GuardedH11Protocol`
adds, per connection:

* **a header deadline** (``AMPCI_HTTP_HEADER_TIMEOUT``): from the first byte of a request (or the
  connection's opening) until its headers are complete; past it the connection is closed.  After a
  response, bytes that do not complete a new request's headers (a body the route never read,
  trickled forever) meet the same deadline.
* **a cap per client address** (``AMPCI_HTTP_CLIENT_CONNECTIONS``): a connection beyond it is
  closed as soon as it is accepted.

The body deadline (``AMPCI_HTTP_BODY_TIMEOUT``: 408) is enforced per request by
:class:`service.api.edge.EdgeGuard`; :func:`uvicorn_limits` gives ``uvicorn.run`` the keep-alive
timeout and the connection cap (``AMPCI_HTTP_KEEPALIVE_TIMEOUT``, ``AMPCI_HTTP_MAX_CONNECTIONS``).
The protocol is named to uvicorn by import string (``HTTP_PROTOCOL``), so ``--workers`` processes
load it too; each reads its limits from the environment unless :func:`configure` set them.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import TypedDict

from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

from service.settings import Settings

log = logging.getLogger(__name__)

HTTP_PROTOCOL = "service.api.server:GuardedH11Protocol"

_settings: Settings | None = None
_per_client: Counter[str] = Counter()  # open connections per client address (this process's event loop)
_noted: dict[str, tuple[float, int]] = {}  # kind -> (last logged, suppressed since)
NOTE_EVERY_S = 5.0


def _note(kind: str, message: str, *args: object) -> None:
    """Log ``message`` as one WARNING line at most every NOTE_EVERY_S per kind, with how many were
    suppressed since (a flood of slow clients cannot flood the log)."""
    import time

    now = time.monotonic()
    last, suppressed = _noted.get(kind, (0.0, 0))
    if now - last < NOTE_EVERY_S:
        _noted[kind] = (last, suppressed + 1)
        return
    _noted[kind] = (now, 0)
    log.warning(message + (f" ({suppressed} more since the last such line)" if suppressed else ""), *args)


def configure(settings: Settings) -> None:
    """Use ``settings``' limits in this process (default: ``Settings.from_env()`` at first use)."""
    global _settings
    _settings = settings


def _limits() -> Settings:
    global _settings
    if _settings is None:
        _settings = Settings.from_env()
    return _settings


class UvicornLimits(TypedDict):
    """``uvicorn.run`` keyword arguments: the HTTP protocol (an import string), the keep-alive timeout in
    seconds and the connection cap."""

    http: str
    timeout_keep_alive: float
    limit_concurrency: int


def uvicorn_limits(settings: Settings) -> UvicornLimits:
    """The ``uvicorn.run`` keyword arguments for ``settings``' limits (protocol included)."""
    return {"http": HTTP_PROTOCOL, "timeout_keep_alive": settings.http_keepalive_timeout,
            "limit_concurrency": settings.http_max_connections}


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header deadline and a per-client connection cap (module docstring)."""

    _header_timer: asyncio.TimerHandle | None = None
    _timed_cycle: RequestResponseCycle | None = None
    _counted: str | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # narrows asyncio's BaseTransport, as H11Protocol does
        super().connection_made(transport)
        limits = _limits()
        address = self.client[0] if self.client else ""
        if _per_client[address] >= limits.http_client_connections:
            _note("cap", "connection from %s refused: it holds %d already (AMPCI_HTTP_CLIENT_CONNECTIONS)",
                  address, _per_client[address])
            transport.close()
            return
        _per_client[address] += 1
        self._counted = address
        self._arm(limits.http_header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._counted is not None:
            _per_client[self._counted] -= 1
            if _per_client[self._counted] <= 0:
                del _per_client[self._counted]
            self._counted = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._header_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._arm(_limits().http_header_timeout)  # bytes of a next request: its headers have a deadline
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and self.cycle is not self._timed_cycle:
            self._timed_cycle = self.cycle  # a request's headers are complete
            self._disarm()

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(seconds, self._header_deadline)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_deadline(self) -> None:
        self._header_timer = None
        if self.transport is not None and not self.transport.is_closing():
            _note("headers", "connection from %s closed: request headers not complete within %gs "
                  "(AMPCI_HTTP_HEADER_TIMEOUT)", self.client[0] if self.client else "?", _limits().http_header_timeout)
            self.transport.close()
