"""Confirm before you accuse: a timing regression is *suspected* until both revisions are timed interleaved.

A timing finding (:data:`service.regressions.rules.TIMING_KINDS`) compares jobs that ran at different
times, so load that came and went between them can look like a change.  Detection stores such a
regression with state ``suspected`` (when the run asked for confirmation: ``run.meta["confirm_pairs"]``,
the ``AMPCI_CONFIRM_PAIRS`` setting at sweep time).  Then, before the run finishes,
:func:`advance` creates one *confirmation run* (trigger ``confirm``, dedup key ``confirm-<run id>``)
whose jobs are the suspected cells only: each job times the cell at the finding's baseline revision
and at the run's revision interleaved on one worker (:mod:`workers.confirm`), ``confirm_pairs`` pairs
per suspected kind (raised to :func:`min_pairs` of ``confirm_p``, 7 for 0.01).  When that run is over, :func:`paired_verdict` decides each finding from the
per-pair ratios: ``open`` (confirmed: it fails the gate and reaches the commit status) or
``dismissed`` (kept, visible, with the paired figures in ``state_note``; never deleted).

**Recoveries are confirmed too.**  A later run that no longer shows an open (or acknowledged) timing
regression does not resolve it by itself: detection marks it ``suspected_resolved`` (its former state kept
in ``state_before``, the run's result in ``resolved_by_result_id``) and this run's confirmation run times
the cell at the finding's **regressed revision** against the run's revision, interleaved.  Only a confirmed
recovery (:func:`recovery_verdict`: the new revision is faster than the regressed one beyond the kind's
ratio limit and floor, one-sided Wilcoxon p < ``confirm_p``) resolves it; otherwise it goes back to the state
it had, with the paired figures in ``state_note``.  Why the regressed revision and not the original
baseline: recovery is a claim that the slowdown is gone, and the test must put the burden of proof on that
claim.  Timing baseline vs new and resolving when no slowdown is confirmed would resolve on *absence* of
evidence, which is exactly what a noisy or short measurement produces; timing regressed vs new asks for
positive evidence that the new revision is faster than the one known to be slow, which noise does not give
(interleaved pairs cancel drift), while the detection that suspected the recovery already found the new
revision level with the baseline.  A recovery that is real but smaller than the rule's margin stays open
(a human can resolve it), the safe direction for a gate.

**Gains are confirmed too.**  A timing *improvement* of a run that asks for confirmation is stored
``suspected`` as a slowdown is, and the same confirmation job times its baseline and the run's revision
interleaved; :func:`improvement_verdict` (the mirror of :func:`paired_verdict`: faster beyond the inverse of the
kind's ratio limit and its floor, one-sided Wilcoxon p < ``confirm_p``) opens it (``open``: a gain every
surface shows) or dismisses it (``dismissed``, with the paired figures).  An improvement whose confirmation
could not measure, was turned off after detection or could not be dispatched is ``dismissed`` with a "not
confirmed: …" note (never shown as a gain); one a cap left out stays ``suspected`` (``state_by``
:data:`~service.regressions.rules.CAPPED_BY`), which no surface counts as a gain either.

**Bounded.**  A run's confirmation times at most ``AMPCI_CONFIRM_MAX_CELLS`` cells, and the runs of one pull
request at most ``AMPCI_CONFIRM_MAX_PER_PR`` cells in all (:mod:`service.regressions.confirm_caps`: which
cells, and the rule for the others: a suspected slowdown left out stays ``suspected`` with ``state_by``
:data:`~service.regressions.rules.CAPPED_BY` and a "not confirmed: confirmation cap …" note, never failing the
gate and never counted as a pass; a suspected recovery left out goes back to the state it had).  The cells
granted, the pull request's budget spent and the confirmation run are written in one transaction.

Guarantees: only suspected cells are re-measured, with at most ``confirm_pairs`` pairs per kind; a
parent run is finished only after its confirmation run is final, so whoever waits for the run (the
CLI gate, the commit status) sees confirmed verdicts only; a finding whose confirmation could not
measure (the job failed, no dispatcher) is kept as a regression (``open``) with a note saying why (a
gate never passes because the check of a slowdown broke); everything is idempotent (several
finishers may call :func:`advance` at once).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa

from service.db import budgets
from service.db import models as m
from service.db.records import RunSpec
from service.regressions.confirm_caps import ConfirmCaps, pull_request, select
from service.regressions.paired import improvement_verdict, min_pairs, paired_verdict, recovery_verdict
from service.regressions.rules import CAPPED_BY, timing_kind
from service.regressions.thresholds import Thresholds
from service.vocabulary import FINAL_RUN_STATES

#: Trigger of a confirmation run.
CONFIRM_TRIGGER = "confirm"
#: Finding states owned by confirmation: awaiting it, and cleared by it.
SUSPECTED, DISMISSED = "suspected", "dismissed"
#: A timing regression a later run no longer shows, until that run's confirmation run decides.
SUSPECTED_RESOLVED = "suspected_resolved"
CONFIRMED_BY = "ampci-confirm"

t_run, t_res, t_reg = m.Run.__table__, m.Result.__table__, m.Regression.__table__


def confirmation_pairs(run: Any) -> int:
    """How many interleaved pairs the run asked for (``run.meta["confirm_pairs"]``; 0: no confirmation).
    A confirmation run itself is never confirmed."""
    if getattr(run, "trigger", None) == CONFIRM_TRIGGER:
        return 0
    meta = getattr(run, "meta", None) or {}
    try:
        return max(0, int(meta.get("confirm_pairs") or 0))
    except (TypeError, ValueError):
        return 0


def dedup_key(run_id: int) -> str:
    """The dedup key of run ``run_id``'s confirmation run."""
    return f"confirm-{run_id}"


