"""Fork pull requests wait for a maintainer's approval (issue 31): end to end through the webhook, the
intake, the real PostgreSQL store, the real Redis job queue and the loopback GitHub stand-in that keeps
commit statuses as GitHub does."""

from __future__ import annotations

import logging
import re
import time
from typing import Any

import pytest
import redis
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from service.github.approval import AWAITING_DESCRIPTION, REFUSED_DESCRIPTION
from service.vocabulary import AWAITING_APPROVAL
from tests.service.api.conftest import make_reporter
from tests.service.api.helpers import (
    REPO,
    comment_payload,
    drain,
    encode,
    pr_payload,
    run_of,
    sha,
    webhook_headers,
)
from tests.service.github.test_pr_report import GitHubStandIn

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

PR = 7
FORK = "stranger/amp-pass"
BASE = sha("approval-base")


class StatusStandIn(GitHubStandIn):
    """The stand-in, also keeping each commit status by its commit, and refusing one GitHub would refuse
    (unknown state, description over 140 characters, no context): 422."""

    def __init__(self, server: HTTPServer) -> None:
        self.by_sha: dict[str, list[dict[str, Any]]] = {}
        super().__init__(server)

    def handle(self, request: Request) -> Response:
        if m := re.fullmatch(rf"/repos/{REPO}/statuses/([0-9a-f]{{40}})", request.path):
            body = request.json
            if (body.get("state") not in ("error", "failure", "pending", "success")
                    or len(body.get("description", "")) > 140 or not body.get("context")):
                return Response('{"message": "Validation Failed"}', status=422, content_type="application/json")
            self.by_sha.setdefault(m.group(1), []).append(body)
        return super().handle(request)


class World:
    """The app (reporting commit statuses to the stand-in), its store and queue, and the events GitHub sends."""

    def __init__(self, client: Any, store: Any, github: StatusStandIn, reporter: Any, redis_url: str,
                 queue: str) -> None:
        self.client, self.store, self.github, self.reporter = client, store, github, reporter
        self.redis, self.queue = redis.Redis.from_url(redis_url), queue

    def post(self, event: str, payload: Any, delivery: str | None = None, body: bytes | None = None) -> Any:
        body = body if body is not None else encode(payload)
        return self.client.post("/webhooks/github", content=body, headers=webhook_headers(body, event, delivery))

    def pr(self, head: str, action: str = "opened", **kw: Any) -> Any:
        return self.post("pull_request", pr_payload(head, BASE, action=action, number=PR, **kw))

    def fork_pr(self, head: str, action: str = "opened", **kw: Any) -> int:
        """A contributor's pull request from a fork; the run it makes (asserted awaiting approval)."""
        kw.setdefault("head_repo", FORK)
        kw.setdefault("association", "CONTRIBUTOR")
        resp = self.pr(head, action, **kw)
        assert resp.json().get("approval") == "required", resp.text
        return run_of(self.client, resp)

    def label(self, head: str, name: str = "ampci:run") -> Any:
        return self.post("pull_request", pr_payload(head, BASE, action="labeled", number=PR, head_repo=FORK,
                                                    association="CONTRIBUTOR", label=name))

    def comment(self, body: str, association: str | None = "MEMBER", **kw: Any) -> Any:
        return self.post("issue_comment", comment_payload(PR, body, association=association, **kw))

    def settled(self, resp: Any) -> Any:
        """The delivery of ``resp`` once the intake has processed it."""
        drain(self.client)
        return self.store.get_delivery(resp.json()["delivery"])

    def messages(self) -> int:
        """Job messages sent to the broker so far (one per job dispatched)."""
        return int(self.redis.llen(self.queue))

    def statuses(self, head: str) -> list[tuple[str, str]]:
        """(state, description) of the commit statuses the stand-in received for ``head``, oldest first."""
        self.reporter.check_watched(self.store)
        for _ in range(20):
            self.reporter.drain()
            if self.reporter.outbox.pending_count() == 0:
                break
            time.sleep(0.05)
        assert self.reporter.outbox.dead() == []  # nothing the stand-in refused
        return [(s["state"], s["description"]) for s in self.github.by_sha.get(head, [])]

    def runs_of(self, head: str) -> list[Any]:
        return [r for r in self.store.list_runs(limit=100) if r.revision_sha == head]


