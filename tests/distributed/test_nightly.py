"""Nightly sweeps: at most one run per (UTC date, sweep), also with two beats racing; the Celery task path."""

from __future__ import annotations

import threading
from datetime import date

import pytest
import redis

from service.orchestration import scheduler
from service.settings import Settings
from tests.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.celery]


def _queued(url: str, queue: str = "cpu") -> int:
    return int(redis.Redis.from_url(url).llen(queue))


def test_nightly_is_deduplicated_per_date_and_sweep(cluster_settings: Settings, fresh_redis) -> None:
    planned = len(scheduler.load_sweep(sweep="smoke").expand(scheduler.zoo_catalog()))
    day = date(2026, 1, 2)
    results: list[int | None] = []

    def beat() -> None:
        results.append(scheduler.start_nightly(cluster_settings, "smoke", day=day, ref="main"))

    threads = [threading.Thread(target=beat) for _ in range(3)]  # three beat instances at once
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    created = [r for r in results if r is not None]
    assert len(results) == 3 and len(created) == 1
    assert scheduler.start_nightly(cluster_settings, "smoke", day=day, ref="main") is None  # a restart
    assert _queued(fresh_redis.url) == planned  # jobs were enqueued once
    store = scheduler.open_store(cluster_settings)
    run = store.get_run(created[0])
    assert run.trigger == "nightly" and run.dedup_key == "nightly:2026-01-02:smoke"
    other = scheduler.start_nightly(cluster_settings, "smoke", day=date(2026, 1, 3), ref="main")
    assert other is not None and store.get_run(other).baseline_sha == run.revision_sha


def test_nightly_task_runs_on_the_control_queue(cluster_settings: Settings, cluster_env, start_worker,
                                                fresh_redis) -> None:
    from service.orchestration.celery_app import NIGHTLY_TASK, make_app

    w = start_worker("wn", queues="control")
    w.wait_ready()
    make_app(cluster_settings).send_task(NIGHTLY_TASK, args=["smoke"], queue="control")
    store = scheduler.open_store(cluster_settings)

    def log() -> str:
        return w.log.read_text()[-3000:]

    (run,) = wait_until(lambda: store.list_runs(trigger="nightly"), "the nightly run", detail=log)
    assert run.dedup_key and run.dedup_key.endswith(":smoke") and run.dedup_key.startswith("nightly:")
    # the run and its job rows are committed before the first message is sent: wait for all of them
    planned = len(store.jobs(run.id))
    assert planned > 0
    wait_until(lambda: _queued(fresh_redis.url) == planned, f"{planned} jobs on the cpu queue", detail=log)
