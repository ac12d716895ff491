"""Gains are verdicts too (issue 34): a timing improvement is *suspected* until the interleaved confirmation
shows it, a dismissed one is shown as dismissed, and nothing unconfirmed is a gain in the run headline, the PR
comment, the run summary or the dashboard; an accuracy "improvement" that a coverage loss on the same cell
explains is recorded as ``explained`` and counted nowhere as an improvement.

Real stores (SQLite and PostgreSQL) through :func:`service.orchestration.jobs.finish_if_complete`, with the
stand-in worker of ``test_confirm`` answering the confirmation jobs.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from service.dashboard import views
from service.db import Store
from service.github.comment import headline, summary_line
from service.github.pr_report import build_report
from service.orchestration.jobs import finish_if_complete
from service.orchestration.judge import detect_run, run_verdict
from service.regressions.confirm import improvement_verdict
from service.regressions.confirm_caps import ConfirmCaps, select
from service.regressions.rules import CAPPED_BY, CAPPED_GAIN_LABEL, EXPLAINED
from service.regressions.thresholds import Thresholds
from service.settings import Settings
from tests.service.dashboard.conftest import BROWSER, make_app
from tests.service.factories import chain, make_result, run_with
from tests.service.orchestration.test_confirm import CELL, OTHER, StandInWorker, make_run, slow_conversion

TH = Thresholds()
SLOW = [0.9 + 0.001 * i for i in range(8)]


def faster_run(store: Store) -> tuple[list[str], int]:
    """Revisions a, b: b converts CELL in 0.3 s where a took 0.9 s (OTHER unchanged); b's run id."""
    a, b = chain(store, 2)
    make_run(store, a, [slow_conversion(1, 0.9), make_result(OTHER, seed=1)], confirm_pairs=8)
    return [a, b], make_run(store, b, [slow_conversion(2, 0.3), make_result(OTHER, seed=2)], confirm_pairs=8)


def shown_as_gain(store: Store, run_id: int) -> dict[str, object]:
    """Every surface's word on improvements of run ``run_id``."""
    report = build_report(store, run_id, "http://ampci.test")
    (reg,) = [g for g in store.regressions(run_id=run_id) if g.category == "improvement"]
    results = {r.cell: r for r in store.results(run_id=run_id)}
    return {"summary": store.run_summary(run_id).improvements, "pr_bucket": report.counts.get("improvement", 0),
            "pr_headline": "improves" in headline(report), "pr_summary": "⚡ 1 improvement" in summary_line(report),
            "verdict": run_verdict(store, run_id).others.get("improvement", {}),
            "cell": views.cell_state(results[CELL], None, [reg]).css}


@pytest.mark.parametrize("state", ["suspected_improvement", "explained", "dismissed"])
def test_every_state_of_an_improvement_that_is_no_gain_has_a_style(state: str) -> None:
    from service.dashboard.routes import CSS

    shown = views.STATES[state]
    assert shown.icon and shown.label and f".st-{shown.css} " in CSS and shown.css != "improved"


def test_improvement_verdict_mirrors_the_slowdown_test() -> None:
    v = improvement_verdict("conversion_time", SLOW, [x - 0.6 for x in SLOW], TH, "s")
    assert v.confirmed and v.detail.startswith("improvement confirmed by 8 interleaved pairs: median ratio x0.3")
    # within the ratio limit (x0.9 > 1/1.2, though 0.5 s and every pair faster), below the floor, or slower
    assert not improvement_verdict("conversion_time", [5.0] * 8, [4.5 - 0.001 * i for i in range(8)], TH, "s").confirmed
    assert not improvement_verdict("conversion_time", [0.2] * 8, [0.12 + 0.001 * i for i in range(8)], TH,
                                   "s").confirmed
    v = improvement_verdict("latency", SLOW, [x + 0.5 for x in SLOW], TH, "ms")
    assert not v.confirmed and v.detail.startswith("improvement dismissed by 8 interleaved pairs")
    assert not improvement_verdict("latency", [0.0] * 8, [1.0] * 8, TH, "ms").confirmed


