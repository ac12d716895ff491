"""The regression rules applied to one run, over plain data: which findings a run has, how each is stored,
which earlier regressions it resolves.  :mod:`service.orchestration.judge` loads the data from the store
(:mod:`service.db.series`), calls these functions and writes what they decide (:mod:`service.db.findings`).

Baselines (per cell):

- ``push``/``manual`` without a baseline: the newest result of the cell at the nearest ancestor
  of the run's revision that has one (parent links from ``revision_parents``, depth-bounded);
- any run with ``baseline_sha`` (``pull_request`` merge base, ``bisect``): the same walk starting
  *at* the baseline revision;
- ``nightly``: the newest earlier result on the revision or its ancestors (the main-branch
  history); latency uses the change-point test over the nightly series instead of a pairwise test,
  and needs ``nightly_consecutive`` violating nights before it opens a regression.  A nightly run
  does not reopen a regression of a kind that is already open/acknowledged for the cell.

Results that are not of the pass (:data:`workers.result.NOT_OF_THE_PASS`: ampci's own failures ``error``,
cells ``unmeasured`` where they ran, poison jobs ``crashed``) are never a baseline, a pooled sample, a drift
point nor a flip of a flaky lineage, and a run's own such results have no finding (:func:`of_the_pass`).

Guarantees: idempotent (each (run, cell, kind, category) is stored once; re-detection updates the
values and keeps any state a human set; findings no longer produced and still ``open`` are
removed); cells that flipped pass/not-pass ``flaky_flips`` times within ``flaky_window`` results,
or match the allowlist, report ``flaky`` instead of ``regression``; a ``push``/``nightly``/
``manual`` run resolves earlier open or acknowledged regressions of a cell when its revision
contains the regressed revision (it is that revision or a recorded descendant of it: a run of an
older revision never resolves a newer finding) and its result is comparable with that regression's
baseline result and no longer regresses against it; a *timing* regression, when the run confirms its
timing findings, only becomes ``suspected_resolved`` and is resolved by a confirmed recovery alone
(:mod:`service.regressions.confirm`: one lucky job never clears a slowdown).  A pairwise timing finding of
such a run, slowdown or improvement, is stored ``suspected`` until its confirmation decides (a gain is
confirmed before it is shown as one); an accuracy or convergence improvement on a cell whose coverage
regressed in the same comparison is stored ``explained`` with the coverage loss in its note (less in low
precision is less rounding, not a better pass).  Convergence
errors in different units (a baseline stored before the job recorded ``relative`` errors) are never
compared (see :mod:`service.regressions.rules`): such a baseline yields only diverged-status findings,
and resolves a divergence regression by the diverged status alone, never a final-error one.

``bisect`` runs store no findings: bisection classifies their *results* (:mod:`service.regressions.bisect`),
and a midpoint of a known regression is not a new regression to triage, so nothing of theirs shows
in ``ampci regressions --open``, the CI gate or the dashboard's regression lists.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Protocol

from service.regressions.confirm import SUSPECTED_RESOLVED
from service.regressions.drift import TIPPING_TRIGGERS, Earlier, LazyHistory, Point, judge
from service.regressions.kinds.registry import kind
from service.regressions.rules import (
    EXPLAINED,
    EXPLAINED_KINDS,
    PAIRWISE_KINDS,
    TIMING_KINDS,
    CellSample,
    Finding,
    compare_cells,
    pooled,
    returned_to_baseline,
    source_kind,
    timing_kind,
)
from service.regressions.stats import count_flips, shift_violations
from service.regressions.stored import (
    Cell,
    FindingRow,
    FindingUpdate,
    HistoryResult,
    LineFinding,
    LineResult,
    StoredFinding,
    StoredResult,
    sample,
)
from service.regressions.thresholds import Thresholds
from workers.result import NOT_OF_THE_PASS

LINEAGE_TRIGGERS = ("push", "nightly", "manual")
#: Categories of a pairwise timing finding that wait for a confirmation run (:mod:`service.regressions.confirm`):
#: a slowdown before it fails the gate, a gain before it is shown as one.
CONFIRMED_CATEGORIES = ("regression", "improvement")
#: States detection gives a finding (nobody decided anything on it yet): re-detection removes those it no
#: longer produces.
DETECTED_STATES = ("open", "suspected", EXPLAINED)
#: Runs that store no findings (see the module docstring).
NO_FINDINGS_TRIGGERS = ("bisect", "confirm")

#: A finding of a cell with the id and revision of the result it was measured against (None: no single one).
Found = tuple[Finding, int | None, str | None]
Samples = Callable[[StoredResult], CellSample]


class OpenRegression(StoredFinding, Protocol):
    """What resolving reads of an earlier open or acknowledged regression (a stored finding): besides what every
    finding has, the ids of its regressed and baseline results."""

    @property
    def result_id(self) -> int | None: ...
    @property
    def baseline_result_id(self) -> int | None: ...


def of_the_pass(current: Mapping[Cell, StoredResult]) -> dict[Cell, StoredResult]:
    """The results of ``current`` that are results of the pass: one ampci failed or could not run
    (:data:`workers.result.NOT_OF_THE_PASS`) has no finding, resolves nothing and is no flip of a flaky lineage
    (the store never gives one as a baseline, a pool, a drift point or a lineage either:
    :data:`service.db.series.OF_THE_PASS`)."""
    return {c: r for c, r in current.items() if r.status not in NOT_OF_THE_PASS}


def flaky_reason(cell: Cell, statuses: Sequence[str], th: Thresholds) -> str | None:
    """Why a cell counts as flaky (allowlist, or pass flips within the window), or None."""
    if th.allowlisted(cell):
        return "flaky (allowlisted)"
    window = [s == "pass" for s in statuses[-th.flaky_window:]]
    flips = count_flips(window)
    if flips >= th.flaky_flips:
        return f"flaky ({flips} pass/fail flips in last {len(window)} results)"
    return None


def nightly_latency(series: Sequence[HistoryResult], cur: StoredResult | HistoryResult,
                    th: Thresholds) -> tuple[Finding, int] | None:
    """Change-point finding over a nightly p50 series (same fingerprint as ``cur``), with the id of the
    last reference result; None without enough history or without ``nightly_consecutive`` violations."""
    pts = [r for r in series if r.env_fingerprint == cur.env_fingerprint and r.latency_p50_ms]
    if cur.latency_p50_ms is None or len(pts) < th.nightly_min_history + th.nightly_consecutive - 1:
        return None
    values = [p for r in pts if (p := r.latency_p50_ms)] + [cur.latency_p50_ms]  # pts: each has a p50
    k = th.nightly_consecutive
    ref_last = pts[-k]  # last point of the reference window
    ref_mean = sum(values[-k - th.nightly_window:-k]) / len(values[-k - th.nightly_window:-k])
    for direction, category in ((1, "regression"), (-1, "improvement")):
        hits = shift_violations(values, th.nightly_window, th.nightly_p, th.nightly_floor, k, direction)
        if hits:
            p, ratio = max(h[0] for h in hits), hits[-1][1]
            sev = "info" if category == "improvement" else ("major" if ratio > 1.5 else "minor")
            detail = (f"nightly p50 {ref_mean:.4g} ms -> {cur.latency_p50_ms:.4g} ms (x{ratio:.2f}); "
                      f"{k} consecutive nights beyond the last {min(th.nightly_window, len(values) - k)} (p<{p:.2g})")
            return Finding("latency", category, sev, "latency_p50_ms", ref_mean, cur.latency_p50_ms, detail, p), ref_last.id
    return None


def screened(th: Thresholds, suspect: bool) -> Thresholds:
    """The limits a run's findings are screened at: confirmed before they count (``suspect``), timing
    regressions are screened at ``suspect_p`` (a 20 % slower model on a busy machine gave p = 0.007 and
    p = 0.051 against a 0.002 limit); anything else stays at the rules' limits."""
    if not suspect:
        return th
    return replace(th, latency_p=max(th.latency_p, th.suspect_p), convert_time_p=max(th.convert_time_p, th.suspect_p))


