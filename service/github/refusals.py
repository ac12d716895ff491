"""What a refusal by GitHub means for the report that met it: the error kinds of the client and the rules
that class an answer into one (GitHub's "Troubleshooting the REST API" and "Rate limits for the REST API").

* **A primary rate limit** (429, or 403 with ``x-ratelimit-remaining: 0``): wait until
  ``x-ratelimit-reset`` (or ``Retry-After`` when given).
* **A secondary rate limit** (403 or 429 whose message says "secondary rate limit", often with a healthy
  ``x-ratelimit-remaining`` and no ``Retry-After``): wait ``Retry-After`` when given, else until
  ``x-ratelimit-reset`` when given, else at least ``wait`` seconds (GitHub: "at least one minute",
  :data:`SECONDARY_WAIT`; a client takes it as a parameter, so a test can shorten it).  Retrying earlier
  only prolongs the block.
* **5xx and 408**: transient, retried in the call and then by the outbox.
* **A 4xx GitHub documents for the endpoints ampci calls** (:data:`KNOWN_REFUSALS`: bad request, bad
  credentials, forbidden, not found, gone, validation failed): permanent; a 422 of a report's write has
  a shortened fallback (:mod:`service.github.fallback`).
* **Any other 4xx** (409, 418, 451, ...): :class:`UnexpectedStatusError`, retried by the outbox at most
  :data:`UNEXPECTED_ATTEMPTS` times, each logged as one line with GitHub's answer (:func:`redact`ed).

Every message is one line, at most a few hundred characters, with tokens and URL passwords redacted.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping

from service.github_auth.transport import (
    DEFAULT_RATE_LIMIT_DELAY,
    MAX_RETRY_DELAY,
    MIN_RETRY_DELAY,
    retry_delay,
)

#: GitHub's advice for a secondary rate limit that names no delay: wait at least a minute.
SECONDARY_WAIT = DEFAULT_RATE_LIMIT_DELAY
#: The 4xx answers GitHub documents for the report endpoints: retrying the same request cannot help.
KNOWN_REFUSALS = frozenset({400, 401, 403, 404, 410, 422})
#: How many posts of one report an unknown 4xx may cost before the report is dropped.
UNEXPECTED_ATTEMPTS = 3
ANSWER_CHARS = 200  # of GitHub's answer kept in a message

_TOKEN = re.compile(r"\b(gh[opusr]_|github_pat_|v1\.)[A-Za-z0-9_]{6,}")
_BEARER = re.compile(r"(?i)\b(bearer|token)\s+[A-Za-z0-9_.\-]{8,}")
_URL_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^@\s]*@")


class StatusPostError(Exception):
    """Posting a report (commit status, comment, check run) failed."""


class TransientStatusError(StatusPostError):
    """Worth retrying later (network, 5xx, rate limit); ``retry_after`` seconds when GitHub said
    (always finite and clamped: :func:`service.github_auth.transport.retry_delay`)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RateLimitedError(TransientStatusError):
    """GitHub limited the credential of ``repo`` (a primary or secondary rate limit): nothing more
    should be sent with that credential for ``retry_after`` seconds; never retried inside the call."""

    def __init__(self, message: str, retry_after: float, repo: str) -> None:
        super().__init__(message, retry_after)
        self.repo = repo


class MalformedAnswerError(TransientStatusError):
    """GitHub's answer could not be read (invalid JSON, a number no float holds, an id that is no id):
    counted as a failed attempt like an outage, and never a traceback."""


class UnexpectedStatusError(TransientStatusError):
    """A 4xx GitHub does not document for the call (``status``): retried by the outbox at most
    :data:`UNEXPECTED_ATTEMPTS` times, never inside the call."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class PermanentStatusError(StatusPostError):
    """Retrying the same request cannot help (401/403/404/422...); ``status`` is GitHub's HTTP status
    (0: no answer of GitHub's, e.g. a credential that would go to another host)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def redact(text: str, limit: int = ANSWER_CHARS) -> str:
    """``text`` on one line, at most ``limit`` characters, with GitHub tokens, bearer credentials and URL
    passwords replaced by ``***``."""
    one = " ".join(text.split())
    one = _TOKEN.sub(r"\1***", one)
    one = _BEARER.sub(r"\1 ***", one)
    one = _URL_PASSWORD.sub(r"\1***@", one)
    return one[:limit]


def is_secondary_limit(status: int, text: str) -> bool:
    """True for GitHub's secondary rate limit: a 403 or 429 whose message says so."""
    return status in (403, 429) and "secondary rate limit" in text.lower()


def rate_limit_delay(headers: Mapping[str, str], secondary: bool, wait: float,
                     now: float | None = None) -> float:
    """Seconds to wait after a rate limit (module docstring): ``Retry-After``; else ``x-ratelimit-reset``
    when ``x-ratelimit-remaining`` is 0, or, for a secondary limit, whenever the reset is given; else
    ``wait``.  Clamped to [:data:`MIN_RETRY_DELAY`, :data:`MAX_RETRY_DELAY`]."""
    told = retry_delay(headers, now)
    if told is not None:
        return told
    if secondary and "x-ratelimit-reset" in headers:
        try:
            reset = float(headers["x-ratelimit-reset"].strip())
        except ValueError:
            reset = math.nan
        if math.isfinite(reset):
            return min(MAX_RETRY_DELAY, max(MIN_RETRY_DELAY, reset - (time.time() if now is None else now)))
    return min(MAX_RETRY_DELAY, max(MIN_RETRY_DELAY, wait))


def classify(status: int, headers: Mapping[str, str], text: str, what: str, repo: str,
             wait: float = SECONDARY_WAIT) -> StatusPostError:
    """A non-2xx answer (``status``, ``headers``, body ``text``) to ``what`` (``METHOD URL``) as an error
    kind (module docstring); ``wait``: the least wait of a secondary limit that names none."""
    message = f"{what}: HTTP {status}: {redact(text)}"
    secondary = is_secondary_limit(status, text)
    primary = status == 429 or (status == 403 and (
        headers.get("x-ratelimit-remaining") == "0" or "retry-after" in headers))
    if secondary or primary:
        return RateLimitedError(message, rate_limit_delay(headers, secondary, wait), repo)
    if status >= 500 or status == 408:
        return TransientStatusError(message, retry_delay(headers))
    if 400 <= status < 500 and status not in KNOWN_REFUSALS:
        return UnexpectedStatusError(message, status)
    return PermanentStatusError(message, status)
