"""``coverage``: fewer low-precision compute nodes, a lower low-precision fraction, or more casts."""

from __future__ import annotations

from service.regressions.findings import CellSample, Finding, fmt_g
from service.regressions.kinds.base import Display, FindingKind
from service.regressions.thresholds import Thresholds


def compute_counts_comparable(base: CellSample, new: CellSample) -> bool:
    """Both samples carry measured compute counts of the same compute-op definition version, with at least
    one compute node each (no compute node: not applicable)."""
    return (base.compute_low is not None and new.compute_low is not None and bool(base.compute_nodes)
            and bool(new.compute_nodes) and base.compute_ops_version is not None
            and base.compute_ops_version == new.compute_ops_version)


def _compute_change(base: CellSample, new: CellSample, th: Thresholds) -> int:
    """-1: fewer low-precision compute nodes (by at least ``coverage_compute_drop``) and more kept fp32, not
    explained by compute nodes the conversion removed; +1: the reverse; 0: no change or not comparable."""
    lb, ln, nb, nn = base.compute_low, new.compute_low, base.compute_nodes, new.compute_nodes
    if not compute_counts_comparable(base, new) or lb is None or ln is None or nb is None or nn is None:
        return 0  # (comparable counts are never None)
    kb, kn = nb - lb, nn - ln
    if lb - ln >= th.coverage_compute_drop and kn > kb:
        return -1
    if ln - lb >= th.coverage_compute_drop and kn < kb:
        return 1
    return 0


def _low(sample: CellSample) -> float:
    """The low-precision compute nodes of a sample whose compute counts compared (:func:`_compute_change`)."""
    if sample.compute_low is None:  # pragma: no cover - a compute change needs both counts
        raise ValueError("a compute change without compute counts")
    return float(sample.compute_low)


def coverage_rule(base: CellSample, new: CellSample, th: Thresholds, model: str, dtype: str) -> list[Finding]:
    """Fewer low-precision compute nodes (measured from the converted model, whatever the fraction or the
    pass's report says), a low-precision compute fraction dropped, or casts grew, beyond the thresholds
    (and back: improvements).  A fraction that is None (no compute node: not applicable) on either side
    is not compared."""
    if not (base.converted and new.converted):
        return []
    fb, fn = base.low_precision_fraction, new.low_precision_fraction
    cb, cn = base.casts_inserted, new.casts_inserted
    drop = fb is not None and fn is not None and fb - fn > th.coverage_fraction_drop
    rise = fb is not None and fn is not None and fn - fb > th.coverage_fraction_drop
    compute = _compute_change(base, new, th)

    def grew(a: int | None, b: int | None) -> bool:
        return a is not None and b is not None and b > a * th.casts_growth_ratio and b - a >= th.casts_growth_abs

    more_casts, fewer_casts = grew(cb, cn), grew(cn, cb)
    casts_txt = f"casts {cb} -> {cn}"
    compute_txt = (f"low-precision compute nodes {base.compute_low}/{base.compute_nodes} -> "
                   f"{new.compute_low}/{new.compute_nodes}")
    bv: float | None
    nv: float | None
    if compute < 0 or drop or more_casts:
        parts = [compute_txt] if compute < 0 else []
        if drop:
            parts.append(f"low-precision fraction {fmt_g(fb)} -> {fmt_g(fn)}")
        if more_casts:
            parts.append(casts_txt)
        if compute < 0:
            metric, bv, nv = "compute_low", _low(base), _low(new)
        else:
            metric, bv, nv = ("low_precision_fraction", fb, fn) if drop else ("casts_inserted", cb, cn)
        severity = "major" if compute < 0 and new.compute_low == 0 else "minor"
        return [Finding("coverage", "regression", severity, metric, bv, nv, "; ".join(parts))]
    if compute > 0 or rise or fewer_casts:
        if compute > 0:
            metric, bv, nv, txt = "compute_low", _low(base), _low(new), compute_txt
        elif rise:
            metric, bv, nv, txt = "low_precision_fraction", fb, fn, f"low-precision fraction {fmt_g(fb)} -> {fmt_g(fn)}"
        else:
            metric, bv, nv, txt = "casts_inserted", cb, cn, casts_txt
        return [Finding("coverage", "improvement", "info", metric, bv, nv, txt)]
    return []


def coverage_comparable(base: CellSample, new: CellSample, th: Thresholds, regressed: CellSample | None) -> bool:
    """Both converted and both carry one of: measured compute counts, the fraction, the casts."""
    return base.converted and new.converted and (
        compute_counts_comparable(base, new)
        or base.low_precision_fraction is not None and new.low_precision_fraction is not None
        or base.casts_inserted is not None and new.casts_inserted is not None)


KIND = FindingKind("coverage", coverage_rule, coverage_comparable,
                   Display("reg-coverage", "□", "cov", "coverage regression",
                           ("#ffe3c7", "#5f2c00", "#b86200")), bisection="rule",
                   drift_metrics=("compute_low", "low_precision_fraction", "casts_inserted"))
