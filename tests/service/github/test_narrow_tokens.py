"""Tokens are as narrow as their job (issue 41, point 3), against the loopback GitHub that mints an
installation token for the ``repositories`` and ``permissions`` asked and refuses it (403) outside them: the
clone token a worker gets reads its one repository and can write nothing; the reporter's token holds the
write permissions of the reports it sends, for the repository it reports to."""

from __future__ import annotations

import pytest
from pytest_httpserver import HTTPServer

from service.github.client import (
    REPORT_PERMISSIONS,
    CheckRun,
    CommitStatus,
    GitHubStatusClient,
    PermanentStatusError,
    report_permissions,
)
from service.github.reporter import StatusReporter
from service.github_auth.app import CLONE_PERMISSIONS, AppAuth
from service.orchestration.jobs import job_worker_config
from service.settings import Settings
from tests.service.api.helpers import REPO, sha
from tests.service.github.github_standin import APP_ID, app_key, app_standin

OTHER = "acme/other"


def _settings(server: HTTPServer, **kw: object) -> Settings:
    return Settings(github_app_id=APP_ID, github_private_key=app_key()[0], github_api_url=server.url_for("/"),
                    **kw)  # type: ignore[arg-type]


def test_the_clone_token_reads_one_repository_and_writes_nothing(httpserver: HTTPServer):
    gh = app_standin(httpserver, repos=(REPO, OTHER))
    gh.installations[OTHER.lower()] = gh.installations[REPO.lower()]  # one installation, two repositories
    settings = _settings(httpserver)
    url = f"https://{httpserver.host}/{REPO}.git"
    token = job_worker_config(settings, {"url": url, "repo": REPO, "installation": 4242}).pass_repo_token
    assert token and gh.mints == [{"installation": 4242, "repositories": ["amp-pass"],
                                   "permissions": dict(CLONE_PERMISSIONS)}]
    clone = GitHubStatusClient(httpserver.url_for("/"), token, timeout=2.0, attempts=1)  # the worker's token
    with pytest.raises(PermanentStatusError) as refused:
        clone.post_status(CommitStatus(REPO, sha("clone-token"), "success", "forged"))
    assert refused.value.status == 403 and gh.statuses == []
    with pytest.raises(PermanentStatusError):
        clone.upsert_check_run(CheckRun(OTHER, sha("clone-token"), "ampci smoke", "success", "forged", "forged"))
    assert [why for _, why in gh.narrowed] == ["status needs write on one of statuses",
                                               "token not minted for acme/other"]  # not even listed
    # cached per (installation, repository, permissions): a second job of the repository mints nothing
    assert job_worker_config(settings, {"url": url, "repo": REPO, "installation": 4242}).pass_repo_token == token


@pytest.mark.parametrize("reports", [frozenset({"status"}), frozenset({"status", "comment", "check"})])
def test_the_reporters_token_holds_what_its_reports_write(httpserver: HTTPServer, reports: frozenset[str]):
    gh = app_standin(httpserver, repos=(REPO, OTHER))
    reporter = StatusReporter.from_settings(_settings(httpserver, github_report=",".join(sorted(reports))))
    assert reporter.client is not None
    try:
        reporter.queued(5, REPO, sha("narrow-report"))
        reporter.queued(6, OTHER, sha("narrow-report"))
        reporter.drain()
        assert [s["repo"] for s in gh.statuses] == [REPO.lower(), OTHER.lower()] and gh.narrowed == []
        wanted = report_permissions(reports)
        # what its reports write, and metadata: read to ask who may approve (service/github/permissions.py)
        assert wanted == {**dict(REPORT_PERMISSIONS[r] for r in reports), "metadata": "read"}
        assert sorted(m["repositories"][0] for m in gh.mints) == ["amp-pass", "other"]
        assert all(m["permissions"] == wanted for m in gh.mints)
        assert reporter.client.permissions == wanted
    finally:
        reporter.close()


def test_a_token_is_cached_per_repository_and_permissions(httpserver: HTTPServer):
    gh = app_standin(httpserver, repos=(REPO, OTHER))
    gh.installations[OTHER.lower()] = gh.installations[REPO.lower()]
    auth = AppAuth(APP_ID, app_key()[0])
    client = GitHubStatusClient(httpserver.url_for("/"), auth=auth, timeout=2.0)
    call = client._auth_call
    read = auth.token(REPO, call, {"contents": "read"})
    write = auth.token(REPO, call, {"statuses": "write"})
    other = auth.token(OTHER, call, {"contents": "read"})
    assert len({read, write, other}) == 3 and auth.token(REPO, call, {"contents": "read"}) == read
    assert gh.minted() == 3
    # GitHub refuses a permission the installation was not granted: no token (the caller logs it)
    del gh.granted["checks"]
    with pytest.raises(Exception, match="422"):
        auth.token(REPO, call, {"checks": "write"})
    client.close()
