"""Apply the regression rules to one run and store what they find.

Baselines (per cell):

- ``push``/``manual`` without a baseline: the newest result of the cell at the nearest ancestor
  of the run's revision that has one (parent links from ``revision_parents``, depth-bounded);
- any run with ``baseline_sha`` (``pull_request`` merge base, ``bisect``): the same walk starting
  *at* the baseline revision;
- ``nightly``: the newest earlier result on the revision or its ancestors (the main-branch
  history); latency uses the change-point test over the nightly series instead of a pairwise test,
  and needs ``nightly_consecutive`` violating nights before it opens a regression.  A nightly run
  does not reopen a regression of a kind that is already open/acknowledged for the cell.

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

import json
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from service.db import models as m
from service.db import pins
from service.db.queries import (
    ancestors,
    first_parent_line,
    regression_info,
    regressions_query,
    stored_error_unit,
)
from service.db.records import Cell, RegressionInfo
from service.db.runs import dialect_insert
from service.regressions.confirm import CONFIRM_TRIGGER, SUSPECTED_RESOLVED, confirmation_pairs
from service.regressions.drift import Earlier, Point, judge
from service.regressions.measured import floats, graph_fields
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
from service.regressions.thresholds import Thresholds

if TYPE_CHECKING:
    from service.db.store import Store

Regression = RegressionInfo
t_rev, t_run, t_res, t_reg = (m.Revision.__table__, m.Run.__table__, m.Result.__table__,
                              m.Regression.__table__)
CELL = (t_res.c.model, t_res.c.dtype, t_res.c.policy, t_res.c.target)
#: The result columns a CellSample is built from, and ``data`` whole *as text* (labelled ``doc``): :func:`sample`
#: reads its JSON paths (latency samples, convergence unit, graph figures) in Python, parsing a document only
#: when a rule needs that result (a row fetched and then passed over costs no parse).  Not a dozen JSON-path
#: expressions on the server: ``results.data`` is ``json``, so each would re-parse the stored text there (6x the
#: query time), and one cast to ``jsonb`` to extract them from costs the server more than ``json.loads`` costs
#: the client (26 vs 19 us for a 2 kB document).  The cell comes first (:func:`_lead_cell`), and :func:`sample`
#: reads the columns after ``revision_sha`` by position (a Row's attribute lookup costs 15x its index).
SAMPLE_COLS = (*CELL, t_res.c.id, t_res.c.run_id, t_res.c.revision_sha, t_res.c.status, t_res.c.max_abs,
               t_res.c.cosine, t_res.c.final_error, t_res.c.diverged, t_res.c.low_precision_fraction,
               t_res.c.casts_inserted, t_res.c.env_fingerprint, t_res.c.latency_p50_ms,
               sa.cast(t_res.c.data, sa.Text).label("doc"))
LINEAGE_TRIGGERS = ("push", "nightly", "manual")
#: Categories of a pairwise timing finding that wait for a confirmation run (:mod:`service.regressions.confirm`):
#: a slowdown before it fails the gate, a gain before it is shown as one.
CONFIRMED_CATEGORIES = ("regression", "improvement")
#: States detection gives a finding (nobody decided anything on it yet): re-detection removes those it no
#: longer produces.
DETECTED_STATES = ("open", "suspected", EXPLAINED)
#: Results of confirmation runs time two revisions at once: never a baseline (:mod:`service.regressions.confirm`).
NOT_CONFIRMATION = t_res.c.run_id.not_in(sa.select(t_run.c.id).where(t_run.c.trigger == CONFIRM_TRIGGER))


def sample(row: Any) -> CellSample:
    """A CellSample from a row selected with SAMPLE_COLS (its ``doc``, the stored ``results.data`` as text,
    parsed once here).

    The convergence error unit is the stored result's ``convergence.error_unit``; a result stored
    before the job recorded one has ``absolute`` errors (as :meth:`workers.result.JobResult.from_dict`
    reads it).  The measured compute counts, conversion-time samples and the pass's convergence come from
    ``results.data`` (:func:`service.regressions.measured.graph_fields`).  A path whose key is missing or
    whose step is not an object reads as None, as the JSON-path operators read it."""
    status, max_abs, cosine, final_error, diverged, low_precision, casts, env, _p50, doc = row[7:]  # SAMPLE_COLS
    data = json.loads(doc) if isinstance(doc, str | bytes) else doc
    latency, graph, convergence = _obj(data, "latency"), _obj(data, "graph"), _obj(data, "convergence")
    return CellSample(status=status, max_abs=max_abs, cosine=cosine, final_error=final_error, diverged=diverged,
                      low_precision_fraction=low_precision, casts_inserted=casts,
                      latency_samples=floats(latency.get("samples_ms")),
                      fp32_latency_samples=floats(latency.get("fp32_samples_ms")),
                      env_fingerprint=env,
                      error_unit=stored_error_unit(convergence.get("error_unit")),
                      cpu_latency_samples=floats(latency.get("cpu_samples_ms")),
                      fp32_cpu_latency_samples=floats(latency.get("fp32_cpu_samples_ms")),
                      **graph_fields(graph))


_NO_OBJECT: Mapping[str, Any] = {}


def _obj(data: Any, key: str) -> Mapping[str, Any]:
    """``data[key]`` when ``data`` and it are JSON objects, else an empty mapping (every key reads None)."""
    value = data.get(key) if isinstance(data, dict) else None
    return value if isinstance(value, dict) else _NO_OBJECT


def _cell(row: Any) -> Cell:
    return (row.model, row.dtype, row.policy, row.target)


def _lead_cell(row: Any) -> Cell:
    """The cell of a row whose first four columns are CELL (SAMPLE_COLS, :func:`_history` rows)."""
    return row[:4]  # type: ignore[no-any-return]  # a Row slice is a plain tuple


#: The other side of :func:`_same_cell`, built once (an alias copies every column of ``results`` when made).
_CUR = t_res.alias("cur")


def _same_cell(other: sa.Table | Any, run_id: int | sa.BindParameter[int]) -> sa.ColumnElement[bool]:
    """Join condition: ``other``'s cell is one of the cells of run ``run_id`` (no bound cell lists)."""
    cur = _CUR
    return sa.exists().where(cur.c.run_id == run_id, cur.c.model == other.c.model, cur.c.dtype == other.c.dtype,
                             cur.c.policy == other.c.policy, cur.c.target == other.c.target)


