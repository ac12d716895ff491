"""The verdict of one run, in every text people read: decided once, by :func:`decide_run`.

:func:`decide_run` is the one place a run's verdict is decided: pure, over plain data (:class:`RunFacts`), it
gives the :class:`RunVerdict` whose ``state`` is the commit status state (and the check run's conclusion), whose
``exit_code`` is the exit code of ``ampci sweep`` and ``ampci regressions --run``, and whose
:meth:`~RunVerdict.headline` and :meth:`~RunVerdict.description` are what the run page, the API, the CLI, the
pull-request comment and the commit status say.  The cells' gate (:func:`service.regressions.gate.decide`:
regressions, cells that could not measure, known failures) is one of its inputs.  :func:`verdict_of` gathers the
facts of a run from its results, jobs, baselines and findings (:func:`service.orchestration.judge.run_verdict`
reads them from the store); :func:`summary_facts` from a run's counts alone (a reporter without a store).

Guarantees: the state and the exit code agree (``success`` exactly when the exit code is 0 and the run is not
pending; ``error`` and ``failure`` always exit 1, and the headline then says "gate fails", never "passes"); a
run that failed or was cancelled, a job that ended ``error`` or ``crashed``, or a cell whose result is not the
pass's (:data:`workers.result.NOT_OF_THE_PASS`: ampci's own failure ``error``, a cell ``unmeasured`` where it ran,
a poison job) is ``error`` (neither green nor red; its reason says a re-run is the remedy); a run in which no cell
was measured is never ``success`` (:mod:`service.regressions.gate`); a cell that could not measure is said
**first**, with the count by status; cells failing as at the baseline are said as failing cells ("2 cells fail to
convert, as at the baseline"), never as passes; a cell without a baseline result is "not compared", and
"no regressions" is only ever said of cells that were compared; a suspected timing finding that a confirmation
cap left out is said as "N not confirmed (cap) (kind)": it does not fail the gate, and "no regressions" is then
not said.  Only a confirmed (open or acknowledged) improvement is said as one ("1 improvement (latency)"); a
suspected, dismissed or capped one is said as such ("1 suspected improvement (conversion_time)", "1 dismissed
improvement (…)", "1 improvement not confirmed (cap) (…)"), and an accuracy gain a coverage loss explains as
"1 improvement explained by a coverage loss (accuracy)".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from service.json_types import JsonObject
from service.regressions.findings import (
    CAPPED_BY,
    CAPPED_GAIN_LABEL,
    CAPPED_LABEL,
    CONFIRMATION_STATES,
    EXPLAINED,
)
from service.regressions.gate import JOB_ERROR, Cell, CellOutcome, GateDecision, decide, not_measured_line
from service.regressions.listing import plural, since_text
from workers.result import INFRA_ERROR, NOT_OF_THE_PASS, UNMEASURED

#: Unmeasured statuses that say the run could not be carried out (a bad spec, a worker that died, a job
#: without any result, ampci's own failure, a cell that could not run where it was sent) rather than that the
#: pass failed: the commit status is ``error`` for them (neither green nor red: a re-run is the remedy).
INFRA_STATUSES = frozenset({"bad_spec", JOB_ERROR, *NOT_OF_THE_PASS})
#: What the verdict says of a run with ampci's failures: what to do about them.
RERUN = "not the pass's failure: re-run once it is fixed"
#: GitHub's limit on a commit status description.
DESCRIPTION_MAX = 140


def _by_status(pairs: tuple[tuple[Cell, str], ...]) -> str:
    counts = Counter(s for _, s in pairs)
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))


#: Run statuses that end a run without a verdict on the pass: the commit status is ``error``.
FAILED_RUN_STATES = frozenset({"failed", "cancelled"})
#: Job statuses of a job that ended without the pass being judged (a worker or infrastructure failure).
ERRORED_JOB_STATES = frozenset({"error", "crashed"})


@dataclass(frozen=True)
class RunFacts:
    """What a run's verdict is decided from, as plain data: the run's status, its cells, jobs still queued or
    running, the outcome of each cell (results, and jobs that ended without one), the cells with a baseline
    result, its open/acknowledged regressions by kind, its other findings (category, state or label -> kind ->
    count), the unfinished runs it waits for, and the jobs that ended ``error``/``crashed`` although a result
    was stored (the others are outcomes)."""

    run_id: int
    run_status: str
    cells: int
    pending: int = 0
    outcomes: tuple[CellOutcome, ...] = ()
    with_baseline: frozenset[Cell] = frozenset()
    regressions: Mapping[str, int] = field(default_factory=dict)
    others: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    waiting_for: tuple[int, ...] = ()
    errored_jobs: int = 0


def decide_run(facts: RunFacts) -> RunVerdict:
    """The run's verdict: the one decider of its state, exit code and headline (see the module docstring).

    State, first match wins: ``pending`` while jobs run or the run waits for its baseline's cells; ``error``
    when the run failed or was cancelled, a job ended ``error``/``crashed``, or a cell could not measure for a
    reason that is not the pass (:data:`INFRA_STATUSES`); ``failure`` for a regression or any other cell that
    could not measure; ``success`` otherwise.  The exit code is 1 whenever a reason fails the gate (every
    ``error`` and ``failure`` has one), else 0."""
    gate = decide(facts.outcomes, facts.with_baseline, sum(facts.regressions.values()))
    reasons = list(gate.reasons)
    failed_run = facts.run_status in FAILED_RUN_STATES
    if failed_run:
        reasons.append(f"the run {facts.run_status}")
    if facts.errored_jobs:
        reasons.append(f"{plural(facts.errored_jobs, 'job')} ended in error")
    infra = [o for o in facts.outcomes if o.status == INFRA_ERROR]
    if infra:
        reasons.append(f"{plural(len(infra), 'cell')} failed by ampci ({infra[0].message[:160]}): {RERUN}")
    if facts.pending or facts.waiting_for:
        state = "pending"
    elif failed_run or facts.errored_jobs or any(s in INFRA_STATUSES for _, s in gate.unmeasured):
        state = "error"
    elif reasons:
        state = "failure"
    else:
        state = "success"
    decision = replace(gate, exit_code=1 if reasons else 0, reasons=tuple(reasons))
    return RunVerdict(facts, decision, state)


class RunCounts(Protocol):
    """What :func:`summary_facts` reads of a run's counts (a :class:`~service.db.records.RunSummary`)."""

    @property
    def run_id(self) -> int: ...
    @property
    def status(self) -> str: ...
    @property
    def cells(self) -> int: ...
    @property
    def job_status(self) -> Mapping[str, int]: ...
    @property
    def regressions(self) -> Mapping[str, int]: ...


