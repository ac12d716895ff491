"""The decisions of detection, confirmation and bisection are pure functions of plain records: table-driven here,
with no database (the same decisions run over the store in test_detect, test_confirm and test_bisect)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from service.regressions.bisect import interval, newest_by_revision
from service.regressions.confirm import ConfirmResult, capped_values, unconfirmed_values, verdict_values
from service.regressions.detect import resolutions
from service.regressions.rules import CAPPED_BY
from service.regressions.stored import StoredResult, sample
from service.regressions.thresholds import Thresholds

CELL = ("m", "fp16", "default", "cpu")
NOW = datetime(2026, 1, 1, tzinfo=UTC)
TH = Thresholds()


def result(rid: int, sha: str, max_abs: float, status: str = "pass", doc: object = None) -> StoredResult:
    """A stored result of CELL (an accuracy figure, no timings)."""
    return StoredResult(CELL, rid, rid, sha, status, max_abs, 0.9999, None, None, 0.5, 4, "env-a", None,
                        json.dumps(doc) if doc is not None else None)


@dataclass(frozen=True)
class Finding:
    """A stored finding as the rules read it."""

    id: int = 7
    model: str = CELL[0]
    dtype: str = CELL[1]
    policy: str = CELL[2]
    target: str = CELL[3]
    kind: str = "accuracy"
    metric: str = "max_abs"
    category: str = "regression"
    state: str = "open"
    state_before: str | None = None
    revision_sha: str = "bad"
    baseline_sha: str | None = "base"
    result_id: int | None = 2
    baseline_result_id: int | None = 1


def test_sample_parses_the_document_only_when_asked() -> None:
    r = result(1, "a", 1e-3, doc={"latency": {"samples_ms": [1.0, 2.0]}, "convergence": {"error_unit": "relative"}})
    got = sample(r)
    assert (got.max_abs, got.latency_samples, got.error_unit) == (1e-3, (1.0, 2.0), "relative")
    assert sample(result(1, "a", 1e-3)).error_unit == "absolute"  # no document: stored before units


@pytest.mark.parametrize(("new_max_abs", "revision", "want"), [
    (1e-3, "fix", [(7, "resolved")]),   # back at the baseline's accuracy: resolved
    (0.5, "fix", []),                    # still regressed: stays open
])
def test_a_later_result_resolves_only_a_regression_it_no_longer_shows(new_max_abs: float, revision: str,
                                                                       want: list[tuple[int, str]]) -> None:
    base, bad, new = result(1, "base", 1e-3), result(2, "bad", 0.5), result(3, revision, new_max_abs)
    got = resolutions(9, revision, [Finding()], {1: base, 2: bad}, {CELL: new}, TH, NOW)
    assert [(i, v["state"]) for i, v in got] == want
    if got:
        assert got[0][1]["resolved_by_result_id"] == 3 and got[0][1]["state_note"].startswith("returned to baseline")


def test_a_regression_without_its_baseline_result_is_left_as_it_is() -> None:
    assert resolutions(9, "fix", [Finding()], {}, {CELL: result(3, "fix", 1e-3)}, TH, NOW) == []


@pytest.mark.parametrize(("finding", "res", "state", "counted"), [
    (Finding(state="suspected", kind="latency"), None, "open", "unconfirmed"),  # a slowdown not measured stays
    (Finding(state="suspected", kind="latency", category="improvement"), None, "dismissed", "unconfirmed"),
    (Finding(state="suspected_resolved", kind="latency", state_before="acknowledged"), None, "acknowledged",
     "unconfirmed"),  # a recovery not measured goes back as it was
    (Finding(state="suspected", kind="latency"),
     ConfirmResult(1, CELL, "pass", None, {"confirmation": {"kinds": {"latency": {
         "baseline": [1.0] * 8, "candidate": [1.0] * 8, "unit": "ms"}}}}), "dismissed", "dismissed"),
    (Finding(state="suspected", kind="latency"),
     ConfirmResult(1, CELL, "pass", None, {"confirmation": {"kinds": {"latency": {
         "baseline": [1.0 + i / 100 for i in range(8)], "candidate": [2.0 + i / 100 for i in range(8)],
         "unit": "ms"}}}}), "open", "confirmed"),
])
def test_confirmation_verdicts(finding: Finding, res: ConfirmResult | None, state: str, counted: str) -> None:
    values, got = verdict_values(finding, res, TH)
    assert (values["state"], got) == (state, counted)


def test_capped_and_unconfirmed_findings() -> None:
    values, when = capped_values(Finding(state="suspected"), "cap of 8 reached")
    assert (values, when) == ({"state_by": CAPPED_BY, "state_note": "not confirmed: cap of 8 reached"}, "suspected")
    values, when = unconfirmed_values(Finding(state="suspected_resolved", state_before="acknowledged"), "off")
    assert (values["state"], values["resolved_by_result_id"], when) == ("acknowledged", None, "suspected_resolved")


@pytest.mark.parametrize(("verdicts", "want"), [
    ({0: "good", 4: "bad"}, (0, 4, [1, 2, 3], ())),
    ({0: "good", 2: "good", 3: "bad", 4: "bad"}, (2, 3, [], ())),            # found: the first bad is 3
    ({0: "good", 1: "skip", 2: "skip", 4: "bad"}, (0, 4, [3], ("c1", "c2"))),  # skipped commits are never blamed
])
def test_the_interval_left_to_bisect(verdicts: dict[int, str], want: tuple[object, ...]) -> None:
    assert interval(["c0", "c1", "c2", "c3", "c4"], verdicts) == want


def test_newest_result_per_revision() -> None:
    got = newest_by_revision([result(5, "a", 1.0), result(3, "a", 2.0), result(4, "b", 3.0)])
    assert {sha: r.id for sha, r in got.items()} == {"a": 5, "b": 4}
