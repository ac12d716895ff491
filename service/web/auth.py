"""Bearer-token checks for the HTTP API (``Authorization: Bearer <AMPCI_API_TOKEN>``).

Write endpoints always need the token; read endpoints need it when ``AMPCI_READ_TOKEN_REQUIRED``
is set.  Tokens are compared in constant time.  Without a configured token, write endpoints answer
403 (disabled) unless ``AMPCI_INSECURE_DEV`` is set.
"""

from __future__ import annotations

import hmac

from fastapi import Request

from service.settings import Settings
from service.web.errors import ApiError

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="ampci"'}


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def check_token(settings: Settings, request: Request) -> None:
    """Raise 401/403 ApiError unless the request carries the configured API token."""
    if not settings.api_token:
        if settings.insecure_dev:
            return
        raise ApiError(403, "write endpoints are disabled: AMPCI_API_TOKEN is not set")
    given = _bearer(request)
    if given is None:
        raise ApiError(401, "missing bearer token (Authorization: Bearer <token>)", headers=_CHALLENGE)
    if not hmac.compare_digest(given.encode("utf-8", "replace"), settings.api_token.encode("utf-8")):
        raise ApiError(401, "invalid bearer token", headers=_CHALLENGE)


def require_write(request: Request) -> None:
    """FastAPI dependency for write endpoints."""
    check_token(request.app.state.ctx.settings, request)


def require_read(request: Request) -> None:
    """FastAPI dependency for read endpoints (a no-op unless AMPCI_READ_TOKEN_REQUIRED)."""
    settings: Settings = request.app.state.ctx.settings
    if settings.read_token_required:
        check_token(settings, request)
