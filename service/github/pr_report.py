"""What the pull-request report says about one finished run: the facts, gathered from the store.

:func:`build_report` reads a run, its jobs, results, findings and the baseline revision of each cell
and puts every cell in exactly one bucket (:data:`BUCKETS`), so the counts of the summary line add up
to the run's cells and the table lists the findings the counts come from.  Rendering is
:mod:`service.github.comment` (Markdown for the PR comment and the check run).

Buckets, first match wins:

* ``regression``: an open or acknowledged finding of category ``regression``;
* any other finding category of :data:`service.regressions.rules.CATEGORIES` in an open or
  acknowledged state (``improvement``, ``flaky``, … in that order), except :data:`QUIET_CATEGORIES`;
* ``not_measured``: the gate's "could not measure" cells (:attr:`GateDecision.unmeasured
  <service.regressions.gate.GateDecision>`: ``bad_spec``, ``crash``, ``convert_error``, a job without
  a result, …) and cells with no result yet (cancelled or pending jobs);
* ``known_failure``: failed the same way as its baseline result (the gate's ``known_failures``);
* ``new``: a result but no baseline result to compare with (the gate's ``not_compared``);
* ``unchanged``: compared with a baseline result, and no finding.

The counts therefore come from the same :func:`service.orchestration.judge.run_verdict` as the
commit status, the run page and the CLI.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from service.regressions.rules import CATEGORIES

if TYPE_CHECKING:
    from service.db.store import Store
    from service.regressions.gate import GateDecision
    from service.regressions.verdict import RunVerdict

Cell = tuple[str, str, str, str]

#: Finding states that count (the others are shown in the table, struck through, but count nowhere).
LIVE_STATES = frozenset({"open", "acknowledged"})
#: Finding categories that never put a cell in their own bucket (a dismissed timing suspicion).
QUIET_CATEGORIES = frozenset({"dismissed"})
#: Finding severities, most severe first (the table's order within a category).
SEVERITIES = ("critical", "major", "minor", "info")
#: The summary buckets in display order; categories added to CATEGORIES later join after ``flaky``.
BUCKETS: tuple[str, ...] = (*(c for c in CATEGORIES if c not in QUIET_CATEGORIES), "not_measured",
                            "known_failure", "new", "unchanged")


@dataclass(frozen=True)
class ReportRow:
    """One finding of the run as the table shows it: ``detail`` is the rule's own words (what a row without
    values shows, e.g. a conversion regression), ``note`` the state's reason (the paired figures of a timing
    confirmation, an acknowledgement's note), ``state_by`` who set the state."""

    id: int
    cell: Cell
    kind: str
    metric: str
    category: str
    severity: str
    state: str
    baseline_value: float | None
    value: float | None
    delta: float | None
    ratio: float | None
    finding_url: str
    detail: str = ""
    note: str = ""
    state_by: str | None = None


@dataclass(frozen=True)
class PullRequestReport:
    """Everything the PR comment and the check run say about one run of a pull request."""

    repo: str
    pr: int | None
    run_id: int
    run_url: str
    run_status: str
    head_sha: str
    head_subject: str
    baseline_sha: str | None          # the PR base's tip (what the run was asked to compare with)
    baseline_revisions: tuple[str, ...]  # the revisions the compared cells were actually compared with
    cells: int
    counts: dict[str, int]
    rows: tuple[ReportRow, ...]
    not_measured: tuple[tuple[Cell, str], ...] = field(default_factory=tuple)  # (cell, why)
    best_effort: int = 0              # cells whose pass ran without the full sandbox (issue 31)
    state: str = "success"            # the commit status state (service.regressions.verdict.decide_run)
    verdict_parts: tuple[str, ...] = ()  # the verdict's phrases (RunVerdict.parts): why it failed or errored
    since: str = ""  # what later runs resolved of it (RunVerdict.since), said beside the verdict

    @property
    def fallback(self) -> bool:
        """True when some cell was compared with another revision than the PR base's tip."""
        return any(r != self.baseline_sha for r in self.baseline_revisions)

    @property
    def not_compared(self) -> int:
        """Cells that have no comparison: new ones and those not measured."""
        return self.counts.get("new", 0) + self.counts.get("not_measured", 0)


def _order(category: str) -> int:
    return CATEGORIES.index(category) if category in CATEGORIES else len(CATEGORIES)


def row_order(row: ReportRow) -> tuple[bool, int, int, Cell, str]:
    """The table's order: live findings first, then by category (regressions first), severity (critical
    first), cell and kind."""
    severity = SEVERITIES.index(row.severity) if row.severity in SEVERITIES else len(SEVERITIES)
    return (row.state not in LIVE_STATES, _order(row.category), severity, row.cell, row.kind)


