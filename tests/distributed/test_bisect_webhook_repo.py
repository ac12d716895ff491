"""Bisection of a regression found in a run of the webhook's own repository (``AMPCI_PASS_REPO`` unset).

The pass repository is a bare repository reachable only by its ``file://`` clone URL (admitted by
``AMPCI_PASS_REPO_ALLOW_FILE``), named by the push deliveries; its commits are unknown to this checkout.  The
deliveries are parsed and their runs created as the webhook intake does (:func:`parse_event`,
:class:`RunDispatcher`, real PostgreSQL); a worker plays every job through the Celery task's plain function
(``execute_job`` → ``finish_if_complete`` → ``continue_bisection``), and ``AMPCI_AUTO_BISECT`` starts the bisection
and dispatches each next midpoint.  Only the job code is a stand-in: it checks the pass out **at the job's
revision from the repository in the job's worker config** through the real revision cache, and reads what that
commit's ``amp_pass`` says; a revision that cannot be checked out is ``bad_spec``, as in the real job.  So a
midpoint that lost the run's repository (``meta.pass_repo``) is never measured, and the bisection fails.
"""

from __future__ import annotations

import subprocess
from collections import deque
from pathlib import Path
from typing import Any

import pytest

from service.api.dispatch import RunDispatcher
from service.github.events import RunRequest, parse_event
from service.orchestration import jobs, scheduler, tasks
from service.orchestration.bisection import bisect_step
from service.orchestration.pass_repo import PASS_REPO
from service.settings import Settings
from tests.distributed import broker_queue
from tests.service.api.helpers import REPO, encode, push_payload
from tests.service.factories import make_result
from workers.revision.config import WorkerConfig
from workers.revision.git_commands import RevisionError
from workers.revision.revisions import RevisionCache

N_COMMITS = 12
ZERO = "0" * 40


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


def make_remote(root: Path, first_bad: int) -> tuple[str, list[str]]:
    """A bare repository (the "remote") with a linear history of N_COMMITS commits, the pass losing accuracy
    from ``first_bad`` on; returns its clone URL and the shas oldest first."""
    work = root / "work"
    (work / "amp_pass").mkdir(parents=True)
    _git(work, "init", "-q", "-b", "main")
    shas = []
    for i in range(N_COMMITS):
        state = "broken" if i >= first_bad else "good"
        (work / "amp_pass" / "__init__.py").write_text(f"STATE = {state!r}\nCOMMIT = {i}\n")
        _git(work, "add", "-A")
        _git(work, "commit", "-q", "-m", f"commit {i} ({state})")
        shas.append(_git(work, "rev-parse", "HEAD"))
    bare = root / "remote" / "pass.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True, capture_output=True)
    return f"file://{bare}", shas


