"""Job leases: a job left ``running`` by a worker that is gone is re-sent by reconcile once its lease
(the broker's visibility timeout, longer than AMPCI_JOB_TIMEOUT) and the grace have passed and its
message is in no queue nor unacked; the re-delivery counts an attempt (poison jobs still end crashed).

Real database (both kinds), real Redis under a key prefix of this test only (so other tests'
messages, whose job ids may collide with ours, are not seen), the real Celery producer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from service.cli.reconcile_cmd import describe
from service.db import Store
from service.db.migrate import upgrade
from service.orchestration import reconcile as rc
from service.settings import Settings
from tests.service.factories import sha

pytestmark = [pytest.mark.redis]

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
GRACE = 30.0


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def broker(redis_url: str, unique_prefix: str) -> Iterator[tuple[Any, str]]:
    """(redis client, key prefix); every key under the prefix is deleted afterwards."""
    import redis

    client = redis.Redis.from_url(redis_url)
    prefix = unique_prefix + ":"
    yield client, prefix
    for key in client.scan_iter(f"{prefix}*"):
        client.delete(key)
    client.close()


def _setup(db_url: str, redis_url: str, prefix: str, max_attempts: int = 3) -> tuple[Settings, Store, Clock, Any]:
    from service.orchestration.celery_app import make_app

    upgrade(db_url)
    settings = Settings(database_url=db_url, broker_url=redis_url, job_timeout=100.0, max_attempts=max_attempts)
    clock = Clock(T0)
    store = Store.from_url(db_url, clock=clock)
    app = make_app(settings)
    app.conf.broker_transport_options = {**(app.conf.broker_transport_options or {}), "global_keyprefix": prefix}
    return settings, store, clock, app


def _queued(client: Any, prefix: str, queue: str) -> list[int]:
    keys = rc.BrokerKeys.from_options({"global_keyprefix": prefix})
    return [rc.run_job_id(json.loads(raw)) for key in keys.lists(queue) for raw in client.lrange(key, 0, -1)]


def test_running_job_past_its_lease_is_resent_once(db_url: str, redis_url: str, broker: tuple[Any, str]) -> None:
    client, prefix = broker
    settings, store, clock, app = _setup(db_url, redis_url, prefix)
    try:
        lease = rc.job_lease_s(settings)
        assert lease > settings.job_timeout  # a live delivery is killed by its hard limit before its lease ends
        rev = sha(7)
        store.upsert_revision(rev)
        run = store.create_run_with_jobs(rev, "manual", None, "t", [("m0", "fp16", "default", "cpu"),
                                                                     ("m1", "fp16", "default", "cpu")])
        victim, done = run.jobs
        store.start_attempt(victim.id, "dead-host:1")   # the worker that will vanish, with its message
        store.start_attempt(done.id, "w:2")
        from tests.service.factories import make_result

        store.write_result(run.run_id, make_result(("m1", "fp16", "default", "cpu")), job_id=done.id)

        clock.now = T0 + timedelta(seconds=lease + GRACE - 1)  # still within lease + grace: left alone
        inspection = rc.lost_jobs(settings, store, app, GRACE, client)
        assert inspection.lost == () and inspection.stale == ()

        clock.now = T0 + timedelta(seconds=lease + GRACE + 1)
        report = rc.reconcile(settings, store, app, GRACE, client=client)
        assert [(x.job.id, x.stale) for x in report.lost] == [(victim.id, True)] and report.resent == (victim.id,)
        assert report.inspection.stale == (victim.id,) and report.inspection.candidates == ()
        assert _queued(client, prefix, "cpu") == [victim.id]
        lines = describe(report)
        assert "1 running job(s) past their lease" in lines[0]
        assert any(f"re-sent job {victim.id}" in ln and "running on dead-host:1 past its lease" in ln for ln in lines)
        assert report.to_dict()["stale_running"] == [victim.id]

        again = rc.reconcile(settings, store, app, GRACE, client=client)  # its message is in the queue now
        assert again.resent == () and again.inspection.stale == (victim.id,)
        assert _queued(client, prefix, "cpu") == [victim.id]
        assert "nothing to re-send" in describe(again)

        client.delete(*rc.BrokerKeys.from_options({"global_keyprefix": prefix}).lists("cpu"))
        clock.now = T0 + timedelta(seconds=lease + GRACE + 5)
        store.start_attempt(victim.id, "w:3")  # a new delivery started: a fresh lease
        assert rc.lost_jobs(settings, store, app, GRACE, client).stale == ()
    finally:
        store.dispose()


def test_a_job_in_unacked_or_of_a_local_run_is_never_resent(db_url: str, redis_url: str,
                                                             broker: tuple[Any, str]) -> None:
    client, prefix = broker
    settings, store, clock, app = _setup(db_url, redis_url, prefix)
    try:
        rev = sha(8)
        store.upsert_revision(rev)
        held = store.create_run_with_jobs(rev, "manual", None, "t", [("a", "fp16", "default", "cpu")]).jobs[0]
        local = store.create_run_with_jobs(rev, "manual", None, "t", [("b", "fp16", "default", "cpu")],
                                           dispatch="local").jobs[0]
        for job in (held, local):
            store.start_attempt(job.id, "w:1")
        message = {"body": json.dumps([[held.id, rev], {}, {}]), "content-type": "application/json",
                   "headers": {"task": "ampci.run_job"}, "properties": {}}
        keys = rc.BrokerKeys.from_options({"global_keyprefix": prefix})
        client.hset(keys.unacked_key, "tag", json.dumps([message, "", "cpu"]))  # a worker still holds it
        clock.now = T0 + timedelta(seconds=rc.job_lease_s(settings) + GRACE + 60)
        report = rc.reconcile(settings, store, app, GRACE, client=client)
        assert report.inspection.stale == (held.id,) and report.resent == ()
        assert report.inspection.local == (local.id,)
        assert _queued(client, prefix, "cpu") == []
    finally:
        store.dispose()


def test_a_poison_job_resent_past_its_lease_still_ends_crashed(db_url: str, redis_url: str,
                                                               broker: tuple[Any, str]) -> None:
    """Every delivery counts: after max_attempts deliveries whose workers died, the re-sent one ends it."""
    from service.orchestration.tasks import execute_job

    client, prefix = broker
    settings, store, clock, app = _setup(db_url, redis_url, prefix, max_attempts=2)
    try:
        rev = sha(9)
        store.upsert_revision(rev)
        run = store.create_run_with_jobs(rev, "manual", None, "t", [("p", "fp16", "default", "cpu")])
        job = run.jobs[0]
        for attempt in range(settings.max_attempts):  # each delivery's worker died mid-job
            store.start_attempt(job.id, f"dead:{attempt}")
            clock.now += timedelta(seconds=rc.job_lease_s(settings) + GRACE + 1)
            assert rc.reconcile(settings, store, app, GRACE, client=client).resent == (job.id,)
            client.delete(*rc.BrokerKeys.from_options({"global_keyprefix": prefix}).lists("cpu"))  # "taken"
        assert execute_job(job.id, settings, worker="w:last", store=store) == "crashed"
        final = store.get_job(job.id)
        assert final.status == "crashed" and final.attempts == settings.max_attempts + 1
        assert store.get_run(run.run_id).status in ("complete", "partial", "failed")
        assert [r.status for r in store.results(run_id=run.run_id)] == ["crashed"]
        clock.now += timedelta(days=1)
        assert rc.reconcile(settings, store, app, GRACE, client=client).inspection.stale == ()
    finally:
        store.dispose()


def test_reconcile_report_names_stale_jobs() -> None:
    report = rc.ReconcileReport(rc.Inspection(stale=(4,), lease_s=13.0), grace_s=0.0)
    assert report.to_dict()["stale_running"] == [4] and report.to_dict()["lease_s"] == 13.0
    assert describe(report)[0].startswith("0 queued job(s) never delivered and older than 0s, 1 running job(s)")