class BucketedFinding(Protocol):
    """What :func:`bucket_cells` reads of a finding (:class:`service.db.records.RegressionInfo`)."""

    @property
    def cell(self) -> Cell: ...

    @property
    def category(self) -> str: ...

    @property
    def state(self) -> str: ...


def bucket_cells(cells: list[Cell], results: set[Cell], decision: GateDecision,
                 findings: Sequence[BucketedFinding]) -> dict[Cell, str]:
    """The bucket of each cell (see the module docstring) given the gate's ``decision``; pure."""
    live: dict[Cell, list[str]] = {}
    for f in findings:
        if f.state in LIVE_STATES and f.category not in QUIET_CATEGORIES:
            live.setdefault(f.cell, []).append(f.category)
    unmeasured = {c for c, _ in decision.unmeasured}
    known = {c for c, _ in decision.known_failures}
    not_compared = set(decision.not_compared)
    out: dict[Cell, str] = {}
    for cell in cells:
        if cell in live:
            out[cell] = min(live[cell], key=_order)
        elif cell in unmeasured or cell not in results:
            out[cell] = "not_measured"
        elif cell in known:
            out[cell] = "known_failure"
        elif cell in not_compared:
            out[cell] = "new"
        else:
            out[cell] = "unchanged"
    return out


def build_report(store: Store, run_id: int, public_url: str, verdict: RunVerdict | None = None) -> PullRequestReport:
    """Gather the report of run ``run_id`` (NotFoundError if unknown) from its ``verdict``
    (:func:`service.orchestration.judge.run_verdict`, decided here unless the caller has it): the report's
    ``state`` is the verdict's, as on the commit status."""
    from service.orchestration.judge import baseline_revisions, run_verdict

    run = store.get_run(run_id)
    gh = (run.meta or {}).get("github")
    gh = gh if isinstance(gh, dict) else {}
    named = gh.get("repo")
    repo = named if isinstance(named, str) else ""
    jobs = store.jobs(run_id)
    results = {r.cell: r.status for r in store.results(run_id=run_id, limit=100_000)}
    based = baseline_revisions(store, run_id) if results else {}
    findings = store.regressions(run_id=run_id, limit=100_000)
    if verdict is None:
        verdict = run_verdict(store, run_id)
    cells = sorted({j.cell for j in jobs} | set(results))
    buckets = bucket_cells(cells, set(results), verdict.decision, findings)
    counts = {b: 0 for b in BUCKETS}
    for b in buckets.values():
        counts[b] = counts.get(b, 0) + 1
    public = public_url.rstrip("/")
    rows = tuple(sorted(
        (ReportRow(id=f.id, cell=f.cell, kind=f.kind, metric=f.metric, category=f.category, severity=f.severity,
                   state=f.state, baseline_value=f.baseline_value, value=f.value, delta=f.delta, ratio=f.ratio,
                   finding_url=f"{public}/regressions/{f.id}", detail=f.detail or "", note=f.state_note or "",
                   state_by=f.state_by)
         for f in findings),
        key=row_order))
    job_status = {j.cell: j.status for j in jobs}
    why = dict(verdict.decision.unmeasured)
    missing = tuple((c, why.get(c) or results.get(c) or f"job {job_status.get(c, 'missing')}, no result")
                    for c in cells if c in why or c not in results)
    try:
        subject = (store.get_revision(run.revision_sha).message or "").splitlines()[0]
    except Exception:  # noqa: BLE001 - a revision row is optional for the report
        subject = ""
    pr = gh.get("pr")
    return PullRequestReport(
        repo=repo, pr=int(pr) if isinstance(pr, int) else None, run_id=run.id,
        run_url=f"{public}/runs/{run.id}", run_status=run.status, head_sha=run.revision_sha,
        head_subject=subject, baseline_sha=run.baseline_sha,
        baseline_revisions=tuple(sorted(set(based.values()))), cells=len(cells), counts=counts, rows=rows,
        not_measured=missing, best_effort=_best_effort(store, run_id),
        state=verdict.state, verdict_parts=tuple(verdict.parts()), since=verdict.since())


def _best_effort(store: Store, run_id: int) -> int:
    """Cells of the run whose pass ran ``best-effort`` (no network, mount or PID isolation)."""
    try:
        return sum(m == "best-effort" for m in store.sandbox_modes(run_id))
    except AttributeError:  # a store without the query (a test double): nothing to say
        return 0
