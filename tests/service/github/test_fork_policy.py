"""Who may run code on our workers (issue 31), without a database: the settings ``AMPCI_FORK_POLICY`` and
``AMPCI_TRUSTED_AUTHORS``, the decision :func:`service.github.events.parse_event` takes for each pull
request, label and comment, and the stored form of approvals."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from service.cli.main import main
from service.errors import ConfigError
from service.github.approval import APPROVALS, Approval
from service.github.events import Ignored, PayloadError, RunRequest, parse_event, stored_request
from service.settings import FORK_POLICIES, Settings
from tests.service.api.helpers import REPO, comment_payload, encode, pr_payload, sha

FORK = "stranger/amp-pass"
APPROVE = Settings(allowed_repos=REPO)


# -- settings -----------------------------------------------------------------------------------------
def test_defaults_wait_for_approval_and_trust_nobody_by_name() -> None:
    settings = Settings.from_env({})
    assert (settings.fork_policy, settings.trusted_author_set()) == ("approve", frozenset())


@pytest.mark.parametrize("policy", FORK_POLICIES)
def test_every_policy_parses(policy: str) -> None:
    assert Settings.from_env({"AMPCI_FORK_POLICY": f" {policy.upper()} "}).fork_policy == policy


def test_trusted_authors_are_a_normalised_comma_list() -> None:
    settings = Settings.from_env({"AMPCI_TRUSTED_AUTHORS": " Alice, renovate[bot] ,, b-o-b "})
    assert settings.trusted_authors == "Alice,renovate[bot],b-o-b"
    assert settings.trusted_author_set() == frozenset({"alice", "renovate[bot]", "b-o-b"})


@pytest.mark.parametrize(("env", "variable"), [
    ({"AMPCI_FORK_POLICY": "sometimes"}, "AMPCI_FORK_POLICY"),
    ({"AMPCI_FORK_POLICY": ""}, "AMPCI_FORK_POLICY"),
    ({"AMPCI_TRUSTED_AUTHORS": "alice bob"}, "AMPCI_TRUSTED_AUTHORS"),      # a space, not a comma
    ({"AMPCI_TRUSTED_AUTHORS": "-alice"}, "AMPCI_TRUSTED_AUTHORS"),         # GitHub logins start alphanumeric
    ({"AMPCI_TRUSTED_AUTHORS": "al--ice"}, "AMPCI_TRUSTED_AUTHORS"),
    ({"AMPCI_TRUSTED_AUTHORS": "a" * 40}, "AMPCI_TRUSTED_AUTHORS"),         # at most 39 characters
    ({"AMPCI_TRUSTED_AUTHORS": "owner/name"}, "AMPCI_TRUSTED_AUTHORS"),
])
def test_a_malformed_value_is_a_one_line_error_naming_the_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError) as err:
        Settings.from_env(env)
    assert str(err.value).startswith(f"{variable}: ") and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=variable):  # settings built directly are checked too
        Settings(**{variable.removeprefix("AMPCI_").lower(): next(iter(env.values()))})


def test_the_cli_refuses_to_start_with_a_malformed_policy(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.setenv("AMPCI_FORK_POLICY", "sometimes")
    assert main(["runs"]) == 2
    err = capsys.readouterr().err.strip()
    assert "AMPCI_FORK_POLICY: expected one of approve, always, never" in err and "\n" not in err


# -- pull requests ---------------------------------------------------------------------------------------
def _pr(settings: Settings = APPROVE, **kw: Any) -> Any:
    return parse_event("pull_request", encode(pr_payload(sha("head"), sha("base"), **kw)), settings)


@pytest.mark.parametrize(("head_repo", "association", "trusted"), [
    (REPO, "OWNER", True), (REPO, "MEMBER", True), (REPO, "COLLABORATOR", True),
    (REPO.upper(), "MEMBER", True),                   # GitHub names are case-insensitive
    (REPO, "CONTRIBUTOR", False), (REPO, "FIRST_TIME_CONTRIBUTOR", False), (REPO, "NONE", False),
    (REPO, "member", False),                          # GitHub sends upper case; anything else is unknown
    (REPO, None, False), (REPO, 7, False),             # missing or malformed: untrusted
    (FORK, "OWNER", False), (FORK, "MEMBER", False), (None, "MEMBER", False), ({"x": 1}, "MEMBER", False),
])
def test_only_a_members_branch_of_the_repository_is_trusted(head_repo: Any, association: Any, trusted: bool) -> None:
    payload = pr_payload(sha("head"), sha("base"), association="MEMBER")
    payload["pull_request"]["head"]["repo"] = {"full_name": head_repo} if isinstance(head_repo, str) else head_repo
    payload["pull_request"]["author_association"] = association
    if association is None:
        del payload["pull_request"]["author_association"]
    got = parse_event("pull_request", encode(payload), APPROVE)
    assert isinstance(got, RunRequest) and got.approval == ("trusted" if trusted else "required")
    assert (got.untrusted is None) == trusted


def test_a_missing_head_repository_is_untrusted() -> None:
    payload = pr_payload(sha("head"), sha("base"))
    del payload["pull_request"]["head"]["repo"]
    assert parse_event("pull_request", encode(payload), APPROVE).approval == "required"


@pytest.mark.parametrize(("login", "trusted"), [("alice", True), ("ALICE", True), ("alice2", False), ("", False)])
def test_trusted_authors_are_trusted_from_forks(login: str, trusted: bool) -> None:
    settings = replace(APPROVE, trusted_authors="Alice,bob")
    got = _pr(settings, head_repo=FORK, association="NONE", login=login)
    assert got.approval == ("trusted" if trusted else "required")


@pytest.mark.parametrize(("policy", "untrusted_gets"), [("approve", "required"), ("always", "trusted"),
                                                         ("never", "refused")])
def test_the_policy_decides_for_untrusted_pull_requests_only(policy: str, untrusted_gets: str) -> None:
    settings = replace(APPROVE, fork_policy=policy)
    assert _pr(settings, head_repo=FORK, association="CONTRIBUTOR").approval == untrusted_gets
    assert _pr(settings).approval == "trusted"
    assert untrusted_gets in APPROVALS


def test_the_label_approves_the_head_of_that_moment() -> None:
    got = _pr(action="labeled", label="ampci:run", head_repo=FORK, association="NONE")
    assert isinstance(got, Approval) and (got.via, got.pr_number, got.head_sha, got.by) == \
        ("label", 7, sha("head"), "maintainer")
    request = RunRequest.from_payload(got.request)
    assert (request.head_sha, request.approval, request.pr_number) == (sha("head"), "trusted", 7)
    for other in ("AMPCI:RUN ", "ampci:run-later", "bug"):
        assert isinstance(_pr(action="labeled", label=other), Ignored)
    assert isinstance(_pr(action="labeled"), Ignored)  # no label in the payload
    assert isinstance(_pr(action="unlabeled", label="ampci:run"), Ignored)
    never = replace(APPROVE, fork_policy="never")
    assert "refused" in _pr(never, action="labeled", label="ampci:run").reason


# -- comments ----------------------------------------------------------------------------------------------
def _comment(body: str, settings: Settings = APPROVE, **kw: Any) -> Any:
    return parse_event("issue_comment", encode(comment_payload(7, body, **kw)), settings)


@pytest.mark.parametrize("body", ["/ampci run", "  /ampci run\t", "/ampci run\r\nlooks fine", "/ampci run\n\n/x"])
def test_a_maintainers_command_is_an_approval_of_the_pull_request(body: str) -> None:
    got = _comment(body, created_at="2026-03-04T05:06:07Z")
    assert isinstance(got, Approval) and (got.via, got.pr_number, got.head_sha, got.request) == ("comment", 7, None, None)
    assert (got.written_at, got.named) == ("2026-03-04T05:06:07+00:00", None)  # the head then is approved


@pytest.mark.parametrize(("body", "named"), [("/ampci run 1a2b3c4", "1a2b3c4"), ("/ampci run\t" + "AB" * 20, "ab" * 20),
                                             ("  /ampci run 0123456789abc  \nreviewed", "0123456789abc")])
def test_a_command_may_name_the_sha_it_approves(body: str, named: str) -> None:
    got = _comment(body)
    assert isinstance(got, Approval) and got.named == named
    assert stored_request(got.to_payload()) == got


def test_a_comment_without_its_time_approves_nothing() -> None:
    payload = comment_payload(7, "/ampci run")
    del payload["comment"]["created_at"]
    got = parse_event("issue_comment", encode(payload), APPROVE)
    assert isinstance(got, Ignored) and "created_at" in got.reason


@pytest.mark.parametrize(("body", "kw", "why"), [
    ("/ampci run", {"association": "CONTRIBUTOR"}, "may not approve"),
    ("/ampci run", {"association": "NONE"}, "may not approve"),
    ("/ampci run", {"association": None}, "may not approve"),
    ("/ampci run", {"association": "member"}, "may not approve"),
    ("/ampci run", {"on_pull_request": False}, "not a pull request"),
    ("/ampci run", {"action": "edited"}, "needs no run"),
    ("/ampci run", {"action": "deleted"}, "needs no run"),
    ("/AMPCI RUN", {}, "not an ampci command"),
    ("/ampci runs", {}, "not an ampci command"),
    ("/ampci run 1a2b3c", {}, "not an ampci command"),      # a sha prefix of fewer than 7 digits
    ("/ampci run " + "a" * 41, {}, "not an ampci command"),  # more than 40
    ("/ampci run main", {}, "not an ampci command"),        # not a sha
    ("lgtm\n/ampci run", {}, "not an ampci command"),
    ("", {}, "not an ampci command"),
])
def test_anything_else_is_ignored(body: str, kw: dict[str, Any], why: str) -> None:
    got = _comment(body, **kw)
    assert isinstance(got, Ignored) and why in got.reason and "lgtm" not in got.reason  # no body recorded


def test_a_comment_body_of_another_type_is_not_a_command_and_policy_never_refuses() -> None:
    payload = comment_payload(7, "/ampci run")
    payload["comment"]["body"] = ["/ampci run"]
    assert isinstance(parse_event("issue_comment", encode(payload), APPROVE), Ignored)
    assert "refused" in _comment("/ampci run", replace(APPROVE, fork_policy="never")).reason


def test_comments_from_other_repositories_are_refused_like_any_event() -> None:
    from service.github.events import RepositoryNotAllowedError

    with pytest.raises(RepositoryNotAllowedError):
        _comment("/ampci run", repo="evil/repo")
    with pytest.raises(PayloadError, match="issue"):
        parse_event("issue_comment", encode({"action": "created", "repository": {"full_name": REPO}}), APPROVE)


# -- the stored form ------------------------------------------------------------------------------------
def test_stored_requests_round_trip_and_old_rows_stay_trusted() -> None:
    approval = replace(_comment("/ampci run"), body_sha256="a" * 64)
    assert stored_request(approval.to_payload()) == approval
    label = _pr(action="labeled", label="ampci:run")
    assert stored_request(label.to_payload()) == label
    untrusted = _pr(head_repo=FORK, association="NONE")
    assert stored_request(untrusted.to_payload()) == untrusted
    old = untrusted.to_payload()
    del old["approval"], old["untrusted"]  # a row stored before approvals existed was trusted then
    assert stored_request(old).approval == "trusted"


@pytest.mark.parametrize("change", [{"via": "email"}, {"pr": 0}, {"pr": True}, {"head_sha": "x"},
                                    {"repo": "no-slash"}, {"body": "zz"}, {"request": "x"}, {"named": "abc"},
                                    {"named": "G" * 7}, {"written_at": "yesterday"}, {"installation": 0}])
def test_a_corrupt_stored_approval_is_a_payload_error(change: dict[str, Any]) -> None:
    with pytest.raises(PayloadError, match="stored payload unreadable"):
        stored_request({**_comment("/ampci run").to_payload(), **change})
    with pytest.raises(PayloadError):
        stored_request({**_pr().to_payload(), "approval": "maybe"})
