"""``drift``: a cumulative change over the cell's history (against an older reference, not the parent) beyond
the limits of the rule of a drift-judged kind (a kind with ``drift_metrics``).  Whether a drift is reported is
:mod:`service.regressions.drift`'s."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from service.regressions.findings import CellSample, Finding
from service.regressions.kinds.base import Display, FindingKind
from service.regressions.thresholds import Thresholds

#: How a drift is shown.
DISPLAY = Display("reg-drift", "↑", "drift", "drift over history (cumulative change beyond a rule's limits)",
                  ("#fbe3cf", "#5c2a00", "#b35900"))


def over(kinds: Sequence[FindingKind]) -> FindingKind:
    """The drift kind, judged by the rules of those of ``kinds`` that have ``drift_metrics``, in their order
    (the registry passes the kinds listed before it: it is built there, so this module needs no registry)."""
    judged = tuple(k for k in kinds if k.drift_metrics)

    def drift_rule(base: CellSample, new: CellSample, th: Thresholds, model: str, dtype: str) -> list[Finding]:
        """``base`` an *older reference* of the cell (not its parent): the first regression, in registry order,
        that the rule of a drift-judged kind finds between them on one of that kind's ``drift_metrics``, with
        that rule's own limits, as a ``drift`` finding of the same metric (its detail prefixed by the kind).
        Improvements over a window are not drift."""
        for kind in judged:
            for f in kind.rule(base, new, th, model, dtype):
                if f.category == "regression" and f.metric in kind.drift_metrics:
                    return [replace(f, kind="drift", detail=f"{kind.name}: {f.detail}")]
        return []

    def drift_comparable(base: CellSample, new: CellSample, th: Thresholds, regressed: CellSample | None) -> bool:
        """Comparable for any drift-judged kind."""
        return any(k.comparable(base, new, th, regressed) for k in judged)

    return FindingKind("drift", drift_rule, drift_comparable, DISPLAY, bisection="rule", pairwise=False)
