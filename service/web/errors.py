"""Errors at the HTTP boundary that every route raises or answers with: :class:`ApiError` (an error
with an explicit status) and :func:`error_response` (the one JSON error shape,
``{"error": CODE, "message": ONE_LINE}``).  The handlers that translate every other error into this
shape are installed by :func:`service.api.errors.install_error_handlers`.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse

_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
          405: "method_not_allowed", 409: "conflict", 413: "too_large", 415: "unsupported_media_type",
          422: "invalid_request", 503: "unavailable"}


class ApiError(Exception):
    """An error with an explicit HTTP status, raised by handlers on purpose."""

    def __init__(self, status_code: int, message: str, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.code = code or _CODES.get(status_code, "error")
        self.headers = headers


def error_response(status_code: int, message: str, code: str | None = None, *,
                   headers: dict[str, str] | None = None, **extra: object) -> JSONResponse:
    """The one JSON error shape of this API."""
    body: dict[str, object] = {"error": code or _CODES.get(status_code, "error"),
                               "message": message.splitlines()[0][:500] if message else ""}
    body.update(extra)
    return JSONResponse(body, status_code=status_code, headers=headers)