def _awaiting(run_id: int) -> sa.ColumnElement[bool]:
    """The findings run ``run_id``'s confirmation decides: its own suspected ones (but those a cap left out),
    and the earlier timing regressions whose recovery one of its results suspects."""
    not_capped = sa.or_(t_reg.c.state_by.is_(None), t_reg.c.state_by != CAPPED_BY)
    return sa.or_(sa.and_(t_reg.c.run_id == run_id, t_reg.c.state == SUSPECTED, not_capped),
                  sa.and_(t_reg.c.state == SUSPECTED_RESOLVED, t_reg.c.resolved_by_result_id.in_(
                      sa.select(t_res.c.id).where(t_res.c.run_id == run_id))))


def _suspected(store: Any, run_id: int) -> list[Any]:
    with store.transaction() as conn:
        return list(conn.execute(sa.select(t_reg).where(_awaiting(run_id)).order_by(t_reg.c.id)))


def _confirm_run(store: Any, run_id: int) -> Any:
    with store.transaction() as conn:
        return conn.execute(sa.select(t_run.c.id, t_run.c.status).where(
            t_run.c.dedup_key == dedup_key(run_id), t_run.c.trigger == CONFIRM_TRIGGER)).first()


def advance(store: Any, run_id: int, send: Callable[[int], object] | None, caps: ConfirmCaps | None = None) -> bool:
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


def _create(store: Any, run: Any, pairs: int, caps: ConfirmCaps) -> int | None:
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
        made = conn.execute(sa.select(t_run.c.id).where(t_run.c.dedup_key == dedup_key(run.id),
                                                        t_run.c.trigger == CONFIRM_TRIGGER)).scalar()
        if made is not None:
            return int(made)
        suspected = list(conn.execute(sa.select(t_reg).where(_awaiting(run.id)).order_by(t_reg.c.id)))
        chosen = select(suspected, caps, left, f"{pr[0]}#{pr[1]}" if pr is not None else "")
        _mark_capped(conn, [r for r in suspected if _cell(r) in chosen.capped], chosen.capped, now)
        if not chosen.chosen:
            return None
        by_cell: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        for reg in suspected:
            cell = _cell(reg)
            if cell not in chosen.chosen:
                continue
            # a slowdown is timed against its baseline; a recovery against the revision that regressed
            side = reg.revision_sha if reg.state == SUSPECTED_RESOLVED else reg.baseline_sha
            entry = by_cell.setdefault(cell, {"baseline": side, "kinds": [], "pairs": pairs})
            kind = _timed(reg)
            if kind not in entry["kinds"]:
                entry["kinds"].append(kind)
        parent_meta = run.meta or {}
        options = {}
        for cell, confirm in by_cell.items():
            key = "|".join(cell)
            base = dict(parent_meta.get("options", {}).get(key, parent_meta.get("cell_defaults", {})))
            options[key] = {**base, "confirm": confirm}
        meta = {"confirms": run.id, "options": options, "cell_defaults": {}, "pairs": pairs,
                "caps": {"max_cells": caps.max_cells, "capped": len(chosen.capped),
                         **({"pull_request": f"{pr[0]}#{pr[1]}", "max_per_pr": caps.max_per_pr} if pr else {})},
                **({"pass_repo": parent_meta["pass_repo"]} if parent_meta.get("pass_repo") else {})}  # same repository
        (new,) = store.create_runs([RunSpec(run.revision_sha, CONFIRM_TRIGGER, run.baseline_sha, run.sweep,
                                            tuple(sorted(by_cell)), dedup_key(run.id), meta)], conn=conn)
        if new.created and pr is not None:
            budgets.spend(conn, repository=pr[0], pr_number=pr[1], cells=len(by_cell), now=now)
        return int(new.run_id)


