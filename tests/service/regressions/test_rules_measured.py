"""Rules over measured figures: compute-node coverage, conversion time, the pass's painting convergence."""

from __future__ import annotations

import dataclasses

import pytest

from service.db import Store
from service.regressions.rules import (
    KINDS,
    RULES,
    CellSample,
    comparable,
    compare_cells,
    conversion_time_rule,
    coverage_rule,
    pass_convergence_rule,
)
from service.regressions.thresholds import Thresholds
from tests.service.factories import chain, make_result, migrated_store, run_with
from workers.result import JobResult

TH = Thresholds()


def cov(low: int | None, nodes: int | None, frac: float | None = None, casts: int | None = 4,
        version: str | None = "1", status: str = "pass") -> CellSample:
    if frac is None and low is not None and nodes:
        frac = low / nodes
    return CellSample(status=status, compute_low=low, compute_nodes=nodes, compute_ops_version=version,
                      low_precision_fraction=frac, casts_inserted=casts)


@pytest.mark.parametrize("base, new, expect", [
    # one low MatMul lost of 100: the fraction moves by 0.01 (< coverage_fraction_drop), the count fires
    (cov(100, 100), cov(99, 100), ("regression", "minor", "compute_low")),
    (cov(16, 16), cov(0, 16), ("regression", "major", "compute_low")),  # silero: 16/16 -> 0/16
    # the fraction says nothing (None: e.g. a stale report), the count still fires
    (cov(16, 16, frac=None), dataclasses.replace(cov(8, 16), low_precision_fraction=None),
     ("regression", "minor", "compute_low")),
    (cov(10, 10), cov(10, 10), None),
    # a compute node folded away (10/10 -> 9/9): fewer low nodes, but no more kept fp32: no regression
    (cov(10, 10), cov(9, 9), None),
    (cov(0, 16), cov(16, 16), ("improvement", "info", "compute_low")),
    # counts of another compute-op version, or not measured, are not compared (the fraction still is)
    (cov(100, 100), cov(99, 100, version="2"), None),
    (cov(None, None, frac=1.0), cov(15, 16), ("regression", "minor", "low_precision_fraction")),
    # no compute at all: fraction None on both sides, nothing to compare
    (cov(0, 0, frac=None), cov(0, 0, frac=None), None),
    (cov(16, 16), cov(0, 16, status="convert_error"), None),
])
def test_coverage_counts_low_compute_nodes(base: CellSample, new: CellSample, expect: tuple | None) -> None:
    got = coverage_rule(base, new, TH, "m", "fp16")
    assert [(f.category, f.severity, f.metric) for f in got] == ([expect] if expect else [])


def test_fraction_none_is_never_compared_with_a_number() -> None:
    none = cov(0, 0, frac=None, casts=None)
    assert coverage_rule(cov(1, 5, casts=None), none, TH, "m", "fp16") == []  # not "0.2 -> better"
    assert coverage_rule(none, cov(1, 5, casts=None), TH, "m", "fp16") == []
    assert not comparable("coverage", none, none, TH)
    counts_only = [dataclasses.replace(cov(k, 5, casts=None), low_precision_fraction=None) for k in (5, 4)]
    assert comparable("coverage", *counts_only, TH)


def ct(samples: list[float], env: str | None = "env-a", status: str = "pass") -> CellSample:
    return CellSample(status=status, convert_samples=tuple(samples), env_fingerprint=env)


FAST = [0.40, 0.41, 0.42, 0.43, 0.44]
SLOW = [0.90, 0.91, 0.92, 0.93, 0.94]  # +0.5 s on every conversion


@pytest.mark.parametrize("base, new, expect, is_comparable", [
    (ct(FAST), ct(SLOW), ("regression", "major"), True),             # x2.2
    (ct(FAST), ct([x * 1.5 for x in FAST]), ("regression", "minor"), True),
    (ct(SLOW), ct(FAST), ("improvement", "info"), True),
    (ct(FAST), ct([x * 1.05 for x in FAST]), None, True),           # +5 %: below the ratio
    (ct([0.010, 0.011, 0.012, 0.013, 0.014]), ct([0.030, 0.031, 0.032, 0.033, 0.034]), None, True),  # x3, 20 ms
    (ct(FAST), ct([0.30, 0.31, 0.95, 0.96, 0.97]), None, True),     # median x2.3, not significant
    (ct([0.20, 0.21, 0.22, 0.23, 0.24]), ct([0.27, 0.28, 0.29, 0.30, 0.31]), None, True),  # x1.3 but +70 ms
    (ct(FAST), ct(SLOW, env="env-b"), None, False),                  # another machine/runtime
    (ct(FAST, env=None), ct(SLOW, env=None), None, False),
    (ct(FAST[:2]), ct(SLOW[:2]), None, False),                       # too few samples
    (ct(FAST[:3]), ct(SLOW[:3]), None, False),                       # 3 v 3: smallest p is 0.05 > 0.01
    (ct(FAST), ct(SLOW, status="fail_accuracy"), ("regression", "major"), True),
    (ct(FAST), ct([], status="convert_error"), None, False),
])
def test_conversion_time(base: CellSample, new: CellSample, expect: tuple | None, is_comparable: bool) -> None:
    got = conversion_time_rule(base, new, TH, "m", "fp16")
    assert [(f.category, f.severity) for f in got] == ([expect] if expect else [])
    assert comparable("conversion_time", base, new, TH) is is_comparable
    if got:
        assert got[0].kind == "conversion_time" and got[0].p_value is not None and got[0].p_value < TH.convert_time_p


