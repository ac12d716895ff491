"""``pass_convergence``: the pass's painting fixpoint stopped converging, or needs many more iterations."""

from __future__ import annotations

from service.regressions.findings import CellSample, Finding
from service.regressions.kinds.base import Display, FindingKind
from service.regressions.thresholds import Thresholds


def pass_convergence_comparable(base: CellSample, new: CellSample) -> bool:
    """Both converted and both reports said whether the painting converged, or both gave iterations."""
    return base.converted and new.converted and (
        base.pass_converged is not None and new.pass_converged is not None
        or base.pass_iterations is not None and new.pass_iterations is not None)


def pass_convergence_rule(base: CellSample, new: CellSample, th: Thresholds, model: str,
                          dtype: str) -> list[Finding]:
    """The pass's painting fixpoint: converged at baseline and not now (major), or, both converged, the
    iterations grew by more than ``pass_iterations_abs`` **and** beyond ``pass_iterations_ratio`` times the
    baseline's (minor); the reverse of either is an improvement."""
    if not pass_convergence_comparable(base, new):
        return []
    bi, ni = base.pass_iterations, new.pass_iterations
    its = f" ({bi} -> {ni} iterations)" if bi is not None and ni is not None else ""
    if base.pass_converged is True and new.pass_converged is False:
        return [Finding("pass_convergence", "regression", "major", "pass_iterations", _f(bi), _f(ni),
                        "the pass's painting converged at baseline, now stops at its iteration limit" + its)]
    if base.pass_converged is False and new.pass_converged is True:
        return [Finding("pass_convergence", "improvement", "info", "pass_iterations", _f(bi), _f(ni),
                        "the pass's painting hit its iteration limit at baseline, now converges" + its)]
    if bi is None or ni is None or base.pass_converged is False or new.pass_converged is False:
        return []

    def grew(x: int, y: int) -> bool:
        return y > x + th.pass_iterations_abs and y > x * th.pass_iterations_ratio

    if grew(bi, ni):
        return [Finding("pass_convergence", "regression", "minor", "pass_iterations", float(bi), float(ni),
                        f"painting fixpoint iterations {bi} -> {ni}")]
    if grew(ni, bi):
        return [Finding("pass_convergence", "improvement", "info", "pass_iterations", float(bi), float(ni),
                        f"painting fixpoint iterations {bi} -> {ni}")]
    return []


def _f(x: int | None) -> float | None:
    return None if x is None else float(x)


KIND = FindingKind("pass_convergence", pass_convergence_rule,
                   lambda base, new, th, regressed: pass_convergence_comparable(base, new),
                   Display("reg-pass_convergence", "↔", "fixpt", "pass convergence regression",
                           ("#e8ddf5", "#35185c", "#6b3fa0")), bisection="rule",
                   drift_metrics=("pass_iterations",))
