"""Baseline runs for webhook runs: run the baseline revision's missing cells first, judge after.

``ampci sweep`` runs the baseline revision for the cells it has no results for before it judges
(``asv continuous``).  A push or pull-request run does the same here:

* :func:`plan` — for each requested run, the cells of its sweep that have no result at its baseline
  revision and are not being measured there by an unfinished run: a ``manual`` run of the baseline
  revision for exactly those cells (its dedup key names the revision, sweep and cells, so a retried
  delivery or a second push on the same parent creates it once), and the ids of the unfinished runs at
  the baseline that already measure some of its cells;
* the requested run records the runs it waits for in ``meta["awaits_runs"]``;
  :func:`service.orchestration.jobs.finish_if_complete` judges (detects, confirms, finishes) a run only
  when :func:`waiting` is False, and once a run finishes it finishes the runs that waited for it
  (:func:`dependents`).  Both the embedded pool and Celery workers finish runs through that function, so
  judging happens after the baseline cells are in, in either mode, and the commit status (posted when
  the run is final) says what was compared.

A run is never its own baseline: a request whose baseline is its own revision plans nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from service.db import baselines
from service.db.records import Cell
from service.json_types import JsonValue
from service.vocabulary import (
    FINAL_RUN_STATES as FINAL_RUN_STATES,  # read here by service.regressions.verdict
)

if TYPE_CHECKING:
    from service.db.engine import Connection
    from service.db.store import Store
    from service.orchestration.sweeps import PlannedCell

#: The run meta key listing the runs a run waits for before it is judged.
AWAITS = "awaits_runs"


@dataclass(frozen=True)
class BaselineNeed:
    """What a requested run at ``baseline`` needs: ``missing`` cells to run there, and the unfinished runs
    there (``running``) that already measure some of its cells."""

    baseline: str
    missing: tuple[Cell, ...]
    running: tuple[int, ...]

    def dedup_key(self, sweep: str) -> str:
        """The baseline run's dedup key: the revision, the sweep and a digest of the cells."""
        digest = hashlib.sha256("\n".join("|".join(c) for c in sorted(self.missing)).encode()).hexdigest()[:16]
        return f"baseline:{self.baseline}:{sweep}:{digest}"


def plan(conn: Connection, wanted: Mapping[str, Iterable[Cell]]) -> dict[str, BaselineNeed]:
    """For each baseline revision in ``wanted`` (sha -> the cells runs judged against it need), what is
    missing there and which unfinished runs there already measure wanted cells (two queries in all)."""
    if not wanted:
        return {}
    shas = list(wanted)
    have = baselines.measured_cells(conn, shas=shas)
    busy = baselines.cells_being_measured(conn, shas=shas)
    out: dict[str, BaselineNeed] = {}
    for sha, cells in wanted.items():
        cells = list(dict.fromkeys(cells))
        missing = tuple(c for c in cells if c not in have[sha] and c not in busy[sha])
        running = tuple(sorted({busy[sha][c] for c in cells if c not in have[sha] and c in busy[sha]}))
        out[sha] = BaselineNeed(sha, missing, running)
    return out


def awaited(meta: Mapping[str, JsonValue] | None) -> tuple[int, ...]:
    """The run ids a run's ``meta`` says it waits for."""
    got = (meta or {}).get(AWAITS) or ()
    return tuple(int(x) for x in got if isinstance(x, int) and not isinstance(x, bool))


def waiting(store: Store, run_id: int) -> bool:
    """True while a run the run waits for (its baseline's missing cells) is not final."""
    ids = awaited(store.get_run(run_id).meta)
    if not ids:
        return False
    with store.transaction() as conn:
        done = baselines.count_final_runs(conn, run_ids=ids)
    return done < len(set(ids))


def dependents(store: Store, run_id: int) -> list[int]:
    """The unfinished runs that wait for run ``run_id`` (judged against its revision), oldest first."""
    run = store.get_run(run_id)
    with store.transaction() as conn:
        waiting_runs = baselines.unfinished_runs_judged_against(conn, sha=run.revision_sha)
    return [other for other, meta in waiting_runs if run_id in awaited(meta)]


def cells_of(planned: Sequence[PlannedCell], cells: Iterable[Cell]) -> list[PlannedCell]:
    """The planned cells (sweep expansion, with options) among ``cells``, in plan order."""
    wanted = set(cells)
    return [c for c in planned if c.cell in wanted]