def pools_from_fetched(base: Mapping[Cell, StoredResult], at_base: Mapping[Cell, Sequence[StoredResult]],
                       limit: int) -> dict[Cell, list[CellSample]]:
    """For each baseline result in ``base``, up to ``limit - 1`` more results of the same cell at the same
    revision taken from ``at_base`` (the results a baseline search fetched there), newest first, as samples to
    pool with it (:func:`service.regressions.rules.pooled` keeps those of the same environment only); only
    results that are pooled are parsed."""
    if limit <= 1 or not base:
        return {}
    picked = {c: sorted((r for r in at_base.get(c, ()) if r.id != b.id), key=lambda r: -r.id)[:limit - 1]
              for c, b in base.items()}
    return {c: [sample(r) for r in rs] for c, rs in picked.items() if rs}


def cell_findings(current: Mapping[Cell, StoredResult], base: Mapping[Cell, StoredResult],
                  pools: Mapping[Cell, Sequence[CellSample]], screen: Thresholds, th: Thresholds, nightly: bool,
                  nightly_hist: Mapping[Cell, Sequence[HistoryResult]],
                  samples: Samples) -> list[tuple[Cell, StoredResult, list[Found]]]:
    """The pairwise findings of each cell of the run against its baseline (pooled), at ``screen``'s limits, and
    for a nightly run its change-point latency finding at ``th``'s; cells without a finding are absent."""
    kinds = tuple(k for k in PAIRWISE_KINDS if not (nightly and k == "latency"))
    found: list[tuple[Cell, StoredResult, list[Found]]] = []
    for cell in sorted(current):
        cur = current[cell]
        findings: list[Found] = []
        if cell in base:
            b = base[cell]
            base_sample = pooled(samples(b), list(pools.get(cell, [])))
            findings += [(f, b.id, b.revision_sha) for f in compare_cells(base_sample, samples(cur), screen, cell[0],
                                                                          cell[1], kinds)]
            seen = {f.kind for f, _, _ in findings}
            # a change a rule saw beyond its own limits and dropped as the machine's: stored dismissed, with why
            findings += [(f, b.id, b.revision_sha) for name in kinds if name not in seen
                         and (dismiss := kind(name).dismissed) is not None
                         for f in dismiss(base_sample, samples(cur), th, cell[0], cell[1])]
        if nightly:
            got = nightly_latency(nightly_hist.get(cell, []), cur, th)
            if got is not None:
                findings.append((got[0], got[1], None))
        if findings:
            found.append((cell, cur, findings))
    return found


