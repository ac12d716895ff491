"""A small GitHub REST client for commit statuses, the pull-request report comment and check runs,
with retry and exponential backoff, that no answer can stall (:mod:`service.github_auth.transport`: a
total deadline per exchange, capped and bomb-safe answers; malformed answers, rate limits and a
passed deadline end the call at once as :class:`TransientStatusError` kinds).

``POST {api}/repos/{owner}/{repo}/statuses/{sha}`` with ``Authorization: Bearer <token>`` and a
JSON body ``{"state", "target_url", "description", "context"}``.  Answers are classed by
:func:`service.github.refusals.classify`: network errors and 5xx raise :class:`TransientStatusError`
after the in-call retries; a primary or secondary rate limit raises :class:`RateLimitedError` with
GitHub's wait (a secondary one that names none: ``rate_limit_wait``, a minute by default) and an
undocumented 4xx :class:`UnexpectedStatusError`, both at once; the caller (the outbox reporter)
schedules further attempts.  Documented refusals (bad token, unknown repository or sha, 422) raise
:class:`PermanentStatusError` with the status.

Every request carries the credential of its repository from a :mod:`service.github_auth.app` identity
(a GitHub App's installation token, minted and refreshed as needed, or the static token); a 401 makes
the identity mint a fresh one and the request is sent once more.  Credentials go to ``api_url`` only:
every URL is built from it and redirects are never followed.

The PR comment is one per pull request: :meth:`GitHubStatusClient.upsert_comment` lists the
comments (``GET /repos/{repo}/issues/{n}/comments``), edits the one carrying
:data:`COMMENT_MARKER` **and written by ampci's own identity** (the App's ``<slug>[bot]``, or the
token's user; a marker quoted in anyone else's comment is ignored) with
``PATCH /repos/{repo}/issues/comments/{id}``, or adds it (``POST``).
A check run is one per (name, head sha, ampci run): :meth:`GitHubStatusClient.upsert_check_run` lists
the commit's check runs of that name (``GET /repos/{repo}/commits/{sha}/check-runs?check_name=NAME``),
edits the newest with the run's ``external_id`` (``PATCH /repos/{repo}/check-runs/{id}``) or creates
it (``POST /repos/{repo}/check-runs``).  The data classes live in :mod:`service.github.report_items`.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeGuard

from service.github.refusals import (
    SECONDARY_WAIT,
    MalformedAnswerError,
    PermanentStatusError,
    RateLimitedError,
    StatusPostError,
    TransientStatusError,
    UnexpectedStatusError,
    classify,
)
from service.github.report_items import (
    CHECK_CONCLUSIONS,
    CHECK_STATUSES,
    COMMENT_MARKER,
    MAX_CHECK_TEXT,
    MAX_COMMENT,
    MAX_DESCRIPTION,
    STATES,
    CheckRun,
    CommitStatus,
    PullRequestComment,
    Report,
    report_from_dict,
)
from service.github_auth.app import AppAuth, AuthError, CallAnswer, GitHubAuth, Permissions, StaticToken
from service.github_auth.transport import (
    MAX_ANSWER_BYTES,
    Answer,
    BoundedHTTP,
    ExchangeError,
    MalformedJSONError,
)
from service.json_types import JsonObject

__all__ = ["CHECK_CONCLUSIONS", "CHECK_STATUSES", "COMMENT_MARKER", "MAX_CHECK_TEXT", "MAX_COMMENT", "MAX_DESCRIPTION",
           "STATES", "CheckRun", "CommitStatus", "GitHubStatusClient", "MalformedAnswerError", "PermanentStatusError",
           "PullRequestComment", "RateLimitedError", "Report", "StatusPostError", "TransientStatusError",
           "UnexpectedStatusError", "backoff_delay", "report_from_dict"]

log = logging.getLogger(__name__)


#: The installation-token permission each report kind writes with (listing what it edits included).
REPORT_PERMISSIONS = {"status": ("statuses", "write"), "comment": ("pull_requests", "write"),
                      "check": ("checks", "write")}
REPORT_KINDS = frozenset(REPORT_PERMISSIONS)


def report_permissions(reports: frozenset[str]) -> dict[str, str]:
    """The permissions a reporter sending ``reports`` (``status``, ``comment``, ``check``) needs, no more, and
    ``metadata: read`` (every App holds it): asking who may approve (:mod:`service.github.permissions`)."""
    return {**dict(REPORT_PERMISSIONS[r] for r in sorted(reports) if r in REPORT_PERMISSIONS), "metadata": "read"}


def backoff_delay(attempt: int, base: float = 1.0, cap: float = 300.0,
                  rng: Callable[[], float] = random.random) -> float:
    """Exponential backoff with full jitter: uniform in [0.5, 1] x min(cap, base * 2**attempt)."""
    ceiling: float = min(cap, base * (2 ** min(attempt, 30)))
    return ceiling * (0.5 + 0.5 * rng())


class GitHubStatusClient:
    """Posts commit statuses, the PR comment and check runs.  Thread-safe (one bounded connection
    pool: :class:`~service.github_auth.transport.BoundedHTTP`); close it when done.

    ``timeout`` is the **total** deadline of each HTTP exchange (connect, send, the whole answer), not
    a per-read timeout; answers are read up to ``max_answer_bytes`` (on the wire and decoded).  In-call
    retries (``attempts``) are for errors that heal in a moment (no connection, 5xx); a deadline that
    passed, a rate limit or a malformed answer ends the call at once (the outbox retries later), so one
    call lasts at most ``attempts`` deadlines plus a few seconds of backoff."""

    def __init__(self, api_url: str, token: str = "", *, auth: GitHubAuth | None = None, timeout: float = 10.0,
                 attempts: int = 3, backoff_base: float = 0.5, sleep: Callable[[float], None] = time.sleep,
                 max_answer_bytes: int = MAX_ANSWER_BYTES, rate_limit_wait: float = SECONDARY_WAIT,
                 permissions: Permissions | None = None) -> None:
        if auth is None:
            if not token:
                raise ValueError("a GitHub identity is required to report (AMPCI_GITHUB_APP_ID or AMPCI_GITHUB_TOKEN)")
            auth = StaticToken(token)
        self.auth = auth
        self.api_url = api_url.rstrip("/")
        self.attempts = max(1, attempts)
        self.backoff_base = backoff_base
        self.rate_limit_wait = rate_limit_wait
        self.permissions = dict(permissions if permissions is not None else report_permissions(REPORT_KINDS))
        self._sleep = sleep
        # no default Authorization: each request gets its repository's credential; redirects are never followed
        self._http = BoundedHTTP(deadline=timeout, max_bytes=max_answer_bytes, headers={
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": "2022-11-28",
            "User-Agent": "ampci",
        })

    @property
    def writes_check_runs(self) -> bool:
        """True when the identity may create check runs: GitHub accepts them only from an App's
        installation token (a personal token gets 403)."""
        return isinstance(self.auth, AppAuth)

    def close(self) -> None:
        self._http.close()

    def post_status(self, status: CommitStatus) -> None:
        """Post ``status``; retries transient failures ``attempts`` times with backoff in this call.

        Raises :class:`TransientStatusError` or :class:`PermanentStatusError` when it did not land.
        """
        self._request("POST", f"{self.api_url}/repos/{status.repo}/statuses/{status.sha}", status.body(),
                      repo=status.repo)

    def installation_of(self, repo: str) -> int | None:
        """The App installation known to serve ``repo`` (None: a static token, or not known yet)."""
        return self.auth.installation_of(repo) if isinstance(self.auth, AppAuth) else None

    def limit_scope(self, repo: str) -> str:
        """What GitHub rate-limits the reports of ``repo`` by: its App installation when known, else
        the repository (a token's limits are per user, but one repository's 429 says nothing of another's)."""
        installation = self.auth.installation_of(repo) if isinstance(self.auth, AppAuth) else None
        return f"installation:{installation}" if installation is not None else f"repo:{repo.lower()}"

    def remember_installation(self, repo: str, installation: int) -> None:
        """The App installation a webhook of ``repo`` named (no effect with a static token)."""
        self.auth.remember(repo, installation)

    def identity(self, repo: str = "") -> str:
        """ampci's login on GitHub (``<slug>[bot]`` for an App, the token's user otherwise); cached.
        ``repo``: the repository it is wanted for (a failure is an error kind of that repository's)."""
        try:
            return self.auth.login(self._auth_call)
        except AuthError as exc:
            raise _auth_failure(exc, repo) from None

    def upsert_comment(self, comment: PullRequestComment, max_pages: int = 10) -> int:
        """Edit the pull request's comment that carries :data:`COMMENT_MARKER` and was written by ampci
        (:meth:`identity`) to ``comment.body``, or add it when there is none; return the comment id.
        A marker in anyone else's comment (a reviewer quoting the report) is ignored: that comment is
        never edited.  Never adds a second comment of ours when one exists in the first ``max_pages``
        pages of 100 comments.  Errors as :meth:`post_status`.
        """
        base = f"{self.api_url}/repos/{comment.repo}/issues"
        body = comment.body if COMMENT_MARKER in comment.body else f"{COMMENT_MARKER}\n{comment.body}"
        me = self.identity(comment.repo).lower()
        for page in range(1, max_pages + 1):
            what = f"GET {base}/{int(comment.pr)}/comments?page={page}"
            items = _json(self._request("GET", f"{base}/{int(comment.pr)}/comments?per_page=100&page={page}",
                                        repo=comment.repo), what, [])
            if not isinstance(items, list):
                raise MalformedAnswerError(f"{what}: expected a list")
            for item in items:
                if isinstance(item, dict) and COMMENT_MARKER in str(item.get("body") or "") and \
                        _is_id(item.get("id")) and _author(item) == me:
                    self._request("PATCH", f"{base}/comments/{item['id']}", {"body": body[:MAX_COMMENT]},
                                  repo=comment.repo)
                    return int(item["id"])
            if len(items) < 100:
                break
        made = self._request("POST", f"{base}/{int(comment.pr)}/comments", {"body": body[:MAX_COMMENT]},
                             repo=comment.repo)
        return _made_id(made)

    def collaborator_permission(self, repo: str, login: str) -> JsonObject | None:
        """GitHub's answer to ``GET /repos/{repo}/collaborators/{login}/permission`` (``permission``,
        ``role_name``); None when GitHub answers 404 (not a collaborator: no permission).  Errors as
        :meth:`post_status` (a 5xx, a timeout or a rate limit: :class:`TransientStatusError` kinds)."""
        from urllib.parse import quote

        url = f"{self.api_url}/repos/{repo}/collaborators/{quote(login, safe='')}/permission"
        try:
            answer = self._request("GET", url, repo=repo)
        except PermanentStatusError as exc:
            if exc.status == 404:
                return None
            raise
        data = _json(answer, f"GET {url}", {})
        if not isinstance(data, dict):
            raise MalformedAnswerError(f"GET {url}: expected an object")
        return data

    def post_check_run(self, check: CheckRun) -> None:
        """Create a check run (needs a token with the ``checks: write`` permission, i.e. a GitHub App
        installation token).  Errors as :meth:`post_status`."""
        self._request("POST", f"{self.api_url}/repos/{check.repo}/check-runs", check.body(), repo=check.repo)

    def upsert_check_run(self, check: CheckRun) -> int:
        """Bring the check run of ``check`` up to date, or create it; return its id (0 if GitHub did
        not say).

        The check run edited (``PATCH /repos/{repo}/check-runs/{id}``) is the newest named
        ``check.name`` on ``check.sha`` with ``check.external_id`` (the ampci run: every stage of one run,
        and a re-report after an acknowledgement, edit one check run, while a re-run gets its own); an
        item without an external id edits the newest of the name.  A new one is created when there is
        none, when the one found cannot be edited (another app's: 403/404), or when it is completed and
        ``check`` is not (a fork's run approved after its ``action_required``: GitHub shows a new check
        run rather than one that went back).  Errors as :meth:`post_status`."""
        from urllib.parse import quote

        base = f"{self.api_url}/repos/{check.repo}"
        what = f"GET {base}/commits/{check.sha}/check-runs"
        data = _json(self._request("GET", f"{base}/commits/{check.sha}/check-runs?check_name="
                                          f"{quote(check.name, safe='')}&filter=all&per_page=100", repo=check.repo),
                     what, {})
        items = data.get("check_runs") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise MalformedAnswerError(f"{what}: expected check_runs")
        ours = [i for i in items if isinstance(i, dict) and i.get("name") == check.name
                and i.get("head_sha", check.sha) == check.sha and _is_id(i.get("id"))
                and (not check.external_id or i.get("external_id") == check.external_id)]
        if ours:
            newest = max(ours, key=lambda i: i["id"])
            if not (newest.get("status") == "completed" and check.status != "completed"):
                body = {k: v for k, v in check.body().items() if k != "head_sha"}
                try:
                    self._request("PATCH", f"{base}/check-runs/{newest['id']}", body, repo=check.repo)
                    return int(newest["id"])
                except PermanentStatusError as exc:
                    if exc.status not in (403, 404):
                        raise
        return _made_id(self._request("POST", f"{base}/check-runs", check.body(), repo=check.repo))

    def deliver(self, report: Report) -> None:
        """Send any report the outbox holds (status, PR comment or check run)."""
        if isinstance(report, PullRequestComment):
            self.upsert_comment(report)
        elif isinstance(report, CheckRun):
            self.upsert_check_run(report)
        else:
            self.post_status(report)

    def _auth_call(self, method: str, path: str, bearer: str, body: JsonObject | None = None) -> CallAnswer:
        """One request of the identity (JWT or token) to the API base: (status, JSON or None, headers)."""
        try:
            resp = self._http.request(method, f"{self.api_url}{path}", headers={"Authorization": f"Bearer {bearer}"},
                                      json_body=body)
        except ExchangeError as exc:
            raise AuthError(f"{method} {path}: {exc}", 0) from None
        try:
            data = resp.json() if resp.content else None
        except MalformedJSONError:
            data = None
        return resp.status_code, data, resp.headers

    def _authorization(self, repo: str) -> dict[str, str]:
        try:
            return {"Authorization": f"Bearer {self.auth.token(repo, self._auth_call, self.permissions)}"}
        except AuthError as exc:
            raise _auth_failure(exc, repo) from None

    def _request(self, method: str, url: str, body: object = None, *, repo: str) -> Answer:
        """One GitHub call; the 2xx answer, or Transient/PermanentStatusError.

        Connection errors and 5xx are tried again in the call (``attempts``, short backoff); a passed
        deadline, a rate limit (:class:`RateLimitedError`) or an unreadable answer end it at once.  A
        401 with a credential the identity can replace (an installation token revoked or expired
        early) is sent once more with a fresh one."""
        if not url.startswith(self.api_url + "/"):  # credentials go to the API base only
            raise PermanentStatusError(f"refusing to send a credential to {url[:100]}")
        last: TransientStatusError | None = None
        refreshed = False
        attempt = 0
        while attempt < self.attempts:
            if attempt:
                self._sleep(backoff_delay(attempt - 1, self.backoff_base, cap=10.0))
            attempt += 1
            headers = self._authorization(repo)
            try:
                resp = self._http.request(method, url, json_body=body, headers=headers)
            except ExchangeError as exc:
                failure = TransientStatusError(f"{method} {url}: {exc}")
                if exc.deadline or "larger than" in str(exc) or "decod" in str(exc).lower():
                    raise failure from None  # the same again would cost the same: the outbox retries later
                last = failure
                continue
            if 200 <= resp.status_code < 300:
                return resp
            if resp.status_code == 401 and not refreshed and self.auth.invalidate(repo):
                refreshed = True  # a stale installation token: mint a fresh one, send once more
                attempt -= 1
                continue
            error = classify(resp.status_code, resp.headers, resp.text, f"{method} {url}", repo,
                             self.rate_limit_wait)
            if not isinstance(error, TransientStatusError) or isinstance(error, RateLimitedError | UnexpectedStatusError):
                raise error
            last = error
        assert last is not None
        raise last


def _is_id(value: object) -> TypeGuard[int]:
    """A GitHub object id: an int (not a bool, not a float such as 1e400) of 1 .. 2**63-1."""
    return type(value) is int and 0 < value < 2**63


def _json(answer: Answer, what: str, empty: object) -> object:
    """The answer's JSON (``empty`` for an empty body); MalformedAnswerError when it is none."""
    if not answer.content:
        return empty
    try:
        return answer.json()
    except MalformedJSONError as exc:
        raise MalformedAnswerError(f"{what}: {exc}") from None


def _made_id(made: Answer) -> int:
    """The id of what a POST created; 0 when GitHub's answer names none (the item landed anyway)."""
    try:
        data = made.json() if made.content else None
    except MalformedJSONError:
        return 0
    found = data.get("id") if isinstance(data, dict) else None
    return int(found) if _is_id(found) else 0


def _author(item: JsonObject) -> str:
    user = item.get("user")
    login = user.get("login") if isinstance(user, dict) else None
    return login.lower() if isinstance(login, str) else ""


def _auth_failure(exc: AuthError, repo: str) -> StatusPostError:
    """An identity call that failed, as the outbox's error kinds (no answer, 5xx: transient; 429:
    rate limited; other 4xx: permanent)."""
    if exc.status == 429:
        return RateLimitedError(f"GitHub authentication: {exc}", exc.retry_after or SECONDARY_WAIT, repo)
    if exc.status == 0 or exc.status >= 500:
        return TransientStatusError(f"GitHub authentication: {exc}", exc.retry_after)
    return PermanentStatusError(f"GitHub authentication: {exc}", exc.status)

