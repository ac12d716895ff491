"""The web dashboard served by ``ampci serve``: runs, the run matrix, cell history plots, regressions.

``dashboard_router()`` returns the FastAPI router that :func:`service.api.app.create_app` mounts.
Pages are rendered on the server (Jinja2 templates, pygal SVG plots) and need no JavaScript;
nothing is fetched from outside the service.  See :mod:`service.dashboard.routes` for the routes.
"""

from __future__ import annotations

from fastapi import APIRouter


def dashboard_router() -> APIRouter:
    """The dashboard's router (HTML pages, the triage form and the stylesheet)."""
    from service.dashboard.routes import router

    return router


__all__ = ["dashboard_router"]
