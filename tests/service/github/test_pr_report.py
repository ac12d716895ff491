"""The pull-request report: one comment per PR, updated in place through pushes and acknowledgements,
and a check run — posted to a real loopback HTTP server that keeps comments as GitHub does; GitHub
failing (403/422/500, a timeout) never affects the run."""

from __future__ import annotations

import re
import time
from dataclasses import replace
from typing import Any

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Response

from service.github.client import COMMENT_MARKER, GitHubStatusClient, PullRequestComment, TransientStatusError
from service.github.comment import escape
from service.orchestration.judge import detect_run, run_verdict
from tests.service.api.conftest import make_reporter
from tests.service.api.helpers import (
    API_TOKEN,
    GITHUB_TOKEN,
    REPO,
    encode,
    pr_payload,
    run_of,
    sha,
    webhook_headers,
)
from tests.service.github.github_standin import GitHubStandIn, app_client, app_standin
from tests.waiting import wait_until
from workers.result import JobResult

PR = 7
ALL = frozenset({"status", "comment", "check"})


def _json(data: Any, status: int = 200) -> Response:
    import json

    return Response(json.dumps(data), status=status, content_type="application/json")


def _result(cell: tuple[str, str, str, str], status: str, revision: str) -> JobResult:
    return JobResult(model=cell[0], dtype=cell[1], policy=cell[2], target=cell[3], status=status, revision=revision,
                     message="" if status == "pass" else "conversion failed: test")


def _finish(store: Any, run_id: int, head: str, bad: set[tuple[str, str]]) -> None:
    """Write a result for every job of the run (``convert_error`` for (model, dtype) in ``bad``), finish, detect."""
    for job in store.jobs(run_id):
        status = "convert_error" if (job.model, job.dtype) in bad else "pass"
        store.write_result(run_id, _result(job.cell, status, head), job_id=job.id)
    store.finish_run(run_id)
    detect_run(store, run_id)


def _table_rows(body: str) -> list[list[str]]:
    rows = [line for line in body.splitlines() if line.startswith("| [")]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in rows]


@pytest.fixture
def pr_world(httpserver: HTTPServer, make_client: Any, make_settings: Any, store: Any, queue: str,
             redis_url: str) -> dict[str, Any]:
    """A base revision with all four cells passing, an app whose reporter posts every report kind to the
    stand-in, and the webhook entry point."""
    github = app_standin(httpserver)  # as an App: check runs need its installation token
    settings = make_settings(github_api_url=httpserver.url_for("/"))
    reporter = make_reporter(settings, redis_url, queue, store=store, reports=ALL, backoff_base=0.01,
                             backoff_cap=0.05, client=app_client(httpserver, backoff_base=0.01))
    client = make_client(settings, reporter=reporter)
    base = sha("pr-base")
    cells = [(m, d, "default", queue) for m in ("conv_small", "mlp_small") for d in ("bf16", "fp16")]
    base_run = store.create_run(base, "push", None, "smoke", cells)
    for cell in cells:
        store.write_result(base_run, _result(cell, "pass", base))
    store.finish_run(base_run)

    def pr_event(head: str, action: str, title: str = "Keep Resize scales in fp32") -> int:
        payload = pr_payload(head, base, action=action, number=PR)
        payload["pull_request"]["title"] = title
        body = encode(payload)
        resp = client.post("/webhooks/github", content=body, headers=webhook_headers(body, "pull_request"))
        return run_of(client, resp)

    def settle() -> None:
        reporter.check_watched(store)
        for _ in range(20):
            reporter.drain()
            if reporter.outbox.pending_count() == 0:
                return
            time.sleep(0.06)

    return {"github": github, "reporter": reporter, "client": client, "store": store, "base": base,
            "pr_event": pr_event, "settle": settle, "cells": cells}


