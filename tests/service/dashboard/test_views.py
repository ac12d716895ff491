"""The pure decisions of the dashboard: a cell's displayed state, key numbers, the diff and formatting."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from service.dashboard import views
from service.db.records import JobInfo, RegressionInfo, ResultRow

NOW = datetime(2026, 11, 29, tzinfo=UTC)
CELL = ("m", "fp16", "default", "cpu")


def result(status: str = "pass", **kw: Any) -> ResultRow:
    fields: dict[str, Any] = dict(id=1, run_id=1, revision_sha="a" * 40, model="m", dtype="fp16", policy="default",
                                  target="cpu", status=status, message=None, cosine=0.99999, max_abs=1e-4,
                                  error_ratio=None, latency_p50_ms=1.0, speedup=1.4, low_precision_fraction=0.9,
                                  casts_inserted=6, final_error=None, diverged=None, env_fingerprint="e",
                                  updated_at=NOW)
    fields.update(kw)
    return ResultRow(**fields)


def finding(kind: str, category: str = "regression", state: str = "open") -> RegressionInfo:
    return RegressionInfo(id=7, run_id=1, revision_sha="a" * 40, baseline_sha="b" * 40, model="m", dtype="fp16",
                          policy="default", target="cpu", kind=kind, category=category, severity="major",
                          metric="max_abs", baseline_value=1e-4, value=1e-2, delta=None, ratio=None, p_value=None,
                          detail="d", result_id=1, baseline_result_id=2, state=state, state_by=None, state_at=None,
                          state_note=None, resolved_by_result_id=None, created_at=NOW)


def job(status: str) -> JobInfo:
    return JobInfo(id=1, run_id=1, model="m", dtype="fp16", policy="default", target="cpu", status=status,
                   attempts=1, worker=None, queued_at=NOW, started_at=None, finished_at=None, error=None)


@pytest.mark.parametrize(("res", "jb", "found", "expected"), [
    (result(), None, [], "pass"),
    (result(), None, [finding("accuracy")], "reg-accuracy"),
    (result(), None, [finding("convergence")], "reg-accuracy"),
    (result(), None, [finding("latency")], "reg-latency"),
    (result("convert_error"), None, [finding("conversion")], "reg-conversion"),
    (result(), None, [finding("latency"), finding("conversion")], "reg-conversion"),  # conversion ranks first
    (result(), None, [finding("coverage")], "reg-coverage"),
    (result(), None, [finding("accuracy", state="acknowledged")], "reg-accuracy"),
    (result(), None, [finding("accuracy", state="resolved")], "reg-accuracy"),  # it did regress in this run
    (result(), None, [finding("accuracy", state="false_positive")], "pass"),
    (result("fail_accuracy"), None, [finding("accuracy", state="false_positive")], "fail"),
    (result(), None, [finding("accuracy", "flaky")], "flaky"),
    (result(), None, [finding("latency", "improvement")], "improved"),
    (result("fail_accuracy"), None, [finding("latency", "improvement")], "fail"),
    (result("convert_error"), None, [], "error"),
    (result("crashed"), None, [], "error"),
    (result("error"), None, [], "error"),  # ampci's failure
    (result("unmeasured"), None, [], "missing"),  # not run where it was sent: nothing measured, never a pass
    (result("diverged"), None, [], "fail"),
    (None, job("queued"), [], "pending"),
    (None, job("running"), [], "pending"),
    (None, job("crashed"), [], "error"),
    (None, None, [], "missing"),
])
def test_cell_state(res: ResultRow | None, jb: JobInfo | None, found: list[RegressionInfo], expected: str) -> None:
    state = views.cell_state(res, jb, found)
    assert state.css == expected
    assert state.icon and state.short and state.label  # never colour alone


def test_no_status_but_pass_shows_as_a_pass() -> None:
    from workers.result import GOOD_STATUSES, STATUSES

    for status in STATUSES:
        shown = views.cell_state(result(status), None, []).css
        assert (shown in ("pass", "improved")) == (status in GOOD_STATUSES), (status, shown)


def test_every_state_has_distinct_icon_or_word() -> None:
    pairs = {(s.icon, s.short) for s in views.STATES.values()}
    assert len(pairs) == len(views.STATES)


def test_key_numbers_and_tooltip_compare_with_baseline() -> None:
    r = result(cosine=0.99987, speedup=1.4321, latency_p50_ms=1.2)
    acc, speed = views.key_numbers(r, views.STATES["pass"])
    assert (acc, speed) == ("cos 0.99987", "×1.43")
    base = result(cosine=0.99999, latency_p50_ms=1.0, casts_inserted=4, revision_sha="b" * 40)
    text = views.tooltip(CELL, views.STATES["reg-latency"], r, base, [finding("latency")])
    assert "baseline pass at bbbbbbbbbb" in text
    assert "p50 ms 1.2 (baseline 1, +20.0%)" in text
    assert "casts 6 (baseline 4, Δ 2)" in text
    assert "regression [latency, major, open]" in text
    assert views.key_numbers(result("convert_error"), views.STATES["error"]) == ("convert error", "")
    assert views.key_numbers(result(cosine=None, error_ratio=3.0), views.STATES["pass"])[0] == "err ×3"


def test_diff_rows_flag_changes_only() -> None:
    same = result()
    moved = result(model="n", latency_p50_ms=1.2)
    new_status = result(model="o", status="fail_accuracy")
    base = {same.cell: result(), moved.cell: result(model="n"), new_status.cell: result(model="o")}
    rows = {r.cell[0]: r for r in views.diff_rows([same, moved, new_status, result(model="p")], base)}
    assert not rows["m"].changed and rows["n"].changed and rows["o"].changed
    assert rows["n"].p50 == ("1.2", "+20.0%")
    assert rows["p"].base_sha is None and not rows["p"].changed


@pytest.mark.parametrize(("value", "text"), [(None, "–"), (float("inf"), "inf"), (3, "3"), (0.000123456, "0.0001235")])
def test_fmt(value: float | None, text: str) -> None:
    assert views.fmt(value) == text


def test_duration_and_pct() -> None:
    assert [views.duration(s) for s in (None, 5, 125, 3725)] == ["–", "5s", "2m 05s", "1h 02m"]
    assert views.pct(2.0, 3.0) == "+50.0%" and views.pct(0, 1) == "–" and views.pct(None, 1) == "–"


def test_result_numbers_do_not_subtract_final_errors_across_units() -> None:
    from workers.result import ConvergenceStats, JobResult

    def jr(final_error: float, unit: str) -> JobResult:
        return JobResult(model="m", dtype="fp16", policy="default", target="cpu", status="pass",
                         convergence=ConvergenceStats(steps=4, final_error=final_error, error_unit=unit))

    rows = {name: (b, n, change) for name, b, n, change in views.result_numbers(jr(0.5, "absolute"), jr(5e-3, "relative"))}
    assert rows["final step error"] == ("0.5", "0.005", "not comparable (absolute vs relative)")
    assert rows["convergence error unit"] == ("absolute", "relative", "changed")
    same = {name: change for name, _, _, change in views.result_numbers(jr(0.5, "relative"), jr(5e-3, "relative"))}
    assert same["final step error"] == "-0.495" and same["convergence error unit"] == ""


@pytest.mark.parametrize(("modes", "line", "warns"), [
    ([], None, None),
    (["full", "full"], "full in 2 of 2 cells", False),
    (["full", "best-effort", ""], "best-effort in 1 of 3 cells", True),
    (["", ""], "not recorded", False),
])
def test_the_run_page_says_how_the_pass_was_sandboxed(modes: list[str], line: str | None, warns: bool | None) -> None:
    got = views.sandbox_line(modes)
    if line is None:
        assert got is None
    else:
        assert got is not None and got[0].startswith(line) and got[1] is warns
