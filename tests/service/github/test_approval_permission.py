"""Approval by permission, for a head (issue 40, point 8): end to end through the webhook, the intake, the real
PostgreSQL store and Redis queue, and the loopback GitHub stand-in that answers ``GET /repos/{repo}/
collaborators/{user}/permission`` as GitHub does (maintain shows as write, triage as read with its
``role_name``, a non-collaborator 404)."""

from __future__ import annotations

from typing import Any

import pytest
from pytest_httpserver import HTTPServer

from service.github.approval import AWAITING_DESCRIPTION, role_approves
from service.github.intake import UNCHECKED_DESCRIPTION
from service.vocabulary import AWAITING_APPROVAL
from tests.service.api.conftest import make_reporter
from tests.service.api.helpers import PUSHED_AT, drain, now_stamp, pr_payload, sha
from tests.service.github.github_standin import ROLE_PERMISSION
from tests.service.github.test_fork_approval import BASE, FORK, PR, StatusStandIn, World
from tests.waiting import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

APPROVING = ("admin", "maintain", "write")
NOT_APPROVING = ("triage", "read", None)  # None: not a collaborator (GitHub answers 404)


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


def _awaiting(w: World, run_id: int) -> bool:
    return w.store.get_run(run_id).status == AWAITING_APPROVAL and w.store.jobs(run_id) == []


def _label_by(w: World, head: str, sender: str) -> Any:
    return w.post("pull_request", pr_payload(head, BASE, action="labeled", number=PR, head_repo=FORK,
                                             association="CONTRIBUTOR", label="ampci:run", sender=sender))


def test_the_role_rule_enumerates_githubs_roles() -> None:
    """Every repository role GitHub has, as its permission answer reads: only admin, maintain and write approve
    (the answer's ``permission`` alone would let maintain pass as write and triage fail as read)."""
    for role, permission in ROLE_PERMISSION.items():
        assert role_approves({"permission": permission, "role_name": role}) is (role in APPROVING), role
    assert role_approves({"permission": "write"}) and not role_approves({"permission": "read"})
    assert not role_approves({"permission": "none"}) and not role_approves(None)


@pytest.mark.parametrize("via", ["comment", "label"])
@pytest.mark.parametrize("role", NOT_APPROVING)
def test_a_member_without_write_access_does_not_start_the_run(world: Any, via: str, role: str | None) -> None:
    """An organisation MEMBER with read or triage access (or none: 404) comments ``/ampci run`` or adds the
    label: GitHub is asked, and nothing starts."""
    w = world()
    if role is not None:
        w.github.roles["reader"] = role
    head = sha(f"reader-{via}-{role}")
    run_id = w.fork_pr(head)
    resp = w.comment("/ampci run", association="MEMBER", login="reader") if via == "comment" else \
        _label_by(w, head, "reader")
    delivery = w.settled(resp)
    assert delivery.status == "accepted" and delivery.run_id is None
    assert "not approved" in delivery.reason and "reader" in delivery.reason
    assert _awaiting(w, run_id) and w.messages() == 0
    assert w.github.permission_asked == ["reader"]
    assert w.statuses(head) == [("pending", AWAITING_DESCRIPTION)]


@pytest.mark.parametrize("via", ["comment", "label"])
@pytest.mark.parametrize("role", APPROVING)
def test_a_collaborator_with_write_access_starts_the_run(world: Any, via: str, role: str) -> None:
    w = world()
    w.github.roles["writer"] = role
    head = sha(f"writer-{via}-{role}")
    run_id = w.fork_pr(head)
    resp = w.comment("/ampci run", association="COLLABORATOR", login="writer") if via == "comment" else \
        _label_by(w, head, "writer")
    assert w.settled(resp).run_id == run_id
    run = w.store.get_run(run_id)
    assert run.status == "queued" and w.messages() == 4 and run.meta["github"]["approved_by"] == "writer"
    assert w.github.permission_asked == ["writer"]


def test_a_push_after_the_comment_is_not_approved_by_it(world: Any) -> None:
    """The maintainer comments on h1; h2 is pushed a few seconds later and its event even reaches ampci before
    the comment's: the comment approves h1, the head when it was written, never h2."""
    w = world()
    h1, h2 = sha("late-push-1"), sha("late-push-2")
    run1 = w.fork_pr(h1)
    written = now_stamp()
    run2 = w.fork_pr(h2, "synchronize", updated_at=now_stamp(5))
    delivery = w.settled(w.comment("/ampci run", created_at=written))
    assert delivery.run_id == run1, delivery.reason
    assert w.store.get_run(run1).status == "queued" and w.messages() == 4
    assert _awaiting(w, run2)
    # a comment written after the push approves it
    assert w.settled(w.comment("/ampci run", created_at=now_stamp(10))).run_id == run2
    assert w.store.get_run(run2).status == "queued" and w.messages() == 8


