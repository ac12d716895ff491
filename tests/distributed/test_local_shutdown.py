"""Issue 24 item 5: a clean stop of an embedded pool strands no job, and the next process resumes them.

The embedded :class:`LocalPool` records its process as the owner of the local runs it takes; a clean
``shutdown()`` (what ``ampci serve``'s lifespan does on SIGTERM) re-queues the job it was running and
releases the runs; :func:`service.orchestration.orphans.resume_orphans` (``ampci serve`` at start-up,
``ampci reconcile --resume`` without a broker) takes the runs of released or dead owners — never a live
one's — and runs their jobs to the end.
"""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from service.db import models as m
from service.orchestration import orphans, scheduler
from service.settings import Settings
from tests.waiting import SAFETY_NET_S, wait_until
from workers.revision.revisions import RevisionCache

ROOT = Path(__file__).resolve().parents[2]
CELLS = [("conv_net", "fp16", "default", "cpu"), ("conv_net", "bf16", "default", "cpu")]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(30)
    return proc.pid


class Taken:
    """Stands in for a LocalPool where only what is submitted matters (our own class, not a service)."""

    def __init__(self) -> None:
        self.jobs: list[Any] = []

    def submit(self, jobs: Any) -> None:
        self.jobs.extend(jobs)


def _settled(store: Any, run_id: int) -> list[Any] | None:
    """The run's jobs once none is ``running`` (all handed back or done), else None."""
    jobs = store.jobs(run_id)
    return None if any(j.status == "running" for j in jobs) else jobs


def _set_owner(store: Any, run_id: int, owner: Any) -> None:
    with store.transaction() as conn:
        conn.execute(m.Run.__table__.update().where(m.Run.__table__.c.id == run_id).values(local_owner=owner))


def test_only_released_or_dead_owners_are_taken_over(db_url: str) -> None:
    from service.db import Store
    from service.db.migrate import upgrade

    upgrade(db_url)
    store = Store.from_url(db_url)
    try:
        sha = "a" * 40
        store.upsert_revision(sha, [], "main", "dev", "x")
        runs = {name: store.create_run(sha, "manual", None, "t", CELLS, dispatch="local")
                for name in ("dead", "alive", "other", "released")}
        broker = store.create_run(sha, "manual", None, "t", CELLS, dispatch="broker")
        _set_owner(store, runs["dead"], {"host": socket.gethostname(), "pid": _dead_pid(), "start": "1"})
        _set_owner(store, runs["alive"], orphans.me())
        _set_owner(store, runs["other"], {"host": "elsewhere.example", "pid": 1, "start": "1"})
        _set_owner(store, runs["released"], None)
        running = store.jobs(runs["dead"])[0]
        store.begin_job(running.id, "local-999999-0")  # the dead process was running it
        assert not store.begin_job(store.jobs(broker)[0].id, "w").started or True

        found = {o.run_id: o for o in orphans.find_orphans(store)}
        assert set(found) == {runs["dead"], runs["other"], runs["released"]}  # never a live owner's, nor broker runs
        assert found[runs["dead"]].state == "dead" and found[runs["dead"]].running == 1
        assert found[runs["other"]].state == "other-host" and not found[runs["other"]].resumable
        assert {o.run_id for o in orphans.find_orphans(store, include_alive=True)} >= {runs["alive"]}

        pool = Taken()
        taken = {o.run_id for o in orphans.resume_orphans(store, pool)}
        assert taken == {runs["dead"], runs["released"]}
        assert sorted(j.run_id for j in pool.jobs) == sorted([runs["dead"]] * 2 + [runs["released"]] * 2)
        (requeued,) = [j for j in store.jobs(runs["dead"]) if j.id == running.id]
        assert requeued.status == "queued" and requeued.attempts == 1  # the dead worker's attempt counts
        assert orphans.owner_of(store, runs["dead"])["pid"] == os.getpid()
        assert orphans.resume_orphans(store, Taken()) == []  # now this live process owns them
        assert {o.run_id for o in orphans.resume_orphans(store, Taken(), force=True)} == {runs["other"]}
    finally:
        store.dispose()


