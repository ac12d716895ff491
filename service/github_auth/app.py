"""Who ampci is on GitHub: a GitHub App installation (recommended) or a static token.

:class:`AppAuth` signs an RS256 JWT with the App's private key (PyJWT; ``iat`` 60 s in the past for
clock drift, ``exp`` 9 minutes ahead -- GitHub refuses more than 10 -- ``iss`` the App's client ID when
configured, as GitHub now recommends, else its numeric id; GitHub accepts either) and
exchanges it at ``POST /app/installations/{id}/access_tokens`` for an installation token.  The
installation of a repository is the one its webhook named (``installation.id``, kept with the run:
:meth:`remember`), else ``GET /repos/{owner}/{repo}/installation`` with the JWT.  A token is as narrow as its
job: minted for the one repository it is used on (``repositories``) with the ``permissions`` its caller
names (a clone: ``contents: read``; the reporter: the write permissions of the reports it sends), so a
token handed to a worker cannot write a status, nor read another repository of the installation.  Tokens
are cached per (installation, repository, permissions) and minted anew :data:`REFRESH_MARGIN` seconds
before their ``expires_at``, and once more when GitHub answers 401 (:meth:`invalidate`).  The identity whose comments are ampci's is the
App's bot, ``<slug>[bot]`` (``GET /app``).

:class:`StaticToken` is the personal or bot token of ``AMPCI_GITHUB_TOKEN`` (commit statuses and
comments; GitHub accepts check runs only from an App): its identity is ``GET /user``'s login.

Credentials go only to the configured API base: every request is built by the caller from
``api_url`` and redirects are never followed (:class:`~service.github.client.GitHubStatusClient`).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Protocol

from service.errors import ConfigError
from service.github_auth.transport import DEFAULT_RATE_LIMIT_DELAY, retry_delay
from service.json_types import JsonObject, JsonValue
from service.settings import Settings

JWT_BACKDATE = 60.0      # iat this far in the past (GitHub's advice against clock drift)
JWT_LIFETIME = 540.0     # exp this far ahead of now (GitHub refuses more than 600 s)
REFRESH_MARGIN = 300.0   # mint a new installation token this long before the old one expires


class AuthError(Exception):
    """GitHub refused or garbled an authentication call: ``status`` is its HTTP status (0: no answer)."""

    def __init__(self, message: str, status: int = 0, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        self.installation: int | None = None  # the installation a token was asked of, when that call failed


#: Permissions of an installation token (GitHub's names: ``{"contents": "read", "statuses": "write"}``).
Permissions = Mapping[str, str]
#: The clone's: read the repository's contents, nothing else.
CLONE_PERMISSIONS: Permissions = {"contents": "read"}

#: What :data:`Call` returns: the HTTP status, the answer's JSON (None when it had none or no valid JSON) and
#: the answer's headers (lower-case names; None when there was no answer).
CallAnswer = tuple[int, JsonValue, Mapping[str, str] | None]


class Call(Protocol):
    """``call(method, path, bearer, body=None) -> (status, json or None, headers)``: one request to the API
    base (``body``: a JSON object to send)."""

    def __call__(self, method: str, path: str, bearer: str, body: JsonObject | None = None) -> CallAnswer: ...



class GitHubAuth(Protocol):
    """What the client asks of an identity (thread-safe)."""

    def token(self, repo: str, call: Call, permissions: Permissions | None = None) -> str:
        """A credential for ``repo`` holding at most ``permissions`` (None: all the identity has)."""
        ...

    def invalidate(self, repo: str) -> bool:
        """Forget the cached credential of ``repo``; True when a fresh one may differ (retry once)."""
        ...

    def login(self, call: Call) -> str: ...

    def remember(self, repo: str, installation: int) -> None: ...


class StaticToken:
    """``AMPCI_GITHUB_TOKEN``: one token for every repository; its identity from ``GET /user``."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("empty GitHub token")
        self._token = token
        self._login: str | None = None

    def token(self, repo: str, call: Call, permissions: Permissions | None = None) -> str:
        return self._token  # a static token's scope is set where it was made

    def invalidate(self, repo: str) -> bool:
        return False  # the same token again would fail the same way

    def remember(self, repo: str, installation: int) -> None:
        return None

    def login(self, call: Call) -> str:
        if self._login is None:
            self._login = _login_of(call("GET", "/user", self._token), "GET /user", "login")
        return self._login