@pytest.fixture
def world(httpserver: HTTPServer, make_client: Any, make_settings: Any, store: Any, queue: str,
          redis_url: str) -> Any:
    def make(**overrides: Any) -> World:
        github = StatusStandIn(httpserver)
        settings = make_settings(github_api_url=httpserver.url_for("/"), **overrides)
        reporter = make_reporter(settings, redis_url, queue, store=store, reports=frozenset({"status"}),
                                 backoff_base=0.01, backoff_cap=0.05)
        return World(make_client(settings, reporter=reporter), store, github, reporter, redis_url, queue)

    return make


def _is_awaiting(store: Any, run_id: int) -> bool:
    return store.get_run(run_id).status == AWAITING_APPROVAL and store.jobs(run_id) == []


@pytest.mark.parametrize(("head_repo", "association"), [
    (FORK, "CONTRIBUTOR"),   # a contributor's fork
    (FORK, "MEMBER"),        # a member's fork: the code is still not the repository's
    (None, "MEMBER"),        # a deleted fork (GitHub sends head.repo null)
    (REPO, "CONTRIBUTOR"),   # a branch of the repository by someone who is no member (e.g. pushed by a bot)
    (REPO, "NONE"),
    (REPO, None),            # no author_association at all: untrusted
])
def test_an_untrusted_pull_request_waits_with_no_job_and_a_pending_status(world: Any, head_repo: Any,
                                                                          association: Any) -> None:
    w = world()
    head = sha(f"untrusted-{head_repo}-{association}")
    resp = w.pr(head, head_repo=head_repo, association=association)
    assert resp.status_code == 202 and resp.json()["approval"] == "required", resp.text
    run_id = run_of(w.client, resp)
    assert _is_awaiting(w.store, run_id) and w.messages() == 0
    assert w.store.get_run(run_id).meta["github"]["approval"] == "required"
    assert w.statuses(head) == [("pending", AWAITING_DESCRIPTION)]
    assert "awaiting approval" in w.store.get_delivery(resp.json()["delivery"]).reason


@pytest.mark.parametrize("association", ["OWNER", "MEMBER", "COLLABORATOR"])
def test_a_members_pull_request_from_the_repository_runs_at_once(world: Any, association: str) -> None:
    w = world()
    head = sha(f"member-{association}")
    resp = w.pr(head, association=association)
    assert "approval" not in resp.json()
    run = w.store.get_run(run_of(w.client, resp))
    assert run.status == "queued" and len(w.store.jobs(run.id)) == 4 and w.messages() == 4
    assert w.statuses(head) == [("pending", "queued")]


def test_a_trusted_author_runs_at_once_even_from_a_fork(world: Any) -> None:
    w = world(trusted_authors="renovate-bot,Alice")
    head = sha("trusted-author")
    run = w.store.get_run(run_of(w.client, w.pr(head, head_repo=FORK, association="NONE", login="alice")))
    assert run.status == "queued" and w.messages() == 4
    # anyone else from that fork still waits
    assert _is_awaiting(w.store, w.fork_pr(sha("untrusted-author"), login="mallory"))
    assert w.messages() == 4


