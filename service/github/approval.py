"""Which pull requests may run at once, and how a maintainer approves the others.

Code from a pull request runs on our workers, so only a *trusted* pull request starts its run when it is
opened or pushed to (GitHub Actions likewise waits for approval before running a fork's workflow):

* trusted: its author's login is in ``AMPCI_TRUSTED_AUTHORS``, or its head branch lives in the repository
  itself (``pull_request.head.repo.full_name`` equals ``repository.full_name``) **and** its author's
  ``pull_request.author_association`` is ``OWNER``, ``MEMBER`` or ``COLLABORATOR``.  A missing field counts
  as untrusted (a deleted fork has no head repository).
* untrusted, with ``AMPCI_FORK_POLICY``: ``approve`` (default) stores a run **awaiting approval** (no job,
  commit status ``pending`` with :data:`AWAITING_DESCRIPTION`); ``always`` runs it at once anyway; ``never``
  stores no run, posts the ``error`` status :data:`REFUSED_DESCRIPTION` and refuses approvals.

An approval (:class:`Approval`) starts the run of **one head**, and only when the person behind it holds
``write``, ``maintain`` or ``admin`` on the repository (:mod:`service.github.permissions` asks GitHub, as
GitHub Actions requires write access to approve a fork's workflow run; triage and read do not approve):

* the label :data:`APPROVE_LABEL` being added, by the event's ``sender``: it approves the head the event
  carries (the head of that moment);
* a comment whose first line is :data:`APPROVE_COMMAND`, optionally followed by a 7-40 hex prefix of a
  commit (``/ampci run 1a2b3c4``), by its author (``author_association`` ``OWNER``/``MEMBER``/
  ``COLLABORATOR`` is a cheap first filter, never enough).  It approves **the head the pull request had when
  the comment was written**: of the pull request's runs, the newest whose head was pushed strictly before the
  comment's ``created_at`` (the push time is ``pull_request.updated_at`` of the opened/synchronize event,
  GitHub's own clock; for rows without it, when ampci received it).  A head pushed after the comment, even
  one that reached ampci before the comment did, is never approved by it.  A named sha must be a prefix of
  that head, else the comment is refused (one line in the delivery's reason): it names a stale or unknown
  head, and the maintainer comments again on what they reviewed.

A later push makes a new run that awaits approval again.  Payloads are HMAC-signed by GitHub, so these
fields cannot be forged; anything else (another label, a comment by someone else) starts nothing.

This module is pure: rules over plain values, no database and no network.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from service.github.sanitize import AUTHOR_MAX, free_text
from service.json_types import JsonObject
from service.settings import Settings

TRUSTED_ASSOCIATIONS = frozenset({"OWNER", "MEMBER", "COLLABORATOR"})
APPROVE_LABEL = "ampci:run"
APPROVE_COMMAND = "/ampci run"
#: Repository roles that may approve (``role_name`` of GitHub's collaborator permission answer).
APPROVING_ROLES = frozenset({"admin", "maintain", "write"})
_COMMAND = re.compile(r"^/ampci run(?:[ \t]+([0-9a-fA-F]{7,40}))?$")
#: The commit status description of a run awaiting approval.
AWAITING_DESCRIPTION = f"waiting for a maintainer: add the label {APPROVE_LABEL}"
#: The commit status description of an untrusted pull request under ``AMPCI_FORK_POLICY=never``.
REFUSED_DESCRIPTION = "not run: untrusted pull request (from a fork or a non-member); AMPCI_FORK_POLICY=never"
#: What becomes of a pull request's run (``RunRequest.approval``): started at once, stored awaiting
#: approval, or not run at all.
APPROVALS = ("trusted", "required", "refused")
APPROVAL_VIAS = ("label", "comment")
_ASSOCIATION = re.compile(r"^[A-Z_]{1,30}$")


def untrusted_reason(repo: str, head_repo: object, association: object, login: object, settings: Settings) -> str | None:
    """None when a pull request of ``repo`` may run at once (see the module docstring), else why not (a short
    phrase that never repeats a value from the payload other than a well-formed association)."""
    if isinstance(login, str) and login.lower() in settings.trusted_author_set():
        return None
    if not isinstance(head_repo, str):
        return "head repository unknown"
    if head_repo.lower() != repo.lower():
        return "head repository is a fork"
    if association not in TRUSTED_ASSOCIATIONS:
        return f"author_association {association_text(association)}"
    return None


def approval_for(reason: str | None, settings: Settings) -> str:
    """The :data:`APPROVALS` value of a pull request that is untrusted for ``reason`` (None: trusted)."""
    if reason is None or settings.fork_policy == "always":
        return "trusted"
    return "required" if settings.fork_policy == "approve" else "refused"


def is_approve_command(body: object) -> bool:
    """True when a comment's first line, trimmed, is :data:`APPROVE_COMMAND`, alone or followed by a sha
    prefix (:func:`named_sha`)."""
    return isinstance(body, str) and _COMMAND.match(body.split("\n", 1)[0].strip()) is not None


def named_sha(body: object) -> str | None:
    """The lower-case 7-40 hex prefix an approve command names (``/ampci run 1a2b3c4``); None when it names none."""
    found = _COMMAND.match(body.split("\n", 1)[0].strip()) if isinstance(body, str) else None
    return found.group(1).lower() if found is not None and found.group(1) else None


def role_approves(answer: object) -> bool:
    """Whether GitHub's answer to ``GET /repos/{repo}/collaborators/{user}/permission`` lets that user approve.

    ``role_name`` decides when present (``admin``, ``maintain``, ``write`` approve; ``triage``, ``read`` and
    anything else do not): ``permission`` reports maintain as ``write`` and triage as ``read``.  Without a
    ``role_name``, ``permission`` ``admin`` or ``write`` approves.  Anything malformed does not."""
    if not isinstance(answer, dict):
        return False
    role = answer.get("role_name")
    if isinstance(role, str) and role:
        return role.lower() in APPROVING_ROLES
    return answer.get("permission") in ("admin", "write")


def may_approve(association: object) -> bool:
    """Whether a commenter with this ``author_association`` may be asked about (missing: no); necessary to
    approve, never enough (:mod:`service.github.permissions` decides)."""
    return association in TRUSTED_ASSOCIATIONS


def association_text(association: object) -> str:
    """``association`` for a log line or a recorded reason (``missing`` unless well-formed)."""
    return association if isinstance(association, str) and _ASSOCIATION.match(association) else "missing"


@dataclass(frozen=True)
class Approval:
    """A maintainer's approval of a pull request's head, decided from a verified delivery.

    ``head_sha``: the head approved (label: the head at that moment); None for a comment, which approves the
    head of the pull request when it was written (``written_at``, ISO 8601) if that head's run awaits approval,
    and only if it starts with ``named`` (the sha prefix the comment names) when given.  ``request``: for a
    label, the stored form (``RunRequest.to_payload()``) of that head's run, created at once when the head has
    no run yet.  ``body_sha256``: of the signed raw body (the dedup key of a run created from ``request``).
    ``installation``: the App installation that sent it (to ask GitHub about ``by`` with).
    """

    repo: str
    pr_number: int
    via: str
    by: str | None = None
    head_sha: str | None = None
    request: JsonObject | None = None
    body_sha256: str | None = None
    written_at: str | None = None
    named: str | None = None
    installation: int | None = None

    def to_payload(self) -> JsonObject:
        """The compact JSON form stored with a pending delivery (:meth:`from_payload` reads it back)."""
        return {"v": 1, "kind": "approval", "repo": self.repo, "pr": self.pr_number, "via": self.via,
                "by": self.by, "head_sha": self.head_sha, "request": self.request, "body": self.body_sha256,
                "written_at": self.written_at, "named": self.named, "installation": self.installation}

    @classmethod
    def from_payload(cls, data: object) -> Approval:
        """The approval :meth:`to_payload` stored; ValueError for anything else."""
        if not isinstance(data, dict) or data.get("v") != 1 or data.get("kind") != "approval":
            raise ValueError("not a stored approval")
        repo, pr, via, by, head = data["repo"], data["pr"], data["via"], data.get("by"), data.get("head_sha")
        request, body = data.get("request"), data.get("body")
        if not isinstance(repo, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", repo):
            raise ValueError("approval: bad repository")
        if not isinstance(pr, int) or isinstance(pr, bool) or not 1 <= pr <= 2**31 - 1:
            raise ValueError("approval: bad pull request number")
        if via not in APPROVAL_VIAS:
            raise ValueError(f"approval: unknown via {str(via)[:20]!r}")
        if head is not None and not (isinstance(head, str) and re.fullmatch(r"[0-9a-f]{40}", head)):
            raise ValueError("approval: head is not 40 lower-case hex")
        if body is not None and not (isinstance(body, str) and re.fullmatch(r"[0-9a-f]{64}", body)):
            raise ValueError("approval: body hash is not 64 hex")
        if request is not None and not isinstance(request, dict):
            raise ValueError("approval: bad request")
        written, named, installation = data.get("written_at"), data.get("named"), data.get("installation")
        if written is not None:
            datetime.fromisoformat(str(written))  # ValueError for anything else
        if named is not None and not (isinstance(named, str) and re.fullmatch(r"[0-9a-f]{7,40}", named)):
            raise ValueError("approval: named sha is not 7-40 lower-case hex")
        if installation is not None and not (type(installation) is int and 0 < installation < 2**63):
            raise ValueError("approval: installation id is not a positive integer")
        return cls(repo=repo, pr_number=pr, via=via, by=free_text(by, AUTHOR_MAX) if isinstance(by, str) else None,
                   head_sha=head, request=request, body_sha256=body,
                   written_at=str(written) if written is not None else None, named=named, installation=installation)


def pushed_time(meta: JsonObject, created_at: datetime) -> datetime:
    """When GitHub saw a pull request run's head pushed: its ``meta.github.pushed_at`` (the event's
    ``pull_request.updated_at``), else ``created_at`` (when ampci stored the run; naive: UTC)."""
    github = meta.get("github")
    stamp = github.get("pushed_at") if isinstance(github, dict) else None
    if isinstance(stamp, str):
        try:
            return _utc(datetime.fromisoformat(stamp))
        except ValueError:
            pass
    return _utc(created_at)


def head_when_written(runs: Sequence[tuple[JsonObject, datetime, int, str]],
                      approval: Approval) -> tuple[int | None, str | None]:
    """(the run id of the head a comment ``approval`` approves, None), or (None, why none: one line).

    ``runs``: the pull request's runs as (meta, created_at, id, head sha).  The head is the one pushed last
    (:func:`pushed_time`; ties: the newer run) strictly before the comment's ``written_at``, so a head pushed
    after the comment is never chosen, even one ampci heard of first; a sha the comment names must be a
    prefix of it (module docstring)."""
    if approval.written_at is None:
        return None, "no run awaits approval: the comment's time is unknown"
    written = _utc(datetime.fromisoformat(approval.written_at))
    before = [(pushed_time(meta, created), run_id, sha) for meta, created, run_id, sha in runs
              if pushed_time(meta, created) < written]
    if not before:
        return None, "no run awaits approval: no head of the pull request was pushed before the comment"
    _, run_id, sha = max(before)
    if approval.named is not None and not sha.startswith(approval.named):
        return None, (f"refused: the comment names {approval.named[:12]}, but the head when it was written was "
                      f"{sha[:12]} (a stale or unknown sha)")
    return run_id, None


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Approved:
    """What an :class:`Approval` did (``RunDispatcher.approve``): the run it concerned (None: no run of the
    pull request awaits approval), whether it started that run now, the run's head, and the reason recorded."""

    run_id: int | None
    started: bool
    sha: str | None
    reason: str
