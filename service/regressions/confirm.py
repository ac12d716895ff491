"""Confirm before you accuse: a timing regression is *suspected* until both revisions are timed interleaved.

A timing finding (:data:`service.regressions.rules.TIMING_KINDS`) compares jobs that ran at different
times, so load that came and went between them can look like a change.  Detection stores such a
regression with state ``suspected`` (when the run asked for confirmation: ``run.meta["confirm_pairs"]``,
the ``AMPCI_CONFIRM_PAIRS`` setting at sweep time).  Then, before the run finishes,
:func:`service.orchestration.confirm_run.advance` creates one *confirmation run* (trigger ``confirm``, dedup key ``confirm-<run id>``)
whose jobs are the suspected cells only: each job times the cell at the finding's baseline revision
and at the run's revision interleaved on one worker (:mod:`workers.jobs.confirm`), ``confirm_pairs`` pairs
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
finishers may call :func:`~service.orchestration.confirm_run.advance` at once).

This module holds the decisions over plain data; :mod:`service.orchestration.confirm_run` drives them
(reads and writes through :mod:`service.db.confirmations` and :mod:`service.db.findings`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypedDict

from service.json_types import JsonObject, JsonValue
from service.regressions.confirm_caps import ConfirmCaps
from service.regressions.paired import improvement_verdict, paired_verdict, recovery_verdict
from service.regressions.rules import CAPPED_BY, timing_kind
from service.regressions.stored import Cell, FindingUpdate, StoredFinding
from service.regressions.thresholds import Thresholds

#: Trigger of a confirmation run.
CONFIRM_TRIGGER = "confirm"
#: Finding states owned by confirmation: awaiting it, and cleared by it.
SUSPECTED, DISMISSED = "suspected", "dismissed"
#: A timing regression a later run no longer shows, until that run's confirmation run decides.
SUSPECTED_RESOLVED = "suspected_resolved"
CONFIRMED_BY = "ampci-confirm"


class Suspected(StoredFinding, Protocol):
    """What confirmation reads of a finding it decides (a stored finding): besides what every finding has,
    its category, the state it had before a suspected recovery and its baseline revision."""

    @property
    def category(self) -> str: ...
    @property
    def state_before(self) -> str | None: ...
    @property
    def baseline_sha(self) -> str | None: ...


class ConfirmPlan(TypedDict):
    """What the confirmation job of one cell times (:func:`plan`): the other revision (``baseline``), the timing
    kinds and the pairs per kind."""

    baseline: str | None
    kinds: list[str]
    pairs: int


@dataclass(frozen=True)
class ConfirmResult:
    """A result of a confirmation run: its status and message, and its ``results.data`` (the paired timings
    under ``confirmation.kinds``, the job's ``timings``)."""

    id: int
    cell: Cell
    status: str
    message: str | None
    data: Mapping[str, JsonValue]


class AsksConfirmation(Protocol):
    """What :func:`confirmation_pairs` reads of a run: its trigger and its meta (None: none stored)."""

    @property
    def trigger(self) -> str: ...
    @property
    def meta(self) -> Mapping[str, JsonValue] | None: ...


def confirmation_pairs(run: AsksConfirmation) -> int:
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


def timed(reg: Suspected) -> str:
    """The timing kind a confirmation job times for finding ``reg`` (a drift of conversion time or latency is
    timed as that kind, its reference revision as the baseline side)."""
    return timing_kind(reg.kind, reg.metric) or reg.kind


def cell_of(reg: Suspected) -> Cell:
    """The cell of finding ``reg``."""
    return (reg.model, reg.dtype, reg.policy, reg.target)


def plan(suspected: Sequence[Suspected], chosen: Sequence[Cell], pairs: int) -> dict[Cell, ConfirmPlan]:
    """What the confirmation job of each ``chosen`` cell times: ``{"baseline": the other revision, "kinds": the
    timing kinds, "pairs": pairs}`` (a slowdown is timed against its baseline, a recovery against the revision
    that regressed)."""
    by_cell: dict[Cell, ConfirmPlan] = {}
    for reg in suspected:
        cell = cell_of(reg)
        if cell not in chosen:
            continue
        side = reg.revision_sha if reg.state == SUSPECTED_RESOLVED else reg.baseline_sha
        entry = by_cell.setdefault(cell, {"baseline": side, "kinds": [], "pairs": pairs})
        kind = timed(reg)
        if kind not in entry["kinds"]:
            entry["kinds"].append(kind)
    return by_cell


def confirmation_meta(parent_id: int, parent_meta: Mapping[str, JsonValue], by_cell: Mapping[Cell, ConfirmPlan],
                      pairs: int, caps: ConfirmCaps, capped: int, pr: tuple[str, int] | None) -> JsonObject:
    """The ``meta`` of the confirmation run of run ``parent_id``: each cell's options are the parent's for that
    cell (else its defaults) plus what its job times (:func:`plan`), and the caps that applied."""
    options: JsonObject = {}
    for cell, confirm in by_cell.items():
        key = "|".join(cell)
        base = dict(parent_meta.get("options", {}).get(key, parent_meta.get("cell_defaults", {})))
        options[key] = {**base, "confirm": confirm}
    return {"confirms": parent_id, "options": options, "cell_defaults": {}, "pairs": pairs,
            "caps": {"max_cells": caps.max_cells, "capped": capped,
                     **({"pull_request": f"{pr[0]}#{pr[1]}", "max_per_pr": caps.max_per_pr} if pr else {})},
            **({"pass_repo": parent_meta["pass_repo"]} if parent_meta.get("pass_repo") else {})}  # same repository


def unconfirmed_state(reg: Suspected) -> str:
    """The state of a suspected finding whose confirmation could not decide: a slowdown stays a regression
    (``open``: a gate never passes because the check of a slowdown broke); an improvement is ``dismissed``
    (nothing unconfirmed is shown as a gain)."""
    return DISMISSED if reg.category == "improvement" else "open"


def _not_recovered(reg: Suspected, note: str) -> FindingUpdate:
    """The values that put a suspected recovery back as it was (``state_before``, default ``open``)."""
    return {"state": reg.state_before or "open", "state_before": None, "resolved_by_result_id": None,
            "state_note": note[:2000]}


def capped_values(reg: Suspected, note: str) -> tuple[FindingUpdate, str]:
    """``(values, the state they apply in)`` marking ``reg`` as left out of confirmation by a cap (``note``:
    why): a suspected slowdown stays ``suspected`` with ``state_by`` CAPPED_BY; a suspected recovery goes back
    as it was.  The caller adds ``state_at``."""
    if reg.state == SUSPECTED_RESOLVED:
        return {**_not_recovered(reg, f"recovery not confirmed: {note}"), "state_by": CONFIRMED_BY}, SUSPECTED_RESOLVED
    return {"state_by": CAPPED_BY, "state_note": f"not confirmed: {note}"}, SUSPECTED


def unconfirmed_values(reg: Suspected, why: str) -> tuple[FindingUpdate, str]:
    """``(values, the state they apply in)`` keeping suspected ``reg`` as a regression (state ``open``; an
    improvement ``dismissed``) with ``why`` it was not confirmed; a suspected recovery goes back to the state it
    had (it is not resolved).  The caller adds ``state_at``."""
    if reg.state == SUSPECTED_RESOLVED:
        return ({**_not_recovered(reg, f"recovery not confirmed: {why}"), "state_by": CONFIRMED_BY},
                SUSPECTED_RESOLVED)
    return ({"state": unconfirmed_state(reg), "state_by": CONFIRMED_BY, "state_note": f"not confirmed: {why}"[:2000]},
            SUSPECTED)


def verdict_values(reg: Suspected, res: ConfirmResult | None, th: Thresholds) -> tuple[FindingUpdate, str]:
    """The values deciding finding ``reg`` from its cell's confirmation result ``res`` (None: no result), and
    which count it adds to: ``confirmed``/``dismissed`` (a slowdown), ``improved``/``not_improved`` (a gain),
    ``recovered``/``not_recovered`` (a recovery) or ``unconfirmed`` (nothing measured).  The caller adds
    ``state_by`` and ``state_at``."""
    data = (res.data or {}) if res is not None else {}
    kind = timed(reg)
    got = ((data.get("confirmation") or {}).get("kinds") or {}).get(kind)
    if reg.state == SUSPECTED_RESOLVED:
        if not got:
            why = (f"the confirmation job ended {res.status}: {res.message or ''}" if res is not None
                   else "no confirmation result")
            return _not_recovered(reg, f"recovery not confirmed: {why}"), "unconfirmed"
        v = recovery_verdict(kind, got.get("baseline") or [], got.get("candidate") or [], th, str(got.get("unit", "")))
        values = ({"state": "resolved", "state_before": None, "state_note": v.detail} if v.confirmed
                  else _not_recovered(reg, v.detail))
        return values, "recovered" if v.confirmed else "not_recovered"
    if not got:
        why = (f"the confirmation job ended {res.status}: {res.message or ''}" if res is not None
               else "no confirmation result")
        return {"state": unconfirmed_state(reg), "state_note": f"not confirmed: {why}"[:2000]}, "unconfirmed"
    if reg.category == "improvement":
        v = improvement_verdict(kind, got.get("baseline") or [], got.get("candidate") or [], th,
                                str(got.get("unit", "")))
        return {"state": "open" if v.confirmed else DISMISSED, "state_note": v.detail}, \
            "improved" if v.confirmed else "not_improved"
    v = paired_verdict(kind, got.get("baseline") or [], got.get("candidate") or [], th, str(got.get("unit", "")))
    return {"state": "open" if v.confirmed else DISMISSED, "state_note": v.detail}, \
        "confirmed" if v.confirmed else "dismissed"
