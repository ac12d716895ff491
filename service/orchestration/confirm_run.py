"""Driving the confirmation of a run's suspected timing findings (the decisions: :mod:`service.regressions.confirm`).

:func:`advance` is called by the run's finisher: it creates the confirmation run once (its cells within the
caps, the pull request's budget spent in the same transaction), dispatches it, and once it is final applies its
verdicts to the findings it decides.  Guarantees: a parent run is finished only after its confirmation run is
final; a finding whose confirmation could not measure or be dispatched is kept as a regression with a note
saying why; idempotent (several finishers may call :func:`advance` at once).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from service.db import budgets, confirmations, findings
from service.db.records import RegressionInfo, RunInfo, RunSpec
from service.regressions.confirm import (
    CONFIRM_TRIGGER,
    CONFIRMED_BY,
    Suspected,
    capped_values,
    cell_of,
    confirmation_meta,
    confirmation_pairs,
    dedup_key,
    plan,
    unconfirmed_values,
    verdict_values,
)
from service.regressions.confirm_caps import ConfirmCaps, pull_request, select
from service.regressions.paired import min_pairs
from service.regressions.thresholds import Thresholds
from service.vocabulary import FINAL_RUN_STATES

if TYPE_CHECKING:
    from service.db.store import Store


def _suspected(store: Store, run_id: int) -> list[RegressionInfo]:
    with store.transaction() as conn:
        return confirmations.awaiting(conn, run_id=run_id)


def _confirm_run(store: Store, run_id: int) -> confirmations.ConfirmRun | None:
    with store.transaction() as conn:
        return confirmations.confirm_run(conn, run_id=run_id)


def advance(store: Store, run_id: int, send: Callable[[int], object] | None, caps: ConfirmCaps | None = None) -> bool:
    """Drive the confirmation of run ``run_id`` one step; True while it is pending (do not finish the run).

    No suspected finding: False.  Suspected findings and no confirmation run yet: create it (suspected
    cells only, within ``caps``: default :class:`ConfirmCaps`; the cells left out are marked as capped) and
    dispatch it with ``send``, True (False when a cap left no cell to confirm); without ``send`` (a waiter
    that cannot dispatch): True when another finisher may still create it, except when the run asked for no
    confirmation (the findings are then opened as unconfirmed).  Confirmation run not final: True.  Final:
    apply its verdicts, False.
    """
    suspected = _suspected(store, run_id)
    if not suspected:
        return False
    run = store.get_run(run_id)
    pairs = confirmation_pairs(run)
    existing = _confirm_run(store, run_id)
    if existing is None:
        if pairs <= 0:
            _open_unconfirmed(store, suspected, "confirmation is off (AMPCI_CONFIRM_PAIRS=0)")
            return False
        if send is None:
            return True
        th = store.thresholds or Thresholds()
        confirm_id = _create(store, run, max(pairs, min_pairs(th.confirm_p)), caps or ConfirmCaps())
        if confirm_id is None:
            return False  # a cap left no cell to confirm: the findings say so, nothing to wait for
        try:
            send(confirm_id)
        except Exception as exc:  # noqa: BLE001 - a broker error must not leave the run waiting forever
            for job in store.jobs(confirm_id):
                store.mark_job(job.id, "error", f"cannot dispatch: {type(exc).__name__}: {exc}")
            store.finish_run(confirm_id)
            # read again: the cells a cap left out keep their own note
            _open_unconfirmed(store, _suspected(store, run_id), f"confirmation could not be dispatched: {exc}")
            return False
        return True
    if existing.status not in FINAL_RUN_STATES:
        store.finish_run(existing.id)  # derives its status from its jobs (idempotent)
        if store.get_run(existing.id).status not in FINAL_RUN_STATES:
            return True
    apply_verdicts(store, run_id, existing.id)
    return False


def _create(store: Store, run: RunInfo, pairs: int, caps: ConfirmCaps) -> int | None:
    """The confirmation run of ``run`` for its suspected cells within ``caps`` (created once; its id), the
    cells left out marked as capped; None when a cap left no cell.  One transaction: the pull request's
    budget row locked first (so concurrent runs of one pull request are granted in turn), the findings read
    under that lock, the run created, the cells it times spent from the budget."""
    pr = pull_request(run)
    with store.transaction() as conn:
        now = store.clock()
        left = None
        if pr is not None:
            left = caps.max_per_pr - budgets.lock(conn, repository=pr[0], pr_number=pr[1], now=now)
        made = confirmations.confirm_run(conn, run_id=run.id)
        if made is not None:
            return int(made.id)
        suspected = confirmations.awaiting(conn, run_id=run.id)
        chosen = select(suspected, caps, left, f"{pr[0]}#{pr[1]}" if pr is not None else "")
        for reg in suspected:
            if cell_of(reg) in chosen.capped:
                values, when = capped_values(reg, chosen.capped[cell_of(reg)])
                findings.set_finding(conn, finding_id=reg.id, values={**values, "state_at": now}, when_state=when)
        if not chosen.chosen:
            return None
        by_cell = plan(suspected, chosen.chosen, pairs)
        meta = confirmation_meta(run.id, run.meta or {}, by_cell, pairs, caps, len(chosen.capped), pr)
        (new,) = store.create_runs([RunSpec(run.revision_sha, CONFIRM_TRIGGER, run.baseline_sha, run.sweep,
                                            tuple(sorted(by_cell)), dedup_key(run.id), meta)], conn=conn)
        if new.created and pr is not None:
            budgets.spend(conn, repository=pr[0], pr_number=pr[1], cells=len(by_cell), now=now)
        return int(new.run_id)


def _open_unconfirmed(store: Store, suspected: Sequence[Suspected], why: str) -> None:
    """Keep ``suspected`` findings as regressions (state ``open``), saying why they were not confirmed; a
    suspected recovery goes back to the state it had (it is not resolved)."""
    with store.transaction() as conn:
        for reg in suspected:
            values, when = unconfirmed_values(reg, why)
            findings.set_finding(conn, finding_id=reg.id, values={**values, "state_at": store.clock()},
                                 when_state=when)


def apply_verdicts(store: Store, run_id: int, confirm_run_id: int) -> dict[str, int]:
    """Decide every suspected finding of ``run_id`` (and every recovery its results suspect) from the results
    of ``confirm_run_id`` (:func:`service.regressions.confirm.verdict_values`); returns counts ``{"confirmed",
    "dismissed", "unconfirmed", "recovered", "not_recovered", "improved", "not_improved"}``."""
    th = store.thresholds or Thresholds()
    counts = {"confirmed": 0, "dismissed": 0, "unconfirmed": 0, "recovered": 0, "not_recovered": 0, "improved": 0,
              "not_improved": 0}
    with store.transaction() as conn:
        results = confirmations.confirm_results(conn, confirm_run_id=confirm_run_id)
        for reg in confirmations.awaiting(conn, run_id=run_id):
            values, counted = verdict_values(reg, results.get(cell_of(reg)), th)
            counts[counted] += 1
            findings.set_finding(conn, finding_id=reg.id,
                                 values={"state_by": CONFIRMED_BY, "state_at": store.clock(), **values})
    return counts


def confirmation_cost(store: Store, run_id: int) -> dict[str, float]:
    """``{"runs": 0|1, "cells": n, "job_seconds": s}`` of run ``run_id``'s confirmation (the total time
    its jobs measured)."""
    existing = _confirm_run(store, run_id)
    if existing is None:
        return {"runs": 0, "cells": 0, "job_seconds": 0.0}
    with store.transaction() as conn:
        results = confirmations.confirm_results(conn, confirm_run_id=existing.id)
    seconds = sum(float((r.data.get("timings") or {}).get("total_s") or 0.0) for r in results.values())
    return {"runs": 1, "cells": len(results), "job_seconds": round(seconds, 3)}


def confirmed_run(store: Store, run_id: int) -> int | None:
    """The run that confirmation run ``run_id`` confirms (None when ``run_id`` is no confirmation run)."""
    with store.transaction() as conn:
        return confirmations.confirmed_run(conn, run_id=run_id)