@pytest.mark.parametrize("real", [True, False], ids=["real-gain", "noise"])
def test_a_timing_improvement_is_suspected_until_confirmation_shows_it(store: Store, real: bool) -> None:
    (a, b), run_id = faster_run(store)
    worker = StandInWorker(store, {"conversion_time": (SLOW, [x - 0.6 if real else x for x in SLOW])})
    assert finish_if_complete(store, run_id, dispatch=worker) is False  # the gain waits for its confirmation
    (reg,) = store.regressions(run_id=run_id)
    assert (reg.kind, reg.category, reg.state) == ("conversion_time", "improvement", "suspected")
    (confirm_id,) = worker.sent
    assert store.get_run(confirm_id).meta["options"]["|".join(CELL)]["confirm"] == {
        "baseline": a, "kinds": ["conversion_time"], "pairs": 8}
    pending = shown_as_gain(store, run_id)
    assert pending == {"summary": 0, "pr_bucket": 0, "pr_headline": False, "pr_summary": False, "verdict": {},
                       "cell": "pass"}
    assert views.finding_state(reg).css == "suspected_improvement"
    assert "1 suspected improvement (conversion_time)" in run_verdict(store, run_id).headline()

    worker.work()
    (reg,) = store.regressions(run_id=run_id)
    assert store.get_run(run_id).status == "complete"
    assert reg.state == ("open" if real else "dismissed") and reg.state_by == "ampci-confirm"
    assert reg.state_note.startswith(f"improvement {'confirmed' if real else 'dismissed'} by 8 interleaved pairs")
    got = shown_as_gain(store, run_id)
    if real:
        assert got == {"summary": 1, "pr_bucket": 1, "pr_headline": True, "pr_summary": True,
                       "verdict": {"conversion_time": 1}, "cell": "improved"}
    else:
        assert got == pending
        assert views.finding_state(reg).css == "dismissed"
        line = run_verdict(store, run_id).headline()
        assert "1 dismissed improvement (conversion_time)" in line and "no regressions in 2 compared cells" in line
    assert finish_if_complete(store, run_id, dispatch=worker) is True and len(worker.sent) == 1
    assert store.regressions(run_id=run_id)[0].state == reg.state  # re-detection keeps the verdict


def test_an_improvement_whose_confirmation_cannot_run_is_dismissed_never_shown(store: Store) -> None:
    _, run_id = faster_run(store)

    def broken(_: int) -> None:
        raise ConnectionError("broker down")

    assert finish_if_complete(store, run_id, dispatch=broken) is True
    (reg,) = store.regressions(run_id=run_id)
    assert reg.state == "dismissed" and reg.state_note.startswith("not confirmed: confirmation could not be dispatched")
    assert shown_as_gain(store, run_id)["summary"] == 0 and run_verdict(store, run_id).exit_code == 0


def test_a_failed_confirmation_job_dismisses_the_improvement(store: Store) -> None:
    _, run_id = faster_run(store)
    sent: list[int] = []
    assert finish_if_complete(store, run_id, dispatch=sent.append) is False
    for job in store.jobs(sent[0]):
        store.write_result(sent[0], make_result(job.cell, status="convert_error"), job_id=job.id)
        store.mark_job(job.id, "done")
    assert finish_if_complete(store, sent[0], dispatch=sent.append) is True
    (reg,) = store.regressions(run_id=run_id)
    assert reg.state == "dismissed" and reg.state_note.startswith("not confirmed: the confirmation job ended")
    assert run_verdict(store, run_id).others == {"dismissed improvement": {"conversion_time": 1}}


def gain(model: str, ratio: float) -> SimpleNamespace:
    return SimpleNamespace(model=model, dtype="fp16", policy="default", target="cpu", state="suspected",
                           ratio=ratio, kind="conversion_time", category="improvement")


def test_the_caps_take_slowdowns_then_recoveries_then_improvements() -> None:
    slowdown = SimpleNamespace(**{**vars(gain("s", 1.3)), "category": "regression"})
    recovery = SimpleNamespace(**{**vars(gain("r", 0.9)), "category": "regression", "state": "suspected_resolved"})
    found = [gain("g", 0.1), recovery, slowdown, gain("h", 0.5)]
    assert [c[0] for c in select(found, ConfirmCaps(max_cells=8)).chosen] == ["s", "r", "g", "h"]
    sel = select(found, ConfirmCaps(max_cells=2))
    assert [c[0] for c in sel.chosen] == ["s", "r"] and sorted(c[0] for c in sel.capped) == ["g", "h"]