class World:
    """Settings without AMPCI_PASS_REPO, the store, the intake's dispatcher and a worker draining a queue."""

    def __init__(self, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first_bad: int) -> None:
        self.url, self.shas = make_remote(tmp_path, first_bad)
        self.settings = Settings(database_url=pg_url, broker_url="redis://127.0.0.1:1/0",  # never contacted
                                 cache_dir=tmp_path / "cache", data_dir=tmp_path / "data", pass_repo="",
                                 pass_repo_allow_file=True, allowed_repos=REPO, tracked_branches="main",
                                 auto_bisect=True, baseline_runs=False, confirm_pairs=0)
        self.store = scheduler.open_store(self.settings)
        self.queue: deque[int] = deque()  # job ids "sent to the broker"
        self.ran: list[tuple[str, str]] = []  # (revision, the clone URL of the job's worker config)
        plan = scheduler.load_sweep(sweep="smoke").expand(scheduler.zoo_catalog())[:1]
        self.cell = plan[0].cell
        self.dispatcher = RunDispatcher(self.settings, self.store, planner=lambda _: plan,
                                        dispatch=lambda s, rev, js: self.queue.extend(j.id for j in js), mode="broker")

        def fake_enqueue(settings: Settings, revision: str, queued: Any, app: Any = None) -> int:
            queued = list(queued)
            self.queue.extend(j.id for j in queued)
            return len(queued)

        def stand_in_job(cell: tuple[str, str, str, str], revision: str, config: WorkerConfig,
                         options: Any = None) -> Any:
            self.ran.append((revision, config.pass_repo_url))
            seed = self.shas.index(revision)
            try:
                tree = RevisionCache.from_config(config).checkout(revision)
            except RevisionError as exc:  # what the real job makes of it
                result = make_result(cell, status="bad_spec", seed=seed)
                result.message = f"bad_spec: {exc}"
                return result
            if "broken" in (tree / "amp_pass" / "__init__.py").read_text():
                return make_result(cell, status="fail_accuracy", max_abs=0.4, seed=seed)
            return make_result(cell, max_abs=1e-3, seed=seed)

        monkeypatch.setattr(jobs, "enqueue", fake_enqueue)
        monkeypatch.setattr(tasks, "_run_cell", stand_in_job)

    def deliver(self, after: int, before: int | None, listed: list[int]) -> int:
        """A push delivery of commit ``after`` (``before`` None: the branch is created) listing the commits
        ``listed``, parsed and submitted as the intake does; returns its run id."""
        payload = push_payload(self.shas[after], before=self.shas[before] if before is not None else ZERO,
                               commits=[self.shas[i] for i in listed], created=before is None,
                               installation={"id": 4242})
        payload["repository"]["clone_url"] = self.url
        request = parse_event("push", encode(payload), self.settings)
        assert isinstance(request, RunRequest) and request.clone_url == self.url
        return self.dispatcher.submit(request, request.dedup_key or "k").run_id

    def drain(self, limit: int = 20) -> int:
        """Play the worker: run queued jobs (and what finishing them queues) until none are left."""
        return broker_queue.drain(self.queue, self.settings, self.store, limit)


@pytest.mark.postgres
@pytest.mark.parametrize(("first_bad", "listed"), [
    (7, list(range(1, N_COMMITS))),   # the push lists every commit: its payload implies the whole path
    (3, list(range(8, N_COMMITS))),   # a large push: the payload lists only its newest commits
])
def test_a_webhook_repository_regression_is_bisected_in_that_repository(pg_url: str, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        first_bad: int, listed: list[int]) -> None:
    w = World(pg_url, tmp_path, monkeypatch, first_bad)
    try:
        w.deliver(0, None, [0])
        w.drain()
        bad_run = w.deliver(N_COMMITS - 1, 0, listed)
        assert len(w.queue) == 1
        tasks.execute_job(w.queue.popleft(), w.settings, "w1", store=w.store)  # finishing the run starts the bisection
        assert len(w.queue) == 1  # the first midpoint
        (reg,) = w.store.regressions(run_id=bad_run, category="regression")
        assert reg.kind == "accuracy" and reg.baseline_sha == w.shas[0]
        # the path walked is git's history of that repository, whatever the payload listed
        assert w.store.first_parent_path(w.shas[-1], w.shas[0]) == w.shas
        steps = w.drain()
        assert 1 <= steps <= 4  # ~log2(10) midpoints
        state = bisect_step(w.store, reg.id)
        assert state.status == "found" and state.first_bad == w.shas[first_bad] and state.skipped == ()
        bisect_runs = w.store.list_runs(trigger="bisect")
        assert len(bisect_runs) == steps
        source = w.store.get_run(bad_run).meta[PASS_REPO]
        assert source == {"url": w.url, "repo": REPO, "installation": 4242}
        assert all(w.store.get_run(r.id).meta[PASS_REPO] == source for r in bisect_runs)  # the same repository
        midpoints = {r.revision_sha for r in bisect_runs}
        assert {rev for rev, _ in w.ran} - {w.shas[0], w.shas[-1]} == midpoints
        assert all(url == w.url for _, url in w.ran)  # every job, the midpoints too, cloned from the delivery's URL
        assert all(res.status != "bad_spec" for r in bisect_runs for res in w.store.results(run_id=r.id))
    finally:
        w.store.dispose()
