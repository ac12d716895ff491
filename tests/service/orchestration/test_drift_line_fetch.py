"""Drift judging reads only as much of the first-parent line as it uses (:func:`nearest_line_results`).

The bounded read must give :func:`service.regressions.detect.drift_findings` exactly what reading the whole
line gave: checked on lines measured at every commit, rarely, never, with the pinned revision near, deep and
absent, for two cells measured at different commits.  Real stores (SQLite and PostgreSQL).
"""

from __future__ import annotations

import random

import pytest

from service.db import Store, pins, series
from service.db.queries import first_parent_line
from service.orchestration.judge import nearest_line_results
from service.regressions.stored import StoredResult
from tests.service.factories import CELL, chain, make_result, run_with

OTHER = ("tiny_mlp", "bf16", "default", "cpu")


def _view(rows: list[StoredResult], depth: dict[str, int], need: int, pinned: str | None) -> dict[tuple, set[int]]:
    """Per cell, the ids of what drift judging reads: the results at its nearest ``need`` measured revisions
    and at the pinned one."""
    out: dict[tuple, set[int]] = {}
    for cell in {r.cell for r in rows}:
        mine = [r for r in rows if r.cell == cell]
        nearest = sorted({r.revision_sha for r in mine}, key=lambda s: depth[s])[:need]
        out[cell] = {r.id for r in mine if r.revision_sha in nearest or r.revision_sha == pinned}
    return out


@pytest.mark.parametrize("every,pin_at", [(1, None), (1, 2), (4, 5), (9, 40), (1000, None)])
def test_the_bounded_read_gives_the_drift_rules_what_the_whole_line_gave(store: Store, every: int,
                                                                          pin_at: int | None) -> None:
    rng = random.Random(every)
    shas = chain(store, 60)
    for k, rev in enumerate(shas[:-1]):
        results = [make_result(CELL, seed=k)] if k % every == 0 else []
        if rng.random() < 0.3:  # the other cell measured at other commits, sometimes twice
            results += [make_result(OTHER, seed=k)] * rng.choice([1, 2])
        for r in results:
            run_with(store, rev, [r], detect=False)
    if pin_at is not None:
        with store.transaction() as conn:
            pins.pin(conn, branch="main", sha=shas[pin_at], now=store.clock())
    run_id = run_with(store, shas[-1], [make_result(CELL, seed=99), make_result(OTHER, seed=99)], detect=False)
    need = 6
    with store.transaction() as conn:
        line = first_parent_line(conn, shas[-1], 200)
        on_line = [s for s, d in line if d > 0]
        pinned = pins.pin_for(conn, branch="main")
        whole = series.line_results(conn, run_id=run_id, shas=on_line)
        bounded = nearest_line_results(conn, run_id, on_line, {CELL, OTHER}, pinned, need)
    depth = dict(line)
    assert len({r.id for r in bounded}) == len(bounded), "a result read twice"
    assert {r.id for r in bounded} <= {r.id for r in whole}
    assert _view(bounded, depth, need, pinned) == _view(whole, depth, need, pinned)
    # it stops reading soon after every cell has its `need` revisions (chunks double), not at the line's end
    index = {s: i for i, s in enumerate(on_line)}
    enough = max((sorted({index[r.revision_sha] for r in whole if r.cell == cell})[need - 1:need] or [len(on_line)])[0]
                 for cell in (CELL, OTHER))
    read = max(index[r.revision_sha] for r in bounded if r.revision_sha != pinned)
    assert read <= 2 * enough + need, (read, enough)
    if every == 1 and enough < len(on_line) // 4:
        assert read < len(on_line) - 1