def by_cell_and_revision(results: Iterable[LineResult]) -> dict[Cell, dict[str, list[LineResult]]]:
    """``results`` grouped by cell, then by revision (each group in the order given)."""
    return group_into({}, results)


def group_into(out: dict[Cell, dict[str, list[LineResult]]],
               results: Iterable[LineResult]) -> dict[Cell, dict[str, list[LineResult]]]:
    """Add ``results`` to ``out``, grouped by cell, then by revision (after what it holds, in the order given);
    returns ``out``.  Grouping a sequence in parts gives what grouping it whole gives."""
    for r in results:
        of_cell = out.get(r.cell)
        if of_cell is None:
            out[r.cell] = {r.revision_sha: [r]}
        elif (rows := of_cell.get(r.revision_sha)) is None:
            of_cell[r.revision_sha] = [r]
        else:
            rows.append(r)
    return out


def drift_findings(run_sha: str, trigger: str, current: Mapping[Cell, StoredResult], line: Sequence[tuple[str, int]],
                   on_line: Sequence[LineResult], pinned: str | None, earlier: Sequence[LineFinding],
                   pairwise: Mapping[Cell, Sequence[Found]], th: Thresholds,
                   samples: Callable[[LineResult], CellSample],
                   grouped: Mapping[Cell, Mapping[str, list[LineResult]]] | None = None) -> dict[Cell, Found]:
    """The drift finding of each cell of the run that has one (:mod:`service.regressions.drift`), with its
    reference's result id and revision: over ``line`` (the first-parent line of the run's revision, (sha,
    depth)), the cells' results ``on_line``, the revision ``pinned`` for the branch and the ``earlier`` findings
    on the line; flaky cells are left to the flaky rule.  ``grouped``: ``on_line`` by cell and revision
    (:func:`by_cell_and_revision`), when the caller has it already (not grouped twice)."""
    depth = dict(line)
    by_cell = grouped if grouped is not None else by_cell_and_revision(on_line)
    earlier_of: dict[Cell, list[Earlier]] = {}
    for e in earlier:
        earlier_of.setdefault(e.cell, []).append(Earlier(source_kind(e.kind, e.metric), depth[e.revision_sha], e.state))
    tipping = trigger in TIPPING_TRIGGERS
    out: dict[Cell, Found] = {}
    for cell, rows_by_sha in by_cell.items():
        if cell not in current:  # the run's result of it is not of the pass (:func:`of_the_pass`): nothing to judge
            continue
        nearest_first = sorted(rows_by_sha, key=depth.__getitem__)  # a line's depths are distinct
        lineage = [r.status for sha in reversed(nearest_first) for r in rows_by_sha[sha]]
        if flaky_reason(cell, [*lineage, current[cell].status], th) is not None:
            continue

        def point(sha: str) -> Point:
            rows = rows_by_sha[sha]  # noqa: B023 - used in this iteration only
            if len(rows) > 1:
                rows = sorted(rows, key=lambda r: -r.id)
            return Point(sha, depth[sha], rows[0].id,
                         lambda: pooled(samples(rows[0]), [samples(r) for r in rows[1:]]))

        history = LazyHistory(nearest_first[:th.drift_window][::-1], point)
        pin = point(pinned) if pinned is not None and pinned in rows_by_sha else None
        done = earlier_of.get(cell, [])

        kinds_found = {source_kind(f.kind, f.metric) for f, _, _ in pairwise.get(cell, ())
                       if f.category == "regression" and f.dismissed is None}
        cur = current[cell]
        got = judge(cell, history, Point.of(run_sha, 0, cur.id, samples(cur)), th, pin=pin, tipping=tipping,
                    pairwise_kinds=kinds_found, earlier=done)
        if got is None:
            continue
        if timing_kind(got.finding.kind, got.finding.metric) and kinds_found & set(TIMING_KINDS):
            continue  # one confirmation job per cell times one baseline: the parent's suspicion goes first
        out[cell] = (got.finding, got.reference.result_id, got.reference.sha)
    return out


