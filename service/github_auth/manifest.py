"""Registering ampci's GitHub App from its manifest (GitHub's "Register a GitHub App from a manifest" flow).

The flow has three steps; this module holds the two that are not a browser's:

1. :func:`build_manifest` fills the shipped template (``deploy/github-app.json``: the permissions and events
   ampci uses, one source for both) with the deployment's public URL (``url``; the webhook is
   ``URL/webhooks/github``), the App's name and the ``redirect_url`` of the flow's receiver -- the page that
   gets GitHub's answer, never the site root.  :func:`registration_url` is where the browser posts it
   (``{web}/settings/apps/new`` or ``{web}/organizations/{org}/settings/apps/new``, with ``state``).
2. The browser posts the form, the user confirms on GitHub, and GitHub redirects to
   ``redirect_url?code=CODE&state=STATE`` (the code works once, within an hour).
3. :func:`convert_code` exchanges the code: ``POST {api}/app-manifests/{code}/conversions`` (no credential),
   whose 201 answer holds the App's id, slug, private key (``pem``) and webhook secret.

Guarantees: the exchange goes to ``api_url`` only, through the bounded transport (a total deadline, a
capped answer, no redirect followed); a code that is not a plain token is refused before any request; every
failure is one :class:`ManifestError` line with an exit status (2: GitHub refused the code; 3: GitHub
could not be reached or answered garbage) that never carries the code, the key or the secret; an answer
is accepted only with a positive integer id, a slug, a PEM private key and a webhook secret that an
``.env`` file can hold as it is.  :class:`AppCredentials` never shows its secrets in ``repr``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlencode, urlsplit

from service.errors import ConfigError
from service.github_auth.transport import BoundedHTTP, ExchangeError, MalformedJSONError
from service.json_types import JsonObject, JsonValue

#: The manifest template this checkout ships (README "Connect to GitHub").
TEMPLATE = Path(__file__).resolve().parents[2] / "deploy" / "github-app.json"
WEBHOOK_PATH = "/webhooks/github"
EXCHANGE_DEADLINE = 30.0
#: A manifest code as GitHub writes it (hex today); anything else is refused unsent.
CODE = re.compile(r"[A-Za-z0-9_-]{1,200}", re.ASCII)
#: A webhook secret an .env line holds verbatim (compose reads no quotes in v1 and expands ``$`` in v2).
SAFE_SECRET = re.compile(r"[A-Za-z0-9._~+/=-]{16,512}", re.ASCII)
_ORG = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})", re.ASCII)
_PEM = re.compile(r"-----BEGIN (RSA )?PRIVATE KEY-----\n[A-Za-z0-9+/=\n]+-----END (RSA )?PRIVATE KEY-----\n?",
                  re.ASCII)
_SLUG = re.compile(r"[a-z0-9][a-z0-9-]{0,99}", re.ASCII)


class ManifestError(Exception):
    """The flow failed: one line for the user; ``exit_code`` 2 (GitHub refused the code, bad input) or 3
    (GitHub unreachable or its answer unusable)."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class AppCredentials:
    """What GitHub returns for a converted manifest; ``pem`` and ``webhook_secret`` stay out of ``repr``."""

    app_id: int
    slug: str
    name: str
    owner: str
    html_url: str
    pem: str = field(repr=False)
    webhook_secret: str = field(repr=False)

    @property
    def install_url(self) -> str:
        """The page that installs the App on repositories."""
        return f"{self.html_url.rstrip('/')}/installations/new"


def load_template(path: Path = TEMPLATE) -> JsonObject:
    """The manifest template at ``path`` as a JSON object; ConfigError (one line) when unreadable."""
    try:
        data: JsonValue = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"manifest template {path}: cannot read it ({type(exc).__name__})") from None
    if not isinstance(data, dict) or not isinstance(data.get("default_permissions"), dict):
        raise ConfigError(f"manifest template {path}: not a GitHub App manifest (no default_permissions)")
    return data