@pytest.mark.postgres
@pytest.mark.redis
def test_one_comment_kept_current_through_pushes_and_an_acknowledgement(pr_world: dict[str, Any]):
    gh, store, client = pr_world["github"], pr_world["store"], pr_world["client"]
    pr_event, settle = pr_world["pr_event"], pr_world["settle"]

    # opened: one cell regresses
    head1 = sha("pr-head-1")
    run1 = pr_event(head1, "opened")
    _finish(store, run1, head1, {("mlp_small", "fp16")})
    settle()
    [comment] = gh.pr_comments()
    body = comment["body"]
    assert body.startswith(COMMENT_MARKER)
    assert f"Merging #{PR} regresses 1 cell" in body and head1[:12] in body
    assert "\n❌ 1 regression · ✅ 3 unchanged\n" in body
    [row] = _table_rows(body)
    findings = store.regressions(run_id=run1)
    assert row[0] == f"[{findings[0].id}](https://ci.example.com/regressions/{findings[0].id})"
    assert row[1:5] == ["mlp\\_small", "fp16", "default", escape(pr_world["cells"][0][3])] and row[5] == "conversion"
    assert row[6:9] == ["converted at baseline \\(pass\\), now convert\\_error", "–", "**critical**"]
    assert row[-1] == "open"
    assert "ampci ack ID" in body
    assert gh.statuses[-1]["state"] == "failure" and gh.checks[-1]["conclusion"] == "failure"
    assert gh.checks[-1]["head_sha"] == head1 and gh.checks[-1]["output"]["title"].startswith("❌ Merging #7")

    # synchronised: while the new head runs, the comment says so and folds the old report away
    head2 = sha("pr-head-2")
    run2 = pr_event(head2, "synchronize")
    settle()
    [pending] = gh.pr_comments()
    top, _, folded = pending["body"].partition("<details>")
    assert pending["id"] == comment["id"] and f"### ⏳ Merging #{PR}: checking `{head2[:12]}`" in top
    assert f"[Run {run2}](https://ci.example.com/runs/{run2})" in top and "regresses" not in top
    assert f"Report of the previous head {head1[:12]} (run {run1})" in folded and "regresses 1 cell" in folded
    assert pending["body"].count(COMMENT_MARKER) == 1
    # ... and when it finishes: now two cells regress -> the same comment, rewritten
    _finish(store, run2, head2, {("mlp_small", "fp16"), ("conv_small", "bf16")})
    settle()
    assert [c["id"] for c in gh.pr_comments()] == [comment["id"]]
    body = gh.pr_comments()[0]["body"]
    assert "regresses 2 cells" in body and head2[:12] in body and head1[:12] not in body
    rows = _table_rows(body)
    expected = {(f.model, f.dtype, f.id) for f in store.regressions(run_id=run2) if f.category == "regression"}
    assert {(r[1].replace("\\_", "_"), r[2], int(r[0].split("]")[0].strip("[")))
            for r in rows} == expected

    # synchronised again: everything passes
    head3 = sha("pr-head-3")
    run3 = pr_event(head3, "synchronize", title="Fix | the *cast* <!-- ampci:pr-report --> @octocat")
    _finish(store, run3, head3, set())
    settle()
    [only] = gh.pr_comments()
    body = only["body"]
    assert only["id"] == comment["id"] and "no change in 4 cells" in body and _table_rows(body) == []
    assert body.count(COMMENT_MARKER) == 1 and "@octocat" not in body and "&#64;octocat" in body
    assert "Fix \\| the \\*cast\\* &lt;\\!\\-\\-" in body

    # a finding of the newest run acknowledged through the API -> rewritten with its state
    head4 = sha("pr-head-4")
    run4 = pr_event(head4, "synchronize")
    _finish(store, run4, head4, {("conv_small", "fp16")})
    settle()
    [finding] = [f for f in store.regressions(run_id=run4) if f.category == "regression"]
    resp = client.post(f"/api/regressions/{finding.id}/ack", json={"by": "reviewer"},
                       headers={"Authorization": f"Bearer {API_TOKEN}"})
    assert resp.status_code == 200, resp.text
    settle()
    [only] = gh.pr_comments()
    [row] = _table_rows(only["body"])
    assert only["id"] == comment["id"] and row[-1] == "acknowledged ✔" and str(finding.id) in row[0]
    assert len(gh.pr_comments()) == 1 and len({c["id"] for c in gh.comments.values()}) == 1

    # ... then marked a false positive with the dashboard's button: struck through, no longer a regression
    resp = client.post(f"/regressions/{finding.id}/triage", data={"token": API_TOKEN, "action": "false_positive"},
                       headers={"Accept": "text/html"}, follow_redirects=False)
    assert resp.status_code == 303, resp.text
    settle()
    [only] = gh.pr_comments()
    [row] = _table_rows(only["body"])
    assert only["id"] == comment["id"] and row[-1] == "false positive" and row[1].startswith("~~")
    # the cell still could not convert: said first, never "no change" (no silent pass)
    assert f"### ⚠️ Merging #{PR}: 1 of 4 cells could not be measured" in only["body"]
    assert "regression" not in only["body"].split("| ID |")[0] and "⚠️ 1 not measured" in only["body"]
    # one check run per head, edited in place by each re-report (ack, false positive), never one more
    assert [c["head_sha"] for c in gh.checks] == [head1, head2, head3, head4]
    assert gh.checks[-1]["output"]["title"].startswith(f"⚠️ Merging #{PR}: 1 of 4 cells could not be measured")
    assert sum(1 for method, path in gh.requests if method == "PATCH" and "/check-runs/" in path) >= 2


