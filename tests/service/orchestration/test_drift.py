"""Drift over history (:mod:`service.regressions.drift`, detection in :mod:`service.regressions.detect`): a
creep of small steps, none beyond a rule's limits, is reported once, at the commit that tips it over against
the window's start or the pinned baseline, for every drift-judged metric (or, on a push, at the first commit
over the limit after one whose drift was dismissed or never judged); noise is not; a reported drift does not
fire again; a timing drift is confirmed against its reference.  Real stores (SQLite and PostgreSQL)."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from service.db import Store, pins
from service.orchestration.jobs import finish_if_complete
from service.regressions.rules import DRIFT_METRICS, KINDS, PAIRWISE_KINDS, TIMING_KINDS, timing_kind
from service.regressions.thresholds import Thresholds
from tests.service.factories import CELL, chain, make_result, run_with
from tests.service.orchestration.test_confirm import StandInWorker, make_run


def conversion(k: int, seconds: float, seed: int | None = None) -> object:
    r = make_result(CELL, seed=k if seed is None else seed)
    assert r.graph is not None
    rng = random.Random(k)
    r.graph.convert_samples_s = [seconds * (1 + rng.uniform(-0.01, 0.01)) for _ in range(5)]
    return r


#: metric -> (result of commit k of a creep, commit at which the cumulative change first passes the limits)
CREEPS: dict[str, tuple[Callable[[int], object], int]] = {
    "max_abs": (lambda k: make_result(CELL, max_abs=1e-3 * 1.3 ** k, seed=k), 3),           # x2 and +1e-3
    "casts_inserted": (lambda k: make_result(CELL, casts=4 + k, seed=k), 2),                 # x1.1 and +2
    "final_error": (lambda k: make_result(CELL, diverged=False, final_error=1e-3 * 1.3 ** k, seed=k), 3),
    "latency_p50_ms": (lambda k: make_result(CELL, latency_ms=2.0 * 1.04 ** k, seed=k), 3),  # x1.10
    "convert_s": (lambda k: conversion(k, 0.1 + 0.03 * k), 4),                               # x1.2 and +0.1 s
}


def test_every_drift_metric_is_a_kinds_metric_and_drift_is_a_kind() -> None:
    assert "drift" in KINDS and "drift" not in PAIRWISE_KINDS
    assert set(DRIFT_METRICS.values()) == set(PAIRWISE_KINDS) - {"conversion"}
    assert {timing_kind("drift", m) for m in DRIFT_METRICS} - {None} == set(TIMING_KINDS)


@pytest.mark.parametrize("metric", sorted(CREEPS))
def test_a_creep_is_reported_once_at_the_commit_that_tips_it(store: Store, metric: str) -> None:
    make, tip = CREEPS[metric]
    shas = chain(store, 8)
    found: dict[int, list] = {}
    for k, rev in enumerate(shas):
        found[k] = store.regressions(run_id=run_with(store, rev, [make(k)]))
    assert all(not regs for k, regs in found.items() if k != tip), {k: [(g.kind, g.detail) for g in v]
                                                                    for k, v in found.items() if v}
    (reg,) = found[tip]
    assert (reg.kind, reg.category, reg.state, reg.metric) == ("drift", "regression", "open", metric)
    assert reg.baseline_sha == shas[0] and reg.revision_sha == shas[tip]
    assert f"over {tip} commits, since {shas[0][:12]} (the start of the {tip}-revision window)" in reg.detail
    assert f"drifted x{reg.ratio:.3g}" in reg.detail and "history: /history?model=tiny_mlp" in reg.detail
    assert store.regressions(state="open")


@pytest.mark.parametrize("metric", sorted(CREEPS))
def test_noise_commits_report_no_drift(store: Store, metric: str) -> None:
    make, _ = CREEPS[metric]
    rng = random.Random(7)
    for k, rev in enumerate(chain(store, 12)):
        level = rng.choice([0, 1])  # one step's worth of noise, up and down
        assert store.regressions(run_id=run_with(store, rev, [make(level) if level else make(0)])) == [] or \
            pytest.fail(f"commit {k}")


def test_a_drift_too_slow_for_the_window_is_caught_against_the_pinned_baseline(store: Store) -> None:
    th = Thresholds(drift_window=3)
    store.thresholds = th
    shas = chain(store, 8)
    run_with(store, shas[0], [make_result(CELL, max_abs=1e-3, seed=0)])
    with store.transaction() as conn:
        pins.pin(conn, branch="", sha=shas[0], now=store.clock(), note="release 1.0")
    found = {}
    for k in range(1, 8):  # x1.15 a commit: x1.52 over any 3-revision window, x2.01 over 5 commits
        found[k] = store.regressions(run_id=run_with(store, shas[k], [make_result(CELL, max_abs=1e-3 * 1.15 ** k,
                                                                                  seed=k)]))
    assert [k for k, v in found.items() if v] == [5]
    (reg,) = found[5]
    assert reg.kind == "drift" and reg.baseline_sha == shas[0] and "(the pinned baseline)" in reg.detail


def test_without_a_pin_the_same_slow_drift_stays_within_every_window(store: Store) -> None:
    store.thresholds = Thresholds(drift_window=3)
    for k, rev in enumerate(chain(store, 8)):
        assert store.regressions(run_id=run_with(store, rev, [make_result(CELL, max_abs=1e-3 * 1.15 ** k,
                                                                          seed=k)])) == []


def test_a_pin_of_another_branch_or_off_the_line_is_not_used(store: Store) -> None:
    store.thresholds = Thresholds(drift_window=3)
    shas = chain(store, 6)
    other = chain(store, 1, branch="side", start=100)[0]
    run_with(store, other, [make_result(CELL, max_abs=1e-4)])
    with store.transaction() as conn:
        pins.pin(conn, branch="", sha=other, now=store.clock())
        assert pins.pin_for(conn, branch="main") == other
    for k, rev in enumerate(shas):
        assert store.regressions(run_id=run_with(store, rev, [make_result(CELL, max_abs=1e-3, seed=k)])) == []


def test_a_drift_nobody_reported_is_reported_by_the_next_push_whatever_its_step(store: Store) -> None:
    shas = chain(store, 6)
    for k in range(5):  # history recorded without detection: the drift was never reported
        run_with(store, shas[k], [make_result(CELL, max_abs=1e-3 * 1.3 ** k, seed=k)], detect=False)
    # its parent already stood x2.86 past the window's start, and its own step moved nothing: still reported
    push = run_with(store, shas[5], [make_result(CELL, max_abs=1e-3 * 1.3 ** 4, seed=5)])
    (reg,) = store.regressions(run_id=push)
    assert (reg.kind, reg.state, reg.baseline_sha) == ("drift", "open", shas[0])
    # reported: the nightly of the same revision does not report it again
    assert store.regressions(run_id=run_with(store, shas[5], [make_result(CELL, max_abs=1e-3 * 1.3 ** 4, seed=6)],
                                             trigger="nightly")) == []


@pytest.mark.parametrize("false_positive", [False, True])
def test_a_reported_and_acknowledged_drift_does_not_fire_again(store: Store, false_positive: bool) -> None:
    shas = chain(store, 10)
    for k in range(4):
        run_with(store, shas[k], [make_result(CELL, max_abs=1e-3 * 1.3 ** k, seed=k)], detect=False)
    first = run_with(store, shas[4], [make_result(CELL, max_abs=1e-3 * 1.3 ** 4, seed=4)], trigger="nightly")
    (reg,) = store.regressions(run_id=first)
    store.ack(reg.id, by="dev", false_positive=false_positive, note="known: the new graph walk")
    for k in range(5, 10):  # nightlies report any drift over the limit, but not this one again
        assert store.regressions(run_id=run_with(store, shas[k], [make_result(CELL, max_abs=1e-3 * 1.3 ** 4,
                                                                              seed=k)], trigger="nightly")) == []


def test_a_single_step_is_the_parent_comparisons_finding_not_a_drift(store: Store) -> None:
    shas = chain(store, 4)
    for k in range(3):
        run_with(store, shas[k], [make_result(CELL, max_abs=1e-3, seed=k)])
    (reg,) = store.regressions(run_id=run_with(store, shas[3], [make_result(CELL, max_abs=5e-3, seed=3)]))
    assert (reg.kind, reg.baseline_sha) == ("accuracy", shas[2])


def test_a_drift_resolves_when_the_level_returns_to_its_reference(store: Store) -> None:
    make, tip = CREEPS["max_abs"]
    shas = chain(store, tip + 2)
    for k in range(tip + 1):
        run_with(store, shas[k], [make(k)])
    (reg,) = store.regressions(state="open")
    run_with(store, shas[tip + 1], [make(0)])
    assert store.regressions(state="open", category="regression") == []
    assert store.get_regression(reg.id).state == "resolved"


@pytest.mark.parametrize("confirmed", [True, False])
def test_a_timing_drift_is_confirmed_against_its_reference(store: Store, confirmed: bool) -> None:
    shas = chain(store, 5)
    for k in range(4):
        make_run(store, shas[k], [conversion(k, 0.1 + 0.03 * k)], confirm_pairs=8)
        finish_if_complete(store, store.list_runs()[0].id, dispatch=lambda _: pytest.fail("nothing to confirm"))
    run_id = make_run(store, shas[4], [conversion(4, 0.22)], confirm_pairs=8)
    base = [0.1 + 0.001 * i for i in range(8)]
    worker = StandInWorker(store, {"conversion_time": (base, [x + (0.12 if confirmed else 0.0) for x in base])})
    assert finish_if_complete(store, run_id, dispatch=worker) is False
    (reg,) = store.regressions(run_id=run_id)
    assert (reg.kind, reg.metric, reg.state, reg.baseline_sha) == ("drift", "convert_s", "suspected", shas[0])
    (confirm_id,) = worker.sent
    assert store.get_run(confirm_id).meta["options"]["|".join(CELL)]["confirm"] == {
        "baseline": shas[0], "kinds": ["conversion_time"], "pairs": 8}
    worker.work()
    (reg,) = store.regressions(run_id=run_id)
    assert reg.state == ("open" if confirmed else "dismissed")
    assert store.run_summary(run_id).regressions == ({"drift": 1} if confirmed else {})
    # the next step of the creep: a confirmed drift is not reported again; a dismissed one is judged anew
    nxt = make_run(store, chain(store, 1, start=5)[0], [conversion(5, 0.25)], confirm_pairs=8)
    finish_if_complete(store, nxt, dispatch=lambda _: None)
    assert [(g.kind, g.state) for g in store.regressions(run_id=nxt)] == ([] if confirmed else [("drift", "suspected")])


def test_a_pull_request_whose_noise_crosses_the_limit_after_a_creep_is_not_blamed_the_push_reports_it(
        store: Store) -> None:
    shas = chain(store, 4)
    for k, v in enumerate((1e-3, 1.4e-3, 1.95e-3)):  # x1.95 of the window's start: within x2
        assert store.regressions(run_id=run_with(store, shas[k], [make_result(CELL, max_abs=v, seed=k)])) == []
    # a noise change measured x2.05 (+1.05e-3): over the limit, but its own step is a tenth of the drift
    head = chain(store, 1, branch="feature", start=3)[0]  # first parent: main's tip
    assert store.regressions(run_id=run_with(store, head, [make_result(CELL, max_abs=2.05e-3, seed=3)],
                                             trigger="pull_request", baseline=shas[2])) == []
    # the same measurement on main is a drift nobody reported: the push reports it
    (reg,) = store.regressions(run_id=run_with(store, shas[3], [make_result(CELL, max_abs=2.05e-3, seed=4)]))
    assert reg.kind == "drift" and reg.baseline_sha == shas[0]


def sweep(store: Store, sha: str, k: int, seconds: float, confirmed_by: float | None) -> list[tuple[str, str]]:
    """A push of ``sha`` (commit ``k``) whose conversion takes ``seconds``; ``confirmed_by``: None when it must
    send no confirmation run, else what the confirmation times between the reference and this revision.
    Returns the run's findings (kind, state) once that confirmation is done."""
    run_id = make_run(store, sha, [conversion(k, seconds)], confirm_pairs=8)
    base = [0.1 + 0.001 * i for i in range(8)]
    worker = StandInWorker(store, {"conversion_time": (base, [x + (confirmed_by or 0.0) for x in base])})
    finish_if_complete(store, run_id, dispatch=worker)
    assert len(worker.sent) == (0 if confirmed_by is None else 1), f"commit {k}"
    worker.work()
    return [(g.kind, g.state) for g in store.regressions(run_id=run_id)]


def test_a_drift_dismissed_below_the_floor_is_reported_by_a_push_once_it_has_grown(store: Store) -> None:
    """The bench's sleeping creep under load (issue 34): +30 ms a commit against the +0.1 s floor.  The drift
    of commit 4 is timed +80 ms by its confirmation and dismissed; commit 5, measured a little faster than
    its parent (noise), is still past the limit: judged anew, dismissed again at +90 ms; commit 6 is confirmed
    (+160 ms) and reported; commit 7 is the same change."""
    shas = chain(store, 8)
    for k in range(4):
        assert sweep(store, shas[k], k, 0.1 + 0.03 * k, None) == [], k
    assert sweep(store, shas[4], 4, 0.22, 0.08) == [("drift", "dismissed")]
    assert sweep(store, shas[5], 5, 0.215, 0.09) == [("drift", "dismissed")]
    assert sweep(store, shas[6], 6, 0.28, 0.16) == [("drift", "open")]
    (reg,) = [g for g in store.regressions(state="open") if g.kind == "drift"]
    assert (reg.revision_sha, reg.baseline_sha, reg.metric) == (shas[6], shas[0], "convert_s")
    assert sweep(store, shas[7], 7, 0.31, None) == []
