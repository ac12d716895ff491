"""A ping names its repository: the delivery records it, so the deliveries page and API show it (they
showed "–" for every ping)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.service.api.helpers import REPO, encode, webhook_headers

BROWSER = {"Accept": "text/html,application/xhtml+xml"}


@pytest.mark.postgres
@pytest.mark.redis
def test_a_ping_records_the_repository_it_named(make_client: Any):
    client = make_client()
    named = encode({"zen": "Design for failure.", "hook_id": 1, "repository": {"full_name": REPO}})
    bare = encode({"zen": "Keep it logically awesome.", "hook_id": 2})
    for body, delivery in ((named, "ping-with-repo"), (bare, "ping-without-repo")):
        resp = client.post("/webhooks/github", content=body, headers=webhook_headers(body, "ping", delivery))
        assert resp.status_code == 200 and resp.json()["status"] == "pong", resp.text
    rows = {d["delivery_id"]: d for d in client.get("/api/deliveries").json()["deliveries"]}
    assert rows["ping-with-repo"]["repository"] == REPO and rows["ping-without-repo"]["repository"] is None
    page = client.get("/deliveries", headers=BROWSER).text
    row = page.split('data-delivery-id="ping-with-repo"')[1].split("</tr>")[0]
    assert f"<td>{REPO}</td>" in row
    row = page.split('data-delivery-id="ping-without-repo"')[1].split("</tr>")[0]
    assert "<td>–</td>" in row