def check_public_url(url: str) -> str:
    """``url`` without a trailing slash when it is an http(s) URL with a host and no user, query or
    fragment (what GitHub posts webhooks to); ConfigError otherwise."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.query \
            or parts.fragment or re.search(r"[\s\x00-\x1f\x7f]", url.strip()):
        raise ConfigError(f"public URL {url[:100]!a}: expected http(s)://HOST[/PATH] (the address GitHub reaches "
                          "ampci at)")
    return url.strip().rstrip("/")


def build_manifest(template: JsonObject, *, public_url: str, receiver_url: str, name: str | None = None) -> JsonObject:
    """The template with ``url``, ``hook_attributes.url`` (``public_url`` + :data:`WEBHOOK_PATH`, active) and
    ``redirect_url`` (the flow's receiver) set, ``name`` when given; permissions and events as shipped."""
    base = check_public_url(public_url)
    manifest: JsonObject = dict(template)
    manifest["url"] = base
    manifest["hook_attributes"] = {"url": base + WEBHOOK_PATH, "active": True}
    manifest["redirect_url"] = receiver_url
    if name:
        manifest["name"] = name
    return manifest


def web_url(api_url: str) -> str:
    """GitHub's web address for the API at ``api_url``: ``https://github.com`` for ``api.github.com``;
    an Enterprise Server's ``/api/v3`` base without that path; any other base (a stand-in) as it is."""
    parts = urlsplit(api_url.strip())
    if (parts.hostname or "").lower() == "api.github.com":
        return "https://github.com"
    path = parts.path.rstrip("/")
    path = path[: -len("/api/v3")] if path.endswith("/api/v3") else path
    return f"{parts.scheme}://{parts.netloc}{path}"


def check_org(org: str) -> str:
    """``org`` when it is a GitHub login (letters, digits, inner hyphens, at most 39); ConfigError otherwise."""
    if not _ORG.fullmatch(org):
        raise ConfigError(f"organization {org[:60]!a}: expected a GitHub login (letters, digits, hyphens)")
    return org


def registration_url(web: str, state: str, org: str | None = None) -> str:
    """Where the browser posts the manifest: the user's (or ``org``'s) new-App page, with ``state``."""
    where = f"/organizations/{quote(check_org(org), safe='')}/settings/apps/new" if org else "/settings/apps/new"
    return f"{web.rstrip('/')}{where}?{urlencode({'state': state})}"


def convert_code(api_url: str, code: str, *, deadline: float = EXCHANGE_DEADLINE) -> AppCredentials:
    """Exchange the manifest ``code`` for the new App's credentials (module docstring); ManifestError else."""
    if not CODE.fullmatch(code):
        raise ManifestError("GitHub's redirect carried no valid code (expected letters and digits)")
    http = BoundedHTTP(deadline=deadline, max_bytes=1024 * 1024, headers={
        "Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28", "User-Agent": "ampci"})
    url = f"{api_url.rstrip('/')}/app-manifests/{code}/conversions"
    try:
        answer = http.request("POST", url)
    except ExchangeError as exc:
        raise ManifestError(f"cannot reach GitHub at {api_url[:100]} to fetch the new App's credentials ({exc}); "
                            "the App may exist without ampci holding its key: delete it on GitHub and run again",
                            3) from None
    finally:
        http.close()
    try:
        data = answer.json()
    except MalformedJSONError:
        data = None
    if answer.status_code == 404:
        raise ManifestError("GitHub does not know this manifest code (a code works once, within an hour): "
                            "run the command again")
    if answer.status_code != 201:
        raise ManifestError(f"GitHub refused the manifest code: {answer.status_code} {_message(data)}",
                            2 if 400 <= answer.status_code < 500 else 3)
    if not isinstance(data, dict):
        raise ManifestError("GitHub's answer to the manifest code is not a JSON object", 3)
    return _credentials(data)


def _message(data: JsonValue) -> str:
    """GitHub's ``message`` (and its first error's) as one printable line of at most 200 characters."""
    if not isinstance(data, dict):
        return "(no message)"
    text = str(data.get("message") or "(no message)")
    errors = data.get("errors")
    if isinstance(errors, list) and errors:
        first = errors[0]
        text += ": " + str(first.get("message") or first.get("code") or first if isinstance(first, dict) else first)
    return re.sub(r"[\x00-\x1f\x7f-\x9f]+", " ", text)[:200]


def _credentials(data: JsonObject) -> AppCredentials:
    """The answer's fields, each checked (module docstring); ManifestError naming the field, never its value."""
    app_id, slug, pem, secret = data.get("id"), data.get("slug"), data.get("pem"), data.get("webhook_secret")
    if isinstance(app_id, bool) or not isinstance(app_id, int) or app_id <= 0:
        raise ManifestError("GitHub's answer has no App id", 3)
    if not isinstance(slug, str) or not _SLUG.fullmatch(slug):
        raise ManifestError("GitHub's answer has no App slug", 3)
    if not isinstance(pem, str) or not _PEM.fullmatch(pem.replace("\r\n", "\n")):
        raise ManifestError("GitHub's answer has no PEM private key", 3)
    if not isinstance(secret, str) or not SAFE_SECRET.fullmatch(secret):
        raise ManifestError("GitHub's answer has no webhook secret an .env file can hold "
                            "(16 to 512 of A-Z a-z 0-9 . _ ~ + / = -)", 3)
    owner = data.get("owner")
    login = owner.get("login") if isinstance(owner, dict) else None
    html_url = data.get("html_url")
    return AppCredentials(app_id=app_id, slug=slug, name=str(data.get("name") or slug)[:100],
                          owner=str(login or "?")[:100],
                          html_url=html_url if isinstance(html_url, str) and html_url.startswith(("https://", "http://"))
                          else f"https://github.com/apps/{slug}",
                          pem=pem.replace("\r\n", "\n").rstrip("\n") + "\n", webhook_secret=secret)
