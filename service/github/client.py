"""A small GitHub REST client for commit statuses, the pull-request report comment and check runs,
with retry and exponential backoff.

``POST {api}/repos/{owner}/{repo}/statuses/{sha}`` with ``Authorization: Bearer <token>`` and a
JSON body ``{"state", "target_url", "description", "context"}``.  Transient failures (network
errors, 5xx, 429, 403 with an exhausted rate limit) raise :class:`TransientStatusError` after the
in-call retries; the caller (the outbox reporter) schedules further attempts.  Permanent failures
(other 4xx: bad token, unknown repository or sha) raise :class:`PermanentStatusError`.

The PR comment is one per pull request: :meth:`GitHubStatusClient.upsert_comment` lists the
comments (``GET /repos/{repo}/issues/{n}/comments``), edits the one carrying
:data:`COMMENT_MARKER` (``PATCH /repos/{repo}/issues/comments/{id}``) or adds it (``POST``).
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

    def __init__(self, api_url: str, token: str, *, timeout: float = 10.0, attempts: int = 3,
                 backoff_base: float = 0.5, sleep: Callable[[float], None] = time.sleep) -> None:
        if not token:
            raise ValueError("a GitHub token is required to post commit statuses (AMPCI_GITHUB_TOKEN)")
        self.api_url = api_url.rstrip("/")
        self.attempts = max(1, attempts)
        self.backoff_base = backoff_base
        self._sleep = sleep
        self._http = httpx.Client(timeout=timeout, headers={
            "Authorization": f"Bearer {token}",
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
        self._request("POST", f"{self.api_url}/repos/{status.repo}/statuses/{status.sha}", status.body())

    def upsert_comment(self, comment: PullRequestComment, max_pages: int = 10) -> int:
        """Edit the pull request's comment that carries :data:`COMMENT_MARKER` to ``comment.body``, or
        add it when there is none; return the comment id.  Never adds a second marked comment when
        one exists in the first ``max_pages`` pages of 100 comments.  Errors as :meth:`post_status`.
        """
        base = f"{self.api_url}/repos/{comment.repo}/issues"
        body = comment.body if COMMENT_MARKER in comment.body else f"{COMMENT_MARKER}\n{comment.body}"
        for page in range(1, max_pages + 1):
            listed = self._request("GET", f"{base}/{int(comment.pr)}/comments?per_page=100&page={page}")
            items = listed.json() if listed.content else []
            if not isinstance(items, list):
                raise PermanentStatusError(f"GET {base}/{comment.pr}/comments: expected a list")
            for item in items:
                if isinstance(item, dict) and COMMENT_MARKER in str(item.get("body") or "") and "id" in item:
                    self._request("PATCH", f"{base}/comments/{int(item['id'])}", {"body": body[:MAX_COMMENT]})
                    return int(item["id"])
            if len(items) < 100:
                break
        made = self._request("POST", f"{base}/{int(comment.pr)}/comments", {"body": body[:MAX_COMMENT]})
        try:
            return int(made.json().get("id", 0))
        except (ValueError, AttributeError):
            return 0

    def post_check_run(self, check: CheckRun) -> None:
        """Create a completed check run (needs a token with the ``checks: write`` permission, i.e. a
        GitHub App installation token).  Errors as :meth:`post_status`."""
        self._request("POST", f"{self.api_url}/repos/{check.repo}/check-runs", check.body())

    def upsert_check_run(self, check: CheckRun) -> int:
        """Edit the newest check run named ``check.name`` on ``check.sha`` to ``check`` (so a re-report
        of a head -- after an acknowledgement, a late confirmation -- is one check run, not one more),
        or create it when there is none; return its id (0 if GitHub did not say).  A check run that
        cannot be edited (another app's: 403/404) is left alone and a new one created.  Errors as
        :meth:`post_status`."""
        from urllib.parse import quote

        base = f"{self.api_url}/repos/{check.repo}"
        listed = self._request("GET", f"{base}/commits/{check.sha}/check-runs?check_name={quote(check.name, safe='')}"
                                      "&filter=latest&per_page=100")
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
                self._request("PATCH", f"{base}/check-runs/{newest['id']}", body)
                return int(newest["id"])
            except PermanentStatusError as exc:
                if " HTTP 403:" not in str(exc) and " HTTP 404:" not in str(exc):
                    raise
        made = self._request("POST", f"{base}/check-runs", check.body())
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

    def _request(self, method: str, url: str, body: object = None) -> httpx.Response:
        """One GitHub call with the in-call retries; the 2xx response, or Transient/PermanentStatusError."""
        last: TransientStatusError | None = None
        for attempt in range(self.attempts):
            if attempt:
                delay = backoff_delay(attempt - 1, self.backoff_base, cap=10.0)
                if last is not None and last.retry_after is not None:
                    delay = max(delay, min(last.retry_after, 10.0))
                self._sleep(delay)
            try:
                resp = self._http.request(method, url, json=body) if body is not None else \
                    self._http.request(method, url)
            except httpx.HTTPError as exc:
                last = TransientStatusError(f"{method} {url}: {type(exc).__name__}: {exc}")
                continue
            if 200 <= resp.status_code < 300:
                return resp
            last_or_perm = _classify(url, resp, method)
            if isinstance(last_or_perm, PermanentStatusError):
                raise last_or_perm
            last = last_or_perm
        assert last is not None
        raise last


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
