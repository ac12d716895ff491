"""What every request meets before a route: HEAD, the body limit, the API token, client disconnects.

:class:`EdgeGuard` is a plain ASGI middleware (no per-request task or buffering) that guarantees:

* **HEAD on every GET route**: a ``HEAD`` request is served as the ``GET`` it names, with the
  status and headers of that answer and no body (monitors and link checkers use HEAD).
* **the token before the body**: a write (``POST``/``PUT``/``PATCH``/``DELETE``) under ``/api/``,
  and with ``AMPCI_READ_TOKEN_REQUIRED`` every ``/api/`` request, is answered 401/403 from its
  headers alone, before a byte of its body is read or parsed, so an unauthenticated client cannot
  make the server buffer or parse anything.
* **a body limit on every route that takes one** (``AMPCI_MAX_BODY_BYTES``): a declared
  ``Content-Length`` over the limit is answered 413 unread; a streamed (chunked) body is cut off as
  soon as it passes the limit (413, the route sees a disconnect and its own answer is dropped).
  The webhook route is exempt: it reads within its own limit (GitHub's 25 MB) itself, because it must answer an
  unsigned oversize request 401 and a signed one 413 (see :mod:`service.github.webhook`).
* **a body read timeout**: a request body must arrive within ``AMPCI_HTTP_BODY_TIMEOUT`` seconds
  of its first read (a client sending a byte at a time is answered 408 and dropped).

:class:`EdgeCounters` counts client disconnects and database errors; the app's error handlers log
each as one WARNING line carrying the running count (never a traceback per request).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.settings import Settings

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
BODY_LIMIT_EXEMPT = frozenset({"/webhooks/github"})  # reads within the limit itself (401 before 413)
_CHALLENGE = [(b"www-authenticate", b'Bearer realm="ampci"')]


@dataclass
class EdgeCounters:
    """Per-process counts of what is logged as one WARNING line each (thread-safe)."""

    client_disconnects: int = 0
    database_errors: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def bump(self, name: str) -> int:
        """Add one to counter ``name``; the new value."""
        with self._lock:
            value = int(getattr(self, name)) + 1
            setattr(self, name, value)
            return value


def _json_error(status: int, code: str, message: str,
                extra_headers: list[tuple[bytes, bytes]] | None = None) -> tuple[Message, Message]:
    body = json.dumps({"error": code, "message": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close"), *(extra_headers or [])]
    return ({"type": "http.response.start", "status": status, "headers": headers},
            {"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> str | None:
    headers: Iterable[tuple[bytes, bytes]] = scope.get("headers", [])  # ASGI: (lower-case name, value) pairs
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def token_refusal(settings: Settings, scope: Scope) -> tuple[int, str, str] | None:
    """(status, code, message) when the request may not reach an ``/api/`` route without reading its
    body: the rules of :func:`service.web.auth.check_token` applied to its headers; None to let it in."""
    path: str = scope.get("path", "")
    if not path.startswith("/api/"):
        return None
    method = scope.get("method", "GET")
    if method not in WRITE_METHODS and not settings.read_token_required:
        return None
    from starlette.requests import Request

    from service.web.auth import check_token
    from service.web.errors import ApiError

    try:
        check_token(settings, Request(scope))
    except ApiError as exc:
        return exc.status_code, exc.code, str(exc)
    return None


class _Cut(Exception):
    """The body passed the limit or its deadline; the answer was sent already."""


class EdgeGuard:
    """ASGI middleware applying the module's rules; ``settings`` gives the limits and the token."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        head = scope.get("method") == "HEAD"
        if head:
            scope = dict(scope, method="GET")
        refused = token_refusal(self.settings, scope)
        if refused is not None:
            status, code, message = refused
            await self._answer(send, status, code, message, head, _CHALLENGE if status == 401 else None)
            return
        limit = self.settings.max_body_bytes
        exempt = scope.get("path") in BODY_LIMIT_EXEMPT
        declared = _header(scope, b"content-length")
        if not exempt and declared is not None and declared.strip().isascii() and declared.strip().isdigit() \
                and int(declared) > limit:
            await self._answer(send, 413, "too_large", f"request body larger than {limit} bytes (not read)", head)
            return

        answered: bool | str = False
        complete = False
        received = 0
        deadline: float | None = None
        timeout = self.settings.http_body_timeout

        async def guarded_send(message: Message) -> None:
            nonlocal answered
            if answered == "cut":
                return  # the route's own answer after we cut its body off
            if message["type"] == "http.response.start":
                answered = True
            if head and message["type"] == "http.response.body":
                if message.get("more_body"):
                    return
                message = {"type": "http.response.body", "body": b""}
            await send(message)

        async def guarded_receive() -> Message:
            nonlocal received, deadline, complete
            if answered == "cut":
                return {"type": "http.disconnect"}
            if complete:  # later receives wait for the disconnect only (a streaming response)
                return await receive()
            now = time.monotonic()
            if deadline is None:
                deadline = now + timeout
            try:
                async with asyncio.timeout(max(0.0, deadline - now)):
                    message = await receive()
            except TimeoutError:
                await cut(408, "timeout", f"request body not received within {timeout:g}s")
                return {"type": "http.disconnect"}
            if message["type"] == "http.request":
                complete = not message.get("more_body", False)
                received += len(message.get("body", b""))
                if not exempt and received > limit:
                    await cut(413, "too_large", f"request body larger than {limit} bytes (cut off)")
                    return {"type": "http.disconnect"}
            return message

        async def cut(status: int, code: str, message: str) -> None:
            nonlocal answered
            if answered is False:
                await self._answer(send, status, code, message, head)
            answered = "cut"

        await self.app(scope, guarded_receive, guarded_send)

    @staticmethod
    async def _answer(send: Send, status: int, code: str, message: str, head: bool,
                      extra: list[tuple[bytes, bytes]] | None = None) -> None:
        start, body = _json_error(status, code, message, extra)
        from service.api.headers import HEADERS

        start["headers"].extend(HEADERS)
        await send(start)
        await send({"type": "http.response.body", "body": b""} if head else body)
