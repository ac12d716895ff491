"""Issue 24 at the HTTP edge: nothing stored for strangers, the token before the body, a body limit and a
body deadline everywhere, HEAD on every GET route, lone surrogates replaced, replays of a signed body
leading to its first run, strict types, and one WARNING line (no traceback) per client that hangs up
or per request meeting a database outage.

Requests that a test client cannot send (headers without their body, a body that never ends, a client
that hangs up half way) are played as raw ASGI calls against the same app, counting what the app read.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from tests.service.api.helpers import (
    API_TOKEN,
    REPO,
    SECRET,
    drain,
    encode,
    pr_payload,
    push_payload,
    sha,
    webhook_headers,
)

pytestmark = [pytest.mark.postgres, pytest.mark.redis]
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}


class Played:
    """The outcome of one raw ASGI request: status, body, and how many body chunks the app pulled."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.body = b""
        self.pulled = 0


def play(app: Any, method: str, path: str, headers: dict[str, str], chunks: Iterator[bytes] | None = None,
         *, hang: bool = False, disconnect: bool = False, timeout: float = 20.0) -> Played:
    """Send one request to ``app``: ``chunks`` (lazily, counted) as the body; ``hang``: after them the
    client sends nothing more, ever; ``disconnect``: after them the client hangs up."""
    out = Played()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "client": ("127.0.0.1", 5000), "server": ("testserver", 80),
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    pending = iter(chunks or iter([b""]))
    done = False

    async def receive() -> dict[str, Any]:
        nonlocal done
        if not done:
            try:
                chunk = next(pending)
                out.pulled += 1
                return {"type": "http.request", "body": chunk, "more_body": True}
            except StopIteration:
                done = True
                if not hang and not disconnect:
                    return {"type": "http.request", "body": b"", "more_body": False}
        if hang:
            await asyncio.sleep(3600)
        if disconnect:
            return {"type": "http.disconnect"}
        await asyncio.sleep(3600)  # a finished request: the disconnect comes when the client leaves
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            out.status = message["status"]
            out.headers = {k.decode().lower(): v.decode() for k, v in message.get("headers", [])}
        elif message["type"] == "http.response.body":
            out.body += message.get("body", b"")

    async def main() -> None:
        await asyncio.wait_for(app(scope, receive, send), timeout)

    asyncio.run(main())
    return out


def _megabytes(n: int) -> Iterator[bytes]:
    block = b"[" + b" " * (1024 * 1024 - 1)
    for _ in range(n):
        yield block


# -- item 1: unsigned requests store nothing ------------------------------------------------------------

def test_unsigned_oversize_headers_only_are_401_and_store_nothing(make_client, make_settings, store):
    client = make_client(make_settings(max_body_bytes=2048))
    for i in range(20):  # headers announcing a big body, the body never sent
        got = play(client.app, "POST", "/webhooks/github",
                   {"content-type": "application/json", "content-length": "5000000", "x-github-event": "push",
                    "x-github-delivery": f"d-unsigned-{i}"}, iter(()), hang=True, timeout=5)
        assert got.status == 401 and got.pulled == 0, (got.status, got.body)
    body = encode(push_payload(sha("unsigned-big")))
    resp = client.post("/webhooks/github", content=body + b" " * 4096,
                       headers=webhook_headers(body, "push", secret=None, delivery="d-unsigned-sent"))
    assert resp.status_code == 401
    bad = client.post("/webhooks/github", content=body + b" " * 4096,
                      headers=webhook_headers(body, "push", delivery="d-badsig", signature="sha256=zz"))
    assert bad.status_code == 401
    assert store.list_deliveries(limit=1000) == []
    assert client.get("/api/deliveries?status=rejected").json()["deliveries"] == []


# -- item 2: the token before the body, a body limit on /api ---------------------------------------------

