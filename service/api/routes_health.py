"""``GET /healthz``: database and broker reachability (200 when both are reachable, else 503)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Database and broker reachability")
async def healthz(request: Request) -> JSONResponse:
    ctx = request.app.state.ctx
    db_ok, db_detail = await run_in_threadpool(ctx.database_probe)
    br_ok, br_detail = await run_in_threadpool(ctx.broker_probe)
    ok = db_ok and br_ok
    body = {"status": "ok" if ok else "unavailable",
            "database": {"ok": db_ok, "detail": db_detail},
            "broker": {"ok": br_ok, "detail": br_detail},
            "status_outbox": {"enabled": ctx.reporter.enabled}}
    return JSONResponse(body, status_code=200 if ok else 503)