def test_conversion_time_more_samples_on_one_side_can_fire() -> None:
    base = ct([0.40, 0.41, 0.42, 0.43, 0.44, 0.45, 0.40, 0.41, 0.42, 0.43])  # e.g. a pooled baseline
    assert [f.category for f in conversion_time_rule(base, ct(SLOW[:3]), TH, "m", "fp16")] == ["regression"]


def pc(iterations: int | None, converged: bool | None, status: str = "pass") -> CellSample:
    return CellSample(status=status, pass_iterations=iterations, pass_converged=converged)


@pytest.mark.parametrize("base, new, expect, is_comparable", [
    (pc(3, True), pc(100, False), ("regression", "major"), True),
    (pc(100, False), pc(3, True), ("improvement", "info"), True),
    (pc(3, True), pc(8, True), ("regression", "minor"), True),   # > 3 + 2 and > 4.5
    (pc(3, True), pc(5, True), None, True),                       # +2 only
    (pc(10, True), pc(14, True), None, True),                     # +4 but x1.4
    (pc(10, True), pc(4, True), ("improvement", "info"), True),
    (pc(100, False), pc(100, False), None, True),
    (pc(None, None), pc(100, False), None, False),                # a report that said nothing at baseline
    (pc(3, True), pc(100, False, status="convert_error"), None, False),
])
def test_pass_convergence(base: CellSample, new: CellSample, expect: tuple | None, is_comparable: bool) -> None:
    got = pass_convergence_rule(base, new, TH, "m", "fp16")
    assert [(f.category, f.severity) for f in got] == ([expect] if expect else [])
    assert comparable("pass_convergence", base, new, TH) is is_comparable


def test_new_kinds_are_registered_and_thresholds_are_configurable() -> None:
    assert {"conversion_time", "pass_convergence"} <= set(KINDS) == set(RULES)
    th = Thresholds.from_mapping({"convert_time_ratio": 3.0, "pass_iterations_abs": 10, "coverage_compute_drop": 2})
    assert conversion_time_rule(ct(FAST), ct(SLOW), th, "m", "fp16") == []
    assert pass_convergence_rule(pc(3, True), pc(8, True), th, "m", "fp16") == []
    assert coverage_rule(cov(100, 100), cov(99, 100), th, "m", "fp16") == []
    kinds = [f.kind for f in compare_cells(pc(3, True), pc(100, False), TH, "m", "fp16")]
    assert kinds == ["pass_convergence"]


# ----------------------------------------------------------------- through the store and detection


@pytest.fixture
def store(db_url: str) -> Store:
    s = migrated_store(db_url)
    yield s
    s.dispose()


def measured(low: int, nodes: int = 16, samples: list[float] | None = None, iterations: int = 3,
             converged: bool = True) -> JobResult:
    r = make_result(lp_fraction=0.9)
    assert r.graph is not None
    r.graph = dataclasses.replace(r.graph, compute_low=low, compute_nodes=nodes, compute_ops_version="1",
                                  low_precision_compute_fraction=low / nodes,
                                  convert_samples_s=list(samples or FAST), pass_iterations=iterations,
                                  pass_converged=converged, pass_report={"low_precision_compute_fraction": 1.0})
    return r


def test_detection_reads_measured_figures_from_the_stored_result(store: Store) -> None:
    shas = chain(store, 3)
    run_with(store, shas[0], [measured(100, 100)])
    r1 = run_with(store, shas[1], [measured(99, 100, samples=SLOW, iterations=100, converged=False)])
    got = sorted((x.kind, x.category, x.metric) for x in store.regressions(run_id=r1))
    assert got == [("conversion_time", "regression", "convert_s"), ("coverage", "regression", "compute_low"),
                   ("pass_convergence", "regression", "pass_iterations")]
    reg = next(x for x in store.regressions(run_id=r1) if x.kind == "coverage")
    assert (reg.baseline_value, reg.value) == (100, 99)
    # a later revision back at the baseline's figures resolves all three
    r2 = run_with(store, shas[2], [measured(100, 100)])
    assert [x for x in store.regressions(run_id=r2) if x.category == "regression"] == []
    assert {x.state for x in store.regressions(run_id=r1)} == {"resolved"}
    # the stored result keeps the measured figures and the pass's own report side by side
    g = store.get_result(reg.result_id).graph
    assert g is not None and g.compute_low == 99 and g.pass_report["low_precision_compute_fraction"] == 1.0


def test_a_result_whose_graph_facts_are_the_pass_report_gives_no_compute_counts(store: Store) -> None:
    shas = chain(store, 2)
    old = measured(16, 16)
    assert old.graph is not None
    old.graph = dataclasses.replace(old.graph, source="report")  # stored before measurement
    run_with(store, shas[0], [old])
    r1 = run_with(store, shas[1], [measured(15, 16)])
    assert [x.kind for x in store.regressions(run_id=r1) if x.metric == "compute_low"] == []
