"""Installations come and go (issue 41, point 4), against the loopback GitHub: after the App was uninstalled
and installed again, a report of a run stored before (which names the dead installation) is not dropped: the
404 for the old installation makes ampci forget it and look the repository's installation up again."""

from __future__ import annotations

from pytest_httpserver import HTTPServer

from service.github.client import CommitStatus, PermanentStatusError
from service.github.outbox import MemoryOutbox
from service.github.reporter import StatusReporter
from tests.service.api.helpers import REPO, sha
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