def test_the_label_starts_the_run_of_the_head_current_then(world: Any) -> None:
    w = world()
    h1, h2 = sha("label-1"), sha("label-2")
    run1, run2 = w.fork_pr(h1), w.fork_pr(h2, "synchronize")
    other = w.label(h2, name="good first issue")
    assert other.status_code == 202 and other.json()["status"] == "ignored"
    assert _is_awaiting(w.store, run2) and w.messages() == 0
    assert w.statuses(h2) == [("pending", AWAITING_DESCRIPTION)]
    resp = w.label(h2)
    assert resp.status_code == 202 and resp.json()["approval"] == "label" and resp.json()["sha"] == h2
    delivery = w.settled(resp)
    assert (delivery.status, delivery.run_id) == ("accepted", run2)
    run = w.store.get_run(run2)
    assert run.status == "queued" and len(w.store.jobs(run2)) == 4 and w.messages() == 4
    assert run.meta["github"]["approved_via"] == "label" and run.meta["github"]["approved_by"] == "maintainer"
    assert _is_awaiting(w.store, run1)  # the older head was not approved
    assert w.statuses(h2) == [("pending", AWAITING_DESCRIPTION), ("pending", "queued")]
    # the same label event again (a redelivery under a new id, or removed and added again): nothing more
    w.settled(w.label(h2))
    assert w.messages() == 4 and len(w.store.jobs(run2)) == 4


def test_a_label_approves_only_the_head_it_names(world: Any) -> None:
    w = world()
    h1, h2 = sha("named-1"), sha("named-2")
    run1, run2 = w.fork_pr(h1), w.fork_pr(h2, "synchronize")
    # labelled while h1 was the head; the delivery arrives after the push of h2
    assert w.settled(w.label(h1)).run_id == run1
    assert w.store.get_run(run1).status == "queued" and w.messages() == 4
    assert _is_awaiting(w.store, run2)


def test_a_label_on_a_head_without_a_run_starts_one(world: Any) -> None:
    w = world()
    head = sha("label-first")
    delivery = w.settled(w.label(head))
    run = w.store.get_run(delivery.run_id)
    assert (run.revision_sha, run.status, run.meta["github"]["pr"]) == (head, "queued", PR)
    assert w.messages() == 4


@pytest.mark.parametrize("association", ["OWNER", "MEMBER", "COLLABORATOR"])
def test_a_maintainers_comment_starts_the_newest_run(world: Any, association: str) -> None:
    w = world()
    h1, h2 = sha("comment-1"), sha("comment-2")
    run1, run2 = w.fork_pr(h1), w.fork_pr(h2, "synchronize")
    resp = w.comment("  /ampci run  \r\nthe change looks safe to run", association=association)
    assert resp.status_code == 202 and resp.json()["approval"] == "comment", resp.text
    assert w.settled(resp).run_id == run2
    assert w.store.get_run(run2).status == "queued" and w.messages() == 4
    assert w.store.get_run(run2).meta["github"]["approved_via"] == "comment"
    assert _is_awaiting(w.store, run1)
    assert w.statuses(h2)[-1] == ("pending", "queued")


@pytest.mark.parametrize("association", ["CONTRIBUTOR", "NONE", "FIRST_TIME_CONTRIBUTOR", "MANNEQUIN", None])
def test_a_comment_by_anyone_else_does_nothing_and_its_body_is_not_logged(world: Any, association: Any,
                                                                          caplog: Any) -> None:
    w = world()
    run_id = w.fork_pr(sha(f"hostile-{association}"))
    caplog.set_level(logging.INFO, logger="service.github.events")
    resp = w.post("issue_comment", comment_payload(PR, "/ampci run\nSECRET-MARKER please", association=association,
                                                   login="mallory"), delivery="d-hostile")
    assert resp.status_code == 202 and resp.json()["status"] == "ignored", resp.text
    assert "may not approve" in resp.json()["reason"]
    drain(w.client)
    assert _is_awaiting(w.store, run_id) and w.messages() == 0
    logged = [r for r in caplog.records if "/ampci run" in r.getMessage()]
    assert logged and all(r.levelno == logging.INFO and "mallory" in r.getMessage() for r in logged)
    assert not any("SECRET-MARKER" in r.getMessage() for r in caplog.records)
    assert "SECRET-MARKER" not in w.store.get_delivery("d-hostile").reason


