"""Drift judging leaves most of the line on the server (issue 42): it reads the line's results in brief (cell,
id, run, revision, status), fetches each cell's parent, window start and pin whole in one query, and the others
only when a drift is described.  The findings must be exactly those judged from every result's
document read with the line: checked on lines measured at every commit, sparsely, with the pin near and deep,
for a cell that creeps (so drifts are found and described) and one that holds still.  Real stores (SQLite and
PostgreSQL)."""

from __future__ import annotations

import random

import pytest

from service.db import Store, pins, series
from service.db.queries import first_parent_line
from service.orchestration.judge import nearest_line_results, sampled_ends
from service.regressions import detect
from service.regressions.stored import BriefResult, Samples, StoredResult, sample
from service.regressions.thresholds import Thresholds
from tests.service.factories import CELL, chain, make_result, run_with

STILL = ("tiny_mlp", "bf16", "default", "cpu")


class CountingLoads:
    """``load`` for Samples that counts the results it fetched whole."""

    def __init__(self, conn: object) -> None:
        self.conn, self.fetched = conn, 0

    def __call__(self, ids: object) -> dict[int, StoredResult]:
        got = series.results_by_id(self.conn, ids=list(ids))  # type: ignore[arg-type]
        self.fetched += len(got)
        return got


@pytest.mark.parametrize("every,pin_at,creep", [(1, None, 1.04), (1, 3, 1.04), (3, 10, 1.05), (5, None, 1.0),
                                                (1, 30, 1.0), (2, None, 1.3)])
def test_deferred_documents_give_the_findings_of_the_raw_samples(store: Store, every: int, pin_at: int | None,
                                                                 creep: float) -> None:
    rng = random.Random(every * 100 + (pin_at or 0))
    shas = chain(store, 40)
    for k, rev in enumerate(shas[:-1]):
        results = []
        if k % every == 0:
            results.append(make_result(CELL, latency_ms=2.0 * creep ** k, max_abs=1e-3 * creep ** k, seed=k))
        if rng.random() < 0.5:  # the other cell at other commits, sometimes twice (pooled)
            results += [make_result(STILL, seed=k)] * rng.choice([1, 2])
        for r in results:
            run_with(store, rev, [r], detect=False)
    if pin_at is not None:
        with store.transaction() as conn:
            pins.pin(conn, branch="main", sha=shas[pin_at], now=store.clock())
    k = len(shas) - 1
    run_id = run_with(store, shas[-1], [make_result(CELL, latency_ms=2.0 * creep ** k, max_abs=1e-3 * creep ** k,
                                                    seed=k), make_result(STILL, seed=k)], detect=False)
    th = Thresholds()
    need = max(th.drift_window, th.flaky_window)
    with store.transaction() as conn:
        current = series.current_results(conn, run_id=run_id)
        line = first_parent_line(conn, shas[-1], th.drift_line_depth)
        on_line = [s for s, d in line if d > 0]
        pinned = pins.pin_for(conn, branch="main")
        earlier = series.earlier_on_line(conn, run_id=run_id, shas=[s for s, _ in line])
        raw_rows = nearest_line_results(conn, run_id, on_line, set(current), pinned, need)
        raw = detect.drift_findings(shas[-1], "push", current, line, raw_rows, pinned, earlier, {}, th, Samples())

        bare = nearest_line_results(conn, run_id, on_line, set(current), pinned, need, brief=True)
        load = CountingLoads(conn)
        deferred = Samples(load)
        deferred.defer(bare)
        ends = sampled_ends(bare, dict(line), pinned, th.drift_window)
        deferred.prefetch(ends)
        prefetched = load.fetched
        got = detect.drift_findings(shas[-1], "push", current, line, bare, pinned, earlier, {}, th, deferred)
        by_id = {r.id: r for r in raw_rows}
        # every deferred result samples exactly as its document read with the line does
        assert all(deferred(r) == sample(by_id[r.id]) for r in bare)
    assert {r.id for r in bare} == set(by_id) and all(isinstance(r, BriefResult) for r in bare)
    assert all((r.cell, r.run_id, r.revision_sha, r.status) ==
               (by_id[r.id].cell, by_id[r.id].run_id, by_id[r.id].revision_sha, by_id[r.id].status) for r in bare)
    assert got == raw
    if creep > 1.0:
        assert CELL in raw, "the creeping cell drifted: the described path was exercised"
    else:
        assert not raw
    # one query for the ends: at most the parent, the window start and the pin per cell (pooled rows each)
    assert prefetched == len({r.id for r in ends}) < len(bare)
    assert len({r.revision_sha for r in ends if r.cell == CELL}) <= 3


def test_a_deferred_result_needs_a_loader() -> None:
    r = StoredResult(CELL, 1, 1, "a" * 40, "pass", None, None, None, None, None, None, None, None, None)
    with pytest.raises(ValueError):
        Samples().defer([r])


def test_a_brief_result_is_sampled_only_when_deferred() -> None:
    whole = StoredResult(CELL, 1, 1, "a" * 40, "pass", 1e-3, None, None, None, None, None, None, None, None)
    brief = BriefResult(CELL, 1, 1, "a" * 40, "pass")
    with pytest.raises(ValueError):
        Samples()(brief)
    loaded = Samples(lambda ids: {1: whole})
    loaded.defer([brief])
    assert loaded(brief) == sample(whole) and loaded(brief).max_abs == 1e-3
    gone = Samples(lambda ids: {})  # deleted since it was read: sampled as a result without columns
    gone.defer([brief])
    assert gone(brief).max_abs is None and gone(brief).status == "pass"
