"""``convergence``: a stable model now diverges, or its final-step error grew beyond the limits.  Errors in
different units (:attr:`CellSample.error_unit`) are never compared: only the diverged status is.  Shown as an
accuracy regression."""

from __future__ import annotations

from service.regressions.findings import CellSample, Finding, fmt_g, same_error_unit
from service.regressions.kinds.accuracy import DISPLAY
from service.regressions.kinds.base import FindingKind
from service.regressions.thresholds import Thresholds


def convergence_rule(base: CellSample, new: CellSample, th: Thresholds, model: str, dtype: str) -> list[Finding]:
    """Not diverged → diverged, or the final-step error grew beyond the convergence ratio and floor.

    Final-step errors in different units are not compared: only a change of the diverged status is
    reported then, without a baseline value (so no delta or ratio across units is stored)."""
    if base.diverged is None or new.diverged is None:
        return []
    thr = th.convergence
    same = same_error_unit(base, new)
    b, n = base.final_error, new.final_error
    known = same and b is not None and n is not None
    bv = base.final_error if same else None
    units = "" if same else f" (final-step errors not comparable: {base.error_unit} at baseline, {new.error_unit} now)"
    if not base.diverged and new.diverged:
        return [Finding("convergence", "regression", "major", "final_error", bv, new.final_error,
                        "stable at baseline, now diverges" + units)]
    if known and b is not None and n is not None and not new.diverged and thr.worse(b, n):
        return [Finding("convergence", "regression", "minor", "final_error", base.final_error, new.final_error,
                        f"final-step error {fmt_g(base.final_error)} -> {fmt_g(new.final_error)}")]
    if base.diverged and not new.diverged:
        return [Finding("convergence", "improvement", "info", "final_error", bv, new.final_error,
                        "diverged at baseline, now stable" + units)]
    if known and b is not None and n is not None and not base.diverged and thr.better(b, n):
        return [Finding("convergence", "improvement", "info", "final_error", base.final_error, new.final_error,
                        f"final-step error {fmt_g(base.final_error)} -> {fmt_g(new.final_error)}")]
    return []


def convergence_comparable(base: CellSample, new: CellSample, th: Thresholds, regressed: CellSample | None) -> bool:
    """Both report whether they diverged, and across error units only when the diverged status decides:
    either side diverged, or ``regressed`` shows the regression was the divergence itself (stable at
    ``base``, diverged at ``regressed``); two stable samples in different units are not comparable."""
    if base.diverged is None or new.diverged is None:
        return False
    divergence = regressed is not None and regressed.diverged is True and not base.diverged
    return same_error_unit(base, new) or base.diverged or new.diverged or divergence


KIND = FindingKind("convergence", convergence_rule, convergence_comparable, DISPLAY, bisection="rule",
                   drift_metrics=("final_error",), explained_by_coverage=True)