#: What identifies a finding of a run (with ``run_id``: the table's unique key).
_KEY_COLS = ("model", "dtype", "policy", "target", "kind", "category")


def _statements() -> dict[str, Any]:
    """Detection's statements, with bound ``run_id`` (and the other values each names), built once: a
    statement object made afresh on every call costs its construction and its cache key each time."""
    run_id = sa.bindparam("run_id")
    chunk = sa.select(*SAMPLE_COLS).where(t_res.c.revision_sha.in_(sa.bindparam("shas", expanding=True)),
                                          t_res.c.run_id != run_id, _same_cell(t_res, run_id), NOT_CONFIRMATION)
    branch = sa.select(t_rev.c.branch).where(t_rev.c.sha == sa.bindparam("sha")).scalar_subquery()
    run_ids = (sa.select(t_run.c.id).join(t_rev, t_rev.c.sha == t_run.c.revision_sha)
               .where(t_run.c.id < run_id, t_run.c.trigger.in_(sa.bindparam("triggers", expanding=True)),
                      sa.or_(sa.func.coalesce(branch, "") == "", t_rev.c.branch == branch))
               .order_by(t_run.c.id.desc()).limit(sa.bindparam("limit")))
    history = (sa.select(*CELL, t_res.c.run_id, t_res.c.id, t_res.c.status, t_res.c.latency_p50_ms,
                         t_res.c.env_fingerprint)
               .where(t_res.c.run_id.in_(run_ids.scalar_subquery())).order_by(t_res.c.run_id))
    return {
        "current": sa.select(*SAMPLE_COLS).where(t_res.c.run_id == run_id),
        "chunk": chunk,
        "chunk_before": chunk.where(t_res.c.run_id < sa.bindparam("before_run")),
        "history": history.where(_same_cell(t_res, run_id)),
        "history_of_models": history.where(t_res.c.model.in_(sa.bindparam("models", expanding=True))),
        "open_regressions": sa.select(t_reg).join(t_run, t_run.c.id == t_reg.c.run_id).where(
            t_run.c.trigger.in_(LINEAGE_TRIGGERS), t_reg.c.category == "regression",
            t_reg.c.state.in_(("open", "acknowledged")), t_reg.c.run_id < run_id,
            t_reg.c.baseline_result_id.is_not(None), _same_cell(t_reg, run_id)),
        "findings": regressions_query().where(t_reg.c.run_id == run_id),
        "delete_stale": t_reg.delete().where(  # the run's detected findings but those in ``keys``
            t_reg.c.run_id == run_id, t_reg.c.state.in_(DETECTED_STATES),
            sa.tuple_(*(t_reg.c[k] for k in _KEY_COLS)).not_in(sa.bindparam("keys", expanding=True))),
    }


