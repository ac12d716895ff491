"""Where a drift is reported (issue 34): a pull request whose own change tips a creep over the limit says so in
its PR comment (the drift row, its metric, the cell's history) and its gate fails; a pull request whose
change did not tip it (the creep was already over the limit on its base) is not blamed.  Real stores (SQLite
and PostgreSQL), real detection, the PR report the reporter posts."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from service.db import Store
from service.github.comment import headline, render_comment
from service.github.pr_report import build_report
from service.orchestration.judge import run_verdict
from tests.service.factories import (
    CELL,
    chain,
    detect_run,
    make_result,
    migrated_store,
    record_verdict,
    run_with,
)

PUBLIC = "https://ci.example.com"


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = migrated_store(db_url)
    yield s
    s.dispose()


def pull_request(store: Store, head: str, base: str, max_abs: float) -> int:
    """A pull_request run of ``head`` (merge base ``base``) measuring ``max_abs``, detected as the finisher does."""
    run_id = store.create_run(head, "pull_request", baseline_sha=base, cells=[CELL],
                              meta={"github": {"repo": "acme/amp-pass", "pr": 7}})
    store.write_result(run_id, make_result(CELL, max_abs=max_abs, seed=99))
    store.finish_run(run_id)
    detect_run(store, run_id)
    record_verdict(store, run_id)
    return run_id


@pytest.mark.parametrize("main_steps, blamed", [(3, True), (4, False)])
def test_a_pull_request_that_tips_a_creep_reports_the_drift_in_its_comment(store: Store, main_steps: int,
                                                                          blamed: bool) -> None:
    """x1.3 a commit on main (no step beyond x2): the PR's step is the one that takes the cell past x2 of the
    window's start when main had 3 steps; with 4 main already stood at x2.2 (main's to report)."""
    shas = chain(store, main_steps)
    for k, rev in enumerate(shas):
        run_with(store, rev, [make_result(CELL, max_abs=1e-3 * 1.3 ** k, seed=k)], detect=False)
    head = chain(store, 1, branch="feature", start=main_steps)[0]  # first parent: main's tip
    run_id = pull_request(store, head, shas[-1], 1e-3 * 1.3 ** main_steps * (1.0 if blamed else 1.02))
    drifts = [g for g in store.regressions(run_id=run_id) if g.kind == "drift"]
    report = build_report(store, run_id, PUBLIC)
    body = render_comment(report)
    if not blamed:
        assert drifts == [] and "drift" not in body
        return
    (drift,) = drifts
    assert (drift.metric, drift.baseline_sha, drift.state) == ("max_abs", shas[0], "open")
    (row,) = [r for r in report.rows if r.kind == "drift"]
    assert row.metric == "max_abs" and row.finding_url == f"{PUBLIC}/regressions/{drift.id}"
    assert f"drift · max abs error: drifted x2\\.2 over {main_steps} commits, since {shas[0][:12]}" in body
    assert "0.001 → 0.002197" in body and f"({PUBLIC}/regressions/{drift.id})" in body
    assert "/history?" not in body  # short rows: the finding's page (linked by its ID) links the series plot
    verdict = run_verdict(store, run_id)
    assert verdict.state == "failure" and "regresses 1 cell" in headline(report)
