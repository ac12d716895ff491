"""The double fault of issue 17: the worker running a job is SIGKILLed while Redis restarts empty (its
AOF lost).  The running job's message is then in no queue and not unacked, so no redelivery can ever
come from the broker; ``ampci reconcile --grace 0`` re-sends it once its lease has expired (with the
queued jobs that were lost too), and a new worker finishes the run with exactly one result per job.

Real Celery workers (prefork), a private redis-server, the real PostgreSQL; processes stopped by pid.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import pytest
import sqlalchemy as sa

from service.orchestration import reconcile as rc
from service.orchestration.scheduler import SweepConfig, open_store, start_sweep, wait_for_run
from tests.distributed.procs import ROOT

pytestmark = [pytest.mark.celery, pytest.mark.redis, pytest.mark.postgres, pytest.mark.slow]


def _results_per_job(url: str, run_id: int) -> dict[str, int]:
    eng = sa.create_engine(url)
    with eng.connect() as c:
        rows = c.execute(sa.text("select model, count(*) from results where run_id = :r group by model"),
                         {"r": run_id}).all()
    eng.dispose()
    return {r[0]: int(r[1]) for r in rows}


def _reconcile(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "service.cli.main", "reconcile", "--grace", "0"], cwd=ROOT,
                          env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)


def test_worker_killed_while_redis_restarts_empty_the_run_still_finishes(
        cluster_settings: Any, cluster_env: dict[str, str], start_worker: Any, fresh_redis: Any) -> None:
    models = ["noop_a", "noop_b", "noop_c", "noop_d"]
    a = start_worker("wa", extra_env={"AMPCI_TEST_NOOP_DELAY": "60"})
    a.wait_ready()
    store = open_store(cluster_settings)
    cfg = SweepConfig(name="t", models=tuple(models), dtypes=("fp16",), policies=("default",), targets=("cpu",),
                      repeats=6)
    started = start_sweep(cluster_settings, cfg, "main", catalog={m: {"test"} for m in models}, store=store)
    deadline = time.monotonic() + 60
    while not any(j.status == "running" and (j.worker or "").startswith("wa@") for j in store.jobs(started.run_id)):
        assert time.monotonic() < deadline, a.log.read_text()[-3000:]
        time.sleep(0.1)
    victim = next(j for j in store.jobs(started.run_id) if j.status == "running")

    a.sigkill()                                   # fault 1: the worker dies mid-job
    fresh_redis.kill()                            # fault 2: Redis restarts with nothing (AOF lost)
    for leftover in fresh_redis.dir.glob("appendonly*"):
        if leftover.is_dir():
            for f in leftover.iterdir():
                f.unlink()
            leftover.rmdir()
        else:
            leftover.unlink()
    fresh_redis.start()

    early = _reconcile(cluster_env)               # the queued jobs at once; the running one keeps its lease
    assert early.returncode == 0, early.stderr
    assert f"re-sent job {victim.id} " not in early.stdout and "re-sent job" in early.stdout, early.stdout
    assert store.get_job(victim.id).status == "running" and store.get_job(victim.id).attempts == 1

    lease = rc.job_lease_s(cluster_settings)
    while (store.clock() - store.get_job(victim.id).started_at).total_seconds() <= lease:
        time.sleep(0.5)
    late = _reconcile(cluster_env)
    assert late.returncode == 0, late.stderr
    assert f"re-sent job {victim.id} " in late.stdout and "past its lease" in late.stdout, late.stdout

    b = start_worker("wb", extra_env={"AMPCI_TEST_NOOP_DELAY": "0.1"})
    b.wait_ready()
    run = wait_for_run(store, started.run_id, timeout=120)
    assert run.status == "complete", [(j.model, j.status, j.attempts) for j in store.jobs(started.run_id)]
    jobs = {j.model: j for j in store.jobs(started.run_id)}
    assert all(j.status == "done" for j in jobs.values())
    assert jobs[victim.model].attempts == 2 and jobs[victim.model].worker.startswith("wb@")
    assert _results_per_job(cluster_env["AMPCI_DATABASE_URL"], started.run_id) == {m: 1 for m in models}
    assert "nothing to re-send" in _reconcile(cluster_env).stdout
    store.dispose()
