"""Bisection of a regression to its first bad commit, ``asv find`` style.

Given a stored regression of cell C found at revision R against baseline B, the commits between
them come from the first-parent links of the revisions table.  Each step classifies every
commit on that path from the stored results of C (newest result per revision):

- ``good``: comparable with the baseline result and no regression of the same kind;
- ``bad``: the same kind of regression against the baseline result (for a ``conversion``
  regression: the same failing status as at R);
- ``skip``: the revision could not be judged — it failed to build/convert (for non-conversion
  kinds), failed in another way, its convergence errors are in another unit than the baseline's
  and neither diverged (unless the regression is the divergence itself, judged by the diverged
  status alone), or a finished bisect run left no result.  Skipped revisions are never blamed;
- ``pending``: a bisect run for it is queued/running; ``untested``: nothing yet.

The interval is (last good before the first bad, first bad].  When no testable commit is left
inside it, the first bad commit is found (listing skipped commits that might also be it);
otherwise the midpoint (or ``parallel`` evenly spaced points) of the untested commits inside it
are created as ``bisect`` runs of the one cell, with dedup keys ``bisect:<sha>:<cell>`` so that
repeated steps never duplicate work, and handed to ``enqueue(run_id)`` when given (the scheduler
owns dispatch).  Call :func:`bisect_step` again when those runs finish — or let
:func:`continue_bisection` do it: the scheduler calls it whenever a run finishes, so a bisection
advances by itself until the first bad commit is found (and, with ``AMPCI_AUTO_BISECT``, starts by
itself when a ``push``/``nightly`` run finds a regression).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from service.db.records import Cell, RegressionInfo
from service.db.store import Store
from service.errors import UserError
from service.regressions.findings import CellSample
from service.regressions.kinds.registry import kind as finding_kind
from service.regressions.thresholds import Thresholds

Enqueue = Callable[[int], object]
AUTO_START_TRIGGERS = ("push", "nightly")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BisectState:
    """Where a bisection stands after one step."""

    regression_id: int
    cell: Cell
    kind: str
    status: str                      # found | queued | waiting
    good: str                        # last known good revision
    bad: str                         # first known bad revision
    first_bad: str | None = None
    remaining: int = 0               # testable commits left strictly between good and bad
    skipped: tuple[str, ...] = ()
    queued_runs: tuple[int, ...] = ()
    pending: tuple[str, ...] = ()
    verdicts: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        """One line for people."""
        cell = "/".join(self.cell)
        if self.status == "found":
            extra = f" (or one of skipped {', '.join(s[:10] for s in self.skipped)})" if self.skipped else ""
            return f"regression {self.regression_id} [{self.kind} {cell}]: first bad commit {self.bad[:12]}{extra}"
        if self.status == "queued":
            return (f"regression {self.regression_id} [{self.kind} {cell}]: {self.remaining} commits between "
                    f"{self.good[:10]}..{self.bad[:10]}; queued bisect runs {', '.join(map(str, self.queued_runs))}")
        return (f"regression {self.regression_id} [{self.kind} {cell}]: waiting for "
                f"{', '.join(s[:10] for s in self.pending)} ({self.remaining} commits between "
                f"{self.good[:10]}..{self.bad[:10]})")

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return {"regression_id": self.regression_id, "cell": list(self.cell), "kind": self.kind,
                "status": self.status, "good": self.good, "bad": self.bad, "first_bad": self.first_bad,
                "remaining": self.remaining, "skipped": list(self.skipped), "queued_runs": list(self.queued_runs),
                "pending": list(self.pending), "verdicts": dict(self.verdicts)}


def classify(kind: str, base: CellSample, regressed: CellSample, cand: CellSample, th: Thresholds,
             model: str, dtype: str) -> str:
    """``good``/``bad``/``skip`` for a candidate result (pure; see the module docstring): the kind's own
    bisection (:meth:`FindingKind.classify <service.regressions.kinds.base.FindingKind.classify>`);
    :class:`~service.regressions.kinds.registry.UnknownKind` for a kind that is not registered."""
    return finding_kind(kind).classify(base, regressed, cand, th, model, dtype)


def dedup_key(sha: str, cell: Cell) -> str:
    """The dedup key of the bisect run of ``cell`` at ``sha``."""
    return f"bisect:{sha}:{'/'.join(cell)}"


def pick(candidates: list[int], parallel: int) -> list[int]:
    """``parallel`` evenly spaced indices out of sorted ``candidates`` (the midpoint for 1)."""
    n = len(candidates)
    k = max(1, min(parallel, n))
    return sorted({candidates[(i + 1) * n // (k + 1)] for i in range(k)})


def bisect_step(store: Store, regression_id: int, enqueue: Enqueue | None = None, parallel: int = 1,
                thresholds: Thresholds | None = None) -> BisectState:
    """Advance the bisection of one regression by one step (idempotent; see the module docstring)."""
    from service.regressions.detect import sample

    th = thresholds or Thresholds()
    reg = store.get_regression(regression_id)
    if reg.baseline_sha is None or reg.baseline_result_id is None or reg.result_id is None:
        raise UserError(f"regression {regression_id} has no baseline revision/result to bisect against")
    path = store.first_parent_path(reg.revision_sha, reg.baseline_sha)
    rows = cell_samples(store, reg, path)
    base, regressed = rows.get(reg.baseline_result_id), rows.get(reg.result_id)
    if base is None or regressed is None:
        raise UserError(f"regression {regression_id}: its baseline or regressed result is gone")
    newest = newest_by_revision(rows.values(), reg)
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
    hi = min(i for i, v in verdict.items() if v == "bad")
    lo = max(i for i, v in verdict.items() if v == "good" and i < hi)
    inside = [i for i in range(lo + 1, hi) if verdict.get(i) != "skip"]
    skipped = tuple(path[i] for i in range(lo + 1, hi) if verdict.get(i) == "skip")
    named = {path[i]: v for i, v in sorted(verdict.items())}
    common = dict(regression_id=regression_id, cell=reg.cell, kind=reg.kind, good=path[lo], bad=path[hi],
                  remaining=len(inside), skipped=skipped, verdicts=named)
    if not inside:
        return BisectState(status="found", first_bad=path[hi], **common)  # type: ignore[arg-type]
    waiting = [i for i in inside if i in pending]
    if waiting:
        return BisectState(status="waiting", pending=tuple(path[i] for i in waiting), **common)  # type: ignore[arg-type]
    queued = []
    meta = {"regression_id": regression_id, "parallel": parallel,
            "options": {"|".join(reg.cell): regressed_options(store, reg)}}
    for i in pick(inside, parallel):
        run_id, created = store.create_run_if_new(
            path[i], "bisect", baseline_sha=reg.baseline_sha, sweep="bisect", cells=[reg.cell],
            dedup_key=dedup_key(path[i], reg.cell), meta=meta)
        queued.append(run_id)
        if created and enqueue is not None:
            enqueue(run_id)
    return BisectState(status="queued", queued_runs=tuple(queued), **common)  # type: ignore[arg-type]


def regressed_options(store: Store, reg: RegressionInfo) -> dict[str, object]:
    """The sweep options (repeats, timeout, …) the regressed run used for the regression's cell, so each
    midpoint is measured the way the regression was."""
    meta = store.get_run(reg.run_id).meta or {}
    return dict(meta.get("options", {}).get("|".join(reg.cell), meta.get("cell_defaults", {})))


def continue_bisection(store: Store, run_id: int, enqueue: Enqueue | None, auto_start: bool = False,
                       thresholds: Thresholds | None = None) -> list[BisectState]:
    """After run ``run_id`` finished: advance the bisections it belongs to by one step each.

    - a ``bisect`` run advances the bisection of the regression named in its meta (while that
      regression is open or acknowledged), with the ``parallel`` it was created with;
    - with ``auto_start``, a ``push``/``nightly`` run starts the bisection of each of its open
      regressions (one that has no untested commits between baseline and revision is found at once
      and queues nothing).

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


def cell_samples(store: Store, reg: RegressionInfo, path: list[str]) -> dict[int, object]:
    """Result rows (SAMPLE_COLS) of the regression's cell at the path's revisions, plus its two results."""
    import sqlalchemy as sa

    from service.regressions.detect import SAMPLE_COLS, t_res

    with store.transaction() as conn:
        q = sa.select(*SAMPLE_COLS).where(
            t_res.c.model == reg.model, t_res.c.dtype == reg.dtype, t_res.c.policy == reg.policy,
            t_res.c.target == reg.target,
            sa.or_(t_res.c.revision_sha.in_(path), t_res.c.id.in_((reg.result_id, reg.baseline_result_id))))
        return {r.id: r for r in conn.execute(q)}


def newest_by_revision(rows: object, reg: RegressionInfo) -> dict[str, object]:
    """The newest row (highest id) per revision sha among ``rows`` (rows of :func:`cell_samples`)."""
    out: dict[str, object] = {}
    for r in sorted(rows, key=lambda r: r.id):  # type: ignore[attr-defined, arg-type]
        out[r.revision_sha] = r  # type: ignore[attr-defined]
    return out
