"""Signed deliveries whose content is hostile (issue 17, items 1–4) against the real PostgreSQL store:
none loses another delivery, none stays pending forever, none breaks the dashboard, none is a 500."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa

from service.db.deliveries import DeliveryWrite
from service.db.records import RevisionRow
from service.github.recorder import DeliveryRecorder
from tests.service.api.helpers import drain, encode, pr_payload, push_payload, sha, webhook_headers

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


def _headers(body: bytes, event: str, delivery: str) -> dict[str, str]:
    return {k.lower(): v for k, v in webhook_headers(body, event, delivery=delivery).items()}


def _nul_ref_push(i: int) -> bytes:
    return encode({**push_payload(sha(f"nul-{i}")), "ref": "refs/heads/ma\x00in"})


def _nul_ref_pr(i: int) -> bytes:
    payload = pr_payload(sha(f"nul-pr-{i}"), sha("nul-pr-base"))
    payload["pull_request"]["head"]["ref"] = "feature/\x00x"
    return encode(payload)


def test_a_burst_with_nul_refs_mixed_in_stores_every_valid_delivery(make_client, store):
    """Item 1: one group commit holds valid pushes and pushes/PRs with a NUL in the ref; every valid
    one is stored (202, then one run each), every hostile one is 400 and recorded rejected."""
    client = make_client()
    processor = client.app.state.ctx.webhook
    valid = [(f"d-ok-{i}", "push", encode(push_payload(sha(f"ok-{i}")))) for i in range(160)]
    hostile = ([(f"d-nul-{i}", "push", _nul_ref_push(i)) for i in range(20)]
               + [(f"d-nulpr-{i}", "pull_request", _nul_ref_pr(i)) for i in range(10)])
    mixed = [x for pair in zip(valid, hostile + [None] * len(valid), strict=False) for x in pair if x]

    async def burst() -> list[Any]:
        recorder = DeliveryRecorder(store)  # one flush for the whole burst: every write in one batch
        return await asyncio.gather(*[processor.handle_async(_headers(body, event, d), body, recorder=recorder)
                                      for d, event, body in mixed], return_exceptions=True)

    outcomes = dict(zip([d for d, _, _ in mixed], asyncio.run(burst()), strict=True))
    for d, _, _ in valid:
        assert not isinstance(outcomes[d], BaseException), (d, outcomes[d])
        assert outcomes[d].status_code == 202, (d, outcomes[d])
    for d, _, _ in hostile:
        assert not isinstance(outcomes[d], BaseException) and outcomes[d].status_code == 400, (d, outcomes[d])
        got = store.get_delivery(d)
        assert got is not None and got.status == "rejected" and "control character" in got.reason, got
        assert "\x00" not in got.reason
    assert drain(client) == len(valid)
    runs = store.list_runs(limit=1000)
    assert sorted(r.id for r in runs) == sorted(store.get_delivery(d).run_id for d, _, _ in valid)
    assert store.count_pending_deliveries() == 0


def test_a_row_the_database_refuses_is_recorded_rejected_and_the_rest_of_its_batch_stored(store):
    """The store's own isolation (whatever the intake let through): a multi-row write with a value
    too long for its column falls back to one by one; only that delivery is rejected, with the reason."""
    writes = [DeliveryWrite(f"d-row-{i}", "push", "pending", reason="push main", repository="acme/amp-pass",
                            payload={"v": 1}) for i in range(6)]
    writes[2] = DeliveryWrite("d-row-long", "push", "pending", reason="push main", repository="x" * 300,
                              payload={"v": 1})
    writes[4] = DeliveryWrite("d-row-nul", "push", "accepted", reason="ignored: branch ma\x00in")
    got = store.receive_deliveries(writes)
    assert [g.stored for g in got] == [True] * 6
    assert [g.rejected is None for g in got] == [True, True, False, True, True, True]
    assert "cannot be stored" in got[2].rejected and "too long" in got[2].rejected
    assert store.get_delivery("d-row-long").status == "rejected"
    assert "too long" in store.get_delivery("d-row-long").reason
    assert store.get_delivery("d-row-nul").reason == "ignored: branch main"  # NUL removed from the reason
    assert {store.get_delivery(w.delivery_id).status for w in writes if w.delivery_id.startswith("d-row-")
            and w.delivery_id not in ("d-row-long", "d-row-nul")} == {"pending"}


def _push_with(**commit: Any) -> dict[str, Any]:
    payload = push_payload(sha("c-" + repr(sorted(commit.items()))[:80]))
    payload["commits"][0].update(commit)
    return payload


def _pr_with(head_ref: str | None = None, title: str | None = None, login: str | None = None) -> dict[str, Any]:
    payload = pr_payload(sha(f"pr-{head_ref!r}-{title!r}-{login!r}"), sha("pr-base"))
    pr = payload["pull_request"]
    if head_ref is not None:
        pr["head"]["ref"] = head_ref
    if title is not None:
        pr["title"] = title
    if login is not None:
        pr["user"]["login"] = login
    return payload


#: item 2: content that used to be answered 202 and then retried forever
ACCEPTED_CLEANED = {
    "NUL in a commit message": ("push", _push_with(message="fix\x00 scales")),
    "NUL in an author name": ("push", _push_with(author={"name": "D\x00ev", "email": "d@example.com"})),
    "author name of 400 characters": ("push", _push_with(author={"name": "n" * 400, "email": "d@example.com"})),
    "NUL in a PR title": ("pull_request", _pr_with(title="Keep\x00 Resize")),
    "user.login of 400 characters": ("pull_request", _pr_with(login="u" * 400)),
    # issue 24 item 3: replaced by U+FFFD like NUL is removed (was refused: pydantic's str check came first)
    "lone surrogate in a message": ("push", _push_with(message="caf\ud800")),
}
REJECTED = {
    "PR head.ref of 256 characters": ("pull_request", _pr_with(head_ref="f" * 256), "longer than 200"),
    "PR head.ref of 300 characters": ("pull_request", _pr_with(head_ref="f" * 300), "longer than 200"),
    "push ref of 300 characters": ("push", {**push_payload(sha("long-ref")), "ref": "refs/heads/" + "b" * 300},
                                   "longer than 255"),
    "PR number out of range": ("pull_request", {**_pr_with(), "number": 2**40}, "between 1 and"),
    "negative PR number": ("pull_request", _pr_with() | {"pull_request": {
        **_pr_with()["pull_request"], "number": -3}}, "between 1 and"),
}


def test_content_that_used_to_fail_later_is_cleaned_or_rejected_at_intake(make_client, store):
    """Item 2: after the intake ran, no delivery is pending: cleanable text made a run (NUL removed,
    bounded), over-long identifiers were refused with 400 and recorded rejected with the reason."""
    client = make_client()
    for case, (event, payload) in ACCEPTED_CLEANED.items():
        body = encode(payload)
        resp = client.post("/webhooks/github", content=body, headers=webhook_headers(body, event, delivery=case[:60]
                                                                                     .replace(" ", "-")))
        assert resp.status_code == 202, (case, resp.text)
    for case, (event, payload, reason) in REJECTED.items():
        body = encode(payload)
        delivery = case.replace(" ", "-").replace(".", "")[:60]
        resp = client.post("/webhooks/github", content=body, headers=webhook_headers(body, event, delivery=delivery))
        assert resp.status_code == 400 and reason in resp.json()["message"], (case, resp.text)
        got = store.get_delivery(delivery)
        assert got.status == "rejected" and reason in got.reason, (case, got)
    assert drain(client) == len(ACCEPTED_CLEANED)
    assert store.count_pending_deliveries() == 0
    assert len(store.list_runs(limit=100)) == len(ACCEPTED_CLEANED)
    with store.transaction() as conn:
        revs = conn.execute(sa.text("select author, message, branch from revisions")).all()
    assert revs and all(len(a or "") <= 300 and "\x00" not in (m or "") and "\ud800" not in (m or "")
                        for a, m, _ in revs)


def test_a_pending_row_of_an_older_version_is_settled_not_retried_forever(make_client, store):
    """A pending payload stored before these checks (NUL in the message, a 300-character branch, a
    year-1 timestamp) is cleaned or rejected by the intake, never left pending."""
    client = make_client()
    base = {"v": 1, "repo": "acme/amp-pass", "trigger": "push", "baseline_sha": None, "branch": "main",
            "sweep": "smoke", "pr_number": None}

    def rev(name: str, branch: str = "main", message: str = "m", at: str | None = None) -> list[Any]:
        return [sha(name), [], branch, "Dev", message, at]

    rows = {
        "old-nul": {**base, "head_sha": sha("old-nul"), "revisions": [rev("old-nul", message="a\x00b")]},
        "old-branch": {**base, "head_sha": sha("old-branch"), "revisions": [rev("old-branch", branch="b" * 300)]},
        "old-year1": {**base, "head_sha": sha("old-year1"),
                      "revisions": [rev("old-year1", at="0001-01-01T00:00:00+14:00")]},
    }
    for d, payload in rows.items():
        assert store.receive_delivery(d, "push", "pending", reason="push main", repository="acme/amp-pass",
                                      payload=payload).stored
    drain(client)
    got = {d: store.get_delivery(d) for d in rows}
    assert got["old-nul"].status == "accepted" and got["old-nul"].run_id is not None
    assert store.get_revision(sha("old-nul")).message == "ab"
    assert got["old-branch"].status == "rejected" and "longer than 200" in got["old-branch"].reason
    assert got["old-year1"].status == "rejected" and "out of range" in got["old-year1"].reason
    assert store.count_pending_deliveries() == 0


EXTREME_TIMES = ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "1969-12-31T23:59:59+00:00",
                 "2100-01-01T00:00:00Z"]


def test_extreme_commit_timestamps_are_rejected_and_the_dashboard_survives_stored_ones(make_client, store):
    """Item 3: such timestamps are 400 and recorded rejected at intake; a run whose revision holds one
    anyway (stored by an older version) does not break GET / and /runs."""
    client = make_client()
    for i, at in enumerate(EXTREME_TIMES):
        payload = push_payload(sha(f"t-{i}"))
        payload["commits"][0]["timestamp"] = at
        body = encode(payload)
        resp = client.post("/webhooks/github", content=body, headers=webhook_headers(body, "push", delivery=f"d-t{i}"))
        assert resp.status_code == 400 and "out of range" in resp.json()["message"], (at, resp.text)
        assert store.get_delivery(f"d-t{i}").status == "rejected"
    assert store.list_runs() == []
    from datetime import timedelta, timezone

    old = datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14)))  # year 0 in UTC: unreadable by the driver
    store.upsert_revisions([RevisionRow(sha("year-0"), (), "main", "Dev", "old", committed_at=old)])
    store.create_run_with_jobs(sha("year-0"), "push", None, "smoke", [("mlp_small", "fp16", "default", "cpu")],
                               "old:year-0", {})
    fine = datetime(2026, 1, 2, tzinfo=UTC)
    store.upsert_revision(sha("fine"), [], "main", "Dev", "new", committed_at=fine)
    store.create_run_with_jobs(sha("fine"), "push", None, "smoke", [("mlp_small", "fp16", "default", "cpu")],
                               "new:fine", {})
    for page in ("/", "/runs"):
        resp = client.get(page, headers={"Accept": "text/html"})
        assert resp.status_code == 200, (page, resp.text[:300])
        assert sha("year-0")[:8] in resp.text and sha("fine")[:8] in resp.text


def test_deep_json_is_400_and_the_next_request_on_the_same_connection_works(pg_url, redis_url, store, tmp_path):
    """Item 4, over a real uvicorn server: a signed 10 KB body nested 5,000 deep is a 400 naming the
    limit (recorded rejected), and the keep-alive connection answers the next delivery."""
    import http.client
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    from bench.bench_webhook import free_port, stop_server
    from tests.service.api.helpers import REPO, SECRET

    root = Path(__file__).resolve().parents[3]
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMPCI_")}
    env.update(AMPCI_DATABASE_URL=pg_url, AMPCI_BROKER_URL=redis_url, AMPCI_WEBHOOK_SECRET=SECRET,
               AMPCI_ALLOWED_REPOS=REPO, AMPCI_LOG_LEVEL="WARNING", AMPCI_DATA_DIR=str(tmp_path))
    with open(tmp_path / "serve.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "service.cli.main", "serve", "--host", "127.0.0.1",
                                 "--port", str(port)], cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        deadline = time.monotonic() + 60
        while True:
            try:
                conn.request("GET", "/healthz")
                conn.getresponse().read()
                break
            except OSError:
                conn.close()
                assert time.monotonic() < deadline and proc.poll() is None, (tmp_path / "serve.log").read_text()
                time.sleep(0.2)

        def send(body: bytes, delivery: str) -> tuple[int, str, Any]:
            conn.request("POST", "/webhooks/github", body=body, headers=webhook_headers(body, "push", delivery=delivery))
            resp = conn.getresponse()
            return resp.status, resp.read().decode(), resp.getheader("connection")

        sock = conn.sock
        deep = b'{"ref":' + b"[" * 5000 + b"]" * 5000 + b"}"
        status, text, connection = send(deep, "d-deep")
        assert status == 400 and "nested deeper than 64" in text, text
        assert connection != "close" and conn.sock is sock
        status, text, _ = send(encode(push_payload(sha("after-deep"))), "d-after-deep")
        assert status == 202, text
        assert conn.sock is sock  # the same connection answered
        conn.close()
        got = store.get_delivery("d-deep")
        assert got.status == "rejected" and "nested deeper than 64" in got.reason
    finally:
        stop_server(proc)


def test_a_redelivery_the_database_refuses_over_a_rejected_row_stays_rejected_with_the_reason(store):
    assert store.receive_delivery("d-again", "push", "rejected", reason="first try").stored
    got = store.receive_delivery("d-again", "push", "pending", reason="push main", repository="x" * 300,
                                 payload={"v": 1})
    assert got.stored and "too long" in got.rejected
    row = store.get_delivery("d-again")
    assert row.status == "rejected" and "too long" in row.reason
