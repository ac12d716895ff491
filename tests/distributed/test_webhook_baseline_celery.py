"""Celery mode: a webhook push run whose baseline revision lacks some cells gets a baseline run for them,
a real worker runs both, and the push run is judged (finished, detected) only after the baseline run, against
the baseline revision's own results.  Real PostgreSQL, a private Redis, a real worker (stopped by pid)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from service.api.dispatch import CeleryDispatch, RunDispatcher
from service.github.events import RevisionInfo, RunRequest
from service.orchestration.judge import baseline_statuses, run_verdict
from service.orchestration.scheduler import SweepConfig, open_store
from service.settings import Settings
from service.vocabulary import FINAL_RUN_STATES
from tests.distributed.conftest import git
from tests.service.factories import make_result

pytestmark = [pytest.mark.celery, pytest.mark.redis, pytest.mark.postgres]


def test_push_run_waits_for_its_baseline_run_on_a_celery_worker(cluster_env: dict[str, str], start_worker: Any,
                                                               pass_repo: Path) -> None:
    base, head = git(pass_repo, "rev-parse", "HEAD~1"), git(pass_repo, "rev-parse", "HEAD")
    settings = Settings.from_env({**cluster_env, "AMPCI_BASELINE_RUNS": "true", "AMPCI_CONFIRM_PAIRS": "0"})
    config = SweepConfig.from_dict({"name": "smoke", "models": ["noop_a", "noop_b"], "dtypes": ["fp16"],
                                    "policies": ["default"], "targets": ["cpu"], "repeats": 6})
    cells = config.expand({"noop_a": {"test"}, "noop_b": {"test"}})
    store = open_store(settings)
    store.upsert_revision(base, [], "main", "t", "first")
    old = store.create_run(base, "push", cells=[cells[0].cell])  # the baseline has a result for noop_a only
    store.write_result(old, make_result(cells[0].cell))
    store.finish_run(old)
    worker = start_worker("wb0", queues="cpu")
    worker.wait_ready()
    dispatcher = RunDispatcher(settings, store, planner=lambda sweep: cells, dispatch=CeleryDispatch(), mode="broker")
    request = RunRequest(repo="acme/amp-pass", trigger="push", head_sha=head, baseline_sha=base, branch="main",
                         revisions=[RevisionInfo(head, [base], "main", "t", "second", None)])
    (sub,) = dispatcher.submit_many([(request, "github:celery-baseline")])
    deadline = time.monotonic() + 120
    while store.get_run(sub.run_id).status not in FINAL_RUN_STATES:
        assert time.monotonic() < deadline, [(r.id, r.status, [j.status for j in store.jobs(r.id)])
                                             for r in store.list_runs(limit=10)]
        time.sleep(0.2)
    (made,) = [r for r in store.list_runs(limit=10) if r.revision_sha == base and r.id != old]
    assert made.trigger == "manual" and [j.cell for j in store.jobs(made.id)] == [cells[1].cell]
    cand = store.get_run(sub.run_id)
    assert made.status == "complete" and cand.status == "complete"
    assert cand.finished_at is not None and made.finished_at is not None and cand.finished_at >= made.finished_at
    assert baseline_statuses(store, cand.id) == {c.cell: (base, "pass") for c in cells}
    verdict = run_verdict(store, cand.id)
    assert verdict.decision.not_compared == () and verdict.decision.compared == 2 and verdict.state == "success"
    store.dispose()
