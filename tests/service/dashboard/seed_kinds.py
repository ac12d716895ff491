"""One finding of every kind (:data:`service.regressions.rules.KINDS`) in every category
(:data:`service.regressions.rules.CATEGORIES`), state ``open``, plus every timing kind
(:data:`~service.regressions.rules.TIMING_KINDS`) regression in every confirmation state
(:data:`~service.regressions.rules.CONFIRMATION_STATES`: suspected, dismissed), each on its own run of one
cell, stored through the real store and the regressions table: what the visibility tests render on every
surface.  All are read from the rules, so a kind, category or state added there is seeded here at once."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from service.db import Store
from service.db import models as m
from service.regressions.rules import CATEGORIES, CONFIRMATION_STATES, KINDS, TIMING_KINDS
from tests.service.factories import chain, make_result, run_with

CELL = ("tiny_mlp", "fp16", "default", "cpu")
#: (kind, category, state) of each seeded finding
CASES = tuple((k, c, "open") for k, c in product(KINDS, CATEGORIES)) + tuple(
    (k, "regression", s) for k, s in product(TIMING_KINDS, CONFIRMATION_STATES))


@dataclass(frozen=True)
class Finding:
    """Where the seeded finding of one (kind, category, state) lives."""

    kind: str
    category: str
    state: str
    run_id: int
    regression_id: int
    revision: str

    @property
    def detail(self) -> str:
        """The finding's detail text (unique per pair, so a page shows which one it rendered)."""
        return detail(self.kind, self.category, self.state)


def detail(kind: str, category: str, state: str) -> str:
    """The seeded detail of (kind, category, state)."""
    return f"seeded {kind} {category} {state} finding"


def seed_every_finding(store: Store, start: int = 500) -> dict[tuple[str, str, str], Finding]:
    """A baseline run, then one run per (kind, category, state) of :data:`CASES` with that one finding."""
    shas = chain(store, len(CASES) + 1, start=start)
    run_with(store, shas[0], [make_result(CELL)], trigger="push", detect=False)
    table = m.Regression.__table__
    out: dict[tuple[str, str, str], Finding] = {}
    for (kind, category, state), rev in zip(CASES, shas[1:], strict=True):
        run_id = run_with(store, rev, [make_result(CELL, seed=len(out) + 1)], trigger="push", detect=False)
        result_id = store.results(run_id=run_id)[0].id
        with store.transaction() as conn:
            reg_id = conn.execute(table.insert().values(
                run_id=run_id, revision_sha=rev, baseline_sha=shas[0], model=CELL[0], dtype=CELL[1], policy=CELL[2],
                target=CELL[3], kind=kind, category=category,
                severity="info" if category == "improvement" else "minor", metric=f"{kind}_metric",
                baseline_value=1.0, value=1.5, delta=0.5, ratio=1.5, p_value=0.001, detail=detail(kind, category, state),
                result_id=result_id, baseline_result_id=None, state=state, created_at=store.clock(),
            ).returning(table.c.id)).scalar_one()
        out[(kind, category, state)] = Finding(kind, category, state, run_id, int(reg_id), rev)
    return out
