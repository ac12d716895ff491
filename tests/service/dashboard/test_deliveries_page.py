"""The dashboard lists webhook deliveries, so a rejected or failed one (with its reason) is visible there too,
not only in ``/api/deliveries`` and ``ampci deliveries``."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.service.dashboard.conftest import BROWSER, make_app
from tests.service.factories import migrated_store


@pytest.fixture
def client(db_url: str) -> Any:
    store = migrated_store(db_url)
    store.record_delivery("d-ok", "push", "accepted")
    store.record_delivery("d-bad", "push", "rejected", reason="ref contains a control character <b>")
    store.record_delivery("d-dead", "push", "failed", reason="gave up after 5 attempts")
    with TestClient(make_app(store, db_url), raise_server_exceptions=False, headers=BROWSER) as c:
        yield c
    store.dispose()


def test_deliveries_page_shows_status_and_reason(client: Any) -> None:
    page = client.get("/deliveries")
    assert page.status_code == 200
    for did in ("d-ok", "d-bad", "d-dead"):
        assert f'data-delivery-id="{did}"' in page.text
    assert "ref contains a control character &lt;b&gt;" in page.text  # escaped
    assert "gave up after 5 attempts" in page.text


def test_deliveries_page_filters_by_status(client: Any) -> None:
    page = client.get("/deliveries", params={"status": "failed"})
    assert page.status_code == 200
    assert 'data-delivery-id="d-dead"' in page.text and 'data-delivery-id="d-ok"' not in page.text
    bad = client.get("/deliveries", params={"status": "bogus"})
    assert bad.status_code == 400 and "unknown delivery status" in bad.text
    assert client.get("/deliveries", params={"limit": "²"}).status_code == 400
    assert 'href="/deliveries"' in client.get("/runs").text  # reachable from the navigation
