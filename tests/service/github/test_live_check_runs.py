"""Live check runs as a GitHub App (issue 33, point 2): queued when the run is created, in_progress when
its first job starts, completed with the gate's conclusion; a name of their own; GitHub's "Re-run" starts
a new run.  End to end through the webhook, the intake, the real PostgreSQL store and Redis outbox and
the loopback GitHub (tests/service/github/github_standin.py), which accepts check runs only from an installation
token and only with GitHub's status and conclusion values."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pytest_httpserver import HTTPServer

from service.github.client import CheckRun, GitHubStatusClient, PermanentStatusError
from service.github.events import Ignored, PayloadError, RepositoryNotAllowedError, RunRequest, parse_event
from service.github.live_checks import check_name, conclusion
from service.orchestration.judge import detect_run
from service.settings import Settings
from tests.service.api.conftest import make_reporter
from tests.service.api.helpers import (
    GITHUB_TOKEN,
    REPO,
    drain,
    encode,
    pr_payload,
    push_payload,
    run_of,
    sha,
    webhook_headers,
)
from tests.service.github.github_standin import APP_ID, PR, GitHubStandIn, app_client, app_standin
from workers.result import JobResult

ALL = frozenset({"status", "comment", "check"})


def test_the_conclusion_comes_from_the_final_state():
    assert conclusion("success", "complete", compared=4) == "success"
    assert conclusion("success", "complete", compared=0) == "neutral"  # not compared is never "passed"
    assert conclusion("failure", "complete", compared=4) == "failure"
    assert conclusion("error", "partial", compared=3) == "failure"
    assert conclusion("error", "cancelled", compared=0) == "cancelled"
    with pytest.raises(ValueError):
        conclusion("pending", "running")
    assert check_name("smoke") == "ampci smoke" != "ampci/smoke"


def test_the_standin_enforces_the_checks_api(httpserver: HTTPServer):
    gh = app_standin(httpserver)
    token = GitHubStatusClient(httpserver.url_for("/"), GITHUB_TOKEN, timeout=2.0, attempts=1)
    check = CheckRun(REPO, sha("rules"), "ampci smoke", None, "Queued", "s", status="queued", external_id="1")
    with pytest.raises(PermanentStatusError, match="HTTP 403"):  # a personal token cannot write check runs
        token.upsert_check_run(check)
    app = app_client(httpserver, attempts=1)
    for bad in ({"status": "done"}, {"status": "completed"}, {"status": "queued", "conclusion": "success"},
                {"status": "completed", "conclusion": "error"}):
        with pytest.raises(PermanentStatusError, match="HTTP 422"):
            app._request("POST", f"{app.api_url}/repos/{REPO}/check-runs",
                         {"name": "ampci smoke", "head_sha": sha("rules"), **bad}, repo=REPO)
    for status, verdict in (("done", None), ("completed", None), ("queued", "success"), ("completed", "error")):
        with pytest.raises(ValueError):  # and ampci never builds one
            CheckRun(REPO, sha("rules"), "ampci smoke", verdict, "t", "s", status=status)
    assert app.upsert_check_run(check) > 0 and gh.checks[0]["status"] == "queued"


def _result(cell: tuple[str, str, str, str], status: str, revision: str) -> JobResult:
    return JobResult(model=cell[0], dtype=cell[1], policy=cell[2], target=cell[3], status=status, revision=revision,
                     message="" if status == "pass" else "conversion failed: test")


class World:
    """The app reporting as an App to the stand-in; a base revision whose four cells pass."""

    def __init__(self, httpserver: HTTPServer, make_client: Any, make_settings: Any, store: Any, queue: str,
                 redis_url: str) -> None:
        self.gh: GitHubStandIn = app_standin(httpserver)
        settings = make_settings(github_api_url=httpserver.url_for("/"))
        self.reporter = make_reporter(settings, redis_url, queue, store=store, reports=ALL, backoff_base=0.01,
                                      backoff_cap=0.05, client=app_client(httpserver, backoff_base=0.01))
        self.client, self.store, self.queue = make_client(settings, reporter=self.reporter), store, queue
        self.base = sha("live-base")
        self.cells = [(m, d, "default", queue) for m in ("conv_small", "mlp_small") for d in ("bf16", "fp16")]
        base_run = store.create_run(self.base, "push", None, "smoke", self.cells)
        for cell in self.cells:
            store.write_result(base_run, _result(cell, "pass", self.base))
        store.finish_run(base_run)

    def post(self, event: str, payload: dict[str, Any]) -> Any:
        body = encode(payload)
        return self.client.post("/webhooks/github", content=body, headers=webhook_headers(body, event))

    def settle(self) -> list[dict[str, Any]]:
        """Report what is due; the stand-in's check runs (asserting nothing was refused)."""
        self.reporter.check_watched(self.store)
        for _ in range(30):
            self.reporter.drain()
            if self.reporter.outbox.pending_count() == 0:
                break
            time.sleep(0.05)
        assert self.reporter.outbox.dead() == []
        return self.gh.checks

    def finish(self, run_id: int, head: str, bad: set[tuple[str, str]] = frozenset()) -> None:  # type: ignore[assignment]
        for job in self.store.jobs(run_id):
            status = "convert_error" if (job.model, job.dtype) in bad else "pass"
            self.store.write_result(run_id, _result(job.cell, status, head), job_id=job.id)
        self.store.finish_run(run_id)
        detect_run(self.store, run_id)


