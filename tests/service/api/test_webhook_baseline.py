"""Webhook push and pull-request runs run their baseline revision's missing cells first, exactly as
``ampci sweep`` does, and are judged (detection, gate, commit status) only once those cells are in.

The jobs are completed here through the same store calls and the same ``finish_if_complete`` the
embedded pool and the Celery workers use, in both orders (candidate first, baseline first)."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from service.api.dispatch import RunDispatcher
from service.github.events import RevisionInfo, RunRequest
from service.orchestration import baseline_runs
from service.orchestration.jobs import finish_if_complete
from service.orchestration.judge import baseline_statuses, run_verdict
from service.vocabulary import FINAL_RUN_STATES
from tests.service.api.conftest import test_planner
from tests.service.api.helpers import REPO, sha
from tests.service.factories import make_result

HEAD, BASE, GRAND = sha("bl-head"), sha("bl-base"), sha("bl-grand")


class Recorder:
    """A dispatch that records (revision, cells) in the order jobs were handed over."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[tuple[str, str, str, str]]]] = []

    def __call__(self, settings: Any, revision: str, jobs: Any) -> None:
        self.sent.append((revision, [j.cell for j in jobs]))


def _request(trigger: str = "push", head: str = HEAD, base: str | None = BASE) -> RunRequest:
    revs = [RevisionInfo(head, [base] if base else [], "main", "dev", "head", None)]
    return RunRequest(repo=REPO, trigger=trigger, head_sha=head, baseline_sha=base, branch="main",
                      pr_number=7 if trigger == "pull_request" else None, revisions=revs)


def _complete(store: Any, run_id: int, status: str = "pass", max_abs: float = 1e-3) -> None:
    """Every job of the run gets a result and ends ``done`` (what a worker does), without finishing the run."""
    revision = store.get_run(run_id).revision_sha
    for job in store.jobs(run_id):
        result = replace(make_result(job.cell, status=status, max_abs=max_abs, latency_ms=None), revision=revision)
        store.write_result(run_id, result, job_id=job.id)
        store.mark_job(job.id, "done")


@pytest.fixture
def setup(store: Any, queue: str, make_settings: Any) -> tuple[Any, RunDispatcher, Recorder]:
    settings = make_settings(baseline_runs=True, confirm_pairs=0)
    rec = Recorder()
    return settings, RunDispatcher(settings, store, planner=test_planner(queue), dispatch=rec, mode="broker"), rec


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


def _runs_at(store: Any, revision: str) -> list[Any]:
    return [r for r in store.list_runs(limit=100) if r.revision_sha == revision]


@pytest.mark.parametrize("trigger", ["push", "pull_request"])
@pytest.mark.parametrize("candidate_first", [True, False])
def test_missing_baseline_cells_run_first_and_judging_waits_for_them(
        store: Any, setup: Any, trigger: str, candidate_first: bool) -> None:
    _, dispatcher, rec = setup
    cells = [c.cell for c in dispatcher.planner("smoke")]
    # the baseline revision has a result for one cell only (an older run of it)
    store.upsert_revision(BASE, [GRAND], "main", "dev", "base")
    old = store.create_run(BASE, "push", cells=[cells[0]])
    _complete(store, old)
    finish_if_complete(store, old)

    (sub,) = dispatcher.submit_many([(_request(trigger), f"github:{trigger}-{candidate_first}")])
    (base_run,) = [r for r in _runs_at(store, BASE) if r.id != old]
    assert base_run.trigger == "manual" and base_run.meta["baseline_for"] == HEAD
    assert sorted(j.cell for j in store.jobs(base_run.id)) == sorted(cells[1:])  # only the missing cells
    assert [s for s, _ in rec.sent] == [BASE, HEAD]  # the baseline's jobs are handed over first
    cand = store.get_run(sub.run_id)
    assert cand.meta[baseline_runs.AWAITS] == [base_run.id]

    first, second = (cand.id, base_run.id) if candidate_first else (base_run.id, cand.id)
    _complete(store, first, max_abs=4e-1 if first == cand.id else 1e-3)
    if first == cand.id:
        assert finish_if_complete(store, cand.id) is False  # waits: nothing judged yet
        assert store.get_run(cand.id).status not in FINAL_RUN_STATES
        assert store.regressions(run_id=cand.id) == []
        waiting = run_verdict(store, cand.id)  # the run page and a commit status say so meanwhile
        assert waiting.state == "pending" and waiting.waiting_for == (base_run.id,)
        assert f"waiting for the baseline's missing cells (run #{base_run.id})" in waiting.headline()
    else:
        assert finish_if_complete(store, base_run.id) is True
    _complete(store, second, max_abs=4e-1 if second == cand.id else 1e-3)
    finish_if_complete(store, second)  # the last job's finisher judges the waiting run too
    cand = store.get_run(cand.id)
    assert cand.status == "complete"
    verdict = run_verdict(store, cand.id)
    assert verdict.decision.not_compared == () and verdict.decision.compared == len(cells)
    accuracy = [r for r in store.regressions(run_id=cand.id) if r.kind == "accuracy"]
    assert len(accuracy) == len(cells)  # every cell judged against the baseline revision's own result
    assert {r.baseline_sha for r in accuracy} == {BASE}


