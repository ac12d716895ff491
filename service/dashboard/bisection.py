"""Where the bisection of a regression stands, read-only (the regression page shows it).

:func:`service.orchestration.bisection.bisect_step` advances a bisection and *creates* runs; a page must not.
This module applies the same classification (:func:`service.regressions.bisect.classify`, the same dedup keys
of bisect runs) to what is stored and reports the verdict per commit on the first-parent path
from the baseline to the regressed revision, without creating or queueing anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from service.db import series
from service.db.dashboard import bisect_runs
from service.db.records import RegressionInfo
from service.db.store import Store
from service.errors import NotFoundError
from service.regressions.bisect import classify, dedup_key, newest_by_revision
from service.regressions.stored import sample
from service.regressions.thresholds import Thresholds

MAX_PATH = 2000


@dataclass(frozen=True)
class CommitVerdict:
    """One commit on the path, oldest first: ``good``/``bad``/``skip``/``pending``/``untested``."""

    sha: str
    verdict: str
    run_id: int | None = None


@dataclass(frozen=True)
class BisectView:
    """The bisection of one regression: ``status`` is ``not_bisectable``, ``adjacent``, ``found`` or
    ``in_progress``; ``note`` says why in one line."""

    status: str
    note: str
    commits: list[CommitVerdict] = field(default_factory=list)
    good: str | None = None
    bad: str | None = None
    remaining: int = 0


def bisect_view(store: Store, reg: RegressionInfo, thresholds: Thresholds | None = None) -> BisectView:
    """The read-only bisection state of ``reg`` (see the module docstring)."""
    if reg.category != "regression":
        return BisectView("not_bisectable", f"a {reg.category} finding is not bisected")
    if reg.baseline_sha is None or reg.baseline_result_id is None or reg.result_id is None:
        return BisectView("not_bisectable", "no baseline revision/result to bisect against")
    try:
        path = store.first_parent_path(reg.revision_sha, reg.baseline_sha, max_len=MAX_PATH)
    except NotFoundError as exc:
        return BisectView("not_bisectable", f"commits between baseline and revision unknown: {exc}")
    if len(path) <= 2:
        return BisectView("adjacent", "the baseline is the parent: this revision is the first bad commit",
                          [CommitVerdict(path[0], "good"), CommitVerdict(path[-1], "bad", reg.run_id)],
                          path[0], path[-1])
    th = thresholds or Thresholds()
    with store.transaction() as conn:
        rows = series.cell_results(conn, cell=reg.cell, shas=path, ids=(reg.result_id, reg.baseline_result_id))
    base, regressed = rows.get(reg.baseline_result_id), rows.get(reg.result_id)
    if base is None or regressed is None:
        return BisectView("not_bisectable", "its baseline or regressed result is gone")
    newest = newest_by_revision(rows.values())
    runs = bisect_runs(store, [dedup_key(sha, reg.cell) for sha in path[1:-1]])
    commits = [CommitVerdict(path[0], "good", getattr(newest.get(path[0]), "run_id", None))]
    for sha in path[1:-1]:
        row = newest.get(sha)
        run = runs.get(dedup_key(sha, reg.cell))
        if row is not None:
            verdict = classify(reg.kind, sample(base), sample(regressed), sample(row), th, reg.model, reg.dtype)
            commits.append(CommitVerdict(sha, verdict, row.run_id))
        elif run is not None:
            commits.append(CommitVerdict(sha, "pending" if run.status in ("queued", "running") else "skip", run.id))
        else:
            commits.append(CommitVerdict(sha, "untested"))
    commits.append(CommitVerdict(path[-1], "bad", reg.run_id))
    hi = min(i for i, c in enumerate(commits) if c.verdict == "bad")
    lo = max(i for i, c in enumerate(commits) if c.verdict == "good" and i < hi)
    inside = [c for c in commits[lo + 1:hi] if c.verdict != "skip"]
    if not inside:
        skipped = [c.sha[:10] for c in commits[lo + 1:hi]]
        extra = f" (or one of the skipped {', '.join(skipped)})" if skipped else ""
        return BisectView("found", f"first bad commit {commits[hi].sha[:12]}{extra}", commits,
                          commits[lo].sha, commits[hi].sha)
    pending = sum(c.verdict == "pending" for c in inside)
    note = (f"{len(inside)} commits left between {commits[lo].sha[:10]} (good) and {commits[hi].sha[:10]} (bad)"
            + (f"; {pending} bisect runs pending" if pending else f"; `ampci bisect --run {reg.run_id} --regression {reg.id}` queues the next step"))
    return BisectView("in_progress", note, commits, commits[lo].sha, commits[hi].sha, len(inside))
