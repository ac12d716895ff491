"""Rules of the verdict that a mutation audit could break with the whole suite green, each pinned here:

* the baseline of a cell is the **newest** result at the nearest ancestor that has one;
* a run is never its own baseline (a run whose baseline sha is its own revision still regresses);
* the documented default latency p-threshold (0.002), and that the minimum sample count can reach it;
* the stored cosine is the **worst** output's (what the job measured over every output).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from service.orchestration.judge import baseline_statuses
from service.regressions.rules import _can_reach
from service.regressions.stats import mann_whitney_p
from service.regressions.thresholds import Thresholds
from tests.docs_text import page
from tests.service.factories import chain, make_result, migrated_store, run_with
from workers.measure.metrics import compare_outputs
from workers.result import AccuracyReport

CELL = ("tiny_mlp", "fp16", "default", "cpu")
VERDICTS = page("verdicts.md")  # the guide's page on how each finding is decided


def test_baseline_is_the_newest_result_at_the_nearest_ancestor(sqlite_url: str) -> None:
    store = migrated_store(sqlite_url)
    shas = chain(store, 3)
    run_with(store, shas[0], [make_result(CELL)])                                  # an older ancestor: passes
    run_with(store, shas[1], [make_result(CELL, status="fail_accuracy", max_abs=0.4)],  # parent, older: fails
             trigger="pull_request")  # (not in the push lineage, so the cell's pass/fail flips stay few)
    newest = run_with(store, shas[1], [make_result(CELL, seed=1)])                 # parent, newest: passes
    run = run_with(store, shas[2], [make_result(CELL, status="fail_accuracy", max_abs=0.4, seed=2)])
    assert baseline_statuses(store, run) == {CELL: (shas[1], "pass")}
    (reg,) = [r for r in store.regressions(run_id=run) if r.kind == "accuracy"]
    assert reg.category == "regression" and "pass -> fail_accuracy" in reg.detail
    assert reg.baseline_result_id == store.results(run_id=newest)[0].id and reg.baseline_sha == shas[1]
    store.dispose()


def test_a_run_is_never_its_own_baseline(sqlite_url: str) -> None:
    store = migrated_store(sqlite_url)
    shas = chain(store, 2)
    run_with(store, shas[0], [make_result(CELL)])
    # a run whose baseline revision is its own: its own result is never what it is compared with
    run = run_with(store, shas[1], [make_result(CELL, status="fail_accuracy", max_abs=0.4)], baseline=shas[1])
    assert baseline_statuses(store, run) == {CELL: (shas[0], "pass")}
    assert [r.kind for r in store.regressions(run_id=run, category="regression")] == ["accuracy"]
    store.dispose()


def test_default_latency_p_threshold_is_the_documented_one_and_reachable() -> None:
    th = Thresholds()
    assert th.latency_p == 0.002
    n = th.latency_min_samples
    prose = " ".join(VERDICTS.split())  # the page's words, whatever its line breaks
    assert f"Mann-Whitney U p < {th.latency_p:g}" in prose and f"cannot reach p < {th.latency_p:g}" in prose
    assert f"(fewer than {n} per side" in prose
    assert _can_reach(n, n, th.latency_p)  # the fewest samples the rule accepts can reach the threshold
    assert mann_whitney_p([2.0 + i for i in range(n)], [float(i) / 10 for i in range(n)], "greater") < th.latency_p
    # and the threshold is not looser than one sample fewer could show (the minimum is not arbitrary)
    assert not _can_reach(2, 2, th.latency_p)


def test_stored_cosine_is_the_worst_outputs(sqlite_url: str) -> None:
    rng = np.random.default_rng(0)
    ref = {"good": rng.standard_normal(256).astype(np.float32), "bad": rng.standard_normal(256).astype(np.float32)}
    got = {"good": ref["good"].copy(), "bad": ref["bad"] + rng.standard_normal(256).astype(np.float32) * 0.3}
    per, worst = compare_outputs(ref, got)
    assert per["good"].cosine > per["bad"].cosine
    assert worst.cosine == min(m.cosine for m in per.values()) == per["bad"].cosine
    store = migrated_store(sqlite_url)
    (sha,) = chain(store, 1)
    base = make_result(CELL)
    accuracy = AccuracyReport(mode="emulation", provider="CPUExecutionProvider", per_output=per, worst=worst,
                              passed=True)
    run = run_with(store, sha, [replace(base, accuracy=accuracy)])
    (row,) = store.results(run_id=run)
    assert row.cosine is not None and abs(row.cosine - per["bad"].cosine) < 1e-9
    store.dispose()