def test_nothing_missing_runs_nothing_and_a_retry_creates_no_second_baseline_run(store: Any, setup: Any) -> None:
    _, dispatcher, rec = setup
    cells = [c.cell for c in dispatcher.planner("smoke")]
    store.upsert_revision(BASE, [GRAND], "main", "dev", "base")
    # a run of the baseline revision is still measuring half the cells: wait for it, do not duplicate it
    busy = store.create_run(BASE, "push", cells=cells[:2])
    dispatcher.submit_many([(_request(), "github:retry")])
    (made,) = [r for r in _runs_at(store, BASE) if r.id != busy]
    assert sorted(j.cell for j in store.jobs(made.id)) == sorted(cells[2:])
    cand = [r for r in _runs_at(store, HEAD)][0]
    assert cand.meta[baseline_runs.AWAITS] == sorted([busy, made.id])
    dispatcher.submit_many([(_request(), "github:retry")])  # the delivery again: no new run anywhere
    assert len(_runs_at(store, BASE)) == 2 and len(_runs_at(store, HEAD)) == 1
    other = sha("bl-other")  # a second push on the same parent waits for the same runs, creates none
    dispatcher.submit_many([(_request(head=other), "github:second")])
    assert len(_runs_at(store, BASE)) == 2
    assert [r for r in _runs_at(store, other)][0].meta[baseline_runs.AWAITS] == sorted([busy, made.id])
    assert [s for s, _ in rec.sent].count(BASE) == 1


def test_no_baseline_or_own_revision_as_baseline_plans_nothing(store: Any, setup: Any) -> None:
    _, dispatcher, rec = setup
    dispatcher.submit_many([(_request(base=None, head=sha("bl-first")), "github:first")])
    dispatcher.submit_many([(_request(head=sha("bl-self"), base=sha("bl-self")), "github:self")])
    assert [s for s, _ in rec.sent] == [sha("bl-first"), sha("bl-self")]  # a run is never its own baseline
    for r in store.list_runs(limit=10):
        assert baseline_runs.AWAITS not in (r.meta or {})


def test_setting_off_keeps_one_run_per_delivery(store: Any, queue: str, make_settings: Any) -> None:
    rec = Recorder()
    dispatcher = RunDispatcher(make_settings(baseline_runs=False), store, planner=test_planner(queue),
                               dispatch=rec, mode="broker")
    dispatcher.submit_many([(_request(), "github:off")])
    assert [s for s, _ in rec.sent] == [HEAD] and len(store.list_runs(limit=10)) == 1


def test_embedded_pool_runs_the_baseline_first_and_judges_after(tmp_path: Path) -> None:
    """The real embedded path: a webhook run's jobs and its baseline run's jobs run on this process's local
    pool (real worker subprocesses, a real pass repository whose revisions fail to convert fast), and the
    webhook run is finished and judged only after its baseline run, against the baseline's own results."""
    from service.api import dispatch as dispatch_mod
    from service.db import Store
    from service.orchestration.scheduler import SweepConfig
    from service.settings import Settings
    from tests.service.cli.test_sweep_validation import _model

    repo = tmp_path / "passrepo"
    (repo / "amp_pass").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    revs = []
    for i in range(2):
        (repo / "amp_pass" / "__init__.py").write_text(f"VALUE = {i}\n")  # no converter: fails fast
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"c{i}")
        revs.append(_git(repo, "rev-parse", "HEAD"))
    digest = _model(tmp_path / "tiny.onnx")
    zoo = tmp_path / "zoo.toml"
    zoo.write_text(f'[models.tiny]\nsource = {{ path = "tiny.onnx" }}\nsha256 = "{digest}"\ntags = ["t"]\n'
                   'inputs.x = { shape = [1, 4], dtype = "float32" }\n')
    config = SweepConfig.from_dict({"name": "smoke", "zoo": str(zoo), "models": ["tiny"], "dtypes": ["fp16", "bf16"],
                                    "policies": ["default"], "targets": ["cpu"], "repeats": 10})
    cells = config.expand({"tiny": ["t"]})
    url = f"sqlite:///{tmp_path / 'ampci.sqlite3'}"
    settings = Settings(database_url=url, broker_url="", pass_repo=str(repo), cache_dir=tmp_path / "cache",
                        data_dir=tmp_path / "data", baseline_runs=True, confirm_pairs=0, local_workers=1)
    store = Store.from_url(url)
    store.upgrade()
    dispatcher = RunDispatcher(settings, store, planner=lambda sweep: cells)
    try:
        (sub,) = dispatcher.submit_many([(_request(head=revs[1], base=revs[0]), "github:embedded")])
        deadline = time.monotonic() + 240
        while store.get_run(sub.run_id).status not in FINAL_RUN_STATES:
            assert time.monotonic() < deadline, [(j.run_id, j.status) for r in store.list_runs() for j in
                                                 store.jobs(r.id)]
            time.sleep(0.2)
        (base_run,) = [r for r in store.list_runs(limit=10) if r.revision_sha == revs[0]]
        cand = store.get_run(sub.run_id)
        assert base_run.status in FINAL_RUN_STATES and base_run.trigger == "manual"
        assert cand.finished_at is not None and base_run.finished_at is not None
        assert cand.finished_at >= base_run.finished_at  # judged after the baseline's cells were in
        verdict = run_verdict(store, cand.id)
        assert verdict.decision.not_compared == () and verdict.decision.compared == len(cells)
        assert set(baseline_statuses(store, cand.id)) == {c.cell for c in cells}
    finally:
        pool = dispatch_mod._LOCAL_POOLS.pop((os.getpid(), settings), None)
        if pool is not None:
            pool.close()
        store.dispose()
