"""The pass repository of a webhook run is the repository that sent the webhook (``AMPCI_PASS_REPO`` unset).

From the delivery to the job: the clone URL is checked when the delivery is parsed (refused: the delivery is
rejected with the reason), kept with the stored request, written into the run's meta and its baseline runs'
(never a credential), handed to the job with the installation token minted from a loopback GitHub that
enforces App JWTs, and a commit pushed after this checkout -- in a bare repository served as ``file://`` --
runs to a ``pass`` result through the Celery task's plain function on PostgreSQL.
"""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from pytest_httpserver import HTTPServer

from service.api.dispatch import RunDispatcher
from service.github.events import PayloadError, RunRequest, parse_event
from service.orchestration import scheduler, tasks
from service.orchestration.jobs import PASS_REPO, cell_options, job_worker_config
from service.settings import Settings
from tests.conftest import test_cache_dir
from tests.service.api.helpers import REPO, encode, pr_payload, push_payload, sha
from tests.service.github.github_standin import GitHubStandIn

URL = f"https://github.com/{REPO}.git"
HEAD, BASE = sha("pr-head"), sha("pr-base")


def _settings(pg_url: str, **kw: Any) -> Settings:
    base: dict[str, Any] = dict(database_url=pg_url, allowed_repos=REPO, tracked_branches="main",
                                github_api_url="http://127.0.0.1:9", baseline_runs=True, confirm_pairs=0)
    return Settings(**{**base, **kw})


def _push(url: Any, **extra: Any) -> bytes:
    payload = push_payload(HEAD, before=BASE, installation={"id": 4242})
    payload["repository"]["clone_url"] = url
    return encode({**payload, **extra})


def test_the_delivery_clone_url_becomes_the_runs_pass_repository(pg_url: str) -> None:
    from service.db import Store

    settings = _settings(pg_url)
    request = parse_event("push", _push(URL), settings)
    assert isinstance(request, RunRequest) and request.clone_url == URL and request.installation == 4242
    assert RunRequest.from_payload(request.to_payload()).clone_url == URL  # kept with the pending delivery
    pr = pr_payload(HEAD, BASE)
    pr["repository"]["clone_url"] = URL
    assert parse_event("pull_request", encode(pr), settings).clone_url == URL  # type: ignore[union-attr]
    labeled = pr_payload(HEAD, BASE, action="labeled", label="ampci:run")
    labeled["repository"]["clone_url"] = URL
    approval = parse_event("pull_request", encode(labeled), settings)  # starts the head's run when it has none
    assert RunRequest.from_payload(approval.request).clone_url == URL  # type: ignore[union-attr]

    store = Store.from_url(pg_url)
    store.upgrade()
    try:
        plan = [c for c in scheduler.load_sweep(sweep="smoke").expand(scheduler.zoo_catalog())][:2]
        sent: list[str] = []
        dispatcher = RunDispatcher(settings, store, planner=lambda _: plan,
                                   dispatch=lambda s, rev, jobs: sent.append(rev), mode="broker")
        sub = dispatcher.submit(request, request.dedup_key or "k")
        run = store.get_run(sub.run_id)
        assert run.meta[PASS_REPO] == {"url": URL, "repo": REPO, "installation": 4242}
        assert all("token" not in str(v).lower() for v in run.meta[PASS_REPO].values())
        baseline_runs = [r for r in store.list_runs(limit=10) if r.id != run.id]
        assert baseline_runs and all(r.revision_sha == BASE for r in baseline_runs)
        assert all(store.get_run(r.id).meta[PASS_REPO]["url"] == URL for r in baseline_runs)  # the same repository
        assert sent == [BASE, HEAD]
        job = store.jobs(run.id)[0]
        assert cell_options(run, job.cell)[PASS_REPO]["url"] == URL
        config = job_worker_config(settings, cell_options(run, job.cell)[PASS_REPO])
        assert config.pass_repo_url == URL and config.pass_repo_token == ""  # no identity configured here
        # AMPCI_PASS_REPO set: the configured repository wins, nothing of the delivery is used
        pinned = replace(settings, pass_repo="/srv/mirror.git")
        assert job_worker_config(pinned, run.meta[PASS_REPO]).pass_repo_url == ""
        assert parse_event("push", _push(URL), pinned).clone_url is None  # type: ignore[union-attr]
        assert parse_event("push", _push("ext::sh -c id"), pinned).clone_url is None  # type: ignore[union-attr]
    finally:
        store.dispose()