def test_a_comment_naming_a_stale_sha_is_refused_in_one_line(world: Any) -> None:
    w = world()
    h1, h2 = sha("named-sha-1"), sha("named-sha-2")
    run1, run2 = w.fork_pr(h1), w.fork_pr(h2, "synchronize")  # both pushed before the comment: h2 is the head
    for stale in (h1[:10], h1, sha("never-pushed")[:7]):
        delivery = w.settled(w.comment(f"/ampci run {stale}\nreviewed"))
        assert delivery.run_id is None and "refused" in delivery.reason and "stale" in delivery.reason
        assert "\n" not in delivery.reason and h2[:12] in delivery.reason
        assert _awaiting(w, run1) and _awaiting(w, run2) and w.messages() == 0
    assert w.settled(w.comment(f"/ampci run {h2[:7].upper()}")).run_id == run2
    assert w.store.get_run(run2).status == "queued" and _awaiting(w, run1) and w.messages() == 4


def test_without_credentials_only_the_listed_approvers_approve(world: Any) -> None:
    """No App, no token: GitHub cannot be asked, so only AMPCI_APPROVERS logins approve (an OWNER outside it
    does not), by comment or label."""
    w = world(github_token="", approvers="alice, Bob")
    h1, h2 = sha("no-credentials-1"), sha("no-credentials-2")
    run1 = w.fork_pr(h1)
    refused = w.settled(w.comment("/ampci run", association="OWNER", login="maintainer"))
    assert refused.run_id is None and "AMPCI_APPROVERS" in refused.reason
    assert _awaiting(w, run1) and w.messages() == 0
    assert w.settled(w.comment("/ampci run", association="MEMBER", login="ALICE")).run_id == run1
    assert w.store.get_run(run1).status == "queued" and w.messages() == 4
    run2 = w.fork_pr(h2, "synchronize")
    assert w.settled(_label_by(w, h2, "maintainer")).run_id is None and _awaiting(w, run2)
    assert w.settled(_label_by(w, h2, "bob")).run_id == run2 and w.messages() == 8
    assert w.github.permission_asked == []


def test_an_unanswered_permission_question_keeps_the_run_waiting_and_says_why(world: Any) -> None:
    """GitHub answers the permission question 503: the approval stays pending, the run waits with a status that
    says so; once GitHub answers, the approval goes through."""
    w = world()
    head = sha("permission-503")
    run_id = w.fork_pr(head)
    assert w.statuses(head) == [("pending", AWAITING_DESCRIPTION)]
    w.github.fail["permission"] = 503
    resp = w.comment("/ampci run")
    drain(w.client)
    assert w.store.get_delivery(resp.json()["delivery"]).status == "pending"
    assert _awaiting(w, run_id) and w.messages() == 0
    assert w.statuses(head) == [("pending", AWAITING_DESCRIPTION), ("pending", UNCHECKED_DESCRIPTION)]
    del w.github.fail["permission"]
    wait_until(lambda: drain(w.client) > 0 or w.store.get_delivery(resp.json()["delivery"]).status != "pending",
               timeout=30, what="the approval retried")
    assert w.store.get_delivery(resp.json()["delivery"]).run_id == run_id
    assert w.store.get_run(run_id).status == "queued" and w.messages() == 4
    assert w.statuses(head)[-1] == ("pending", "queued")


def test_a_permission_is_asked_once_within_its_ttl_and_a_refusal_is_not_kept_long(world: Any) -> None:
    w = world()
    checker = w.client.app.state.ctx.webhook.intake.approvers
    now = [1000.0]
    checker.clock = lambda: now[0]
    h1, h2 = sha("cached-1"), sha("cached-2")
    run1 = w.fork_pr(h1)
    assert w.settled(w.comment("/ampci run")).run_id == run1
    run2 = w.fork_pr(h2, "synchronize")
    now[0] += checker.allow_ttl_s - 1
    assert w.settled(w.comment("/ampci run")).run_id == run2  # within the TTL: no second question
    assert w.github.permission_asked == ["maintainer"] and w.messages() == 8
    # a refusal is kept only a few seconds: access granted meanwhile counts soon after
    run3 = w.fork_pr(sha("cached-3"), "synchronize")
    assert w.settled(w.comment("/ampci run", login="newcomer")).run_id is None
    w.github.roles["newcomer"] = "write"
    assert w.settled(w.comment("/ampci run", login="newcomer")).run_id is None  # still cached
    now[0] += checker.refusal_ttl_s + 0.1
    assert w.settled(w.comment("/ampci run", login="newcomer")).run_id == run3
    assert w.github.permission_asked == ["maintainer", "newcomer", "newcomer"]
    assert checker.refusal_ttl_s < checker.allow_ttl_s and PUSHED_AT < now_stamp()
