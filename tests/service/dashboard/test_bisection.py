"""The regression page's read-only bisection state follows the real bisection (``service.regressions.bisect``)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from service.dashboard.bisection import bisect_view
from service.orchestration.bisection import bisect_step
from service.orchestration.judge import detect_run
from tests.service.dashboard.seed import ACC_CELL, make_result, sha

pytestmark = pytest.mark.postgres


@pytest.fixture
def store(pg_url: str) -> Iterator[Any]:
    from service.db import Store

    s = Store.from_url(pg_url)
    s.upgrade()
    yield s
    s.dispose()


def write(store: Any, run_id: int, rev: str, bad: bool) -> None:
    store.write_result(run_id, make_result(ACC_CELL, rev, 0, random.Random(1), accuracy_bad=bad))
    store.finish_run(run_id)


def test_bisection_state_through_the_real_steps(store: Any) -> None:
    revs = [sha(f"bisect-{i}") for i in range(5)]  # a b c d e; only a and e tested
    for i, rev in enumerate(revs):
        store.upsert_revision(rev, parents=[revs[i - 1]] if i else [], branch="main")
    first = store.create_run(revs[0], "push", cells=[ACC_CELL])
    write(store, first, revs[0], bad=False)
    last = store.create_run(revs[4], "push", cells=[ACC_CELL])
    write(store, last, revs[4], bad=True)
    (reg,) = [f for f in detect_run(store, last) if f.category == "regression"]
    assert reg.baseline_sha == revs[0]

    view = bisect_view(store, reg)
    assert view.status == "in_progress" and view.remaining == 3
    assert [c.verdict for c in view.commits] == ["good", "untested", "untested", "untested", "bad"]
    assert f"--regression {reg.id}" in view.note
    runs_before = len(store.list_runs(limit=100))
    bisect_view(store, reg)
    assert len(store.list_runs(limit=100)) == runs_before  # looking never creates runs

    step = bisect_step(store, reg.id)  # the real step queues the midpoint (c)
    (mid_run,) = step.queued_runs
    view = bisect_view(store, reg)
    assert [c.verdict for c in view.commits][2] == "pending" and "1 bisect runs pending" in view.note

    write(store, mid_run, revs[2], bad=True)
    view = bisect_view(store, reg)
    assert [c.verdict for c in view.commits] == ["good", "untested", "bad", "untested", "bad"]
    assert view.remaining == 1 and view.good == revs[0] and view.bad == revs[2]

    (b_run,) = bisect_step(store, reg.id).queued_runs
    write(store, b_run, revs[1], bad=False)
    view = bisect_view(store, reg)
    assert view.status == "found" and view.bad == revs[2] and revs[2][:12] in view.note
    assert bisect_step(store, reg.id).first_bad == revs[2]  # agrees with the real bisection


def test_bisection_not_possible_without_baseline_or_for_improvements(store: Any) -> None:
    rev = sha("lonely")
    store.upsert_revision(rev, branch="main")
    run = store.create_run(rev, "push", cells=[ACC_CELL])
    write(store, run, rev, bad=True)
    assert detect_run(store, run) == []
    fake = type("R", (), {"category": "improvement"})()
    assert bisect_view(store, fake).status == "not_bisectable"
