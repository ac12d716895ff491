"""A small GitHub REST client for commit statuses, the pull-request report comment and check runs,
with retry and exponential backoff.

``POST {api}/repos/{owner}/{repo}/statuses/{sha}`` with ``Authorization: Bearer <token>`` and a
JSON body ``{"state", "target_url", "description", "context"}``.  Transient failures (network
errors, 5xx, 429, 403 with an exhausted rate limit) raise :class:`TransientStatusError` after the
in-call retries; the caller (the outbox reporter) schedules further attempts.  Permanent failures
(other 4xx: bad token, unknown repository or sha) raise :class:`PermanentStatusError`.

Every request carries the credential of its repository from a :mod:`service.github.auth` identity
(a GitHub App's installation token, minted and refreshed as needed, or the static token); a 401 makes
the identity mint a fresh one and the request is sent once more.  Credentials go to ``api_url`` only:
every URL is built from it and redirects are never followed.

The PR comment is one per pull request: :meth:`GitHubStatusClient.upsert_comment` lists the
comments (``GET /repos/{repo}/issues/{n}/comments``), edits the one carrying
:data:`COMMENT_MARKER` **and written by ampci's own identity** (the App's ``<slug>[bot]``, or the
token's user; a marker quoted in anyone else's comment is ignored) with
``PATCH /repos/{repo}/issues/comments/{id}``, or adds it (``POST``).
A check run is one per (name, head sha) as well: :meth:`GitHubStatusClient.upsert_check_run` lists the
commit's check runs of that name (``GET /repos/{repo}/commits/{sha}/check-runs?check_name=NAME``), edits
the newest (``PATCH /repos/{repo}/check-runs/{id}``) or creates it (``POST /repos/{repo}/check-runs``).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from service.github.auth import AuthError, GitHubAuth, StaticToken

log = logging.getLogger(__name__)

STATES = frozenset({"pending", "success", "failure", "error"})
MAX_DESCRIPTION = 140  # GitHub truncates/rejects longer descriptions


class StatusPostError(Exception):
    """Posting a commit status failed."""


class TransientStatusError(StatusPostError):
    """Worth retrying later (network, 5xx, rate limit); ``retry_after`` seconds when GitHub said."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PermanentStatusError(StatusPostError):
    """Retrying cannot help (401/404/422...)."""


@dataclass(frozen=True)
class CommitStatus:
    """One commit status to post.  ``key`` identifies (repo, sha, context): a later status for the
    same key supersedes an earlier unsent one."""

    repo: str
    sha: str
    state: str
    description: str
    target_url: str | None = None
    context: str = "ampci/smoke"

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"unknown commit status state {self.state!r}")

    @property
    def key(self) -> str:
        return f"{self.repo.lower()}@{self.sha}#{self.context}"

    def body(self) -> dict[str, str]:
        """The JSON body GitHub expects."""
        out = {"state": self.state, "description": self.description[:MAX_DESCRIPTION],
               "context": self.context}
        if self.target_url:
            out["target_url"] = self.target_url
        return out

    def to_dict(self) -> dict[str, str | None]:
        return {"repo": self.repo, "sha": self.sha, "state": self.state, "description": self.description,
                "target_url": self.target_url, "context": self.context}

    @classmethod
    def from_dict(cls, d: dict) -> CommitStatus:
        return cls(repo=d["repo"], sha=d["sha"], state=d["state"], description=d["description"],
                   target_url=d.get("target_url"), context=d.get("context", "ampci/smoke"))


#: The hidden marker that identifies ampci's report comment on a pull request (found again by it).
COMMENT_MARKER = "<!-- ampci:pr-report -->"
MAX_COMMENT = 65536      # GitHub refuses longer comment bodies
MAX_CHECK_TEXT = 65535   # and longer check-run output fields
CHECK_CONCLUSIONS = frozenset({"success", "failure", "neutral", "cancelled", "timed_out", "action_required"})


