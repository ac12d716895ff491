"""Security headers on every response, no CDN-loading docs page, and /healthz details only for callers
allowed to read (never a password)."""

from __future__ import annotations

from typing import Any

from service.api.headers import CSP
from tests.service.api.helpers import API_TOKEN, encode, push_payload, sha, webhook_headers

AUTH = {"Authorization": f"Bearer {API_TOKEN}"}


def _directives(csp: str) -> dict[str, str]:
    return {d.strip().split(" ", 1)[0]: d.strip().partition(" ")[2] for d in csp.split(";") if d.strip()}


def _assert_secure(resp: Any, what: str) -> None:
    h = resp.headers
    policy = _directives(h.get("content-security-policy", ""))
    assert policy.get("default-src") == "'self'" and policy.get("frame-ancestors") == "'none'", (what, h)
    assert policy.get("script-src") == "'none'" and policy.get("object-src") == "'none'", (what, h)
    assert h.get("x-frame-options") == "DENY" and h.get("x-content-type-options") == "nosniff", (what, h)
    assert h.get("referrer-policy") == "no-referrer", (what, h)


def test_every_kind_of_response_carries_the_security_headers(make_client: Any) -> None:
    client = make_client()
    body = encode(push_payload(sha("hdr")))
    responses = {
        "dashboard page": client.get("/runs", headers={"Accept": "text/html"}),
        "dashboard 404": client.get("/runs/999", headers={"Accept": "text/html"}),
        "dashboard css": client.get("/dashboard.css"),
        "api json": client.get("/api/runs"),
        "api 422": client.get("/api/runs?limit=x"),
        "api 401": client.post("/api/runs", json={}),
        "unknown path": client.get("/nope"),
        "openapi": client.get("/openapi.json"),
        "healthz": client.get("/healthz"),
        "webhook": client.post("/webhooks/github", content=body, headers=webhook_headers(body, "push")),
        "redirect": client.get("/runs/1"),
    }
    for what, resp in responses.items():
        assert resp.status_code < 500, (what, resp.status_code)
        _assert_secure(resp, what)
    assert responses["dashboard page"].status_code == 200 and responses["webhook"].status_code == 202


def test_docs_pages_are_not_served_and_the_schema_is(make_client: Any) -> None:
    client = make_client()
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        assert client.get(path).status_code == 404, path
    schema = client.get("/openapi.json")
    assert schema.status_code == 200 and "/api/runs" in schema.json()["paths"]
    assert "cdn" not in schema.text.lower()


def test_the_dashboard_needs_nothing_the_policy_forbids(make_client: Any) -> None:
    """No page relies on a script (script-src 'none') nor on another origin (default-src 'self')."""
    html = make_client().get("/runs", headers={"Accept": "text/html"}).text
    assert "<script" not in html.lower() and "http://" not in html and "https://" not in html
    assert "'unsafe-inline'" not in _directives(CSP)["script-src"]


def test_healthz_hides_details_from_anonymous_callers_when_reads_need_a_token(make_settings: Any) -> None:
    from fastapi.testclient import TestClient

    from service.api.app import create_app

    settings = make_settings(read_token_required=True, broker_url="redis://:s3cret-pw@127.0.0.1:1/0",
                             github_token="")
    with TestClient(create_app(settings, background=False), raise_server_exceptions=False) as c:
        anonymous = c.get("/healthz")
        wrong = c.get("/healthz", headers={"Authorization": "Bearer nope"})
        allowed = c.get("/healthz", headers=AUTH)
    for resp in (anonymous, wrong):
        body = resp.json()
        assert resp.status_code == 503 and body == {"status": "unavailable", "down": ["broker"],
                                                    "sandbox": body.get("sandbox"), "canary": body.get("canary")}
        assert body["sandbox"] in {"full", "best-effort", "refused", "workers"}
        # the canary's verdict only (null where this process ran none), never its reason, paths or timing
        assert body["canary"] is None or set(body["canary"]) == {"ok"}, resp.text
    assert allowed.status_code == 503 and allowed.json()["broker"]["ok"] is False
    assert "127.0.0.1" in allowed.json()["database"]["detail"] and "s3cret-pw" not in allowed.text
    settings = make_settings(broker_url="redis://:s3cret-pw@127.0.0.1:1/0", github_token="")
    with TestClient(create_app(settings, background=False), raise_server_exceptions=False) as c:
        open_health = c.get("/healthz")  # reads open: details for everyone, still no password
    assert "database" in open_health.json() and "s3cret-pw" not in open_health.text


def test_redact_url_hides_passwords_with_and_without_a_user() -> None:
    from service.settings import redact_url

    assert redact_url("redis://:pw@h:6379/0") == "redis://:***@h:6379/0"
    assert redact_url("postgresql+psycopg://u:pw@h/db") == "postgresql+psycopg://u:***@h/db"
    assert redact_url("redis://h:6379/0") == "redis://h:6379/0"
