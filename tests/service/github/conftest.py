"""The github floor's tests drive the webhook and the reporter through the API app: they share the API
tests' fixtures (a migrated PostgreSQL store, an isolated Celery queue, settings and a TestClient factory)."""

from tests.service.api.conftest import make_client, make_settings, queue, store

__all__ = ["make_client", "make_settings", "queue", "store"]
