"""``accuracy``: pass -> fail_accuracy, or the worst max-abs error beyond the dtype's (or model's) limits."""

from __future__ import annotations

from service.regressions.findings import CellSample, Finding, fmt_g
from service.regressions.kinds.base import Display, FindingKind
from service.regressions.thresholds import Thresholds

#: How an accuracy regression is shown (a convergence regression is shown the same way).
DISPLAY = Display("reg-accuracy", "▼", "acc", "accuracy regression",
                           ("#fbd9d5", "#6e0c03", "#b3261e"))


def accuracy_rule(base: CellSample, new: CellSample, th: Thresholds, model: str, dtype: str) -> list[Finding]:
    """pass→fail_accuracy, or worst max-abs error beyond the dtype's (or model's) ratio and floor."""
    if not (base.converted and new.converted):
        return []
    thr = th.accuracy_for(model, dtype)
    b, n = base.max_abs, new.max_abs
    flip_bad = base.status == "pass" and new.status == "fail_accuracy"
    flip_good = base.status == "fail_accuracy" and new.status == "pass"
    worse = b is not None and n is not None and thr.worse(b, n)
    better = b is not None and n is not None and thr.better(b, n)
    limits = f"(limits x{thr.ratio:g} and +{thr.floor:g})"
    if flip_bad or worse:
        why = "pass -> fail_accuracy" if flip_bad else ""
        if worse:
            why = (why + "; " if why else "") + f"max_abs {fmt_g(base.max_abs)} -> {fmt_g(new.max_abs)} {limits}"
        return [Finding("accuracy", "regression", "major" if flip_bad else "minor", "max_abs",
                        base.max_abs, new.max_abs, why)]
    if flip_good or better:
        why = "fail_accuracy -> pass" if flip_good else f"max_abs {fmt_g(base.max_abs)} -> {fmt_g(new.max_abs)}"
        return [Finding("accuracy", "improvement", "info", "max_abs", base.max_abs, new.max_abs, why)]
    return []


def accuracy_comparable(base: CellSample, new: CellSample, th: Thresholds, regressed: CellSample | None) -> bool:
    """Both converted and both carry a max-abs error."""
    return base.converted and new.converted and base.max_abs is not None and new.max_abs is not None


KIND = FindingKind("accuracy", accuracy_rule, accuracy_comparable, DISPLAY, bisection="rule",
                   drift_metrics=("max_abs",), explained_by_coverage=True)