def merge_drifts(found: list[tuple[Cell, StoredResult, list[Found]]], drifts: Mapping[Cell, Found],
                 current: Mapping[Cell, StoredResult]) -> None:
    """Add each cell's drift finding to ``found`` (in place; a cell without another finding comes last)."""
    for cell, drift_finding in drifts.items():
        got = next((fs for c, _, fs in found if c == cell), None)
        if got is None:
            found.append((cell, current[cell], [drift_finding]))
        else:
            got.append(drift_finding)


def finding_rows(run_id: int, run_sha: str, found: Sequence[tuple[Cell, StoredResult, Sequence[Found]]],
                 lineage: Mapping[Cell, Sequence[HistoryResult]], th: Thresholds, *, nightly: bool, suspect: bool,
                 already_open: set[tuple[Cell, str]], now: datetime) -> list[FindingRow]:
    """The ``regressions`` rows the run's findings are stored as (see the module docstring): flaky cells'
    regressions as ``flaky``, screened-only timing findings dropped unless a confirmation run will judge them,
    pairwise timing findings ``suspected`` while they await it, gains a coverage loss explains ``explained``."""
    strict = {"latency": th.latency_p, "conversion_time": th.convert_time_p}
    rows: list[FindingRow] = []
    for cell, cur, findings in found:
        flaky = flaky_reason(cell, [r.status for r in lineage.get(cell, [])] + [cur.status], th)
        loss = next((f for f, _, _ in findings if f.kind == "coverage" and f.category == "regression"), None)
        for f, base_id, base_sha in findings:
            if nightly and f.category == "regression" and (cell, f.kind) in already_open:
                continue
            if f.dismissed is not None:  # seen beyond the rule's limits, judged not the pass's: shown, with why
                rows.append(_row(run_id, run_sha, cell, cur, f, base_id, base_sha, now, f.category, f.detail,
                                 "dismissed", f"dismissed: {f.dismissed}"))
                continue
            timing = timing_kind(f.kind, f.metric)
            if timing in strict and f.p_value is not None and f.p_value >= strict[timing] and (
                    flaky or f.category != "regression" or base_sha is None):
                continue  # screened only: kept when a confirmation run will judge it
            category, detail = f.category, f.detail
            if flaky and category == "regression":
                category, detail = "flaky", f"{flaky}: {detail}"
            # a pairwise timing regression or improvement awaits its confirmation run (the nightly change-point
            # test has no single baseline revision to time against: it needs consecutive nights)
            # (a drift of a timing metric too: confirmed against its old reference)
            state = ("suspected" if suspect and category in CONFIRMED_CATEGORIES and timing is not None
                     and base_sha is not None else "open")
            note = None
            if loss is not None and category == "improvement" and f.kind in EXPLAINED_KINDS:
                # less in low precision is less rounding: the coverage loss explains the "gain"
                state = EXPLAINED
                note = f"explained by the coverage loss on this cell ({loss.detail}): not an improvement of the pass"
            rows.append(_row(run_id, run_sha, cell, cur, f, base_id, base_sha, now, category, detail, state, note))
    return rows


