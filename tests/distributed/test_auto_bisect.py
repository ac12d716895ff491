"""Automatic bisection end to end: a pass repository where one commit breaks accuracy, the worker path
(``execute_job`` → ``finish_if_complete``) advancing the bisection after every bisect run and
dispatching the next midpoint, until the first bad commit is found.

The job itself is replaced by a stand-in that checks the pass out **at the job's revision** through
the real revision cache and reads what that commit's ``amp_pass`` says (good, broken, or not even
importable); Celery dispatch is replaced by a queue the test drains like a worker would.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections import deque
from pathlib import Path
from typing import Any

import pytest

from service.cli.main import main
from service.orchestration import jobs, scheduler, tasks
from service.orchestration.bisection import bisect_step
from service.settings import Settings
from tests.distributed import broker_queue
from tests.service.factories import make_result
from workers.revision.revisions import RevisionCache

CELL = ("tiny_mlp", "fp16", "default", "cpu")
N_COMMITS = 12


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


def make_repo(root: Path, first_bad: int, unbuildable: set[int]) -> list[str]:
    """A linear history of N_COMMITS commits; from ``first_bad`` on the pass loses accuracy;
    ``unbuildable`` commits do not even convert.  Returns the shas oldest first."""
    repo = root / "passrepo"
    (repo / "amp_pass").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    shas = []
    for i in range(N_COMMITS):
        state = "unbuildable" if i in unbuildable else ("broken" if i >= first_bad else "good")
        (repo / "amp_pass" / "__init__.py").write_text(f"STATE = {state!r}\nCOMMIT = {i}\n")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"commit {i} ({state})")
        shas.append(_git(repo, "rev-parse", "HEAD"))
    return shas


class Harness:
    """Settings, store, a fake broker queue and the stand-in job, for one test."""

    def __init__(self, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, auto_bisect: bool,
                 first_bad: int = 7, unbuildable: frozenset[int] = frozenset(),
                 broker_url: str = "redis://127.0.0.1:1/0") -> None:  # never contacted
        self.shas = make_repo(tmp_path, first_bad, set(unbuildable))
        self.settings = Settings(database_url=db_url, broker_url=broker_url,
                                 cache_dir=tmp_path / "cache", data_dir=tmp_path / "data",
                                 pass_repo=str(tmp_path / "passrepo"), auto_bisect=auto_bisect)
        self.store = scheduler.open_store(self.settings)
        self.queue: deque[int] = deque()   # job ids "sent to the broker"
        self.ran: list[str] = []           # revisions a job ran at
        cache = RevisionCache.from_config(self.settings.worker_config())
        for i, sha in enumerate(self.shas):  # what the webhook records for a push
            self.store.upsert_revision(sha, [self.shas[i - 1]] if i else [], "main", "t", f"commit {i}")

        def fake_enqueue(settings: Settings, revision: str, jobs: Any, app: Any = None) -> int:
            jobs = list(jobs)
            self.queue.extend(j.id for j in jobs)
            return len(jobs)

        def fake_run_cell(cell, revision, settings, options=None):  # noqa: ANN001, ANN202
            text = (cache.checkout(revision) / "amp_pass" / "__init__.py").read_text()
            self.ran.append(revision)
            seed = self.shas.index(revision)
            if "unbuildable" in text:
                return make_result(cell, status="convert_error", seed=seed)
            if "broken" in text:
                return make_result(cell, status="fail_accuracy", max_abs=0.4, seed=seed)
            return make_result(cell, max_abs=1e-3, seed=seed)

        monkeypatch.setattr(jobs, "enqueue", fake_enqueue)
        monkeypatch.setattr(tasks, "run_cell", fake_run_cell)
        self.fake_run_cell = fake_run_cell

    def push(self, i: int) -> int:
        """A push run of commit ``i``, run by a worker; returns its id."""
        run_id = self.store.create_run(self.shas[i], "push", cells=[CELL])
        for job in self.store.jobs(run_id):
            tasks.execute_job(job.id, self.settings, "w1", store=self.store)
        return run_id

    def drain(self, limit: int = 20) -> int:
        """Play the workers: run queued jobs (and what finishing them queues) until none are left."""
        return broker_queue.drain(self.queue, self.settings, self.store, limit)


@pytest.mark.parametrize(("first_bad", "unbuildable"), [(7, frozenset()), (1, frozenset()), (4, frozenset({3, 5}))])
def test_regression_is_bisected_to_its_first_bad_commit_by_itself(db_url: str, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch, first_bad: int,
                                                                   unbuildable: frozenset[int]) -> None:
    h = Harness(db_url, tmp_path, monkeypatch, auto_bisect=True, first_bad=first_bad, unbuildable=unbuildable)
    h.push(0)
    bad_run = h.push(N_COMMITS - 1)
    (reg,) = h.store.regressions(run_id=bad_run, category="regression")
    assert reg.kind == "accuracy" and reg.baseline_sha == h.shas[0]
    assert len(h.queue) == 1  # AMPCI_AUTO_BISECT: the first midpoint was dispatched when the push run finished
    steps = h.drain()
    # ~log2(10) midpoints, plus one per unbuildable commit it had to step over
    assert steps <= 4 + len(unbuildable)
    bisect_runs = h.store.list_runs(trigger="bisect")
    assert len(bisect_runs) == steps and all(r.status in ("complete", "partial", "failed") for r in bisect_runs)
    state = bisect_step(h.store, reg.id)  # nothing left to queue: the answer is stored
    assert state.status == "found" and state.first_bad == h.shas[first_bad] and state.queued_runs == ()
    assert set(state.skipped) <= {h.shas[i] for i in unbuildable}
    assert set(h.ran) - {h.shas[0], h.shas[-1]} == {r.revision_sha for r in bisect_runs}
    # bisect runs add no open regressions: only the push run's one is open (and gates CI)
    assert [r.id for r in h.store.regressions(state="open", category="regression")] == [reg.id]
    assert all(not h.store.regressions(run_id=r.id) for r in bisect_runs)
    h.store.dispose()


def test_manual_first_step_then_continues_and_auto_start_is_off_by_default(sqlite_url: str, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch,
                                                                            capsys: pytest.CaptureFixture[str]
                                                                            ) -> None:
    h = Harness(sqlite_url, tmp_path, monkeypatch, auto_bisect=False, first_bad=6)
    h.push(0)
    bad_run = h.push(N_COMMITS - 1)
    assert not h.queue and not h.store.list_runs(trigger="bisect")  # off by default
    monkeypatch.setenv("AMPCI_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("AMPCI_BROKER_URL", h.settings.broker_url)
    assert main(["bisect", "--run", str(bad_run), "--dispatch", "--json"]) == 0  # the first step, by hand
    (first,) = json.loads(capsys.readouterr().out)
    assert first["status"] == "queued" and list(h.queue) == [h.store.jobs(first["queued_runs"][0])[0].id]
    h.drain()  # every later step happened when a bisect run finished
    assert main(["bisect", "--run", str(bad_run), "--json"]) == 0
    (last,) = json.loads(capsys.readouterr().out)
    assert last["status"] == "found" and last["first_bad"] == h.shas[6]
    assert main(["regressions", "--open", "--json"]) == 0
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)] == [bad_run]
    h.store.dispose()


def test_embedded_pool_runs_the_whole_bisection(sqlite_url: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """No broker: the LocalPool that ran the push run also runs every midpoint it leads to."""
    from service.orchestration import localpool, pool_slots

    h = Harness(sqlite_url, tmp_path, monkeypatch, auto_bisect=True, first_bad=3, broker_url="")
    assert h.settings.embedded

    def slot_run(self: Any, request: tuple[Any, ...], timeout: float) -> str:  # the job, in-process
        cell, revision, settings, options = request
        return h.fake_run_cell(tuple(cell), revision, settings, options).to_json()

    monkeypatch.setattr(pool_slots.Slot, "run", slot_run)
    for i in (0, N_COMMITS - 1):  # one pool per sweep, as `ampci sweep` does
        pool = localpool.LocalPool(h.settings, h.store, workers=2)
        try:
            run_id = h.store.create_run(h.shas[i], "push", cells=[CELL])
            pool.submit(h.store.jobs(run_id))
            scheduler.wait_for_run(h.store, run_id, poll=0.05, timeout=60)
        finally:
            pool.close()  # returns once the pool has nothing left: for the second, the bisection is over
        assert not pool.errors
    assert not h.queue  # nothing went to "Celery"
    (reg,) = h.store.regressions(state="open", category="regression")
    state = bisect_step(h.store, reg.id)
    assert state.status == "found" and state.first_bad == h.shas[3]
    runs = h.store.list_runs(trigger="bisect")
    assert 1 <= len(runs) <= 4 and all(r.status == "complete" for r in runs)
    h.store.dispose()


def test_concurrent_finishers_dispatch_each_midpoint_once(pg_url: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    h = Harness(pg_url, tmp_path, monkeypatch, auto_bisect=True)
    h.push(0)
    bad_run = h.push(N_COMMITS - 1)
    job = h.store.get_job(h.queue.popleft())
    run = h.store.get_run(job.run_id)
    scheduler.record_result(h.store, run, job, tasks.run_cell(job.cell, run.revision_sha, h.settings))
    dispatched: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(6)

    def send(run_id: int) -> None:
        with lock:
            dispatched.append(run_id)

    def finisher() -> None:  # several workers (or redeliveries) finishing the same run at once
        barrier.wait()
        scheduler.finish_if_complete(h.store, run.id, h.settings, dispatch=send)

    threads = [threading.Thread(target=finisher) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(dispatched) == 1  # the next midpoint: created once, dispatched once
    assert len(h.store.list_runs(trigger="bisect")) == 2
    scheduler.finish_if_complete(h.store, run.id, h.settings, dispatch=send)  # a late redelivery
    scheduler.finish_if_complete(h.store, bad_run, h.settings, dispatch=send)
    assert len(dispatched) == 1 and len(h.store.list_runs(trigger="bisect")) == 2
    h.store.dispose()
