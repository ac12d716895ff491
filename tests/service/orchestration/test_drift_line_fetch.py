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
from service.orchestration.judge import drift_line, nearest_line_results
from service.regressions.detect import by_cell_and_revision
from service.regressions.stored import StoredResult
from service.regressions.thresholds import Thresholds
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


NEW = ("new_model", "fp16", "default", "cpu")


@pytest.mark.parametrize("every,pin_at,new_cell", [(1, None, False), (1, 3, False), (1, 40, False), (1, None, True),
                                                   (4, None, False), (1000, None, False), (1, 58, False)])
def test_the_short_walk_of_the_line_reads_what_the_whole_walk_read(store: Store, every: int, pin_at: int | None,
                                                                    new_cell: bool) -> None:
    """:func:`drift_line` walks the line only ``need`` deep when that chunk is all the read would take: its
    results (and the line down to the deepest of them) are those of the whole walk's read, on dense, sparse and
    pinned lines and with a cell that has no history; the dense line is walked short."""
    shas = chain(store, 60)
    for k, rev in enumerate(shas[:-1]):
        if k % every == 0:
            run_with(store, rev, [make_result(CELL, seed=k), make_result(OTHER, seed=k)], detect=False)
    if pin_at is not None:
        with store.transaction() as conn:
            pins.pin(conn, branch="main", sha=shas[pin_at], now=store.clock())
    cells = {CELL, OTHER, *([NEW] if new_cell else [])}
    run_id = run_with(store, shas[-1], [make_result(c, seed=99) for c in cells], detect=False)
    th = Thresholds()
    need = max(th.drift_window, th.flaky_window)
    with store.transaction() as conn:
        pinned = pins.pin_for(conn, branch="main")
        whole_line = first_parent_line(conn, shas[-1], th.drift_line_depth)
        whole = nearest_line_results(conn, run_id, [s for s, d in whole_line if d > 0], cells, pinned, need,
                                     brief=True)
        line, on_line, grouped = drift_line(conn, store.run_row(conn, run_id), cells, pinned, th)
    assert [r.id for r in on_line] == [r.id for r in whole]
    assert grouped == by_cell_and_revision(whole)
    deepest = max(d for s, d in whole_line if s in {r.revision_sha for r in whole})
    assert [x for x in line if x[1] <= deepest] == [x for x in whole_line if x[1] <= deepest]
    dense_unpinned_or_near = every == 1 and not new_cell and (pin_at is None or pin_at >= 59 - need)
    assert len(line) - 1 == (need if dense_unpinned_or_near else len(whole_line) - 1), len(line)


def test_the_pinned_revision_counts_as_measured_only_once_the_read_reaches_it(store: Store) -> None:
    """A cell one revision short of ``need`` in the first chunk, measured at a deeper pinned revision (read
    first): the read goes on to the next chunk, as reading the whole line says it must."""
    shas = chain(store, 60)
    for k, rev in enumerate(shas[:-1]):
        if k != 56:  # depth 3 not measured: 5 of the first chunk's 6 revisions are
            run_with(store, rev, [make_result(CELL, seed=k)], detect=False)
    with store.transaction() as conn:
        pins.pin(conn, branch="main", sha=shas[10], now=store.clock())  # depth 49, measured
    run_id = run_with(store, shas[-1], [make_result(CELL, seed=99)], detect=False)
    need = 6
    with store.transaction() as conn:
        line = first_parent_line(conn, shas[-1], 200)
        on_line = [s for s, d in line if d > 0]
        pinned = pins.pin_for(conn, branch="main")
        whole = series.line_results(conn, run_id=run_id, shas=on_line)
        bounded = nearest_line_results(conn, run_id, on_line, {CELL}, pinned, need)
    depth = dict(line)
    assert _view(bounded, depth, need, pinned) == _view(whole, depth, need, pinned)
    assert max(depth[r.revision_sha] for r in bounded if r.revision_sha != pinned) > need
