"""Payload builders and request helpers shared by the API tests and the webhook benchmark."""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

from service.github.signature import sign

SECRET = "test-webhook-secret"
API_TOKEN = "test-api-token"
GITHUB_TOKEN = "ghp-test-token"
REPO = "acme/amp-pass"


def sha(seed: str) -> str:
    """A deterministic 40-hex sha for ``seed``."""
    return hashlib.sha1(seed.encode()).hexdigest()


def push_payload(after: str, before: str | None = None, branch: str = "main", repo: str = REPO,
                 commits: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    """A GitHub ``push`` payload (the fields we read, plus some we ignore)."""
    commits = commits if commits is not None else [after]
    return {
        "ref": f"refs/heads/{branch}", "before": before or sha("before-" + after), "after": after,
        "created": False, "deleted": False, "forced": False,
        "repository": {"full_name": repo, "id": 1, "private": True},
        "pusher": {"name": "dev"},
        "commits": [{"id": c, "message": f"commit {c[:7]}", "timestamp": "2026-11-28T10:00:00+00:00",
                     "author": {"name": "Dev", "email": "dev@example.com", "username": "dev"},
                     "added": [], "removed": [], "modified": ["amp_pass/paint.py"]} for c in commits],
        "head_commit": {"id": after, "message": f"commit {after[:7]}",
                        "timestamp": "2026-11-28T10:00:00+00:00",
                        "author": {"name": "Dev", "email": "dev@example.com"}},
        **extra,
    }


def pr_payload(head: str, base: str, action: str = "opened", number: int = 7, repo: str = REPO) -> dict[str, Any]:
    """A GitHub ``pull_request`` payload."""
    return {
        "action": action, "number": number,
        "pull_request": {"number": number, "title": "Keep Resize scales in fp32", "state": "open",
                         "head": {"sha": head, "ref": "feature/resize", "label": "dev:feature/resize"},
                         "base": {"sha": base, "ref": "main", "label": "acme:main"},
                         "user": {"login": "dev"}, "merge_commit_sha": None},
        "repository": {"full_name": repo},
    }


def encode(payload: Any) -> bytes:
    return json.dumps(payload).encode()


def webhook_headers(body: bytes, event: str, delivery: str | None = None, secret: str | None = SECRET,
                    signature: str | None = None) -> dict[str, str]:
    """Headers GitHub sends; ``secret=None`` leaves the signature out."""
    headers = {"Content-Type": "application/json", "X-GitHub-Event": event,
               "X-GitHub-Delivery": delivery or str(uuid.uuid4()), "User-Agent": "GitHub-Hookshot/test"}
    if signature is not None:
        headers["X-Hub-Signature-256"] = signature
    elif secret is not None:
        headers["X-Hub-Signature-256"] = sign(secret, body)
    return headers


def drain(client: Any) -> int:
    """Let the webhook intake process every pending delivery now (the test apps run without their
    background threads); returns how many deliveries it settled."""
    return int(client.app.state.ctx.webhook.intake.drain())


def run_of(client: Any, resp: Any) -> int:
    """The run a ``queued`` webhook answer leads to, once the intake has processed it."""
    assert resp.status_code == 202 and resp.json()["status"] == "queued", resp.text
    drain(client)
    delivery = client.app.state.ctx.store.get_delivery(resp.json()["delivery"])
    assert delivery is not None and delivery.status == "accepted" and delivery.run_id is not None, delivery
    return int(delivery.run_id)
