"""A loopback GitHub for the reporting tests, enforcing the rules GitHub enforces.

Repository data (issue comments, statuses, check runs) is kept as GitHub keeps it.  Every ``/repos``
request must carry a credential GitHub would accept, else 401: the static token (``pat``, a user
``pat_login``) or a live installation token.  The App endpoints check the App JWT as GitHub does:
RS256 signed by the App's key (verified with its public key), ``iss`` the App id, issued no later
than now, expiring within 10 minutes.  Installation tokens expire (``token_lifetime``, or at once by
:meth:`GitHubStandIn.expire_tokens`).  Comments record their author; an App may edit only its own
comments (403 otherwise), a user token with write access may edit any.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from tests.api.helpers import GITHUB_TOKEN, REPO

PR = 7
PAT_LOGIN = "ampci-maintainer"


def _json(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data), status=status, content_type="application/json")


class GitHubStandIn:
    """Issue comments, statuses and check runs of one repository, and GitHub's authentication.

    ``fail`` maps a request kind (``list``, ``create``, ``edit``, ``status``, ``check``) to an HTTP
    status to answer instead, or to ``"timeout"`` (answer after ``delay`` seconds).  ``app_id`` and
    ``public_key`` (PEM) make it accept that App; ``installations`` maps repositories to installation ids."""

    def __init__(self, server: HTTPServer, *, app_id: str | None = None, public_key: str | None = None,
                 slug: str = "ampci-test", installation: int = 4242, token_lifetime: float = 3600.0,
                 clock: Callable[[], float] = time.time, pat: str = GITHUB_TOKEN) -> None:
        self.comments: dict[int, dict[str, Any]] = {}
        self.statuses: list[dict[str, Any]] = []
        self.checks: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str]] = []
        self.fail: dict[str, int | str] = {}
        self.delay = 3.0
        self.app_id, self.public_key, self.slug = app_id, public_key, slug
        self.installations = {REPO.lower(): installation}
        self.token_lifetime = token_lifetime
        self.clock = clock
        self.pat = pat
        self.tokens: dict[str, tuple[int, float]] = {}   # installation token -> (installation, expires)
        self.jwt_claims: list[dict[str, Any]] = []       # of every accepted JWT
        self.refused: list[tuple[str, str]] = []         # (path, why) of every 401
        self._next = 1000
        self._lock = threading.Lock()
        server.expect_request(re.compile(r"^/.*")).respond_with_handler(self.handle)

    # -- authentication -------------------------------------------------------------------------

    def expire_tokens(self) -> None:
        """Every installation token minted so far expires now (GitHub: 401 'Bad credentials')."""
        with self._lock:
            self.tokens = {t: (i, self.clock() - 1) for t, (i, _) in self.tokens.items()}

    def minted(self) -> int:
        return len(self.tokens)

    def _bearer(self, request: Request) -> str:
        header = request.headers.get("Authorization", "")
        return header[len("Bearer "):] if header.startswith("Bearer ") else ""

    def _unauthorized(self, request: Request, why: str) -> Response:
        self.refused.append((request.path, why))
        return _json({"message": "Bad credentials", "why": why}, 401)

    def _identity(self, request: Request) -> str | Response:
        """The login a repository request acts as, or the 401 answer."""
        token = self._bearer(request)
        if token and token == self.pat:
            return PAT_LOGIN
        held = self.tokens.get(token)
        if held is None:
            return self._unauthorized(request, "unknown token")
        if held[1] <= self.clock():
            return self._unauthorized(request, "expired installation token")
        return f"{self.slug}[bot]"

    def _app(self, request: Request) -> dict[str, Any] | Response:
        """The claims of a valid App JWT, or the 401 answer (GitHub's rules)."""
        import jwt

        if self.app_id is None or self.public_key is None:
            return self._unauthorized(request, "no App configured")
        try:
            claims = jwt.decode(self._bearer(request), self.public_key, algorithms=["RS256"],
                                options={"require": ["iat", "exp", "iss"], "verify_exp": False, "verify_iat": False})
        except jwt.PyJWTError as exc:
            return self._unauthorized(request, f"JWT: {type(exc).__name__}")
        now = self.clock()
        if str(claims["iss"]) != self.app_id:
            return self._unauthorized(request, "JWT iss is not the App id")
        if claims["exp"] <= now:
            return self._unauthorized(request, "JWT expired")
        if claims["exp"] - now > 600 or claims["exp"] - claims["iat"] > 660:
            return self._unauthorized(request, "JWT exp too far in the future")
        if claims["iat"] > now + 1:
            return self._unauthorized(request, "JWT issued in the future")
        self.jwt_claims.append(claims)
        return claims

    def _app_endpoint(self, request: Request) -> Response:
        claims = self._app(request)
        if isinstance(claims, Response):
            return claims
        path = request.path
        if path == "/app":
            return _json({"id": int(self.app_id or 0), "slug": self.slug, "name": "ampci test"})
        if m := re.fullmatch(r"/app/installations/(\d+)/access_tokens", path):
            if request.method != "POST" or int(m.group(1)) not in self.installations.values():
                return _json({"message": "Not Found"}, 404)
            with self._lock:
                self._next += 1
                token = f"ghs_test{self._next}"
                expires = self.clock() + self.token_lifetime
                self.tokens[token] = (int(m.group(1)), expires)
            stamp = datetime.fromtimestamp(expires, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            return _json({"token": token, "expires_at": stamp, "permissions": {}}, 201)
        if m := re.fullmatch(r"/repos/([^/]+/[^/]+)/installation", path):
            found = self.installations.get(m.group(1).lower())
            return _json({"id": found}) if found else _json({"message": "Not Found"}, 404)
        return _json({"message": "Not Found"}, 404)

    # -- repository data --------------------------------------------------------------------------

    def _failing(self, kind: str) -> Response | None:
        how = self.fail.get(kind)
        if how is None:
            return None
        if how == "timeout":
            time.sleep(self.delay)
            return Response("{}", status=200, content_type="application/json")
        return Response('{"message": "refused"}', status=int(how), content_type="application/json")

    def handle(self, request: Request) -> Response:
        path, method = request.path, request.method
        with self._lock:
            self.requests.append((method, path))
        if path.startswith("/app") or re.fullmatch(r"/repos/[^/]+/[^/]+/installation", path):
            return self._app_endpoint(request)
        who = self._identity(request)
        if isinstance(who, Response):
            return who
        if path == "/user":
            if who != PAT_LOGIN:  # an installation token is not a user
                return _json({"message": "Resource not accessible by integration"}, 403)
            return _json({"login": who, "id": 1})
        if m := re.fullmatch(rf"/repos/{REPO}/issues/(\d+)/comments", path):
            kind = "list" if method == "GET" else "create"
            if (bad := self._failing(kind)) is not None:
                return bad
            issue = int(m.group(1))
            if method == "GET":
                page, per = int(request.args.get("page", 1)), int(request.args.get("per_page", 30))
                mine = [c for c in self.comments.values() if c["issue"] == issue]
                return _json(mine[(page - 1) * per: page * per])
            with self._lock:
                self._next += 1
                self.comments[self._next] = {"id": self._next, "issue": issue, "body": request.json["body"],
                                             "user": {"login": who}}
            return _json(self.comments[self._next], 201)
        if m := re.fullmatch(rf"/repos/{REPO}/issues/comments/(\d+)", path):
            if (bad := self._failing("edit")) is not None:
                return bad
            comment = self.comments[int(m.group(1))]
            author = (comment.get("user") or {}).get("login")
            if who != PAT_LOGIN and author != who:  # an App edits only its own comments
                return _json({"message": "Resource not accessible by integration"}, 403)
            comment["body"] = request.json["body"]
            return _json(comment)
        if path.startswith(f"/repos/{REPO}/statuses/"):
            if (bad := self._failing("status")) is not None:
                return bad
            self.statuses.append({**request.json, "by": who})
            return _json({}, 201)
        if path.startswith(f"/repos/{REPO}/") and "check-runs" in path:
            if (bad := self._failing("check")) is not None:
                return bad
            return self._check_runs(request)
        return _json({"message": "Not Found"}, 404)

    def _check_runs(self, request: Request) -> Response:
        """List a commit's check runs (by name, newest only as ``filter=latest``), create, edit one."""
        path, method = request.path, request.method
        if (m := re.fullmatch(rf"/repos/{REPO}/commits/([0-9a-f]{{40}})/check-runs", path)) and method == "GET":
            found = [c for c in self.checks if c["head_sha"] == m.group(1)
                     and c["name"] == request.args.get("check_name", c["name"])]
            if request.args.get("filter", "latest") == "latest":
                found = list({c["name"]: c for c in sorted(found, key=lambda c: c["id"])}.values())
            return _json({"total_count": len(found), "check_runs": found})
        if path == f"/repos/{REPO}/check-runs" and method == "POST":
            with self._lock:
                self._next += 1
                self.checks.append({"id": self._next, **request.json})
            return _json(self.checks[-1], 201)
        if (m := re.fullmatch(rf"/repos/{REPO}/check-runs/(\d+)", path)) and method == "PATCH":
            [check] = [c for c in self.checks if c["id"] == int(m.group(1))] or [None]
            if check is None:
                return _json({"message": "Not Found"}, 404)
            if check.get("app") == "other":  # GitHub: an app edits only its own check runs
                return _json({"message": "Resource not accessible by integration"}, 403)
            assert "head_sha" not in request.json  # not a field of the update
            check.update(request.json)
            return _json(check)
        return _json({"message": "Not Found"}, 404)

    def pr_comments(self, issue: int = PR) -> list[dict[str, Any]]:
        return [c for c in self.comments.values() if c["issue"] == issue]
