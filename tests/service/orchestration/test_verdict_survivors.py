"""Rules of the verdict that an independent mutation audit broke with the whole suite green (issue 34), each
pinned here on the real store (SQLite and PostgreSQL):

* a new cell that failed ``convert_error`` with **no baseline** fails the gate, and neither
  :attr:`RunVerdict.state` nor the commit status built on it says ``success``;
* a job that ended ``error`` without a result fails :func:`run_verdict` (never "gate passes");
* a suspected recovery resolves only on an improvement beyond ``1 / ratio_limit`` of its kind, never on a
  smaller one that clears the floor and the paired test (e.g. 5-10 %).
"""

from __future__ import annotations

import pytest

from service.db import Store
from service.github.reporter import status_text
from service.orchestration.jobs import finish_if_complete
from service.orchestration.judge import run_verdict
from service.regressions.confirm import recovery_verdict
from service.regressions.thresholds import Thresholds
from service.regressions.verdict import decide_run, summary_facts
from tests.service.factories import chain, make_result, run_with
from tests.service.orchestration.test_confirm import StandInWorker, make_run, slow_conversion

TH = Thresholds()
A, B = ("tiny_mlp", "fp16", "default", "cpu"), ("tiny_mlp", "bf16", "default", "cpu")


def test_a_new_cell_that_cannot_convert_is_no_success_on_the_verdict_or_the_commit_status(store: Store) -> None:
    (rev,) = chain(store, 1)
    run = run_with(store, rev, [make_result(A, status="convert_error"), make_result(B)])
    verdict = run_verdict(store, run)
    assert verdict.exit_code == 1 and verdict.decision.unmeasured == ((A, "convert_error"),)
    assert verdict.state == "failure"  # the pass failed (not the infrastructure): failure, never success
    assert verdict.headline().startswith("gate fails: 1 of 2 cells could not measure (1 convert_error)")
    summary = store.run_summary(run)
    assert summary.regressions == {}  # no finding at all: only the verdict knows the cell failed
    assert decide_run(summary_facts(summary)).state == "success"  # what the counts alone would post ...
    state, description = status_text(store, run, summary)
    assert state == "failure" == verdict.state  # ... and what is posted: the verdict's
    assert description.startswith("1 of 2 cells could not measure (1 convert_error)")


def test_a_job_that_ended_error_without_a_result_fails_the_verdict(store: Store) -> None:
    a, b = chain(store, 2)
    run_with(store, a, [make_result(A), make_result(B)])
    run = store.create_run(b, "push", cells=[A, B])
    jobs = {j.cell: j for j in store.jobs(run)}
    store.write_result(run, make_result(A, seed=1), job_id=jobs[A].id)
    store.mark_job(jobs[A].id, "done")
    store.mark_job(jobs[B].id, "error", "worker lost: no result")
    store.finish_run(run)
    verdict = run_verdict(store, run)
    assert verdict.exit_code == 1, verdict.headline()
    assert verdict.decision.unmeasured == ((B, "job_error"),)
    assert verdict.state == "error"  # no worker answer: the infrastructure, said as an error
    assert verdict.headline().startswith("gate fails: 1 of 2 cells could not measure (1 job_error)")
    assert "no regressions" not in verdict.headline()
    assert status_text(store, run, store.run_summary(run))[0] == "error"


@pytest.mark.parametrize(("kind", "unit", "regressed", "factor"), [
    ("conversion_time", "s", 5.0, 0.90),   # limit x1.20: recovery below x0.833; x0.90 is 0.5 s faster (floor 0.1 s)
    ("conversion_time", "s", 5.0, 0.95),
    ("latency", "ms", 10.0, 0.93),         # limit x1.10: recovery below x0.909; x0.93 is 0.7 ms faster (floor 0.05)
])
def test_a_recovery_smaller_than_the_inverse_ratio_limit_is_not_confirmed(kind: str, unit: str, regressed: float,
                                                                          factor: float) -> None:
    slow = [regressed * (1 + 0.001 * i) for i in range(8)]
    faster = [x * factor for x in slow]  # every pair faster, beyond the floor: only the ratio limit holds it
    v = recovery_verdict(kind, slow, faster, TH, unit)
    assert v.p_value < TH.confirm_p and v.difference < -limits_floor(kind)
    assert not v.confirmed and v.ratio == pytest.approx(factor)
    assert recovery_verdict(kind, slow, [x * 0.8 for x in slow], TH, unit).confirmed  # beyond it: confirmed


def limits_floor(kind: str) -> float:
    return TH.convert_time_floor_s if kind == "conversion_time" else TH.latency_floor_ms


def test_a_ten_percent_faster_revision_does_not_resolve_a_confirmed_slowdown(store: Store) -> None:
    a, b, c = chain(store, 3)
    make_run(store, a, [slow_conversion(1, 3.0)], confirm_pairs=8)
    run_b = make_run(store, b, [slow_conversion(2, 5.0)], confirm_pairs=8)
    base, regressed = [3.0 + 0.001 * i for i in range(8)], [5.0 + 0.001 * i for i in range(8)]
    worker = StandInWorker(store, {"conversion_time": (base, regressed)})
    finish_if_complete(store, run_b, dispatch=worker)
    worker.work()
    (reg,) = store.regressions(run_id=run_b)
    assert reg.state == "open"
    # c's job looks back at a's level; its confirmation finds it only 10 % faster than b: not a recovery
    run_c = make_run(store, c, [slow_conversion(3, 3.0)], confirm_pairs=8)
    worker = StandInWorker(store, {"conversion_time": (regressed, [x * 0.9 for x in regressed])})
    assert finish_if_complete(store, run_c, dispatch=worker) is False
    assert store.get_regression(reg.id).state == "suspected_resolved"
    worker.work()
    got = store.get_regression(reg.id)
    assert got.state == "open" and got.state_note.startswith("recovery not confirmed by 8 interleaved pairs")