_Q = _statements()


def nearest_results(conn: Connection, start: str, include_self: bool, run_id: int, cells: Sequence[Cell],
                    max_depth: int, before_run: int | None = None) -> dict[Cell, Any]:
    """For each of ``cells`` (the cells of ``run_id``), the newest result at the nearest ancestor of
    ``start`` that has one (results of ``run_id`` itself excluded).

    Ancestors are searched in growing chunks (1, 4, 16, … revisions; the deep ancestry is only
    walked when the near one lacks a cell), so the usual case costs two small queries.
    """
    return _nearest(conn, start, include_self, run_id, cells, max_depth, before_run)[0]


def _nearest(conn: Connection, start: str, include_self: bool, run_id: int, cells: Sequence[Cell],
             max_depth: int, before_run: int | None = None) -> tuple[dict[Cell, Any], dict[Cell, list[Any]]]:
    """:func:`nearest_results`, and for each cell found, every row of that cell at its baseline's revision
    that the search fetched (the baseline row included): all of the cell's results there outside run
    ``run_id`` and confirmation runs (before ``before_run``, when given)."""
    missing = set(cells)
    found: dict[Cell, Any] = {}
    fetched: dict[tuple[Cell, str], list[Any]] = defaultdict(list)
    anc = ancestors(conn, start, 4, include_self)
    deep = False
    i, size = 0, 1
    while missing:
        if i >= len(anc):
            if deep or not anc or anc[-1][1] < 4:
                break
            seen = {sha for sha, _ in anc}
            anc = anc + [a for a in ancestors(conn, start, max_depth, include_self) if a[0] not in seen]
            deep = True
            continue
        chunk = anc[i:i + size]
        depth = dict(chunk)
        i, size = i + size, size * 4
        params = {"shas": list(depth), "run_id": run_id, "before_run": before_run}
        best: dict[Cell, Any] = {}
        for r in conn.execute(_Q["chunk" if before_run is None else "chunk_before"], params).all():
            c = _lead_cell(r)
            if c not in missing:
                continue
            fetched[c, r.revision_sha].append(r)
            cur = best.get(c)
            if cur is None or (depth[r.revision_sha], -r.id) < (depth[cur.revision_sha], -cur.id):
                best[c] = r
        found.update(best)
        missing -= set(best)
    return found, {c: fetched[c, r.revision_sha] for c, r in found.items()}


def _history(conn: Connection, run: Any, triggers: Sequence[str], limit: int,
             cells: Sequence[Cell] | None = None) -> dict[Cell, list[Any]]:
    """Results of the run's cells (or of ``cells`` only) in the last ``limit`` runs with one of ``triggers``
    before it, oldest first; on the branch of the run's revision when it has one (else any branch).  One
    statement: the branch and the run ids are subqueries."""
    if limit <= 0 or (cells is not None and not cells):
        return {}
    wanted = None if cells is None else set(cells)
    params = {"run_id": run.id, "sha": run.revision_sha, "triggers": list(triggers), "limit": limit,
              "models": sorted({c[0] for c in wanted or ()})}
    out: dict[Cell, list[Any]] = defaultdict(list)
    for r in conn.execute(_Q["history" if wanted is None else "history_of_models"], params).all():
        c = _lead_cell(r)
        if wanted is None or c in wanted:
            out[c].append(r)
    return out


def flaky_reason(cell: Cell, statuses: Sequence[str], th: Thresholds) -> str | None:
    """Why a cell counts as flaky (allowlist, or pass flips within the window), or None."""
    if th.allowlisted(cell):
        return "flaky (allowlisted)"
    window = [s == "pass" for s in statuses[-th.flaky_window:]]
    flips = count_flips(window)
    if flips >= th.flaky_flips:
        return f"flaky ({flips} pass/fail flips in last {len(window)} results)"
    return None


