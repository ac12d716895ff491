"""Installations come and go (issue 41, point 4), against the loopback GitHub: after the App was uninstalled
and installed again, a report of a run stored before (which names the dead installation) is not dropped: the
404 for the old installation makes ampci forget it and look the repository's installation up again.  An
``installation`` deleted/suspend event, or a repository removed by ``installation_repositories``, stops the
reports to it (dropped without a request, one log line) and refuses its run requests, until it is back."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pytest_httpserver import HTTPServer

from service.github.client import CommitStatus, PermanentStatusError
from service.github.installations import BACK_ACTIONS, GONE_ACTIONS
from service.github.outbox import MemoryOutbox
from service.github.reporter import StatusReporter
from tests.service.api.conftest import make_reporter
from tests.service.api.helpers import REPO, encode, push_payload, sha, webhook_headers
from tests.service.github.github_standin import app_client, app_standin


def test_a_report_after_a_reinstall_finds_the_new_installation(httpserver: HTTPServer):
    gh = app_standin(httpserver)
    reporter = StatusReporter(MemoryOutbox(), app_client(httpserver), public_url="https://ci.example.com")
    old = gh.installations[REPO.lower()]
    reporter.note_installation(REPO, old)  # as a run's stored meta says
    reporter.outbox.put(CommitStatus(REPO, sha("before-reinstall"), "pending", "queued"))
    assert reporter.drain() == 1
    gh.installations[REPO.lower()] = old + 100  # uninstalled, installed again: a new id
    gh.expire_tokens()
    reporter.note_installation(REPO, old)  # a run stored before the reinstall still names the old one
    reporter.outbox.put(CommitStatus(REPO, sha("after-reinstall"), "success", "4 cells: 4 pass"))
    assert reporter.drain() == 1 and reporter.outbox.dead() == []
    assert [s["description"] for s in gh.statuses] == ["queued", "4 cells: 4 pass"]
    mints = [p for m, p in gh.requests if p.endswith("/access_tokens")]
    assert mints[-2:] == [f"/app/installations/{old}/access_tokens", f"/app/installations/{old + 100}/access_tokens"]
    # the dead id is not taken up again from old runs: no more 404s for it
    reporter.note_installation(REPO, old)
    reporter.outbox.put(CommitStatus(REPO, sha("later"), "success", "4 cells: 4 pass"))
    assert reporter.drain() == 1
    assert [p for m, p in gh.requests if p.endswith("/access_tokens")][-1] == \
        f"/app/installations/{old + 100}/access_tokens"
    reporter.close()


def test_an_uninstalled_repository_gives_up_after_one_lookup(httpserver: HTTPServer):
    gh = app_standin(httpserver)
    client = app_client(httpserver, attempts=1)
    client.remember_installation(REPO, gh.installations[REPO.lower()])
    gh.installations.clear()  # uninstalled for good
    before = len(gh.requests)
    try:
        client.post_status(CommitStatus(REPO, sha("uninstalled"), "pending", "queued"))
    except PermanentStatusError as exc:
        assert exc.status == 404
    else:
        raise AssertionError("a report to an uninstalled repository landed")
    asked = [p for _, p in gh.requests[before:]]
    assert asked == ["/app/installations/4242/access_tokens", f"/repos/{REPO}/installation"]
    client.close()


def _event(client: Any, event: str, payload: dict[str, Any]) -> Any:
    body = encode(payload)
    return client.post("/webhooks/github", content=body, headers=webhook_headers(body, event))


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.parametrize("gone", sorted(GONE_ACTIONS))
def test_a_deleted_or_suspended_installation_is_no_longer_reported_to(
        httpserver: HTTPServer, make_client: Any, make_settings: Any, store: Any, queue: str, redis_url: str,
        caplog: pytest.LogCaptureFixture, gone: str):
    gh = app_standin(httpserver)
    installation = gh.installations[REPO.lower()]
    settings = make_settings(github_api_url=httpserver.url_for("/"))
    reporter = make_reporter(settings, redis_url, queue, store=store, client=app_client(httpserver))
    client = make_client(settings, reporter=reporter)
    reporter.note_installation(REPO, installation)
    caplog.set_level(logging.WARNING, "service.github.reporter")
    resp = _event(client, "installation", {"action": gone, "installation": {"id": installation}})
    assert resp.status_code == 202 and resp.json()["status"] == "installation"
    lines = [r.getMessage() for r in caplog.records if r.name == "service.github.reporter"]
    assert lines == [f"installation {installation} {gone}: reports to it stop"]
    # queued reports are dropped without a request; the run requests it sends are refused
    before = len(gh.requests)
    reporter.outbox.put(CommitStatus(REPO, sha(f"gone-{gone}"), "success", "4 cells: 4 pass"))
    assert reporter.drain() == 0 and len(gh.requests) == before and gh.statuses == []
    assert [d["reason"] for d in reporter.outbox.dead()] == [f"not sent: installation {installation} {gone}"]
    body = encode(push_payload(sha(f"push-{gone}"), installation={"id": installation}))
    refused = client.post("/webhooks/github", content=body, headers=webhook_headers(body, "push"))
    assert refused.status_code == 403 and f"installation {installation} {gone}" in refused.json()["message"]
    # back again (reinstalled, unsuspended): reports resume
    back = "unsuspend" if gone == "suspend" else "created"
    assert back in BACK_ACTIONS
    assert _event(client, "installation", {"action": back, "installation": {"id": installation}}).status_code == 202
    reporter.outbox.put(CommitStatus(REPO, sha(f"back-{gone}"), "success", "4 cells: 4 pass"))
    assert reporter.drain() == 1 and len(gh.statuses) == 1


@pytest.mark.postgres
@pytest.mark.redis
def test_a_repository_removed_from_the_installation_is_no_longer_reported_to(
        httpserver: HTTPServer, make_client: Any, make_settings: Any, store: Any, queue: str, redis_url: str):
    gh = app_standin(httpserver)
    installation = gh.installations[REPO.lower()]
    settings = make_settings(github_api_url=httpserver.url_for("/"))
    reporter = make_reporter(settings, redis_url, queue, store=store, client=app_client(httpserver))
    client = make_client(settings, reporter=reporter)
    repos = [{"full_name": REPO, "id": 1, "name": "amp-pass"}]
    change = {"installation": {"id": installation}, "repository_selection": "selected"}
    resp = _event(client, "installation_repositories", {**change, "action": "removed", "repositories_removed": repos})
    assert resp.status_code == 202 and "1 repositories removed (acme/amp-pass)" in resp.json()["reason"]
    reporter.outbox.put(CommitStatus(REPO, sha("removed"), "pending", "queued"))
    assert reporter.drain() == 0 and gh.statuses == []
    assert reporter.outbox.dead()[-1]["reason"] == f"not sent: acme/amp-pass removed from installation {installation}"
    _event(client, "installation_repositories", {**change, "action": "added", "repositories_added": repos})
    reporter.outbox.put(CommitStatus(REPO, sha("added"), "pending", "queued"))
    assert reporter.drain() == 1 and len(gh.statuses) == 1
