"""A loopback GitHub for the reporting tests, enforcing the rules GitHub enforces.

Repository data (issue comments, statuses, check runs) of the repositories in ``repos`` is kept as
GitHub keeps it.  Every ``/repos``
request must carry a credential GitHub would accept, else 401: the static token (``pat``, a user
``pat_login``) or a live installation token.  The App endpoints check the App JWT as GitHub does:
RS256 signed by the App's key (verified with its public key), ``iss`` the App id or its client ID, issued no later
than now, expiring within 10 minutes.  Installation tokens expire (``token_lifetime``, or at once by
:meth:`GitHubStandIn.expire_tokens`).  Comments record their author; an App may edit only its own
comments (403 otherwise), a user token with write access may edit any.  Check runs are GitHub App
business: only an installation token may list, create or edit them (a personal token gets 403), and
only with GitHub's values (``status`` queued/in_progress/completed, a ``conclusion`` of GitHub's list
exactly when completed: 422 otherwise); an App edits only its own check runs.  An installation token is
minted for the ``repositories`` and with the ``permissions`` asked (422 beyond the installation's) and
refused (403) outside them.

Refusals follow "Rate limits for the REST API": ``script[kind]`` lists answers to give the next requests of a
kind (:data:`SCRIPTED`), among them the secondary rate limit (403 "You have exceeded a secondary rate limit",
no ``Retry-After``); once an identity met it, its every repository request is refused the same way until
``secondary_window`` seconds have passed (GitHub: continuing to send while limited prolongs the block), and
each such early request is counted in ``early``.  Sizes follow the REST reference: a check run's
``output.summary`` or ``output.text`` over ``output_limit`` bytes (65,535; GitHub counts bytes) and a comment
over 65,536 characters are refused with 422.

Collaborators' permissions follow "Get repository permissions for a user": ``roles`` maps a login (lower case)
to its repository role (``admin``, ``maintain``, ``write``, ``triage``, ``read``); the answer's ``permission`` is
``admin``/``write``/``read`` (maintain shows as write, triage as read) with ``role_name`` the role, and a login
with no role is not a collaborator: 404.  Any token may ask (GitHub Apps always hold ``metadata: read``);
``permission_asked`` counts the questions.

``hostile`` makes one repository's GitHub misbehave (:data:`HOSTILE`), to prove the reporter cannot
be stalled: a trickled answer, an endless body, a gzip bomb, a rate limit with any ``Retry-After``,
invalid JSON, an id no integer holds.  Serve it from a threaded server to see two repositories at once.
"""

from __future__ import annotations

import functools
import json
import re
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from tests.service.api.helpers import GITHUB_TOKEN, REPO

PR = 7
PAT_LOGIN = "ampci-maintainer"
APP_ID = "123456"
#: hostile modes (``GitHubStandIn.hostile[repo] = mode``): ``trickle`` (a 200 whose body comes one byte
#: every ``trickle_s`` seconds, for ever), ``huge`` (an endless body), ``gzip_bomb`` (a small gzip answer
#: that inflates to 256 MiB), ``retry_after:VALUE`` (429 with that Retry-After), ``invalid_json`` (a 200
#: that is not JSON), ``big_id`` (a 200 whose ids are ``1e400``)
HOSTILE = ("trickle", "huge", "gzip_bomb", "retry_after:", "invalid_json", "big_id")
#: scripted answers (``GitHubStandIn.script[kind]``, consumed one per request of the kind): ``secondary`` (403, a
#: secondary rate limit, no Retry-After: limited for ``secondary_window``), ``secondary_reset`` (the same with
#: ``x-ratelimit-reset`` two windows ahead, limited until then), ``primary`` (403, ``x-ratelimit-remaining: 0``,
#: reset two windows ahead), or an HTTP status (409, 422)
SCRIPTED = ("secondary", "secondary_reset", "primary")
SECONDARY_MESSAGE = ("You have exceeded a secondary rate limit. Please wait a few minutes before you try again. If "
                     "you reach out to GitHub Support for help, please include the request ID.")
MAX_COMMENT_CHARS = 65536
_LEVEL = {"none": 0, "read": 1, "write": 2}
#: the permission each request kind needs (GitHub's "Permissions required for GitHub Apps"): level, any of names
NEEDS = {"list": ("read", ("pull_requests", "issues")), "create": ("write", ("pull_requests", "issues")),
         "edit": ("write", ("pull_requests", "issues")), "status": ("write", ("statuses",)),
         "check": ("read", ("checks",)), "check_write": ("write", ("checks",)), "other": ("read", ("contents",)),
         "permission": ("read", ("metadata",))}
