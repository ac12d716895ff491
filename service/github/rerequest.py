"""GitHub's "Re-run" of an ampci check run: a ``check_run`` event with action ``rerequested``.

GitHub sends it to the App that made the check run when someone with write access asks for a re-run.
It becomes a **new** run of that head (its own change key: the check run's id, so a redelivery of the
same event is the same run, while a re-run of the new check run is another):

* the check run names a pull request of the repository itself (``check_run.pull_requests``): a
  pull-request run of that head against the pull request's base, as its ``synchronize`` would make;
* else, when the check suite's branch is tracked: a push run of that head on that branch, against
  the suite's ``before`` when it names one;
* else (a fork's pull request, which GitHub does not list, or an untracked branch) nothing is run:
  ampci cannot tell what the head belongs to, and a fork's code is never started without its approval.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, StrictInt, ValidationError, field_validator

from service.github.sanitize import BRANCH_MAX, REPOSITORY_MAX, name_text
from service.github.stored import (
    PayloadError,
    RevisionInfo,
    RunRequest,
    change_key,
    check_commit_sha,
    check_number,
)
from service.json_types import JsonObject

#: The check runs ampci makes are named with this prefix and the sweep (never the commit status context).
CHECK_NAME_PREFIX = "ampci "
_ZERO_SHA = "0" * 40


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", str_max_length=1_000_000)


def _positive_id(v: int) -> int:
    if not 0 < v < 2**63:
        raise ValueError("must be a positive 64-bit integer")
    return v


class _Ref(_Model):
    sha: str
    ref: str

    @field_validator("sha")
    @classmethod
    def _sha(cls, v: str) -> str:
        return check_commit_sha(v)

    @field_validator("ref")
    @classmethod
    def _ref(cls, v: str) -> str:
        return name_text(v, BRANCH_MAX)


class _PullRequest(_Model):
    number: StrictInt
    head: _Ref
    base: _Ref

    @field_validator("number")
    @classmethod
    def _num(cls, v: int) -> int:
        return check_number(v)


class _CheckSuite(_Model):
    head_branch: str | None = None
    before: str | None = None

    @field_validator("before")
    @classmethod
    def _sha(cls, v: str | None) -> str | None:
        return None if v is None else check_commit_sha(v)


class _CheckRun(_Model):
    id: StrictInt
    name: str = ""
    head_sha: str
    check_suite: _CheckSuite | None = None
    pull_requests: list[_PullRequest] = []

    @field_validator("id")
    @classmethod
    def _id(cls, v: int) -> int:
        return _positive_id(v)

    @field_validator("head_sha")
    @classmethod
    def _sha(cls, v: str) -> str:
        return check_commit_sha(v)


class _Repository(_Model):
    full_name: str

    @field_validator("full_name")
    @classmethod
    def _owner_name(cls, v: str) -> str:
        if len(v) > REPOSITORY_MAX or not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", v):
            raise ValueError(f"not an owner/name repository: {v[:100]!r}")
        return v


class _Installation(_Model):
    id: StrictInt

    @field_validator("id")
    @classmethod
    def _id(cls, v: int) -> int:
        return _positive_id(v)


class _CheckRunEvent(_Model):
    action: str
    check_run: _CheckRun
    repository: _Repository
    installation: _Installation | None = None


def rerun_request(data: JsonObject, tracked: frozenset[str] | set[str],
                  check_repository: Callable[[str], None]) -> RunRequest | str:
    """What a ``check_run`` delivery asks for: a :class:`RunRequest` for a re-run ampci can place
    (module docstring), else the reason it needs no run.  ``tracked``: the tracked branches;
    ``check_repository`` raises for a repository outside the allowlist.  PayloadError for a payload
    that is not GitHub's."""
    if data.get("action") != "rerequested":  # created/completed of our own check runs, and the rest
        return f"check_run action {str(data.get('action'))[:50]!r} needs no run"
    try:
        event = _CheckRunEvent.model_validate(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in err.get("loc", ())) or "payload"
        raise PayloadError(f"invalid payload: {where}: {err.get('msg', 'invalid')}") from None
    repo = event.repository.full_name
    check_repository(repo)
    run = event.check_run
    if not run.name.startswith(CHECK_NAME_PREFIX):
        return "check_run re-requested is not ampci's"
    key = change_key("check_run", repo.lower(), run.id, run.head_sha)
    installation = event.installation.id if event.installation else None
    prs = [p for p in run.pull_requests if p.head.sha == run.head_sha] or run.pull_requests
    if prs:
        pr = prs[0]
        head = RevisionInfo(sha=run.head_sha, parents=[], branch=pr.head.ref, author=None,
                            message=f"PR #{pr.number}: re-run", committed_at=None)
        base = RevisionInfo(sha=pr.base.sha, parents=[], branch=pr.base.ref, author=None, message="", committed_at=None)
        return RunRequest(repo=repo, trigger="pull_request", head_sha=run.head_sha, baseline_sha=pr.base.sha,
                          branch=pr.head.ref, pr_number=pr.number, revisions=[base, head], change_sha256=key,
                          installation=installation)
    suite = run.check_suite
    branch = name_text(suite.head_branch, BRANCH_MAX) if suite is not None and suite.head_branch else None
    if branch is None or branch not in tracked:
        return "check_run re-run of a head that is neither a pull request of the repository nor a tracked branch"
    before = suite.before if suite is not None and suite.before not in (None, _ZERO_SHA) else None
    head = RevisionInfo(sha=run.head_sha, parents=[], branch=branch, author=None, message="", committed_at=None)
    return RunRequest(repo=repo, trigger="push", head_sha=run.head_sha, baseline_sha=before, branch=branch,
                      revisions=[head], change_sha256=key, installation=installation)