def test_an_improvement_a_cap_left_out_stays_suspected_and_is_no_gain(store: Store) -> None:
    a, b = chain(store, 2)
    cfg = Settings.from_env({"AMPCI_CONFIRM_MAX_CELLS": "1"})
    make_run(store, a, [slow_conversion(1, 0.9), slow_conversion_of(OTHER, 1, 0.3)], confirm_pairs=8)
    run_id = make_run(store, b, [slow_conversion(2, 0.3), slow_conversion_of(OTHER, 2, 0.9)], confirm_pairs=8)
    worker = StandInWorker(store, {"conversion_time": (SLOW, SLOW)})  # the slowdown is noise: dismissed
    assert finish_if_complete(store, run_id, cfg, dispatch=worker) is False
    assert [j.cell for j in store.jobs(worker.sent[0])] == [OTHER]  # the slowdown takes the one cell
    worker.work()
    by_cell = {g.cell: g for g in store.regressions(run_id=run_id)}
    assert (by_cell[CELL].category, by_cell[CELL].state, by_cell[CELL].state_by) == ("improvement", "suspected",
                                                                                      CAPPED_BY)
    assert by_cell[OTHER].state == "dismissed"
    v = run_verdict(store, run_id)
    assert v.others[CAPPED_GAIN_LABEL] == {"conversion_time": 1} and "improvement" not in v.others
    # a capped gain is no reason to withhold "no regressions" (a capped slowdown is)
    assert v.exit_code == 0 and "no regressions in 2 compared cells" in v.headline()
    assert f"1 {CAPPED_GAIN_LABEL} (conversion_time)" in v.headline()
    assert store.run_summary(run_id).improvements == 0


def slow_conversion_of(cell: tuple[str, str, str, str], seed: int, seconds: float) -> object:
    r = slow_conversion(seed, seconds)
    r.model, r.dtype, r.policy, r.target = cell
    return r


def _page(store: Store, url: str, run_id: int) -> str:
    from fastapi.testclient import TestClient

    with TestClient(make_app(store, url), raise_server_exceptions=True, headers=BROWSER) as c:
        r = c.get(f"/runs/{run_id}")
    assert r.status_code == 200
    return r.text


@pytest.mark.parametrize("coverage_lost", [True, False], ids=["deny-listed", "real-gain"])
def test_an_accuracy_gain_a_coverage_loss_explains_is_no_improvement(store: Store, db_url: str,
                                                                     coverage_lost: bool) -> None:
    """MatMul moved to the deny list: nothing is low precision any more, so max_abs falls to ~0 -- given up,
    not gained."""
    a, b = chain(store, 2)
    run_with(store, a, [make_result(CELL, max_abs=1e-2, lp_fraction=0.9)])
    run = run_with(store, b, [make_result(CELL, max_abs=1e-6, lp_fraction=0.0 if coverage_lost else 0.9, seed=1)])
    found = {g.kind: g for g in store.regressions(run_id=run)}
    acc = found["accuracy"]
    assert acc.category == "improvement"
    verdict = run_verdict(store, run)
    if coverage_lost:
        assert found["coverage"].category == "regression" and found["coverage"].state == "open"
        assert acc.state == EXPLAINED and acc.state_note.startswith("explained by the coverage loss on this cell")
        assert "low-precision" in acc.state_note
        assert store.run_summary(run).improvements == 0 and "improvement" not in verdict.others
        assert verdict.others["improvement explained by a coverage loss"] == {"accuracy": 1}
        assert views.finding_state(acc).css == "explained"
        assert views.cell_state(store.results(run_id=run)[0], None, [acc]).css == "pass"
    else:
        assert set(found) == {"accuracy"} and acc.state == "open" and acc.state_note is None
        assert store.run_summary(run).improvements == 1 and verdict.others["improvement"] == {"accuracy": 1}
    page = _page(store, db_url, run)
    assert ('id="findings-improvement"' in page) is not coverage_lost
    assert ('id="findings-improvement_not_counted"' in page) is coverage_lost
    detect_run(store, run)  # re-detection keeps it as it was
    assert {g.kind: g.state for g in store.regressions(run_id=run)}["accuracy"] == acc.state
