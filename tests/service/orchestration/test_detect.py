"""Regression detection applied to runs: baselines, storing, flaky cells, nightly change points, resolution."""

from __future__ import annotations

import pytest

from service.db import Store
from service.orchestration.judge import detect_run
from service.regressions.thresholds import Thresholds
from tests.service.factories import CELL, chain, make_result, run_with, sha


def kinds(regs) -> list[tuple[str, str, str]]:  # type: ignore[no-untyped-def]
    return sorted((r.kind, r.category, r.state) for r in regs)


def test_push_baseline_walks_back_to_nearest_ancestor_with_a_result(store: Store) -> None:
    shas = chain(store, 4)
    run_with(store, shas[0], [make_result(max_abs=1e-3)])
    run_with(store, shas[1], [make_result(max_abs=0.3)], detect=False)
    # shas[2] has no result; shas[3] must compare with shas[1] (nearest), not shas[0]
    r3 = run_with(store, shas[3], [make_result(max_abs=0.3)])
    # no step against shas[1]; the jump since shas[0], which nothing reported (shas[1] was not detected), is a
    # drift against the window's start, not a parent comparison's finding
    assert [(g.kind, g.metric, g.baseline_sha) for g in store.regressions(run_id=r3)] == [("drift", "max_abs", shas[0])]
    r1_regs = detect_run(store, store.list_runs(revision=shas[1])[0].id)
    assert kinds(r1_regs) == [("accuracy", "regression", "open")]
    (reg,) = r1_regs
    assert (reg.baseline_sha, reg.revision_sha, reg.metric) == (shas[0], shas[1], "max_abs")
    assert reg.baseline_value == 1e-3 and reg.value == 0.3 and reg.delta == pytest.approx(0.299)
    assert store.get_result(reg.result_id).accuracy.worst.max_abs == 0.3
    # a run with no ancestor results has nothing to compare with
    assert detect_run(store, store.list_runs(revision=shas[0])[0].id) == []


def test_detection_is_idempotent_and_keeps_human_state(store: Store) -> None:
    shas = chain(store, 2)
    run_with(store, shas[0], [make_result()])
    r = run_with(store, shas[1], [make_result(status="convert_error")])
    first = detect_run(store, r)
    store.ack(first[0].id, by="alice", note="known")
    second = detect_run(store, r)
    assert [(x.id, x.state, x.state_by) for x in second] == [(first[0].id, "acknowledged", "alice")]
    assert kinds(second) == [("conversion", "regression", "acknowledged")]
    # a rewritten result that no longer regresses removes the stale open finding on re-detection
    r2 = run_with(store, shas[1], [make_result(max_abs=0.5)], trigger="manual")
    assert kinds(store.regressions(run_id=r2)) == [("accuracy", "regression", "open")]
    store.write_result(r2, make_result(max_abs=1e-3))
    assert detect_run(store, r2) == []


def test_pull_request_compares_with_merge_base(store: Store) -> None:
    main = chain(store, 3)
    run_with(store, main[0], [make_result(max_abs=1e-3)])
    run_with(store, main[2], [make_result(max_abs=0.9)], detect=False)
    pr = sha(500)
    store.upsert_revision(pr, [main[0]], "feature")
    r = run_with(store, pr, [make_result(max_abs=1.1e-3)], trigger="pull_request", baseline=main[0])
    assert store.regressions(run_id=r) == []  # compared with the merge base, not main's head
    r2 = run_with(store, pr, [make_result(max_abs=0.2)], trigger="pull_request", baseline=main[0])
    (reg,) = store.regressions(run_id=r2)
    assert reg.baseline_sha == main[0]


def test_pull_request_baseline_that_is_not_its_parent(store: Store) -> None:
    """The PR's head sits on main[2] (a bad result) but its baseline is main[0]: comparing with the parent's
    lineage instead of the baseline would call the PR an improvement instead of a regression."""
    main = chain(store, 3)
    run_with(store, main[0], [make_result(max_abs=1e-3)])
    run_with(store, main[2], [make_result(max_abs=0.9)], detect=False)
    pr = sha(501)
    store.upsert_revision(pr, [main[2]], "feature")
    r = run_with(store, pr, [make_result(max_abs=0.2)], trigger="pull_request", baseline=main[0])
    (reg,) = store.regressions(run_id=r)
    assert (reg.category, reg.baseline_sha, reg.baseline_value) == ("regression", main[0], 1e-3)
    ok = run_with(store, pr, [make_result(max_abs=1.1e-3)], trigger="pull_request", baseline=main[0])
    assert store.regressions(run_id=ok) == []