@pytest.mark.parametrize(("url", "why"), [
    ("ext::sh -c touch% /tmp/pwned", "transport helper"),
    ("--upload-pack=touch /tmp/pwned", "option"),
    ("https://github.com/someone-else/amp-pass.git", "does not name"),
    ("https://token@github.com/acme/amp-pass.git", "user info"),
    ("file:///srv/pass.git", "not allowed"),
    (17, "not a string"),
])
def test_a_clone_url_that_may_not_be_cloned_rejects_the_delivery(url: Any, why: str) -> None:
    with pytest.raises(PayloadError, match=f"repository.clone_url: .*{why}"):
        parse_event("push", _push(url), Settings(allowed_repos=REPO, tracked_branches="main"))


def test_file_urls_pass_only_with_pass_repo_allow_file() -> None:
    settings = Settings(allowed_repos=REPO, tracked_branches="main", pass_repo_allow_file=True)
    assert parse_event("push", _push("file:///srv/pass.git"), settings).clone_url == "file:///srv/pass.git"  # type: ignore[union-attr]
    assert Settings.from_env({"AMPCI_PASS_REPO_ALLOW_FILE": "true"}).worker_config().pass_repo_allow_file


def _pem(key: rsa.RSAPrivateKey) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def test_the_job_gets_an_installation_token_for_its_repository_host_only(httpserver: HTTPServer,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    gh = GitHubStandIn(httpserver, app_id="777", public_key=public)
    settings = Settings(github_app_id="777", github_private_key=_pem(key), github_api_url=httpserver.url_for("/"))
    # the stand-in is GitHub on the loopback: its clone host is the API's own host
    mine = f"https://{httpserver.host}/{REPO}.git"
    config = job_worker_config(settings, {"url": mine, "repo": REPO, "installation": 4242})
    assert config.pass_repo_token and config.pass_repo_token in gh.tokens and gh.minted() == 1
    assert config.pass_repo_token not in repr(config)
    # another host, or a transport that is not https: no token is made for it
    for url in (URL, "file:///srv/pass.git", f"https://evil.example/{REPO}.git"):
        assert job_worker_config(settings, {"url": url, "repo": REPO, "installation": 4242}).pass_repo_token == ""
    assert gh.minted() == 1
    # GitHub refuses (an uninstalled App): no token, one line without any secret
    gh.installations.clear()
    caplog.clear()
    lone = Settings(github_app_id="777", github_private_key=_pem(key), github_api_url=httpserver.url_for("/"),
                    cache_dir=Path("/nonexistent"))
    assert job_worker_config(lone, {"url": mine, "repo": REPO}).pass_repo_token == ""
    assert "no installation token" in caplog.text and "BEGIN" not in caplog.text


def _git(*args: str, cwd: Path | None = None) -> str:
    import os

    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def test_a_commit_pushed_after_this_checkout_runs_from_the_delivery_repository(pg_url: str, tmp_path: Path) -> None:
    """A bare repository (this checkout plus a new commit) as the 'remote': its webhook's job checks the new commit
    out from there and passes, where the default pass repository gives ``bad_spec``."""
    root = Path(__file__).resolve().parents[3]
    work = tmp_path / "work"
    _git("clone", "-q", "--no-hardlinks", str(root), str(work))
    (work / "PUSHED.md").write_text("a commit made after the image was built\n")
    _git("add", "PUSHED.md", cwd=work)
    _git("commit", "-q", "-m", "pushed later", cwd=work)
    new = _git("rev-parse", "HEAD", cwd=work)
    bare = tmp_path / "pass.git"
    _git("clone", "-q", "--bare", str(work), str(bare))
    settings = replace(_settings(pg_url, pass_repo_allow_file=True), cache_dir=test_cache_dir(), latency_runs=2,
                       latency_warmup=1, convert_repeats=1, max_attempts=2)
    store = scheduler.open_store(settings)
    try:
        cell = ("conv_net", "fp16", "default", "cpu")
        meta = {"options": {"|".join(cell): {}}, PASS_REPO: {"url": f"file://{bare}", "repo": REPO}}
        run_id = store.create_run(new, "push", None, "smoke", [cell], None, meta)
        (job,) = store.jobs(run_id)
        assert tasks.execute_job(job.id, settings, "w", store=store) == "done"
        (result,) = store.results(run_id=run_id)
        assert result.status == "pass", result.message
        # without the delivery's repository: the commit is unknown to this checkout, as before
        other = store.create_run(new, "push", None, "smoke", [cell], None, {"options": {"|".join(cell): {}}})
        (job,) = store.jobs(other)
        tasks.execute_job(job.id, settings, "w", store=store)
        (result,) = store.results(run_id=other)
        assert result.status == "bad_spec" and "is not in the pass repository" in (result.message or "")
    finally:
        store.dispose()
