"""Driving a bisection over the store (the verdicts and the interval: :mod:`service.regressions.bisect`).

:func:`bisect_step` judges every commit of the regression's first-parent path from the stored results of its
cell and creates the next midpoint ``bisect`` runs (deduplicated by key, handed to ``enqueue``);
:func:`continue_bisection` calls it whenever a run finishes, so a bisection advances by itself.

A regression found in a run that tests its webhook's own repository (``meta.pass_repo``: ``AMPCI_PASS_REPO``
unset, the repository reachable only by its clone URL) is bisected in that repository: its midpoint runs name
the same repository, and before its bisection starts the regressed revision's first-parent history is read
from that repository with git (:func:`record_run_ancestry`), so the path walked is git's (a push payload gives
no parents: a push run's history is read the same way before it is judged).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from service.db import series
from service.db.records import RegressionInfo
from service.db.store import Store
from service.errors import UserError
from service.json_types import JsonObject
from service.orchestration.pass_repo import PASS_REPO, pass_repo_of
from service.orchestration.pass_repo import record_run_ancestry as record_run_ancestry  # re-exported
from service.regressions.bisect import (
    AUTO_START_TRIGGERS,
    BisectState,
    classify,
    dedup_key,
    interval,
    newest_by_revision,
    pick,
)
from service.regressions.stored import StoredResult, sample
from service.regressions.thresholds import Thresholds
from service.settings import Settings

Enqueue = Callable[[int], object]
log = logging.getLogger(__name__)


def bisect_step(store: Store, regression_id: int, enqueue: Enqueue | None = None, parallel: int = 1,
                thresholds: Thresholds | None = None) -> BisectState:
    """Advance the bisection of one regression by one step (idempotent; see :mod:`service.regressions.bisect`).
    Its midpoint runs test the regressed run's pass repository (its :data:`PASS_REPO` entry, when it names one)."""
    th = thresholds or Thresholds()
    reg = store.get_regression(regression_id)
    if reg.baseline_sha is None or reg.baseline_result_id is None or reg.result_id is None:
        raise UserError(f"regression {regression_id} has no baseline revision/result to bisect against")
    path = store.first_parent_path(reg.revision_sha, reg.baseline_sha)
    rows = cell_samples(store, reg, path)
    base, regressed = rows.get(reg.baseline_result_id), rows.get(reg.result_id)
    if base is None or regressed is None:
        raise UserError(f"regression {regression_id}: its baseline or regressed result is gone")
    newest = newest_by_revision(rows.values())
    verdict: dict[int, str] = {0: "good", len(path) - 1: "bad"}
    pending: list[int] = []
    for i in range(1, len(path) - 1):
        row = newest.get(path[i])
        if row is not None:
            verdict[i] = classify(reg.kind, sample(base), sample(regressed), sample(row), th, reg.model, reg.dtype)
            continue
        run = store.find_run(dedup_key(path[i], reg.cell))
        if run is not None:
            if run.status in ("queued", "running"):
                pending.append(i)
            else:
                verdict[i] = "skip"
    lo, hi, inside, skipped = interval(path, verdict)
    named = {path[i]: v for i, v in sorted(verdict.items())}
    common = dict(regression_id=regression_id, cell=reg.cell, kind=reg.kind, good=path[lo], bad=path[hi],
                  remaining=len(inside), skipped=skipped, verdicts=named)
    if not inside:
        return BisectState(status="found", first_bad=path[hi], **common)  # type: ignore[arg-type]
    waiting = [i for i in inside if i in pending]
    if waiting:
        return BisectState(status="waiting", pending=tuple(path[i] for i in waiting), **common)  # type: ignore[arg-type]
    queued = []
    regressed_meta = store.get_run(reg.run_id).meta or {}
    source = pass_repo_of(regressed_meta)
    meta = {"regression_id": regression_id, "parallel": parallel,
            "options": {"|".join(reg.cell): regressed_options(store, reg, regressed_meta)},
            **({PASS_REPO: source} if source is not None else {})}  # the midpoints: the same repository
    for i in pick(inside, parallel):
        run_id, created = store.create_run_if_new(
            path[i], "bisect", baseline_sha=reg.baseline_sha, sweep="bisect", cells=[reg.cell],
            dedup_key=dedup_key(path[i], reg.cell), meta=meta)
        queued.append(run_id)
        if created and enqueue is not None:
            enqueue(run_id)
    return BisectState(status="queued", queued_runs=tuple(queued), **common)  # type: ignore[arg-type]


