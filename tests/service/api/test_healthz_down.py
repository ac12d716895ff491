"""``/healthz`` names the dependency that is down (``down``), with and without the details."""

from __future__ import annotations

from typing import Any

import pytest

from tests.service.api.helpers import API_TOKEN

AUTH = {"Authorization": f"Bearer {API_TOKEN}"}


@pytest.mark.parametrize(("broken", "down"), [
    ({}, []),
    ({"broker_url": "redis://127.0.0.1:1/0"}, ["broker"]),
    ({"database_url": "postgresql+psycopg://ampci:wrong@127.0.0.1:1/ampci"}, ["database"]),
    ({"broker_url": "redis://127.0.0.1:1/0", "database_url": "postgresql+psycopg://ampci:pw@127.0.0.1:1/x"},
     ["database", "broker"]),
])
@pytest.mark.parametrize("token_required", [False, True])
def test_healthz_says_which_dependency_is_down(make_settings: Any, broken: dict[str, str], down: list[str],
                                                token_required: bool) -> None:
    from fastapi.testclient import TestClient

    from service.api.app import create_app

    settings = make_settings(read_token_required=token_required, github_token="", **broken)
    with TestClient(create_app(settings, background=False), raise_server_exceptions=False) as c:
        anonymous, allowed = c.get("/healthz"), c.get("/healthz", headers=AUTH)
    for resp in (anonymous, allowed):
        assert resp.status_code == (503 if down else 200), resp.text
        assert resp.json()["down"] == down
        assert resp.json()["status"] == ("unavailable" if down else "ok")
    assert allowed.json()["database"]["ok"] is ("database" not in down)
    assert allowed.json()["broker"]["ok"] is ("broker" not in down)
    assert "wrong" not in allowed.text