@pytest.fixture
def world(httpserver: HTTPServer, make_client: Any, make_settings: Any, store: Any, queue: str,
          redis_url: str) -> World:
    return World(httpserver, make_client, make_settings, store, queue, redis_url)


def _stages(check: dict[str, Any]) -> tuple[str, str | None]:
    return check["status"], check.get("conclusion")


@pytest.mark.postgres
@pytest.mark.redis
def test_a_check_run_lives_with_its_run(world: World):
    head = sha("live-head")
    run_id = run_of(world.client, world.post("pull_request", pr_payload(head, world.base, number=PR)))
    [check] = world.settle()
    url = f"https://ci.example.com/runs/{run_id}"
    assert _stages(check) == ("queued", None) and check["details_url"] == url
    assert check["name"] == "ampci smoke" and check["external_id"] == str(run_id) and check["head_sha"] == head
    assert check["app"] == "ampci-test[bot]"
    assert {s["context"] for s in world.gh.statuses} == {"ampci/smoke"}  # the status keeps its own name

    first_job = world.store.jobs(run_id)[0]
    world.store.begin_job(first_job.id, "worker-1")
    [check] = world.settle()
    assert _stages(check) == ("in_progress", None) and check["details_url"] == url

    world.finish(run_id, head, {("mlp_small", "fp16")})
    [check] = world.settle()  # the same check run, completed
    assert _stages(check) == ("completed", "failure") and check["output"]["title"].startswith("❌")
    assert world.gh.statuses[-1]["state"] == "failure"


@pytest.mark.postgres
@pytest.mark.redis
def test_a_report_that_cannot_be_built_still_completes_the_check_run(world: World,
                                                                     monkeypatch: pytest.MonkeyPatch):
    """A bug in building the final report (here the builder raises) never leaves the check run in progress: it
    completes with the verdict's conclusion and says why, linking the run page."""
    from service.github import pr_report

    head = sha("live-unbuilt")
    run_id = run_of(world.client, world.post("pull_request", pr_payload(head, world.base, number=PR)))
    [check] = world.settle()
    assert _stages(check) == ("queued", None)

    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("the report builder has a bug\nand a second line")

    monkeypatch.setattr(pr_report, "build_report", broken)
    world.finish(run_id, head, {("mlp_small", "fp16")})
    [check] = world.settle()
    url = f"https://ci.example.com/runs/{run_id}"
    assert _stages(check) == ("completed", "failure") and check["details_url"] == url
    assert check["output"]["summary"] == ("ampci could not build its report: RuntimeError: the report builder has a "
                                          f"bug; see [the run page]({url}).")
    assert world.gh.statuses[-1]["state"] == "failure"


