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


_SAME_REPO = object()


#: ``pull_request.updated_at`` of the test payloads: a head pushed before any comment written now
PUSHED_AT = "2026-01-01T00:00:00Z"


def now_stamp(offset_s: float = 0.0) -> str:
    """GitHub's timestamp (whole seconds, UTC) of now plus ``offset_s``."""
    from datetime import UTC, datetime, timedelta

    return (datetime.now(UTC) + timedelta(seconds=offset_s)).strftime("%Y-%m-%dT%H:%M:%SZ")


def pr_payload(head: str, base: str, action: str = "opened", number: int = 7, repo: str = REPO,
               association: str | None = "MEMBER", head_repo: Any = _SAME_REPO, login: str = "dev",
               label: str | None = None, sender: str = "maintainer", updated_at: str = PUSHED_AT) -> dict[str, Any]:
    """A GitHub ``pull_request`` payload: by default a member's branch of the repository itself
    (trusted); ``head_repo`` names a fork (None: a deleted fork), ``association=None`` leaves
    ``author_association`` out, ``label`` adds the ``label`` of a ``labeled`` action (by ``sender``);
    ``updated_at``: when the head was pushed (default :data:`PUSHED_AT`, before any comment)."""
    head_repo = repo if head_repo is _SAME_REPO else head_repo
    pull: dict[str, Any] = {
        "number": number, "title": "Keep Resize scales in fp32", "state": "open",
        "head": {"sha": head, "ref": "feature/resize", "label": "dev:feature/resize",
                 "repo": None if head_repo is None else {"full_name": head_repo}},
        "base": {"sha": base, "ref": "main", "label": "acme:main", "repo": {"full_name": repo}},
        "user": {"login": login}, "merge_commit_sha": None, "updated_at": updated_at}
    if association is not None:
        pull["author_association"] = association
    payload: dict[str, Any] = {"action": action, "number": number, "pull_request": pull,
                               "repository": {"full_name": repo}, "sender": {"login": sender}}
    if label is not None:
        payload["label"] = {"name": label, "color": "ededed"}
    return payload


def comment_payload(number: int, body: str, association: str | None = "MEMBER", repo: str = REPO,
                    action: str = "created", on_pull_request: bool = True, login: str = "maintainer",
                    created_at: str | None = None) -> dict[str, Any]:
    """A GitHub ``issue_comment`` payload (on a pull request unless ``on_pull_request`` is False;
    ``association=None`` leaves ``author_association`` out), written ``created_at`` (default: now)."""
    issue: dict[str, Any] = {"number": number, "title": "Keep Resize scales in fp32", "state": "open"}
    if on_pull_request:
        issue["pull_request"] = {"url": f"https://api.github.com/repos/{repo}/pulls/{number}"}
    comment: dict[str, Any] = {"id": 1, "body": body, "user": {"login": login},
                               "created_at": created_at or now_stamp()}
    if association is not None:
        comment["author_association"] = association
    return {"action": action, "issue": issue, "comment": comment, "repository": {"full_name": repo},
            "sender": {"login": login}}


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
