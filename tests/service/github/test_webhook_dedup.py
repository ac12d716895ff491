"""One run per change, not per byte: deliveries of the same push (repository, ref, before, after) or
pull-request head (repository, number, head sha, action class) lead to one run however they were
serialised or re-sent; a different change is a different run."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

import pytest

from tests.service.api.helpers import REPO, encode, pr_payload, push_payload, run_of, sha, webhook_headers

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


def _send(client: Any, body: bytes, event: str, content_type: str = "application/json") -> int:
    headers = webhook_headers(body, event)
    headers["Content-Type"] = content_type
    return run_of(client, client.post("/webhooks/github", content=body, headers=headers))


def test_a_push_reserialised_four_ways_makes_one_run(make_client: Any, store: Any):
    client = make_client()
    payload = push_payload(sha("dedup-after"), before=sha("dedup-before"))
    bodies = [
        (encode(payload), "application/json"),
        (json.dumps(payload, sort_keys=True, indent=2).encode(), "application/json"),  # keys reordered, spaced
        (json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode(), "application/json"),
        (urlencode({"payload": json.dumps(payload)}).encode(), "application/x-www-form-urlencoded"),
    ]
    runs = {_send(client, body, "push", ctype) for body, ctype in bodies}
    assert len(runs) == 1 and len(store.list_runs()) == 1
    # the repository's name in another case is the same repository
    upper = push_payload(sha("dedup-after"), before=sha("dedup-before"), repo=REPO.upper())
    assert _send(client, encode(upper), "push") in runs
    # another before (a force-push onto the same head) is another change
    other = push_payload(sha("dedup-after"), before=sha("dedup-other-before"))
    assert _send(client, encode(other), "push") not in runs
    assert len(store.list_runs()) == 2


def test_pull_request_deliveries_of_one_head_make_one_run(make_client: Any, store: Any):
    client = make_client()
    head, base = sha("dedup-pr-head"), sha("dedup-pr-base")
    runs = set()
    for i in range(32):  # GitHub's deliveries of one head differ in updated_at (and other volatile fields)
        payload = pr_payload(head, base, action="synchronize" if i % 2 else "opened")
        payload["pull_request"]["updated_at"] = f"2026-11-28T10:{i:02d}:00Z"
        payload["pull_request"]["comments"] = i
        runs.add(_send(client, encode(payload), "pull_request"))
    reopened = pr_payload(head, base, action="reopened")  # a reopen of a head already measured: its run
    runs.add(_send(client, encode(reopened), "pull_request"))
    assert len(runs) == 1 and len(store.list_runs()) == 1
    assert {d.run_id for d in store.list_deliveries(limit=100)} == runs  # every delivery accepted with it
    # a new head, or the same head on another pull request, is another change
    assert _send(client, encode(pr_payload(sha("dedup-pr-head-2"), base)), "pull_request") not in runs
    assert _send(client, encode(pr_payload(head, base, number=8)), "pull_request") not in runs
    assert len(store.list_runs()) == 3
