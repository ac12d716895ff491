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

from pydantic import StrictInt, ValidationError, field_validator

from service.github.stored import RevisionInfo, RunRequest, change_key, check_commit_sha, check_number

#: The check runs ampci makes are named with this prefix and the sweep (never the commit status context).
CHECK_NAME_PREFIX = "ampci "


def _models() -> tuple[type, ...]:
    """The payload models, built on :mod:`service.github.events`' (imported late: it imports this module)."""
    from service.github.events import _Installation, _Model, _Ref, _Repository

    class CheckRunPR(_Model):
        number: StrictInt
        head: _Ref
        base: _Ref

        @field_validator("number")
        @classmethod
        def _num(cls, v: int) -> int:
            return check_number(v)

    class CheckSuite(_Model):
        head_branch: str | None = None
        before: str | None = None

        @field_validator("before")
        @classmethod
        def _sha(cls, v: str | None) -> str | None:
            return None if v is None else check_commit_sha(v)

    class CheckRunBody(_Model):
        id: StrictInt
        name: str = ""
        head_sha: str
        check_suite: CheckSuite | None = None
        pull_requests: list[CheckRunPR] = []

        @field_validator("id")
        @classmethod
        def _id(cls, v: int) -> int:
            if not 0 < v < 2**63:
                raise ValueError("must be a positive 64-bit integer")
            return v

        @field_validator("head_sha")
        @classmethod
        def _sha(cls, v: str) -> str:
            return check_commit_sha(v)

    class CheckRunEvent(_Model):
        action: str
        check_run: CheckRunBody
        repository: _Repository
        installation: _Installation | None = None

    return (CheckRunEvent,)


def parse_check_run(data: dict, settings: object) -> object:
    """The decision for a ``check_run`` delivery (:func:`service.github.events.parse_event`): a
    :class:`RunRequest` for a re-run ampci can place (module docstring), else ``Ignored``."""
    from service.github.events import ZERO_SHA, Ignored, PayloadError, _validation_reason, check_repository
    from service.github.sanitize import BRANCH_MAX, name_text

    if data.get("action") != "rerequested":  # created/completed of our own check runs, and the rest
        return Ignored(f"check_run action {str(data.get('action'))[:50]!r} needs no run")
    (event_model,) = _models()
    try:
        event = event_model.model_validate(data)
    except ValidationError as exc:
        raise PayloadError(_validation_reason(exc)) from None
    check_repository(event.repository.full_name, settings)  # type: ignore[arg-type]
    run = event.check_run
    if not run.name.startswith(CHECK_NAME_PREFIX):
        return Ignored("check_run re-requested is not ampci's")
    repo = event.repository.full_name
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
    if branch is None or branch not in settings.tracked_branch_set():  # type: ignore[attr-defined]
        return Ignored("check_run re-run of a head that is neither a pull request of the repository nor a "
                       "tracked branch")
    before = suite.before if suite is not None and suite.before not in (None, ZERO_SHA) else None
    head = RevisionInfo(sha=run.head_sha, parents=[], branch=branch, author=None, message="", committed_at=None)
    return RunRequest(repo=repo, trigger="push", head_sha=run.head_sha, baseline_sha=before, branch=branch,
                      revisions=[head], change_sha256=key, installation=installation)