class JudgedResult(Protocol):
    """What :func:`verdict_of` reads of a stored result of the run (a :class:`~service.db.records.ResultRow`)."""

    @property
    def cell(self) -> Cell: ...
    @property
    def status(self) -> str: ...
    @property
    def message(self) -> str | None: ...


class JudgedJob(Protocol):
    """What :func:`verdict_of` reads of a job of the run (a :class:`~service.db.records.JobInfo`)."""

    @property
    def cell(self) -> Cell: ...
    @property
    def status(self) -> str: ...
    @property
    def error(self) -> str | None: ...


class JudgedFinding(Protocol):
    """What :func:`verdict_of` reads of a stored finding of the run (a
    :class:`~service.db.records.RegressionInfo`)."""

    @property
    def kind(self) -> str: ...
    @property
    def category(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def state_by(self) -> str | None: ...


def summary_facts(summary: RunCounts) -> RunFacts:
    """The facts a run's counts alone give (a :class:`~service.db.records.RunSummary`; no cell outcomes): for a
    reporter without a store."""
    jobs = summary.job_status
    return RunFacts(summary.run_id, summary.status, summary.cells,
                    pending=sum(jobs.get(s, 0) for s in ("queued", "running")),
                    regressions=dict(summary.regressions),
                    errored_jobs=sum(jobs.get(s, 0) for s in ERRORED_JOB_STATES))


@dataclass(frozen=True)
class RunVerdict:
    """A run's verdict as :func:`decide_run` decided it (``state``, ``decision`` with the final exit code and
    reasons), with what the run page, the CLI, the API and the commit status say about it.  Build it with
    :func:`decide_run` only: it renders, it decides nothing."""

    facts: RunFacts
    decision: GateDecision
    state: str
    #: regressions of this run that later runs resolved, and those runs: shown beside the verdict, which
    #: stays what it was decided (:meth:`since`); never an input of it
    resolved: int = 0
    resolved_by: tuple[int, ...] = ()

    def since(self) -> str:
        """What happened to the run's regressions after it was judged (:func:`since_text`)."""
        return since_text(self.resolved, sum(self.regressions.values()), self.resolved_by)

    @property
    def run_id(self) -> int:
        """The run."""
        return self.facts.run_id

    @property
    def run_status(self) -> str:
        """The run's status."""
        return self.facts.run_status

    @property
    def cells(self) -> int:
        """The run's cells."""
        return self.facts.cells

    @property
    def pending(self) -> int:
        """Jobs still queued or running."""
        return self.facts.pending

    @property
    def regressions(self) -> Mapping[str, int]:
        """Open/acknowledged regressions by kind."""
        return self.facts.regressions

    @property
    def waiting_for(self) -> tuple[int, ...]:
        """Unfinished runs this run waits for before it is judged (its baseline's missing cells)."""
        return self.facts.waiting_for

    @property
    def others(self) -> Mapping[str, Mapping[str, int]]:
        """Open/acknowledged findings of every other category (improvement, flaky, …), timing findings being
        confirmed or dismissed, and suspected ones a confirmation cap left out
        (:data:`~service.regressions.findings.CAPPED_LABEL`): category, state or that label -> kind -> count."""
        return self.facts.others

    @property
    def exit_code(self) -> int:
        """The gate's exit code (0 pass, 1 fail), as decided."""
        return self.decision.exit_code

    def parts(self) -> list[str]:
        """The verdict as short phrases, most important first (see the module docstring)."""
        d = self.decision
        out: list[str] = []
        if self.run_status in FAILED_RUN_STATES:
            out.append(f"run {self.run_status}")
        if self.facts.errored_jobs:
            out.append(f"{plural(self.facts.errored_jobs, 'job')} ended in error")
        if d.unmeasured:
            out.append(f"{len(d.unmeasured)} of {self.cells} cells could not measure ({_by_status(d.unmeasured)})")
        infra = [o for o in self.facts.outcomes if o.status == INFRA_ERROR]
        if infra:
            out.append(f"{plural(len(infra), 'cell')} failed by ampci, {RERUN} ({infra[0].message[:100]})")
        skipped = Counter(o.cell[3] for o in self.facts.outcomes if o.status == UNMEASURED)
        out += [not_measured_line(target, n) for target, n in sorted(skipped.items())]
        if d.exit_code and not d.measured and self.facts.outcomes:
            out.append(f"nothing measured: none of the {len(self.facts.outcomes)} cells converted")
        for kind, n in sorted(self.regressions.items()):
            out.append(f"{n} {kind} regression{'s' if n != 1 else ''}")
        if d.known_failures:
            out.append(as_at_baseline(d.known_failures))
        for category, kinds in sorted(self.others.items()):
            out.append(f"{sum(kinds.values())} {category} ({', '.join(sorted(kinds))})")
        if self.pending:
            out.append(f"{self.pending} pending")
        if self.waiting_for:
            runs = ", ".join(f"#{i}" for i in self.waiting_for)
            out.append(f"waiting for the baseline's missing cells (run {runs}) before judging")
        if d.not_compared:
            out.append(f"{len(d.not_compared)} of {self.cells} cells not compared (no baseline result)")
        if not d.exit_code and d.compared and not self.regressions and CAPPED_LABEL not in self.others:
            out.append(f"no regressions in {d.compared} compared cell{'s' if d.compared != 1 else ''}")
        if not out:
            out.append("no results: nothing compared")
        return out

    def headline(self) -> str:
        """One line for the run page and the CLI, e.g. ``gate fails: 6 of 6 cells could not measure
        (6 bad_spec); 6 of 6 cells not compared (no baseline result)``."""
        lead = "pending" if self.state == "pending" else ("gate fails" if self.exit_code else "gate passes")
        since = self.since()
        return f"{lead}: " + "; ".join(self.parts()) + (f" — {since}" if since else "")

    def description(self, summary_line: str = "") -> str:
        """The commit status description (at most :data:`DESCRIPTION_MAX` characters): the verdict's
        phrases first, then ``summary_line`` (the run's counts) as room allows."""
        text = "; ".join(self.parts())
        if self.since():
            text += f" — {self.since()}"
        if summary_line and len(text) + 3 + len(summary_line) <= DESCRIPTION_MAX:
            text += " · " + summary_line
        return text if len(text) <= DESCRIPTION_MAX else text[:DESCRIPTION_MAX - 1] + "…"

    def brief(self) -> JsonObject:
        """What a list of runs shows of the verdict (stored in ``runs.verdict``): the commit status state, the
        exit code, the headline and the counts behind it."""
        d = self.decision
        return {"state": self.state, "exit_code": self.exit_code, "headline": self.headline(),
                "regressions": sum(self.regressions.values()), "unmeasured": len(d.unmeasured),
                "known_failures": len(d.known_failures), "not_compared": len(d.not_compared),
                "compared": d.compared, "cells": self.cells, "pending": self.pending,
                "improvements": sum(self.others.get("improvement", {}).values()),
                "flaky": sum(self.others.get("flaky", {}).values())}

    def to_dict(self) -> JsonObject:
        """JSON-ready form."""
        return {"run_id": self.run_id, "state": self.state, "headline": self.headline(),
                "gate": self.decision.to_dict(), "regressions": dict(self.regressions),
                "others": {c: dict(k) for c, k in self.others.items()}, "cells": self.cells,
                "pending": self.pending, "exit_code": self.exit_code,
                "resolved_since": ({"regressions": self.resolved, "runs": list(self.resolved_by)}
                                   if self.resolved else None)}


def as_at_baseline(known: Sequence[tuple[Cell, str]]) -> str:
    """How every view says cells that fail as they did at the baseline: failing cells, never passes, e.g.
    ``2 cells fail to convert, as at the baseline`` or ``1 cell fails as at the baseline (1 fail_accuracy)``."""
    n = len(known)
    cells = f"{plural(n, 'cell')} fail{'s' if n == 1 else ''}"
    if all(s == "convert_error" for _, s in known):
        return f"{cells} to convert, as at the baseline"
    return f"{cells} as at the baseline ({_by_status(tuple(known))})"


def _label(g: JudgedFinding) -> str:
    """The verdict's phrase for a finding that is under or after confirmation, or explained: never a gain."""
    capped = g.state == "suspected" and g.state_by == CAPPED_BY
    if g.category == "improvement":
        if g.state == EXPLAINED:
            return "improvement explained by a coverage loss"
        return CAPPED_GAIN_LABEL if capped else f"{g.state.replace('_', ' ')} improvement"
    return CAPPED_LABEL if capped else g.state


#: States a regression of a run reaches only through a later run (resolved, or being confirmed resolved): it
#: counts as the regression it was when the run was judged.
LATER_STATES = frozenset({"resolved", "suspected_resolved"})


def verdict_of(run_id: int, run_status: str, revision_sha: str, results: Sequence[JudgedResult],
               jobs: Sequence[JudgedJob], base: Mapping[Cell, tuple[str, str]], found: Sequence[JudgedFinding],
               waiting: tuple[int, ...]) -> RunVerdict:
    """The verdict of run ``run_id`` (see the module docstring) from its ``results`` (``cell``, ``status``,
    ``message``), its ``jobs`` (``cell``, ``status``, ``error``), each cell's baseline ``(revision, status)``
    (``base``), its stored findings (``found``: ``kind``, ``category``, ``state``, ``state_by``) and the runs it
    still ``waiting`` for.  Pure: :func:`service.orchestration.judge.run_verdict` reads these from the store."""
    outcomes = [CellOutcome(r.cell, r.status, r.message or "", base[r.cell][1] if r.cell in base else None,
                            revision_sha) for r in results]
    with_result = {r.cell for r in results}
    outcomes += [CellOutcome(j.cell, JOB_ERROR if j.status == "error" else "crashed", j.error or "")
                 for j in jobs if j.status in ("error", "crashed") and j.cell not in with_result]
    # a regression a later run resolved counts as what it was when this run was judged (the resolution is
    # shown beside the verdict: RunVerdict.since), so a verdict decided on a later read says the same
    live = [g for g in found if g.state in ("open", "acknowledged") or (g.state in LATER_STATES
                                                                       and g.category == "regression")]
    counted = {id(g) for g in live}
    regs = [g for g in live if g.category == "regression"]
    by_kind = Counter(g.kind for g in regs)
    others: dict[str, Counter[str]] = {}
    for g in live:
        if g.category != "regression":
            others.setdefault(g.category, Counter())[g.kind] += 1
    for g in found:  # timing findings being confirmed, dismissed by it or left out by a cap: shown, never failing
        if (g.state in CONFIRMATION_STATES or g.state == EXPLAINED) and id(g) not in counted:
            others.setdefault(_label(g), Counter())[g.kind] += 1
    pending = sum(j.status in ("queued", "running") for j in jobs)
    errored = sum(j.status in ERRORED_JOB_STATES and j.cell in with_result for j in jobs)
    return decide_run(RunFacts(run_id, run_status, max(len(jobs), len(results)), pending, tuple(outcomes),
                               frozenset(base), dict(by_kind), {c: dict(k) for c, k in others.items()}, waiting,
                               errored))
