"""One finding of every kind (:data:`service.regressions.rules.KINDS`) in every category
(:data:`service.regressions.rules.CATEGORIES`), each on its own run of one cell, stored through the real
store and the regressions table: what the visibility tests render on every surface.  The kinds and
categories are read from the rules, so a kind or category added there is seeded here at once."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from service.db import Store
from service.db import models as m
from service.regressions.rules import CATEGORIES, KINDS
from tests.service.factories import chain, make_result, run_with

CELL = ("tiny_mlp", "fp16", "default", "cpu")
PAIRS = tuple(product(KINDS, CATEGORIES))


@dataclass(frozen=True)
class Finding:
    """Where the seeded finding of one (kind, category) lives."""

    kind: str
    category: str
    run_id: int
    regression_id: int
    revision: str

    @property
    def detail(self) -> str:
        """The finding's detail text (unique per pair, so a page shows which one it rendered)."""
        return detail(self.kind, self.category)


def detail(kind: str, category: str) -> str:
    """The seeded detail of (kind, category)."""
    return f"seeded {kind} {category} finding"


def seed_every_finding(store: Store, start: int = 500) -> dict[tuple[str, str], Finding]:
    """A baseline run, then one run per (kind, category) with that one finding (state ``open``)."""
    shas = chain(store, len(PAIRS) + 1, start=start)
    run_with(store, shas[0], [make_result(CELL)], trigger="push", detect=False)
    table = m.Regression.__table__
    out: dict[tuple[str, str], Finding] = {}
    for (kind, category), rev in zip(PAIRS, shas[1:], strict=True):
        run_id = run_with(store, rev, [make_result(CELL, seed=len(out) + 1)], trigger="push", detect=False)
        result_id = store.results(run_id=run_id)[0].id
        with store.transaction() as conn:
            reg_id = conn.execute(table.insert().values(
                run_id=run_id, revision_sha=rev, baseline_sha=shas[0], model=CELL[0], dtype=CELL[1], policy=CELL[2],
                target=CELL[3], kind=kind, category=category,
                severity="info" if category == "improvement" else "minor", metric=f"{kind}_metric",
                baseline_value=1.0, value=1.5, delta=0.5, ratio=1.5, p_value=0.001, detail=detail(kind, category),
                result_id=result_id, baseline_result_id=None, state="open", created_at=store.clock(),
            ).returning(table.c.id)).scalar_one()
        out[(kind, category)] = Finding(kind, category, run_id, int(reg_id), rev)
    return out
