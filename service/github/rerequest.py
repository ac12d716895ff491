"""GitHub's "Re-run" of ampci's checks: a ``check_run`` event (one check run re-run) or a ``check_suite``
event ("Re-run all checks") with action ``rerequested``.

GitHub sends them to the App that made the check run (and so owns its check suite) when someone with write
access asks for a re-run.  Either becomes a **new** run of that head, with its own change key, so that a
redelivery of the same event is the same run while a new re-run is another: a check run's key is its id (the
re-run makes a new check run, whose own re-run has another id); a check suite's is its id and its
``updated_at`` (the suite stays the same, and GitHub queues it again, with a new time, at each re-run).  The run:

* the check run or suite names a pull request of the repository itself (``pull_requests``): a
  pull-request run of that head against the pull request's base, as its ``synchronize`` would make;
* else, when the check suite's branch is tracked and ampci has run that head as a push to that branch
  before (checked when the run is created: a fork's pull request is not listed in ``pull_requests`` and its
  suite names the fork's own branch, which may well be called ``main``): a push run of that head on that
  branch, against the suite's ``before`` when it names one; a head never pushed there runs nothing;
* else (a fork's pull request, which GitHub does not list, or an untracked branch) nothing is run:
  ampci cannot tell what the head belongs to, and a fork's code is never started without its approval.

Only ampci's own checks are re-run: a check run named with :data:`CHECK_NAME_PREFIX`, a check suite of the
App ``AMPCI_GITHUB_APP_ID`` (when set; else the one whose ``client_id`` is ``AMPCI_GITHUB_CLIENT_ID``).  As
for a push or a pull request, the repository must be allowed and,
with ``AMPCI_PASS_REPO`` unset, its checked clone URL becomes the run's pass repository.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import StrictInt, field_validator

from service.github.payloads import (
    Installation,
    PayloadModel,
    Ref,
    Repository,
    check_repository,
    clone_url,
    positive_id,
    validate,
)
from service.github.sanitize import BRANCH_MAX, name_text, sane_time
from service.github.stored import RevisionInfo, RunRequest, change_key, check_commit_sha, check_number
from service.json_types import JsonObject
from service.settings import Settings

#: The check runs ampci makes are named with this prefix and the sweep (never the commit status context).
CHECK_NAME_PREFIX = "ampci "
_ZERO_SHA = "0" * 40


class _PullRequest(PayloadModel):
    number: StrictInt
    head: Ref
    base: Ref

    @field_validator("number")
    @classmethod
    def _num(cls, v: int) -> int:
        return check_number(v)


class _CheckSuite(PayloadModel):
    head_branch: str | None = None
    before: str | None = None

    @field_validator("before")
    @classmethod
    def _sha(cls, v: str | None) -> str | None:
        return None if v is None else check_commit_sha(v)


class _App(PayloadModel):
    id: StrictInt
    client_id: str | None = None

    @field_validator("id")
    @classmethod
    def _id(cls, v: int) -> int:
        return positive_id(v)


class _RerequestedSuite(_CheckSuite):
    """``check_suite`` of a ``check_suite`` event: the suite itself, with its head and pull requests."""

    id: StrictInt
    head_sha: str
    pull_requests: list[_PullRequest] = []
    app: _App | None = None
    updated_at: datetime | None = None

    @field_validator("id")
    @classmethod
    def _id(cls, v: int) -> int:
        return positive_id(v)

    @field_validator("head_sha")
    @classmethod
    def _head(cls, v: str) -> str:
        return check_commit_sha(v)

    @field_validator("updated_at")
    @classmethod
    def _time(cls, v: datetime | None) -> datetime | None:
        return sane_time(v)


class _CheckRun(PayloadModel):
    id: StrictInt
    name: str = ""
    head_sha: str
    check_suite: _CheckSuite | None = None
    pull_requests: list[_PullRequest] = []

    @field_validator("id")
    @classmethod
    def _id(cls, v: int) -> int:
        return positive_id(v)

    @field_validator("head_sha")
    @classmethod
    def _sha(cls, v: str) -> str:
        return check_commit_sha(v)


class _CheckRunEvent(PayloadModel):
    action: str
    check_run: _CheckRun
    repository: Repository
    installation: Installation | None = None


class _CheckSuiteEvent(PayloadModel):
    action: str
    check_suite: _RerequestedSuite
    repository: Repository
    installation: Installation | None = None


def rerun_request(event: str, data: JsonObject, settings: Settings) -> RunRequest | str:
    """What a ``check_run`` or ``check_suite`` delivery (``event``) asks for: a :class:`RunRequest` for a re-run
    of ampci's checks it can place (module docstring), else the reason it needs no run.  PayloadError for a
    payload that is not GitHub's (or whose clone URL may not be cloned); RepositoryNotAllowedError for a
    repository outside the allowlist."""
    if data.get("action") != "rerequested":  # created/completed of our own check runs and suites, and the rest
        return f"{event} action {str(data.get('action'))[:50]!r} needs no run"
    if event == "check_run":
        run_event = validate(_CheckRunEvent, data)
        check_repository(run_event.repository.full_name, settings)
        run = run_event.check_run
        if not run.name.startswith(CHECK_NAME_PREFIX):
            return "check_run re-requested is not ampci's"
        key = change_key("check_run", run_event.repository.full_name.lower(), run.id, run.head_sha)
        return _rerun(event, run_event.repository, run_event.installation, run.head_sha, run.pull_requests,
                      run.check_suite or _CheckSuite(), key, settings)
    suite_event = validate(_CheckSuiteEvent, data)
    check_repository(suite_event.repository.full_name, settings)
    suite = suite_event.check_suite
    if suite.app is not None and (
            (settings.github_app_id and str(suite.app.id) != settings.github_app_id.strip())
            or (not settings.github_app_id and settings.github_client_id
                and suite.app.client_id != settings.github_client_id.strip())):
        return "check_suite re-requested is another App's"
    key = change_key("check_suite", suite_event.repository.full_name.lower(), suite.id, suite.head_sha,
                     suite.updated_at.isoformat() if suite.updated_at else None)
    return _rerun(event, suite_event.repository, suite_event.installation, suite.head_sha, suite.pull_requests,
                  suite, key, settings)


def _rerun(event: str, repository: Repository, installation: Installation | None, head_sha: str,
           pull_requests: list[_PullRequest], suite: _CheckSuite, key: str, settings: Settings) -> RunRequest | str:
    """The run of a re-run of ``head_sha`` (module docstring), or why there is none."""
    repo = repository.full_name
    install = installation.id if installation else None
    prs = [p for p in pull_requests if p.head.sha == head_sha] or pull_requests
    if prs:
        pr = prs[0]
        head = RevisionInfo(sha=head_sha, parents=[], branch=pr.head.ref, author=None,
                            message=f"PR #{pr.number}: re-run", committed_at=None)
        base = RevisionInfo(sha=pr.base.sha, parents=[], branch=pr.base.ref, author=None, message="", committed_at=None)
        return RunRequest(repo=repo, trigger="pull_request", head_sha=head_sha, baseline_sha=pr.base.sha,
                          branch=pr.head.ref, pr_number=pr.number, revisions=[base, head], change_sha256=key,
                          installation=install, clone_url=clone_url(repository, settings))
    branch = name_text(suite.head_branch, BRANCH_MAX) if suite.head_branch else None
    if branch is None or branch not in settings.tracked_branch_set():
        return f"{event} re-run of a head that is neither a pull request of the repository nor a tracked branch"
    before = suite.before if suite.before not in (None, _ZERO_SHA) else None
    head = RevisionInfo(sha=head_sha, parents=[], branch=branch, author=None, message="", committed_at=None)
    return RunRequest(repo=repo, trigger="push", head_sha=head_sha, baseline_sha=before, branch=branch,
                      revisions=[head], change_sha256=key, installation=install,
                      clone_url=clone_url(repository, settings), rerun_of_push=True)
