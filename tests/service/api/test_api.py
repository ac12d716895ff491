"""The JSON API: read endpoints, bearer-token write endpoints, health, error shapes."""

from __future__ import annotations

from typing import Any

import pytest

from service.orchestration.judge import detect_run
from tests.service.api.helpers import API_TOKEN, encode, push_payload, run_of, sha, webhook_headers
from workers.result import AccuracyReport, JobResult, OutputMetrics

pytestmark = [pytest.mark.postgres, pytest.mark.redis]
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}


def _result(cell: tuple[str, str, str, str], status: str, cosine: float) -> JobResult:
    worst = OutputMetrics(max_abs=1e-3, cosine=cosine)
    return JobResult(model=cell[0], dtype=cell[1], policy=cell[2], target=cell[3], status=status,
                     accuracy=AccuracyReport(mode="emulation", provider="CPUExecutionProvider", worst=worst,
                                             passed=status == "pass"))


def _two_runs_with_a_regression(store: Any, client: Any) -> tuple[int, int]:
    """A baseline push run (all pass) and a child push run (one cell fails conversion), via the webhook."""
    base, head = sha("api-base"), sha("api-head")
    ids = []
    for after, before in ((base, sha("api-root")), (head, base)):
        body = encode(push_payload(after, before=before))
        resp = client.post("/webhooks/github", content=body, headers=webhook_headers(body, "push"))
        run_id = run_of(client, resp)
        for job in store.jobs(run_id):
            failing = after == head and job.cell[0] == "mlp_small" and job.cell[1] == "bf16"
            store.write_result(run_id, _result(job.cell, "convert_error" if failing else "pass", 0.9999),
                               job_id=job.id)
        store.finish_run(run_id)
        detect_run(store, run_id)
        ids.append(run_id)
    return ids[0], ids[1]


def test_read_endpoints(make_client, store, queue):
    client = make_client()
    base_run, head_run = _two_runs_with_a_regression(store, client)

    runs = client.get("/api/runs").json()["runs"]
    assert [r["id"] for r in runs] == [head_run, base_run]
    assert client.get("/api/runs", params={"trigger": "nightly"}).json() == {"runs": []}
    assert [r["id"] for r in client.get("/api/runs", params={"revision": sha("api-head")[:10]}).json()["runs"]] \
        == [head_run]

    detail = client.get(f"/api/runs/{head_run}").json()
    assert detail["run"]["id"] == head_run and detail["url"] == f"https://ci.example.com/runs/{head_run}"
    assert len(detail["cells"]) == 4
    assert all(c["result"] is not None and c["job"]["status"] == "done" for c in detail["cells"])
    assert detail["summary"]["line"].startswith("4 cells: 3 pass, 1 convert_error")

    results = client.get("/api/results", params={"run_id": head_run, "status": "convert_error"}).json()["results"]
    assert [(r["model"], r["dtype"]) for r in results] == [("mlp_small", "bf16")]
    full = client.get(f"/api/results/{results[0]['id']}").json()
    assert full["status"] == "convert_error" and full["target"] == queue

    regs = client.get("/api/regressions", params={"state": "open", "category": "regression"}).json()["regressions"]
    assert [(r["run_id"], r["model"], r["kind"]) for r in regs] == [(head_run, "mlp_small", "conversion")]
    assert client.get(f"/api/regressions/{regs[0]['id']}").json()["id"] == regs[0]["id"]

    hist = client.get("/api/history", params={"model": "conv_small", "dtype": "fp16", "metric": "cosine"}).json()
    assert [p["run_id"] for p in hist["points"]] == [base_run, head_run]
    assert all(p["value"] == pytest.approx(0.9999) for p in hist["points"])

    assert client.get(f"/runs/{head_run}", follow_redirects=False).headers["location"] == f"/api/runs/{head_run}"


