"""Webhook push and pull-request runs run their baseline revision's missing cells first, exactly as
``ampci sweep`` does, and are judged (detection, gate, commit status) only once those cells are in.

The jobs are completed here through the same store calls and the same ``finish_if_complete`` the
embedded pool and the Celery workers use, in both orders (candidate first, baseline first)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from service.api.dispatch import RunDispatcher
from service.github.events import RevisionInfo, RunRequest
from service.orchestration import baseline_runs
from service.orchestration.jobs import finish_if_complete
from service.regressions.verdict import run_verdict
from tests.api.conftest import test_planner
from tests.api.helpers import REPO, sha
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
        assert store.get_run(cand.id).status not in baseline_runs.FINAL_RUN_STATES
        assert store.regressions(run_id=cand.id) == []
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