class AppAuth:
    """A GitHub App: JWTs, installation ids per repository and installation tokens per installation."""

    def __init__(self, app_id: str, private_key: str, *, client_id: str = "",
                 clock: Callable[[], float] = time.time) -> None:
        import jwt
        from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey
        from cryptography.hazmat.primitives.serialization import load_pem_private_key

        if app_id.strip() and not app_id.strip().isdigit():
            raise ConfigError("AMPCI_GITHUB_APP_ID: expected the App's numeric id")
        if client_id.strip() and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{3,99}", client_id.strip()):
            raise ConfigError("AMPCI_GITHUB_CLIENT_ID: expected the App's client ID (Iv1.… or Iv23…)")
        if not (app_id.strip() or client_id.strip()):
            raise ConfigError("a GitHub App needs AMPCI_GITHUB_APP_ID or AMPCI_GITHUB_CLIENT_ID")
        try:
            key = load_pem_private_key(private_key.encode(), password=None)
        except (ValueError, TypeError):
            key = None
        if not isinstance(key, RSAPrivateKey):  # the message never carries the key
            raise ConfigError("AMPCI_GITHUB_PRIVATE_KEY(_FILE): not a PEM RSA private key (the App's .pem file)")
        self.app_id = app_id.strip()
        self.client_id = client_id.strip()
        self.issuer = self.client_id or self.app_id  # the JWT's iss
        self._key = key
        self._jwt = jwt
        self._clock = clock
        self._lock = threading.Lock()
        self._installations: dict[str, int] = {}
        self._gone: set[int] = set()  # installations GitHub no longer knows
        self._tokens: dict[tuple[int, str, tuple[tuple[str, str], ...]], tuple[str, float]] = {}
        self._login: str | None = None

    def app_jwt(self) -> str:
        """A JWT for the App's own endpoints: RS256, ``iat`` 60 s back, ``exp`` 9 min ahead, ``iss`` the client
        ID when configured, else the numeric id."""
        now = int(self._clock())
        claims = {"iat": now - int(JWT_BACKDATE), "exp": now + int(JWT_LIFETIME), "iss": self.issuer}
        return str(self._jwt.encode(claims, self._key, algorithm="RS256"))

    def remember(self, repo: str, installation: int) -> None:
        """The installation a webhook of ``repo`` named (saves a ``GET /repos/.../installation``); ignored for
        an installation GitHub no longer knows (:meth:`forget`: a run stored before a reinstall names it)."""
        with self._lock:
            if int(installation) not in self._gone:
                self._installations[repo.lower()] = int(installation)

    def forget(self, installation: int) -> None:
        """``installation`` is gone (uninstalled, or GitHub answered 404 for it): its tokens are dropped, the
        repositories it served are looked up again when next needed, and :meth:`remember` ignores it."""
        with self._lock:
            self._gone.add(int(installation))
            self._installations = {r: i for r, i in self._installations.items() if i != int(installation)}
            self._tokens = {k: v for k, v in self._tokens.items() if k[0] != int(installation)}

    def installation_of(self, repo: str) -> int | None:
        """The installation of ``repo`` when known (remembered or looked up), without a request."""
        with self._lock:
            return self._installations.get(repo.lower())

    def installation(self, repo: str, call: Call) -> int:
        with self._lock:
            known = self._installations.get(repo.lower())
        if known is not None:
            return known
        found = _field(call("GET", f"/repos/{repo}/installation", self.app_jwt()), f"GET /repos/{repo}/installation")
        if type(found.get("id")) is not int or found["id"] <= 0:
            raise AuthError(f"GET /repos/{repo}/installation: no installation id", 502)
        self.remember(repo, found["id"])
        return int(found["id"])

    def token(self, repo: str, call: Call, permissions: Permissions | None = None) -> str:
        """A live installation token for ``repo`` alone with ``permissions`` (None: the installation's),
        cached per (installation, repository, permissions); minted when none or near its expiry.  When GitHub
        no longer knows the installation remembered for ``repo`` (404: uninstalled, maybe installed again),
        it is forgotten and the repository's installation looked up once more before giving up."""
        try:
            return self._token(repo, call, permissions)
        except AuthError as exc:
            if exc.status != 404 or exc.installation is None:
                raise
            self.forget(exc.installation)
        return self._token(repo, call, permissions)

    def _token(self, repo: str, call: Call, permissions: Permissions | None) -> str:
        installation = self.installation(repo, call)
        scope = tuple(sorted((permissions or {}).items()))
        key = (installation, repo.lower(), scope)
        now = self._clock()
        with self._lock:
            cached = self._tokens.get(key)
        if cached is not None and cached[1] - now > REFRESH_MARGIN:
            return cached[0]
        path = f"/app/installations/{installation}/access_tokens"
        body: JsonObject = {"repositories": [repo.split("/", 1)[-1]]}
        if permissions is not None:
            body["permissions"] = dict(scope)
        try:
            got = _field(call("POST", path, self.app_jwt(), body), f"POST {path}")
        except AuthError as exc:
            exc.installation = installation  # a 404: the caller forgets it and looks the repository up again
            raise
        token, expires = got.get("token"), got.get("expires_at")
        try:
            expires_at = datetime.fromisoformat(str(expires).replace("Z", "+00:00")).timestamp()
        except ValueError:
            expires_at = now + 600.0  # unreadable: keep it briefly
        if not isinstance(token, str) or not token:
            raise AuthError(f"POST {path}: no token in the answer", 502)
        with self._lock:
            self._tokens[key] = (token, expires_at)
        return token

    def invalidate(self, repo: str) -> bool:
        with self._lock:
            installation = self._installations.get(repo.lower())
            stale = [k for k in self._tokens if k[0] == installation and k[1] == repo.lower()]
            for k in stale:
                del self._tokens[k]
            return bool(stale)

    def login(self, call: Call) -> str:
        """``<slug>[bot]``: the login GitHub shows as the author of what the App writes."""
        if self._login is None:
            self._login = _login_of(call("GET", "/app", self.app_jwt()), "GET /app", "slug") + "[bot]"
        return self._login


