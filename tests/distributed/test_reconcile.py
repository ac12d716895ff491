"""Lost job messages are re-sent: a private Redis, the real PostgreSQL, real Celery workers and beat.

A lost message is simulated the way it happens: the run and its jobs are created by the real
``start_sweep`` and then one job's message is removed from the Redis list (what a Redis crash in
kombu's pop-to-unacked window, or a sender dying after committing the job rows, leaves behind).
Jobs are made older than the grace period by moving their ``queued_at`` back.  Every process is
started by these tests and stopped by pid.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from service.orchestration import reconcile as rc
from service.orchestration import scheduler
from service.orchestration.scheduler import SweepConfig, celery_app, open_store, start_sweep, wait_for_run
from service.settings import Settings
from tests.distributed.procs import ROOT, free_port, stop
from tests.waiting import SAFETY_NET_S

pytestmark = [pytest.mark.celery, pytest.mark.redis, pytest.mark.postgres]

UNACKED = "unacked"   # kombu's Redis transport: the hash of delivered, unacknowledged messages


def _lists(queue: str) -> list[str]:
    """kombu's Redis list keys of ``queue``: the name (priority 0), then one per priority step."""
    return [queue, *(f"{queue}\x06\x16{p}" for p in (3, 6, 9))]


def _start(settings: Settings, models: list[str], targets: tuple[str, ...] = ("cpu",)) -> tuple[Any, Any]:
    cfg = SweepConfig(name="t", models=tuple(models), dtypes=("fp16",), policies=("default",), targets=targets,
                      repeats=6)
    store = open_store(settings)
    started = start_sweep(settings, cfg, "main", catalog={m: {"test"} for m in models}, store=store)
    return store, started


def _queued_ids(url: str, queue: str = "cpu") -> Counter[int]:
    """Job ids of the run_job messages in the queue's lists (all priorities), with multiplicity."""
    r = redis.Redis.from_url(url)
    ids: Counter[int] = Counter()
    for key in _lists(queue):
        for raw in r.lrange(key, 0, -1):
            job_id = rc.run_job_id(json.loads(raw))
            if job_id is not None:
                ids[job_id] += 1
    return ids


def _unacked_ids(url: str) -> Counter[int]:
    r = redis.Redis.from_url(url)
    return Counter(rc.run_job_id(json.loads(raw)[0]) for raw in r.hvals(UNACKED))


def _lose(url: str, job_id: int, queue: str = "cpu") -> None:
    """Remove the message of ``job_id`` from the queue list, as a broker crash would."""
    r = redis.Redis.from_url(url)
    for raw in r.lrange(queue, 0, -1):
        if rc.run_job_id(json.loads(raw)) == job_id:
            assert r.lrem(queue, 1, raw) == 1
            return
    raise AssertionError(f"no message of job {job_id} in {queue}")


def _age(db_url: str, run_id: int, seconds: int) -> None:
    """Move the run's jobs' ``queued_at`` ``seconds`` into the past."""
    eng = sa.create_engine(db_url)
    with eng.begin() as c:
        c.execute(sa.text("update jobs set queued_at = queued_at - make_interval(secs => :s) where run_id = :r"),
                  {"s": seconds, "r": run_id})
    eng.dispose()


def _job_rows(store: Any, run_id: int) -> list[tuple[int, str, int]]:
    return [(j.id, j.status, j.attempts) for j in store.jobs(run_id)]


