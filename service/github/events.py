"""Parse verified GitHub webhook payloads into run requests.

:func:`parse_event` is a pure function of (event name, raw body, settings): it never touches the
database or the network.  It returns a :class:`RunRequest` (store a run and enqueue it), a
:class:`Ping`, or an :class:`Ignored` with the reason; malformed input raises :class:`PayloadError`
whose message is the one-line reason recorded for the rejected delivery.

What the payloads carry (and what they do not):

* ``push`` lists at most 20 commits, oldest first, without their parents.  We record the parent
  chain the payload implies: commit *i*'s first parent is commit *i-1*, the first commit's parent is
  ``before`` (unless the push is forced or creates the branch, where it is unknown and left empty).
  Second parents of merge commits are not in the payload; the worker fills them from git.
* ``pull_request`` carries the base branch tip (``base.sha``), not the merge base.  We record the
  base tip as the run's baseline; the worker resolves ``git merge-base head base`` when it checks out
  the revision (see README "Webhook and HTTP API").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, ValidationError, field_validator

from service.errors import UserError
from service.github.sanitize import (
    AUTHOR_MAX,
    BRANCH_MAX,
    MESSAGE_MAX,
    REF_MAX,
    REPOSITORY_MAX,
    TooDeepError,
    check_json_depth,
    free_text,
    name_text,
    sane_time,
)
from service.settings import Settings

SHA_RE = re.compile(r"^[0-9a-fA-F]{40}$")
ZERO_SHA = "0" * 40
MAX_NUMBER = 2**31 - 1  # PR numbers are stored and compared as database integers
PR_ACTIONS = frozenset({"opened", "synchronize", "reopened"})
SMOKE_SWEEP = "smoke"


class PayloadError(UserError):
    """A delivery that cannot be accepted (HTTP 400); the message is the recorded reason."""


class RepositoryNotAllowedError(UserError):
    """A correctly signed delivery from a repository outside ``AMPCI_ALLOWED_REPOS`` (HTTP 403)."""


def _check_sha(value: str) -> str:
    if not SHA_RE.match(value):
        raise ValueError(f"not a 40-hex commit sha: {value[:60]!r}")
    return value.lower()


def _before_text(value: Any, limit: int) -> Any:
    """A free-text field made storable *before* pydantic's own ``str`` check, which refuses a lone
    surrogate (``"\\ud800"`` from JSON) instead of letting :func:`free_text` replace it; a value that
    is not a string is left for pydantic to refuse.  JSON ``null`` stays None."""
    return free_text(value, limit) if isinstance(value, str) else value


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", str_max_length=1_000_000)


class _Repository(_Model):
    full_name: str

    @field_validator("full_name")
    @classmethod
    def _owner_name(cls, v: str) -> str:
        if len(v) > REPOSITORY_MAX or not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", v):
            raise ValueError(f"not an owner/name repository: {v[:100]!r}")
        return v


def _number(v: int) -> int:
    if not 1 <= v <= MAX_NUMBER:
        raise ValueError(f"must be between 1 and {MAX_NUMBER}")
    return v


class _Person(_Model):
    name: str | None = None
    email: str | None = None
    username: str | None = None

    @field_validator("name", "email", "username", mode="before")
    @classmethod
    def _text(cls, v: Any) -> Any:
        return _before_text(v, AUTHOR_MAX)


class _Commit(_Model):
    id: str
    message: str = ""
    timestamp: datetime | None = None
    author: _Person | None = None

    @field_validator("id")
    @classmethod
    def _sha(cls, v: str) -> str:
        return _check_sha(v)

    @field_validator("message", mode="before")
    @classmethod
    def _message(cls, v: Any) -> Any:
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

    @field_validator("before", "after")
    @classmethod
    def _shas(cls, v: str) -> str:
        return _check_sha(v)

    @field_validator("ref")
    @classmethod
    def _ref(cls, v: str) -> str:
        return name_text(v, REF_MAX)


class _Ref(_Model):
    sha: str
    ref: str

    @field_validator("sha")
    @classmethod
    def _sha(cls, v: str) -> str:
        return _check_sha(v)

    @field_validator("ref")
    @classmethod
    def _ref(cls, v: str) -> str:
        return name_text(v, BRANCH_MAX)


class _User(_Model):
    login: str | None = None

    @field_validator("login", mode="before")
    @classmethod
    def _login(cls, v: Any) -> Any:
        return _before_text(v, AUTHOR_MAX)


class _PullRequestBody(_Model):
    number: StrictInt
    title: str = ""
    head: _Ref
    base: _Ref
    user: _User | None = None
    updated_at: datetime | None = None

    @field_validator("number")
    @classmethod
    def _num(cls, v: int) -> int:
        return _number(v)

    @field_validator("title", mode="before")
    @classmethod
    def _title(cls, v: Any) -> Any:
        return _before_text(v, MESSAGE_MAX)

    @field_validator("updated_at")
    @classmethod
    def _time(cls, v: datetime | None) -> datetime | None:
        return sane_time(v)


class _PullRequest(_Model):
    action: str
    number: StrictInt | None = None
    pull_request: _PullRequestBody
    repository: _Repository

    @field_validator("number")
    @classmethod
    def _num(cls, v: int | None) -> int | None:
        return None if v is None else _number(v)


class _Ping(_Model):
    zen: str = ""
    hook_id: StrictInt | None = None
    repository: _Repository | None = None

    @field_validator("zen", mode="before")
    @classmethod
    def _zen(cls, v: Any) -> Any:
        return _before_text(v, 200)


@dataclass(frozen=True)
class RevisionInfo:
    """One commit to upsert as a revision row (parents as far as the payload shows them)."""

    sha: str
    parents: list[str]
    branch: str | None
    author: str | None
    message: str
    committed_at: datetime | None


@dataclass(frozen=True)
class RunRequest:
    """A run to create for a verified, allowed delivery.  All shas are lower-case 40 hex."""

    repo: str
    trigger: str               # "push" | "pull_request"
    head_sha: str
    baseline_sha: str | None   # push: previous head; pull_request: base branch tip (merge base later)
    branch: str
    sweep: str = SMOKE_SWEEP
    pr_number: int | None = None
    revisions: list[RevisionInfo] = field(default_factory=list)
    body_sha256: str | None = None  # of the signed raw body: a replay under a new delivery id finds its run

    @property
    def dedup_key(self) -> str | None:
        """The run's dedup key by content (``github-body:<sha256>``), None without a body hash."""
        return f"github-body:{self.body_sha256}" if self.body_sha256 else None


    def to_payload(self) -> dict[str, Any]:
        """The compact JSON form stored with a pending delivery (:meth:`from_payload` reads it back)."""
        return {"v": 1, "repo": self.repo, "trigger": self.trigger, "head_sha": self.head_sha,
                "baseline_sha": self.baseline_sha, "branch": self.branch, "sweep": self.sweep,
                "pr_number": self.pr_number, "body": self.body_sha256,
                "revisions": [[r.sha, r.parents, r.branch, r.author, r.message,
                               r.committed_at.isoformat() if r.committed_at else None] for r in self.revisions]}

    @classmethod
    def from_payload(cls, data: Any) -> RunRequest:
        """The request :meth:`to_payload` stored; PayloadError for anything else (a corrupt row)."""
        try:
            if not isinstance(data, dict) or data.get("v") != 1:
                raise ValueError("unknown payload version")
            # the same checks as at intake: a row stored by an older version cannot fail later
            revisions = [RevisionInfo(sha=_check_sha(r[0]), parents=[_check_sha(p) for p in r[1]],
                                      branch=name_text(r[2], BRANCH_MAX) if r[2] is not None else None,
                                      author=free_text(r[3], AUTHOR_MAX), message=free_text(r[4], MESSAGE_MAX) or "",
                                      committed_at=sane_time(datetime.fromisoformat(r[5])) if r[5] else None)
                         for r in data["revisions"]]
            base = data["baseline_sha"]
            pr = data["pr_number"]
            body = data.get("body")  # absent in rows stored before replay detection
            if body is not None and not (isinstance(body, str) and re.fullmatch(r"[0-9a-f]{64}", body)):
                raise ValueError("body hash is not 64 hex")
            return cls(repo=name_text(str(data["repo"]), REPOSITORY_MAX), trigger=str(data["trigger"]),
                       head_sha=_check_sha(data["head_sha"]), baseline_sha=_check_sha(base) if base else None,
                       branch=name_text(str(data["branch"]), BRANCH_MAX), sweep=name_text(str(data["sweep"]), 100),
                       pr_number=None if pr is None else _number(int(pr)), revisions=revisions,
                       body_sha256=body)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise PayloadError(f"stored payload unreadable: {exc}"[:200]) from None


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