def test_only_a_descendant_of_the_regressed_revision_resolves_it(store: Store) -> None:
    shas = chain(store, 3)
    run_with(store, shas[0], [make_result()])
    bad = run_with(store, shas[1], [make_result(status="fail_accuracy", max_abs=0.5)])
    (reg,) = store.regressions(run_id=bad)
    run_with(store, shas[0], [make_result(seed=1)], trigger="manual")  # the base again: still broken at shas[1]
    assert store.get_regression(reg.id).state == "open"
    side = sha(700)  # a branch off the base that never had the bad change
    store.upsert_revision(side, [shas[0]], "side")
    run_with(store, side, [make_result(seed=2)], trigger="push")
    assert store.get_regression(reg.id).state == "open"
    run_with(store, shas[2], [make_result(seed=3)])  # contains shas[1]: a fix
    fixed = store.get_regression(reg.id)
    assert fixed.state == "resolved" and fixed.state_note.startswith(f"returned to baseline at {shas[2][:12]}")


def test_improvement_recorded_and_regression_resolved_by_later_push(store: Store) -> None:
    shas = chain(store, 3)
    run_with(store, shas[0], [make_result()])
    bad = run_with(store, shas[1], [make_result(status="fail_accuracy", max_abs=0.5)])
    (reg,) = store.regressions(run_id=bad)
    summary = store.run_summary(bad)
    assert summary.describe() == "1 cells: 0 pass, 1 fail_accuracy, 1 accuracy regression"
    fixed = run_with(store, shas[2], [make_result(max_abs=1.1e-3)])
    assert kinds(store.regressions(run_id=fixed)) == [("accuracy", "improvement", "open")]
    resolved = store.get_regression(reg.id)
    assert resolved.state == "resolved" and resolved.state_by == "ampci"
    assert store.results(run_id=fixed)[0].id == resolved.resolved_by_result_id
    assert resolved.state_note.startswith(f"returned to baseline at {shas[2][:12]}")
    assert store.regressions(state="open", category="regression") == []


def test_pull_request_run_does_not_resolve_main_regressions(store: Store) -> None:
    shas = chain(store, 2)
    run_with(store, shas[0], [make_result()])
    bad = run_with(store, shas[1], [make_result(status="convert_error")])
    pr = sha(600)
    store.upsert_revision(pr, [shas[1]], "feature")
    run_with(store, pr, [make_result()], trigger="pull_request", baseline=shas[1])
    assert store.regressions(run_id=bad)[0].state == "open"


def test_flaky_cell_is_reported_as_flaky(store: Store) -> None:
    shas = chain(store, 6)
    statuses = ["pass", "fail_accuracy", "pass", "fail_accuracy", "pass", "fail_accuracy"]
    runs = [run_with(store, s, [make_result(status=st, max_abs=1e-3)]) for s, st in zip(shas, statuses, strict=True)]
    assert kinds(store.regressions(run_id=runs[1])) == [("accuracy", "regression", "resolved")]  # by runs[2]
    assert kinds(store.regressions(run_id=runs[-1])) == [("accuracy", "flaky", "open")]
    assert "flips" in store.regressions(run_id=runs[-1])[0].detail
    assert store.run_summary(runs[-1]).describe() == "1 cells: 0 pass, 1 fail_accuracy, 1 flaky"


def test_allowlisted_cell_is_flaky(store: Store) -> None:
    shas = chain(store, 2)
    th = Thresholds(flaky_allowlist=("tiny_*/fp16/*/*",))
    run_with(store, shas[0], [make_result()])
    r = run_with(store, shas[1], [make_result(status="convert_error")], detect=False)
    (reg,) = detect_run(store, r, th)
    assert (reg.kind, reg.category, reg.detail) == ("conversion", "flaky",
                                                    "flaky (allowlisted): converted at baseline (pass), now convert_error")