def _row(run_id: int, run_sha: str, cell: Cell, cur: StoredResult, f: Finding, base_id: int | None,
         base_sha: str | None, now: datetime, category: str, detail: str, state: str, note: str | None) -> FindingRow:
    return {"run_id": run_id, "revision_sha": run_sha, "baseline_sha": base_sha,
            "model": cell[0], "dtype": cell[1], "policy": cell[2], "target": cell[3],
            "kind": f.kind, "category": category, "severity": f.severity, "metric": f.metric,
            "baseline_value": f.baseline_value, "value": f.value, "delta": f.delta,
            "ratio": f.ratio, "p_value": f.p_value, "detail": detail, "result_id": cur.id,
            "baseline_result_id": base_id, "created_at": now, "state": state,
            "state_by": "ampci" if note else None, "state_note": note[:2000] if note else None}


def suspected_baselines(rows: Sequence[FindingRow]) -> dict[Cell, str]:
    """Cell -> the baseline revision of its suspected findings among ``rows`` (what its confirmation job times;
    :func:`finding_rows` stores a finding ``suspected`` only against a baseline revision)."""
    return {(r["model"], r["dtype"], r["policy"], r["target"]): base for r in rows
            if r["state"] == "suspected" and (base := r["baseline_sha"]) is not None}


def resolutions(run_id: int, run_sha: str, open_regs: Sequence[OpenRegression], results: Mapping[int, StoredResult],
                current: Mapping[Cell, StoredResult], th: Thresholds, now: datetime, suspect: bool = False,
                suspected_cells: Mapping[Cell, str] | None = None,
                samples: Samples = sample) -> list[tuple[int, FindingUpdate]]:
    """(finding id, the values to store) of each earlier regression this run no longer shows (see the module
    docstring); ``open_regs`` are those whose regressed revision the run's revision contains, ``results`` their
    baseline and regressed results by id.

    With ``suspect`` (the run's timing findings are confirmed), a timing regression is not resolved by this
    one job, which may have been measured at a lucky moment: it becomes ``suspected_resolved`` (its state
    kept in ``state_before``, ``resolved_by_result_id`` this run's result) and the run's confirmation run
    times its regressed revision against this one (:mod:`service.regressions.confirm`), which resolves it
    or puts it back.  One confirmation job per cell times two revisions: a cell with a new suspected
    finding of this run timed against another revision (``suspected_cells``: cell -> the baseline revision of
    its suspected findings), or a second regressed revision, keeps such a regression as it is (a later run
    tries again).  A suspected improvement against the regressed revision itself (the fix of a slowdown, as
    its parent) shares the job: both are decided from the same interleaved pairs."""
    recovering: dict[Cell, str] = dict(suspected_cells or {})  # cell -> the revision its confirmation job times
    out: list[tuple[int, FindingUpdate]] = []
    for reg in open_regs:
        cell = (reg.model, reg.dtype, reg.policy, reg.target)
        base_id, cur = reg.baseline_result_id, current[cell]
        b = results.get(base_id) if base_id is not None else None
        bad = results.get(reg.result_id) if reg.result_id is not None else None
        kind = source_kind(reg.kind, reg.metric)  # a drift resolves by its metric's rule against its reference
        if b is None or not returned_to_baseline(kind, samples(b), samples(cur), th, reg.model, reg.dtype,
                                                 samples(bad) if bad is not None else None):
            continue
        if suspect and kind in TIMING_KINDS:
            if recovering.setdefault(cell, reg.revision_sha) != reg.revision_sha or reg.revision_sha == run_sha:
                continue  # its confirmation job is taken (or there is nothing to time against): stays as it is
            out.append((reg.id, FindingUpdate(
                state=SUSPECTED_RESOLVED, state_before=reg.state, state_by="ampci", state_at=now,
                resolved_by_result_id=cur.id,
                state_note=f"recovery suspected at {run_sha[:12]} (run {run_id}): awaiting its "
                           f"confirmation against {reg.revision_sha[:12]} timed interleaved")))
            continue
        out.append((reg.id, FindingUpdate(state="resolved", state_by="ampci", state_at=now,
                                          resolved_by_result_id=cur.id,
                                          state_note=f"returned to baseline at {run_sha[:12]} (run {run_id})")))
    return out
