"""The credential a worker clones a webhook's pass repository with: the GitHub identity's token, for git.

A private repository needs a token with *Contents: read* (the App's ``contents: read`` permission): an
installation token of the run's installation minted for that one repository with ``contents: read`` alone
(:data:`~service.github_auth.app.CLONE_PERMISSIONS`: it cannot write a status or read another repository) (:class:`service.github_auth.app.AppAuth`, cached and refreshed as
for reports), or ``AMPCI_GITHUB_TOKEN``.  A worker has one only when its own settings configure an identity
(in compose the credentials reach the api alone: see docs/deployment.md, "Pass repository").

Guarantees: a token is produced only for an https clone URL whose host is GitHub's for the configured API
(``api.github.com`` -> ``github.com``; any other API base: its own host), so it never goes to another host;
the API is called at ``AMPCI_GITHUB_API_URL`` only, without following redirects; failures are one log line
naming the repository and the HTTP status (never a token) and give no token (the clone of a public
repository still works; a private one then fails with git's own message).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from service.settings import Settings

if TYPE_CHECKING:
    from service.github_auth.app import Call, CallAnswer, GitHubAuth
    from service.json_types import JsonObject

log = logging.getLogger(__name__)

_IDENTITIES: dict[Settings, GitHubAuth | None] = {}
_LOCK = threading.Lock()


def clone_host(api_url: str) -> str:
    """The host git clones from for the GitHub API at ``api_url`` (lower case)."""
    host = (urlsplit(api_url).hostname or "").lower()
    return "github.com" if host == "api.github.com" else host


def _identity(settings: Settings) -> GitHubAuth | None:
    from service.github_auth.app import auth_from_settings

    with _LOCK:
        if settings not in _IDENTITIES:
            _IDENTITIES[settings] = auth_from_settings(settings)
        return _IDENTITIES[settings]


def _call(api_url: str) -> Call:
    import httpx

    def call(method: str, path: str, bearer: str, body: JsonObject | None = None) -> CallAnswer:
        with httpx.Client(timeout=10.0, follow_redirects=False) as client:
            resp = client.request(method, api_url.rstrip("/") + path, json=body,
                                  headers={"Authorization": f"Bearer {bearer}", "Accept": "application/vnd.github+json",
                                           "X-GitHub-Api-Version": "2022-11-28"})
        try:
            data = resp.json()
        except ValueError:
            data = None
        return resp.status_code, data, resp.headers

    return call


def git_token(settings: Settings, url: str, repo: str, installation: int | None) -> str:
    """A token git may send to ``url`` to read ``repo`` ('' when none is configured or the URL's host is not
    the API's GitHub host; see the module docstring)."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "https" or (parts.hostname or "").lower() != clone_host(settings.github_api_url):
        return ""
    try:
        identity = _identity(settings)
    except Exception as exc:  # noqa: BLE001 - a half-configured App: say so once per job, clone without
        log.warning("pass repository %s: no git credential (%s)", repo, type(exc).__name__)
        return ""
    if identity is None:
        return ""
    if installation is not None:
        identity.remember(repo, installation)
    from service.github_auth.app import CLONE_PERMISSIONS

    try:
        return str(identity.token(repo, _call(settings.github_api_url), CLONE_PERMISSIONS))
    except Exception as exc:  # noqa: BLE001 - AuthError, network: the clone says the rest
        status = getattr(exc, "status", None)
        log.warning("pass repository %s: no installation token (%s%s)", repo, type(exc).__name__,
                    f", HTTP {status}" if status else "")
        return ""
