"""Regression rules: pure functions from (baseline sample, new sample, thresholds) to findings.

Each rule looks at one kind and returns at most one :class:`Finding` per direction (a regression or an
improvement); the rules live with their kinds (:mod:`service.regressions.kinds`, one module per kind, listed by
:mod:`service.regressions.kinds.registry`).  This module applies them: :func:`compare_cells`,
:func:`comparable`, :func:`returned_to_baseline`, and the tables other modules read (:data:`KINDS`,
:data:`TIMING_KINDS`, …), all derived from the registry, so a kind is never listed twice.  Rules never fire
when a side lacks the data they need: a missing metric is "unknown", not "worse".  Statuses that are not the
pass's fault (``bad_model``, ``bad_spec``, ``reference_error``, ``crashed``) never produce a conversion
regression.  Convergence errors measured in different units (``CellSample.error_unit``: results stored before
the job recorded a unit are ``absolute``, newer ones ``relative``) are never compared: only the
unit-independent diverged status is.  A kind that is not registered raises
:class:`~service.regressions.kinds.registry.UnknownKind` everywhere.
"""

from __future__ import annotations

from service.regressions.findings import (
    CAPPED_BY,
    CAPPED_GAIN_LABEL,
    CAPPED_LABEL,
    CATEGORIES,
    CONFIRMATION_STATES,
    EXPLAINED,
    PASS_FAULT_STATUSES,
    CellSample,
    Finding,
    same_error_unit,
)
from service.regressions.kinds.accuracy import accuracy_rule
from service.regressions.kinds.base import Rule
from service.regressions.kinds.convergence import convergence_rule
from service.regressions.kinds.conversion import conversion_rule
from service.regressions.kinds.conversion_time import conversion_time_comparable, conversion_time_rule
from service.regressions.kinds.coverage import compute_counts_comparable, coverage_rule
from service.regressions.kinds.latency import latency_comparable, latency_rule
from service.regressions.kinds.pass_convergence import pass_convergence_comparable, pass_convergence_rule
from service.regressions.kinds.registry import UnknownKind, all_kinds, kind
from service.regressions.thresholds import Thresholds
from service.regressions.timing import (
    can_reach,
    conversion_cpu,
    pooled,
    relative_conversion,
    relative_cpu_latency,
    relative_latency,
    timing_shift,
)

__all__ = [
    "CAPPED_BY", "CAPPED_GAIN_LABEL", "CAPPED_LABEL", "CATEGORIES", "CONFIRMATION_STATES", "DRIFT_METRICS",
    "EXPLAINED", "EXPLAINED_KINDS", "KINDS", "PAIRWISE_KINDS", "PASS_FAULT_STATUSES", "RULES", "TIMING_KINDS",
    "CellSample", "Finding", "Rule", "UnknownKind", "accuracy_rule", "comparable", "compare_cells",
    "compute_counts_comparable", "conversion_cpu", "conversion_rule", "conversion_time_comparable",
    "conversion_time_rule", "convergence_rule", "coverage_rule", "drift_rule", "latency_comparable", "latency_rule",
    "pass_convergence_comparable", "pass_convergence_rule", "pooled", "relative_conversion", "relative_cpu_latency",
    "relative_latency", "returned_to_baseline", "same_error_unit", "source_kind", "timing_kind", "timing_shift",
]

_can_reach = can_reach  # the name the tests of the conversion-time rule know it by
#: The drift rule (:func:`service.regressions.kinds.drift.over`): ``base`` an older reference of the cell.
drift_rule: Rule = kind("drift").rule

#: Every kind, in registry order (the order a cell's regressions of several kinds pick its state).
KINDS: tuple[str, ...] = tuple(k.name for k in all_kinds())
#: The kinds judged against the parent (the baseline of a run); ``drift`` judges against an older reference
#: (a lookback window of the cell's history, or a pinned baseline: :mod:`service.regressions.drift`).
PAIRWISE_KINDS: tuple[str, ...] = tuple(k.name for k in all_kinds() if k.pairwise)
#: The metric of each kind a drift is judged on (the findings' ``metric``) and the kind whose rule and limits
#: judge it; conversion (a status flip) is never a drift: its parent comparison already sees it.
DRIFT_METRICS: dict[str, str] = {m: k.name for k in all_kinds() for m in k.drift_metrics}
#: Kinds measured in time: their regressions are *suspected* until the baseline and the candidate revision are
#: timed interleaved on one worker (:mod:`service.regressions.confirm`).
TIMING_KINDS: tuple[str, ...] = tuple(k.name for k in all_kinds() if k.timing)
#: Kinds whose improvement a coverage loss in the same comparison explains (stored as :data:`EXPLAINED`).
EXPLAINED_KINDS: tuple[str, ...] = tuple(k.name for k in all_kinds() if k.explained_by_coverage)
#: The rule of each kind (a copy: the registry is the source).
RULES: dict[str, Rule] = {k.name: k.rule for k in all_kinds()}


def source_kind(kind_name: str, metric: str | None) -> str:
    """The rule kind that judges a finding: its own kind, or for ``drift`` the kind of its metric."""
    kind(kind_name)
    return DRIFT_METRICS.get(metric or "", kind_name) if kind_name == "drift" else kind_name


def timing_kind(kind_name: str, metric: str | None) -> str | None:
    """The timing kind (:data:`TIMING_KINDS`) whose confirmation judges a finding of ``kind_name`` and ``metric``
    (a drift of conversion time or latency is confirmed as one); None for any other finding."""
    got = kind(source_kind(kind_name, metric))
    return got.name if got.timing else None


def compare_cells(base: CellSample, new: CellSample, th: Thresholds, model: str, dtype: str,
                  kinds: tuple[str, ...] = PAIRWISE_KINDS) -> list[Finding]:
    """All findings of the selected rule kinds for one cell, in the order given (by default every kind judged
    against a parent, in registry order: :data:`PAIRWISE_KINDS`)."""
    out: list[Finding] = []
    for name in kinds:
        out.extend(kind(name).rule(base, new, th, model, dtype))
    return out


def comparable(kind_name: str, base: CellSample, new: CellSample, th: Thresholds,
               regressed: CellSample | None = None) -> bool:
    """True when the ``kind_name`` rule has the data it needs on both sides (so "no finding" means "same");
    ``regressed``: the result a regression was found at, when the caller judges that regression (see
    :func:`service.regressions.kinds.convergence.convergence_comparable`)."""
    return kind(kind_name).comparable(base, new, th, regressed)


def returned_to_baseline(kind_name: str, base: CellSample, new: CellSample, th: Thresholds, model: str,
                         dtype: str, regressed: CellSample | None = None) -> bool:
    """True when ``new`` is comparable with ``base`` for ``kind_name`` and shows no regression of that kind
    (``regressed``: see :func:`comparable`)."""
    return kind(kind_name).returned_to_baseline(base, new, th, model, dtype, regressed)
