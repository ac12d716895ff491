"""A small GitHub REST client for commit statuses, with retry and exponential backoff.

``POST {api}/repos/{owner}/{repo}/statuses/{sha}`` with ``Authorization: Bearer <token>`` and a
JSON body ``{"state", "target_url", "description", "context"}``.  Transient failures (network
errors, 5xx, 429, 403 with an exhausted rate limit) raise :class:`TransientStatusError` after the
in-call retries; the caller (the outbox reporter) schedules further attempts.  Permanent failures
(other 4xx: bad token, unknown repository or sha) raise :class:`PermanentStatusError`.
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
        url = f"{self.api_url}/repos/{status.repo}/statuses/{status.sha}"
        last: TransientStatusError | None = None
        for attempt in range(self.attempts):
            if attempt:
                delay = backoff_delay(attempt - 1, self.backoff_base, cap=10.0)
                if last is not None and last.retry_after is not None:
                    delay = max(delay, min(last.retry_after, 10.0))
                self._sleep(delay)
            try:
                resp = self._http.post(url, json=status.body())
            except httpx.HTTPError as exc:
                last = TransientStatusError(f"POST {url}: {type(exc).__name__}: {exc}")
                continue
            if resp.status_code in (200, 201):
                return
            last_or_perm = _classify(url, resp)
            if isinstance(last_or_perm, PermanentStatusError):
                raise last_or_perm
            last = last_or_perm
        assert last is not None
        raise last


def _classify(url: str, resp: httpx.Response) -> StatusPostError:
    text = resp.text[:200].replace("\n", " ")
    retry_after: float | None = None
    if "retry-after" in resp.headers:
        try:
            retry_after = float(resp.headers["retry-after"])
        except ValueError:
            retry_after = None
    limited = resp.status_code == 403 and (resp.headers.get("x-ratelimit-remaining") == "0" or retry_after)
    if resp.status_code >= 500 or resp.status_code in (408, 429) or limited:
        return TransientStatusError(f"POST {url}: HTTP {resp.status_code}: {text}", retry_after)
    return PermanentStatusError(f"POST {url}: HTTP {resp.status_code}: {text}")