def test_api_write_without_token_is_401_before_reading_the_body(make_client):
    client = make_client()
    got = play(client.app, "POST", "/api/runs", {"content-type": "application/json",
                                                 "transfer-encoding": "chunked"}, _megabytes(100))
    assert got.status == 401 and got.pulled == 0 and got.headers["www-authenticate"].startswith("Bearer")
    deep = b"[" * 100_000
    resp = client.post("/api/runs", content=deep, headers={"content-type": "application/json"})
    assert resp.status_code == 401 and resp.json()["error"] == "unauthorized"
    wrong = client.post("/api/runs", content=deep, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401


def test_api_body_over_the_limit_is_413_declared_or_streamed(make_client, make_settings):
    client = make_client(make_settings(max_body_bytes=64 * 1024))
    declared = play(client.app, "POST", "/api/runs", {**{k.lower(): v for k, v in AUTH.items()},
                                                      "content-type": "application/json",
                                                      "content-length": str(20 * 1024 * 1024)}, _megabytes(20))
    assert declared.status == 413 and declared.pulled == 0
    streamed = play(client.app, "POST", "/api/runs", {**{k.lower(): v for k, v in AUTH.items()},
                                                      "content-type": "application/json"},
                    (b" " * 16384 for _ in range(10_000)))
    assert streamed.status == 413 and json.loads(streamed.body)["error"] == "too_large"
    assert streamed.pulled <= 5  # cut off at the limit (4 x 16 KiB), not read to the end
    ok = client.post("/api/runs", json={"revision": "a" * 40, "extra": 1}, headers=AUTH)
    assert ok.status_code == 422  # under the limit the route still decides


def test_a_body_that_never_arrives_is_408_after_the_body_timeout(make_client, make_settings):
    client = make_client(make_settings(http_body_timeout=0.5))
    got = play(client.app, "POST", "/api/runs", {**{k.lower(): v for k, v in AUTH.items()},
                                                 "content-type": "application/json", "content-length": "100"},
               iter([b"{"]), hang=True, timeout=10)
    assert got.status == 408 and json.loads(got.body)["error"] == "timeout"


# -- item 3: lone surrogates replaced --------------------------------------------------------------------

def test_lone_surrogates_in_free_text_are_replaced_not_refused(make_client, store):
    client = make_client()
    payload = push_payload(sha("surrogate"))
    payload["commits"][0]["message"] = "fix \ud800 paint"
    payload["commits"][0]["author"]["name"] = "De\udc00v"
    payload["head_commit"]["message"] = "fix \ud800 paint"
    body = json.dumps(payload).encode()  # ensure_ascii: the surrogate travels as the escape \ud800
    assert b"\\ud800" in body
    resp = client.post("/webhooks/github", content=body, headers=webhook_headers(body, "push"))
    assert resp.status_code == 202, resp.text
    pr = pr_payload(sha("surrogate-pr"), sha("surrogate-base"))
    pr["pull_request"]["title"] = "\udfff title"
    pr["pull_request"]["user"]["login"] = "\ud83d"
    pr_body = json.dumps(pr).encode()
    assert client.post("/webhooks/github", content=pr_body,
                       headers=webhook_headers(pr_body, "pull_request")).status_code == 202
    assert drain(client) == 2
    rev = store.get_revision(sha("surrogate"))
    assert rev.message == "fix \ufffd paint" and "\ufffd" in rev.author
    assert len(store.list_runs()) == 2


def test_api_free_text_is_normalised_too():
    from service.api.routes_write import Triage

    got = Triage.model_validate({"by": "a\udc00\x00b", "note": "n\x00o\ud800te"})
    assert got.by == "a\ufffdb" and got.note == "no\ufffdte"


# -- item 9: replays ------------------------------------------------------------------------------------

def _queued(redis_url: str, queue: str) -> int:
    import redis

    return int(redis.Redis.from_url(redis_url).llen(queue))


def test_a_signed_body_replayed_under_new_delivery_ids_leads_to_its_first_run(make_client, store, redis_url, queue):
    client = make_client()
    body = encode(push_payload(sha("replayed")))
    ids = ["d-replay-1", "d-replay-2", "d-replay-3"]
    for d in ids[:2]:
        assert client.post("/webhooks/github", content=body,
                           headers=webhook_headers(body, "push", delivery=d)).status_code == 202
    drain(client)
    fresh = encode(push_payload(sha("fresh")))  # a new run in the same batch as the last replay
    assert client.post("/webhooks/github", content=fresh,
                       headers=webhook_headers(fresh, "push", delivery="d-fresh")).status_code == 202
    assert client.post("/webhooks/github", content=body,
                       headers=webhook_headers(body, "push", delivery=ids[2])).status_code == 202
    drain(client)
    got = [store.get_delivery(d) for d in ids]
    assert {g.status for g in got} == {"accepted"} and len({g.run_id for g in got}) == 1
    assert len(store.list_runs()) == 2
    assert "replay" in got[1].reason and "replay" in got[2].reason and "replay" not in got[0].reason
    assert _queued(redis_url, queue) == 2 * 4  # each run's jobs sent once, not again per replay
    other = encode(push_payload(sha("replayed"), before=sha("another-before")))  # another event, same head
    assert client.post("/webhooks/github", content=other,
                       headers=webhook_headers(other, "push", delivery="d-other")).status_code == 202
    drain(client)
    assert len(store.list_runs()) == 3


# -- item 10: strict types ------------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["top", "pull_request"])
def test_a_boolean_is_not_a_pull_request_number(make_client, store, where):
    client = make_client()
    payload = pr_payload(sha(f"bool-{where}"), sha("bool-base"))
    (payload if where == "top" else payload["pull_request"])["number"] = True
    body = encode(payload)
    resp = client.post("/webhooks/github", content=body, headers=webhook_headers(body, "pull_request"))
    assert resp.status_code == 400 and "number" in resp.json()["message"], resp.text


def test_push_flags_must_be_booleans(make_client):
    client = make_client()
    body = encode(push_payload(sha("flags"), forced="false"))
    resp = client.post("/webhooks/github", content=body, headers=webhook_headers(body, "push"))
    assert resp.status_code == 400 and "forced" in resp.json()["message"]


# -- item 8: HEAD ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/", "/api/runs", "/healthz", "/dashboard.css", "/openapi.json", "/deliveries"])
def test_head_answers_like_get_without_a_body(make_client, path):
    client = make_client()
    get = client.get(path)
    head = client.head(path)
    assert head.status_code == get.status_code and head.status_code != 405, (path, head.status_code)
    assert head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]
    assert head.headers["x-frame-options"] == "DENY"
    assert client.head("/webhooks/github").status_code == 405  # POST only


