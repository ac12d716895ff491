"""POST /webhooks/github against the real PostgreSQL store and a real Redis job queue."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from service.api.app import create_app
from service.errors import ConfigError
from tests.service.api.helpers import (
    REPO,
    SECRET,
    drain,
    encode,
    pr_payload,
    push_payload,
    run_of,
    sha,
    webhook_headers,
)

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


def _queued(redis_url: str, queue: str) -> int:
    return int(redis.Redis.from_url(redis_url).llen(queue))


def _runs(store: Any) -> list[Any]:
    return store.list_runs(limit=1000)


def post(client: Any, payload: Any, event: str = "push", **kw: Any) -> Any:
    body = payload if isinstance(payload, bytes) else encode(payload)
    headers = webhook_headers(body, event, **kw)
    return client.post("/webhooks/github", content=body, headers=headers)


def test_push_to_tracked_branch_creates_one_smoke_run_with_revisions_and_jobs(make_client, store, queue,
                                                                               redis_url):
    client = make_client()
    c1, c2, c3 = sha("c1"), sha("c2"), sha("c3")
    before = sha("base")
    resp = post(client, push_payload(c3, before=before, commits=[c1, c2, c3]), delivery="d-push-1")
    assert resp.status_code == 202, resp.text
    body = resp.json()
    assert body["status"] == "queued" and body["sha"] == c3 and body["baseline"] == before
    assert body["delivery"] == "d-push-1"
    # answered before anything but the delivery was written: no run, no message yet
    assert store.get_delivery("d-push-1").status == "pending" and _runs(store) == []
    assert _queued(redis_url, queue) == 0
    run = store.get_run(run_of(client, resp))
    assert (run.revision_sha, run.trigger, run.baseline_sha, run.status) == (c3, "push", before, "queued")
    assert run.meta["github"]["repo"] == REPO
    # no parent link from the payload (the finisher reads them from git: test_push_history.py)
    assert [store.get_revision(c).parents for c in (c1, c2, c3)] == [(), (), ()]
    assert store.get_revision(c1).message == f"commit {c1[:7]}"
    assert store.get_revision(c3).author == "Dev <dev@example.com>"
    jobs = store.jobs(run.id)
    assert len(jobs) == 4 and {j.target for j in jobs} == {queue}
    assert _queued(redis_url, queue) == 4  # one Celery message per job, nothing run inline
    messages = [json.loads(m) for m in redis.Redis.from_url(redis_url).lrange(queue, 0, -1)]
    assert {m["headers"]["task"] for m in messages} == {"ampci.run_job"}
    delivery = store.get_delivery("d-push-1")
    assert (delivery.status, delivery.run_id, delivery.event, delivery.repository) == ("accepted", run.id, "push", REPO)


def test_redelivery_is_acknowledged_and_does_nothing_more(make_client, store, queue, redis_url):
    client = make_client()
    payload = push_payload(sha("dup"))
    first = post(client, payload, delivery="d-dup")
    again = post(client, payload, delivery="d-dup")  # still pending: no run id yet
    assert first.status_code == 202 and again.status_code == 200
    assert again.json() == {"status": "duplicate", "delivery": "d-dup", "run_id": None}
    run_id = run_of(client, first)
    late = post(client, payload, delivery="d-dup")
    assert late.status_code == 200
    assert late.json() == {"status": "duplicate", "delivery": "d-dup", "run_id": run_id}
    assert drain(client) == 0
    assert len(_runs(store)) == 1
    assert _queued(redis_url, queue) == 4


def test_pull_request_runs_head_with_base_as_baseline(make_client, store):
    client = make_client()
    head, base = sha("pr-head"), sha("pr-base")
    for i, action in enumerate(("opened", "synchronize", "reopened")):
        resp = post(client, pr_payload(head, base, action=action), event="pull_request", delivery=f"d-pr-{i}")
        assert resp.status_code == 202, resp.text
        run = store.get_run(run_of(client, resp))
        assert (run.revision_sha, run.baseline_sha, run.trigger) == (head, base, "pull_request")
        assert run.meta["github"]["pr"] == 7
    closed = post(client, pr_payload(head, base, action="closed"), event="pull_request")
    assert closed.status_code == 202 and closed.json()["status"] == "ignored"
    assert len(_runs(store)) == 1  # opened, synchronize, reopened of one head: one change, one run


def test_ping_is_200_and_other_events_are_202_ignored(make_client, store, queue, redis_url):
    client = make_client()
    ping = post(client, {"zen": "Keep it logically awesome.", "hook_id": 1}, event="ping")
    assert ping.status_code == 200 and ping.json()["status"] == "pong"
    issue = post(client, {"action": "opened", "issue": {}}, event="issues", delivery="d-issue")
    assert issue.status_code == 202 and issue.json()["status"] == "ignored"
    assert store.get_delivery("d-issue").status == "accepted"
    untracked = post(client, push_payload(sha("x"), branch="feature/x"))
    tag = post(client, {**push_payload(sha("t")), "ref": "refs/tags/v1"})
    deleted = post(client, push_payload("0" * 40, deleted=True))
    for resp in (untracked, tag, deleted):
        assert resp.status_code == 202 and resp.json()["status"] == "ignored", resp.text
    assert drain(client) == 0
    assert _runs(store) == [] and _queued(redis_url, queue) == 0


SIGNATURES = [None, "", "sha256=" + "0" * 64, "sha1=abc", "sha256=zz", "garbage"]


def test_missing_or_wrong_signature_is_401_and_nothing_is_stored(make_client, store, queue, redis_url):
    client = make_client()
    body = encode(push_payload(sha("unsigned")))
    for i, signature in enumerate(SIGNATURES):
        headers = webhook_headers(body, "push", delivery=f"d-bad-sig-{i}", secret=None, signature=signature)
        resp = client.post("/webhooks/github", content=body, headers=headers)
        assert resp.status_code == 401 and resp.json()["error"] == "unauthorized", signature
        assert store.get_delivery(f"d-bad-sig-{i}") is None
    wrong_secret = client.post("/webhooks/github", content=body,
                               headers=webhook_headers(body, "push", delivery="d-bad-sig", secret="other"))
    assert wrong_secret.status_code == 401
    assert store.get_delivery("d-bad-sig") is None and _runs(store) == []
    assert _queued(redis_url, queue) == 0


BAD_BODIES = {
    "malformed JSON": (b'{"ref": "refs/heads/main", ', "malformed JSON"),
    "not an object": (b"[1, 2, 3]", "expected a JSON object"),
    "missing after": (encode({k: v for k, v in push_payload(sha("m")).items() if k != "after"}), "after"),
    "sha not 40 hex": (encode(push_payload("abc123")), "not a 40-hex commit sha"),
    "sha with non-hex": (encode(push_payload("g" * 40)), "not a 40-hex commit sha"),
    "commit sha short": (encode(push_payload(sha("a"), commits=["deadbeef"])), "commits.0.id"),
    "wrong type": (encode({**push_payload(sha("w")), "commits": "many"}), "commits"),
    "not utf-8": (b'{"ref": "\xff\xfe"}', "malformed JSON"),
}


def test_bad_payload_is_400_recorded_as_rejected_and_nothing_queued(make_client, store, queue, redis_url):
    client = make_client()
    for case, (body, reason) in sorted(BAD_BODIES.items()):
        delivery = "d-bad-" + case.replace(" ", "-")
        resp = post(client, body, delivery=delivery)
        assert resp.status_code == 400, (case, resp.text)
        assert resp.json()["error"] == "bad_request" and reason in resp.json()["message"], case
        recorded = store.get_delivery(delivery)
        assert recorded.status == "rejected" and reason in recorded.reason, case
    assert drain(client) == 0
    assert _runs(store) == [] and _queued(redis_url, queue) == 0


def test_bad_pull_request_sha_is_rejected(make_client, store):
    client = make_client()
    resp = post(client, pr_payload(sha("h"), "not-a-sha"), event="pull_request", delivery="d-bad-pr")
    assert resp.status_code == 400 and "pull_request.base.sha" in resp.json()["message"]
    assert store.get_delivery("d-bad-pr").status == "rejected"


def test_oversized_signed_body_is_413_and_nothing_stored(make_client, make_settings, store, queue, redis_url):
    """Issue 24 item 1: a body over the limit is not read, so its signature cannot be verified:
    nothing is stored for it (it used to be recorded ``rejected``, a row per unverified request)."""
    client = make_client(make_settings(webhook_max_body_bytes=2048))
    payload = push_payload(sha("big"))
    payload["commits"][0]["message"] = "x" * 4096
    resp = post(client, payload, delivery="d-big")
    assert resp.status_code == 413 and resp.json()["error"] == "too_large"
    assert store.get_delivery("d-big") is None
    assert _runs(store) == [] and _queued(redis_url, queue) == 0
    small = post(client, push_payload(sha("small")), delivery="d-small")
    assert small.status_code == 202


def test_repository_outside_allowlist_is_403_and_rejected(make_client, store):
    client = make_client()
    resp = post(client, push_payload(sha("evil"), repo="evil/fork"), delivery="d-evil")
    assert resp.status_code == 403 and "evil/fork" in resp.json()["message"]
    assert store.get_delivery("d-evil").status == "rejected" and _runs(store) == []


def test_rejected_delivery_is_processed_again_when_redelivered(make_client, make_settings, store):
    closed = make_client(make_settings(allowed_repos="someone/else"))
    payload = push_payload(sha("retry"))
    assert post(closed, payload, delivery="d-retry").status_code == 403
    opened = make_client()
    resp = post(opened, payload, delivery="d-retry")
    assert resp.status_code == 202
    assert store.get_delivery("d-retry").status == "pending"
    run_of(opened, resp)
    assert store.get_delivery("d-retry").status == "accepted" and len(_runs(store)) == 1


def test_missing_delivery_or_event_header_is_400(make_client, store):
    client = make_client()
    body = encode(push_payload(sha("h")))
    headers = webhook_headers(body, "push")
    del headers["X-GitHub-Delivery"]
    assert client.post("/webhooks/github", content=body, headers=headers).status_code == 400
    headers = webhook_headers(body, "push", delivery="d-no-event")
    del headers["X-GitHub-Event"]
    assert client.post("/webhooks/github", content=body, headers=headers).status_code == 400
    assert store.get_delivery("d-no-event").status == "rejected" and _runs(store) == []


def test_app_refuses_to_start_without_a_secret_unless_insecure_dev(make_settings, make_client, store, queue):
    with pytest.raises(ConfigError, match="AMPCI_WEBHOOK_SECRET"):
        create_app(make_settings(webhook_secret=""), store=store)
    client = make_client(make_settings(webhook_secret="", insecure_dev=True))
    resp = post(client, push_payload(sha("dev")), secret=None)
    assert resp.status_code == 202


def test_webhook_answers_fast(make_client):
    import time

    client = make_client()
    post(client, push_payload(sha("warm")))
    t0 = time.perf_counter()
    resp = post(client, push_payload(sha("fast")))
    assert resp.status_code == 202
    assert time.perf_counter() - t0 < 1.0


def test_secret_is_the_signing_key(make_client):
    client = make_client()
    body = encode(push_payload(sha("k")))
    assert client.post("/webhooks/github", content=body,
                       headers=webhook_headers(body, "push", secret=SECRET)).status_code == 202


def test_default_planner_runs_the_real_smoke_sweep(make_settings, store):
    """Without a planner the dispatcher expands sweeps/smoke.toml over zoo.toml (broker call recorded
    here instead of sent, so the real ``cpu`` queue stays untouched)."""
    from service.api.dispatch import RunDispatcher
    from service.github.webhook import WebhookProcessor
    from service.orchestration.scheduler import load_sweep, zoo_catalog
    from service.run_meta import cell_options

    sent: list[tuple[str, list[int]]] = []
    settings = make_settings()
    dispatcher = RunDispatcher(settings, store, dispatch=lambda s, rev, jobs: sent.append((rev, [j.id for j in jobs])))
    processor = WebhookProcessor(settings, store, dispatcher)
    head = sha("real-smoke")
    body = encode(push_payload(head))
    out = processor.handle({k.lower(): v for k, v in webhook_headers(body, "push").items()}, body)
    assert out.status_code == 202 and sent == []
    assert processor.intake.drain() == 1
    run_id = store.get_delivery(out.body["delivery"]).run_id
    expected = sorted(c.cell for c in load_sweep(sweep="smoke").expand(zoo_catalog()))
    jobs = store.jobs(run_id)
    assert sorted(j.cell for j in jobs) == expected and len(expected) >= 2
    assert sent == [(head, [j.id for j in jobs])]
    run = store.get_run(run_id)
    planned = {c.cell: c.options() for c in load_sweep(sweep="smoke").expand(zoo_catalog())}
    assert run.sweep == "smoke" and {c: cell_options(run.meta, c) for c in expected} == planned


def test_form_encoded_deliveries_are_accepted(make_client, store):
    from urllib.parse import urlencode

    client = make_client()
    body = urlencode({"payload": encode(push_payload(sha("form"))).decode()}).encode()
    headers = {**webhook_headers(body, "push", delivery="d-form"), "Content-Type": "application/x-www-form-urlencoded"}
    resp = client.post("/webhooks/github", content=body, headers=headers)
    assert resp.status_code == 202, resp.text
    assert store.get_run(run_of(client, resp)).revision_sha == sha("form")
    bad = b"payload=%7B&payload=2"
    headers = {**webhook_headers(bad, "push", delivery="d-form-bad"), "Content-Type": "application/x-www-form-urlencoded"}
    assert client.post("/webhooks/github", content=bad, headers=headers).status_code == 400
    assert store.get_delivery("d-form-bad").status == "rejected"


def _raw_push(after: str) -> bytes:
    """A push as GitHub may serialise it, not as json.dumps would: key order, whitespace, ``\\u``
    escapes for non-ASCII and a trailing newline."""
    return ('{\n  "repository" : {"full_name":"' + REPO + '"},\n\t"after":"' + after + '",  "before":"'
            + sha("raw-before") + '",\r\n  "ref":"refs/heads/main",\n  "commits":[{"id":"' + after
            + '","message":"caf\\u00e9 \\ud83d\\ude80 \u00e9","timestamp":"2026-11-28T10:00:00+01:00",'
            '"author":{"name":"D\\u00e9v","email":"dev@example.com"}}]\n}\n').encode("utf-8")


def test_the_signature_is_checked_over_the_raw_bytes(make_client, store):
    """GitHub signs the bytes it sends: a body whose re-serialisation differs is accepted, and the
    revision keeps its decoded text."""
    client = make_client()
    head = sha("raw")
    body = _raw_push(head)
    assert json.dumps(json.loads(body)).encode() != body  # a verifier re-serialising the JSON would refuse it
    resp = client.post("/webhooks/github", content=body, headers=webhook_headers(body, "push", delivery="d-raw"))
    assert resp.status_code == 202, resp.text
    run_of(client, resp)
    rev = store.get_revision(head)
    assert rev.message == "caf\u00e9 \U0001f680 \u00e9" and rev.author == "D\u00e9v <dev@example.com>"


@pytest.mark.parametrize("where", ["whitespace", "escape", "trailing newline", "content"])
def test_one_byte_changed_after_signing_is_401(make_client, store, where: str):
    """Even a change that leaves the parsed JSON equal (whitespace, an escape spelled differently,
    the trailing newline) breaks the signature: nothing is stored."""
    client = make_client()
    body = _raw_push(sha("raw-tamper"))
    signature = webhook_headers(body, "push")["X-Hub-Signature-256"]
    tampered = {"whitespace": body.replace(b"\t", b" ", 1), "escape": body.replace(b"\\u00e9", b"\\u00E9", 1),
                "trailing newline": body[:-1], "content": body.replace(b"main", b"mait", 1)}[where]
    assert len(tampered) in (len(body), len(body) - 1) and tampered != body
    if where != "content":
        assert json.loads(tampered) == json.loads(body)
    headers = webhook_headers(tampered, "push", delivery="d-tamper", signature=signature)
    resp = client.post("/webhooks/github", content=tampered, headers=headers)
    assert resp.status_code == 401, resp.text
    assert store.get_delivery("d-tamper") is None and store.list_runs() == []
