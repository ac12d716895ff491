"""Translate errors into JSON responses at the HTTP boundary (STYLE habit 8).

Every error response has the body ``{"error": CODE, "message": ONE_LINE}`` (plus ``detail`` for
validation errors).  User errors are 4xx, an unreachable database is 503, and anything else is our
bug: 500 with a generic message (the traceback goes to the log, not to the client).  A client that
hangs up before its body was read and a database that is down are each one WARNING line with a
running count (``app.state.edge_counters``), never a traceback per request.
"""

from __future__ import annotations

import logging
from typing import TypedDict

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from service.db.errors import DATABASE_DOWN, VALUE_REFUSED, driver_message
from service.errors import DatabaseUnavailableError, NotFoundError, UserError
from service.github.events import RepositoryNotAllowedError
from service.web.errors import ApiError, error_response

log = logging.getLogger(__name__)


class ValidationIssue(TypedDict):
    """One entry of a 422 answer's ``detail``: where (the path of names), what, and pydantic's error type."""

    loc: list[str]
    msg: str
    type: str


def _validation_detail(exc: RequestValidationError) -> list[ValidationIssue]:
    out: list[ValidationIssue] = []
    for err in exc.errors()[:20]:
        out.append({"loc": [str(p) for p in err.get("loc", ())], "msg": str(err.get("msg", ""))[:200],
                    "type": str(err.get("type", ""))})
    return out


def _count(request: Request, name: str) -> int:
    """Bump the app's :class:`service.api.edge.EdgeCounters` ``name``; its new value (0 without one)."""
    counters = getattr(request.app.state, "edge_counters", None)
    return counters.bump(name) if counters is not None else 0


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers so that no request ends in an HTML page or an unhandled 500."""

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status_code, str(exc), exc.code, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        detail = _validation_detail(exc)
        first = detail[0] if detail else ValidationIssue(loc=[], msg="invalid request", type="")
        where = ".".join(str(p) for p in first["loc"])
        return error_response(422, f"{where}: {first['msg']}" if where else str(first["msg"]),
                              detail=detail)

    @app.exception_handler(RepositoryNotAllowedError)
    async def _forbidden(_: Request, exc: RepositoryNotAllowedError) -> JSONResponse:
        return error_response(403, str(exc))

    @app.exception_handler(NotFoundError)
    async def _not_found(_: Request, exc: NotFoundError) -> JSONResponse:
        return error_response(404, str(exc))

    @app.exception_handler(UserError)
    async def _user_error(_: Request, exc: UserError) -> JSONResponse:
        return error_response(400, str(exc))

    async def _bad_value(_: Request, exc: Exception) -> JSONResponse:
        # a value the database cannot hold (out-of-range number, NUL byte) is the client's input
        return error_response(400, "a value in the request cannot be stored or compared: "
                              + driver_message(exc).splitlines()[0][:200])

    async def _db_error(request: Request, exc: Exception) -> JSONResponse:
        n = _count(request, "database_errors")
        log.warning("database error on %s %s (%d so far): %s", request.method, request.url.path, n,
                    str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__)
        return error_response(503, "database unavailable or overloaded; try again")

    for refused in VALUE_REFUSED:
        app.add_exception_handler(refused, _bad_value)
    for down in DATABASE_DOWN:
        app.add_exception_handler(down, _db_error)

    @app.exception_handler(DatabaseUnavailableError)
    async def _db_down(request: Request, exc: DatabaseUnavailableError) -> JSONResponse:
        n = _count(request, "database_errors")
        log.warning("database unavailable on %s %s (%d so far): %s", request.method, request.url.path, n,
                    str(exc).splitlines()[0][:300])
        return error_response(503, str(exc))

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, _: ClientDisconnect) -> Response:
        n = _count(request, "client_disconnects")
        log.warning("client disconnected before its request was read: %s %s (%d so far)",
                    request.method, request.url.path, n)
        return Response(status_code=400)  # nobody reads it

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal error (logged on the server)", "internal")