def _drain(world: World) -> None:
    for _ in range(60):
        world.reporter.drain()
        if world.reporter.outbox.pending_count() == 0:
            return
        time.sleep(0.05)
    raise AssertionError(f"outbox not drained: {world.reporter.outbox.dead()}")


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.parametrize("recovers", [True, False])
def test_the_sweep_completes_a_check_run_whose_completion_never_landed(world: World, recovers: bool,
                                                                       caplog: pytest.LogCaptureFixture):
    """GitHub refuses the completion in every form (400): the check run stays in progress, one line says so;
    the reporter's sweep finds it open after its run ended and queues the completion again -- it lands once
    GitHub takes it, else the sweep gives up after ``SWEEP_TRIES`` sweeps with one line."""
    import logging

    from service.github.open_checks import SWEEP_TRIES

    caplog.set_level(logging.WARNING, "service.github.reporter")
    head = sha(f"live-left-open-{recovers}")
    run_id = run_of(world.client, world.post("pull_request", pr_payload(head, world.base, number=PR)))
    world.reporter.check_watched(world.store)
    _drain(world)
    assert world.reporter.outbox.open_checks() == [run_id]
    world.finish(run_id, head)
    world.gh.script["check_write"] = [400, 400] if recovers else [400] * (2 + 2 * SWEEP_TRIES)
    world.reporter.check_watched(world.store)
    _drain(world)
    [check] = [c for c in world.gh.checks if c["head_sha"] == head]
    assert check["status"] == "queued"
    assert len([r for r in caplog.records if "left open: GitHub refused" in r.getMessage()]) == 1
    assert world.reporter.complete_open_checks(world.store) == 0  # ended, but not yet at the sweep before
    for _ in range(SWEEP_TRIES + 1):
        world.reporter.complete_open_checks(world.store)
        _drain(world)
    [check] = [c for c in world.gh.checks if c["head_sha"] == head]
    assert world.reporter.outbox.open_checks() == []
    given_up = [r.getMessage() for r in caplog.records if "did not land" in r.getMessage()]
    if recovers:
        assert _stages(check) == ("completed", "success") and given_up == []
    else:
        assert check["status"] == "queued" and world.gh.script["check_write"] == []
        assert len(given_up) == 1 and f"run {run_id}" in given_up[0]


@pytest.mark.postgres
@pytest.mark.redis
def test_cancelled_and_not_compared_runs_conclude_as_such(world: World):
    head = sha("live-cancelled")
    run_id = run_of(world.client, world.post("pull_request", pr_payload(head, world.base, number=PR)))
    for job in world.store.jobs(run_id):
        world.store.mark_job(job.id, "cancelled")
    world.store.finish_run(run_id)
    [check] = world.settle()
    assert _stages(check) == ("completed", "cancelled")
    assert world.gh.statuses[-1]["state"] == "error"  # the commit status is unchanged

    fresh = sha("live-no-baseline")  # a push whose parent was never measured: nothing to compare with
    run_id = run_of(world.client, world.post("push", push_payload(fresh, before=sha("never-measured"))))
    world.finish(run_id, fresh)
    checks = [c for c in world.settle() if c["head_sha"] == fresh]
    assert [_stages(c) for c in checks] == [("completed", "neutral")]


@pytest.mark.postgres
@pytest.mark.redis
def test_a_fork_run_awaits_approval_as_action_required(world: World):
    head = sha("live-fork")
    resp = world.post("pull_request", pr_payload(head, world.base, number=PR, head_repo="stranger/amp-pass",
                                                 association="CONTRIBUTOR"))
    run_id = run_of(world.client, resp)
    [check] = world.settle()
    assert _stages(check) == ("completed", "action_required") and check["external_id"] == str(run_id)
    approve = pr_payload(head, world.base, action="labeled", number=PR, head_repo="stranger/amp-pass",
                         association="CONTRIBUTOR", label="ampci:run")
    run_of(world.client, world.post("pull_request", approve))
    awaiting, started = world.settle()  # approved: a new check run (GitHub's never goes back to queued)
    assert _stages(awaiting) == ("completed", "action_required") and _stages(started) == ("queued", None)
    assert started["external_id"] == str(run_id)


def _rerequest(check: dict[str, Any], base: str, pull_requests: bool = True) -> dict[str, Any]:
    prs = [{"number": PR, "head": {"sha": check["head_sha"], "ref": "feature/resize"},
            "base": {"sha": base, "ref": "main"}}] if pull_requests else []
    return {"action": "rerequested", "repository": {"full_name": REPO},
            "installation": {"id": 4242},
            "check_run": {"id": check["id"], "name": check["name"], "head_sha": check["head_sha"],
                          "external_id": check["external_id"], "pull_requests": prs,
                          "check_suite": {"head_branch": "feature/resize", "before": None}}}


