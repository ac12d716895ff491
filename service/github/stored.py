"""What a webhook delivery stores for the intake: a :class:`RunRequest` or an
:class:`~service.github.approval.Approval`, in a compact, versioned JSON form.

The webhook handler (:mod:`service.github.webhook`) stores the validated request with the pending
delivery; the intake (:mod:`service.github.intake`) reads it back with :func:`stored_request`, which
checks every value again, so a row stored by an older version cannot fail later.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

from service.errors import UserError
from service.github.approval import APPROVALS, Approval
from service.github.sanitize import (
    AUTHOR_MAX,
    BRANCH_MAX,
    MESSAGE_MAX,
    REPOSITORY_MAX,
    free_text,
    name_text,
    sane_time,
)
from service.json_types import JsonObject

SHA_RE = re.compile(r"^[0-9a-fA-F]{40}$")
MAX_NUMBER = 2**31 - 1  # PR numbers are stored and compared as database integers
SMOKE_SWEEP = "smoke"


class PayloadError(UserError):
    """A delivery that cannot be accepted (HTTP 400); the message is the recorded reason."""


def check_commit_sha(value: str) -> str:
    """``value`` lower-cased when it is a 40-hex commit sha; ValueError otherwise."""
    if not SHA_RE.match(value):
        raise ValueError(f"not a 40-hex commit sha: {value[:60]!r}")
    return value.lower()


def check_number(v: int) -> int:
    """``v`` when it is a storable pull request number (1 .. MAX_NUMBER); ValueError otherwise."""
    if not 1 <= v <= MAX_NUMBER:
        raise ValueError(f"must be between 1 and {MAX_NUMBER}")
    return v


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
    body_sha256: str | None = None  # of the signed raw body (rows stored before change keys: their run's key)
    approval: str = "trusted"  # approval.APPROVALS: run at once, await a maintainer's approval, or not run
    untrusted: str | None = None  # why a pull request is not trusted (None: trusted)
    change_sha256: str | None = None  # of the change it names (:func:`change_key`): one run per change
    installation: int | None = None  # the GitHub App installation that sent it (``installation.id``)
    clone_url: str | None = None  # the repository's clone URL: the run's pass repository (AMPCI_PASS_REPO unset)
    #: a re-run ("Re-run" on GitHub) of a tracked branch's head: run only if ampci saw that head pushed there
    #: (:meth:`service.db.store.Store.pushed_head`); a fork's pull request names its own branch, maybe ``main``
    rerun_of_push: bool = False
    #: a pull request's ``updated_at`` (ISO 8601) in the event that named this head: when GitHub saw it pushed
    pushed_at: str | None = None

    @property
    def dedup_key(self) -> str | None:
        """The run's dedup key: by the change (``github-change:<sha256>``, so a re-sent or re-serialised
        delivery of the same push or pull-request head finds the run its first copy made), else by the
        signed body (``github-body:<sha256>``: rows stored before change keys, label approvals), else None."""
        if self.change_sha256:
            return f"github-change:{self.change_sha256}"
        return f"github-body:{self.body_sha256}" if self.body_sha256 else None

    def to_payload(self) -> JsonObject:
        """The compact JSON form stored with a pending delivery (:meth:`from_payload` reads it back)."""
        return {"v": 1, "repo": self.repo, "trigger": self.trigger, "head_sha": self.head_sha,
                "baseline_sha": self.baseline_sha, "branch": self.branch, "sweep": self.sweep,
                "pr_number": self.pr_number, "body": self.body_sha256, "approval": self.approval,
                "untrusted": self.untrusted, "change": self.change_sha256, "installation": self.installation,
                "clone_url": self.clone_url, "rerun_of_push": self.rerun_of_push, "pushed_at": self.pushed_at,
                "revisions": [[r.sha, r.parents, r.branch, r.author, r.message,
                               r.committed_at.isoformat() if r.committed_at else None] for r in self.revisions]}

    @classmethod
    def from_payload(cls, data: object) -> RunRequest:
        """The request :meth:`to_payload` stored; PayloadError for anything else (a corrupt row)."""
        try:
            if not isinstance(data, dict) or data.get("v") != 1:
                raise ValueError("unknown payload version")
            # the same checks as at intake: a row stored by an older version cannot fail later
            revisions = [RevisionInfo(sha=check_commit_sha(r[0]), parents=[check_commit_sha(p) for p in r[1]],
                                      branch=name_text(r[2], BRANCH_MAX) if r[2] is not None else None,
                                      author=free_text(r[3], AUTHOR_MAX), message=free_text(r[4], MESSAGE_MAX) or "",
                                      committed_at=sane_time(datetime.fromisoformat(r[5])) if r[5] else None)
                         for r in data["revisions"]]
            base = data["baseline_sha"]
            pr = data["pr_number"]
            body = data.get("body")  # absent in rows stored before replay detection
            if body is not None and not (isinstance(body, str) and re.fullmatch(r"[0-9a-f]{64}", body)):
                raise ValueError("body hash is not 64 hex")
            approval = data.get("approval", "trusted")  # absent in rows stored before approvals: trusted then
            if approval not in APPROVALS:
                raise ValueError(f"unknown approval {str(approval)[:20]!r}")
            untrusted = data.get("untrusted")
            change = data.get("change")  # absent in rows stored before change keys
            if change is not None and not (isinstance(change, str) and re.fullmatch(r"[0-9a-f]{64}", change)):
                raise ValueError("change hash is not 64 hex")
            installation = data.get("installation")
            if installation is not None and not (type(installation) is int and 0 < installation < 2**63):
                raise ValueError("installation id is not a positive integer")
            clone_url = data.get("clone_url")  # absent in rows stored before; checked again by the worker
            if clone_url is not None and not (isinstance(clone_url, str) and 0 < len(clone_url) <= 500):
                raise ValueError("clone URL is not a string of at most 500 characters")
            rerun_of_push = data.get("rerun_of_push", False)  # absent in rows stored before: not a re-run
            if type(rerun_of_push) is not bool:
                raise ValueError("rerun_of_push is not a boolean")
            pushed = data.get("pushed_at")  # absent in rows stored before
            pushed_time = sane_time(datetime.fromisoformat(str(pushed))) if pushed is not None else None
            pushed_at = pushed_time.isoformat() if pushed_time is not None else None
            return cls(repo=name_text(str(data["repo"]), REPOSITORY_MAX), trigger=str(data["trigger"]),
                       head_sha=check_commit_sha(data["head_sha"]), baseline_sha=check_commit_sha(base) if base else None,
                       branch=name_text(str(data["branch"]), BRANCH_MAX), sweep=name_text(str(data["sweep"]), 100),
                       pr_number=None if pr is None else check_number(int(pr)), revisions=revisions,
                       body_sha256=body, approval=approval,
                       untrusted=free_text(untrusted, 200) if isinstance(untrusted, str) else None,
                       change_sha256=change, installation=installation, clone_url=clone_url,
                       rerun_of_push=rerun_of_push, pushed_at=pushed_at)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise PayloadError(f"stored payload unreadable: {exc}"[:200]) from None


def change_key(*identity: object) -> str:
    """SHA-256 (hex) of a change's identity, e.g. ``("push", repo, ref, before, after)`` or
    ``("pull_request", repo, number, head, action class)``: the same change gives the same key however
    its delivery was serialised (callers pass names in one case: GitHub compares them case-insensitively)."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(list(identity), separators=(",", ":")).encode()).hexdigest()


def stored_request(data: object) -> RunRequest | Approval:
    """What a pending delivery's stored payload asks for (:meth:`RunRequest.to_payload` or
    :meth:`~service.github.approval.Approval.to_payload`); PayloadError for a corrupt row."""
    if isinstance(data, dict) and data.get("kind") == "approval":
        try:
            return Approval.from_payload(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise PayloadError(f"stored payload unreadable: {exc}"[:200]) from None
    return RunRequest.from_payload(data)
