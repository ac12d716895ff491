"""Bisection of a regression to its first bad commit, ``asv find`` style: the pure part (each commit's verdict,
the interval left, the midpoints); :mod:`service.orchestration.bisection` drives it over the store.

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
owns dispatch).  Call :func:`~service.orchestration.bisection.bisect_step` again when those runs finish — or let
:func:`~service.orchestration.bisection.continue_bisection` do it: the scheduler calls it whenever a run finishes, so a bisection
advances by itself until the first bad commit is found (and, with ``AMPCI_AUTO_BISECT``, starts by
itself when a ``push``/``nightly`` run finds a regression).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from service.regressions.findings import CellSample
from service.regressions.kinds.registry import kind as finding_kind
from service.regressions.stored import Cell, StoredResult
from service.regressions.thresholds import Thresholds

AUTO_START_TRIGGERS = ("push", "nightly")


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


def interval(path: list[str], verdict: dict[int, str]) -> tuple[int, int, list[int], tuple[str, ...]]:
    """Over ``path`` (the first-parent path from the baseline, index 0, to the regressed revision) and the
    verdict of each index judged so far (``good``/``bad``/``skip``; the two ends included): ``(lo, hi, inside,
    skipped)``: the last good index before the first bad one, that first bad index, the indices between them
    not skipped (judged or not), and the revisions between them that were skipped."""
    hi = min(i for i, v in verdict.items() if v == "bad")
    lo = max(i for i, v in verdict.items() if v == "good" and i < hi)
    inside = [i for i in range(lo + 1, hi) if verdict.get(i) != "skip"]
    skipped = tuple(path[i] for i in range(lo + 1, hi) if verdict.get(i) == "skip")
    return lo, hi, inside, skipped


def newest_by_revision(results: Iterable[StoredResult]) -> dict[str, StoredResult]:
    """The newest result (highest id) per revision sha among ``results``."""
    out: dict[str, StoredResult] = {}
    for r in sorted(results, key=lambda r: r.id):
        out[r.revision_sha] = r
    return out