@pytest.mark.postgres
@pytest.mark.redis
def test_an_older_run_finishing_late_never_overwrites_the_newer_report(pr_world: dict[str, Any]):
    gh, store, pr_event, settle = pr_world["github"], pr_world["store"], pr_world["pr_event"], pr_world["settle"]
    old, new = sha("pr-late-old"), sha("pr-late-new")
    run_old = pr_event(old, "opened")
    run_new = pr_event(new, "synchronize")
    _finish(store, run_new, new, set())
    settle()
    _finish(store, run_old, old, {("mlp_small", "fp16")})
    settle()
    [comment] = gh.pr_comments()
    assert new[:12] in comment["body"] and old[:12] not in comment["body"]
    assert store.get_run(run_old).status == "complete"


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.parametrize("failure", [403, 422, 500, "timeout"])
def test_github_failing_never_affects_the_run(pr_world: dict[str, Any], failure: int | str):
    gh, store, client = pr_world["github"], pr_world["store"], pr_world["client"]
    pr_event, reporter = pr_world["pr_event"], pr_world["reporter"]
    reporter.client.close()
    reporter.client = GitHubStatusClient(reporter.client.api_url, auth=reporter.client.auth, timeout=0.5,
                                         attempts=1, backoff_base=0.01)  # the App: check runs too
    gh.delay = 1.0
    for kind in ("list", "create", "edit", "status", "check"):
        gh.fail[kind] = failure
    head = sha(f"pr-fail-{failure}")
    run_id = pr_event(head, "opened")
    _finish(store, run_id, head, {("mlp_small", "fp16")})
    before = (store.get_run(run_id), store.run_summary(run_id), store.regressions(run_id=run_id))
    reporter.check_watched(store)
    for _ in range(3):
        reporter.drain()
    [finding] = before[2]
    resp = client.post(f"/api/regressions/{finding.id}/ack", json={"by": "reviewer"},
                       headers={"Authorization": f"Bearer {API_TOKEN}"})
    assert resp.status_code == 200 and resp.json()["state"] == "acknowledged"
    reporter.drain()
    run, summary, _ = before
    after = store.get_run(run_id)  # the triage recorded the run's verdict for the lists of runs, nothing else
    assert replace(after, verdict=None) == replace(run, verdict=None) and store.run_summary(run_id) == summary
    assert after.verdict == run_verdict(store, run_id).brief()
    assert gh.pr_comments() == []
    if failure in (403, 422):  # permanent: dropped to the dead list (after 422, its shortened forms first; a
        # check run's completion: after its minimal form)
        wait_until(lambda: reporter.drain() == 0 and reporter.outbox.pending_count() == 0,
                   "every shortened form refused and dropped")
        dead = reporter.outbox.dead()
        assert {d.get("kind", "status") for d in dead} >= {"status", "comment", "check"}
        assert reporter.outbox.pending_count() == 0
    else:  # transient: still in the outbox for later
        assert reporter.outbox.pending_count() >= 1
        gh.fail.clear()
        time.sleep(0.1)
        pr_world["settle"]()
        [comment] = gh.pr_comments()
        assert "acknowledged ✔" in comment["body"]


