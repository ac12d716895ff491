"""Where a job's pass repository comes from when a webhook delivery names it: clone URLs and git credentials.

In served mode with ``AMPCI_PASS_REPO`` unset, the pass repository of a webhook run is the repository that
sent the webhook: its clone URL travels with the run (``runs.meta["pass_repo"]``) and the worker clones and
fetches it (:class:`workers.revision.revisions.RevisionCache`).  This module decides which URLs may be cloned and how
a credential reaches git.

Guarantees:

* :func:`check_clone_url` admits only ``https://host[:port]/owner/name[.git]`` (no user info, query, fragment,
  whitespace or control characters; the path names the delivery's repository when one is given) and, only
  when explicitly allowed (tests, a local mirror), ``file:///absolute/path``; everything else -- ``ext::``,
  ``ssh``, ``git://``, plain ``http``, a leading ``-`` (``--upload-pack=...``), relative paths -- is refused
  with a :class:`CloneUrlError` whose message never repeats more than 100 characters of the URL.
* :class:`GitCredential` hands a token to git only through the environment of the git call
  (``GIT_CONFIG_COUNT``/``GIT_CONFIG_KEY_n``/``GIT_CONFIG_VALUE_n``: an ``http.<origin>/.extraHeader`` scoped to
  the one https origin it was made for, redirects off): never in a URL, an argument, a stored error or a log
  line; :meth:`GitCredential.scrub` removes it (and its header form) from any text a git call returns.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

MAX_URL = 500
_REPO_PATH = re.compile(r"/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+?)(?:\.git)?/?")
_HOST = re.compile(r"[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]")
_UNSAFE = re.compile(r"[\x00-\x20\x7f\\]")


class CloneUrlError(ValueError):
    """A clone URL that may not be cloned (the message says why, quoting at most 100 characters of it)."""


def check_clone_url(url: object, *, allow_file: bool = False, repo: str | None = None) -> str:
    """``url`` when a worker may clone it (see the module docstring), else :class:`CloneUrlError`.

    ``repo`` (``owner/name``, compared case-insensitively) is the repository the delivery named: an https
    URL must point at it.  ``allow_file`` admits ``file:///absolute/path`` (``AMPCI_PASS_REPO_ALLOW_FILE``).
    """
    if not isinstance(url, str) or not url:
        raise CloneUrlError("clone URL missing or not a string")
    shown = repr(url[:100])
    if len(url) > MAX_URL:
        raise CloneUrlError(f"clone URL longer than {MAX_URL} characters: {shown}")
    if "::" in url.split("/", 1)[0]:
        raise CloneUrlError(f"clone URL with a git transport helper (ext::, fd::...): {shown}")
    if url.startswith("-") or _UNSAFE.search(url):
        raise CloneUrlError(f"clone URL with an option, whitespace or control character: {shown}")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise CloneUrlError(f"not a URL: {shown}") from None
    scheme = parts.scheme.lower()
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise CloneUrlError(f"clone URL with a query or fragment: {shown}")
    if "%" in url or "/../" in parts.path + "/" or "/./" in parts.path + "/":
        raise CloneUrlError(f"clone URL with an escaped or relative path: {shown}")
    if scheme == "file":
        if not allow_file:
            raise CloneUrlError(f"file:// clone URLs are not allowed (AMPCI_PASS_REPO_ALLOW_FILE): {shown}")
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/") or parts.path == "/":
            raise CloneUrlError(f"file:// clone URL without an absolute path: {shown}")
        return url
    if scheme != "https":
        raise CloneUrlError(f"clone URL scheme {parts.scheme[:20]!r} is not https: {shown}")
    if "@" in parts.netloc or not parts.hostname or not _HOST.fullmatch(parts.hostname) or port == 0:
        raise CloneUrlError(f"clone URL with user info or without a valid host: {shown}")
    match = _REPO_PATH.fullmatch(parts.path)
    if match is None:
        raise CloneUrlError(f"clone URL path is not /owner/name[.git]: {shown}")
    if repo is not None and f"{match.group(1)}/{match.group(2)}".lower() != repo.lower():
        raise CloneUrlError(f"clone URL {shown} does not name the delivery's repository {repo[:100]}")
    return url


def origin(url: str) -> str:
    """``scheme://host[:port]/`` of an https URL (the scope of a credential made for it)."""
    parts = urlsplit(url)
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}/"


@dataclass(frozen=True)
class GitCredential:
    """A token git sends, as HTTP basic auth (``x-access-token:<token>``, what GitHub expects of an App
    installation token), to ``scope`` (``https://host[:port]/``) alone.  Its token is left out of ``repr``."""

    scope: str
    token: str = field(repr=False)

    @classmethod
    def for_url(cls, url: str, token: str) -> GitCredential | None:
        """The credential of ``token`` scoped to ``url``'s origin; None for no token or a URL that is not https
        (a credential never travels over another transport)."""
        if not token or urlsplit(url).scheme.lower() != "https":
            return None
        return cls(origin(url), token)

    def header(self) -> str:
        """The ``Authorization`` header line git adds to each request to :attr:`scope`."""
        basic = base64.b64encode(f"x-access-token:{self.token}".encode()).decode()
        return f"Authorization: Basic {basic}"

    def env(self) -> dict[str, str]:
        """Environment variables that give one git call the header (scoped to :attr:`scope`) and turn
        redirects off, so the header follows no redirect to another host."""
        pairs = [(f"http.{self.scope}.extraHeader", self.header()), ("http.followRedirects", "false")]
        env = {"GIT_CONFIG_COUNT": str(len(pairs))}
        for i, (key, value) in enumerate(pairs):
            env[f"GIT_CONFIG_KEY_{i}"] = key
            env[f"GIT_CONFIG_VALUE_{i}"] = value
        return env

    def scrub(self, text: str) -> str:
        """``text`` with the token and its header form replaced by ``***``."""
        basic = self.header().rsplit(" ", 1)[-1]
        return text.replace(self.token, "***").replace(basic, "***")
