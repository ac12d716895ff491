"""The FastAPI application: ``create_app(settings)``.

Routes: ``POST /webhooks/github``, ``GET /healthz``, JSON read endpoints under ``/api`` (runs, a
run with its cells, results, regressions, history, deliveries), write endpoints under ``/api``
(bearer token), the OpenAPI schema at ``/openapi.json`` (no ``/docs`` or ``/redoc``: FastAPI's
pages load Swagger UI / ReDoc scripts from a public CDN, which offline deployments cannot reach and
the CSP forbids), and ``/runs/{id}``, the run page linked from commit statuses (a redirect to the
JSON unless a dashboard router provides it).

Guarantees: the app refuses to be built without ``AMPCI_WEBHOOK_SECRET`` unless
``AMPCI_INSECURE_DEV`` is set; every error is a JSON body with a 4xx/5xx status (no HTML, no
traceback); every response carries the security headers of :mod:`service.api.headers` (CSP
without script, no framing, nosniff, no referrer); the commit-status poster and the webhook intake (pending deliveries → runs, see
:mod:`service.github.intake`) run on background threads for the app's lifetime.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import APIRouter, FastAPI
from fastapi.responses import RedirectResponse

from service.api import routes_health, routes_read, routes_webhook, routes_write
from service.api.context import AppContext, Probe, broker_probe, database_probe
from service.api.dispatch import RunDispatcher
from service.api.edge import EdgeCounters, EdgeGuard
from service.api.errors import install_error_handlers
from service.api.headers import SecurityHeaders
from service.github.reporter import StatusReporter
from service.github.webhook import WebhookProcessor, check_webhook_config
from service.json_types import JsonObject
from service.settings import Settings

if TYPE_CHECKING:
    from service.db.store import Store

log = logging.getLogger(__name__)

_FROZEN = False  # gc.freeze() done in this process (once is enough)

ERROR_SCHEMA = {"type": "object", "required": ["error", "message"],
                "properties": {"error": {"type": "string"}, "message": {"type": "string"},
                               "detail": {"type": "array", "items": {"type": "object"}}}}


def create_app(settings: Settings, *, store: Store | None = None, dispatcher: RunDispatcher | None = None,
               reporter: StatusReporter | None = None, database_check: Probe | None = None,
               broker_check: Probe | None = None, dashboard: APIRouter | None = None,
               background: bool = True) -> FastAPI:
    """Build the app for ``settings``; the other arguments replace the defaults (tests, embedding).

    ``store`` defaults to a Store of ``settings.effective_database_url`` whose engine holds at most
    ``AMPCI_DB_POOL_SIZE + AMPCI_DB_MAX_OVERFLOW`` connections (schema assumed at
    head: ``ampci serve`` upgrades it first); ``background=False`` keeps the status poster and the
    webhook intake off (pending deliveries then wait for ``ctx.webhook.intake.drain()``).
    """
    check_webhook_config(settings)
    if store is None:
        from service.db import Store
        from service.db.engine import make_engine

        store = Store(make_engine(settings.effective_database_url, **settings.db_pool()))
    dispatcher = dispatcher or RunDispatcher(settings, store)
    reporter = reporter or StatusReporter.from_settings(settings, store=store)
    if reporter.store is None:
        reporter.store = store
    ctx = AppContext(settings=settings, store=store, dispatcher=dispatcher, reporter=reporter,
                     webhook=WebhookProcessor(settings, store, dispatcher, reporter),
                     database_probe=database_check or database_probe(store),
                     broker_probe=broker_check or broker_probe(settings))

    intake = ctx.webhook.intake

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if background and reporter.enabled:
            try:
                reporter.recover(store)
            except Exception:  # noqa: BLE001 - a down database must not stop the server starting
                log.exception("could not recover unfinished webhook runs for status reporting")
            reporter.start()
        if background and settings.embedded and getattr(dispatcher, "mode", None) == "local":
            _resume_local_jobs(settings)  # jobs of local runs an earlier (stopped or dead) process left
        if background:
            intake.start()  # first picks up deliveries an earlier process left pending
            # What start-up allocated (modules, compiled statements, the app) lives as long as the
            # process: keep it out of the collector's full passes, which otherwise pause requests.
            global _FROZEN
            if not _FROZEN:
                _FROZEN = True
                gc.collect()
                gc.freeze()
        try:
            yield
        finally:
            intake.stop()
            reporter.stop()
            if background and settings.embedded:  # hand running/queued local jobs back (resumed next start)
                _stop_local_pools()

    app = FastAPI(title="ampci", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Mixed-precision regression CI: GitHub webhook and JSON API.")
    app.state.ctx = ctx
    app.state.edge_counters = EdgeCounters()
    app.add_middleware(SecurityHeaders)
    app.add_middleware(EdgeGuard, settings=settings)  # outermost: HEAD, token before body, body limit
    install_error_handlers(app)
    app.include_router(routes_webhook.router)
    app.include_router(routes_health.router)
    app.include_router(routes_read.router)
    app.include_router(routes_write.router)
    if dashboard is None:  # the HTML dashboard (service/dashboard); the redirect below if it cannot load
        try:
            from service.dashboard import dashboard_router

            dashboard = dashboard_router()
        except ImportError as exc:
            log.warning("dashboard disabled (%s); /runs/{id} redirects to the JSON API", exc)
    if dashboard is not None:
        app.include_router(dashboard)
    else:
        @app.get("/runs/{run_id}", include_in_schema=False)
        def run_page(run_id: routes_read.Id) -> RedirectResponse:
            return RedirectResponse(f"/api/runs/{run_id}", status_code=307)

    _add_error_schema(app)
    return app


def _stop_local_pools() -> int:
    """Shut down this process's embedded pools (:meth:`LocalPool.shutdown`: the running job re-queued,
    the queued ones left for the next process, their runs released); how many were stopped."""
    import os

    from service.api import dispatch

    stopped = 0
    for (pid, _), pool in list(dispatch._LOCAL_POOLS.items()):
        if pid == os.getpid():
            pool.shutdown()
            stopped += 1
    return stopped


def _resume_local_jobs(settings: Settings) -> None:
    """Submit the jobs of ``local`` runs whose owning process stopped or died to this process's pool
    (:func:`service.orchestration.orphans.resume_orphans`); a failure is logged, never fatal."""
    try:
        from service.api.dispatch import local_pool
        from service.orchestration.orphans import resume_orphans

        pool = local_pool(settings)
        taken = resume_orphans(pool.store, pool)
        if taken:
            log.warning("resumed the jobs of %d local run(s) left by a stopped process: %s", len(taken),
                        "; ".join(o.describe() for o in taken[:10]))
    except Exception as exc:  # noqa: BLE001 - a down database must not stop the server starting
        log.warning("could not resume local jobs left by an earlier process: %s: %s", type(exc).__name__,
                    str(exc).splitlines()[0][:200] if str(exc) else "")


def _add_error_schema(app: FastAPI) -> None:
    """Publish the JSON error shape in the OpenAPI components (referenced by the webhook route)."""
    original = app.openapi

    def openapi() -> JsonObject:
        if app.openapi_schema is None:
            schema = original()
            schema.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend the schema


def app_from_env() -> FastAPI:
    """``create_app(Settings.from_env())``: the factory uvicorn workers import (``ampci serve --workers``)."""
    return create_app(Settings.from_env())