def _timed(reg: Any) -> str:
    """The timing kind a confirmation job times for finding ``reg`` (a drift of conversion time or latency is
    timed as that kind, its reference revision as the baseline side)."""
    return timing_kind(reg.kind, reg.metric) or reg.kind


def _cell(reg: Any) -> tuple[str, str, str, str]:
    return (reg.model, reg.dtype, reg.policy, reg.target)


def _mark_capped(conn: Any, findings: Sequence[Any], why: dict[tuple[str, str, str, str], str], now: Any) -> None:
    """Mark ``findings`` as left out of confirmation by a cap (reason per cell in ``why``): a suspected
    slowdown stays ``suspected`` with ``state_by`` CAPPED_BY; a suspected recovery goes back as it was."""
    for reg in findings:
        note = why[_cell(reg)]
        if reg.state == SUSPECTED_RESOLVED:
            conn.execute(t_reg.update().where(t_reg.c.id == reg.id, t_reg.c.state == SUSPECTED_RESOLVED).values(
                **_not_recovered(reg, f"recovery not confirmed: {note}"), state_by=CONFIRMED_BY, state_at=now))
            continue
        conn.execute(t_reg.update().where(t_reg.c.id == reg.id, t_reg.c.state == SUSPECTED).values(
            state_by=CAPPED_BY, state_at=now, state_note=f"not confirmed: {note}"))


def _open_unconfirmed(store: Any, suspected: Sequence[Any], why: str) -> None:
    """Keep ``suspected`` findings as regressions (state ``open``), saying why they were not confirmed; a
    suspected recovery goes back to the state it had (it is not resolved)."""
    with store.transaction() as conn:
        for reg in suspected:
            if reg.state == SUSPECTED_RESOLVED:
                conn.execute(t_reg.update().where(t_reg.c.id == reg.id, t_reg.c.state == SUSPECTED_RESOLVED)
                             .values(**_not_recovered(reg, f"recovery not confirmed: {why}"), state_by=CONFIRMED_BY,
                                     state_at=store.clock()))
                continue
            conn.execute(t_reg.update().where(t_reg.c.id == reg.id, t_reg.c.state == SUSPECTED).values(
                state=unconfirmed_state(reg), state_by=CONFIRMED_BY, state_at=store.clock(),
                state_note=f"not confirmed: {why}"[:2000]))


def unconfirmed_state(reg: Any) -> str:
    """The state of a suspected finding whose confirmation could not decide: a slowdown stays a regression
    (``open``: a gate never passes because the check of a slowdown broke); an improvement is ``dismissed``
    (nothing unconfirmed is shown as a gain)."""
    return DISMISSED if reg.category == "improvement" else "open"


def _not_recovered(reg: Any, note: str) -> dict[str, Any]:
    """The values that put a suspected recovery back as it was (``state_before``, default ``open``)."""
    return {"state": reg.state_before or "open", "state_before": None, "resolved_by_result_id": None,
            "state_note": note[:2000]}


def _confirm_results(conn: Any, confirm_run_id: int) -> dict[tuple[str, str, str, str], Any]:
    rows = conn.execute(sa.select(t_res.c.id, t_res.c.model, t_res.c.dtype, t_res.c.policy, t_res.c.target,
                                  t_res.c.status, t_res.c.message, t_res.c.data)
                        .where(t_res.c.run_id == confirm_run_id).order_by(t_res.c.id))
    return {(r.model, r.dtype, r.policy, r.target): r for r in rows}