@dataclass(frozen=True)
class PullRequestComment:
    """The report comment of one pull request.  ``key`` is (repo, PR): a newer body supersedes an
    unsent older one, and :meth:`GitHubStatusClient.upsert_comment` edits the comment carrying
    :data:`COMMENT_MARKER` instead of adding a second one."""

    repo: str
    pr: int
    body: str
    sha: str = ""   # the head the report is about (for logs and the dead list)

    @property
    def key(self) -> str:
        return f"{self.repo.lower()}#pr{int(self.pr)}#comment"

    def to_dict(self) -> dict[str, object]:
        return {"kind": "comment", "repo": self.repo, "pr": self.pr, "body": self.body, "sha": self.sha}

    @classmethod
    def from_dict(cls, d: dict) -> PullRequestComment:
        return cls(repo=d["repo"], pr=int(d["pr"]), body=d["body"], sha=d.get("sha", ""))


@dataclass(frozen=True)
class CheckRun:
    """A completed check run (Checks API) for ``sha``: its conclusion and the report as output."""

    repo: str
    sha: str
    name: str
    conclusion: str
    title: str
    summary: str
    text: str = ""
    details_url: str | None = None

    def __post_init__(self) -> None:
        if self.conclusion not in CHECK_CONCLUSIONS:
            raise ValueError(f"unknown check run conclusion {self.conclusion!r}")

    @property
    def key(self) -> str:
        return f"{self.repo.lower()}@{self.sha}#check:{self.name}"

    def body(self) -> dict[str, object]:
        """The JSON body of ``POST /repos/{repo}/check-runs`` (without ``head_sha``: of the PATCH)."""
        output: dict[str, str] = {"title": self.title[:MAX_DESCRIPTION], "summary": self.summary[:MAX_CHECK_TEXT]}
        if self.text:
            output["text"] = self.text[:MAX_CHECK_TEXT]
        out: dict[str, object] = {"name": self.name, "head_sha": self.sha, "status": "completed",
                                  "conclusion": self.conclusion, "output": output}
        if self.details_url:
            out["details_url"] = self.details_url
        return out

    def to_dict(self) -> dict[str, object]:
        return {"kind": "check", "repo": self.repo, "sha": self.sha, "name": self.name,
                "conclusion": self.conclusion, "title": self.title, "summary": self.summary, "text": self.text,
                "details_url": self.details_url}

    @classmethod
    def from_dict(cls, d: dict) -> CheckRun:
        return cls(repo=d["repo"], sha=d["sha"], name=d["name"], conclusion=d["conclusion"], title=d["title"],
                   summary=d["summary"], text=d.get("text", ""), details_url=d.get("details_url"))


#: Everything the outbox delivers to GitHub.
Report = CommitStatus | PullRequestComment | CheckRun


def report_from_dict(d: dict) -> Report:
    """The report a ``to_dict`` stored (``kind`` absent: a commit status, as stored before reports had kinds)."""
    kind = d.get("kind", "status")
    if kind == "comment":
        return PullRequestComment.from_dict(d)
    if kind == "check":
        return CheckRun.from_dict(d)
    return CommitStatus.from_dict(d)


def backoff_delay(attempt: int, base: float = 1.0, cap: float = 300.0,
                  rng: Callable[[], float] = random.random) -> float:
    """Exponential backoff with full jitter: uniform in [0.5, 1] x min(cap, base * 2**attempt)."""
    ceiling = min(cap, base * (2 ** min(attempt, 30)))
    return ceiling * (0.5 + 0.5 * rng())


