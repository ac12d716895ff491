"""Pure parsing of webhook payloads and the signature check (no database, no network)."""

from __future__ import annotations

import pytest

from service.github.events import (
    Ignored,
    PayloadError,
    Ping,
    RepositoryNotAllowedError,
    RunRequest,
    parse_event,
)
from service.github.signature import sign, verify_signature
from service.settings import Settings
from tests.service.api.helpers import REPO, encode, pr_payload, push_payload, sha

SETTINGS = Settings(allowed_repos=f"{REPO}, other/repo", tracked_branches="main,release")


def test_signature_matches_githubs_documented_example():
    # https://docs.github.com/webhooks/using-webhooks/validating-webhook-deliveries
    secret, body = "It's a Secret to Everybody", b"Hello, World!"
    expected = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    assert sign(secret, body) == expected
    assert verify_signature(secret, body, expected)
    assert not verify_signature(secret, body + b" ", expected)
    assert not verify_signature(secret, body, expected.upper())
    assert not verify_signature(secret, body, expected[7:])
    assert not verify_signature("", body, sign("", body))
    assert not verify_signature(secret, body, None)
    assert not verify_signature(secret, body, "sha256=ä")


def test_push_records_its_commits_without_inventing_parent_links():
    """A payload lists commits without parents (a pushed merge lists its branch's commits in line, a long push
    only part of them): none is linked; the finisher reads the links from git (test_push_history.py)."""
    c1, c2 = sha("1"), sha("2")
    got = parse_event("push", encode(push_payload(c2, before=sha("0"), commits=[c1, c2])), SETTINGS)
    assert isinstance(got, RunRequest)
    assert [(r.sha, r.parents, r.message) for r in got.revisions] == [(c1, [], f"commit {c1[:7]}"),
                                                                      (c2, [], f"commit {c2[:7]}")]
    assert (got.trigger, got.head_sha, got.baseline_sha, got.branch, got.sweep) == ("push", c2, sha("0"), "main", "smoke")


@pytest.mark.parametrize("flag", ["forced", "created"])
def test_first_parent_is_unknown_for_forced_pushes_and_new_branches(flag: str):
    c1 = sha("f")
    got = parse_event("push", encode(push_payload(c1, commits=[c1], **{flag: True})), SETTINGS)
    assert isinstance(got, RunRequest) and got.revisions[0].parents == []


def test_a_forced_push_is_compared_with_its_nearest_swept_ancestor_not_the_old_tip():
    """After a forced push the old tip (``before``) may be on no path to the new head: comparing with it would
    charge the pass with whatever the rewritten commits changed.  No baseline is named, so detection takes the
    nearest ancestor of the head with results (as for a new branch)."""
    head, old_tip = sha("new"), sha("rewritten")
    forced = parse_event("push", encode(push_payload(head, before=old_tip, commits=[head], forced=True)), SETTINGS)
    plain = parse_event("push", encode(push_payload(head, before=old_tip, commits=[head])), SETTINGS)
    assert isinstance(forced, RunRequest) and isinstance(plain, RunRequest)
    assert (forced.baseline_sha, plain.baseline_sha) == (None, old_tip)


def test_push_moving_a_branch_to_an_existing_commit_records_the_head():
    head = sha("existing")
    got = parse_event("push", encode(push_payload(head, commits=[])), SETTINGS)
    assert isinstance(got, RunRequest) and [r.sha for r in got.revisions] == [head]
    assert got.revisions[0].message == f"commit {head[:7]}"


def test_shas_are_normalised_to_lower_case_and_repo_match_is_case_insensitive():
    head = sha("upper").upper()
    got = parse_event("push", encode(push_payload(head, repo=REPO.upper(), commits=[head])), SETTINGS)
    assert isinstance(got, RunRequest) and got.head_sha == head.lower() and got.repo == REPO.upper()


def test_ignored_pushes():
    assert isinstance(parse_event("push", encode(push_payload(sha("b"), branch="dev")), SETTINGS), Ignored)
    assert isinstance(parse_event("push", encode(push_payload(sha("r"), branch="release")), SETTINGS), RunRequest)
    assert "deleted" in parse_event("push", encode(push_payload("0" * 40, deleted=True)), SETTINGS).reason


def test_pull_request_actions():
    head, base = sha("h"), sha("b")
    got = parse_event("pull_request", encode(pr_payload(head, base, action="synchronize", number=12)), SETTINGS)
    assert isinstance(got, RunRequest)
    assert (got.trigger, got.head_sha, got.baseline_sha, got.pr_number) == ("pull_request", head, base, 12)
    for action in ("closed", "labeled", "edited"):
        assert isinstance(parse_event("pull_request", encode(pr_payload(head, base, action=action)), SETTINGS), Ignored)


def test_ping_and_unknown_events():
    assert parse_event("ping", b'{"zen": "Half measures are as bad as nothing at all."}', SETTINGS) == \
        Ping("Half measures are as bad as nothing at all.")
    assert isinstance(parse_event("check_run", b"{}", SETTINGS), Ignored)


def test_allowlist():
    with pytest.raises(RepositoryNotAllowedError):
        parse_event("push", encode(push_payload(sha("x"), repo="evil/repo")), SETTINGS)
    with pytest.raises(RepositoryNotAllowedError):  # an empty allowlist admits nothing...
        parse_event("push", encode(push_payload(sha("x"))), Settings(allowed_repos=""))
    dev = Settings(allowed_repos="", insecure_dev=True)  # ...except in development
    assert isinstance(parse_event("push", encode(push_payload(sha("x"))), dev), RunRequest)


@pytest.mark.parametrize(("body", "needle"), [
    (b"", "malformed JSON"), (b"null", "JSON object"), (b'"x"', "JSON object"),
    (encode({"ref": "refs/heads/main"}), "invalid payload"),
    (encode({**push_payload(sha("a")), "repository": {"full_name": "no-slash"}}), "repository.full_name"),
    (encode({**push_payload(sha("a")), "before": 42}), "before"),
])
def test_malformed_payloads_are_payload_errors(body: bytes, needle: str):
    with pytest.raises(PayloadError, match=needle):
        parse_event("push", body, SETTINGS)
