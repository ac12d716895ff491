"""Security headers on every HTTP response (JSON API, webhook, dashboard, errors).

:class:`SecurityHeaders` is a plain ASGI middleware (no per-request task or body buffering, so the
webhook's latency is unaffected) that adds, unless a handler set them itself:

* ``Content-Security-Policy`` (:data:`CSP`): everything from this origin only, **no script at all**
  (the dashboard is server-rendered and needs none), no plugins, no ``<base>``, forms posting only
  here, and ``frame-ancestors 'none'`` (no framing: clickjacking on the triage form).  Inline
  *styles* are allowed: the SVG plots pygal renders carry ``<style>`` elements and ``style``
  attributes, which hold no script;
* ``X-Frame-Options: DENY`` (older browsers' frame-ancestors), ``X-Content-Type-Options: nosniff``,
  ``Referrer-Policy: no-referrer`` (run and regression URLs leave no trace in other sites' logs).

Swagger UI / ReDoc (which load scripts from a public CDN) are not served: ``/openapi.json`` is.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

CSP = ("default-src 'self'; script-src 'none'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "font-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")

HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CSP.encode("ascii")),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)


class SecurityHeaders:
    """ASGI middleware adding :data:`HEADERS` to every HTTP response start (headers a handler set win)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers.extend(h for h in HEADERS if h[0] not in present)
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)
