"""Judging a run: its findings detected and stored, and its verdict decided.

:func:`detect_run` loads what detection needs from the store (:mod:`service.db.series`), applies the pure
rules of :mod:`service.regressions.detect` and writes what they decide (:mod:`service.db.findings`), in one
transaction; :func:`run_verdict` reads a run's results, jobs, baselines and findings and hands them to
:func:`service.regressions.verdict.verdict_of`.  The guarantees of detection are those of
:mod:`service.regressions.detect`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from service.db import findings, pins, series, verdicts
from service.db.engine import Connection  # an open transaction of the store, handed to db/ functions
from service.db.queries import ancestors, first_parent_line
from service.db.records import RegressionInfo, RunInfo
from service.json_types import JsonObject
from service.orchestration import baseline_runs
from service.regressions import detect
from service.regressions.confirm import confirmation_pairs
from service.regressions.stored import Cell, LineResult, Samples, StoredResult, sample
from service.regressions.thresholds import Thresholds
from service.regressions.verdict import RunVerdict, verdict_of
from service.regressions.verdict_stored import from_stored, to_stored

if TYPE_CHECKING:
    from service.db.store import Store


class JudgedRun(Protocol):
    """What judging reads of the run it judges (the store's row of it: :meth:`Store.run_row`)."""

    @property
    def id(self) -> int:
        """The run's id."""

    @property
    def trigger(self) -> str:
        """What started it (``push``, ``nightly``, ...)."""

    @property
    def revision_sha(self) -> str:
        """The revision it measured."""

    @property
    def baseline_sha(self) -> str | None:
        """The baseline revision it asked for (None: the nearest ancestor with results)."""

    @property
    def meta(self) -> JsonObject | None:
        """Its meta (the confirmation it asked for, among others)."""


def detect_run(store: Store, run_id: int, thresholds: Thresholds | None = None) -> list[RegressionInfo]:
    """Detect, store and return the findings of ``run_id`` (see :mod:`service.regressions.detect`): the run's
    stored findings as :meth:`Store.regressions` lists them, read in the transaction that stored them."""
    th = thresholds or store.thresholds or Thresholds()
    with store.transaction() as conn:
        run = store.run_row(conn, run_id)
        current = detect.of_the_pass(series.current_results(conn, run_id=run_id))
        if current:
            _detect(conn, store, run, current, th)
        return findings.run_findings(conn, run_id=run_id)


def _detect(conn: Connection, store: Store, run: JudgedRun, current: dict[Cell, StoredResult], th: Thresholds) -> None:
    if run.trigger in detect.NO_FINDINGS_TRIGGERS:
        findings.store_findings(conn, run_id=run.id, rows=[])  # drops open findings stored by older versions
        return
    nightly = run.trigger == "nightly"
    cells = sorted(current)
    base, at_base = _baselines(conn, run, cells, th)
    nightly_hist = (series.history(conn, run_id=run.id, sha=run.revision_sha, triggers=("nightly",),
                                   limit=th.nightly_window + th.nightly_consecutive) if nightly else {})
    already_open = series.open_kinds(conn, run_id=run.id) if nightly else set()
    now = store.clock()
    suspect = confirmation_pairs(run) > 0  # timing regressions wait for their confirmation run
    screen = detect.screened(th, suspect)
    # the push path's chunk queries fetched every result at each baseline's revision: the pools come from
    # those rows (no second query); a nightly search stops at earlier runs, its pools do not
    if nightly:
        pools = {c: [sample(r) for r in rs]
                 for c, rs in series.baseline_pools(conn, run_id=run.id, base=base, limit=th.latency_pool).items()}
    else:
        pools = detect.pools_from_fetched(base, at_base, th.latency_pool)
    samples = Samples(lambda ids: series.results_by_id(conn, ids=ids))
    found = detect.cell_findings(current, base, pools, screen, th, nightly, nightly_hist, samples)
    drifts = _drifts(conn, run, current, {c: fs for c, _, fs in found}, screen, samples)
    detect.merge_drifts(found, drifts, current)
    # the lineage only decides whether a finding is flaky: read for the cells that have one
    lineage = series.history(conn, run_id=run.id, sha=run.revision_sha, triggers=detect.LINEAGE_TRIGGERS,
                             limit=th.flaky_window - 1, cells=[cell for cell, _, _ in found])
    rows = detect.finding_rows(run.id, run.revision_sha, found, lineage, th, nightly=nightly, suspect=suspect,
                               already_open=already_open, now=now)
    findings.store_findings(conn, run_id=run.id, rows=rows)
    if run.trigger in detect.LINEAGE_TRIGGERS:
        _resolve(conn, run, current, th, now, suspect, detect.suspected_baselines(rows), samples)


def _drifts(conn: Connection, run: JudgedRun, current: dict[Cell, StoredResult],
            pairwise: dict[Cell, list[detect.Found]], th: Thresholds, samples: Samples) -> dict[Cell, detect.Found]:
    """The drift findings of the run (:func:`service.regressions.detect.drift_findings`).  Three small queries
    for the whole run: the first-parent line of its revision (:func:`drift_line`), the cells' results on it,
    the earlier findings on it (and the branch's pin)."""
    pinned = pins.pin_for_revision(conn, sha=run.revision_sha)
    line, on_line, grouped = drift_line(conn, run, set(current), pinned, th)
    if not on_line:
        return {}
    depth = dict(line)
    samples.defer(on_line)
    samples.prefetch(sampled_ends(on_line, depth, pinned, th.drift_window, grouped=grouped))
    # judging reads the earlier findings above a reference (a revision read: the window's or the pin) and at the
    # parent: those on the line down to the deepest revision read (17 revisions, not 200, on a dense line)
    deepest = max(depth[r.revision_sha] for r in on_line)
    earlier = series.earlier_on_line(conn, run_id=run.id, shas=[s for s, d in line if d <= deepest])
    return detect.drift_findings(run.revision_sha, run.trigger, current, line, on_line, pinned, earlier, pairwise,
                                 th, samples, grouped=grouped)


def drift_line(conn: Connection, run: JudgedRun, cells: set[Cell], pinned: str | None, th: Thresholds
               ) -> tuple[list[tuple[str, int]], list[LineResult], dict[Cell, dict[str, list[LineResult]]]]:
    """The first-parent line of the run's revision ((sha, depth), nearest first), the results on it drift
    judging reads (:func:`nearest_line_results`, in brief) and those grouped by cell and revision.

    The line is walked first only as deep as the first chunk :func:`nearest_line_results` reads (``need``
    revisions): when every cell has ``need`` measured revisions there (a line measured at every commit) and the
    pin, if any, lies on it, that chunk is all the whole line's read would have given (it stops after its first
    chunk).  Otherwise the line is walked to ``th.drift_line_depth`` and read again, as before: the same
    results, the same findings, whichever way they were read."""
    need = max(th.drift_window, th.flaky_window)
    short = min(need, th.drift_line_depth)
    line = first_parent_line(conn, run.revision_sha, short)
    walked_all = len(line) - 1 < short or short == th.drift_line_depth
    if walked_all or pinned is None or pinned in dict(line):
        on_line, grouped = nearest_line_grouped(conn, run.id, [s for s, d in line if d > 0], cells, pinned,
                                                need=need, brief=True)
        if walked_all or all(len(grouped.get(c, ())) >= need for c in cells):
            return line, on_line, grouped
    line = first_parent_line(conn, run.revision_sha, th.drift_line_depth)
    on_line, grouped = nearest_line_grouped(conn, run.id, [s for s, d in line if d > 0], cells, pinned, need=need,
                                            brief=True)
    return line, on_line, grouped


def sampled_ends(on_line: Sequence[LineResult], depth: dict[str, int], pinned: str | None,
                 window: int, grouped: Mapping[Cell, Mapping[str, list[LineResult]]] | None = None
                 ) -> list[LineResult]:
    """The results of ``on_line`` whose samples drift judging reads for a cell whatever it finds
    (:func:`service.regressions.drift.judge`): those at the cell's nearest measured revision (the parent), at
    the oldest of its nearest ``window`` (the window's reference) and at ``pinned``.  Fetched in one query; the
    window's other documents only when a drift is described.  ``grouped``: ``on_line`` by cell and revision
    (:func:`service.regressions.detect.by_cell_and_revision`), when the caller has it already."""
    out: list[LineResult] = []
    for by_sha in (grouped if grouped is not None else detect.by_cell_and_revision(on_line)).values():
        measured = sorted(by_sha, key=depth.__getitem__)[:window]
        for sha in {measured[0], measured[-1], *([pinned] if pinned else [])} & by_sha.keys():
            out.extend(by_sha[sha])
    return out


def nearest_line_results(conn: Connection, run_id: int, shas: list[str], cells: set[Cell], pinned: str | None,
                         need: int, brief: bool = False) -> list[LineResult]:
    """The results on the first-parent line ``shas`` (nearest first) of run ``run_id``'s cells that drift
    judging reads (:func:`service.regressions.detect.drift_findings`): every result at each cell's nearest
    ``need`` measured revisions (its drift window and its flaky lineage are drawn from those) and every result
    at the ``pinned`` revision when it is on the line.  Read nearest first in chunks that double, so a line
    measured at every commit costs one chunk of ``need`` revisions, not the whole line (200 revisions x 200
    cells at 100,000 results); a cell measured rarely, or never, makes it read on, at worst to the line's end.
    ``brief``: the results in brief, cell, id, run, revision and status (:func:`series.line_briefs`)."""
    return nearest_line_grouped(conn, run_id, shas, cells, pinned, need, brief)[0]


def nearest_line_grouped(conn: Connection, run_id: int, shas: list[str], cells: set[Cell], pinned: str | None,
                         need: int, brief: bool = False
                         ) -> tuple[list[LineResult], dict[Cell, dict[str, list[LineResult]]]]:
    """:func:`nearest_line_results`, and those results grouped by cell and revision as
    :func:`service.regressions.detect.by_cell_and_revision` groups them: the grouping that decides when to stop
    reading is the one returned (the rows are walked once, not once to count and again to group)."""
    read = series.line_briefs if brief else series.line_results
    out: list[LineResult] = []
    grouped: dict[Cell, dict[str, list[LineResult]]] = {}
    on_pin = False  # the pinned revision counts as measured once a chunk reaches it (it is read first)
    if pinned is not None and pinned in shas:  # the pin is read at once, wherever it lies on the line
        out.extend(read(conn, run_id=run_id, shas=[pinned]))
        detect.group_into(grouped, out)
        on_pin = bool(out)

    def measured(c: Cell) -> int:
        of_cell = grouped.get(c, {})
        return len(of_cell) - (1 if on_pin and pinned in of_cell else 0)

    start, size = 0, max(1, need)
    while start < len(shas) and any(measured(c) < need for c in cells):
        chunk = shas[start:start + size]
        rows = read(conn, run_id=run_id, shas=[s for s in chunk if s != pinned])
        out.extend(rows)
        detect.group_into(grouped, rows)
        if pinned in chunk:
            on_pin = False
        start, size = start + size, size * 2
    return out, grouped


def _resolve(conn: Connection, run: JudgedRun, current: dict[Cell, StoredResult], th: Thresholds, now: datetime,
             suspect: bool, suspected_cells: dict[Cell, str], samples: Samples) -> None:
    """Resolve the earlier regressions this run no longer shows (:func:`service.regressions.detect.resolutions`)."""
    open_regs = series.open_regressions(conn, run_id=run.id)
    if not open_regs:  # the usual case: no walk of the whole ancestry (11 ms of 200 revisions)
        return
    # only a revision that contains the regressed one (itself or a descendant) can resolve it: a run of
    # an older or unrelated revision says nothing about whether the change that regressed is fixed
    contains = {sha for sha, _ in ancestors(conn, run.revision_sha, th.ancestor_depth, include_self=True)}
    open_regs = [r for r in open_regs if r.revision_sha in contains]
    if not open_regs:
        return
    ids = {r.baseline_result_id for r in open_regs if r.baseline_result_id is not None} | \
        {r.result_id for r in open_regs if r.result_id is not None}
    results = series.results_by_id(conn, ids=ids)
    for finding_id, values in detect.resolutions(run.id, run.revision_sha, open_regs, results, current, th, now,
                                                 suspect, suspected_cells, samples):
        findings.set_finding(conn, finding_id=finding_id, values=values)


def _baselines(conn: Connection, run: JudgedRun, cells: list[Cell],
               th: Thresholds) -> tuple[dict[Cell, StoredResult], dict[Cell, list[StoredResult]]]:
    """The baseline result of each of ``cells`` (see :mod:`service.regressions.detect`; cells without one are
    absent), and the results fetched at each baseline's revision (:func:`service.db.series.nearest`)."""
    nightly = run.trigger == "nightly"
    start, include_self = (run.baseline_sha, True) if run.baseline_sha else (run.revision_sha, nightly)
    return series.nearest(conn, start=start, include_self=include_self, run_id=run.id, cells=cells,
                          max_depth=th.ancestor_depth, before_run=run.id if nightly else None)


def baseline_revisions(store: Store, run_id: int, thresholds: Thresholds | None = None) -> dict[Cell, str]:
    """For each cell of run ``run_id`` that has a result, the revision of the baseline result detection
    compares it with; cells with no baseline result (a first run of the cell) are absent."""
    return {c: sha for c, (sha, _) in baseline_statuses(store, run_id, thresholds).items()}


def baseline_statuses(store: Store, run_id: int, thresholds: Thresholds | None = None) -> dict[Cell, tuple[str, str]]:
    """For each cell of run ``run_id`` that has a result, ``(revision, status)`` of the baseline result
    detection compares it with (the gate tells a known failure by the status); cells with no baseline
    result are absent."""
    th = thresholds or store.thresholds or Thresholds()
    with store.transaction() as conn:
        run = store.run_row(conn, run_id)
        cells = series.cells_of_run(conn, run_id=run_id)
        if not cells:
            return {}
        return {c: (r.revision_sha, r.status) for c, r in _baselines(conn, run, cells, th)[0].items()}


def cells_with_results(store: Store, sha: str) -> set[Cell]:
    """The cells that have at least one result at revision ``sha`` (any run)."""
    with store.transaction() as conn:
        return series.cells_with_results(conn, sha=sha)


def decide_verdict(store: Store, run_id: int) -> RunVerdict:
    """Decide the verdict of run ``run_id`` afresh from the store (:func:`service.regressions.verdict.verdict_of`):
    its results, jobs, each cell's baseline, its findings and the runs it waits for.  Only judging calls this;
    every view reads :func:`run_verdict`."""
    run = store.get_run(run_id)
    results = store.results(run_id=run_id)
    jobs = store.jobs(run_id)
    base = baseline_statuses(store, run_id)
    found = store.regressions(run_id=run_id)
    waiting: tuple[int, ...] = ()
    if baseline_runs.awaited(run.meta) and run.status not in baseline_runs.FINAL_RUN_STATES:
        waiting = tuple(i for i in baseline_runs.awaited(run.meta)
                        if store.get_run(i).status not in baseline_runs.FINAL_RUN_STATES)
    return verdict_of(run_id, run.status, run.revision_sha, results, jobs, base, found, waiting)


def run_verdict(store: Store, run_id: int) -> RunVerdict:
    """The verdict of run ``run_id`` as every view shows it (the run page, the API, ``ampci regressions --run``,
    ``ampci sweep``, the commit status, the check run and the pull-request comment): the one stored when the run
    was judged (:func:`record_verdict`), with the regressions later runs resolved beside it
    (:meth:`RunVerdict.since`), never instead of it.  A run not finished yet is decided afresh (pending); a
    finished run without a stored verdict (judged before ``runs.judgement`` existed) is decided on this read
    and stored, once; a stored verdict of another run status (the run was cancelled after it was judged) is
    decided and stored again.  NotFoundError for an unknown run."""
    run = store.get_run(run_id)
    with store.transaction() as conn:
        stored = from_stored(verdicts.judgement(conn, run_id=run_id))
        since = verdicts.resolved_since(conn, run_ids=[run_id]).get(run_id)
    if run.finished_at is None:
        verdict = decide_verdict(store, run_id)
    elif stored is None or stored.run_status != run.status:
        verdict = record_verdict(store, run_id)
    else:
        verdict = stored
    return replace(verdict, resolved=since[0], resolved_by=since[1]) if since else verdict


def record_verdict(store: Store, run_id: int) -> RunVerdict:
    """Decide run ``run_id``'s verdict (:func:`decide_verdict`) and store it, in brief for the lists of runs
    and whole for every view of the run (:mod:`service.db.verdicts`): called by the finisher when it judges
    the run (once it is finished: a run waiting for its confirmation or baseline run is not finished, so what
    is stored is its final verdict), after one of its findings is triaged (a person re-judged it), and by
    :func:`run_verdict` for a finished run without one.  A run not finished yet records nothing (the lists say
    it is pending).  Returns the verdict decided."""
    verdict = decide_verdict(store, run_id)
    if store.get_run(run_id).finished_at is not None:
        store.record_verdict(run_id, verdict.brief(), to_stored(verdict))
    return verdict


def listed_verdicts(store: Store, runs: Sequence[RunInfo]) -> tuple[list[RunInfo], dict[int, tuple[int, tuple[int, ...]]]]:
    """What a list of ``runs`` shows of their verdicts: the runs with their stored verdict (a finished run that
    has none, judged before it was stored, is decided and stored now, once: :func:`record_verdict`), and for
    each run whose regressions later runs resolved, ``(how many, by which runs)``
    (:func:`service.db.verdicts.resolved_since`), shown beside it."""
    out = list(runs)
    for i, r in enumerate(out):
        if r.verdict is None and r.finished_at is not None:
            record_verdict(store, r.id)
            out[i] = store.get_run(r.id)
    with store.transaction() as conn:
        return out, verdicts.resolved_since(conn, run_ids=[r.id for r in out])