def nightly_latency(series: Sequence[Any], cur: Any, th: Thresholds) -> tuple[Finding, int] | None:
    """Change-point finding over a nightly p50 series (same fingerprint as ``cur``), with the id of the
    last reference result; None without enough history or without ``nightly_consecutive`` violations."""
    pts = [r for r in series if r.env_fingerprint == cur.env_fingerprint and r.latency_p50_ms]
    if cur.latency_p50_ms is None or len(pts) < th.nightly_min_history + th.nightly_consecutive - 1:
        return None
    values = [r.latency_p50_ms for r in pts] + [cur.latency_p50_ms]
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


def detect_run(store: Store, run_id: int, thresholds: Thresholds | None = None) -> list[RegressionInfo]:
    """Detect, store and return the findings of ``run_id`` (see the module docstring): the run's stored
    findings as :meth:`Store.regressions` lists them, read in the transaction that stored them."""
    th = thresholds or store.thresholds or Thresholds()
    with store.transaction() as conn:
        run = store.run_row(conn, run_id)
        current = {_lead_cell(r): r for r in conn.execute(_Q["current"], {"run_id": run_id}).all()}
        if current:
            _detect(conn, store, run, current, th)
        return [regression_info(r) for r in conn.execute(_Q["findings"], {"run_id": run_id})]


def _detect(conn: Connection, store: Store, run: Any, current: dict[Cell, Any], th: Thresholds) -> None:
    if run.trigger in ("bisect", "confirm"):
        _store_findings(conn, run.id, [])  # drops open findings stored by older versions
        return
    nightly = run.trigger == "nightly"
    cells = sorted(current)
    base, at_base = _baselines(conn, run, cells, th)
    nightly_hist = (_history(conn, run, ("nightly",), th.nightly_window + th.nightly_consecutive)
                    if nightly else {})
    already_open = _open_kinds(conn, run.id) if nightly else set()
    now = store.clock()
    suspect = confirmation_pairs(run) > 0  # timing regressions wait for their confirmation run
    # confirmed before they count, timing regressions are screened at suspect_p (a 20 % slower model on a
    # busy machine gave p = 0.007 and p = 0.051 against a 0.002 limit); anything else stays at the rules' limits
    screen = replace(th, latency_p=max(th.latency_p, th.suspect_p),
                     convert_time_p=max(th.convert_time_p, th.suspect_p)) if suspect else th
    strict = {"latency": th.latency_p, "conversion_time": th.convert_time_p}

    # the push path's chunk queries fetched every result at each baseline's revision: the pools come from
    # those rows (no second query); a nightly search stops at earlier runs, its pools do not
    pools = _baseline_pools(conn, run.id, base, th.latency_pool, None if nightly else at_base)
    samples = _Samples()
    kinds = tuple(k for k in PAIRWISE_KINDS if not (nightly and k == "latency"))
    found: list[tuple[Cell, Any, list[tuple[Finding, int | None, str | None]]]] = []
    for cell in cells:
        cur = current[cell]
        findings: list[tuple[Finding, int | None, str | None]] = []
        if cell in base:
            b = base[cell]
            base_sample = pooled(samples(b), pools.get(cell, []))
            findings += [(f, b.id, b.revision_sha) for f in compare_cells(base_sample, samples(cur), screen, cell[0],
                                                                          cell[1], kinds)]
        if nightly:
            got = nightly_latency(nightly_hist.get(cell, []), cur, th)
            if got is not None:
                findings.append((got[0], got[1], None))
        if findings:
            found.append((cell, cur, findings))
    drifts = _drifts(conn, run, current, {c: fs for c, _, fs in found}, screen, samples)
    for cell, drift_finding in drifts.items():
        got = next((fs for c, _, fs in found if c == cell), None)
        if got is None:
            found.append((cell, current[cell], [drift_finding]))
        else:
            got.append(drift_finding)
    # the lineage only decides whether a finding is flaky: read for the cells that have one
    lineage = _history(conn, run, LINEAGE_TRIGGERS, th.flaky_window - 1, [cell for cell, _, _ in found])
    rows: list[dict[str, Any]] = []
    for cell, cur, findings in found:
        flaky = flaky_reason(cell, [r.status for r in lineage.get(cell, [])] + [cur.status], th)
        loss = next((f for f, _, _ in findings if f.kind == "coverage" and f.category == "regression"), None)
        for f, base_id, base_sha in findings:
            if nightly and f.category == "regression" and (cell, f.kind) in already_open:
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
            rows.append({"run_id": run.id, "revision_sha": run.revision_sha, "baseline_sha": base_sha,
                         "model": cell[0], "dtype": cell[1], "policy": cell[2], "target": cell[3],
                         "kind": f.kind, "category": category, "severity": f.severity, "metric": f.metric,
                         "baseline_value": f.baseline_value, "value": f.value, "delta": f.delta,
                         "ratio": f.ratio, "p_value": f.p_value, "detail": detail, "result_id": cur.id,
                         "baseline_result_id": base_id, "created_at": now, "state": state,
                         "state_by": "ampci" if note else None, "state_note": note[:2000] if note else None})
    _store_findings(conn, run.id, rows)
    if run.trigger in LINEAGE_TRIGGERS:
        _resolve(conn, run, current, th, now, suspect, {(r["model"], r["dtype"], r["policy"], r["target"]):
                                                        r["baseline_sha"] for r in rows if r["state"] == "suspected"},
                 samples)