def test_latency_needs_same_environment(store: Store) -> None:
    shas = chain(store, 3)
    run_with(store, shas[0], [make_result(latency_ms=2.0, env="a")])
    slow_other = run_with(store, shas[1], [make_result(latency_ms=4.0, env="b", seed=1)])
    assert store.regressions(run_id=slow_other) == []
    slow_same = run_with(store, shas[2], [make_result(latency_ms=8.0, env="b", seed=2)])
    (reg,) = store.regressions(run_id=slow_same)
    assert (reg.kind, reg.severity, reg.p_value < 0.002) == ("latency", "major", True)
    assert reg.ratio == pytest.approx(2.0, rel=0.05)


def test_nightly_latency_needs_two_consecutive_violations(store: Store) -> None:
    (rev,) = chain(store, 1)
    p50s = [2.0, 2.02, 1.98, 2.01, 1.99, 2.0, 2.03, 1.97, 2.0, 2.01]
    for i, ms in enumerate(p50s):
        run_with(store, rev, [make_result(latency_ms=ms, seed=i)], trigger="nightly")
    night1 = run_with(store, rev, [make_result(latency_ms=2.6, seed=20)], trigger="nightly")
    assert store.regressions(run_id=night1) == []  # one slow night: not yet
    night2 = run_with(store, rev, [make_result(latency_ms=2.62, seed=21)], trigger="nightly")
    (reg,) = store.regressions(run_id=night2)
    assert (reg.kind, reg.category, reg.metric) == ("latency", "regression", "latency_p50_ms")
    assert "2 consecutive nights" in reg.detail and reg.p_value < 0.001
    night3 = run_with(store, rev, [make_result(latency_ms=2.61, seed=22)], trigger="nightly")
    assert store.regressions(run_id=night3) == []  # already open: not reopened every night
    back = run_with(store, rev, [make_result(latency_ms=2.0, seed=23)], trigger="nightly")
    assert store.get_regression(reg.id).state == "resolved"
    assert [r.category for r in store.regressions(run_id=back)] == []


def test_many_cells_one_run(store: Store) -> None:
    shas = chain(store, 2)
    cells = [(f"m{i}", "fp16", "default", "cpu") for i in range(30)]
    run_with(store, shas[0], [make_result(c) for c in cells])
    new = [make_result(c, max_abs=0.5 if i % 10 == 0 else 1e-3, seed=i) for i, c in enumerate(cells)]
    r = run_with(store, shas[1], new)
    regs = store.regressions(run_id=r)
    assert sorted(x.model for x in regs) == ["m0", "m10", "m20"]
    assert store.run_summary(r).describe() == "30 cells: 30 pass, 3 accuracy regressions"
    assert store.regressions(revision=shas[1][:8], state="open") == regs
    assert CELL not in {x.cell for x in regs}


def test_baseline_search_goes_deep_and_per_cell(store: Store) -> None:
    shas = chain(store, 9)
    other = ("other", "bf16", "default", "cpu")
    run_with(store, shas[0], [make_result(CELL, max_abs=1e-3)])            # depth 8 from shas[8]
    run_with(store, shas[6], [make_result(other, status="pass")])         # depth 2 from shas[8]
    r = run_with(store, shas[8], [make_result(CELL, max_abs=0.9), make_result(other, status="convert_error")])
    got = {(x.model, x.kind): x.baseline_sha for x in store.regressions(run_id=r)}
    assert got == {("tiny_mlp", "accuracy"): shas[0], ("other", "conversion"): shas[6]}
    th = Thresholds(ancestor_depth=5)
    assert {x.model for x in detect_run(store, r, th)} == {"other"}  # shas[0] is beyond the limit


@pytest.mark.parametrize("state", ["open", "acknowledged"])
def test_nightly_does_not_reopen_a_regression_a_human_acknowledged(store: Store, state: str) -> None:
    a, b = chain(store, 2)
    run_with(store, a, [make_result(max_abs=1e-3)], trigger="nightly")
    push = run_with(store, b, [make_result(max_abs=5e-2, seed=1)], trigger="push")
    (reg,) = [r for r in store.regressions(run_id=push) if r.category == "regression"]
    assert reg.kind == "accuracy"
    if state == "acknowledged":
        store.ack(reg.id, by="alice", note="known: new kernel")
    # the next nightly runs b against the previous nightly's revision a: the same finding, already triaged
    night = run_with(store, b, [make_result(max_abs=5e-2, seed=2)], trigger="nightly", baseline=a)
    assert [r for r in store.regressions(run_id=night) if r.category == "regression"] == []
    got = store.get_regression(reg.id)
    assert (got.state, got.state_by) == (state, "alice" if state == "acknowledged" else None)
