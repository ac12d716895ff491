"""Regression rules: pure functions from (baseline sample, new sample, thresholds) to findings.

Each rule looks at one kind (conversion, accuracy, convergence, coverage, latency) and returns at
most one :class:`Finding` per direction (a regression or an improvement).  Rules never fire when a
side lacks the data they need: a missing metric is "unknown", not "worse".  Statuses that are not
the pass's fault (``bad_model``, ``bad_spec``, ``reference_error``, ``crashed``) never produce a
conversion regression.  Convergence errors measured in different units (``CellSample.error_unit``:
results stored before the job recorded a unit are ``absolute``, newer ones ``relative``) are never
compared: only the unit-independent diverged status is.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from service.regressions.stats import mann_whitney_p
from service.regressions.thresholds import Thresholds
from workers.result import CONVERGENCE_ERROR_UNIT, CONVERSION_OK_STATUSES

#: Statuses that blame the pass under test (conversion failed, hung or died).
PASS_FAULT_STATUSES = frozenset({"convert_error", "timeout", "crash"})
KINDS = ("conversion", "accuracy", "convergence", "coverage", "latency")


@dataclass(frozen=True)
class CellSample:
    """What the rules need of one result of a cell (built from a stored row or a JobResult)."""

    status: str
    max_abs: float | None = None
    cosine: float | None = None
    final_error: float | None = None
    diverged: bool | None = None
    low_precision_fraction: float | None = None
    casts_inserted: int | None = None
    latency_samples: tuple[float, ...] = ()
    env_fingerprint: str | None = None
    error_unit: str = CONVERGENCE_ERROR_UNIT  # unit of final_error (workers.result.ConvergenceStats)

    @property
    def converted(self) -> bool:
        """The pass produced a valid model (accuracy, convergence and coverage are meaningful)."""
        return self.status in CONVERSION_OK_STATUSES


def same_error_unit(base: CellSample, new: CellSample) -> bool:
    """True when the two samples' convergence errors are in the same unit (so their values compare)."""
    return base.error_unit == new.error_unit


@dataclass(frozen=True)
class Finding:
    """One change of one kind: ``category`` is ``regression`` or ``improvement`` (``flaky`` later)."""

    kind: str
    category: str
    severity: str
    metric: str
    baseline_value: float | None
    value: float | None
    detail: str
    p_value: float | None = None

    @property
    def delta(self) -> float | None:
        """``value - baseline_value`` (None when either is unknown)."""
        if self.value is None or self.baseline_value is None:
            return None
        if math.isinf(self.value) and math.isinf(self.baseline_value):
            return 0.0
        return self.value - self.baseline_value

    @property
    def ratio(self) -> float | None:
        """``value / baseline_value`` (inf for a rise from zero; None when unknown)."""
        if self.value is None or self.baseline_value is None:
            return None
        if self.baseline_value == 0:
            return 1.0 if self.value == 0 else math.inf
        return self.value / self.baseline_value