def _field(answer: CallAnswer, what: str) -> JsonObject:
    status, data, headers = answer
    if not 200 <= status < 300:
        retry = retry_delay(headers) if headers is not None else None
        message = data.get("message") if isinstance(data, dict) else None
        secondary = status == 403 and isinstance(message, str) and "secondary rate limit" in message.lower()
        if secondary or (status == 403 and headers is not None and headers.get("x-ratelimit-remaining") == "0"):
            # a rate limit of the App's own calls: told apart from a refusal as a 429 (the caller waits)
            raise AuthError(f"{what}: HTTP {status} (rate limited)", 429, retry or DEFAULT_RATE_LIMIT_DELAY)
        raise AuthError(f"{what}: HTTP {status}", status, retry if status == 429 or (
            headers is not None and headers.get("retry-after") is not None) else None)
    if not isinstance(data, dict):
        raise AuthError(f"{what}: expected a JSON object", 502)
    return data


def _login_of(answer: CallAnswer, what: str, key: str) -> str:
    value = _field(answer, what).get(key)
    if not isinstance(value, str) or not value:
        raise AuthError(f"{what}: no {key} in the answer", 502)
    return value


def auth_from_settings(settings: Settings) -> GitHubAuth | None:
    """The identity the settings configure: the App (``AMPCI_GITHUB_APP_ID`` or ``AMPCI_GITHUB_CLIENT_ID`` with
    ``AMPCI_GITHUB_PRIVATE_KEY`` or ``AMPCI_GITHUB_PRIVATE_KEY_FILE``), else ``AMPCI_GITHUB_TOKEN``, else
    None.  ConfigError (naming the variable, never showing the key) for half an App or an unreadable key."""
    key = settings.github_private_key
    if settings.github_private_key_file:
        if key:
            raise ConfigError("set one of AMPCI_GITHUB_PRIVATE_KEY and AMPCI_GITHUB_PRIVATE_KEY_FILE, not both")
        try:
            key = Path(settings.github_private_key_file).expanduser().read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"AMPCI_GITHUB_PRIVATE_KEY_FILE: cannot read it ({type(exc).__name__})") from None
    named = settings.github_app_id or settings.github_client_id
    if named or key:
        if not (named and key):
            raise ConfigError("a GitHub App needs AMPCI_GITHUB_APP_ID (or AMPCI_GITHUB_CLIENT_ID) and "
                              "AMPCI_GITHUB_PRIVATE_KEY(_FILE)")
        if "\\n" in key and "\n" not in key.strip():  # a PEM written on one line in an env file
            key = key.replace("\\n", "\n")
        return AppAuth(settings.github_app_id, key, client_id=settings.github_client_id)
    if settings.github_token:
        return StaticToken(settings.github_token)
    return None