Decision = RunRequest | Ping | Ignored


def _validation_reason(exc: ValidationError) -> str:
    err = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in err.get("loc", ())) or "payload"
    return f"invalid payload: {where}: {err.get('msg', 'invalid')}"


def _load(body: bytes) -> dict:
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


def check_repository(full_name: str, settings: Settings) -> None:
    """Raise RepositoryNotAllowedError unless ``full_name`` is on the allowlist (case-insensitive);
    an empty allowlist admits nothing, except with ``AMPCI_INSECURE_DEV``."""
    allowed = settings.allowed_repo_set()
    if full_name.lower() in allowed:
        return
    if not allowed and settings.insecure_dev:
        return  # development: an empty allowlist admits every repository
    raise RepositoryNotAllowedError(f"repository {full_name} is not in AMPCI_ALLOWED_REPOS")


def _author(person: _Person | None) -> str | None:
    if person is None:
        return None
    if person.name and person.email:
        return f"{person.name} <{person.email}>"
    return person.name or person.username or person.email


def _parse_push(data: dict, settings: Settings) -> Decision:
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
    before_known = push.before != ZERO_SHA and not push.forced and not push.created
    revisions: list[RevisionInfo] = []
    previous: str | None = push.before if before_known else None
    for c in push.commits:
        revisions.append(RevisionInfo(sha=c.id, parents=[previous] if previous else [], branch=branch,
                                      author=_author(c.author), message=c.message, committed_at=c.timestamp))
        previous = c.id
    if not any(r.sha == push.after for r in revisions):
        head = push.head_commit
        revisions.append(RevisionInfo(
            sha=push.after, parents=[], branch=branch, author=_author(head.author) if head else None,
            message=head.message if head else "", committed_at=head.timestamp if head else None))
    baseline = push.before if push.before != ZERO_SHA else None
    return RunRequest(repo=push.repository.full_name, trigger="push", head_sha=push.after,
                      baseline_sha=baseline, branch=branch, revisions=revisions)


