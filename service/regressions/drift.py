"""Small steps add up: a run judged against an older reference of its cell, not only its parent.

Pure functions over a cell's history (plain samples; detection reads them: :mod:`service.regressions.detect`).
The history is the cell's measured revisions along the first-parent line of the run's revision, oldest first.
Two references are tried, in this order: the **pinned baseline** (``ampci baseline pin REV``) when it lies on
that line, and the start of the **lookback window** (the oldest of the last ``drift_window`` measured
revisions).  Against a reference, :func:`service.regressions.rules.drift_rule` applies every drift-judged
rule with its own limits (accuracy ratio and floor, coverage drops, casts growth, latency and conversion-time
ratio, floor and test, pass iterations).

A drift is **reported** when the rule finds a regression against the reference and:

- the parent comparison of this run shows no regression of that kind (the step is then reported itself);
- it is not reported yet: no *live* finding of the cell and that kind (a drift of its metric or the parent
  comparison's: open, acknowledged, suspected, a false positive; any state but ``resolved`` or
  ``dismissed``) stands at a revision after the reference on the line, this one included — once reported
  (and acknowledged, or marked a false positive) the same change does not fire again, while a drift
  dismissed by its confirmation (below the floor then) does not silence the larger one it grows into: that
  is judged anew, and confirmed like any timing finding;
- for a ``pull_request`` run (:data:`TIPPING_TRIGGERS`), besides, **its own change tipped it**: the parent
  (the newest measured revision before it) did not regress against the same reference by the same metric (a
  drift already over the limit on its base is the base line's to report, and must not fail the pull request;
  unless the parent's finding of that kind was dismissed by confirmation, so a borderline drift is not lost),
  and its own step moved the metric towards the drift (by at least half the mean step since the reference
  where a noise commit leaves the metric unchanged: see :func:`own_step`).  A ``push``, ``manual`` or
  ``nightly`` run reports any drift over the limit that is not reported yet, whichever commit tipped it: a
  push after one whose drift was dismissed (or never judged) is where it is caught, not only the nightly.

The finding names where the level moved: E-divisive means over the metric's series from the reference to
this run (:mod:`service.regressions.changepoint`), as "drifted x4.5 over 8 commits, since REV; level moved
between A and B" with a link to the cell's history page.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TypeAlias, overload
from urllib.parse import urlencode

from service.regressions.rules import (
    DRIFT_METRICS,
    TIMING_KINDS,
    CellSample,
    Finding,
    drift_rule,
    relative_latency,
)
from service.regressions.thresholds import Thresholds

Cell = tuple[str, str, str, str]


@dataclass(frozen=True)
class Point:
    """One measured revision of the cell's history: its sha, first-parent distance from the run's revision,
    the id of the result it stands for, and its sample (pooled over the results at that revision).

    The sample is built by ``load`` on first use and kept: :func:`judge` reads the samples of the reference,
    the parent and the run only, the window's other points only when a drift is described, so detection
    decodes 3 results' documents per cell, not the window's 16 (issue 42)."""

    sha: str
    depth: int
    result_id: int
    load: Callable[[], CellSample] = field(repr=False, compare=False)

    @cached_property
    def sample(self) -> CellSample:
        """``load()``, called once."""
        return self.load()

    @classmethod
    def of(cls, sha: str, depth: int, result_id: int, sample: CellSample) -> Point:
        """A point whose sample is already built."""
        return cls(sha, depth, result_id, lambda: sample)


_Slice: TypeAlias = "slice[int | None, int | None, int | None]"


class LazyHistory(Sequence[Point]):
    """A cell's history for :func:`judge`: the points of ``shas`` (oldest first), each made by ``make`` on first
    use and kept.  :func:`judge` reads the window's start and end (and its length), the other points only
    when a drift is described, so a run of 200 cells builds ~400 points, not the windows' 3,200."""

    def __init__(self, shas: Sequence[str], make: Callable[[str], Point]) -> None:
        self._shas, self._make = shas, make
        self._made: dict[int, Point] = {}

    def __len__(self) -> int:
        return len(self._shas)

    @overload
    def __getitem__(self, i: int) -> Point: ...
    @overload
    def __getitem__(self, i: _Slice) -> list[Point]: ...

    def __getitem__(self, i: int | _Slice) -> Point | list[Point]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self._shas)))]
        if i < 0:
            i += len(self._shas)
        if not 0 <= i < len(self._shas):
            raise IndexError(i)
        got = self._made.get(i)
        if got is None:
            got = self._made[i] = self._make(self._shas[i])
        return got


@dataclass(frozen=True)
class Earlier:
    """An earlier regression finding of the cell on the run's first-parent line: the kind whose rule judged it
    (a drift's metric's kind), the first-parent distance of its revision, its state."""

    kind: str
    depth: int
    state: str


#: States of an earlier finding that do not stop the same change being reported again.
NOT_REPORTED = ("resolved", "dismissed")
#: Triggers of runs that report a drift only when their own change tipped it over the limit.
TIPPING_TRIGGERS = ("pull_request",)


@dataclass(frozen=True)
class Drift:
    """A drift to report: the finding (kind ``drift``), the reference point it was judged against, and
    whether that reference is the pinned baseline."""

    finding: Finding
    reference: Point
    pinned: bool


