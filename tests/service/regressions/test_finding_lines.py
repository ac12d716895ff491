"""The end of the ``ampci sweep`` printout: one line per kind of finding, in a stable order, every stored state of
every category on exactly one of them (:mod:`service.regressions.finding_lines`), so no suspicion ends unseen."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from service.db.result_queries import REG_STATES
from service.regressions.finding_lines import FEW, LINES, finding_lines, line_of
from service.regressions.findings import CAPPED_BY, CATEGORIES


@dataclass(frozen=True)
class F:
    model: str
    kind: str
    category: str
    state: str
    state_by: str | None = None
    state_note: str | None = None
    dtype: str = "fp16"
    policy: str = "default"
    target: str = "cpu"


def test_every_state_of_every_category_has_a_line() -> None:
    """The source of truth: the categories (:data:`CATEGORIES`) and the states the store takes (``REG_STATES``)."""
    for category in CATEGORIES:
        for state in REG_STATES:
            assert line_of(category, state) in LINES, (category, state)
    with pytest.raises(ValueError):
        line_of("regression", "a state nobody placed")


def test_the_lines_come_in_one_order_each_once_and_name_few_cells() -> None:
    own = [F("conv_net", "conversion_time", "regression", "open"),
           F("a", "latency", "improvement", "open"),
           F("b", "accuracy", "flaky", "acknowledged"),
           F("c", "conversion_time", "regression", "dismissed", "ampci", "dismissed by 7 interleaved pairs: x1.01"),
           F("d", "conversion_time", "regression", "suspected", CAPPED_BY,
             "not confirmed: confirmation cap of 8 cells per run"),
           F("e", "latency", "improvement", "explained", "ampci", "coverage fell 0.9 -> 0.5"),
           *(F(f"m{i}", "latency", "improvement", "dismissed", "ampci", "noise") for i in range(FEW))]
    resolved = [F("old", "accuracy", "regression", "resolved", "ampci", "returned to baseline")]
    lines = finding_lines(own, resolved)
    assert [ln.split(":")[0] for ln in lines] == list(LINES)
    got = dict(ln.split(": ", 1) for ln in lines)
    assert got["regressions"] == "1 (conv_net/fp16/default/cpu conversion_time)"
    assert got["confirmed improvements"] == "1 (a/fp16/default/cpu latency)"
    assert got["flaky"] == "1 (b/fp16/default/cpu accuracy)"
    assert got["resolved"] == "1 (old/fp16/default/cpu accuracy)"
    assert got["dismissed"] == str(FEW + 2)  # more than FEW: counted only
    assert got["not confirmed"] == ("1 (d/fp16/default/cpu conversion_time (regression: not confirmed: "
                                    "confirmation cap of 8 cells per run))")
    few = dict(ln.split(": ", 1) for ln in finding_lines(own[3:5], []))
    assert "dismissed by 7 interleaved pairs" in few["dismissed"] and few["regressions"] == "none"


def test_the_sweep_printout_ends_with_them_and_says_what_a_later_run_resolved(
        sqlite_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Through a real store and ``ampci sweep``'s report: the regressing run's printout ends with its
    regression, the reverting run's with what it resolved."""
    from service.cli.sweep_cmd import _report
    from service.orchestration.scheduler import StartedRun
    from tests.service.factories import CELL, chain, make_result, migrated_store, run_with

    store = migrated_store(sqlite_url)
    a, b, c = chain(store, 3)
    run_with(store, a, [make_result(CELL)])
    bad = run_with(store, b, [make_result(CELL, max_abs=1.0, seed=1)])
    fixed = run_with(store, c, [make_result(CELL, seed=2)])
    tails = {}
    for run_id, base in ((bad, a), (fixed, b)):
        run = store.get_run(run_id)
        code = _report(argparse.Namespace(json=False), store, StartedRun(run_id, run.revision_sha, base, 1,
                                                                         created=True), run, None, [])
        tails[run_id] = (code, capsys.readouterr().out.strip().splitlines()[-len(LINES):])
    cell = "/".join(CELL)
    # reported after the revert resolved it: still the run's regression, the resolution beside it
    assert tails[bad] == (1, [f"regressions: 1 ({cell} accuracy, resolved since)", "confirmed improvements: none",
                              "flaky: none",
                              "resolved: none", "dismissed: none", "not confirmed: none"])
    assert tails[fixed][1][3] == f"resolved: 1 ({cell} accuracy)" and tails[fixed][1][0] == "regressions: none"
    store.dispose()