def _parse_pull_request(data: dict, settings: Settings) -> Decision:
    try:
        event = _PullRequest.model_validate(data)
    except ValidationError as exc:
        raise PayloadError(_validation_reason(exc)) from None
    check_repository(event.repository.full_name, settings)
    if event.action not in PR_ACTIONS:
        return Ignored(f"pull_request action {event.action[:50]!r} needs no run")
    pr = event.pull_request
    head = RevisionInfo(sha=pr.head.sha, parents=[], branch=pr.head.ref,
                        author=pr.user.login if pr.user else None,
                        message=f"PR #{pr.number}: {pr.title}", committed_at=None)
    base = RevisionInfo(sha=pr.base.sha, parents=[], branch=pr.base.ref, author=None, message="",
                        committed_at=None)
    return RunRequest(repo=event.repository.full_name, trigger="pull_request", head_sha=pr.head.sha,
                      baseline_sha=pr.base.sha, branch=pr.head.ref, pr_number=pr.number,
                      revisions=[base, head])


def parse_event(event: str, body: bytes, settings: Settings) -> Decision:
    """Decide what a verified delivery asks for.

    Guarantees: never raises anything but :class:`PayloadError` (400) or
    :class:`RepositoryNotAllowedError` (403); every sha in the result is 40 lower-case hex; only
    pushes to tracked branches and opened/synchronize/reopened pull requests of allowed
    repositories produce a :class:`RunRequest`.
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
    return Ignored(f"event {event[:50]!r} is not handled")
