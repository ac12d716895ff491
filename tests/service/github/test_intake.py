"""The webhook intake: pending deliveries become runs off the request path, survive restarts and
failures, and never become two runs (real PostgreSQL store, real Redis job queue)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from service.api.dispatch import RunDispatcher
from service.github.intake import WebhookIntake
from tests.service.api.conftest import test_planner
from tests.service.api.helpers import drain, encode, push_payload, sha, webhook_headers

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


def _post(client: Any, delivery: str, head: str) -> Any:
    body = encode(push_payload(head))
    return client.post("/webhooks/github", content=body, headers=webhook_headers(body, "push", delivery=delivery))


def _queued(redis_url: str, queue: str) -> int:
    return int(redis.Redis.from_url(redis_url).llen(queue))


def test_deliveries_stored_while_the_intake_is_stopped_are_processed_after_start(
        make_client, store, queue, redis_url):
    stopped = make_client()  # background=False: nothing processes what it stores (a crashed server)
    ids = [f"d-restart-{i}" for i in range(3)]
    for i, d in enumerate(ids):
        assert _post(stopped, d, sha(f"restart-{i}")).status_code == 202
    assert [store.get_delivery(d).status for d in ids] == ["pending"] * 3
    assert store.list_runs() == [] and _queued(redis_url, queue) == 0

    restarted = make_client(background=True)  # the lifespan starts the intake, which picks them up
    deadline = time.monotonic() + 30
    while store.count_pending_deliveries() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert restarted.app.state.ctx.webhook.intake.running
    got = [store.get_delivery(d) for d in ids]
    assert [g.status for g in got] == ["accepted"] * 3 and all(g.run_id for g in got)
    runs = store.list_runs()
    assert sorted(r.id for r in runs) == sorted(g.run_id for g in got)  # one run per delivery
    assert all(r.dedup_key.startswith("github-change:") for r in runs)  # keyed by the change
    assert _queued(redis_url, queue) == 3 * 4
    again = _post(restarted, ids[0], sha("restart-0"))  # GitHub's redelivery afterwards
    assert again.status_code == 200 and again.json()["run_id"] == got[0].run_id


def test_a_dispatch_failure_leaves_the_delivery_pending_and_a_retry_sends_the_jobs(
        make_client, make_settings, store, queue, redis_url):
    settings = make_settings()
    real = RunDispatcher(settings, store, planner=test_planner(queue))
    calls = {"n": 0}

    def flaky(s: Any, rev: str, jobs: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ConnectionError("broker down")
        real.dispatch(s, rev, jobs)

    client = make_client(settings, dispatcher=RunDispatcher(settings, store, planner=test_planner(queue),
                                                            dispatch=flaky))
    assert _post(client, "d-flaky", sha("flaky")).status_code == 202
    assert drain(client) == 0
    assert store.get_delivery("d-flaky").status == "pending"  # nothing lost, nothing half-accepted
    (run,) = store.list_runs()  # the run exists once ...
    assert _queued(redis_url, queue) == 0  # ... but none of its jobs was sent
    intake = client.app.state.ctx.webhook.intake
    intake._retry.clear()  # the backoff has passed
    assert drain(client) == 1
    got = store.get_delivery("d-flaky")
    assert (got.status, got.run_id) == ("accepted", run.id)
    assert [r.id for r in store.list_runs()] == [run.id] and _queued(redis_url, queue) == 4


def test_an_unknown_sweep_is_rejected_with_the_reason(make_client, make_settings, store):
    from service.orchestration.scheduler import SweepConfigError

    def planner(sweep: str) -> Any:
        raise SweepConfigError(f"unknown sweep {sweep!r}")

    settings = make_settings()
    client = make_client(settings, dispatcher=RunDispatcher(settings, store, planner=planner))
    assert _post(client, "d-nosweep", sha("nosweep")).status_code == 202
    assert drain(client) == 1
    got = store.get_delivery("d-nosweep")
    assert got.status == "rejected" and "unknown sweep 'smoke'" in got.reason and store.list_runs() == []


def test_two_intakes_never_make_two_runs_of_one_delivery(make_client, make_settings, store, queue, redis_url):
    settings = make_settings()
    client = make_client(settings)
    ids = [f"d-race-{i}" for i in range(24)]
    for i, d in enumerate(ids):
        assert _post(client, d, sha(f"race-{i}")).status_code == 202
    intakes = [WebhookIntake(store, RunDispatcher(settings, store, planner=test_planner(queue)), batch_size=5)
               for _ in range(3)]
    counts: list[int] = []
    threads = [threading.Thread(target=lambda i=i: counts.append(i.drain())) for i in intakes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sum(counts) == len(ids)  # each delivery settled by exactly one intake (row locks)
    run_ids = sorted(r.id for r in store.list_runs(limit=100))
    assert len(run_ids) == len(ids) and run_ids == sorted(store.get_delivery(d).run_id for d in ids)
    assert _queued(redis_url, queue) == len(ids) * 4  # and its jobs sent once
    assert {store.get_delivery(d).status for d in ids} == {"accepted"}


def _failing_client(make_client, make_settings, store, exc: BaseException) -> Any:
    def planner(sweep: str) -> Any:
        raise exc

    settings = make_settings()
    return make_client(settings, dispatcher=RunDispatcher(settings, store, planner=planner))


def _attempt(client: Any) -> None:
    client.app.state.ctx.webhook.intake._retry.clear()  # the backoff has passed
    drain(client)


def test_a_value_the_database_refuses_is_rejected_at_once_with_the_reason(make_client, make_settings, store):
    import sqlalchemy as sa

    refused = sa.exc.DataError("INSERT …", {}, Exception("value too long for type character varying(200)"))
    client = _failing_client(make_client, make_settings, store, refused)
    assert _post(client, "d-data", sha("data")).status_code == 202
    _attempt(client)
    got = store.get_delivery("d-data")
    assert got.status == "rejected" and "value too long" in got.reason, got
    assert store.count_pending_deliveries() == 0 and store.list_runs() == []


def test_an_unexpected_error_is_retried_a_bounded_number_of_times_then_failed(
        make_client, make_settings, store, queue):
    settings = make_settings()
    real = RunDispatcher(settings, store, planner=test_planner(queue))

    def buggy(s: Any, rev: str, jobs: Any) -> None:
        if rev == sha("bug"):
            raise RuntimeError("a bug in dispatching")
        real.dispatch(s, rev, jobs)

    client = make_client(settings, dispatcher=RunDispatcher(settings, store, planner=test_planner(queue),
                                                            dispatch=buggy))
    intake = client.app.state.ctx.webhook.intake
    assert _post(client, "d-bug", sha("bug")).status_code == 202
    assert _post(client, "d-fine", sha("fine")).status_code == 202
    for _ in range(intake.max_attempts - 1):
        _attempt(client)
        assert store.get_delivery("d-bug").status == "pending"
        assert store.get_delivery("d-fine").status == "accepted"  # the others keep being processed
    _attempt(client)
    got = store.get_delivery("d-bug")
    assert got.status == "failed" and "failed after 5 attempts" in got.reason and "a bug in dispatching" in got.reason
    assert store.count_pending_deliveries() == 0
    # visible in the API; a redelivery of a failed delivery is processed again
    listed = client.get("/api/deliveries", params={"status": "failed"}).json()["deliveries"]
    assert [(d["delivery_id"], d["status"]) for d in listed] == [("d-bug", "failed")] and listed[0]["reason"]
    assert len(client.get("/api/deliveries").json()["deliveries"]) == 2
    assert client.get("/api/deliveries", params={"status": "nope"}).status_code == 422
    assert _post(client, "d-bug", sha("bug")).status_code == 202
    assert store.get_delivery("d-bug").status == "pending"


def test_infrastructure_errors_are_retried_without_bound(make_client, make_settings, store):
    client = _failing_client(make_client, make_settings, store, ConnectionError("broker down"))
    assert _post(client, "d-down", sha("down")).status_code == 202
    for _ in range(12):
        _attempt(client)
    assert store.get_delivery("d-down").status == "pending"


def test_ampci_deliveries_lists_rejected_ones_with_the_reason(make_client, store, pg_url, monkeypatch, capsys):
    import json

    from service.cli.main import main

    client = make_client()
    body = encode({**push_payload(sha("cli")), "ref": "refs/heads/x\x01y"})
    assert client.post("/webhooks/github", content=body,
                       headers=webhook_headers(body, "push", delivery="d-cli")).status_code == 400
    assert _post(client, "d-cli-ok", sha("cli-ok")).status_code == 202
    monkeypatch.setenv("AMPCI_DATABASE_URL", pg_url)
    assert main(["deliveries", "--status", "rejected", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["delivery_id"], r["status"]) for r in rows] == [("d-cli", "rejected")]
    assert "control character" in rows[0]["reason"]
    assert main(["deliveries"]) == 0
    out = capsys.readouterr().out
    assert "d-cli" in out and "d-cli-ok" in out and "pending" in out
    with pytest.raises(SystemExit) as refused:  # argparse's one-line usage error (issue 24: typed options)
        main(["deliveries", "--status", "bogus"])
    assert refused.value.code == 2 and "unknown delivery status" in capsys.readouterr().err
