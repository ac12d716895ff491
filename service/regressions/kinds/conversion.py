"""``conversion``: the pass converted and validated a cell at the baseline and fails on it now (a pass fault:
:data:`~service.regressions.findings.PASS_FAULT_STATUSES`), or the reverse.  Bisected by status."""

from __future__ import annotations

from service.regressions.findings import PASS_FAULT_STATUSES, CellSample, Finding
from service.regressions.kinds.base import Display, FindingKind
from service.regressions.thresholds import Thresholds


def conversion_rule(base: CellSample, new: CellSample, th: Thresholds, model: str, dtype: str) -> list[Finding]:
    """Converted and validated at the baseline, a pass fault now (and the reverse: an improvement)."""
    if base.converted and new.status in PASS_FAULT_STATUSES:
        return [Finding("conversion", "regression", "critical", "status", None, None,
                        f"converted at baseline ({base.status}), now {new.status}")]
    if base.status in PASS_FAULT_STATUSES and new.converted:
        return [Finding("conversion", "improvement", "info", "status", None, None,
                        f"{base.status} at baseline, now converts ({new.status})")]
    return []


def conversion_comparable(base: CellSample, new: CellSample, th: Thresholds, regressed: CellSample | None) -> bool:
    """The new result converted, or failed by the pass's fault (either way its status says something)."""
    return new.converted or new.status in PASS_FAULT_STATUSES


KIND = FindingKind("conversion", conversion_rule, conversion_comparable,
                   Display("reg-conversion", "×", "conv", "conversion regression",
                           ("#f4d2ea", "#5b0b45", "#9c2a7d")), bisection="status")
