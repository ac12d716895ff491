"""Whose failure is it: ampci's own failures (``error``) and cells not run (``unmeasured``) are not results of the
pass.  They never serve as a baseline, never count as a known failure nor as a flip of a flaky lineage, and a run
with one is neither green nor red (state ``error``, a re-run its remedy); a run in which nothing was measured
never passes its gate, whatever its baseline did."""

from __future__ import annotations

import pytest

from service.orchestration.judge import baseline_revisions, detect_run, run_verdict
from service.regressions.thresholds import Thresholds
from tests.service.factories import chain, make_result, migrated_store, run_with
from workers.result import NOT_OF_THE_PASS, JobResult

A, B = ("tiny_mlp", "fp16", "default", "cpu"), ("tiny_mlp", "bf16", "default", "cpu")
SANDBOX = "infrastructure: the sandbox cannot import onnx.inliner (site-packages under /tmp)"


def failed(cell: tuple[str, str, str, str], status: str) -> JobResult:
    """A result of ``cell`` with ``status`` and the sandbox's cause as its message."""
    r = make_result(cell, status=status)
    r.message = SANDBOX
    return r


@pytest.mark.parametrize("status", sorted(NOT_OF_THE_PASS))
def test_a_result_that_is_not_the_pass_is_never_a_baseline(sqlite_url: str, status: str) -> None:
    store = migrated_store(sqlite_url)
    shas = chain(store, 3)
    run_with(store, shas[0], [make_result(A), make_result(B)])
    bad = run_with(store, shas[1], [failed(A, status), make_result(B)])
    verdict = run_verdict(store, bad)
    assert (verdict.state, verdict.exit_code) == ("error", 1)  # neither green nor red
    assert not verdict.decision.known_failures and verdict.decision.unmeasured == ((A, status),)
    assert not store.regressions(run_id=bad)  # no finding of the pass from ampci's failure
    later = run_with(store, shas[2], [make_result(A), make_result(B)])
    assert baseline_revisions(store, later) == {A: shas[0], B: shas[1]}  # the error result is skipped
    again = run_with(store, shas[2], [failed(A, status), make_result(B)])
    assert run_verdict(store, again).decision.known_failures == ()  # not "the same way" as any baseline
    store.dispose()


def test_an_infrastructure_error_says_it_is_not_the_pass_and_a_rerun_is_the_remedy(sqlite_url: str) -> None:
    store = migrated_store(sqlite_url)
    shas = chain(store, 2)
    run_with(store, shas[0], [make_result(A)])
    run = run_with(store, shas[1], [failed(A, "error")])
    verdict = run_verdict(store, run)
    assert verdict.state == "error" and "failed by ampci" in verdict.headline()
    assert "re-run" in verdict.headline() and "onnx.inliner" in verdict.headline()
    assert any("re-run" in r for r in verdict.decision.reasons)
    store.dispose()


def test_alternating_infrastructure_failures_are_no_flaky_flips(sqlite_url: str) -> None:
    """One revision measured alternately by a broken and a working worker, then a child that really regresses
    accuracy: a regression, not flaky (the issue's reproduction, with accuracy for timing)."""
    store = migrated_store(sqlite_url)
    store.thresholds = Thresholds(flaky_flips=2, flaky_window=10)
    shas = chain(store, 2)
    for i in range(5):
        run_with(store, shas[0], [failed(A, "error") if i % 2 else make_result(A)])
    run = run_with(store, shas[1], [make_result(A, max_abs=1.0)])
    found = [(f.kind, f.category) for f in store.regressions(run_id=run)]
    assert ("accuracy", "regression") in found and not [c for _, c in found if c == "flaky"], found
    assert run_verdict(store, run).state == "failure"
    store.dispose()


def test_alternating_pass_failures_of_the_pass_still_are_flaky(sqlite_url: str) -> None:
    """The control: the same alternation with the pass's own failure is flaky, so the rule above is not vacuous."""
    store = migrated_store(sqlite_url)
    store.thresholds = Thresholds(flaky_flips=2, flaky_window=10)
    shas = chain(store, 2)
    for i in range(5):
        run_with(store, shas[0], [make_result(A, status="convert_error" if i % 2 else "pass")])
    run = run_with(store, shas[1], [make_result(A, max_abs=1.0)])
    assert "flaky" in [f.category for f in store.regressions(run_id=run)]
    store.dispose()


def test_nothing_measured_is_never_green_whatever_the_baseline(sqlite_url: str) -> None:
    store = migrated_store(sqlite_url)
    shas = chain(store, 2)
    run_with(store, shas[0], [make_result(A, status="convert_error"), make_result(B, status="convert_error")])
    run = run_with(store, shas[1], [make_result(A, status="convert_error"), make_result(B, status="convert_error")])
    verdict = run_verdict(store, run)
    assert (verdict.state, verdict.exit_code) == ("failure", 1)
    assert "nothing measured: none of the 2 cells converted" in verdict.headline()
    assert "2 cells fail to convert, as at the baseline" in verdict.headline()
    assert "passes" not in verdict.headline() and "known failure" not in verdict.headline()
    detect_run(store, run)
    store.dispose()
