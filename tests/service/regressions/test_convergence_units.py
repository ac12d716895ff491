"""Convergence errors in different units are never compared (stored absolute vs new relative errors).

Results stored before the job recorded ``convergence.error_unit`` carry absolute ``max|diff|`` step
errors; newer ones relative ``max|diff| / max(1, max|fp32|)``.  The legacy rows here are written the
way old code wrote them: the stored JSON has no ``error_unit`` key at all.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from service.db import Store
from service.db import models as m
from service.orchestration.bisection import bisect_step
from service.orchestration.judge import detect_run
from service.regressions.bisect import classify
from service.regressions.rules import CellSample, comparable, compare_cells, returned_to_baseline
from service.regressions.thresholds import Thresholds
from tests.service.factories import chain, make_result, migrated_store, run_with
from workers.result import JobResult

TH = Thresholds()
t_res = m.Result.__table__


def S(unit: str = "relative", **kw: object) -> CellSample:  # noqa: N802 - a tiny table constructor
    return CellSample(status="diverged" if kw.get("diverged") else "pass", error_unit=unit, **kw)  # type: ignore[arg-type]


# (name, baseline, new, expected [(category, severity)] of the convergence rule)
SCENARIOS = [
    ("absolute -> relative, would look 100x worse", S("absolute", diverged=False, final_error=1e-3),
     S(diverged=False, final_error=1e-1), []),
    ("absolute -> relative, would look 1000x better", S("absolute", diverged=False, final_error=0.5),
     S(diverged=False, final_error=5e-4), []),
    ("relative -> absolute is not compared either", S(diverged=False, final_error=1e-4),
     S("absolute", diverged=False, final_error=1.0), []),
    ("absolute -> absolute still compared", S("absolute", diverged=False, final_error=1e-3),
     S("absolute", diverged=False, final_error=1e-1), [("regression", "minor")]),
    ("relative -> relative still compared", S(diverged=False, final_error=1e-3),
     S(diverged=False, final_error=1e-1), [("regression", "minor")]),
    ("relative improvement still compared", S(diverged=False, final_error=0.5),
     S(diverged=False, final_error=5e-4), [("improvement", "info")]),
    ("divergence across units still reported", S("absolute", diverged=False, final_error=1e-4),
     S(diverged=True, final_error=0.9), [("regression", "major")]),
    ("recovery across units still reported", S("absolute", diverged=True, final_error=50.0),
     S(diverged=False, final_error=1e-3), [("improvement", "info")]),
]


@pytest.mark.parametrize(("name", "base", "new", "expected"), SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_convergence_rule_across_units(name: str, base: CellSample, new: CellSample, expected: list) -> None:
    got = [(f.category, f.severity) for f in compare_cells(base, new, TH, "m", "fp16", ("convergence",))]
    assert got == expected


def test_status_findings_across_units_carry_no_baseline_value() -> None:
    (f,) = compare_cells(S("absolute", diverged=False, final_error=1e-4), S(diverged=True, final_error=0.9), TH,
                         "m", "fp16", ("convergence",))
    assert (f.baseline_value, f.value, f.delta, f.ratio) == (None, 0.9, None, None)
    assert "not comparable: absolute at baseline, relative now" in f.detail
    (same,) = compare_cells(S(diverged=False, final_error=1e-4), S(diverged=True, final_error=0.9), TH, "m", "fp16",
                            ("convergence",))
    assert same.baseline_value == 1e-4 and same.detail == "stable at baseline, now diverges"


STABLE_ABS, STABLE_REL = S("absolute", diverged=False, final_error=1e-4), S(diverged=False, final_error=1e-4)
DIVERGED_REL = S(diverged=True, final_error=0.9)
# (kind, baseline, new, regressed, comparable, returned to baseline)
RESOLVE = [
    ("final error regression, stable in the other unit: unknown", STABLE_ABS, STABLE_REL,
     S("absolute", diverged=False, final_error=0.5), False, False),
    ("no regressed sample: unknown", STABLE_ABS, STABLE_REL, None, False, False),
    ("divergence regression, stable in the other unit: back", STABLE_ABS, STABLE_REL, DIVERGED_REL, True, True),
    ("divergence regression, still diverged", STABLE_ABS, DIVERGED_REL, DIVERGED_REL, True, False),
    ("same unit: the error is compared", STABLE_REL, S(diverged=False, final_error=0.5), DIVERGED_REL, True, False),
    ("same unit: back", STABLE_REL, S(diverged=False, final_error=1.1e-4), None, True, True),
]


@pytest.mark.parametrize(("name", "base", "new", "regressed", "comp", "back"), RESOLVE, ids=[r[0] for r in RESOLVE])
def test_comparable_and_returned_across_units(name: str, base: CellSample, new: CellSample,
                                              regressed: CellSample | None, comp: bool, back: bool) -> None:
    assert comparable("convergence", base, new, TH, regressed) is comp
    assert returned_to_baseline("convergence", base, new, TH, "m", "fp16", regressed) is back


def test_bisect_classify_across_units() -> None:
    grew = S("absolute", diverged=False, final_error=0.5)
    # a final-error regression cannot be judged from a candidate in another unit: skipped, never blamed
    assert classify("convergence", STABLE_ABS, grew, S(diverged=False, final_error=0.4), TH, "m", "fp16") == "skip"
    assert classify("convergence", STABLE_ABS, grew, S("absolute", diverged=False, final_error=0.4), TH, "m",
                    "fp16") == "bad"
    # a divergence regression is judged by the diverged status alone
    assert classify("convergence", STABLE_ABS, DIVERGED_REL, STABLE_REL, TH, "m", "fp16") == "good"
    assert classify("convergence", STABLE_ABS, DIVERGED_REL, DIVERGED_REL, TH, "m", "fp16") == "bad"


# -- stored results (PostgreSQL and SQLite) -------------------------------------------------------
@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = migrated_store(db_url)
    yield s
    s.dispose()


def conv(final_error: float, diverged: bool = False, seed: int = 0) -> JobResult:
    return make_result(status="diverged" if diverged else "pass", diverged=diverged, final_error=final_error,
                       seed=seed)


def legacy_run(store: Store, revision: str, final_error: float, diverged: bool = False, detect: bool = True) -> int:
    """A run whose stored result is what code before ``error_unit`` wrote: absolute errors, no unit key."""
    run_id = run_with(store, revision, [conv(final_error, diverged)], detect=False)
    (row,) = store.results(run_id=run_id)
    data = store.get_result(row.id).to_dict()
    assert data["convergence"].pop("error_unit") == "relative"
    with store.engine.begin() as conn:
        # code that old wrote no sample summary either (migration 0012): detection reads the document
        conn.execute(t_res.update().where(t_res.c.id == row.id).values(data=data, sample_doc=None))
    assert store.get_result(row.id).convergence.error_unit == "absolute"  # type: ignore[union-attr]
    if detect:
        detect_run(store, run_id)
    return run_id


def findings(store: Store, run_id: int) -> list[tuple[str, str, str]]:
    return sorted((r.kind, r.category, r.state) for r in store.regressions(run_id=run_id))


def test_stored_absolute_baseline_gives_no_spurious_finding(store: Store) -> None:
    shas = chain(store, 4)
    legacy_run(store, shas[0], final_error=0.5)  # absolute: 0.5 of a state that counts up to 64
    same_model = run_with(store, shas[1], [conv(5e-3)])  # the same conversion, measured relative
    assert findings(store, same_model) == []  # 100x "better" only because the unit changed
    # relative vs relative is compared again: a 100x growth is a regression, and back is an improvement
    worse = run_with(store, shas[2], [conv(0.5)])
    assert findings(store, worse) == [("convergence", "regression", "open")]
    (reg,) = store.regressions(run_id=worse)
    assert (reg.baseline_value, reg.value, reg.baseline_sha) == (5e-3, 0.5, shas[1])
    better = run_with(store, shas[3], [conv(5e-3)])
    assert findings(store, better) == [("convergence", "improvement", "open")]
    assert store.get_regression(reg.id).state == "resolved"


def test_stored_absolute_baseline_then_growth_is_not_a_regression(store: Store) -> None:
    shas = chain(store, 2)
    legacy_run(store, shas[0], final_error=1e-4)
    assert findings(store, run_with(store, shas[1], [conv(0.2)])) == []


def test_divergence_against_stored_absolute_baseline_is_still_flagged(store: Store) -> None:
    shas = chain(store, 3)
    legacy_run(store, shas[0], final_error=1e-4)
    bad = run_with(store, shas[1], [conv(0.9, diverged=True)])
    (reg,) = store.regressions(run_id=bad)
    assert (reg.kind, reg.category, reg.severity) == ("convergence", "regression", "major")
    assert reg.baseline_value is None and reg.value == 0.9 and reg.ratio is None
    assert "absolute at baseline, relative now" in reg.detail
    # stable again (relative): resolved by the diverged status alone
    fixed = run_with(store, shas[2], [conv(1e-3)])
    assert findings(store, fixed) == [("convergence", "improvement", "open")]
    assert store.get_regression(reg.id).state == "resolved"


def test_final_error_regression_between_absolute_results_is_not_resolved_by_a_relative_one(store: Store) -> None:
    shas = chain(store, 3)
    legacy_run(store, shas[0], final_error=1e-3)
    bad = legacy_run(store, shas[1], final_error=0.5)
    (reg,) = store.regressions(run_id=bad)
    assert (reg.category, reg.severity, reg.baseline_value, reg.value) == ("regression", "minor", 1e-3, 0.5)
    later = run_with(store, shas[2], [conv(1e-3)])
    assert findings(store, later) == []  # 0.5 absolute -> 1e-3 relative is no improvement either
    assert store.get_regression(reg.id).state == "open"  # unknown whether it returned: stays open


def test_compare_gives_no_final_error_delta_across_units(store: Store) -> None:
    shas = chain(store, 3)
    legacy_run(store, shas[0], final_error=0.5, detect=False)
    run_with(store, shas[1], [conv(5e-3)], detect=False)
    run_with(store, shas[2], [conv(7e-3)], detect=False)
    (across,) = store.compare(shas[0], shas[1])
    assert across.deltas["final_error"] is None and across.a.final_error == 0.5  # type: ignore[union-attr]
    assert across.deltas["cosine"] == 0.0
    (same,) = store.compare(shas[1], shas[2])
    assert same.deltas["final_error"] == pytest.approx(2e-3)


def test_bisect_divergence_with_absolute_baseline_finds_first_bad(store: Store) -> None:
    shas = chain(store, 9)
    legacy_run(store, shas[0], final_error=1e-4)
    bad_run = run_with(store, shas[-1], [conv(0.9, diverged=True)])
    (reg,) = store.regressions(run_id=bad_run)
    first_bad = 5
    for _ in range(6):
        state = bisect_step(store, reg.id)
        if state.status == "found":
            break
        for run_id in state.queued_runs:
            i = shas.index(store.get_run(run_id).revision_sha)
            store.write_result(run_id, conv(0.9, diverged=True, seed=i) if i >= first_bad else conv(1e-3, seed=i))
            store.finish_run(run_id)
    assert (state.status, state.first_bad, state.skipped) == ("found", shas[first_bad], ())


def test_history_of_final_error_gives_each_point_its_unit(store: Store) -> None:
    shas = chain(store, 3)
    legacy_run(store, shas[0], final_error=0.5, detect=False)
    run_with(store, shas[1], [conv(5e-3)], detect=False)
    run_with(store, shas[2], [conv(7e-3)], detect=False)
    cell = make_result()
    points = store.history(cell.model, cell.dtype, metric="final_error")
    assert [(p.value, p.unit) for p in points] == [(0.5, "absolute"), (5e-3, "relative"), (7e-3, "relative")]
    assert points[0].to_dict()["unit"] == "absolute"
    assert {p.unit for p in store.history(cell.model, cell.dtype, metric="cosine")} == {None}


def test_history_cli_never_plots_two_units_on_one_axis(store: Store, db_url: str, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from service.cli.main import main as cli_main

    shas = chain(store, 2)
    legacy_run(store, shas[0], final_error=0.5, detect=False)
    run_with(store, shas[1], [conv(5e-3)], detect=False)
    cell = make_result()
    monkeypatch.setenv("AMPCI_DATABASE_URL", db_url)
    monkeypatch.setenv("COLUMNS", "170")
    assert cli_main(["history", cell.model, "--dtype", cell.dtype, "--metric", "convergence"]) == 0
    out = capsys.readouterr().out
    assert "unit" in out and "absolute" in out and "relative" in out
    assert "· final_error (absolute) · 1 run" in out and "· final_error (relative) · 1 run" in out  # one chart each
