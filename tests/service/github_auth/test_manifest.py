"""service/github_auth/manifest.py against the loopback stand-in of GitHub's manifest endpoints
(tests/service/github_auth/manifest_standin.py): the manifest ampci posts, where it posts it, and the one-time
exchange of the code for the App's credentials -- each refusal one line without a secret."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import pytest

from service.errors import ConfigError
from service.github_auth.manifest import (
    TEMPLATE,
    ManifestError,
    build_manifest,
    convert_code,
    load_template,
    registration_url,
    web_url,
)
from tests.service.github_auth.manifest_standin import OWNER, ManifestStandIn

RECEIVER = "http://127.0.0.1:4567/callback"


@pytest.fixture
def github() -> Iterator[ManifestStandIn]:
    standin = ManifestStandIn()
    yield standin
    standin.close()


def _manifest() -> dict:
    return build_manifest(load_template(), public_url="https://ci.example.com/", receiver_url=RECEIVER, name="ampci-x")


def test_the_manifest_points_github_at_the_deployment_and_back_at_the_receiver() -> None:
    shipped = json.loads(TEMPLATE.read_text())
    manifest = _manifest()
    assert manifest["url"] == "https://ci.example.com"
    assert manifest["hook_attributes"] == {"url": "https://ci.example.com/webhooks/github", "active": True}
    assert manifest["redirect_url"] == RECEIVER  # the flow's receiver, never the site root
    assert manifest["name"] == "ampci-x"
    for key in ("default_permissions", "default_events", "public"):  # one source: the shipped template
        assert manifest[key] == shipped[key]
    assert "redirect_url" not in shipped, "the shipped template names a redirect_url (it was the site root)"
    for bad in ("ftp://x", "https://user:pw@h", "https://h/?q=1", "https://h/#f", "not a url", "https://h/a b"):
        with pytest.raises(ConfigError):
            build_manifest(load_template(), public_url=bad, receiver_url=RECEIVER)


def test_the_registration_page_of_a_user_or_an_organization() -> None:
    assert web_url("https://api.github.com") == "https://github.com"
    assert web_url("https://ghe.example.com/api/v3/") == "https://ghe.example.com"
    user = urlsplit(registration_url("https://github.com", "s t&x"))
    assert user.path == "/settings/apps/new" and parse_qs(user.query) == {"state": ["s t&x"]}
    org = urlsplit(registration_url("https://github.com", "abc", "acme-labs"))
    assert org.path == "/organizations/acme-labs/settings/apps/new" and parse_qs(org.query) == {"state": ["abc"]}
    for bad in ("-acme", "a/b", "a" * 40, "../x", ""):
        with pytest.raises(ConfigError):
            registration_url("https://github.com", "abc", bad or " ")


def test_a_code_is_exchanged_once_for_the_apps_credentials(github: ManifestStandIn) -> None:
    code = github.register(_manifest())
    creds = convert_code(github.url, code)
    app = github.apps[0]
    assert (creds.app_id, creds.slug, creds.owner) == (app.id, "ampci-x", OWNER)
    assert creds.pem == app.pem and creds.webhook_secret == app.webhook_secret
    assert creds.install_url == "https://github.com/apps/ampci-x/installations/new"
    assert app.pem not in repr(creds) and app.webhook_secret not in repr(creds)
    assert github.requests == [("POST", f"/app-manifests/{code}/conversions", False)]  # no credential sent
    with pytest.raises(ManifestError, match="does not know this manifest code") as used:
        convert_code(github.url, code)
    assert used.value.exit_code == 2 and code not in str(used.value)


def test_refusals_are_one_line_without_secrets(github: ManifestStandIn) -> None:
    code = github.register(_manifest(), refuse=True)
    with pytest.raises(ManifestError) as refused:
        convert_code(github.url, code)
    assert refused.value.exit_code == 2
    assert str(refused.value) == "GitHub refused the manifest code: 422 Validation Failed: Name is already in use"
    with pytest.raises(ManifestError, match="no valid code"):  # not sent: a code that is no plain token
        convert_code(github.url, "../../app/installations")
    assert len(github.requests) == 1


def test_an_unreachable_github_is_one_line_exit_3() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(ManifestError, match="cannot reach GitHub") as failed:
        convert_code(f"http://127.0.0.1:{port}", "abc123")
    assert failed.value.exit_code == 3 and "\n" not in str(failed.value) and "abc123" not in str(failed.value)


@pytest.mark.parametrize("field,value", [("id", 0), ("id", "7"), ("slug", None), ("pem", "not a key"),
                                         ("webhook_secret", "has $dollar and spaces"), ("webhook_secret", None)])
def test_an_answer_without_usable_credentials_is_refused(github: ManifestStandIn, monkeypatch: pytest.MonkeyPatch,
                                                         field: str, value: object) -> None:
    convert = github._convert

    def broken(code: str) -> tuple[int, dict]:
        status, body = convert(code)
        return status, {**body, field: value}

    monkeypatch.setattr(github, "_convert", broken)
    code = github.register(_manifest())
    with pytest.raises(ManifestError, match=f"no {'App ' if field in ('id', 'slug') else ''}") as bad:
        convert_code(github.url, code)
    assert bad.value.exit_code == 3 and github.apps[0].pem not in str(bad.value)