def regressed_options(store: Store, reg: RegressionInfo, meta: JsonObject | None = None) -> dict[str, object]:
    """The sweep options (repeats, timeout, …) the regressed run used for the regression's cell (its ``meta``,
    read from the store when not given), so each midpoint is measured the way the regression was."""
    meta = meta if meta is not None else (store.get_run(reg.run_id).meta or {})
    return dict(meta.get("options", {}).get("|".join(reg.cell), meta.get("cell_defaults", {})))


def continue_bisection(store: Store, run_id: int, enqueue: Enqueue | None, auto_start: bool = False,
                       thresholds: Thresholds | None = None, settings: Settings | None = None) -> list[BisectState]:
    """After run ``run_id`` finished: advance the bisections it belongs to by one step each.

    - a ``bisect`` run advances the bisection of the regression named in its meta (while that
      regression is open or acknowledged), with the ``parallel`` it was created with;
    - with ``auto_start``, a ``push``/``nightly`` run starts the bisection of each of its open
      regressions (one that has no untested commits between baseline and revision is found at once
      and queues nothing); with ``settings``, the run's revision's history is first read from the
      repository it tests when that is its webhook's own (:func:`record_run_ancestry`).

    New runs are handed to ``enqueue`` (None: they stay queued).  Idempotent and safe when several
    processes call it at once: bisect runs are deduplicated by key and only the caller that created
    a run enqueues it.  Never raises: a bisection that cannot go on is logged and left as it is.
    """
    th = thresholds if thresholds is not None else store.thresholds
    try:
        run = store.get_run(run_id)
        if run.trigger == "bisect":
            reg_id = run.meta.get("regression_id")
            if not isinstance(reg_id, int):
                return []
            steps = [(reg_id, int(run.meta.get("parallel") or 1))]
        elif auto_start and run.trigger in AUTO_START_TRIGGERS:
            steps = [(r.id, 1) for r in store.regressions(run_id=run_id, category="regression", state="open")
                     if r.baseline_sha is not None and r.baseline_result_id is not None]
            if steps and settings is not None:
                record_run_ancestry(settings, store, run_id)
        else:
            return []
    except Exception:  # noqa: BLE001 - finishing the run must not fail because of bisection
        log.exception("bisection after run %s: could not read the run", run_id)
        return []
    states = []
    for reg_id, parallel in steps:
        try:
            if store.get_regression(reg_id).state not in ("open", "acknowledged"):
                continue  # resolved or a false positive: nothing left to bisect
            state = bisect_step(store, reg_id, enqueue=enqueue, parallel=parallel, thresholds=th)
        except Exception as exc:  # noqa: BLE001 - e.g. the baseline is not a recorded first-parent ancestor
            log.warning("bisection of regression %s after run %s stopped: %s", reg_id, run_id, exc)
            continue
        log.info("after run %s: %s", run_id, state.describe())
        states.append(state)
    return states


def cell_samples(store: Store, reg: RegressionInfo, path: list[str]) -> dict[int, StoredResult]:
    """Results of the regression's cell at the path's revisions, plus its two results, by id."""
    with store.transaction() as conn:
        return series.cell_results(conn, cell=reg.cell, shas=path,
                                   ids=(i for i in (reg.result_id, reg.baseline_result_id) if i is not None))