def test_a_check_run_is_edited_in_place_per_head_and_name(httpserver: HTTPServer):
    """Reporting a head again edits its check run (found by name and head sha); another head, another
    name, or a check run this token cannot edit (another app's) gets its own."""
    from service.github.client import CheckRun

    gh = app_standin(httpserver)  # check runs are for Apps only
    client = app_client(httpserver, attempts=1)
    head, other = sha("check-head"), sha("check-other")

    def check(conclusion: str, at: str = head, name: str = "ampci/smoke") -> CheckRun:
        return CheckRun(REPO, at, name, conclusion, f"title {conclusion}", "summary")

    first = client.upsert_check_run(check("failure"))
    client.deliver(check("success"))
    assert [(c["id"], c["conclusion"], c["output"]["title"]) for c in gh.checks] == [(first, "success",
                                                                                       "title success")]
    second = client.upsert_check_run(check("failure", at=other))
    third = client.upsert_check_run(check("neutral", name="ampci/full"))
    assert len({first, second, third}) == 3
    assert client.upsert_check_run(check("neutral", at=other)) == second
    assert {(c["head_sha"], c["name"], c["conclusion"]) for c in gh.checks} == {
        (head, "ampci/smoke", "success"), (other, "ampci/smoke", "neutral"), (head, "ampci/full", "neutral")}
    gh.checks[0]["app"] = "other"  # made by another app: left alone, ours created beside it
    fourth = client.upsert_check_run(check("failure"))
    assert fourth not in (first, second, third) and gh.checks[0]["conclusion"] == "success"
    assert client.upsert_check_run(check("success")) == fourth  # the newest of the name is ours now
    gh.fail["check"] = 503
    with pytest.raises(TransientStatusError):
        client.upsert_check_run(check("failure"))


def test_upsert_finds_its_comment_by_marker_across_pages(httpserver: HTTPServer):
    gh = GitHubStandIn(httpserver)
    client = GitHubStatusClient(httpserver.url_for("/"), GITHUB_TOKEN, timeout=2.0, attempts=1)
    first = client.upsert_comment(PullRequestComment(REPO, PR, "hello"))
    second = client.upsert_comment(PullRequestComment(REPO, PR, "again"))
    assert first == second and [c["body"] for c in gh.pr_comments()] == [f"{COMMENT_MARKER}\nagain"]
    # with 150 other comments before it, ours is still found (on the second page), never duplicated
    for i in range(1, 151):
        gh.comments[i] = {"id": i, "issue": PR, "body": f"comment {i}"}
    gh.comments = dict(sorted(gh.comments.items()))
    assert client.upsert_comment(PullRequestComment(REPO, PR, "third")) == first
    assert sum(COMMENT_MARKER in c["body"] for c in gh.pr_comments()) == 1
    gh.fail["list"] = 503
    with pytest.raises(TransientStatusError):
        client.upsert_comment(PullRequestComment(REPO, PR, "fourth"))
