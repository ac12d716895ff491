"""When a drift is reported (issue 34), pure: :func:`service.regressions.detect.drift_findings` over a creep of
max_abs (x1.3 a commit: no step passes the accuracy rule's x2 and +1e-3, three do), by the run's trigger and
the earlier findings on its first-parent line.

A push, manual or nightly run reports a drift over the limits that no live finding of its cell and kind (open,
acknowledged, suspected, a false positive) since the reference already reports, whether or not its own step
tipped it: a drift dismissed by its confirmation while still below the floor, that then kept growing, is
reported once it is over the limit.  A pull request is blamed only when its own change tipped the drift: main's
unreported drift does not fail it."""

from __future__ import annotations

import pytest

from service.regressions.detect import drift_findings
from service.regressions.rules import Finding
from service.regressions.stored import LineFinding, Samples, StoredResult
from service.regressions.thresholds import Thresholds

CELL = ("tiny_mlp", "fp16", "default", "cpu")
OTHER = ("tiny_mlp", "bf16", "default", "cpu")


def result(k: int, max_abs: float, cell: tuple[str, str, str, str] = CELL) -> StoredResult:
    """The result of commit ``k`` of the line (revision ``c{k}``)."""
    rid = 100 + k + (50 if cell == OTHER else 0)
    return StoredResult(cell, rid, 10 + k, f"c{k}", "pass", max_abs, 0.9999, None, None, 0.9, 4, None, None, None)


def creep(k: int) -> float:
    return 1e-3 * 1.3 ** k


def judge_commit(trigger: str, current: float, earlier: list[tuple[str, str | None, int, str]],
                 n: int = 5, pairwise: tuple[str, ...] = ()) -> list[tuple[str, str | None, str | None]]:
    """The drifts reported by a ``trigger`` run of commit ``n`` measuring ``current``, commits 0..n-1 measured on
    the creep, with ``earlier`` findings (kind, metric, commit, state) on the line: (kind, metric, reference)."""
    line = [(f"c{k}", n - k) for k in range(n, -1, -1)]
    on_line = [result(k, creep(k)) for k in range(n)]
    found = [LineFinding(CELL, kind, metric, f"c{k}", state) for kind, metric, k, state in earlier]
    pair = {CELL: [(Finding(kind=kind, category="regression", severity="major", metric=None, baseline_value=None,
                            value=None, detail=""), None, None) for kind in pairwise]}
    got = drift_findings(f"c{n}", trigger, {CELL: result(n, current)}, line, on_line, None, found, pair,
                         Thresholds(), Samples())
    return [(f.kind, f.metric, ref) for f, _, ref in got.values()]


DRIFT = [("drift", "max_abs", "c0")]
PUSHES = ["push", "manual", "nightly"]


@pytest.mark.parametrize("trigger", PUSHES)
@pytest.mark.parametrize("current", [creep(5), creep(4), creep(4) * 0.97], ids=["own step", "no step", "step back"])
def test_an_unreported_drift_over_the_limit_is_reported_by_the_next_push_whatever_its_own_step(
        trigger: str, current: float) -> None:
    """The parent (x2.86) already stood past the limit and nothing reported it: this run does."""
    assert judge_commit(trigger, current, []) == DRIFT


@pytest.mark.parametrize("earlier, reported", [
    # the bench's creep: its drift at commit 3 (x2.2) dismissed by confirmation; 4 and 5 kept growing
    ([("drift", "max_abs", 3, "dismissed")], True),
    ([("drift", "max_abs", 4, "dismissed")], True),
    ([("accuracy", "max_abs", 3, "dismissed")], True),     # the parent comparison's, dismissed: not live
    ([("drift", "max_abs", 3, "resolved")], True),
    ([("drift", "max_abs", 0, "open")], True),             # at the reference: a change before it
    ([("coverage", "casts_inserted", 3, "open")], True),   # another kind's
    ([("drift", "casts_inserted", 3, "open")], True),      # another metric's kind's drift
    ([("drift", "max_abs", 3, "open")], False),            # reported: the same change
    ([("drift", "max_abs", 3, "acknowledged")], False),
    ([("drift", "max_abs", 3, "false_positive")], False),
    ([("drift", "max_abs", 4, "suspected")], False),       # awaiting its confirmation
    ([("accuracy", "max_abs", 3, "open")], False),         # the parent comparison's finding of that kind
    ([("drift", "max_abs", 3, "dismissed"), ("drift", "max_abs", 4, "open")], False),
    ([("drift", "max_abs", 5, "open")], False),            # an earlier run of this very revision reported it
])
@pytest.mark.parametrize("trigger", PUSHES)
def test_a_live_finding_since_the_reference_silences_a_dismissed_one_does_not(
        trigger: str, earlier: list[tuple[str, str | None, int, str]], reported: bool) -> None:
    assert judge_commit(trigger, creep(5), earlier) == (DRIFT if reported else [])


@pytest.mark.parametrize("trigger", [*PUSHES, "pull_request"])
def test_below_the_limit_or_a_step_the_parent_comparison_reports_is_no_drift(trigger: str) -> None:
    assert judge_commit(trigger, creep(2), [], n=2) == []                      # x1.69 of the reference
    assert judge_commit(trigger, creep(5), [], pairwise=("accuracy",)) == []   # the step is this run's finding


@pytest.mark.parametrize("earlier, current, blamed", [
    ([], creep(5), False),                                      # main's unreported drift: not the PR's
    ([("drift", "max_abs", 3, "dismissed")], creep(5), False),  # dismissed two commits back: parent over
    ([("drift", "max_abs", 4, "dismissed")], creep(5), True),   # the parent's drift dismissed, the PR moved it
    ([("drift", "max_abs", 4, "dismissed")], creep(4), False),  # ... but not by its own step
])
def test_a_pull_request_is_blamed_only_when_its_own_change_tips_the_drift(
        earlier: list[tuple[str, str | None, int, str]], current: float, blamed: bool) -> None:
    assert judge_commit("pull_request", current, earlier) == (DRIFT if blamed else [])


def test_a_pull_request_whose_step_tips_the_drift_is_blamed() -> None:
    assert judge_commit("pull_request", creep(3), [], n=3) == DRIFT  # the parent stood at x1.69


def test_other_cells_history_is_not_this_cells() -> None:
    line = [(f"c{k}", 5 - k) for k in range(5, -1, -1)]
    on_line = [result(k, creep(k)) for k in range(5)] + [result(k, 1e-3, OTHER) for k in range(5)]
    earlier = [LineFinding(OTHER, "drift", "max_abs", "c3", "open")]
    got = drift_findings("c5", "push", {CELL: result(5, creep(5)), OTHER: result(5, 1e-3, OTHER)}, line, on_line,
                         None, earlier, {}, Thresholds(), Samples())
    assert {c: (f.kind, f.metric) for c, (f, _, _) in got.items()} == {CELL: ("drift", "max_abs")}