def _g(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def conversion_rule(base: CellSample, new: CellSample, th: Thresholds, model: str, dtype: str) -> list[Finding]:
    """Converted and validated at the baseline, a pass fault now (and the reverse: an improvement)."""
    if base.converted and new.status in PASS_FAULT_STATUSES:
        return [Finding("conversion", "regression", "critical", "status", None, None,
                        f"converted at baseline ({base.status}), now {new.status}")]
    if base.status in PASS_FAULT_STATUSES and new.converted:
        return [Finding("conversion", "improvement", "info", "status", None, None,
                        f"{base.status} at baseline, now converts ({new.status})")]
    return []


def accuracy_rule(base: CellSample, new: CellSample, th: Thresholds, model: str, dtype: str) -> list[Finding]:
    """pass→fail_accuracy, or worst max-abs error beyond the dtype's (or model's) ratio and floor."""
    if not (base.converted and new.converted):
        return []
    thr = th.accuracy_for(model, dtype)
    known = base.max_abs is not None and new.max_abs is not None
    flip_bad = base.status == "pass" and new.status == "fail_accuracy"
    flip_good = base.status == "fail_accuracy" and new.status == "pass"
    worse = known and thr.worse(base.max_abs, new.max_abs)  # type: ignore[arg-type]
    better = known and thr.better(base.max_abs, new.max_abs)  # type: ignore[arg-type]
    limits = f"(limits x{thr.ratio:g} and +{thr.floor:g})"
    if flip_bad or worse:
        why = "pass -> fail_accuracy" if flip_bad else ""
        if worse:
            why = (why + "; " if why else "") + f"max_abs {_g(base.max_abs)} -> {_g(new.max_abs)} {limits}"
        return [Finding("accuracy", "regression", "major" if flip_bad else "minor", "max_abs",
                        base.max_abs, new.max_abs, why)]
    if flip_good or better:
        why = "fail_accuracy -> pass" if flip_good else f"max_abs {_g(base.max_abs)} -> {_g(new.max_abs)}"
        return [Finding("accuracy", "improvement", "info", "max_abs", base.max_abs, new.max_abs, why)]
    return []


def convergence_rule(base: CellSample, new: CellSample, th: Thresholds, model: str, dtype: str) -> list[Finding]:
    """Not diverged → diverged, or the final-step error grew beyond the convergence ratio and floor.

    Final-step errors in different units are not compared: only a change of the diverged status is
    reported then, without a baseline value (so no delta or ratio across units is stored)."""
    if base.diverged is None or new.diverged is None:
        return []
    thr = th.convergence
    same = same_error_unit(base, new)
    known = same and base.final_error is not None and new.final_error is not None
    bv = base.final_error if same else None
    units = "" if same else f" (final-step errors not comparable: {base.error_unit} at baseline, {new.error_unit} now)"
    if not base.diverged and new.diverged:
        return [Finding("convergence", "regression", "major", "final_error", bv, new.final_error,
                        "stable at baseline, now diverges" + units)]
    if known and not new.diverged and thr.worse(base.final_error, new.final_error):  # type: ignore[arg-type]
        return [Finding("convergence", "regression", "minor", "final_error", base.final_error, new.final_error,
                        f"final-step error {_g(base.final_error)} -> {_g(new.final_error)}")]
    if base.diverged and not new.diverged:
        return [Finding("convergence", "improvement", "info", "final_error", bv, new.final_error,
                        "diverged at baseline, now stable" + units)]
    if known and not base.diverged and thr.better(base.final_error, new.final_error):  # type: ignore[arg-type]
        return [Finding("convergence", "improvement", "info", "final_error", base.final_error, new.final_error,
                        f"final-step error {_g(base.final_error)} -> {_g(new.final_error)}")]
    return []


def coverage_rule(base: CellSample, new: CellSample, th: Thresholds, model: str, dtype: str) -> list[Finding]:
    """Low-precision compute fraction dropped, or casts grew, beyond the thresholds (and back)."""
    if not (base.converted and new.converted):
        return []
    fb, fn = base.low_precision_fraction, new.low_precision_fraction
    cb, cn = base.casts_inserted, new.casts_inserted
    drop = fb is not None and fn is not None and fb - fn > th.coverage_fraction_drop
    rise = fb is not None and fn is not None and fn - fb > th.coverage_fraction_drop

    def grew(a: int | None, b: int | None) -> bool:
        return a is not None and b is not None and b > a * th.casts_growth_ratio and b - a >= th.casts_growth_abs

    more_casts, fewer_casts = grew(cb, cn), grew(cn, cb)
    casts_txt = f"casts {cb} -> {cn}"
    if drop or more_casts:
        parts = [f"low-precision fraction {_g(fb)} -> {_g(fn)}"] if drop else []
        if more_casts:
            parts.append(casts_txt)
        metric, bv, nv = ("low_precision_fraction", fb, fn) if drop else ("casts_inserted", cb, cn)
        return [Finding("coverage", "regression", "minor", metric, bv, nv, "; ".join(parts))]
    if rise or fewer_casts:
        metric, bv, nv = ("low_precision_fraction", fb, fn) if rise else ("casts_inserted", cb, cn)
        txt = f"low-precision fraction {_g(fb)} -> {_g(fn)}" if rise else casts_txt
        return [Finding("coverage", "improvement", "info", metric, bv, nv, txt)]
    return []


def latency_rule(base: CellSample, new: CellSample, th: Thresholds, model: str, dtype: str) -> list[Finding]:
    """asv's rule: same environment fingerprint, Mann-Whitney U p < latency_p **and** a median ratio
    beyond latency_ratio (either way: slower is a regression, faster an improvement)."""
    if base.env_fingerprint is None or base.env_fingerprint != new.env_fingerprint:
        return []
    a, b = base.latency_samples, new.latency_samples
    if len(a) < th.latency_min_samples or len(b) < th.latency_min_samples:
        return []
    ma, mb = statistics.median(a), statistics.median(b)
    if ma <= 0 or mb <= 0:
        return []
    ratio = mb / ma
    if ratio > th.latency_ratio:
        p = mann_whitney_p(b, a, "greater")
        if p < th.latency_p:
            return [Finding("latency", "regression", "major" if ratio > 1.5 else "minor", "latency_p50_ms", ma, mb,
                            f"p50 {ma:.4g} ms -> {mb:.4g} ms (x{ratio:.2f}, Mann-Whitney p={p:.2g})", p)]
    elif ratio < 1 / th.latency_ratio:
        p = mann_whitney_p(b, a, "less")
        if p < th.latency_p:
            return [Finding("latency", "improvement", "info", "latency_p50_ms", ma, mb,
                            f"p50 {ma:.4g} ms -> {mb:.4g} ms (x{ratio:.2f}, Mann-Whitney p={p:.2g})", p)]
    return []


Rule = Callable[[CellSample, CellSample, Thresholds, str, str], list[Finding]]
RULES: dict[str, Rule] = {"conversion": conversion_rule, "accuracy": accuracy_rule,
                          "convergence": convergence_rule, "coverage": coverage_rule, "latency": latency_rule}


def compare_cells(base: CellSample, new: CellSample, th: Thresholds, model: str, dtype: str,
                  kinds: tuple[str, ...] = KINDS) -> list[Finding]:
    """All findings of the selected rule kinds for one cell, in KINDS order."""
    out: list[Finding] = []
    for kind in kinds:
        out.extend(RULES[kind](base, new, th, model, dtype))
    return out


def comparable(kind: str, base: CellSample, new: CellSample, th: Thresholds,
               regressed: CellSample | None = None) -> bool:
    """True when the ``kind`` rule has the data it needs on both sides (so "no finding" means "same").

    Convergence across error units: only the diverged status compares, so the samples are comparable
    when either side diverged, or when ``regressed`` (the result a regression was found at, when the
    caller judges that regression) shows the regression was the divergence itself (stable at
    ``base``, diverged at ``regressed``); two stable samples in different units are not comparable."""
    if kind == "conversion":
        return new.converted or new.status in PASS_FAULT_STATUSES
    if kind == "accuracy":
        return base.converted and new.converted and base.max_abs is not None and new.max_abs is not None
    if kind == "convergence":
        if base.diverged is None or new.diverged is None:
            return False
        divergence = regressed is not None and regressed.diverged is True and not base.diverged
        return same_error_unit(base, new) or base.diverged or new.diverged or divergence
    if kind == "coverage":
        return base.converted and new.converted and (
            base.low_precision_fraction is not None and new.low_precision_fraction is not None
            or base.casts_inserted is not None and new.casts_inserted is not None)
    return (base.env_fingerprint is not None and base.env_fingerprint == new.env_fingerprint
            and min(len(base.latency_samples), len(new.latency_samples)) >= th.latency_min_samples)


def returned_to_baseline(kind: str, base: CellSample, new: CellSample, th: Thresholds, model: str,
                         dtype: str, regressed: CellSample | None = None) -> bool:
    """True when ``new`` is comparable with ``base`` for ``kind`` and shows no regression of that kind
    (``regressed``: see :func:`comparable`)."""
    if not comparable(kind, base, new, th, regressed):
        return False
    return not any(f.category == "regression" for f in RULES[kind](base, new, th, model, dtype))
