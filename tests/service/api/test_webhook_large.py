"""Every valid delivery is accepted: the webhook takes bodies up to GitHub's 25 MB cap (a realistic
2,048-commit push is ~2 MB), fed into the HMAC as they arrive; an unsigned request is refused before
its body is read, a signed one over the cap is 413 and stores nothing; the JSON API keeps
``AMPCI_MAX_BODY_BYTES``."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from hashlib import sha256
from typing import Any

import pytest

from service.settings import Settings
from tests.service.api.helpers import API_TOKEN, SECRET, encode, push_payload, run_of, sha, webhook_headers
from tests.service.api.test_edge_hardening import play

pytestmark = [pytest.mark.postgres, pytest.mark.redis]
GITHUB_CAP = 25 * 1024 * 1024


def realistic_push(n: int = 2048) -> dict[str, Any]:
    """A push as GitHub sends it with ``n`` commits: ids, messages, author and committer, url, file lists."""
    ids = [sha(f"big-push-{i}") for i in range(n)]
    payload = push_payload(ids[-1], before=sha("big-push-before"), commits=ids)
    for i, commit in enumerate(payload["commits"]):
        person = {"name": f"Developer {i % 17}", "email": f"dev{i % 17}@example.com", "username": f"dev{i % 17}"}
        commit.update({
            "tree_id": sha(f"tree-{i}"), "distinct": True,
            "message": f"amp_pass: step {i} of the resize rework\n\nKeep scales in fp32 where the schema "
                       "asks for a float; the policy table records the reason.\n\nSigned-off-by: Developer <dev@example.com>",
            "url": f"https://github.com/acme/amp-pass/commit/{commit['id']}",
            "author": person, "committer": {**person, "name": "GitHub", "email": "noreply@github.com"},
            "added": [f"tests/amp_pass/cases/case_{i}.onnx.txt"],
            "removed": [f"amp_pass/old/module_{i}.py"] if i % 5 == 0 else [],
            "modified": ["amp_pass/propagate.py", "amp_pass/casts.py", f"amp_pass/ops/op_{i % 40}.py",
                         "tests/amp_pass/test_propagate.py", "docs/POLICIES.md", "amp_pass/policies/default.toml",
                         f"tests/amp_pass/golden/report_{i % 64}.json"],
        })
    payload["head_commit"] = payload["commits"][-1]
    payload["compare"] = "https://github.com/acme/amp-pass/compare/aaaa...bbbb"
    return payload


def test_a_realistic_2048_commit_push_is_accepted(make_client: Any, store: Any):
    body = encode(realistic_push())
    assert 1.8e6 < len(body) < 3e6, len(body)  # ~2 MB: over the JSON API's 1 MiB, far under GitHub's cap
    client = make_client()
    assert client.app.state.ctx.settings.max_body_bytes < len(body)
    run = store.get_run(run_of(client, client.post("/webhooks/github", content=body,
                                                   headers=webhook_headers(body, "push"))))
    assert run.revision_sha == sha("big-push-2047") and run.baseline_sha == sha("big-push-before")


def _chunks(total: int, size: int = 1024 * 1024) -> Iterator[bytes]:
    sent = 0
    while sent < total:
        n = min(size, total - sent)
        sent += n
        yield b" " * n


def test_a_signed_body_over_githubs_cap_is_413_and_cut_off(make_client: Any, store: Any):
    app = make_client().app
    total = GITHUB_CAP + 3 * 1024 * 1024
    signature = "sha256=" + hmac.new(SECRET.encode(), b" " * total, sha256).hexdigest()
    headers = {"content-type": "application/json", "x-github-event": "push", "x-github-delivery": "d-huge",
               "x-hub-signature-256": signature}
    got = play(app, "POST", "/webhooks/github", headers, _chunks(total), timeout=60)
    assert got.status == 413 and got.pulled <= 26  # not read past the cap
    declared = play(app, "POST", "/webhooks/github", {**headers, "content-length": str(GITHUB_CAP + 1)},
                    _chunks(GITHUB_CAP + 1), timeout=60)
    assert declared.status == 413 and declared.pulled == 0
    assert store.get_delivery("d-huge") is None and store.list_deliveries() == []


def test_an_unsigned_or_missigned_large_body_is_refused_unparsed(make_client: Any, store: Any):
    app = make_client().app
    headers = {"content-type": "application/json", "x-github-event": "push", "x-github-delivery": "d-unsigned"}
    got = play(app, "POST", "/webhooks/github", headers, _chunks(20 * 1024 * 1024))
    assert got.status == 401 and got.pulled == 0  # no signature header: not a byte of the body read
    bad = play(app, "POST", "/webhooks/github", {**headers, "x-hub-signature-256": "sha256=" + "0" * 64},
               iter([b"{not json" + b" " * 1024 * 1024]))
    assert bad.status == 401  # signature first: the malformed JSON was never parsed (that would be 400)
    assert store.list_deliveries() == []


def test_the_json_api_keeps_its_own_limit(make_client: Any, make_settings: Any):
    client = make_client(make_settings(webhook_max_body_bytes=GITHUB_CAP))
    big = b'{"revision": "' + b"a" * (2 * 1024 * 1024) + b'"}'
    resp = client.post("/api/runs", content=big, headers={"Authorization": f"Bearer {API_TOKEN}",
                                                          "Content-Type": "application/json"})
    assert resp.status_code == 413


def test_the_webhook_limit_is_a_size_setting():
    assert Settings().webhook_max_body_bytes == GITHUB_CAP
    assert Settings.from_env({"AMPCI_WEBHOOK_MAX_BODY_BYTES": "30MiB"}).webhook_max_body_bytes == 30 * 1024 * 1024
