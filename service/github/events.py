"""Parse verified GitHub webhook payloads into run requests.

:func:`parse_event` is a pure function of (event name, raw body, settings): it never touches the
database or the network.  It returns a :class:`RunRequest` (store a run and enqueue it), a
:class:`Ping`, or an :class:`Ignored` with the reason; malformed input raises :class:`PayloadError`
whose message is the one-line reason recorded for the rejected delivery.

What the payloads carry (and what they do not):

* ``push`` lists at most 2,048 commits (a longer push lists only part of them), oldest first, without their
  parents -- a pushed merge lists the merged branch's commits too.  So no parent link is taken from the payload:
  its commits are recorded with their authors and messages only, the run's baseline is ``before`` (the old tip;
  for a fast-forward push an ancestor of ``after``, not necessarily its parent), and the run's first-parent
  history with every parent link is read from git before it is judged
  (:func:`service.orchestration.pass_repo.record_run_ancestry`, in the worker that finishes the run).
* ``pull_request`` carries the base branch tip (``base.sha``), not the merge base.  We record the
  base tip as the run's baseline; the worker resolves ``git merge-base head base`` when it checks out
  the revision (see docs/api.md, "Webhook and HTTP API").
* whether a pull request's code may run at once (head repository, author association, author login)
  and its approval (a ``labeled`` ``pull_request``, an ``issue_comment``): :mod:`service.github.approval`.
  An ``issue_comment`` is read only for that; its body is never stored or logged.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from datetime import datetime

from pydantic import StrictBool, StrictInt, ValidationError, field_validator

from service.github.approval import (
    APPROVE_COMMAND,
    APPROVE_LABEL,
    Approval,
    approval_for,
    association_text,
    is_approve_command,
    may_approve,
    named_sha,
    untrusted_reason,
)
from service.github.installations import InstallationChange, parse_installation_event
from service.github.payloads import Installation as _Installation
from service.github.payloads import PayloadModel as _Model
from service.github.payloads import Ref as _Ref
from service.github.payloads import Repository as _Repository
from service.github.payloads import RepositoryNotAllowedError, check_repository
from service.github.payloads import clone_url as _clone_url
from service.github.payloads import validation_reason as _validation_reason
from service.github.sanitize import (
    AUTHOR_MAX,
    BRANCH_MAX,
    MESSAGE_MAX,
    REF_MAX,
    TooDeepError,
    check_json_depth,
    free_text,
    name_text,
    sane_time,
)
from service.github.stored import (
    PayloadError,
    RevisionInfo,
    RunRequest,
    change_key,
    check_commit_sha,
    check_number,
    stored_request,
)
from service.json_types import JsonObject, JsonValue
from service.settings import Settings

__all__ = ["Approval", "Decision", "Ignored", "PayloadError", "Ping", "RepositoryNotAllowedError", "RevisionInfo",
           "RunRequest", "check_repository", "parse_event", "stored_request"]

log = logging.getLogger(__name__)

ZERO_SHA = "0" * 40
PR_ACTIONS = frozenset({"opened", "synchronize", "reopened"})
#: The action class of a pull-request event in its change key: every action in PR_ACTIONS asks for
#: the same thing -- measure this head -- so an ``opened`` re-sent as ``synchronize``, or a reopen of a
#: head already measured, leads to the run its first delivery made.
PR_ACTION_CLASS = {action: "head" for action in PR_ACTIONS}


def _before_text(value: object, limit: int) -> object:
    """A free-text field made storable *before* pydantic's own ``str`` check, which refuses a lone
    surrogate (``"\\ud800"`` from JSON) instead of letting :func:`free_text` replace it; a value that
    is not a string is left for pydantic to refuse.  JSON ``null`` stays None."""
    return free_text(value, limit) if isinstance(value, str) else value


class _Person(_Model):
    name: str | None = None
    email: str | None = None
    username: str | None = None

    @field_validator("name", "email", "username", mode="before")
    @classmethod
    def _text(cls, v: object) -> object:
        return _before_text(v, AUTHOR_MAX)


class _Commit(_Model):
    id: str
    message: str = ""
    timestamp: datetime | None = None
    author: _Person | None = None

    @field_validator("id")
    @classmethod
    def _sha(cls, v: str) -> str:
        return check_commit_sha(v)

    @field_validator("message", mode="before")
    @classmethod
    def _message(cls, v: object) -> object:
        return _before_text(v, MESSAGE_MAX)

    @field_validator("timestamp")
    @classmethod
    def _time(cls, v: datetime | None) -> datetime | None:
        return sane_time(v)


class _Push(_Model):
    ref: str
    before: str
    after: str
    repository: _Repository
    commits: list[_Commit] = []
    head_commit: _Commit | None = None
    deleted: StrictBool = False
    created: StrictBool = False
    forced: StrictBool = False
    installation: _Installation | None = None  # present when a GitHub App receives the event

    @field_validator("before", "after")
    @classmethod
    def _shas(cls, v: str) -> str:
        return check_commit_sha(v)

    @field_validator("ref")
    @classmethod
    def _ref(cls, v: str) -> str:
        return name_text(v, REF_MAX)


class _User(_Model):
    login: str | None = None

    @field_validator("login", mode="before")
    @classmethod
    def _login(cls, v: object) -> object:
        return _before_text(v, AUTHOR_MAX)


class _PullRequestBody(_Model):
    number: StrictInt
    title: str = ""
    head: _Ref
    base: _Ref
    user: _User | None = None
    author_association: JsonValue = None  # only compared with approval.TRUSTED_ASSOCIATIONS
    updated_at: datetime | None = None

    @field_validator("number")
    @classmethod
    def _num(cls, v: int) -> int:
        return check_number(v)

    @field_validator("title", mode="before")
    @classmethod
    def _title(cls, v: object) -> object:
        return _before_text(v, MESSAGE_MAX)

    @field_validator("updated_at")
    @classmethod
    def _time(cls, v: datetime | None) -> datetime | None:
        return sane_time(v)


class _Label(_Model):
    name: JsonValue = None


class _PullRequest(_Model):
    action: str
    number: StrictInt | None = None
    pull_request: _PullRequestBody
    repository: _Repository
    label: _Label | None = None  # action "labeled": the label added
    sender: _User | None = None
    installation: _Installation | None = None

    @field_validator("number")
    @classmethod
    def _num(cls, v: int | None) -> int | None:
        return None if v is None else check_number(v)


class _Issue(_Model):
    number: StrictInt
    pull_request: JsonValue = None  # present (an object) when the issue is a pull request

    @field_validator("number")
    @classmethod
    def _num(cls, v: int) -> int:
        return check_number(v)


class _Comment(_Model):
    body: JsonValue = None  # only compared with approval.APPROVE_COMMAND: never stored or logged
    user: _User | None = None
    author_association: JsonValue = None
    created_at: datetime | None = None  # the head it approves is the pull request's head at this time

    @field_validator("created_at")
    @classmethod
    def _time(cls, v: datetime | None) -> datetime | None:
        return sane_time(v)


class _IssueComment(_Model):
    action: str
    issue: _Issue
    comment: _Comment
    repository: _Repository
    installation: _Installation | None = None


class _Ping(_Model):
    zen: str = ""
    hook_id: StrictInt | None = None
    repository: _Repository | None = None

    @field_validator("zen", mode="before")
    @classmethod
    def _zen(cls, v: object) -> object:
        return _before_text(v, 200)


@dataclass(frozen=True)
class Ping:
    """GitHub's hook test event; answered 200 and nothing else (``repo``: the repository it named, recorded
    with the delivery)."""

    zen: str
    repo: str | None = None


@dataclass(frozen=True)
class Ignored:
    """A valid delivery that needs no run (answered 202); ``reason`` is recorded."""

    reason: str


Decision = RunRequest | Approval | Ping | Ignored | InstallationChange


def _load(body: bytes) -> JsonObject:
    """The JSON object of a UTF-8 body nested at most MAX_JSON_DEPTH deep; PayloadError otherwise
    (the depth is checked by a linear scan before parsing, so no input can recurse the parser)."""
    try:
        text = body.decode("utf-8")
        check_json_depth(text)
        data = json.loads(text)
    except TooDeepError as exc:
        raise PayloadError(f"malformed JSON: {exc}") from None
    except RecursionError:  # not reachable after the scan; kept so that it can never be a 500
        raise PayloadError("malformed JSON: nested too deep") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise PayloadError(f"malformed JSON: {exc}".splitlines()[0][:200]) from None
    if not isinstance(data, dict):
        raise PayloadError("malformed payload: expected a JSON object")
    return data


def _author(person: _Person | None) -> str | None:
    if person is None:
        return None
    if person.name and person.email:
        return f"{person.name} <{person.email}>"
    return person.name or person.username or person.email


def _parse_push(data: JsonObject, settings: Settings) -> Decision:
    try:
        push = _Push.model_validate(data)
    except ValidationError as exc:
        raise PayloadError(_validation_reason(exc)) from None
    check_repository(push.repository.full_name, settings)
    if not push.ref.startswith("refs/heads/"):
        return Ignored(f"push to {push.ref[:100]} is not a branch")
    branch = push.ref[len("refs/heads/"):]
    if push.deleted or push.after == ZERO_SHA:
        return Ignored(f"branch {branch[:100]} deleted")
    if branch not in settings.tracked_branch_set():
        return Ignored(f"branch {branch[:100]} is not tracked")
    if len(branch) > BRANCH_MAX:
        raise PayloadError(f"invalid payload: ref: branch name longer than {BRANCH_MAX} characters")
    # no parents: the payload does not give them, and a chain of its commits is wrong for merges and truncated lists
    revisions = [RevisionInfo(sha=c.id, parents=[], branch=branch, author=_author(c.author), message=c.message,
                              committed_at=c.timestamp) for c in push.commits]
    if not any(r.sha == push.after for r in revisions):
        head = push.head_commit
        revisions.append(RevisionInfo(
            sha=push.after, parents=[], branch=branch, author=_author(head.author) if head else None,
            message=head.message if head else "", committed_at=head.timestamp if head else None))
    # a forced push's `before` is the branch's old tip, which the new head need not descend from: the baseline is
    # then the nearest swept ancestor of the head (git's links, recorded when the run finishes), as for a new branch
    baseline = push.before if push.before != ZERO_SHA and not push.forced else None
    return RunRequest(repo=push.repository.full_name, trigger="push", head_sha=push.after,
                      baseline_sha=baseline, branch=branch, revisions=revisions,
                      change_sha256=change_key("push", push.repository.full_name.lower(), push.ref,
                                               push.before, push.after),
                      installation=push.installation.id if push.installation else None,
                      clone_url=_clone_url(push.repository, settings))


def _parse_pull_request(data: JsonObject, settings: Settings) -> Decision:
    try:
        event = _PullRequest.model_validate(data)
    except ValidationError as exc:
        raise PayloadError(_validation_reason(exc)) from None
    check_repository(event.repository.full_name, settings)
    if event.action == "labeled":
        return _approval_by_label(event, settings)
    if event.action not in PR_ACTIONS:
        return Ignored(f"pull_request action {event.action[:50]!r} needs no run")
    pr = event.pull_request
    head_repo = pr.head.repo.get("full_name") if isinstance(pr.head.repo, dict) else None
    reason = untrusted_reason(event.repository.full_name, head_repo, pr.author_association,
                              pr.user.login if pr.user else None, settings)
    request = _pull_request_run(event, approval_for(reason, settings), reason)
    return replace(request, change_sha256=change_key("pull_request", event.repository.full_name.lower(), pr.number,
                                                     pr.head.sha, PR_ACTION_CLASS[event.action]),
                   installation=event.installation.id if event.installation else None,
                   clone_url=_clone_url(event.repository, settings))


def _pull_request_run(event: _PullRequest, approval: str, untrusted: str | None) -> RunRequest:
    pr = event.pull_request
    head = RevisionInfo(sha=pr.head.sha, parents=[], branch=pr.head.ref,
                        author=pr.user.login if pr.user else None,
                        message=f"PR #{pr.number}: {pr.title}", committed_at=None)
    base = RevisionInfo(sha=pr.base.sha, parents=[], branch=pr.base.ref, author=None, message="",
                        committed_at=None)
    return RunRequest(repo=event.repository.full_name, trigger="pull_request", head_sha=pr.head.sha,
                      baseline_sha=pr.base.sha, branch=pr.head.ref, pr_number=pr.number,
                      revisions=[base, head], approval=approval, untrusted=untrusted,
                      pushed_at=pr.updated_at.isoformat() if pr.updated_at is not None else None)


def _approval_by_label(event: _PullRequest, settings: Settings) -> Decision:
    """The label ampci:run approves the head of that moment, when its sender may approve (asked of GitHub in
    the intake: triage may label, but does not approve)."""
    if event.label is None or event.label.name != APPROVE_LABEL:
        return Ignored(f"pull_request label is not {APPROVE_LABEL}")
    if settings.fork_policy == "never":
        return Ignored("approval refused: AMPCI_FORK_POLICY=never")
    pr = event.pull_request
    request = replace(_pull_request_run(event, "trusted", None),  # started at once when that head has no run yet
                      installation=event.installation.id if event.installation else None,
                      clone_url=_clone_url(event.repository, settings))
    return Approval(repo=event.repository.full_name, pr_number=pr.number, via="label",
                    by=event.sender.login if event.sender else None, head_sha=pr.head.sha,
                    request=request.to_payload(), installation=request.installation)


def _parse_issue_comment(data: JsonObject, settings: Settings) -> Decision:
    """An ``issue_comment`` matters only as an approval: ``/ampci run [SHA]`` on a pull request by an
    OWNER/MEMBER/COLLABORATOR (a first filter: the intake asks GitHub for the author's permission), with the
    time it was written.  The comment's body is compared, never stored or logged (a named sha is kept)."""
    try:
        event = _IssueComment.model_validate(data)
    except ValidationError as exc:
        raise PayloadError(_validation_reason(exc)) from None
    check_repository(event.repository.full_name, settings)
    if event.action != "created":
        return Ignored(f"issue_comment action {event.action[:50]!r} needs no run")
    if not isinstance(event.issue.pull_request, dict):
        return Ignored("comment on an issue, not a pull request")
    if not is_approve_command(event.comment.body):
        return Ignored("comment is not an ampci command")
    who = event.comment.user.login if event.comment.user else None
    if not may_approve(event.comment.author_association):
        association = association_text(event.comment.author_association)
        log.info("%s on %s#%d by %s ignored: author_association %s may not approve", APPROVE_COMMAND,
                 event.repository.full_name, event.issue.number, (who or "unknown")[:100], association)
        return Ignored(f"{APPROVE_COMMAND} by a commenter who may not approve (author_association {association})")
    if settings.fork_policy == "never":
        return Ignored("approval refused: AMPCI_FORK_POLICY=never")
    if event.comment.created_at is None:
        return Ignored(f"{APPROVE_COMMAND} comment without created_at: the head it approves is unknown")
    return Approval(repo=event.repository.full_name, pr_number=event.issue.number, via="comment", by=who,
                    written_at=event.comment.created_at.isoformat(), named=named_sha(event.comment.body),
                    installation=event.installation.id if event.installation else None)


def parse_event(event: str, body: bytes, settings: Settings) -> Decision:
    """Decide what a verified delivery asks for.

    Guarantees: never raises anything but :class:`PayloadError` (400) or
    :class:`RepositoryNotAllowedError` (403); every sha in the result is 40 lower-case hex; only
    pushes to tracked branches and opened/synchronize/reopened pull requests of allowed
    repositories produce a :class:`RunRequest` (``approval`` says whether a pull request's run may
    start: :mod:`service.github.approval`), and a ``check_run`` ``rerequested`` of an ampci check run or a
    ``check_suite`` ``rerequested`` of ampci's suite (:mod:`service.github.rerequest`); only the label
    ampci:run being added to a pull request, or a ``/ampci run [SHA]`` comment on one by an
    OWNER/MEMBER/COLLABORATOR, produces an :class:`Approval` (none under ``AMPCI_FORK_POLICY=never``); whether
    its author may approve is asked of GitHub in the intake (:mod:`service.github.permissions`).
    """
    data = _load(body)
    if event == "ping":
        try:
            ping = _Ping.model_validate(data)
        except ValidationError as exc:
            raise PayloadError(_validation_reason(exc)) from None
        return Ping(zen=free_text(ping.zen, 200) or "",
                    repo=ping.repository.full_name if ping.repository is not None else None)
    if event == "push":
        return _parse_push(data, settings)
    if event == "pull_request":
        return _parse_pull_request(data, settings)
    if event == "issue_comment":
        return _parse_issue_comment(data, settings)
    if event in ("check_run", "check_suite"):  # GitHub's "Re-run" / "Re-run all checks" of ampci's checks
        from service.github.rerequest import rerun_request

        rerun = rerun_request(event, data, settings)
        return rerun if isinstance(rerun, RunRequest) else Ignored(rerun)
    if event in ("installation", "installation_repositories"):  # the App uninstalled, suspended, narrowed...
        return parse_installation_event(event, data)
    return Ignored(f"event {event[:50]!r} is not handled")