def series_value(metric: str, s: CellSample) -> float | None:
    """The value of ``metric`` in one sample, as the change-point search reads it (None when unknown):
    medians for timings (latency relative to its fp32 model when paired, as the latency rule reads it)."""
    if metric == "convert_s":
        return statistics.median(s.convert_samples) if s.convert_samples else None
    if metric == "latency_p50_ms":
        rel = relative_latency(s)
        if rel:
            return statistics.median(rel)
        return statistics.median(s.latency_samples) if s.latency_samples else None
    value = getattr(s, metric, None)
    return None if value is None or isinstance(value, bool) else float(value)


def history_href(cell: Cell) -> str:
    """The cell's history page (the series plot), on every branch."""
    return "/history?" + urlencode({"model": cell[0], "dtype": cell[1], "policy": cell[2], "target": cell[3],
                                    "branch": "all"})


def _regresses(ref: CellSample, new: CellSample, th: Thresholds, cell: Cell, metric: str) -> bool:
    return any(f.metric == metric or DRIFT_METRICS.get(f.metric) == DRIFT_METRICS[metric]
               for f in drift_rule(ref, new, th, cell[0], cell[1]))


def judge(cell: Cell, history: Sequence[Point], current: Point, th: Thresholds, *, pin: Point | None,
          tipping: bool, pairwise_kinds: set[str], earlier: Sequence[Earlier] = ()) -> Drift | None:
    """The drift of ``current`` to report, if any (see the module doc).  ``history``: the cell's measured
    revisions before the run, oldest first, newest ``th.drift_window`` at most; ``pin``: the pinned baseline's
    point (on the line) or None; ``tipping``: report only a drift this run's change tipped over the limit;
    ``pairwise_kinds``: kinds the parent comparison of this run already found a regression of;
    ``earlier``: the cell's earlier regression findings on the line."""
    if len(history) < th.drift_min_history:
        return None
    parent = history[-1]
    refs = [(pin, True)] if pin is not None and pin.sha != parent.sha else []
    if history[0].sha != parent.sha and (pin is None or history[0].sha != pin.sha):
        refs.append((history[0], False))
    for ref, pinned in refs:
        got = drift_rule(ref.sample, current.sample, th, cell[0], cell[1])
        if not got:
            continue
        f = got[0]
        kind = DRIFT_METRICS[f.metric]
        if kind in pairwise_kinds:
            continue
        mine = [e for e in earlier if e.kind == kind]
        if any(e.depth < ref.depth and e.state not in NOT_REPORTED for e in mine):
            continue  # reported before: the same change
        if tipping:
            parent_dismissed = any(e.depth == parent.depth and e.state == "dismissed" for e in mine)
            # the parent was judged (it had a history of its own) and already regressed against this reference
            if (len(history) > th.drift_min_history and not parent_dismissed
                    and _regresses(ref.sample, parent.sample, th, cell, f.metric)):
                continue
            if not own_step(f.metric, ref, parent, current):
                continue
        return Drift(replace(f, detail=describe(cell, f, ref, pinned, history, current)), ref, pinned)
    return None


def own_step(metric: str, ref: Point, parent: Point, current: Point) -> bool:
    """The step from ``parent`` to ``current`` moved ``metric`` in the direction it drifted from ``ref``: by at
    least half the mean step since ``ref`` for a metric a noise commit leaves unchanged (accuracy, coverage,
    convergence, iterations), by any amount for a timing (a 20 ms step of a creep is within one job's noise,
    so the size of one step cannot be asked of it; its confirmation times the reference against it).  True
    when a value is unknown: the rule's verdict stands."""
    r, p, c = (series_value(metric, x.sample) for x in (ref, parent, current))
    if r is None or p is None or c is None or ref.depth <= 0:
        return True
    total = c - r
    step = (c - p) * math.copysign(1.0, total)
    if DRIFT_METRICS[metric] in TIMING_KINDS:
        return step > 0
    return step >= abs(total) / (2 * ref.depth)


def describe(cell: Cell, f: Finding, ref: Point, pinned: bool, history: Sequence[Point], current: Point) -> str:
    """"drifted x4.5 over 8 commits, since REV (window|pinned baseline); level moved between A and B (E-divisive
    means, p=…); <the rule's detail>; history: <link>"."""
    ratio = f.ratio
    size = "n/a" if ratio is None else ("inf" if math.isinf(ratio) else f"{ratio:.3g}")
    where = "the pinned baseline" if pinned else f"the start of the {len(history)}-revision window"
    text = (f"drifted x{size} over {ref.depth} commits, since {ref.sha[:12]} ({where}); "
            f"{moved_text(f.metric, history, ref, current)}; {f.detail}; history: {history_href(cell)}")
    return text


def moved_text(metric: str, history: Sequence[Point], ref: Point, current: Point) -> str:
    """Where the level of ``metric`` moved between ``ref`` and ``current`` (E-divisive means over the
    measured revisions since the reference), or that no single change point was found (a gradual creep)."""
    # imported here: numpy is only loaded when a drift is reported, never by the query commands that import detection
    from service.regressions.changepoint import e_divisive

    pts = [p for p in history if p.depth <= ref.depth] + [current]
    if pts[0].sha != ref.sha:
        pts = [ref, *pts]
    known = [(p, v) for p in pts if (v := series_value(metric, p.sample)) is not None]
    cps = e_divisive([v for _, v in known]) if len(known) >= 4 else []
    if not cps:
        return f"no single change point in {len(known)} measured revisions (a gradual change)"
    first, last = known[cps[0].index - 1][0], known[cps[-1].index][0]
    return (f"level moved between {first.sha[:12]} and {last.sha[:12]} "
            f"(E-divisive means, {len(cps)} change point{'s' if len(cps) > 1 else ''}, p={max(c.p for c in cps):.2g})")