def _cli(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "service.cli.main", "reconcile", *args], cwd=ROOT,
                          env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_beat_resends_only_the_lost_job_and_a_worker_completes_the_run(
        cluster_settings, cluster_env, start_worker, fresh_redis, tmp_path: Path) -> None:
    store, started = _start(cluster_settings, ["noop_a", "noop_b", "noop_c"])
    jobs = {j.model: j.id for j in store.jobs(started.run_id)}
    _lose(fresh_redis.url, jobs["noop_b"])
    _age(cluster_env["AMPCI_DATABASE_URL"], started.run_id, 3600)
    assert _queued_ids(fresh_redis.url) == Counter([jobs["noop_a"], jobs["noop_c"]])

    env = {**cluster_env, "AMPCI_RECONCILE_EVERY": "1s", "AMPCI_RECONCILE_GRACE": "60s"}
    control = start_worker("wctl", queues="control", extra_env=env)
    log = open(tmp_path / "beat.log", "ab")
    beat = subprocess.Popen([sys.executable, "-m", "service.cli.main", "beat", "--schedule-file",
                             str(tmp_path / "beat-schedule")], cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    try:
        control.wait_ready()
        deadline = time.monotonic() + SAFETY_NET_S
        while _queued_ids(fresh_redis.url) != Counter(jobs.values()):  # the lost one is back, once
            assert time.monotonic() < deadline, (_queued_ids(fresh_redis.url),
                                                 (tmp_path / "beat.log").read_text()[-2000:],
                                                 control.log.read_text()[-3000:])
            assert beat.poll() is None, (tmp_path / "beat.log").read_text()[-3000:]
            time.sleep(0.2)
        time.sleep(2.5)  # more beat periods: nothing present is ever re-sent
        assert _queued_ids(fresh_redis.url) == Counter(jobs.values())
        assert _job_rows(store, started.run_id) == [(i, "queued", 0) for i in sorted(jobs.values())]

        cpu = start_worker("wcpu", queues="cpu", extra_env={"AMPCI_TEST_NOOP_DELAY": "0.1"})
        cpu.wait_ready()
        run = wait_for_run(store, started.run_id, timeout=SAFETY_NET_S)
        assert run.status == "complete"
        assert all(j.status == "done" and j.attempts == 1 for j in store.jobs(started.run_id))
        assert sorted(r.model for r in store.results(run_id=started.run_id)) == ["noop_a", "noop_b", "noop_c"]
        time.sleep(2.5)  # beat keeps running: a finished run gets no messages
        assert not _queued_ids(fresh_redis.url)
    finally:
        stop(beat)


def test_jobs_in_a_queue_list_or_unacked_are_never_resent(cluster_settings, cluster_env, fresh_redis) -> None:
    store, started = _start(cluster_settings, [f"noop_{c}" for c in "abcde"])
    ids = {j.model[-1]: j.id for j in store.jobs(started.run_id)}
    app = celery_app(cluster_settings)
    conn = app.connection_for_write()
    try:
        held = conn.default_channel.basic_get("cpu", no_ack=False)   # kombu moves it to `unacked`
        held_id = held.decode()[0][0]
        _lose(fresh_redis.url, ids["c"])
        _lose(fresh_redis.url, ids["d"])                               # ... and d goes to a priority sub-list
        app.send_task("ampci.run_job", args=[ids["d"], started.revision], queue="cpu", priority=7)
        _age(cluster_env["AMPCI_DATABASE_URL"], started.run_id, 3600)
        assert _unacked_ids(fresh_redis.url) == Counter([held_id])
        assert redis.Redis.from_url(fresh_redis.url).llen("cpu\x06\x166") == 1

        assert rc.resend_lost_jobs(cluster_settings, store, grace_s=60) == [ids["c"]]
        expected = Counter(i for i in ids.values() if i != held_id)
        assert _queued_ids(fresh_redis.url) == expected and _unacked_ids(fresh_redis.url) == Counter([held_id])
        assert rc.resend_lost_jobs(cluster_settings, store, grace_s=60) == []       # now it is there
        assert _queued_ids(fresh_redis.url) == expected

        _lose(fresh_redis.url, ids["e"])                 # two reconcilers at once: one message
        barrier = threading.Barrier(2)
        reports: list[Any] = []

        def reconciler() -> None:
            own = open_store(cluster_settings)
            barrier.wait(10)
            reports.append(rc.reconcile(cluster_settings, own, grace_s=60))
            own.dispose()

        threads = [threading.Thread(target=reconciler) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(r.resent for r in reports) == [(), (ids["e"],)]
        assert _queued_ids(fresh_redis.url) == expected
        assert _job_rows(store, started.run_id) == [(i, "queued", 0) for i in sorted(ids.values())]
        held.ack()
    finally:
        conn.release()


def test_jobs_younger_than_the_grace_period_are_left_alone(cluster_settings, cluster_env, fresh_redis) -> None:
    store, started = _start(cluster_settings, ["noop_young", "noop_lost"])
    ids = {j.model: j.id for j in store.jobs(started.run_id)}
    _lose(fresh_redis.url, ids["noop_lost"])
    assert rc.resend_lost_jobs(cluster_settings, store) == []            # AMPCI_RECONCILE_GRACE: 300 s
    assert rc.resend_lost_jobs(cluster_settings, store, grace_s=120) == []
    assert _queued_ids(fresh_redis.url) == Counter([ids["noop_young"]])
    _age(cluster_env["AMPCI_DATABASE_URL"], started.run_id, 200)
    assert rc.resend_lost_jobs(cluster_settings, store) == []            # 200 s < 300 s
    assert rc.resend_lost_jobs(cluster_settings, store, grace_s=120) == [ids["noop_lost"]]
    assert _queued_ids(fresh_redis.url) == Counter(ids.values())


def test_cli_dry_run_sends_nothing_and_the_real_run_resends(cluster_settings, cluster_env, fresh_redis) -> None:
    store, started = _start(cluster_settings, ["noop_x", "noop_y"], targets=("cpu", "cuda"))
    ids = {(j.model, j.target): j.id for j in store.jobs(started.run_id)}
    lost = ids[("noop_y", "cuda")]
    _lose(fresh_redis.url, lost, queue="cuda")
    _age(cluster_env["AMPCI_DATABASE_URL"], started.run_id, 3600)
    before = (_queued_ids(fresh_redis.url, "cpu"), _queued_ids(fresh_redis.url, "cuda"))

    dry = _cli(cluster_env, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    out = json.loads(dry.stdout)
    assert out["dry_run"] and out["resent"] == [] and [x["job"]["id"] for x in out["lost"]] == [lost]
    assert sorted(out["candidates"]) == sorted(ids.values()) and {"cpu", "cuda", "control"} <= set(out["queues"])
    assert (_queued_ids(fresh_redis.url, "cpu"), _queued_ids(fresh_redis.url, "cuda")) == before
    text = _cli(cluster_env, "--dry-run")
    assert f"would re-send job {lost} " in text.stdout and "dry run: nothing sent" in text.stdout

    real = _cli(cluster_env)
    assert real.returncode == 0, real.stderr
    assert f"re-sent job {lost} (run {started.run_id}, noop_y/fp16/default) to queue cuda" in real.stdout
    assert _queued_ids(fresh_redis.url, "cuda") == before[1] + Counter([lost])
    assert _queued_ids(fresh_redis.url, "cpu") == before[0]
    again = _cli(cluster_env)
    assert "nothing to re-send" in again.stdout and _queued_ids(fresh_redis.url, "cuda")[lost] == 1


def test_unreachable_broker_is_one_line_and_changes_nothing(cluster_settings, cluster_env, fresh_redis) -> None:
    store, started = _start(cluster_settings, ["noop_p", "noop_q"])
    ids = {j.model: j.id for j in store.jobs(started.run_id)}
    _lose(fresh_redis.url, ids["noop_q"])
    _age(cluster_env["AMPCI_DATABASE_URL"], started.run_id, 3600)
    rows = _job_rows(store, started.run_id)
    down = {**cluster_env, "AMPCI_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0"}
    for args in ((), ("--dry-run",)):
        proc = _cli(down, *args, timeout=SAFETY_NET_S)  # it gives up on the broker: no retrying for ever
        assert proc.returncode == 3 and proc.stdout == ""
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ampci: error: cannot inspect the broker at redis://")
        assert "nothing re-sent" in lines[0]
    with pytest.raises(rc.BrokerInspectionError):
        rc.resend_lost_jobs(Settings.from_env(down), store, grace_s=60)
    assert _job_rows(store, started.run_id) == rows
    assert _queued_ids(fresh_redis.url) == Counter([ids["noop_p"]])


class DeadPool:
    """Stands in for the LocalPool of an embedded ``ampci sweep`` that died before running its
    jobs (or is still busy with others): takes the jobs, runs none."""

    submitted: list[int] = []

    def __init__(self, settings: Settings, store: Any, workers: int | None = None) -> None:
        assert settings.embedded

    def prestart(self, jobs: int | None = None) -> None:  # starts no worker
        pass

    def submit(self, jobs: Any) -> None:
        DeadPool.submitted.extend(j.id for j in jobs)

    def close(self) -> None:
        pass


def test_embedded_mode_jobs_in_the_shared_database_are_never_resent(
        cluster_settings, cluster_env, fresh_redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """An embedded-mode sweep (no broker) pointed at the distributed deployment's database: its
    queued jobs are in no broker queue either, yet reconcile neither counts them lost nor sends
    them to Celery, while a broker job in the same state is re-sent."""
    store, started = _start(cluster_settings, ["noop_d1", "noop_d2"])
    broker_ids = {j.model: j.id for j in store.jobs(started.run_id)}
    _lose(fresh_redis.url, broker_ids["noop_d2"])

    laptop = Settings.from_env({**cluster_env, "AMPCI_BROKER_URL": ""})
    monkeypatch.setattr(scheduler, "LocalPool", DeadPool)
    DeadPool.submitted = []
    local_store, local = _start(laptop, ["noop_l1", "noop_l2"])
    local_ids = sorted(j.id for j in local_store.jobs(local.run_id))
    local_store.dispose()
    assert DeadPool.submitted == local_ids and local.pool is not None
    for run_id in (started.run_id, local.run_id):
        _age(cluster_env["AMPCI_DATABASE_URL"], run_id, 3600)
    assert _queued_ids(fresh_redis.url) == Counter([broker_ids["noop_d1"]])

    dry = _cli(cluster_env, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    out = json.loads(dry.stdout)
    assert sorted(out["candidates"]) == sorted(broker_ids.values())
    assert [x["job"]["id"] for x in out["lost"]] == [broker_ids["noop_d2"]]
    assert out["local_not_resent"] == local_ids
    text = _cli(cluster_env, "--dry-run")
    assert f"(local, not re-sent): {', '.join(map(str, local_ids))}" in text.stdout

    report = rc.reconcile(cluster_settings, store, grace_s=60)
    assert report.resent == (broker_ids["noop_d2"],) and report.inspection.local == tuple(local_ids)
    assert rc.resend_lost_jobs(cluster_settings, store, grace_s=60) == []
    assert _queued_ids(fresh_redis.url) == Counter(broker_ids.values())   # no message for a local job
    assert _unacked_ids(fresh_redis.url) == Counter()
    assert _job_rows(store, local.run_id) == [(i, "queued", 0) for i in local_ids]
