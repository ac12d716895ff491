"""The drift lookback window's length (:data:`Thresholds.drift_window`, applied in
:func:`service.regressions.detect.drift_findings`): the reference is the oldest of exactly the last
``drift_window`` measured revisions, not one more and not one fewer.  Two creeps of ``max_abs`` (the drift rule:
x2 and +1e-3) against a 4-revision window, real stores (SQLite and PostgreSQL):

* x1.20 a commit is x2.07 over 4 commits and x1.73 over 3: reported at commit 4 against commit 0 ("over 4
  commits"); a window one revision narrower never reaches x2;
* x1.15 a commit is x1.75 over 4 commits and x2.01 over 5: never reported; a window one revision wider would
  report it at commit 5.
"""

from __future__ import annotations

from service.db import Store
from service.regressions.thresholds import Thresholds
from tests.service.factories import CELL, chain, make_result, run_with

WINDOW = 4


def creep(store: Store, step: float, commits: int) -> dict[int, list]:
    """Run commit k of a creep of ``max_abs`` by ``step`` a commit; the findings of each run."""
    store.thresholds = Thresholds(drift_window=WINDOW)
    shas = chain(store, commits)
    return {k: store.regressions(run_id=run_with(store, rev, [make_result(CELL, max_abs=1e-3 * step ** k, seed=k)]))
            for k, rev in enumerate(shas)}


def test_the_window_reaches_back_exactly_drift_window_revisions(store: Store) -> None:
    found = creep(store, 1.20, 7)
    assert [k for k, v in found.items() if v] == [WINDOW], {k: [g.detail for g in v] for k, v in found.items()}
    (reg,) = found[WINDOW]
    assert reg.kind == "drift" and reg.metric == "max_abs"
    assert f"over {WINDOW} commits" in reg.detail and f"(the start of the {WINDOW}-revision window)" in reg.detail


def test_the_window_reaches_no_further_than_drift_window_revisions(store: Store) -> None:
    found = creep(store, 1.15, 10)
    assert not any(found.values()), {k: [g.detail for g in v] for k, v in found.items() if v}


def test_the_creeps_cross_the_rule_at_one_window_length_and_not_the_next() -> None:
    """The figures behind the two tests, from the rule's own threshold: each creep crosses it at one window
    length and not at the other, so a window one revision off changes what they see."""
    limit = Thresholds().accuracy_for(CELL[0], CELL[1])
    assert limit.worse(1e-3, 1e-3 * 1.20 ** WINDOW) and not limit.worse(1e-3, 1e-3 * 1.20 ** (WINDOW - 1))
    assert limit.worse(1e-3, 1e-3 * 1.15 ** (WINDOW + 1)) and not limit.worse(1e-3, 1e-3 * 1.15 ** WINDOW)
