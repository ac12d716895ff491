"""Every suspicion ends visibly (issue 39): a conversion-time change beyond the rule's limits that the
machine-slowdown guard judges the machine's is stored as a ``dismissed`` finding saying why, shown in the run's
verdict and its views, never failing the gate; the pass's own sleep is a regression.  Real stores (SQLite and
PostgreSQL), runs judged by the real finisher."""

from __future__ import annotations

import random

from service.db import Store
from service.orchestration.judge import run_verdict
from service.regressions.finding_lines import finding_lines
from tests.service.factories import CELL, chain, make_result
from tests.service.orchestration.test_verdict_lists import finished


def timed(seed: int, wall: float, cpu: float, ref: float) -> object:
    """A result whose 5 conversions took ``wall`` s (``cpu`` s of CPU), each followed by a ``ref`` s reference."""
    r = make_result(CELL, seed=seed)
    assert r.graph is not None
    rng = random.Random(seed)
    r.graph.convert_samples_s = [wall * (1 + rng.uniform(-0.01, 0.01)) for _ in range(5)]
    r.graph.convert_cpu_s = [cpu * (1 + rng.uniform(-0.01, 0.01)) for _ in range(5)]
    r.graph.convert_reference_s = [ref * (1 + rng.uniform(-0.01, 0.01)) for _ in range(5)]
    return r


def test_a_machine_slowdown_ends_as_a_dismissed_finding_and_a_sleep_as_a_regression(store: Store) -> None:
    a, b, c = chain(store, 3)
    finished(store, a, [timed(0, 0.25, 0.20, 0.010)])
    # the whole machine x3 slower (the reference too), CPU flat: beyond the rule's limits in wall time, dismissed
    busy = finished(store, b, [timed(1, 0.75, 0.20, 0.030)])
    (f,) = store.regressions(run_id=busy)
    assert (f.kind, f.category, f.state, f.state_by) == ("conversion_time", "regression", "dismissed", "ampci")
    assert f.state_note.startswith("dismissed: wall time only, within what the machine did: the reference "
                                   "workload moved x"), f.state_note
    verdict = run_verdict(store, busy)
    assert verdict.exit_code == 0 and "1 dismissed (conversion_time)" in verdict.headline(), verdict.headline()
    assert "dismissed: 1 (tiny_mlp/fp16/default/cpu conversion_time (regression: dismissed: wall time only" in \
        "\n".join(finding_lines(store.regressions(run_id=busy), []))
    # the pass sleeping 0.5 s a conversion, the reference as fast as before: a regression (no confirmation here)
    slow = finished(store, c, [timed(2, 1.25, 0.20, 0.030)])
    (g,) = [x for x in store.regressions(run_id=slow) if x.kind == "conversion_time"]
    assert (g.category, g.state) == ("regression", "open") and "(wall only)" in g.detail, g.detail
    assert run_verdict(store, slow).exit_code == 1