# -- item 4: one WARNING line each ----------------------------------------------------------------------

def test_a_client_hanging_up_mid_body_is_one_warning_line(make_client, caplog):
    client = make_client()
    caplog.set_level(logging.INFO)
    for path in ("/webhooks/github", "/api/runs"):
        caplog.clear()
        headers = {"content-type": "application/json", "content-length": "100", "x-github-event": "push",
                   "x-hub-signature-256": "sha256=" + "0" * 64, "x-github-delivery": "d-gone", **AUTH}
        play(client.app, "POST", path, {k.lower(): v for k, v in headers.items()}, iter([b"{"]), disconnect=True)
        records = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert all(r.exc_info is None for r in caplog.records), [r.getMessage() for r in caplog.records]
        assert all(r.levelno == logging.WARNING for r in records), [r.getMessage() for r in records]
        assert len(records) <= 1, [r.getMessage() for r in records]
    assert client.app.state.edge_counters.client_disconnects >= 1


def test_a_database_outage_is_one_warning_line_per_request(make_settings, caplog):
    from fastapi.testclient import TestClient

    from service.api.app import create_app
    from service.db import Store
    from service.db.engine import make_engine

    settings = make_settings(database_url="postgresql+psycopg://postgres@127.0.0.1:1/down", broker_url="")
    store = Store(make_engine(settings.effective_database_url, **settings.db_pool()))
    caplog.set_level(logging.INFO)
    with TestClient(create_app(settings, store=store, background=False), raise_server_exceptions=False) as client:
        body = encode(push_payload(sha("outage")))
        answers = [client.get(p).status_code for p in ("/api/runs", "/", "/deliveries", "/api/runs/1")]
        answers.append(client.post("/webhooks/github", content=body, headers=webhook_headers(body, "push")).status_code)
        answers.append(client.post("/api/runs", json={"revision": "a" * 40}, headers=AUTH).status_code)
    assert set(answers) == {503}, answers
    assert [r for r in caplog.records if r.exc_info] == []
    warnings = [r for r in caplog.records if r.name.startswith("service") and r.levelno >= logging.WARNING]
    assert len(warnings) == len(answers) and all("so far" in r.getMessage() for r in warnings)
    store.dispose()


def test_settings_are_the_ones_documented():
    """The edge settings exist and are on the guide's configuration page (tests/test_readme.py checks each
    documented default against the real one)."""
    from service.settings import Settings
    from tests.docs_text import page

    readme = page("configuration.md")
    for name in ("http_header_timeout", "http_body_timeout", "http_keepalive_timeout", "http_max_connections",
                 "http_client_connections", "max_body_bytes"):
        assert f"`AMPCI_{name.upper()}`" in readme, name
        assert hasattr(Settings(), name)
    assert SECRET and REPO


# -- item 7: timestamps the driver cannot return ---------------------------------------------------------

def test_a_timestamp_before_year_1_in_utc_renders_as_a_dash(make_client, store):
    """A commit time stored by another tool as ``0001-01-01 00:00:00+14`` (year 0 in UTC, which no
    Python datetime holds) reads back as missing: the run page, the run list, the API answer 200."""
    import sqlalchemy as sa

    client = make_client()
    head, base = sha("ancient-head"), sha("ancient-base")
    store.upsert_revision(base, [], "main", "dev", "base")
    store.upsert_revision(head, [base], "main", "dev", "head")
    run_id = store.create_run(head, "push", baseline_sha=base, cells=[("mlp_small", "fp16", "default", "cpu")])
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE revisions SET committed_at = '0001-01-01 00:00:00+14'"))
    for path in (f"/runs/{run_id}", "/", "/runs", f"/api/runs/{run_id}", "/api/runs", f"/api/revisions/{head}"):
        resp = client.get(path, headers={"Accept": "text/html"} if not path.startswith("/api") else {})
        if path.startswith("/api/revisions") and resp.status_code == 404:
            continue  # no such endpoint in this version
        assert resp.status_code == 200, (path, resp.status_code, resp.text[:300])
        assert "0001-01-01" not in resp.text and "0000-12-31" not in resp.text
    assert store.get_revision(head).committed_at is None  # every reader: missing, shown as "–" where shown
