"""``GET /healthz``: database and broker reachability (200 when both are reachable, else 503).

``down`` lists the unreachable dependencies by name (``["database"]``, ``["broker"]``, both, or
none) in every answer, so a load balancer or ``docker compose ps`` user sees which one failed
without the details.

``sandbox`` says how the pass is isolated where this process runs it, and ``canary`` how this process's sandbox
canary conversion went (:mod:`workers.revision.canary`: ``ok``, the one-line ``reason``, ``ran_at``, ``seconds``; null
where none ran in this process: a served API whose Celery workers check their own, or ``serve --workers N``);
a failed canary makes the answer 503 with ``sandbox`` in ``down``: no job could convert.

Open to everyone (load balancers probe it without a token).  With ``AMPCI_READ_TOKEN_REQUIRED``
a caller without the API token gets only ``{"status": "ok"|"unavailable"}``: the details name the
database and broker URLs.  Details never carry a password (URLs are shown with ``***``).
"""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from service.api.context import app_context
from service.json_types import JsonObject
from service.settings import redact_url
from service.web.auth import check_token
from service.web.errors import ApiError

router = APIRouter(tags=["health"])


def _may_see_details(request: Request) -> bool:
    settings = app_context(request).settings
    if not settings.read_token_required:
        return True
    try:
        check_token(settings, request)
    except ApiError:
        return False
    return True


@router.get("/healthz", summary="Database and broker reachability")
async def healthz(request: Request) -> JSONResponse:
    ctx = app_context(request)
    db_ok, db_detail = await run_in_threadpool(ctx.database_probe)
    br_ok, br_detail = await run_in_threadpool(ctx.broker_probe)
    canary = _canary()
    sb_ok = canary is None or canary["ok"] is True
    ok = db_ok and br_ok and sb_ok
    status = "ok" if ok else "unavailable"
    down = [name for name, up in (("database", db_ok), ("broker", br_ok), ("sandbox", sb_ok)) if not up]
    sandbox = await run_in_threadpool(_sandbox_mode, ctx)
    if not _may_see_details(request):
        return JSONResponse({"status": status, "down": down, "sandbox": sandbox,
                             "canary": None if canary is None else {"ok": canary["ok"]}},
                            status_code=200 if ok else 503)
    body = {"status": status, "down": down, "sandbox": sandbox, "canary": canary,
            "sandbox_cgroup": await run_in_threadpool(_sandbox_cgroup, sandbox),
            "database": {"ok": db_ok, "detail": redact_url(db_detail)},
            "broker": {"ok": br_ok, "detail": redact_url(br_detail)},
            "status_outbox": {"enabled": ctx.reporter.enabled}}
    return JSONResponse(body, status_code=200 if ok else 503)


def _sandbox_mode(ctx: object) -> str:
    """How the pass under test is isolated where this process runs it (embedded mode: its own pool): ``full``,
    ``best-effort``, or ``refused`` (AMPCI_SANDBOX=require on a host that cannot make it: jobs end as crashes
    saying so); ``workers`` when a broker is configured (the Celery workers run the pass, each result's
    ``environment.sandbox`` says how)."""
    from workers.sandbox.policy import SandboxUnavailable, resolve_mode

    settings = getattr(ctx, "settings", None)
    if settings is None:
        return "unknown"
    if not settings.embedded:
        return "workers"
    try:
        return resolve_mode(settings.worker_config().sandbox_policy())
    except SandboxUnavailable:
        return "refused"


def _sandbox_cgroup(sandbox: str) -> str | None:
    """The per-job cgroup limits this process's own pool gets (:func:`workers.sandbox.policy.cgroup_limits`: which,
    or the one line saying which the host does not offer); None where the workers run the pass."""
    if sandbox not in ("full", "best-effort"):
        return None
    from workers.sandbox.policy import cgroup_limits

    return cgroup_limits()


def _canary() -> JsonObject | None:
    """This process's latest sandbox canary (:func:`workers.revision.canary.last`) as JSON, or None when none ran."""
    from workers.revision.canary import last

    got = last()
    if got is None:
        return None
    return {"ok": got.ok, "reason": got.reason, "sandbox": got.sandbox, "seconds": round(got.seconds, 3),
            "ran_at": datetime.fromtimestamp(got.ran_at, UTC).isoformat(timespec="seconds")}