def apply_verdicts(store: Any, run_id: int, confirm_run_id: int) -> dict[str, int]:
    """Decide every suspected finding of ``run_id`` (and every recovery its results suspect) from the results
    of ``confirm_run_id`` (see module doc); returns counts ``{"confirmed", "dismissed", "unconfirmed",
    "recovered", "not_recovered", "improved", "not_improved"}``."""
    th = store.thresholds or Thresholds()
    counts = {"confirmed": 0, "dismissed": 0, "unconfirmed": 0, "recovered": 0, "not_recovered": 0, "improved": 0,
              "not_improved": 0}
    with store.transaction() as conn:
        results = _confirm_results(conn, confirm_run_id)
        for reg in conn.execute(sa.select(t_reg).where(_awaiting(run_id))):
            res = results.get((reg.model, reg.dtype, reg.policy, reg.target))
            data = (res.data or {}) if res is not None else {}
            kind = _timed(reg)
            got = ((data.get("confirmation") or {}).get("kinds") or {}).get(kind)
            if reg.state == SUSPECTED_RESOLVED:
                if not got:
                    why = (f"the confirmation job ended {res.status}: {res.message or ''}" if res is not None
                           else "no confirmation result")
                    values = _not_recovered(reg, f"recovery not confirmed: {why}")
                    counts["unconfirmed"] += 1
                else:
                    v = recovery_verdict(kind, got.get("baseline") or [], got.get("candidate") or [], th,
                                         str(got.get("unit", "")))
                    values = ({"state": "resolved", "state_before": None, "state_note": v.detail} if v.confirmed
                              else _not_recovered(reg, v.detail))
                    counts["recovered" if v.confirmed else "not_recovered"] += 1
                conn.execute(t_reg.update().where(t_reg.c.id == reg.id).values(
                    state_by=CONFIRMED_BY, state_at=store.clock(), **values))
                continue
            if not got:
                why = (f"the confirmation job ended {res.status}: {res.message or ''}" if res is not None
                       else "no confirmation result")
                values = {"state": unconfirmed_state(reg), "state_note": f"not confirmed: {why}"[:2000]}
                counts["unconfirmed"] += 1
            elif reg.category == "improvement":
                v = improvement_verdict(kind, got.get("baseline") or [], got.get("candidate") or [], th,
                                        str(got.get("unit", "")))
                values = {"state": "open" if v.confirmed else DISMISSED, "state_note": v.detail}
                counts["improved" if v.confirmed else "not_improved"] += 1
            else:
                v = paired_verdict(kind, got.get("baseline") or [], got.get("candidate") or [], th,
                                   str(got.get("unit", "")))
                values = {"state": "open" if v.confirmed else DISMISSED, "state_note": v.detail}
                counts["confirmed" if v.confirmed else "dismissed"] += 1
            conn.execute(t_reg.update().where(t_reg.c.id == reg.id).values(
                state_by=CONFIRMED_BY, state_at=store.clock(), **values))
    return counts


def confirmation_cost(store: Any, run_id: int) -> dict[str, float]:
    """``{"runs": 0|1, "cells": n, "job_seconds": s}`` of run ``run_id``'s confirmation (the total time
    its jobs measured)."""
    existing = _confirm_run(store, run_id)
    if existing is None:
        return {"runs": 0, "cells": 0, "job_seconds": 0.0}
    with store.transaction() as conn:
        results = _confirm_results(conn, existing.id)
    seconds = sum(float(((r.data or {}).get("timings") or {}).get("total_s") or 0.0) for r in results.values())
    return {"runs": 1, "cells": len(results), "job_seconds": round(seconds, 3)}




def confirmed_run(store: Any, run_id: int) -> int | None:
    """The run that confirmation run ``run_id`` confirms (None when ``run_id`` is no confirmation run)."""
    with store.transaction() as conn:
        row = conn.execute(sa.select(t_run.c.trigger, t_run.c.meta).where(t_run.c.id == run_id)).first()
    if row is None or row.trigger != CONFIRM_TRIGGER:
        return None
    parent = (row.meta or {}).get("confirms")
    return int(parent) if isinstance(parent, int) else None