def test_not_found_and_invalid_input_are_json(make_client):
    client = make_client()
    for path, code in (("/api/runs/999", 404), ("/api/results/5", 404), ("/api/regressions/3", 404),
                       ("/api/deliveries/nope", 404), ("/api/runs/0", 422), ("/api/runs/abc", 422),
                       ("/api/runs/99999999999999999999", 422), ("/api/runs?limit=-1", 422),
                       ("/api/runs?trigger=cron", 422), ("/api/history?model=x", 422),
                       ("/api/history?model=unknown&dtype=fp16", 404),
                       ("/api/history?model=a&dtype=fp16&metric=bogus", 422),
                       ("/api/results?revision=zz", 422), ("/api/results?model=%00", 422),
                       ("/api/regressions?since=yesterday", 422), ("/api/regressions?since=2026-01-01T00:00", 422),
                       ("/nope", 404)):
        resp = client.get(path)
        assert resp.status_code == code, (path, resp.text)
        assert resp.headers["content-type"] == "application/json" and resp.json()["error"], path
    assert client.delete("/api/runs").status_code == 401  # the token is checked before anything else
    assert client.delete("/api/runs", headers={"Authorization": f"Bearer {API_TOKEN}"}).status_code == 405


def test_write_endpoints_need_the_bearer_token(make_client, make_settings, store):
    client = make_client()
    _, head_run = _two_runs_with_a_regression(store, client)
    [reg] = store.regressions(run_id=head_run, category="regression")
    url = f"/api/regressions/{reg.id}/ack"
    assert client.post(url).status_code == 401
    assert client.post(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.post(url, headers={"Authorization": f"Basic {API_TOKEN}"}).status_code == 401
    assert client.post(url, headers={"Authorization": "Bearer wrong"}).headers["www-authenticate"].startswith("Bearer")
    assert store.get_regression(reg.id).state == "open"

    acked = client.post(url, headers=AUTH, json={"by": "alice", "note": "known, fix in #12"})
    assert acked.status_code == 200 and acked.json()["state"] == "acknowledged" and acked.json()["state_by"] == "alice"
    fp = client.post(f"/api/regressions/{reg.id}/false-positive", headers=AUTH)
    assert fp.status_code == 200 and store.get_regression(reg.id).state == "false_positive"
    assert client.post("/api/regressions/999999/ack", headers=AUTH).status_code == 404
    assert client.post(url, headers=AUTH, json={"by": "x", "extra": 1}).status_code == 422

    disabled = make_client(make_settings(api_token=""))
    resp = disabled.post(url, headers=AUTH)
    assert resp.status_code == 403 and "AMPCI_API_TOKEN" in resp.json()["message"]


def test_manual_run_trigger_is_idempotent_with_a_key(make_client, store, queue, redis_url):
    import redis

    client = make_client()
    rev = sha("manual")
    body = {"revision": rev.upper(), "sweep": "smoke"}
    assert client.post("/api/runs", json=body).status_code == 401
    first = client.post("/api/runs", json=body, headers={**AUTH, "Idempotency-Key": "k-1"})
    assert first.status_code == 202 and first.json()["created"] is True
    again = client.post("/api/runs", json=body, headers={**AUTH, "Idempotency-Key": "k-1"})
    assert again.status_code == 200 and again.json() == {**first.json(), "created": False}
    run = store.get_run(first.json()["run_id"])
    assert (run.revision_sha, run.trigger, run.sweep) == (rev, "manual", "smoke")
    assert redis.Redis.from_url(redis_url).llen(queue) == 4
    for bad in ({"revision": "-abc"}, {"revision": "a b"}, {"revision": rev, "sweep": "../etc"},
                {"revision": rev, "extra": True}, {}, {"revision": rev, "baseline": "x\x00"}):
        assert client.post("/api/runs", json=bad, headers=AUTH).status_code == 422, bad
    for unknown in ({"revision": "no-such-branch-xyz"}, {"revision": rev, "baseline": "no-such-tag-xyz"},
                    {"revision": "WORKTREE"}):  # resolved through the pass repository: one-line 400
        got = client.post("/api/runs", json=unknown, headers=AUTH)
        assert got.status_code == 400 and "\n" not in got.json()["message"], unknown
    assert client.post("/api/runs", content=b"{not json", headers={**AUTH, "Content-Type": "application/json"}
                       ).status_code == 422
    assert len(store.list_runs()) == 1
    other = client.post("/api/runs", json={"revision": rev, "repo": "evil/fork"}, headers=AUTH)
    assert other.status_code == 403 and "evil/fork" in other.json()["message"]
    reported = client.post("/api/runs", json={"revision": rev, "repo": "acme/amp-pass"}, headers=AUTH)
    assert reported.status_code == 202
    assert store.get_run(reported.json()["run_id"]).meta["github"]["repo"] == "acme/amp-pass"


def test_read_token_required(make_client, make_settings):
    client = make_client(make_settings(read_token_required=True))
    assert client.get("/api/runs").status_code == 401
    assert client.get("/api/runs", headers=AUTH).status_code == 200
    assert client.get("/healthz").status_code == 200  # health stays open for load balancers


def test_healthz_reports_database_and_broker(make_client, make_settings):
    ok = make_client().get("/healthz")
    assert ok.status_code == 200
    assert ok.json()["database"]["ok"] is True and ok.json()["broker"]["ok"] is True
    from fastapi.testclient import TestClient

    from service.api.app import create_app

    settings = make_settings(broker_url="redis://127.0.0.1:1/0", github_token="",
                             database_url="postgresql+psycopg://nobody:secret@127.0.0.1:1/none")
    with TestClient(create_app(settings), raise_server_exceptions=False) as down:
        resp = down.get("/healthz")
        runs = down.get("/api/runs")
    assert runs.status_code == 503 and runs.json()["error"] == "unavailable"
    assert resp.status_code == 503
    body = resp.json()
    assert body["database"]["ok"] is False and body["broker"]["ok"] is False
    assert "secret" not in resp.text


def test_openapi_schema_is_served(make_client):
    schema = make_client().get("/openapi.json").json()
    assert {"/webhooks/github", "/healthz", "/api/runs", "/api/runs/{run_id}", "/api/results", "/api/regressions",
            "/api/history", "/api/regressions/{regression_id}/ack"} <= set(schema["paths"])
    assert "post" in schema["paths"]["/api/runs"]


def test_manual_run_names_a_revision_by_branch_tag_or_short_sha(make_client, make_settings, store, tmp_path):
    import subprocess

    repo = tmp_path / "pass"
    (repo / "amp_pass").mkdir(parents=True)
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@localhost", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@localhost", "PATH": "/usr/bin:/bin"}

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                              env=env).stdout.strip()

    git("init", "-q", "-b", "main")
    shas = []
    for i in range(2):
        (repo / "amp_pass" / "__init__.py").write_text(f"# {i}\n")
        git("add", "-A")
        git("commit", "-q", "-m", f"c{i}")
        shas.append(git("rev-parse", "HEAD"))
    git("tag", "v1", shas[0])
    git("branch", "feature", shas[1])
    client = make_client(make_settings(pass_repo=str(repo), cache_dir=str(tmp_path / "cache")))
    got = {}
    for name, baseline in (("feature", "v1"), (shas[0][:9], None)):
        body = {"revision": name, "sweep": "smoke", **({"baseline": baseline} if baseline else {})}
        resp = client.post("/api/runs", json=body, headers=AUTH)
        assert resp.status_code == 202, resp.json()
        run = store.get_run(resp.json()["run_id"])
        got[name] = (run.revision_sha, run.baseline_sha)
    assert got["feature"] == (shas[1], shas[0]) and got[shas[0][:9]][0] == shas[0]