@pytest.mark.parametrize(("body", "kw"), [
    ("please /ampci run", {}),                      # not the first line's command
    ("/ampci running late", {}),
    ("/ampci run", {"on_pull_request": False}),     # on an issue
    ("/ampci run", {"action": "edited"}),           # an edited comment
])
def test_other_comments_do_nothing(world: Any, body: str, kw: dict[str, Any]) -> None:
    w = world()
    run_id = w.fork_pr(sha(f"other-{body}-{kw}"))
    resp = w.comment(body, **kw)
    assert resp.status_code == 202 and resp.json()["status"] == "ignored", resp.text
    drain(w.client)
    assert _is_awaiting(w.store, run_id) and w.messages() == 0


def test_a_comment_with_no_run_awaiting_does_nothing(world: Any) -> None:
    w = world()
    nothing = w.settled(w.comment("/ampci run"))  # a pull request with no run at all
    assert (nothing.status, nothing.run_id) == ("accepted", None) and "no run awaits approval" in nothing.reason
    run = run_of(w.client, w.pr(sha("trusted-running")))  # the newest run already runs
    again = w.settled(w.comment("/ampci run"))
    assert again.run_id == run and "not awaiting approval" in again.reason
    assert w.store.list_runs(limit=10)[0].id == run and w.messages() == 4


def test_a_push_after_approval_waits_again_until_approved_again(world: Any) -> None:
    w = world()
    h1, h2, h3 = sha("sync-1"), sha("sync-2"), sha("sync-3")
    run1 = w.fork_pr(h1)
    w.settled(w.comment("/ampci run"))
    assert w.store.get_run(run1).status == "queued" and w.messages() == 4
    run2 = w.fork_pr(h2, "synchronize")  # the label may still be on the PR: a push waits all the same
    assert _is_awaiting(w.store, run2) and w.messages() == 4
    assert w.statuses(h2) == [("pending", AWAITING_DESCRIPTION)]
    w.settled(w.comment("/ampci run"))
    assert w.store.get_run(run2).status == "queued" and w.messages() == 8
    run3 = w.fork_pr(h3, "synchronize")
    w.settled(w.label(h3))  # the label removed and added again
    assert w.store.get_run(run3).status == "queued" and w.messages() == 12


def test_two_approvals_start_the_run_once(world: Any) -> None:
    w = world()
    head = sha("twice")
    run_id = w.fork_pr(head)
    label, comment = w.label(head), w.comment("/ampci run")
    drain(w.client)
    reasons = [w.store.get_delivery(r.json()["delivery"]).reason for r in (label, comment)]
    assert len(w.store.jobs(run_id)) == 4 and w.messages() == 4, reasons
    assert sum("started" in r for r in reasons) == 1


def test_policy_always_runs_untrusted_pull_requests_at_once(world: Any) -> None:
    w = world(fork_policy="always")
    resp = w.pr(sha("always"), head_repo=FORK, association="NONE")
    assert "approval" not in resp.json()
    assert w.store.get_run(run_of(w.client, resp)).status == "queued" and w.messages() == 4


def test_policy_never_runs_no_untrusted_pull_request_and_refuses_approvals(world: Any) -> None:
    w = world(fork_policy="never")
    head = sha("never")
    resp = w.pr(head, head_repo=FORK, association="CONTRIBUTOR")
    assert resp.json()["approval"] == "refused"
    delivery = w.settled(resp)
    assert (delivery.status, delivery.run_id) == ("accepted", None) and "not run" in delivery.reason
    assert w.runs_of(head) == [] and w.messages() == 0
    assert w.statuses(head) == [("error", REFUSED_DESCRIPTION)]
    for approval in (w.label(head), w.comment("/ampci run")):
        assert approval.json()["status"] == "ignored" and "refused" in approval.json()["reason"]
    drain(w.client)
    assert w.runs_of(head) == [] and w.messages() == 0
    # trusted pull requests and pushes still run
    assert w.store.get_run(run_of(w.client, w.pr(sha("never-member")))).status == "queued"
    assert w.messages() == 4
