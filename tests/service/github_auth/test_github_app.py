"""ampci as a GitHub App, against the loopback GitHub that enforces GitHub's rules
(tests/service/github/github_standin.py): RS256 JWTs checked with the App's public key and lifetime, installation
tokens minted, cached, refreshed before they expire and once on a 401, the installation from the
webhook or looked up; the report comment is only ever ampci's own."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from pytest_httpserver import HTTPServer

from service.errors import ConfigError
from service.github.client import (
    COMMENT_MARKER,
    CommitStatus,
    GitHubStatusClient,
    PermanentStatusError,
    PullRequestComment,
    RateLimitedError,
    TransientStatusError,
)
from service.github_auth.app import AppAuth, StaticToken, auth_from_settings
from service.settings import Settings
from tests.service.api.helpers import GITHUB_TOKEN, REPO, sha
from tests.service.github.github_standin import PAT_LOGIN, PR, GitHubStandIn

APP_ID = "123456"


def _pem(key: rsa.RSAPrivateKey) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _public(key: rsa.RSAPrivateKey) -> str:
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


@pytest.fixture(scope="module")
def keys() -> tuple[rsa.RSAPrivateKey, rsa.RSAPrivateKey]:
    return (rsa.generate_private_key(public_exponent=65537, key_size=2048),
            rsa.generate_private_key(public_exponent=65537, key_size=2048))


class Clock:
    def __init__(self) -> None:
        import time

        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _world(httpserver: HTTPServer, keys: Any, *, signing_key: Any = None, **standin: Any) -> tuple[Any, Any, Any]:
    clock = Clock()
    gh = GitHubStandIn(httpserver, app_id=APP_ID, public_key=_public(keys[0]), clock=clock, **standin)
    auth = AppAuth(APP_ID, _pem(signing_key or keys[0]), clock=clock)
    client = GitHubStatusClient(httpserver.url_for("/"), auth=auth, timeout=2.0, attempts=2, sleep=lambda s: None)
    return gh, client, clock


def _status(n: int = 0) -> CommitStatus:
    return CommitStatus(REPO, sha(f"app-{n}"), "pending", "queued")


def test_app_jwt_is_verified_and_tokens_are_cached(httpserver: HTTPServer, keys: Any):
    gh, client, clock = _world(httpserver, keys)
    for n in range(5):
        client.post_status(_status(n))
    assert len(gh.statuses) == 5 and {s["by"] for s in gh.statuses} == {"ampci-test[bot]"}
    assert gh.minted() == 1  # one installation token for five reports
    [lookup, mint] = gh.jwt_claims  # GET /repos/{repo}/installation, then POST .../access_tokens
    assert mint["iss"] == APP_ID and mint["iat"] == int(clock.now) - 60 and 0 < mint["exp"] - clock.now <= 600
    assert ("GET", f"/repos/{REPO}/installation") in gh.requests


def test_a_jwt_signed_with_another_key_is_refused(httpserver: HTTPServer, keys: Any):
    gh, client, _ = _world(httpserver, keys, signing_key=keys[1])
    with pytest.raises(PermanentStatusError, match="HTTP 401"):
        client.post_status(_status())
    assert gh.statuses == [] and gh.refused and gh.refused[0][1].startswith("JWT")


def test_the_webhook_installation_is_used_without_a_lookup(httpserver: HTTPServer, keys: Any):
    gh, client, _ = _world(httpserver, keys)
    client.remember_installation(REPO, 4242)
    client.post_status(_status())
    assert ("GET", f"/repos/{REPO}/installation") not in gh.requests and gh.minted() == 1


def test_tokens_are_refreshed_before_expiry_and_once_on_a_401(httpserver: HTTPServer, keys: Any):
    gh, client, clock = _world(httpserver, keys)
    client.post_status(_status(1))
    clock.now += 3600 - 200  # within the refresh margin of expires_at: minted anew before use
    client.post_status(_status(2))
    assert gh.minted() == 2 and gh.refused == []
    gh.expire_tokens()  # revoked early: 401, a fresh token, the same request once more
    client.post_status(_status(3))
    assert gh.minted() == 3 and len(gh.statuses) == 3
    assert [why for _, why in gh.refused] == ["expired installation token"]
    gh.token_lifetime = -1  # every token GitHub mints is stale: one refresh, then a permanent failure
    gh.expire_tokens()
    with pytest.raises(PermanentStatusError, match="HTTP 401"):
        client.post_status(_status(4))
    assert [why for _, why in gh.refused].count("expired installation token") == 3


def test_only_its_own_comment_is_edited_as_an_app(httpserver: HTTPServer, keys: Any):
    gh, client, _ = _world(httpserver, keys)
    gh.comments[1] = {"id": 1, "issue": PR, "user": {"login": "reviewer"},
                      "body": f"> {COMMENT_MARKER}\n> quoting the report: why is this red?"}
    ours = client.upsert_comment(PullRequestComment(REPO, PR, "report 1"))
    assert ours != 1 and gh.comments[1]["body"].startswith("> ")  # the reviewer's comment untouched
    assert client.upsert_comment(PullRequestComment(REPO, PR, "report 2")) == ours
    assert [(c["user"]["login"], c["body"]) for c in gh.pr_comments()][1:] == [
        ("ampci-test[bot]", f"{COMMENT_MARKER}\nreport 2")]
    assert ("GET", "/app") in gh.requests


def test_only_its_own_comment_is_edited_with_a_token(httpserver: HTTPServer):
    gh = GitHubStandIn(httpserver)
    client = GitHubStatusClient(httpserver.url_for("/"), GITHUB_TOKEN, timeout=2.0, attempts=1)
    gh.comments[1] = {"id": 1, "issue": PR, "user": {"login": "reviewer"}, "body": f"{COMMENT_MARKER} copied"}
    ours = client.upsert_comment(PullRequestComment(REPO, PR, "report"))
    assert ours != 1 and gh.comments[1]["body"] == f"{COMMENT_MARKER} copied"  # a maintainer token could edit it
    assert gh.comments[ours]["user"]["login"] == PAT_LOGIN
    assert client.upsert_comment(PullRequestComment(REPO, PR, "again")) == ours


def test_credentials_go_to_the_api_base_only(httpserver: HTTPServer):
    client = GitHubStatusClient(httpserver.url_for("/"), GITHUB_TOKEN, timeout=2.0, attempts=1)
    with pytest.raises(PermanentStatusError, match="refusing"):
        client._request("GET", "https://evil.example.com/repos/x/y", repo=REPO)
    httpserver.expect_request(f"/repos/{REPO}/statuses/{sha('redirect')}").respond_with_data(
        "", status=307, headers={"Location": "https://evil.example.com/steal"})
    with pytest.raises(PermanentStatusError, match="HTTP 307"):  # a redirect is never followed
        client.post_status(CommitStatus(REPO, sha("redirect"), "pending", "queued"))
    assert len(httpserver.log) == 1


def test_a_failed_identity_lookup_is_an_error_kind_of_the_comments_repository(httpserver: HTTPServer):
    """GET /user failing while the comment is written: transient for a 5xx, rate limited (the comment's
    repository) for a 429, permanent for a 401 -- never an unexpected error."""
    client = GitHubStatusClient(httpserver.url_for("/"), GITHUB_TOKEN, timeout=2.0, attempts=1)
    comment = PullRequestComment(REPO, PR, "report")
    httpserver.expect_oneshot_request("/user").respond_with_data("down", status=503)
    with pytest.raises(TransientStatusError, match="GitHub authentication: GET /user: HTTP 503") as down:
        client.upsert_comment(comment)
    assert not isinstance(down.value, RateLimitedError)
    httpserver.expect_oneshot_request("/user").respond_with_data("slow down", status=429, headers={"Retry-After": "30"})
    with pytest.raises(RateLimitedError) as limited:
        client.upsert_comment(comment)
    assert limited.value.repo == REPO and limited.value.retry_after == 30.0
    httpserver.expect_oneshot_request("/user").respond_with_data("bad credentials", status=401)
    with pytest.raises(PermanentStatusError, match="GET /user: HTTP 401"):
        client.upsert_comment(comment)
    assert [r.path for r, _ in httpserver.log] == ["/user"] * 3  # no comment read or written without the login


def test_settings_choose_the_app_and_fail_fast(keys: Any, tmp_path: Any):
    pem = _pem(keys[0])
    key_file = tmp_path / "app.pem"
    key_file.write_text(pem)
    assert isinstance(auth_from_settings(Settings(github_app_id=APP_ID, github_private_key_file=str(key_file),
                                                  github_token="t")), AppAuth)
    one_line = pem.strip().replace("\n", "\\n")  # as written in an env file
    assert isinstance(auth_from_settings(Settings(github_app_id=APP_ID, github_private_key=one_line)), AppAuth)
    assert isinstance(auth_from_settings(Settings(github_token="t")), StaticToken)
    assert auth_from_settings(Settings()) is None
    for bad in (Settings(github_app_id=APP_ID), Settings(github_private_key=pem),
                Settings(github_app_id=APP_ID, github_private_key="-----BEGIN nonsense"),
                Settings(github_app_id=APP_ID, github_private_key_file=str(tmp_path / "missing.pem"))):
        with pytest.raises(ConfigError) as err:
            auth_from_settings(bad)
        assert "PRIVATE" not in str(err.value).replace("PRIVATE_KEY", "") and pem[40:80] not in str(err.value)
    settings = Settings.from_env({"AMPCI_GITHUB_APP_ID": APP_ID, "AMPCI_GITHUB_PRIVATE_KEY": pem})
    assert settings.github_private_key == pem.strip() and pem[40:80] not in repr(settings)
    assert pem[40:80] not in repr(replace(settings))


def test_the_app_manifest_asks_for_what_ampci_uses():
    import json
    from pathlib import Path

    manifest = json.loads((Path(__file__).parents[3] / "deploy" / "github-app.json").read_text())
    assert manifest["default_permissions"] == {"checks": "write", "pull_requests": "write", "statuses": "write",
                                               "contents": "read", "metadata": "read"}
    assert set(manifest["default_events"]) == {"push", "pull_request", "check_run", "check_suite", "issue_comment",
                                                "installation"}
    assert manifest["hook_attributes"]["url"].endswith("/webhooks/github") and manifest["public"] is False


@pytest.mark.postgres
@pytest.mark.redis
def test_the_webhooks_installation_is_kept_with_the_run(make_client: Any, store: Any):
    from tests.service.api.helpers import encode, push_payload, run_of, webhook_headers

    client = make_client()
    body = encode(push_payload(sha("app-push"), installation={"id": 4242, "node_id": "x"}))
    run = store.get_run(run_of(client, client.post("/webhooks/github", content=body,
                                                   headers=webhook_headers(body, "push"))))
    assert run.meta["github"]["installation"] == 4242


@pytest.mark.parametrize("app_id", [APP_ID, ""])
def test_the_jwt_may_be_issued_by_the_apps_client_id(httpserver: HTTPServer, app_id: str):
    """GitHub recommends the client ID as the JWT's ``iss`` and accepts the numeric id as well: with
    AMPCI_GITHUB_CLIENT_ID set, the JWTs name it (with or without the numeric id), and the App reports."""
    from tests.service.github.github_standin import app_key, app_standin

    client_id = "Iv23liTestClient0001"
    gh = app_standin(httpserver, client_id=client_id)
    gh.app_id = "999"  # a stand-in that would refuse the numeric id: only the client ID can pass
    settings = Settings(github_app_id=app_id, github_client_id=client_id, github_private_key=app_key()[0],
                        github_api_url=httpserver.url_for("/"))
    auth = auth_from_settings(settings)
    assert isinstance(auth, AppAuth)
    client = GitHubStatusClient(settings.github_api_url, auth=auth, timeout=2.0, attempts=1)
    client.post_status(CommitStatus(REPO, sha("client-id"), "pending", "queued"))
    client.close()
    assert len(gh.statuses) == 1 and gh.jwt_claims and {c["iss"] for c in gh.jwt_claims} == {client_id}
    for bad in ("", "not a client id!", "x" * 200):
        with pytest.raises(ConfigError):
            AppAuth("", app_key()[0], client_id=bad)