@pytest.mark.postgres
@pytest.mark.redis
def test_rerun_on_github_starts_a_new_run_of_that_head(world: World):
    head = sha("live-rerun")
    first = run_of(world.client, world.post("pull_request", pr_payload(head, world.base, number=PR)))
    [queued] = world.settle()
    world.finish(first, head, {("mlp_small", "fp16")})
    world.reporter.check_watched(world.store)  # its completion is in the outbox, not sent yet ...
    second = run_of(world.client, world.post("check_run", _rerequest(queued, world.base)))  # ... at the re-run
    assert second != first
    run = world.store.get_run(second)
    assert run.revision_sha == head and run.trigger == "pull_request" and run.meta["github"]["pr"] == PR
    done, rerun = world.settle()  # the re-run's check run hides nothing of the run before
    assert _stages(done) == ("completed", "failure") and done["id"] == queued["id"]
    assert _stages(rerun) == ("queued", None) and rerun["external_id"] == str(second)
    # the same event delivered again is the same run; GitHub's created/completed events run nothing
    assert run_of(world.client, world.post("check_run", _rerequest(done, world.base))) == second
    ignored = world.post("check_run", {**_rerequest(done, world.base), "action": "completed"})
    assert ignored.status_code == 202 and ignored.json()["status"] != "queued"
    # a fork's check run (GitHub lists no pull request) on an untracked branch: nothing is run
    fork = world.post("check_run", _rerequest({**done, "id": done["id"] + 1}, world.base, pull_requests=False))
    assert fork.json()["status"] != "queued"


def test_with_a_token_no_check_run_is_attempted(httpserver: HTTPServer):
    """GitHub refuses check runs from a personal token: the reporter does not send them (nor drop them)."""
    from service.github.outbox import MemoryOutbox
    from service.github.reporter import StatusReporter

    gh = GitHubStandIn(httpserver)
    client = GitHubStatusClient(httpserver.url_for("/"), GITHUB_TOKEN, timeout=2.0, attempts=1)
    reporter = StatusReporter(MemoryOutbox(), client, public_url="https://ci.example.com", reports=ALL)
    reporter.queued(3, REPO, sha("token-only"))
    reporter.awaiting(4, REPO, sha("token-awaiting"))
    while reporter.drain():
        pass
    assert len(gh.statuses) == 2 and not any("check-runs" in path for _, path in gh.requests)
    assert reporter.outbox.dead() == [] and reporter.outbox.pending_count() == 0


def _suite_rerequest(head: str, base: str, updated_at: str, pull_requests: bool = True, branch: str = "feature/resize",
                     suite_id: int = 9001, before: str | None = None, app_id: int = int(APP_ID)) -> dict[str, Any]:
    """A ``check_suite`` ``rerequested`` payload (GitHub's "Re-run all checks") as GitHub sends it to the App."""
    prs = [{"number": PR, "head": {"sha": head, "ref": branch, "repo": {"full_name": REPO}},
            "base": {"sha": base, "ref": "main", "repo": {"full_name": REPO}}}] if pull_requests else []
    return {"action": "rerequested", "repository": {"full_name": REPO}, "installation": {"id": 4242},
            "sender": {"login": "maintainer"},
            "check_suite": {"id": suite_id, "head_branch": branch, "head_sha": head, "before": before, "after": head,
                            "status": "queued", "conclusion": None, "pull_requests": prs,
                            "app": {"id": app_id, "slug": "ampci-test"}, "created_at": "2026-12-03T10:00:00Z",
                            "updated_at": updated_at, "latest_check_runs_count": 1}}


