"""The web floor's tests drive its parameters through the API app and the dashboard: they share the API
tests' fixtures (a migrated PostgreSQL store, an isolated Celery queue, settings and a TestClient factory)."""

from tests.service.api.conftest import make_client, make_settings, queue, store

__all__ = ["make_client", "make_settings", "queue", "store"]
