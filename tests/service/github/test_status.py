"""Commit statuses: the exact requests made to a real local HTTP server standing in for GitHub,
retries with backoff through the Redis outbox, and the final status of real runs."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from service.github.client import (
    CommitStatus,
    GitHubStatusClient,
    PermanentStatusError,
    RateLimitedError,
    TransientStatusError,
    backoff_delay,
)
from service.github.outbox import MemoryOutbox, RedisOutbox
from service.github.reporter import CONTEXT, StatusReporter
from service.orchestration.judge import detect_run, run_verdict
from service.regressions.verdict import decide_run, summary_facts
from tests.service.api.conftest import make_reporter
from tests.service.api.helpers import GITHUB_TOKEN, REPO, encode, push_payload, run_of, sha, webhook_headers
from tests.service.github.github_standin import GitHubStandIn
from workers.result import JobResult

SHA = sha("status")
PATH = f"/repos/{REPO}/statuses/{SHA}"


def _status(state: str = "pending", description: str = "queued") -> CommitStatus:
    return CommitStatus(repo=REPO, sha=SHA, state=state, description=description,
                        target_url="https://ci.example.com/runs/5")


def _client(server: HTTPServer, **kw: Any) -> GitHubStatusClient:
    return GitHubStatusClient(server.url_for("/"), GITHUB_TOKEN, timeout=2.0, backoff_base=0.01, **kw)


def test_client_posts_the_exact_request(httpserver: HTTPServer):
    httpserver.expect_oneshot_request(
        PATH, method="POST",
        headers={"Authorization": f"Bearer {GITHUB_TOKEN}", "Accept": "application/vnd.github+json",
                 "X-GitHub-Api-Version": "2022-11-28"},
        json={"state": "pending", "description": "queued", "context": "ampci/smoke",
              "target_url": "https://ci.example.com/runs/5"},
    ).respond_with_json({"id": 1}, status=201)
    client = _client(httpserver)
    client.post_status(_status())
    client.close()
    httpserver.check_assertions()
    assert len(httpserver.log) == 1


def test_client_retries_transient_failures_with_backoff(httpserver: HTTPServer):
    httpserver.expect_ordered_request(PATH, method="POST").respond_with_data("bad gateway", status=502)
    httpserver.expect_ordered_request(PATH, method="POST").respond_with_data("unavailable", status=503)
    httpserver.expect_ordered_request(PATH, method="POST").respond_with_json({}, status=201)
    sleeps: list[float] = []
    _client(httpserver, attempts=3, sleep=sleeps.append).post_status(_status())
    httpserver.check_assertions()
    assert len(httpserver.log) == 3 and len(sleeps) == 2 and all(s >= 0 for s in sleeps)


def test_a_rate_limit_ends_the_call_without_sleeping(httpserver: HTTPServer):
    """A 429 is never slept on inside the call (the reporter's thread is shared): it is raised at once
    with GitHub's delay, clamped (Retry-After 0 still waits a second)."""
    httpserver.expect_request(PATH, method="POST").respond_with_data("slow down", status=429,
                                                                    headers={"Retry-After": "0"})
    sleeps: list[float] = []
    with pytest.raises(RateLimitedError) as err:
        _client(httpserver, attempts=3, sleep=sleeps.append).post_status(_status())
    assert len(httpserver.log) == 1 and sleeps == [] and err.value.retry_after == 1.0 and err.value.repo == REPO


def test_client_gives_up_at_once_on_permanent_errors(httpserver: HTTPServer):
    httpserver.expect_request(PATH, method="POST").respond_with_json({"message": "No commit found"}, status=422)
    with pytest.raises(PermanentStatusError, match="422"):
        _client(httpserver, attempts=3, sleep=lambda s: None).post_status(_status())
    assert len(httpserver.log) == 1


def test_client_reports_unreachable_github_as_transient():
    client = GitHubStatusClient("http://127.0.0.1:9", GITHUB_TOKEN, timeout=0.5, attempts=2, sleep=lambda s: None)
    with pytest.raises(TransientStatusError):
        client.post_status(_status())


def test_backoff_grows_exponentially_and_is_capped():
    assert [backoff_delay(a, 1.0, 60.0, rng=lambda: 1.0) for a in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert backoff_delay(3, 1.0, 60.0, rng=lambda: 0.0) == 4.0


def test_description_is_cut_to_githubs_limit():
    assert len(_status(description="x" * 500).body()["description"]) == 140


@pytest.mark.redis
@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_outage_is_retried_until_github_recovers_and_nothing_is_lost(httpserver: HTTPServer, redis_url: str,
                                                                     queue: str, kind: str):
    outbox = MemoryOutbox() if kind == "memory" else RedisOutbox(redis_url, prefix=queue)
    reporter = StatusReporter(outbox, _client(httpserver, attempts=1), public_url="https://ci.example.com",
                              backoff_base=0.05, backoff_cap=0.2, max_attempts=50)
    httpserver.expect_request(PATH, method="POST").respond_with_data("down", status=503)
    reporter.queued(5, REPO, SHA)
    for _ in range(3):
        assert reporter.drain() == 0
        time.sleep(0.25)
    assert outbox.pending_count() == 1 and len(httpserver.log) >= 3
    httpserver.clear()
    httpserver.expect_oneshot_request(PATH, method="POST", json={
        "state": "pending", "description": "queued", "context": "ampci/smoke",
        "target_url": "https://ci.example.com/runs/5"}).respond_with_json({}, status=201)
    time.sleep(0.25)
    assert reporter.drain() == 1
    httpserver.check_assertions()
    assert outbox.pending_count() == 0 and outbox.dead() == []


@pytest.mark.redis
def test_newer_status_supersedes_unsent_pending(httpserver: HTTPServer, redis_url: str, queue: str):
    outbox = RedisOutbox(redis_url, prefix=queue)
    reporter = StatusReporter(outbox, _client(httpserver), public_url="https://ci.example.com")
    outbox.put(_status("pending", "queued"))
    outbox.put(_status("success", "4 cells: 4 pass"))
    httpserver.expect_oneshot_request(PATH, method="POST", json={
        "state": "success", "description": "4 cells: 4 pass", "context": "ampci/smoke",
        "target_url": "https://ci.example.com/runs/5"}).respond_with_json({}, status=201)
    assert reporter.drain() == 1
    httpserver.check_assertions()
    assert reporter.drain() == 0 and len(httpserver.log) == 1


@pytest.mark.redis
def test_status_superseded_while_in_flight_is_posted_next(redis_url: str, queue: str):
    outbox = RedisOutbox(redis_url, prefix=queue)
    outbox.put(_status("pending"))
    [claimed] = outbox.claim(time.time(), 10, lease=60)
    outbox.put(_status("failure", "1 regression"))
    assert outbox.claim(time.time(), 10, lease=60) == []  # not while the older one is in flight
    outbox.complete(claimed, ok=True, next_due=0)
    [newer] = outbox.claim(time.time(), 10, lease=60)
    assert newer.status.state == "failure"


@pytest.mark.redis
def test_claim_of_a_dead_poster_expires(redis_url: str, queue: str):
    outbox = RedisOutbox(redis_url, prefix=queue)
    outbox.put(_status())
    assert len(outbox.claim(time.time(), 10, lease=0.2)) == 1
    assert outbox.claim(time.time(), 10, lease=0.2) == []
    time.sleep(0.3)
    assert len(outbox.claim(time.time(), 10, lease=0.2)) == 1


@pytest.mark.redis
def test_permanent_error_goes_to_the_dead_list(httpserver: HTTPServer, redis_url: str, queue: str):
    outbox = RedisOutbox(redis_url, prefix=queue)
    reporter = StatusReporter(outbox, _client(httpserver), public_url="https://ci.example.com")
    httpserver.expect_request(PATH, method="POST").respond_with_json({"message": "Bad credentials"}, status=401)
    reporter.queued(5, REPO, SHA)
    assert reporter.drain() == 0
    assert outbox.pending_count() == 0
    [dead] = outbox.dead()
    assert dead["sha"] == SHA and "401" in dead["reason"]


def _result(cell: tuple[str, str, str, str], status: str, revision: str) -> JobResult:
    return JobResult(model=cell[0], dtype=cell[1], policy=cell[2], target=cell[3], status=status, revision=revision,
                     message="" if status == "pass" else "conversion failed: test")


@pytest.mark.postgres
@pytest.mark.redis
def test_webhook_run_reports_pending_then_its_outcome(httpserver: HTTPServer, make_client, make_settings,
                                                      store: Any, queue: str, redis_url: str):
    settings = make_settings(github_api_url=httpserver.url_for("/"))
    reporter = make_reporter(settings, redis_url, queue, store=store)
    client = make_client(settings, reporter=reporter)
    base, head = sha("base-rev"), sha("head-rev")
    base_run = store.create_run(base, "push", None, "smoke", [("mlp_small", "fp16", "default", queue)])
    store.write_result(base_run, _result(("mlp_small", "fp16", "default", queue), "pass", base))
    store.finish_run(base_run)

    seen: list[dict[str, Any]] = []

    def record(request: Request) -> Response:
        seen.append({"path": request.path, "auth": request.headers.get("Authorization"), "json": request.json})
        return Response("{}", status=201, content_type="application/json")

    httpserver.expect_request(f"/repos/{REPO}/statuses/{head}", method="POST").respond_with_handler(record)
    body = encode(push_payload(head, before=base))
    resp = client.post("/webhooks/github", content=body, headers=webhook_headers(body, "push"))
    assert resp.status_code == 202
    assert reporter.drain() == 0  # the pending status is queued by the intake, not the request
    run_id = run_of(client, resp)
    assert reporter.drain() == 1
    url = f"https://ci.example.com/runs/{run_id}"
    assert seen == [{"path": f"/repos/{REPO}/statuses/{head}", "auth": f"Bearer {GITHUB_TOKEN}",
                     "json": {"state": "pending", "description": "queued", "context": "ampci/smoke",
                              "target_url": url}}]
    assert reporter.check_watched(store) == 0  # still queued: nothing to report yet

    for job in store.jobs(run_id):
        bad = job.cell == ("mlp_small", "fp16", "default", queue)
        store.write_result(run_id, _result(job.cell, "convert_error" if bad else "pass", head), job_id=job.id)
    store.finish_run(run_id)
    detect_run(store, run_id)
    assert reporter.check_watched(store) == 1
    assert reporter.drain() == 1
    final = seen[-1]["json"]
    summary = store.run_summary(run_id)
    verdict = run_verdict(store, run_id)
    assert final == {"state": "failure", "description": verdict.description(summary.describe()),
                     "context": "ampci/smoke", "target_url": url}
    # the cell that could not measure comes first, with its count; cells without a baseline are not compared
    assert final["description"].startswith("1 of 4 cells could not measure (1 convert_error)")
    assert "1 conversion regression" in final["description"]
    assert "3 of 4 cells not compared" in final["description"] and "no regressions" not in final["description"]
    assert reporter.check_watched(store) == 0 and len(seen) == 2


def test_state_from_counts_alone():
    from service.db.records import RunSummary

    def s(status: str = "complete", jobs: dict | None = None, regs: dict | None = None) -> RunSummary:
        return RunSummary(run_id=1, status=status, cells=4, job_status=jobs or {"done": 4},
                          result_status={"pass": 4}, regressions=regs or {}, improvements=0, flaky=0)

    def final_state(summary: RunSummary) -> str:  # what a reporter without a store posts
        return decide_run(summary_facts(summary)).state

    assert final_state(s()) == "success"
    assert final_state(s(regs={"accuracy": 1})) == "failure"
    assert final_state(s(status="partial", jobs={"done": 3, "crashed": 1})) == "error"
    assert final_state(s(status="failed", jobs={"error": 4})) == "error"
    assert final_state(s(status="cancelled", jobs={"cancelled": 4})) == "error"


@pytest.mark.postgres
def test_each_sweep_reports_under_its_own_status_context(httpserver: HTTPServer, store: Any, queue: str):
    """One commit status context per sweep (every sweep of sweeps/), so a branch rule can require each; the
    smoke sweep keeps ``ampci/smoke``, the single context of before, so existing required checks still match."""
    from service.orchestration.sweeps import SWEEPS_DIR

    gh = GitHubStandIn(httpserver)
    reporter = StatusReporter(MemoryOutbox(), _client(httpserver), public_url="https://ci.example.com", store=store)
    sweeps = sorted(p.stem for p in SWEEPS_DIR.glob("*.toml"))
    assert "smoke" in sweeps and len(sweeps) > 1
    cell = ("mlp_small", "fp16", "default", queue)
    for sweep in sweeps:
        head = sha(f"context-{sweep}")
        run_id = store.create_run(head, "push", None, sweep, [cell], meta={"github": {"repo": REPO}})
        reporter.queued(run_id, REPO, head)
        reporter.drain()
        store.write_result(run_id, _result(cell, "pass", head))
        store.finish_run(run_id)
        reporter.check_watched(store)
        reporter.drain()
        assert [(s["state"], s["context"]) for s in gh.statuses if s["target_url"].endswith(f"/runs/{run_id}")] == \
            [("pending", f"ampci/{sweep}"), ("success", f"ampci/{sweep}")]
    assert CONTEXT == "ampci/smoke" and {s["context"] for s in gh.statuses} == {f"ampci/{s}" for s in sweeps}
