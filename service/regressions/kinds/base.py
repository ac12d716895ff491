"""What a finding kind is: :class:`FindingKind`, everything that differs from one kind to another.

A kind module (``kinds/<name>.py``) defines one ``KIND = FindingKind(...)``; the registry
(:mod:`service.regressions.kinds.registry`) lists them.  Nothing outside a kind module branches on a kind's
name: rules, comparability, bisection, confirmation limits, drift metrics and the dashboard's rendering are
all read from here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from service.regressions.findings import PASS_FAULT_STATUSES, CellSample, Finding
from service.regressions.thresholds import Thresholds

#: A rule: (baseline sample, new sample, thresholds, model, dtype) -> at most one finding per direction.
Rule = Callable[[CellSample, CellSample, Thresholds, str, str], list[Finding]]
#: Whether a rule has the data it needs on both sides: (base, new, thresholds, regressed) -> bool, where
#: ``regressed`` is the result a regression was found at, when the caller judges that regression.
Comparable = Callable[[CellSample, CellSample, Thresholds, "CellSample | None"], bool]
#: (ratio limit, raw floor, p limit) of a timing kind's confirmation, from the thresholds.
Limits = Callable[[Thresholds], tuple[float, float, float]]

#: The verdicts a bisection step gives a candidate revision (:mod:`service.regressions.bisect`).
BISECT_VERDICTS = ("good", "bad", "skip")
#: How a kind's regressions are bisected: ``status`` -- a candidate is bad when it fails with the regressed
#: result's status (a status flip, such as a conversion that now fails); ``rule`` -- a candidate is bad when
#: the kind's own rule finds the regression against the baseline result again.
BISECTIONS = ("status", "rule")


@dataclass(frozen=True)
class Display:
    """How a regression of a kind is shown: CSS class (``reg-<kind>``), icon, short label, long label, and its
    colours (background, text, border) for the dashboard's stylesheet.  Kinds that share a CSS class share one
    :class:`Display` (the same object), so a class never has two looks."""

    css: str
    icon: str
    short: str
    label: str
    colors: tuple[str, str, str]

    def style(self) -> str:
        """The stylesheet rule of this display's state (``.st-<css> { … }``)."""
        background, color, border = self.colors
        return f".st-{self.css} {{ background: {background}; color: {color}; border-color: {border}; }}"


@dataclass(frozen=True)
class FindingKind:
    """One finding kind.  Guarantees: ``name`` is the ``regressions.kind`` stored for its findings; ``rule``
    returns findings of this kind only (``drift``: of its own kind, judged by the other kinds' rules);
    ``confirm_limits`` is set exactly for the timing kinds (their regressions are suspected until confirmed);
    ``drift_metrics`` are the finding metrics of this kind that a drift over history is judged on."""

    name: str
    rule: Rule
    is_comparable: Comparable
    display: Display
    bisection: str
    #: judged against the run's parent (the baseline); False: against an older reference (drift)
    pairwise: bool = True
    confirm_limits: Limits | None = None
    drift_metrics: tuple[str, ...] = ()
    #: an improvement of this kind is "explained" (no gain) when the cell's coverage regressed in the same
    #: comparison: less computed in low precision is less rounding, not a better pass
    explained_by_coverage: bool = False
    #: the changes its rule saw beyond its limits and dropped as not the pass's (a machine slowdown), as
    #: findings whose ``dismissed`` says why: detection stores them ``dismissed`` so that no suspicion of a
    #: pairwise comparison ends unseen (issue 39); None: the rule drops nothing it saw
    dismissed: Rule | None = None

    def __post_init__(self) -> None:
        if self.bisection not in BISECTIONS:
            raise ValueError(f"kind {self.name}: bisection {self.bisection!r} is not one of {', '.join(BISECTIONS)}")

    @property
    def timing(self) -> bool:
        """Measured in time: its regressions are suspected until confirmed by an interleaved timing."""
        return self.confirm_limits is not None

    @property
    def css(self) -> str:
        """The CSS class of a regression of this kind (dashboard, run page, regression page)."""
        return self.display.css

    def limits(self, th: Thresholds) -> tuple[float, float, float]:
        """(ratio limit, raw floor, p limit) of this timing kind's confirmation; ValueError for a kind that
        is not timed."""
        if self.confirm_limits is None:
            raise ValueError(f"{self.name!r} is not a timing kind")
        return self.confirm_limits(th)

    def comparable(self, base: CellSample, new: CellSample, th: Thresholds,
                   regressed: CellSample | None = None) -> bool:
        """True when this kind's rule has the data it needs on both sides (so "no finding" means "same")."""
        return self.is_comparable(base, new, th, regressed)

    def returned_to_baseline(self, base: CellSample, new: CellSample, th: Thresholds, model: str, dtype: str,
                             regressed: CellSample | None = None) -> bool:
        """True when ``new`` is comparable with ``base`` and shows no regression of this kind."""
        if not self.comparable(base, new, th, regressed):
            return False
        return not any(f.category == "regression" for f in self.rule(base, new, th, model, dtype))

    def classify(self, base: CellSample, regressed: CellSample, cand: CellSample, th: Thresholds, model: str,
                 dtype: str) -> str:
        """``good``/``bad``/``skip`` for a bisection candidate ``cand`` of a regression of this kind found at
        ``regressed`` against ``base`` (see :data:`BISECTIONS`).  A candidate that did not convert, or whose
        data the rule cannot compare, is skipped (never blamed) unless the kind bisects by status."""
        if self.bisection == "status":
            if cand.converted:
                return "good"
            return "bad" if cand.status == regressed.status and cand.status in PASS_FAULT_STATUSES else "skip"
        if not cand.converted or not self.comparable(base, cand, th, regressed):
            return "skip"
        return "good" if self.returned_to_baseline(base, cand, th, model, dtype, regressed) else "bad"