@pytest.mark.slow
def test_shutdown_requeues_the_running_job_and_the_next_pool_finishes_the_run(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", cache_dir=tmp_path / "cache")
    store = scheduler.open_store(settings)
    key = RevisionCache.from_config(settings.worker_config()).snapshot(ROOT)
    run_id = store.create_run(key, "manual", None, "t", CELLS)
    pool = scheduler.LocalPool(settings, store, workers=1)
    pool.submit(store.jobs(run_id))
    assert orphans.owner_of(store, run_id)["pid"] == os.getpid()  # the owner is recorded
    wait_until(lambda: any(j.status == "running" for j in store.jobs(run_id)) and pool._slots
               and pool._slots[0].proc is not None, "a job running in a pool subprocess", every=0.05)
    pool.shutdown()
    jobs = _settled(store, run_id)  # handed back by shutdown itself, whether or not the slot's thread ran since
    assert jobs is not None, store.jobs(run_id)
    assert {j.status for j in jobs} == {"queued"} and {j.attempts for j in jobs} == {0}, jobs
    assert orphans.owner_of(store, run_id) is None  # released
    assert store.get_run(run_id).finished_at is None

    # `ampci reconcile` without a broker lists them
    os.environ_backup = dict(os.environ)  # type: ignore[attr-defined]
    out = io.StringIO()
    try:
        os.environ.update(AMPCI_DATA_DIR=str(tmp_path / "data"), AMPCI_CACHE_DIR=str(tmp_path / "cache"))
        os.environ.pop("AMPCI_BROKER_URL", None)
        os.environ.pop("AMPCI_DATABASE_URL", None)
        from service.cli.main import main

        with redirect_stdout(out):
            assert main(["reconcile", "--json"]) == 0
    finally:
        os.environ.clear()
        os.environ.update(os.environ_backup)  # type: ignore[attr-defined]
    listed = json.loads(out.getvalue())
    assert [(o["run_id"], o["queued"], o["resumable"]) for o in listed["orphans"]] == [(run_id, 2, True)]

    again = scheduler.LocalPool(settings, store, workers=1)
    try:
        assert [o.run_id for o in orphans.resume_orphans(store, again)] == [run_id]
        run = scheduler.wait_for_run(store, run_id, timeout=SAFETY_NET_S)
    finally:
        again.close()
    jobs = store.jobs(run_id)
    assert run.status == "complete" and {j.status for j in jobs} == {"done"} and {j.attempts for j in jobs} == {1}
    assert orphans.find_orphans(store, include_alive=True) == []
    store.dispose()


@pytest.mark.slow
def test_the_app_hands_local_jobs_back_on_stop_and_resumes_them_on_start(tmp_path: Path) -> None:
    """What ``ampci serve`` without a broker does on SIGTERM and on its next start (its lifespan)."""
    from fastapi.testclient import TestClient

    from service.api import dispatch
    from service.api.app import create_app

    settings = Settings(data_dir=tmp_path / "data", cache_dir=tmp_path / "cache", insecure_dev=True,
                        local_workers=1)
    store = scheduler.open_store(settings)
    key = RevisionCache.from_config(settings.worker_config()).snapshot(ROOT)
    run_id = store.create_run(key, "manual", None, "t", CELLS)  # left queued by a process that is gone
    _set_owner(store, run_id, {"host": socket.gethostname(), "pid": _dead_pid(), "start": "1"})
    try:
        with TestClient(create_app(settings)):  # start-up resumes the run on this process's pool
            wait_until(lambda: any(j.status == "running" for j in store.jobs(run_id)), "a job running",
                       every=0.05, detail=lambda: store.jobs(run_id))
        # the lifespan's end (SIGTERM) handed the running job back (before the pool's shutdown returned)
        # and released the run
        jobs = _settled(store, run_id)
        assert jobs is not None, store.jobs(run_id)
        assert {j.status for j in jobs} <= {"queued", "done"} and "queued" in {j.status for j in jobs}, jobs
        assert orphans.owner_of(store, run_id) is None
        dispatch._LOCAL_POOLS.clear()  # the next "process" gets a fresh pool
        with TestClient(create_app(settings)):
            run = scheduler.wait_for_run(store, run_id, timeout=SAFETY_NET_S)
        assert run.status == "complete" and {j.status for j in store.jobs(run_id)} == {"done"}
    finally:
        dispatch._LOCAL_POOLS.clear()
        store.dispose()


@pytest.mark.slow
@pytest.mark.postgres
def test_sigterm_to_an_embedded_serve_then_a_restart_leaves_no_job_behind(pg_url: str, tmp_path: Path) -> None:
    """The probe of the issue, bounded: ``ampci serve`` without a broker on PostgreSQL, a manual smoke
    run through the API, SIGTERM while a job runs; nothing is left ``running``, the rest stays
    ``queued`` and released; a second ``ampci serve`` on the same database finishes the run."""
    import httpx

    from bench.bench_webhook import free_port, stop_server
    from service.db import Store
    from service.db.migrate import upgrade

    upgrade(pg_url)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMPCI_") or k == "AMPCI_CACHE_DIR"}
    env.update(AMPCI_DATABASE_URL=pg_url, AMPCI_WEBHOOK_SECRET="s", AMPCI_API_TOKEN="t", AMPCI_LOCAL_WORKERS="1",
               AMPCI_DATA_DIR=str(tmp_path / "data"), AMPCI_LOG_LEVEL="WARNING")
    store = Store.from_url(pg_url)

    def serve(log: Path) -> tuple[subprocess.Popen[bytes], str]:
        port = free_port()
        with open(log, "wb") as fh:
            proc = subprocess.Popen([sys.executable, "-m", "service.cli.main", "serve", "--port", str(port),
                                     "--no-migrate"], cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"

        def answers() -> bool:
            assert proc.poll() is None, log.read_text()[-2000:]
            try:
                httpx.get(base + "/healthz", timeout=5)
            except httpx.HTTPError:
                return False
            return True

        try:
            wait_until(answers, "ampci serve to answer /healthz", every=0.2, detail=lambda: log.read_text()[-2000:])
        except BaseException:
            stop_server(proc)
            raise
        return proc, base

    first, base = serve(tmp_path / "first.log")
    try:
        resp = httpx.post(base + "/api/runs", json={"revision": head, "sweep": "smoke"},
                          headers={"Authorization": "Bearer t"}, timeout=SAFETY_NET_S)
        assert resp.status_code == 202, resp.text
        run_id = resp.json()["run_id"]
        wait_until(lambda: any(j.status == "running" for j in store.jobs(run_id)), "a job running",
                   detail=lambda: store.jobs(run_id))
        first.terminate()  # SIGTERM: uvicorn's graceful shutdown runs the app's lifespan end
        first.wait(SAFETY_NET_S)
    finally:
        stop_server(first)
    jobs = store.jobs(run_id)
    assert "running" not in {j.status for j in jobs}, jobs
    assert "queued" in {j.status for j in jobs}
    assert orphans.owner_of(store, run_id) is None  # handed back
    assert "Traceback" not in (tmp_path / "first.log").read_text()

    second, _ = serve(tmp_path / "second.log")
    try:
        wait_until(lambda: not {j.status for j in store.jobs(run_id)} & {"queued", "running"},
                   "the run's jobs to end", every=0.5, detail=lambda: store.jobs(run_id))
    finally:
        stop_server(second)
    assert all(j.status == "done" for j in store.jobs(run_id)), store.jobs(run_id)
    assert "resumed the jobs of 1 local run" in (tmp_path / "second.log").read_text()
    store.dispose()
