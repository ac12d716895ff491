"""Real Celery workers, a private Redis and the real PostgreSQL: redelivery, restarts, poison jobs.

The jobs here are ``noop_*``/``poison_*`` test models (see hook_app.py): they check out the job's
pass revision for real and then return at once (or kill their worker), so what is tested is the
distributed machinery, not the conversion.  Each test is bounded by its ``wait_for_run`` timeout.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa

from service.orchestration.scheduler import SweepConfig, open_store, start_sweep, wait_for_run
from tests.distributed.conftest import git
from tests.waiting import wait_until

pytestmark = [pytest.mark.celery, pytest.mark.redis, pytest.mark.postgres, pytest.mark.slow]


def _sweep(models: list[str], name: str = "t") -> tuple[SweepConfig, dict[str, set[str]]]:
    cfg = SweepConfig(name=name, models=tuple(models), dtypes=("fp16",), policies=("default",),
                      targets=("cpu",), repeats=6)
    return cfg, {m: {"test"} for m in models}


def _result_counts(url: str, run_id: int) -> dict[tuple[str, ...], int]:
    eng = sa.create_engine(url)
    with eng.connect() as c:
        rows = c.execute(sa.text("select model, dtype, policy, target, count(*) from results "
                                 "where run_id = :r group by model, dtype, policy, target"), {"r": run_id}).all()
    eng.dispose()
    return {tuple(r[:4]): int(r[4]) for r in rows}


def _wait_running(store: Any, run_id: int, node: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for job in store.jobs(run_id):
            if job.status == "running" and (job.worker or "").startswith(f"{node}@"):
                return job
        time.sleep(0.1)
    raise AssertionError(f"no job of run {run_id} started on {node} within {timeout}s")


def _wait_reconciling(settings: Any, store: Any, run_id: int, detail: Any = None) -> tuple[Any, list[int]]:
    """Wait for the run to finish while re-sending lost job messages every few seconds, as a deployment's
    beat does (``ampci.reconcile``); return the final run and the ids of the jobs re-sent."""
    from service.orchestration.reconcile import resend_lost_jobs

    resent: list[int] = []

    def finished() -> Any:
        try:
            return wait_for_run(store, run_id, timeout=10)
        except TimeoutError:  # still pending: reconcile as beat would (grace: sent well before the restart)
            resent.extend(resend_lost_jobs(settings, store, grace_s=5))
            return None

    run = wait_until(finished, f"run {run_id} to finish", every=0, detail=detail)
    return run, resent


def test_worker_sigkilled_mid_job_is_redelivered_and_stored_once(
        cluster_settings, cluster_env, start_worker) -> None:
    a = start_worker("wa", extra_env={"AMPCI_TEST_NOOP_DELAY": "30"})
    a.wait_ready()
    cfg, catalog = _sweep(["noop_a", "noop_b", "noop_c"])
    store = open_store(cluster_settings)
    started = start_sweep(cluster_settings, cfg, "main", catalog=catalog, store=store)
    victim = _wait_running(store, started.run_id, "wa")
    b = start_worker("wb", extra_env={"AMPCI_TEST_NOOP_DELAY": "0.1"})
    b.wait_ready()
    a.sigkill()
    run = wait_for_run(store, started.run_id, timeout=90)
    assert run.status == "complete"
    jobs = {j.model: j for j in store.jobs(started.run_id)}
    assert jobs[victim.model].attempts == 2 and jobs[victim.model].status == "done"
    assert jobs[victim.model].worker.startswith("wb@")
    assert all(j.status == "done" for j in jobs.values())
    counts = _result_counts(cluster_env["AMPCI_DATABASE_URL"], started.run_id)
    assert sorted(counts.values()) == [1, 1, 1] and len(counts) == 3
    results = {r.model: r for r in store.results(run_id=started.run_id)}
    assert "node=wb" in results[victim.model].message
    assert "pass=VALUE = 'second'" in results[victim.model].message  # the run's revision, checked out


def test_redis_restart_while_jobs_are_queued_loses_nothing(
        cluster_settings, cluster_env, start_worker, fresh_redis) -> None:
    w = start_worker("wr", extra_env={"AMPCI_TEST_NOOP_DELAY": "0.3"})
    w.wait_ready()
    models = [f"noop_{i}" for i in range(10)]
    cfg, catalog = _sweep(models)
    store = open_store(cluster_settings)
    started = start_sweep(cluster_settings, cfg, "main", catalog=catalog, store=store)

    def log() -> str:
        return w.log.read_text()[-3000:]

    wait_until(lambda: sum(j.status == "done" for j in store.jobs(started.run_id)) >= 2, "two jobs done",
               every=0.05, detail=log)
    fresh_redis.kill()            # SIGKILL: no chance to save; the AOF (fsync always) must be enough
    time.sleep(1.0)               # (Redis down for a moment: not a wait for a condition)
    fresh_redis.start()
    run, resent = _wait_reconciling(cluster_settings, store, started.run_id, detail=log)
    assert run.status == "complete"
    # the AOF kept every message; at most the one a worker was popping as Redis died (kombu's window
    # between BRPOP and recording it as unacked) is lost, and beat's reconciler re-sends it
    assert len(resent) <= 1, resent
    assert all(j.status == "done" for j in store.jobs(started.run_id))
    counts = _result_counts(cluster_env["AMPCI_DATABASE_URL"], started.run_id)
    assert len(counts) == len(models) and set(counts.values()) == {1}


def test_a_pool_child_that_starts_slowly_still_runs_the_jobs(cluster_settings, start_worker) -> None:
    """A pool child preloads the job code before it reports up, which takes seconds on a busy machine.
    Celery gives a replacement child (after a crash, or after ``worker_max_tasks_per_child`` jobs) 4 s by
    default and then SIGKILLs it, again and again: the worker never ran a job again.  Here every child
    starts in 6 s and the poison job kills each one it reaches."""
    w = start_worker("wslow", extra_env={"AMPCI_TEST_CHILD_INIT_DELAY": "6"})
    w.wait_ready()
    cfg, catalog = _sweep(["poison_pill", "noop_a"])
    store = open_store(cluster_settings)
    started = start_sweep(cluster_settings, cfg, "main", catalog=catalog, store=store)
    run = wait_for_run(store, started.run_id, timeout=240)
    jobs = {j.model: j for j in store.jobs(started.run_id)}
    assert jobs["noop_a"].status == "done" and jobs["poison_pill"].status == "crashed"
    assert run.status == "partial"
    assert "Timed out waiting for UP message" not in w.log.read_text()


def test_poison_job_ends_crashed_while_others_complete(cluster_settings, start_worker) -> None:
    workers = [start_worker(f"wp{i}", extra_env={"AMPCI_TEST_NOOP_DELAY": "0.1"}) for i in range(2)]
    for w in workers:
        w.wait_ready()
    cfg, catalog = _sweep(["noop_x", "poison_pill", "noop_y", "noop_z"])
    store = open_store(cluster_settings)
    started = start_sweep(cluster_settings, cfg, "main", catalog=catalog, store=store)
    run = wait_for_run(store, started.run_id, timeout=120)
    jobs = {j.model: j for j in store.jobs(started.run_id)}
    assert jobs["poison_pill"].status == "crashed"
    assert jobs["poison_pill"].attempts == cluster_settings.max_attempts + 1
    assert all(jobs[m].status == "done" for m in ("noop_x", "noop_y", "noop_z"))
    results = {r.model: r for r in store.results(run_id=started.run_id)}
    assert results["poison_pill"].status == "crashed"
    assert run.status == "partial"
    assert all(w.proc.poll() is None for w in workers)  # the workers themselves survived


def test_two_sweeps_at_once_do_not_corrupt_each_other(cluster_settings, cluster_env, start_worker,
                                                      pass_repo) -> None:
    workers = [start_worker(f"wc{i}", extra_env={"AMPCI_TEST_NOOP_DELAY": "0.05"}) for i in range(2)]
    for w in workers:
        w.wait_ready()
    first = git(pass_repo, "rev-parse", "main~1")
    models = [f"noop_{i}" for i in range(6)]
    cfg, catalog = _sweep(models)
    store = open_store(cluster_settings)
    started: dict[str, Any] = {}

    def go(key: str, rev: str) -> None:
        started[key] = start_sweep(cluster_settings, cfg, rev, catalog=catalog, store=open_store(cluster_settings))

    threads = [threading.Thread(target=go, args=(k, r)) for k, r in (("a", "main"), ("b", "main"), ("c", first))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert set(started) == {"a", "b", "c"}
    assert started["a"].run_id != started["b"].run_id and started["a"].revision == started["b"].revision
    for key, value in (("a", "second"), ("b", "second"), ("c", "first")):
        run_id = started[key].run_id
        assert wait_for_run(store, run_id, timeout=120).status == "complete"
        results = store.results(run_id=run_id)
        assert sorted(r.model for r in results) == sorted(models)
        assert all(r.revision_sha == started[key].revision for r in results)
        assert all(f"pass=VALUE = '{value}'" in (r.message or "") for r in results), key
        counts = _result_counts(cluster_env["AMPCI_DATABASE_URL"], run_id)
        assert set(counts.values()) == {1}
        assert {j.run_id for j in store.jobs(run_id)} == {run_id}


@pytest.mark.parametrize("ignore_soft", ["0", "1"])
def test_job_past_the_time_limit_gets_a_timeout_result(cluster_settings, start_worker, ignore_soft) -> None:
    w = start_worker("wt", extra_env={"AMPCI_TEST_NOOP_DELAY": "60", "AMPCI_TEST_IGNORE_SOFT_LIMIT": ignore_soft})
    w.wait_ready()
    cfg, catalog = _sweep(["noop_stuck"])
    store = open_store(cluster_settings)
    started = start_sweep(cluster_settings, cfg, "main", catalog=catalog, store=store)
    run = wait_for_run(store, started.run_id, timeout=60)
    (result,) = store.results(run_id=started.run_id)
    assert result.status == "timeout" and "time limit" in (result.message or "")
    assert run.status == "complete" and store.jobs(started.run_id)[0].attempts == 1
    assert w.proc.poll() is None