@pytest.mark.postgres
@pytest.mark.redis
def test_rerun_all_checks_on_github_starts_a_new_run_of_that_head(world: World):
    head = sha("live-suite-rerun")
    first = run_of(world.client, world.post("pull_request", pr_payload(head, world.base, number=PR)))
    [queued] = world.settle()
    world.finish(first, head, {("mlp_small", "fp16")})
    world.reporter.check_watched(world.store)
    again = _suite_rerequest(head, world.base, "2026-12-03T10:05:00Z")
    second = run_of(world.client, world.post("check_suite", again))
    assert second != first
    run = world.store.get_run(second)
    assert run.revision_sha == head and run.trigger == "pull_request" and run.meta["github"]["pr"] == PR
    assert run.baseline_sha == world.base and run.meta["github"]["installation"] == 4242
    done, rerun = world.settle()  # a new check run for the new run; the first one keeps its verdict
    assert _stages(done) == ("completed", "failure") and done["id"] == queued["id"]
    assert _stages(rerun) == ("queued", None) and rerun["external_id"] == str(second) and rerun["head_sha"] == head
    # the same delivery again is the same run; the next "Re-run all checks" of that suite (GitHub queues the
    # suite again: a new updated_at) is a new run
    assert run_of(world.client, world.post("check_suite", again)) == second
    third = run_of(world.client, world.post("check_suite", _suite_rerequest(head, world.base, "2026-12-03T10:09:00Z")))
    assert third not in (first, second) and world.store.get_run(third).revision_sha == head
    # GitHub's requested/completed suite events run nothing
    for action in ("requested", "completed"):
        ignored = world.post("check_suite", {**again, "action": action})
        assert ignored.status_code == 202 and ignored.json()["status"] != "queued"
    # a tracked branch's head (no pull request) ampci never saw pushed there -- as a fork's pull request, which
    # GitHub does not list and whose suite names the fork's own branch, here "main" -- is not run
    pushed = sha("live-suite-push")
    suite_of_pushed = _suite_rerequest(pushed, world.base, "2026-12-03T10:10:00Z", pull_requests=False,
                                       branch="main", before=world.base)
    unseen = world.post("check_suite", suite_of_pushed)
    assert unseen.status_code == 202
    drain(world.client)
    delivery = world.store.get_delivery(unseen.json()["delivery"])
    assert delivery is not None and delivery.status == "rejected" and delivery.run_id is None, delivery
    assert "never ran as a push to main" in (delivery.reason or "")
    assert not [r for r in world.store.list_runs(limit=500) if r.revision_sha == pushed]
    # once pushed to main (a signed push delivery), the same re-run is a push run against the suite's `before`
    original = run_of(world.client, world.post("push", push_payload(pushed, world.base)))
    push_run = run_of(world.client, world.post("check_suite", {
        **suite_of_pushed, "check_suite": {**suite_of_pushed["check_suite"], "updated_at": "2026-12-03T10:12:00Z"}}))
    run = world.store.get_run(push_run)
    assert push_run != original
    assert run.trigger == "push" and run.revision_sha == pushed and run.baseline_sha == world.base
    # a head that is neither a pull request of the repository nor on a tracked branch: nothing is run
    fork = world.post("check_suite", _suite_rerequest(sha("live-suite-fork"), world.base, "2026-12-03T10:11:00Z",
                                                      pull_requests=False))
    assert fork.status_code == 202 and fork.json()["status"] != "queued"


def test_a_rerun_tests_the_repository_that_asked_for_it_and_only_ampcis_checks():
    """Both re-runs carry the repository's clone URL (the run's pass repository with AMPCI_PASS_REPO unset), are
    refused for a repository outside the allowlist, and a suite of another App runs nothing."""
    url = f"https://github.com/{REPO}.git"
    settings = Settings(allowed_repos=REPO, tracked_branches="main", github_app_id=APP_ID)
    head, base = sha("suite-unit-head"), sha("suite-unit-base")
    suite = _suite_rerequest(head, base, "2026-12-03T10:00:00Z")
    suite["repository"]["clone_url"] = url
    check = _rerequest({"id": 5, "name": "ampci smoke", "head_sha": head, "external_id": "1"}, base)
    check["repository"]["clone_url"] = url
    for event, payload in (("check_suite", suite), ("check_run", check)):
        request = parse_event(event, encode(payload), settings)
        assert isinstance(request, RunRequest) and request.clone_url == url and request.installation == 4242
        assert request.head_sha == head and request.pr_number == PR
        pinned = parse_event(event, encode(payload), Settings(allowed_repos=REPO, pass_repo="/srv/mirror.git"))
        assert isinstance(pinned, RunRequest) and pinned.clone_url is None  # AMPCI_PASS_REPO set: it wins
        bad = {**payload, "repository": {"full_name": REPO, "clone_url": "ext::sh -c id"}}
        with pytest.raises(PayloadError, match="repository.clone_url: .*transport helper"):
            parse_event(event, encode(bad), settings)
        with pytest.raises(RepositoryNotAllowedError):
            parse_event(event, encode(payload), Settings(allowed_repos="acme/other", tracked_branches="main"))
    other_app = _suite_rerequest(head, base, "2026-12-03T10:00:00Z", app_id=int(APP_ID) + 1)
    decision = parse_event("check_suite", encode(other_app), settings)
    assert isinstance(decision, Ignored) and "another App" in decision.reason
    with pytest.raises(PayloadError, match="check_suite.head_sha"):
        parse_event("check_suite", encode({**suite, "check_suite": {**suite["check_suite"], "head_sha": "main"}}),
                    settings)
    # the same suite re-run at two times: two changes; the same re-run re-serialised: one
    keys = {parse_event("check_suite", encode(_suite_rerequest(head, base, when)), settings).dedup_key  # type: ignore[union-attr]
            for when in ("2026-12-03T10:00:00Z", "2026-12-03T10:00:00+00:00", "2026-12-03T11:00:00Z")}
    assert len(keys) == 2