def _drifts(conn: Connection, run: Any, current: Mapping[Cell, Any],
            pairwise: Mapping[Cell, Sequence[tuple[Finding, int | None, str | None]]], th: Thresholds,
            samples: Callable[[Any], CellSample]) -> dict[Cell, tuple[Finding, int | None, str | None]]:
    """The drift finding of each cell of the run that has one (:mod:`service.regressions.drift`), with its
    reference's result id and revision.  Three small queries for the whole run: the first-parent line of its
    revision, the cells' results on it, the earlier findings on it; flaky cells are left to the flaky rule."""
    line = first_parent_line(conn, run.revision_sha, th.drift_line_depth)
    depth = dict(line)
    by_cell: dict[Cell, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    for r in conn.execute(_Q["chunk"], {"shas": [s for s, d in line if d > 0], "run_id": run.id}).all():
        by_cell[_lead_cell(r)][r.revision_sha].append(r)
    if not by_cell:
        return {}
    branch = conn.execute(sa.select(t_rev.c.branch).where(t_rev.c.sha == run.revision_sha)).scalar()
    pinned = pins.pin_for(conn, branch=branch)
    earlier = conn.execute(sa.select(*(t_reg.c[k] for k in ("model", "dtype", "policy", "target", "kind",
                                                             "metric", "revision_sha", "state")))
                           .where(t_reg.c.run_id < run.id, t_reg.c.category == "regression",
                                  t_reg.c.state != "resolved", t_reg.c.revision_sha.in_(list(depth)),
                                  _same_cell(t_reg, run.id))).all()
    tipping = run.trigger != "nightly"
    out: dict[Cell, tuple[Finding, int | None, str | None]] = {}
    for cell, rows_by_sha in by_cell.items():
        lineage = [r.status for sha in sorted(rows_by_sha, key=lambda x: -depth[x]) for r in rows_by_sha[sha]]
        if flaky_reason(cell, [*lineage, current[cell].status], th) is not None:
            continue

        def point(sha: str) -> Point:
            rows = sorted(rows_by_sha[sha], key=lambda r: -r.id)  # noqa: B023 - used in this iteration only
            return Point(sha, depth[sha], rows[0].id, pooled(samples(rows[0]), [samples(r) for r in rows[1:]]))

        measured = sorted(rows_by_sha, key=lambda x: depth[x])[:th.drift_window]
        history = [point(sha) for sha in reversed(measured)]
        pin = point(pinned) if pinned in rows_by_sha else None
        done = [Earlier(source_kind(e.kind, e.metric), depth[e.revision_sha], e.state) for e in earlier
                if _cell(e) == cell]

        kinds_found = {source_kind(f.kind, f.metric) for f, _, _ in pairwise.get(cell, ()) if f.category == "regression"}
        cur = current[cell]
        got = judge(cell, history, Point(run.revision_sha, 0, cur.id, samples(cur)), th, pin=pin, tipping=tipping,
                    pairwise_kinds=kinds_found, earlier=done)
        if got is None:
            continue
        if timing_kind(got.finding.kind, got.finding.metric) and kinds_found & set(TIMING_KINDS):
            continue  # one confirmation job per cell times one baseline: the parent's suspicion goes first
        out[cell] = (got.finding, got.reference.result_id, got.reference.sha)
    return out


class _Samples:
    """:func:`sample` of result rows, each result's document parsed once per detection (by result id)."""

    def __init__(self) -> None:
        self._by_id: dict[int, CellSample] = {}

    def __call__(self, row: Any) -> CellSample:
        """The CellSample of ``row`` (a SAMPLE_COLS row), built on its first request."""
        got = self._by_id.get(row.id)
        if got is None:
            got = self._by_id[row.id] = sample(row)
        return got


def _baseline_pools(conn: Connection, run_id: int, base: Mapping[Cell, Any], limit: int,
                    at_base: Mapping[Cell, Sequence[Any]] | None = None) -> dict[Cell, list[CellSample]]:
    """For each baseline result in ``base``, up to ``limit - 1`` more results of the same cell at the same
    revision (newest first, run ``run_id``, confirmation runs and the baseline result itself excluded), as
    samples to pool with it (:func:`service.regressions.rules.pooled` keeps those of the same environment
    only).  ``at_base``: those results already fetched (each cell's rows at its baseline's revision, as
    :func:`_nearest` returns them), taken instead of a query; only rows that are pooled are parsed."""
    if limit <= 1 or not base:
        return {}
    if at_base is not None:
        out_rows = {c: sorted((r for r in at_base.get(c, ()) if r.id != b.id), key=lambda r: -r.id)[:limit - 1]
                    for c, b in base.items()}
        return {c: [sample(r) for r in rs] for c, rs in out_rows.items() if rs}
    shas = {b.revision_sha for b in base.values()}
    used = {b.id for b in base.values()}
    q = (sa.select(*SAMPLE_COLS).where(t_res.c.revision_sha.in_(shas), t_res.c.run_id != run_id,
                                       _same_cell(t_res, run_id), NOT_CONFIRMATION).order_by(t_res.c.id.desc()))
    out: dict[Cell, list[CellSample]] = defaultdict(list)
    for r in conn.execute(q):
        c = _cell(r)
        b = base.get(c)
        if b is None or r.id in used or r.revision_sha != b.revision_sha or len(out[c]) >= limit - 1:
            continue
        out[c].append(sample(r))
    return out


def _baselines(conn: Connection, run: Any, cells: Sequence[Cell],
               th: Thresholds) -> tuple[dict[Cell, Any], dict[Cell, list[Any]]]:
    """The baseline result of each of ``cells`` (see the module docstring; cells without one are absent),
    and the rows fetched at each baseline's revision (:func:`_nearest`)."""
    nightly = run.trigger == "nightly"
    start, include_self = (run.baseline_sha, True) if run.baseline_sha else (run.revision_sha, nightly)
    return _nearest(conn, start, include_self, run.id, list(cells), th.ancestor_depth, run.id if nightly else None)


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
        cells = sorted({_cell(r) for r in conn.execute(sa.select(*CELL).where(t_res.c.run_id == run_id))})
        if not cells:
            return {}
        return {c: (r.revision_sha, r.status) for c, r in _baselines(conn, run, cells, th)[0].items()}


def cells_with_results(store: Store, sha: str) -> set[Cell]:
    """The cells that have at least one result at revision ``sha`` (any run)."""
    with store.transaction() as conn:
        return {_cell(r) for r in conn.execute(sa.select(*CELL).distinct().where(t_res.c.revision_sha == sha))}


def _open_kinds(conn: Connection, run_id: int) -> set[tuple[Cell, str]]:
    rows = conn.execute(sa.select(t_reg.c.model, t_reg.c.dtype, t_reg.c.policy, t_reg.c.target, t_reg.c.kind)
                        .where(t_reg.c.run_id < run_id, t_reg.c.category == "regression",
                               t_reg.c.state.in_(("open", "acknowledged")), _same_cell(t_reg, run_id)))
    return {(_cell(r), r.kind) for r in rows}


#: Up to this many findings, the stale ones are deleted by one statement naming the findings kept (6 bound
#: values each: far below PostgreSQL's 65,535 and SQLite's 32,766); a larger run selects its stale ids first.
DELETE_KEYS_MAX = 1000


def _store_findings(conn: Connection, run_id: int, rows: list[dict[str, Any]]) -> None:
    """Store ``rows`` as the findings of run ``run_id``: its open or suspected findings not among them (by
    cell, kind and category) are deleted, the others inserted or updated, keeping state a human set."""
    key_cols = _KEY_COLS
    wanted = sorted({tuple(r[k] for k in key_cols) for r in rows})
    if len(wanted) <= DELETE_KEYS_MAX:  # one statement, no select first
        conn.execute(_Q["delete_stale"], {"run_id": run_id, "keys": wanted})
    else:
        kept = set(wanted)
        stale = [r.id for r in conn.execute(sa.select(t_reg.c.id, *(t_reg.c[k] for k in key_cols))
                                            .where(t_reg.c.run_id == run_id, t_reg.c.state.in_(DETECTED_STATES)))
                 if tuple(r[1:]) not in kept]
        if stale:
            conn.execute(t_reg.delete().where(t_reg.c.id.in_(stale)))
    if not rows:
        return
    conn.execute(_upsert(conn), rows)


_UPSERTS: dict[str, Any] = {}


def _upsert(conn: Connection) -> Any:
    """The findings' upsert for the connection's dialect: on a finding already stored (same run, cell, kind and
    category) its values are updated and its state, creation time and resolution kept.  Built once per dialect
    (``excluded`` copies every column of ``regressions`` when made)."""
    stmt = _UPSERTS.get(conn.dialect.name)
    if stmt is None:
        ins = dialect_insert(conn, t_reg)
        keep = {"run_id", *_KEY_COLS, "state", "created_at"}
        stmt = _UPSERTS[conn.dialect.name] = ins.on_conflict_do_update(
            index_elements=[t_reg.c.run_id, *(t_reg.c[k] for k in _KEY_COLS)],
            set_={c.name: ins.excluded[c.name] for c in t_reg.c if c.name not in keep and c.name != "id"
                  and not c.name.startswith("state") and c.name != "resolved_by_result_id"})
    return stmt


def _resolve(conn: Connection, run: Any, current: dict[Cell, Any], th: Thresholds, now: Any,
             suspect: bool = False, suspected_cells: Mapping[Cell, str] | None = None,
             samples: Callable[[Any], CellSample] = sample) -> None:
    """Resolve the earlier regressions this run no longer shows (see the module docstring).

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
    open_regs = conn.execute(_Q["open_regressions"], {"run_id": run.id}).all()
    if not open_regs:  # the usual case: no walk of the whole ancestry (11 ms of 200 revisions)
        return
    # only a revision that contains the regressed one (itself or a descendant) can resolve it: a run of
    # an older or unrelated revision says nothing about whether the change that regressed is fixed
    contains = {sha for sha, _ in ancestors(conn, run.revision_sha, th.ancestor_depth, include_self=True)}
    open_regs = [r for r in open_regs if r.revision_sha in contains]
    if not open_regs:
        return
    ids = {r.baseline_result_id for r in open_regs} | {r.result_id for r in open_regs if r.result_id is not None}
    rows = {r.id: r for r in conn.execute(sa.select(*SAMPLE_COLS).where(t_res.c.id.in_(ids)))}
    for reg in open_regs:
        b, cur, bad = rows.get(reg.baseline_result_id), current[_cell(reg)], rows.get(reg.result_id)
        kind = source_kind(reg.kind, reg.metric)  # a drift resolves by its metric's rule against its reference
        if b is None or not returned_to_baseline(kind, samples(b), samples(cur), th, reg.model, reg.dtype,
                                                 samples(bad) if bad is not None else None):
            continue
        cell = _cell(reg)
        if suspect and kind in TIMING_KINDS:
            if recovering.setdefault(cell, reg.revision_sha) != reg.revision_sha \
                    or reg.revision_sha == run.revision_sha:
                continue  # its confirmation job is taken (or there is nothing to time against): stays as it is
            conn.execute(t_reg.update().where(t_reg.c.id == reg.id).values(
                state=SUSPECTED_RESOLVED, state_before=reg.state, state_by="ampci", state_at=now,
                resolved_by_result_id=cur.id,
                state_note=f"recovery suspected at {run.revision_sha[:12]} (run {run.id}): awaiting its "
                           f"confirmation against {reg.revision_sha[:12]} timed interleaved"))
            continue
        conn.execute(t_reg.update().where(t_reg.c.id == reg.id).values(
            state="resolved", state_by="ampci", state_at=now, resolved_by_result_id=cur.id,
            state_note=f"returned to baseline at {run.revision_sha[:12]} (run {run.id})"))