#: GitHub's ``permission`` field for each repository role (``role_name``)
ROLE_PERMISSION = {"admin": "admin", "maintain": "write", "write": "write", "triage": "read", "read": "read"}
CHECK_STATUSES = ("queued", "in_progress", "completed")
CHECK_CONCLUSIONS = ("action_required", "cancelled", "failure", "neutral", "success", "skipped", "timed_out")


@functools.lru_cache(maxsize=1)
def gzip_bomb() -> bytes:
    """256 MiB of zeros, gzip-compressed (about 260 KB)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    return b"".join([*(packer.compress(zeros) for _ in range(256)), packer.flush()])


@functools.lru_cache(maxsize=1)
def app_key() -> tuple[str, str]:
    """(private PEM, public PEM) of a test App's RSA key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return private, public


def _json(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data), status=status, content_type="application/json")


class GitHubStandIn:
    """Issue comments, statuses and check runs of one repository, and GitHub's authentication.

    ``fail`` maps a request kind (``list``, ``create``, ``edit``, ``status``, ``check``) to an HTTP
    status to answer instead, or to ``"timeout"`` (answer after ``delay`` seconds).  ``app_id`` and
    ``public_key`` (PEM) make it accept that App; ``installations`` maps repositories to installation ids."""

    def __init__(self, server: HTTPServer, *, app_id: str | None = None, public_key: str | None = None,
                 slug: str = "ampci-test", installation: int = 4242, token_lifetime: float = 3600.0,
                 clock: Callable[[], float] = time.time, pat: str = GITHUB_TOKEN,
                 repos: tuple[str, ...] = (REPO,), client_id: str | None = None) -> None:
        self.comments: dict[int, dict[str, Any]] = {}
        self.statuses: list[dict[str, Any]] = []
        self.checks: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str]] = []
        self.fail: dict[str, int | str] = {}
        self.delay = 3.0
        self.app_id, self.public_key, self.slug = app_id, public_key, slug
        self.client_id = client_id  # GitHub accepts the App's client ID as the JWT's iss as well
        self.repos = {r.lower() for r in repos}
        self.installations = {r.lower(): installation + i for i, r in enumerate(repos)}
        self.hostile: dict[str, str] = {}   # repository (lower case) -> a mode of HOSTILE
        self.trickle_s = 1.0
        self.served: dict[str, int] = {}    # repository (lower case) -> requests answered (after hostility)
        self.token_lifetime = token_lifetime
        self.clock = clock
        self.pat = pat
        self.tokens: dict[str, tuple[int, float]] = {}   # installation token -> (installation, expires)
        self.jwt_claims: list[dict[str, Any]] = []       # of every accepted JWT
        self.refused: list[tuple[str, str]] = []         # (path, why) of every 401
        self.script: dict[str, list[int | str]] = {}     # request kind -> answers to give next (SCRIPTED)
        self.secondary_window = 60.0
        self.limited_until: dict[str, float] = {}        # identity -> end of its rate limit
        self.limited_at: list[float] = []                # when each scripted rate limit was answered
        self.early = 0                                   # requests sent while their identity was limited
        self.output_limit = 65535
        #: the App's permissions on every installation (deploy/github-app.json's) and what each token holds
        self.granted = {"checks": "write", "pull_requests": "write", "statuses": "write", "contents": "read",
                        "metadata": "read"}
        self.scopes: dict[str, tuple[set[str] | None, dict[str, str] | None]] = {}  # token -> (repo names, perms)
        self.mints: list[dict[str, Any]] = []            # the body of every installation token minted
        self.narrowed: list[tuple[str, str]] = []        # (path, why) of every 403 for a token's narrowing
        self.roles: dict[str, str] = {"maintainer": "write"}  # login (lower case) -> repository role
        self.permission_asked: list[str] = []            # the login of every permission question answered
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
        if str(claims["iss"]) not in {self.app_id, self.client_id} - {None}:
            return self._unauthorized(request, "JWT iss is neither the App id nor its client ID")
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
            installation = int(m.group(1))
            asked = request.get_json(silent=True) or {}
            mine = {r.split("/", 1)[1] for r, i in self.installations.items() if i == installation}
            names = {str(n).lower() for n in asked.get("repositories", [])} or None
            permissions = asked.get("permissions")
            if names is not None and not names <= mine:
                return _json({"message": "There is at least one repository that does not exist or is not "
                                         "accessible to the parent installation."}, 422)
            if permissions is not None and any(
                    _LEVEL.get(level, 9) > _LEVEL.get(self.granted.get(name, "none"), 0)
                    for name, level in permissions.items()):
                return _json({"message": "The permissions requested are not granted to this installation."}, 422)
            with self._lock:
                self._next += 1
                token = f"ghs_test{self._next}"
                expires = self.clock() + self.token_lifetime
                self.tokens[token] = (installation, expires)
                self.scopes[token] = (names, dict(permissions) if permissions is not None else None)
                self.mints.append({"installation": installation, **asked})
            stamp = datetime.fromtimestamp(expires, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            return _json({"token": token, "expires_at": stamp,
                          "permissions": permissions if permissions is not None else self.granted}, 201)
        if m := re.fullmatch(r"/repos/([^/]+/[^/]+)/installation", path):
            found = self.installations.get(m.group(1).lower())
            return _json({"id": found}) if found else _json({"message": "Not Found"}, 404)
        return _json({"message": "Not Found"}, 404)

    # -- repository data --------------------------------------------------------------------------

    def _scripted(self, kind: str, who: str) -> Response | None:
        """The next scripted answer of ``kind`` (:data:`SCRIPTED`), consumed; None when none is left."""
        with self._lock:
            queue = self.script.get(kind)
            how = queue.pop(0) if queue else None
        if how is None:
            return None
        if isinstance(how, int):
            return _json({"message": f"scripted {how}", "documentation_url": "https://docs.github.com/rest"}, how)
        now = self.clock()
        # a limit that names its reset lasts until then: two windows, so waiting one is not enough
        until = now + self.secondary_window * (1 if how == "secondary" else 2)
        with self._lock:
            self.limited_until[who] = until
            self.limited_at.append(now)
        reset = {"x-ratelimit-reset": str(int(until) + 1)}
        if how == "primary":
            return Response(
                json.dumps({"message": "API rate limit exceeded for installation."}), status=403,
                content_type="application/json", headers={"x-ratelimit-remaining": "0", **reset})
        headers = {"x-ratelimit-remaining": "4000", **(reset if how == "secondary_reset" else {})}
        return Response(json.dumps({"message": SECONDARY_MESSAGE}), status=403, content_type="application/json",
                        headers=headers)

    def _still_limited(self, who: str) -> Response | None:
        """GitHub's answer to a request of an identity whose rate limit has not ended (counted in ``early``)."""
        with self._lock:
            until = self.limited_until.get(who)
            if until is None or until <= self.clock():
                return None
            self.early += 1
        return Response(json.dumps({"message": SECONDARY_MESSAGE}), status=403, content_type="application/json",
                        headers={"x-ratelimit-remaining": "4000"})

    def _outside_scope(self, request: Request, repo: str, kind: str) -> Response | None:
        """GitHub's 403 for an installation token used outside what it was minted for: another repository, or
        an endpoint whose permission (:data:`NEEDS`) it does not hold at that level; None when allowed."""
        scope = self.scopes.get(self._bearer(request))
        if scope is None:
            return None
        names, permissions = scope
        why = ""
        if names is not None and repo.split("/", 1)[1] not in names:
            why = f"token not minted for {repo}"
        elif permissions is not None and kind in NEEDS:
            level, choices = NEEDS[kind]
            held = {"metadata": "read", **permissions}  # GitHub: every installation token reads metadata
            if not any(_LEVEL.get(held.get(name, "none"), 0) >= _LEVEL[level] for name in choices):
                why = f"{kind} needs {level} on one of {', '.join(choices)}"
        if not why:
            return None
        self.narrowed.append((request.path, why))
        return _json({"message": "Resource not accessible by integration", "why": why}, 403)

    def _failing(self, kind: str) -> Response | None:
        how = self.fail.get(kind)
        if how is None:
            return None
        if how == "timeout":
            time.sleep(self.delay)
            return Response("{}", status=200, content_type="application/json")
        return Response('{"message": "refused"}', status=int(how), content_type="application/json")

    def _misbehave(self, mode: str) -> Response:
        """The answer of a hostile repository (:data:`HOSTILE`)."""
        if mode == "trickle":
            def trickle() -> Iterator[bytes]:
                for _ in range(600):
                    yield b" "
                    time.sleep(self.trickle_s)
            return Response(trickle(), status=200, content_type="application/json", direct_passthrough=True)
        if mode == "huge":
            def endless() -> Iterator[bytes]:
                chunk = b" " * 65536
                for _ in range(1 << 16):  # 4 GiB at most
                    yield chunk
            return Response(endless(), status=200, content_type="application/json", direct_passthrough=True)
        if mode == "gzip_bomb":
            return Response(gzip_bomb(), status=200, content_type="application/json",
                            headers={"Content-Encoding": "gzip"})
        if mode.startswith("retry_after:"):
            return Response('{"message": "API rate limit exceeded"}', status=429, content_type="application/json",
                            headers={"Retry-After": mode.split(":", 1)[1]})
        if mode == "invalid_json":
            return Response('{"check_runs": [{"id": 1,', status=200, content_type="application/json")
        if mode == "big_id":
            return Response('{"total_count": 1, "check_runs": [{"id": 1e400, "name": "x"}]}', status=200,
                            content_type="application/json")
        raise AssertionError(f"unknown hostile mode {mode!r}")

    def handle(self, request: Request) -> Response:
        path, method = request.path, request.method
        with self._lock:
            self.requests.append((method, path))
        if path.startswith("/app") or re.fullmatch(r"/repos/[^/]+/[^/]+/installation", path):
            if (scripted := self._scripted("app", "app")) is not None:  # the App's own calls: script["app"]
                return scripted
            return self._app_endpoint(request)
        who = self._identity(request)
        if isinstance(who, Response):
            return who
        if path == "/user":
            if who != PAT_LOGIN:  # an installation token is not a user
                return _json({"message": "Resource not accessible by integration"}, 403)
            return _json({"login": who, "id": 1})
        m = re.match(r"/repos/([^/]+/[^/]+)(/.*)", path)
        if m is None or m.group(1).lower() not in self.repos:
            return _json({"message": "Not Found"}, 404)
        repo, rest = m.group(1).lower(), m.group(2)
        with self._lock:
            self.served[repo] = self.served.get(repo, 0) + 1
        if repo in self.hostile:
            return self._misbehave(self.hostile[repo])
        if (limited := self._still_limited(who)) is not None:
            return limited
        kind = ("list" if method == "GET" else "create") if re.fullmatch(r"/issues/(\d+)/comments", rest) else \
            "edit" if rest.startswith("/issues/comments/") else "status" if rest.startswith("/statuses/") else \
            ("check" if method == "GET" else "check_write") if "check-runs" in rest else \
            "permission" if re.fullmatch(r"/collaborators/[^/]+/permission", rest) else "other"
        if (narrow := self._outside_scope(request, repo, kind)) is not None:
            return narrow
        if (scripted := self._scripted(kind, who)) is not None:
            return scripted
        if method in ("POST", "PATCH") and kind in ("create", "edit") and \
                len(request.json.get("body", "")) > MAX_COMMENT_CHARS:
            return _json({"message": "Validation Failed", "errors": [
                {"resource": "IssueComment", "code": "custom", "field": "body",
                 "message": f"body is too long (maximum is {MAX_COMMENT_CHARS} characters)"}]}, 422)
        if m := re.fullmatch(r"/issues/(\d+)/comments", rest):
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
        if m := re.fullmatch(r"/issues/comments/(\d+)", rest):
            if (bad := self._failing("edit")) is not None:
                return bad
            comment = self.comments[int(m.group(1))]
            author = (comment.get("user") or {}).get("login")
            if who != PAT_LOGIN and author != who:  # an App edits only its own comments
                return _json({"message": "Resource not accessible by integration"}, 403)
            comment["body"] = request.json["body"]
            return _json(comment)
        if m := re.fullmatch(r"/collaborators/([^/]+)/permission", rest):
            if (bad := self._failing("permission")) is not None:
                return bad
            login = m.group(1).lower()
            with self._lock:
                self.permission_asked.append(login)
            role = self.roles.get(login)
            if role is None:  # GitHub: not a collaborator
                return _json({"message": "Not Found"}, 404)
            return _json({"permission": ROLE_PERMISSION[role], "role_name": role, "user": {"login": m.group(1)}})
        if rest.startswith("/statuses/"):
            if (bad := self._failing("status")) is not None:
                return bad
            self.statuses.append({**request.json, "by": who, "repo": repo})
            return _json({}, 201)
        if "check-runs" in rest:
            if (bad := self._failing("check")) is not None:
                return bad
            if who == PAT_LOGIN:  # GitHub: the Checks API is for GitHub Apps only
                return _json({"message": "Resource not accessible by personal access token"}, 403)
            return self._check_runs(request, repo, rest, who)
        return _json({"message": "Not Found"}, 404)

    @staticmethod
    def _invalid_check(body: dict[str, Any], creating: bool, limit: int = 65535) -> str | None:
        """Why GitHub would refuse this check-run body with 422, or None."""
        if creating and not (isinstance(body.get("name"), str) and body["name"]
                             and re.fullmatch(r"[0-9a-f]{40}", str(body.get("head_sha")))):
            return "name and head_sha are required"
        status, conclusion = body.get("status", "queued" if creating else None), body.get("conclusion")
        if status is not None and status not in CHECK_STATUSES:
            return f"status {status!r} is not included in the list"
        if conclusion is not None and conclusion not in CHECK_CONCLUSIONS:
            return f"conclusion {conclusion!r} is not included in the list"
        if status == "completed" and conclusion is None:
            return "conclusion must be provided when status is completed"
        if conclusion is not None and status not in (None, "completed"):
            return "a conclusion requires status completed"
        output = body.get("output") or {}
        for field in ("summary", "text"):
            if len(str(output.get(field, "")).encode()) > limit:
                return f"output.{field} is too long (maximum is {limit} characters)"
        return None

    def _check_runs(self, request: Request, repo: str, rest: str, who: str) -> Response:
        """List a commit's check runs (by name; newest per name as ``filter=latest``), create, edit one."""
        method = request.method
        if (m := re.fullmatch(r"/commits/([0-9a-f]{40})/check-runs", rest)) and method == "GET":
            found = [c for c in self.checks if c["repo"] == repo and c["head_sha"] == m.group(1)
                     and c["name"] == request.args.get("check_name", c["name"])]
            if request.args.get("filter", "latest") == "latest":
                found = list({c["name"]: c for c in sorted(found, key=lambda c: c["id"])}.values())
            return _json({"total_count": len(found), "check_runs": found})
        if rest == "/check-runs" and method == "POST":
            if (why := self._invalid_check(request.json, creating=True, limit=self.output_limit)) is not None:
                return _json({"message": "Validation Failed", "why": why}, 422)
            with self._lock:
                self._next += 1
                self.checks.append({"status": "queued", "id": self._next, **request.json, "repo": repo, "app": who})
            return _json(self.checks[-1], 201)
        if (m := re.fullmatch(r"/check-runs/(\d+)", rest)) and method == "PATCH":
            [check] = [c for c in self.checks if c["id"] == int(m.group(1)) and c["repo"] == repo] or [None]
            if check is None:
                return _json({"message": "Not Found"}, 404)
            if check.get("app") != who:  # GitHub: an app edits only its own check runs
                return _json({"message": "Resource not accessible by integration"}, 403)
            assert "head_sha" not in request.json  # not a field of the update
            if (why := self._invalid_check(request.json, creating=False, limit=self.output_limit)) is not None:
                return _json({"message": "Validation Failed", "why": why}, 422)
            check.update(request.json)
            if check.get("status") != "completed":
                check.pop("conclusion", None)
            return _json(check)
        return _json({"message": "Not Found"}, 404)

    def pr_comments(self, issue: int = PR) -> list[dict[str, Any]]:
        return [c for c in self.comments.values() if c["issue"] == issue]


def app_standin(server: HTTPServer, **kwargs: Any) -> GitHubStandIn:
    """A stand-in that accepts the test App (:func:`app_key`, :data:`APP_ID`)."""
    return GitHubStandIn(server, app_id=APP_ID, public_key=app_key()[1], **kwargs)


def app_client(server: HTTPServer, **kwargs: Any) -> Any:
    """A client reporting as the test App to ``server`` (its installation looked up or remembered)."""
    from service.github.client import GitHubStatusClient
    from service.github_auth.app import AppAuth

    kwargs.setdefault("timeout", 2.0)
    return GitHubStatusClient(server.url_for("/"), auth=AppAuth(APP_ID, app_key()[0]), **kwargs)
