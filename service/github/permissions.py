"""Who may approve a pull request's run: asked of GitHub, cached briefly.

An approval (:mod:`service.github.approval`) counts only when the person behind it — a ``/ampci run``
comment's author, the ``ampci:run`` label's sender — holds ``write``, ``maintain`` or ``admin`` on the
repository, as GitHub Actions requires to approve a fork's workflow run.  ``author_association`` cannot
say so (``MEMBER`` includes organisation members without access to the repository, ``COLLABORATOR``
read-only outside collaborators), and GitHub lets triage label.

* **With a GitHub identity** (the App or ``AMPCI_GITHUB_TOKEN``): ``GET /repos/{repo}/collaborators/
  {login}/permission`` through the reporter's bounded, redacted, rate-limit-aware client
  (:class:`~service.github.client.GitHubStatusClient`); :func:`~service.github.approval.role_approves`
  reads the answer (``role_name`` first: triage shows as ``permission`` ``read``); a 404 (not a
  collaborator) is no permission.  ``AMPCI_APPROVERS`` is not consulted: GitHub decides.
* **Without one**: only the logins of ``AMPCI_APPROVERS`` approve (GitHub logins compare case-insensitively).

A permission that approves is cached :data:`ALLOW_TTL_S` seconds per (repository, login); a refusal only
:data:`REFUSAL_TTL_S` (a maintainer just granted access need not wait).  When GitHub cannot be asked (no
answer, a 5xx, a rate limit, a malformed answer, a 401/403 of our own credential) :meth:`ApproverCheck.check`
raises :class:`PermissionUnknownError` and nothing is cached: the intake leaves the approval pending, the run
waiting, and says so in the commit status; it never approves.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from service.github.approval import role_approves
from service.github.refusals import StatusPostError
from service.json_types import JsonObject
from service.settings import Settings

ALLOW_TTL_S = 60.0
REFUSAL_TTL_S = 5.0
_LOGIN = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})(?:\[bot\])?$")


class PermissionClient(Protocol):
    """What asking needs of :class:`~service.github.client.GitHubStatusClient`."""

    def collaborator_permission(self, repo: str, login: str) -> JsonObject | None: ...

    def remember_installation(self, repo: str, installation: int) -> None: ...


class PermissionUnknownError(Exception):
    """GitHub could not be asked whether a login may approve (an outage, a rate limit...): approve nothing yet."""


@dataclass(frozen=True)
class Verdict:
    """Whether ``login`` may approve on ``repo``, and why (a short phrase for the delivery's reason)."""

    allowed: bool
    why: str


class ApproverCheck:
    """Decides whether a login may approve (see the module docstring).  Thread-safe.

    ``client``: the reporter's GitHub client, None when ampci has no GitHub identity.  ``calls`` counts the
    questions sent to GitHub (cache misses)."""

    def __init__(self, settings: Settings, client: PermissionClient | None, *, allow_ttl_s: float = ALLOW_TTL_S,
                 refusal_ttl_s: float = REFUSAL_TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.approvers = settings.approver_set()
        self.client = client
        self.allow_ttl_s = allow_ttl_s
        self.refusal_ttl_s = refusal_ttl_s
        self.clock = clock
        self.calls = 0
        self._cache: dict[tuple[str, str], tuple[float, Verdict]] = {}
        self._lock = threading.Lock()

    def check(self, repo: str, login: str | None, installation: int | None = None) -> Verdict:
        """Whether ``login`` may approve a run of ``repo``; :class:`PermissionUnknownError` when GitHub cannot say."""
        if not login or not _LOGIN.match(login):
            return Verdict(False, "the approver's login is missing or malformed")
        if self.client is None:
            if login.lower() in self.approvers:
                return Verdict(True, f"{login} is in AMPCI_APPROVERS (no GitHub identity to ask)")
            return Verdict(False, f"{login} is not in AMPCI_APPROVERS (no GitHub identity to ask for permissions)")
        key = (repo.lower(), login.lower())
        now = self.clock()
        with self._lock:
            held = self._cache.get(key)
            if held is not None and held[0] > now:
                return held[1]
        if installation is not None:
            self.client.remember_installation(repo, installation)
        self.calls += 1
        try:
            answer = self.client.collaborator_permission(repo, login)
        except StatusPostError as exc:
            raise PermissionUnknownError(f"GitHub's permission of {login} could not be asked: "
                                         f"{str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__}") from None
        verdict = _verdict(login, answer)
        with self._lock:
            if len(self._cache) > 10000:
                self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
            self._cache[key] = (now + (self.allow_ttl_s if verdict.allowed else self.refusal_ttl_s), verdict)
        return verdict


def _verdict(login: str, answer: JsonObject | None) -> Verdict:
    if answer is None:
        return Verdict(False, f"{login} is not a collaborator (permission none)")
    role = answer.get("role_name") or answer.get("permission")
    shown = role if isinstance(role, str) and re.fullmatch(r"[a-z_-]{1,30}", role) else "unknown"
    if role_approves(answer):
        return Verdict(True, f"{login} has {shown} access")
    return Verdict(False, f"{login} has {shown} access (write, maintain or admin approves)")
