"""``/healthz`` says how the pass under test is isolated where this process runs it (issue 31), and how its sandbox
canary went (issue 39)."""

from __future__ import annotations

from typing import Any

import pytest

from workers.revision import canary
from workers.sandbox import policy as sb


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


@pytest.mark.parametrize("max_procs", [64, 1], ids=["healthy", "failed"])
@pytest.mark.skipif(sb.full_sandbox_error(sb.SandboxPolicy()) is not None, reason="no full sandbox here")
def test_healthz_shows_the_canary(make_settings: Any, max_procs: int) -> None:
    from fastapi.testclient import TestClient

    from service.api.app import create_app

    """A canary that failed (its sandbox cannot fork a conversion: ``sandbox_max_procs=1``) makes ``/healthz``
    503 with ``sandbox`` down and its one line; a healthy one is 200 with it ``ok``."""
    settings = make_settings(broker_url="", sandbox="require", sandbox_max_procs=max_procs)
    try:
        ran = canary.run_canary(settings.worker_config().sandbox_policy())
        assert ran.ok is (max_procs > 1), ran
        with TestClient(create_app(settings, background=False), raise_server_exceptions=False) as c:
            got = c.get("/healthz")
        body = got.json()
        assert body["canary"]["ok"] is ran.ok and body["canary"]["reason"] == ran.reason
        assert body["canary"]["ran_at"].startswith("20") and body["canary"]["sandbox"] == "full"
        assert got.status_code == (200 if ran.ok else 503) and ("sandbox" in body["down"]) is not ran.ok
    finally:
        canary.forget()


def test_a_missing_cgroup_controller_is_one_line_in_healthz(make_settings: Any,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 40: where the host offers no per-job cgroup limit of a controller, ``sandbox_cgroup`` says so."""
    from fastapi.testclient import TestClient

    from service.api.app import create_app

    cgl = sb.loader()._cgl
    monkeypatch.setattr(sb, "full_sandbox_error", lambda policy: None)
    monkeypatch.setattr(cgl, "available", lambda: {"pids": None, "memory": "cgroup v2"})
    with TestClient(create_app(make_settings(sandbox="require", broker_url=""), background=False),
                    raise_server_exceptions=False) as c:
        assert c.get("/healthz").json()["sandbox_cgroup"] == cgl.note({"pids": None, "memory": "cgroup v2"})
    monkeypatch.setattr(cgl, "available", lambda: {"pids": "cgroup v1", "memory": "cgroup v2"})
    with TestClient(create_app(make_settings(sandbox="require", broker_url=""), background=False),
                    raise_server_exceptions=False) as c:
        assert c.get("/healthz").json()["sandbox_cgroup"] == "per job: pids (cgroup v1), memory (cgroup v2)"
