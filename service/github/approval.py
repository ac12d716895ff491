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

An approval (:class:`Approval`) starts the run of **one head**: the label :data:`APPROVE_LABEL` being added
(GitHub lets only people with triage or write access label; the event carries the head of that moment), or
a comment whose first line is :data:`APPROVE_COMMAND` on the pull request by an ``OWNER``/``MEMBER``/
``COLLABORATOR`` (the newest run of that pull request, when it is awaiting approval).  A later push makes a
new run that awaits approval again.  Payloads are HMAC-signed by GitHub, so these fields cannot be forged;
anything else (another label, a comment by someone else) starts nothing.

This module is pure: rules over plain values, no database and no network.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from service.github.sanitize import AUTHOR_MAX, free_text
from service.json_types import JsonObject
from service.settings import Settings

TRUSTED_ASSOCIATIONS = frozenset({"OWNER", "MEMBER", "COLLABORATOR"})
APPROVE_LABEL = "ampci:run"
APPROVE_COMMAND = "/ampci run"
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
    """True when a comment's first line, trimmed, is :data:`APPROVE_COMMAND`."""
    return isinstance(body, str) and body.split("\n", 1)[0].strip() == APPROVE_COMMAND


def may_approve(association: object) -> bool:
    """Whether a commenter with this ``author_association`` may approve (missing: no)."""
    return association in TRUSTED_ASSOCIATIONS


def association_text(association: object) -> str:
    """``association`` for a log line or a recorded reason (``missing`` unless well-formed)."""
    return association if isinstance(association, str) and _ASSOCIATION.match(association) else "missing"


@dataclass(frozen=True)
class Approval:
    """A maintainer's approval of a pull request's head, decided from a verified delivery.

    ``head_sha``: the head approved (label: the head at that moment); None for a comment, which approves the
    newest run of the pull request when it awaits approval.  ``request``: for a label, the stored form
    (``RunRequest.to_payload()``) of that head's run, created at once when the head has no run yet.
    ``body_sha256``: of the signed raw body (the dedup key of a run created from ``request``).
    """

    repo: str
    pr_number: int
    via: str
    by: str | None = None
    head_sha: str | None = None
    request: JsonObject | None = None
    body_sha256: str | None = None

    def to_payload(self) -> JsonObject:
        """The compact JSON form stored with a pending delivery (:meth:`from_payload` reads it back)."""
        return {"v": 1, "kind": "approval", "repo": self.repo, "pr": self.pr_number, "via": self.via,
                "by": self.by, "head_sha": self.head_sha, "request": self.request, "body": self.body_sha256}

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
        return cls(repo=repo, pr_number=pr, via=via, by=free_text(by, AUTHOR_MAX) if isinstance(by, str) else None,
                   head_sha=head, request=request, body_sha256=body)


@dataclass(frozen=True)
class Approved:
    """What an :class:`Approval` did (``RunDispatcher.approve``): the run it concerned (None: no run of the
    pull request awaits approval), whether it started that run now, the run's head, and the reason recorded."""

    run_id: int | None
    started: bool
    sha: str | None
    reason: str
