"""The HTTP service: GitHub webhook, JSON API and health check (``create_app(settings)``)."""

from __future__ import annotations

from service.api.app import create_app

__all__ = ["create_app"]
