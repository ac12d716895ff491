"""``POST /api/runs`` with ``repository``: a manual run of the repository a webhook delivery named (``AMPCI_PASS_REPO``
unset), as a webhook run of it would test -- its clone URL in ``meta.pass_repo``, branch and tag names resolved in
that repository -- and a one-line 4xx for everything it cannot be.

The repository is a bare one reachable only by its ``file://`` clone URL (``AMPCI_PASS_REPO_ALLOW_FILE``), with
commits this checkout does not have; the webhook, the API, PostgreSQL and Redis are real.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from service.orchestration.jobs import cell_options, job_worker_config
from service.orchestration.pass_repo import PASS_REPO
from tests.service.api.helpers import API_TOKEN, REPO, encode, push_payload, run_of, webhook_headers

pytestmark = [pytest.mark.postgres, pytest.mark.redis]
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()


def _remote(root: Path) -> tuple[Path, list[str]]:
    """A bare repository with three commits on main (the second tagged v1); its path and the shas."""
    work = root / "work"
    (work / "amp_pass").mkdir(parents=True)
    _git(work, "init", "-q", "-b", "main")
    shas = []
    for i in range(3):
        (work / "amp_pass" / "__init__.py").write_text(f"COMMIT = {i}\n")
        _git(work, "add", "-A")
        _git(work, "commit", "-q", "-m", f"commit {i}")
        shas.append(_git(work, "rev-parse", "HEAD"))
        if i == 1:
            _git(work, "tag", "v1")
    bare = root / "pass.git"
    _git(root, "clone", "-q", "--bare", str(work), str(bare))
    return bare, shas


def test_a_manual_run_tests_the_repository_a_delivery_named(make_client: Any, make_settings: Any, store: Any,
                                                            tmp_path: Path) -> None:
    bare, shas = _remote(tmp_path)
    url = f"file://{bare}"
    settings = make_settings(pass_repo_allow_file=True, cache_dir=tmp_path / "cache",
                             allowed_repos=f"{REPO},acme/not-yet")
    client = make_client(settings)
    body = {"revision": "main", "repository": REPO}
    unknown = client.post("/api/runs", json=body, headers=AUTH)  # no delivery has named it yet
    assert unknown.status_code == 400 and "no webhook delivery has named its clone URL" in unknown.json()["message"]

    push = push_payload(shas[2], before=shas[1], installation={"id": 4242})
    push["repository"]["clone_url"] = url
    delivered = encode(push)
    webhook_run = store.get_run(run_of(client, client.post("/webhooks/github", content=delivered,
                                                           headers=webhook_headers(delivered, "push"))))
    assert webhook_run.meta[PASS_REPO] == {"url": url, "repo": REPO, "installation": 4242}

    made = client.post("/api/runs", json={**body, "repository": REPO.upper(), "baseline": "v1"}, headers=AUTH)
    assert made.status_code == 202, made.text
    run = store.get_run(made.json()["run_id"])
    # resolved in that repository (this checkout has none of these commits), tested from its clone URL
    assert (run.revision_sha, run.baseline_sha, run.trigger) == (shas[2], shas[1], "manual")
    assert run.meta[PASS_REPO] == webhook_run.meta[PASS_REPO] and "github" not in run.meta
    job = store.jobs(run.id)[0]
    assert job_worker_config(settings, cell_options(run, job.cell)[PASS_REPO]).pass_repo_url == url
    short = client.post("/api/runs", json={"revision": shas[0][:10], "repository": REPO}, headers=AUTH)
    assert short.status_code == 202 and store.get_run(short.json()["run_id"]).revision_sha == shas[0]

    def refused(app_settings: Any, request: dict[str, str]) -> tuple[int, str]:
        got = make_client(app_settings).post("/api/runs", json=request, headers=AUTH)
        message = got.json()["message"]
        assert "\n" not in message
        return got.status_code, message

    runs = len(store.list_runs())
    status, message = refused(settings, {"revision": "no-such-branch", "repository": REPO})
    assert status == 400 and "no-such-branch" in message
    status, message = refused(settings, {"revision": "main", "repository": "evil/fork"})
    assert status == 403 and "evil/fork" in message and "AMPCI_ALLOWED_REPOS" in message
    status, message = refused(settings, {"revision": "main", "repository": "acme/not-yet"})
    assert status == 400 and "acme/not-yet" in message
    # a URL the workers may no longer clone (file:// without AMPCI_PASS_REPO_ALLOW_FILE)
    status, message = refused(make_settings(cache_dir=tmp_path / "cache"), {"revision": "main", "repository": REPO})
    assert status == 400 and "may not be cloned" in message
    # AMPCI_PASS_REPO set: every run tests it; a repository field is refused rather than silently ignored
    pinned = make_settings(pass_repo=str(bare), cache_dir=tmp_path / "cache")
    status, message = refused(pinned, {"revision": shas[2], "repository": REPO})
    assert status == 400 and "AMPCI_PASS_REPO" in message and str(bare) not in message
    for bad in ("no-slash", "a/b/c", "a b/c", "a/" + "b" * 101):
        assert client.post("/api/runs", json={"revision": "main", "repository": bad}, headers=AUTH).status_code == 422
    assert len(store.list_runs()) == runs  # nothing refused was stored