class GitHubStatusClient:
    """Posts commit statuses.  Thread-safe (one pooled ``httpx.Client``); close it when done."""

    def __init__(self, api_url: str, token: str = "", *, auth: GitHubAuth | None = None, timeout: float = 10.0,
                 attempts: int = 3, backoff_base: float = 0.5, sleep: Callable[[float], None] = time.sleep) -> None:
        if auth is None:
            if not token:
                raise ValueError("a GitHub identity is required to report (AMPCI_GITHUB_APP_ID or AMPCI_GITHUB_TOKEN)")
            auth = StaticToken(token)
        self.auth = auth
        self.api_url = api_url.rstrip("/")
        self.attempts = max(1, attempts)
        self.backoff_base = backoff_base
        self._sleep = sleep
        # no default Authorization: each request gets its repository's credential; never follow a redirect
        self._http = httpx.Client(timeout=timeout, follow_redirects=False, headers={
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": "2022-11-28",
            "User-Agent": "ampci",
        })

    def close(self) -> None:
        self._http.close()

    def post_status(self, status: CommitStatus) -> None:
        """Post ``status``; retries transient failures ``attempts`` times with backoff in this call.

        Raises :class:`TransientStatusError` or :class:`PermanentStatusError` when it did not land.
        """
        self._request("POST", f"{self.api_url}/repos/{status.repo}/statuses/{status.sha}", status.body(),
                      repo=status.repo)

    def remember_installation(self, repo: str, installation: int) -> None:
        """The App installation a webhook of ``repo`` named (no effect with a static token)."""
        self.auth.remember(repo, installation)

    def identity(self) -> str:
        """ampci's login on GitHub (``<slug>[bot]`` for an App, the token's user otherwise); cached."""
        try:
            return self.auth.login(self._auth_call)
        except AuthError as exc:
            raise _auth_failure(exc) from None
    def upsert_comment(self, comment: PullRequestComment, max_pages: int = 10) -> int:
        """Edit the pull request's comment that carries :data:`COMMENT_MARKER` and was written by ampci
        (:meth:`identity`) to ``comment.body``, or add it when there is none; return the comment id.
        A marker in anyone else's comment (a reviewer quoting the report) is ignored: that comment is
        never edited.  Never adds a second comment of ours when one exists in the first ``max_pages``
        pages of 100 comments.  Errors as :meth:`post_status`.
        """
        base = f"{self.api_url}/repos/{comment.repo}/issues"
        body = comment.body if COMMENT_MARKER in comment.body else f"{COMMENT_MARKER}\n{comment.body}"
        me = self.identity().lower()
        for page in range(1, max_pages + 1):
            listed = self._request("GET", f"{base}/{int(comment.pr)}/comments?per_page=100&page={page}",
                                   repo=comment.repo)
            items = listed.json() if listed.content else []
            if not isinstance(items, list):
                raise PermanentStatusError(f"GET {base}/{comment.pr}/comments: expected a list")
            for item in items:
                if isinstance(item, dict) and COMMENT_MARKER in str(item.get("body") or "") and \
                        type(item.get("id")) is int and _author(item) == me:
                    self._request("PATCH", f"{base}/comments/{item['id']}", {"body": body[:MAX_COMMENT]},
                                  repo=comment.repo)
                    return int(item["id"])
            if len(items) < 100:
                break
        made = self._request("POST", f"{base}/{int(comment.pr)}/comments", {"body": body[:MAX_COMMENT]},
                             repo=comment.repo)
        try:
            return int(made.json().get("id", 0))
        except (ValueError, AttributeError):
            return 0

    def post_check_run(self, check: CheckRun) -> None:
        """Create a completed check run (needs a token with the ``checks: write`` permission, i.e. a
        GitHub App installation token).  Errors as :meth:`post_status`."""
        self._request("POST", f"{self.api_url}/repos/{check.repo}/check-runs", check.body(), repo=check.repo)

    def upsert_check_run(self, check: CheckRun) -> int:
        """Edit the newest check run named ``check.name`` on ``check.sha`` to ``check`` (so a re-report
        of a head -- after an acknowledgement, a late confirmation -- is one check run, not one more),
        or create it when there is none; return its id (0 if GitHub did not say).  A check run that
        cannot be edited (another app's: 403/404) is left alone and a new one created.  Errors as
        :meth:`post_status`."""
        from urllib.parse import quote

        base = f"{self.api_url}/repos/{check.repo}"
        listed = self._request("GET", f"{base}/commits/{check.sha}/check-runs?check_name={quote(check.name, safe='')}"
                                      "&filter=latest&per_page=100", repo=check.repo)
        data = listed.json() if listed.content else {}
        items = data.get("check_runs") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise PermanentStatusError(f"GET {base}/commits/{check.sha}/check-runs: expected check_runs")
        ours = [i for i in items if isinstance(i, dict) and i.get("name") == check.name
                and i.get("head_sha", check.sha) == check.sha and isinstance(i.get("id"), int)]
        if ours:
            newest = max(ours, key=lambda i: i["id"])
            body = {k: v for k, v in check.body().items() if k != "head_sha"}
            try:
                self._request("PATCH", f"{base}/check-runs/{newest['id']}", body, repo=check.repo)
                return int(newest["id"])
            except PermanentStatusError as exc:
                if " HTTP 403:" not in str(exc) and " HTTP 404:" not in str(exc):
                    raise
        made = self._request("POST", f"{base}/check-runs", check.body(), repo=check.repo)
        try:
            return int(made.json().get("id", 0))
        except (ValueError, AttributeError, TypeError):
            return 0

    def deliver(self, report: Report) -> None:
        """Send any report the outbox holds (status, PR comment or check run)."""
        if isinstance(report, PullRequestComment):
            self.upsert_comment(report)
        elif isinstance(report, CheckRun):
            self.upsert_check_run(report)
        else:
            self.post_status(report)

    def _auth_call(self, method: str, path: str, bearer: str) -> tuple[int, object, object]:
        """One request of the identity (JWT or token) to the API base: (status, JSON or None, headers)."""
        try:
            resp = self._http.request(method, f"{self.api_url}{path}", headers={"Authorization": f"Bearer {bearer}"})
        except httpx.HTTPError as exc:
            raise AuthError(f"{method} {path}: {type(exc).__name__}", 0) from None
        try:
            data = resp.json() if resp.content else None
        except ValueError:
            data = None
        return resp.status_code, data, resp.headers

    def _authorization(self, repo: str) -> dict[str, str]:
        try:
            return {"Authorization": f"Bearer {self.auth.token(repo, self._auth_call)}"}
        except AuthError as exc:
            raise _auth_failure(exc) from None

    def _request(self, method: str, url: str, body: object = None, *, repo: str) -> httpx.Response:
        """One GitHub call with the in-call retries; the 2xx response, or Transient/PermanentStatusError.
        A 401 with a credential the identity can replace (an installation token revoked or expired
        early) is sent once more with a fresh one."""
        if not url.startswith(self.api_url + "/"):  # credentials go to the API base only
            raise PermanentStatusError(f"refusing to send a credential to {url[:100]}")
        last: TransientStatusError | None = None
        refreshed = False
        attempt = 0
        while attempt < self.attempts:
            if attempt:
                delay = backoff_delay(attempt - 1, self.backoff_base, cap=10.0)
                if last is not None and last.retry_after is not None:
                    delay = max(delay, min(last.retry_after, 10.0))
                self._sleep(delay)
            attempt += 1
            try:
                headers = self._authorization(repo)
                resp = self._http.request(method, url, json=body, headers=headers) if body is not None else \
                    self._http.request(method, url, headers=headers)
            except TransientStatusError as exc:
                last = exc
                continue
            except httpx.HTTPError as exc:
                last = TransientStatusError(f"{method} {url}: {type(exc).__name__}: {exc}")
                continue
            if 200 <= resp.status_code < 300:
                return resp
            if resp.status_code == 401 and not refreshed and self.auth.invalidate(repo):
                refreshed = True  # a stale installation token: mint a fresh one, send once more
                attempt -= 1
                continue
            last_or_perm = _classify(url, resp, method)
            if isinstance(last_or_perm, PermanentStatusError):
                raise last_or_perm
            last = last_or_perm
        assert last is not None
        raise last


def _author(item: dict) -> str:
    user = item.get("user")
    login = user.get("login") if isinstance(user, dict) else None
    return login.lower() if isinstance(login, str) else ""


def _auth_failure(exc: AuthError) -> StatusPostError:
    """An identity call that failed, as the outbox's error kinds (no answer, 5xx, 429: transient)."""
    if exc.status == 0 or exc.status >= 500 or exc.status == 429:
        return TransientStatusError(f"GitHub authentication: {exc}", exc.retry_after)
    return PermanentStatusError(f"GitHub authentication: {exc}")


def _classify(url: str, resp: httpx.Response, method: str = "POST") -> StatusPostError:
    text = resp.text[:200].replace("\n", " ")
    retry_after: float | None = None
    if "retry-after" in resp.headers:
        try:
            retry_after = float(resp.headers["retry-after"])
        except ValueError:
            retry_after = None
    limited = resp.status_code == 403 and (resp.headers.get("x-ratelimit-remaining") == "0" or retry_after)
    if resp.status_code >= 500 or resp.status_code in (408, 429) or limited:
        return TransientStatusError(f"{method} {url}: HTTP {resp.status_code}: {text}", retry_after)
    return PermanentStatusError(f"{method} {url}: HTTP {resp.status_code}: {text}")
