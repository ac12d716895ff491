"""``/healthz`` says how the pass under test is isolated where this process runs it (issue 31)."""

from __future__ import annotations

from typing import Any

import pytest

from workers import sandbox as sb


@pytest.mark.parametrize(("mode", "probe", "want"), [
    ("auto", None, "full"), ("auto", "unshare: EPERM", "best-effort"), ("best-effort", None, "best-effort"),
    ("require", None, "full"), ("require", "unshare: EPERM", "refused")])
def test_embedded_healthz_reports_the_sandbox_of_its_own_pool(make_settings: Any, monkeypatch: pytest.MonkeyPatch,
                                                              mode: str, probe: str | None, want: str) -> None:
    from fastapi.testclient import TestClient

    from service.api.app import create_app

    monkeypatch.setattr(sb, "full_sandbox_error", lambda policy: probe)
    settings = make_settings(sandbox=mode, broker_url="")
    with TestClient(create_app(settings, background=False), raise_server_exceptions=False) as c:
        assert c.get("/healthz").json()["sandbox"] == want


def test_served_healthz_leaves_the_sandbox_to_the_workers(make_settings: Any) -> None:
    from fastapi.testclient import TestClient

    from service.api.app import create_app

    settings = make_settings(broker_url="redis://127.0.0.1:1/0")
    with TestClient(create_app(settings, background=False), raise_server_exceptions=False) as c:
        assert c.get("/healthz").json()["sandbox"] == "workers"
