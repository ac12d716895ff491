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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from service.regressions.stats import mann_whitney_p
from service.regressions.thresholds import Thresholds
from workers.result import CONVERGENCE_ERROR_UNIT, CONVERSION_OK_STATUSES

#: Statuses that blame the pass under test (conversion failed, hung or died).
PASS_FAULT_STATUSES = frozenset({"convert_error", "timeout", "crash"})
KINDS = ("conversion", "accuracy", "convergence", "coverage", "latency", "conversion_time", "pass_convergence",
         "drift")
#: The kinds judged against the parent (the baseline of a run); ``drift`` judges against an older reference
#: (a lookback window of the cell's history, or a pinned baseline: :mod:`service.regressions.drift`).
PAIRWISE_KINDS = tuple(k for k in KINDS if k != "drift")
#: The metric of each kind a drift is judged on (the findings' ``metric``) and the kind whose rule and limits
#: judge it; conversion (a status flip) is never a drift: its parent comparison already sees it.
DRIFT_METRICS = {"max_abs": "accuracy", "final_error": "convergence", "compute_low": "coverage",
                 "low_precision_fraction": "coverage", "casts_inserted": "coverage", "latency_p50_ms": "latency",
                 "convert_s": "conversion_time", "pass_iterations": "pass_convergence"}
#: The categories a stored finding can have, the one source of truth every rendering (dashboard, CLI, commit
#: status, API) is tested against: ``regression`` fails the gate; ``improvement`` and ``flaky`` never do.
CATEGORIES = ("regression", "improvement", "flaky")
#: Kinds measured in time: their regressions are *suspected* until the baseline and the candidate revision are
#: timed interleaved on one worker (:mod:`service.regressions.confirm`).
TIMING_KINDS = ("latency", "conversion_time")
#: Finding states of confirmation (``regressions.state``, beside open/acknowledged/resolved/false_positive):
#: ``suspected`` awaits its confirmation run, ``dismissed`` was not confirmed by it (kept, never a gate failure);
#: ``suspected_resolved``: an open or acknowledged timing regression that a later run no longer shows, until a
#: confirmation run times its regressed revision against that run's interleaved (then ``resolved``, or back
#: to the state it had: :mod:`service.regressions.confirm`).
CONFIRMATION_STATES = ("suspected", "dismissed", "suspected_resolved")
#: ``state_by`` of a ``suspected`` finding that its run's confirmation left out because a cap was reached (the
#: cells per run, or the pull request's budget: :mod:`service.regressions.confirm_caps`): it stays suspected
#: for good, never fails the gate, and the verdict counts it as :data:`CAPPED_LABEL`, never as a pass.
CAPPED_BY = "ampci-confirm-cap"
CAPPED_LABEL = "not confirmed (cap)"
#: What the verdict calls a suspected timing *improvement* a cap left out: never a gain, and (unlike
#: :data:`CAPPED_LABEL`) no reason to withhold "no regressions".
CAPPED_GAIN_LABEL = "improvement not confirmed (cap)"
#: ``regressions.state`` of an accuracy or convergence improvement on a cell whose coverage regressed in the same
#: comparison (:data:`EXPLAINED_KINDS`): less computed in low precision is less rounding, not a better pass, so it
#: is recorded with the coverage loss in its note and counted nowhere as an improvement.
EXPLAINED = "explained"
EXPLAINED_KINDS = ("accuracy", "convergence")


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
    fp32_latency_samples: tuple[float, ...] = ()  # the fp32 model timed interleaved with latency_samples
    # the same blocks' CPU time of the timing thread (ms; workers.latency), paired like the wall-time samples;
    # empty where CPU time is not the model's work (CUDA, thread pools) and in results stored before
    cpu_latency_samples: tuple[float, ...] = ()
    fp32_cpu_latency_samples: tuple[float, ...] = ()
    # a pooled baseline (:func:`pooled`): the median of each pooled result's own samples, relative to fp32
    # (when every result carried paired fp32 samples), in ms, and in CPU time relative to fp32 (when every
    # result carried paired CPU samples); empty for a single result
    run_medians: tuple[float, ...] = ()
    run_medians_ms: tuple[float, ...] = ()
    run_medians_cpu: tuple[float, ...] = ()
    env_fingerprint: str | None = None
    error_unit: str = CONVERGENCE_ERROR_UNIT  # unit of final_error (workers.result.ConvergenceStats)
    # measured by the worker from the converted model (workers.graph_facts); None for results whose graph
    # facts are the pass's own report (stored before measurement) or counted by another compute-op version
    compute_low: int | None = None
    compute_nodes: int | None = None
    compute_ops_version: str | None = None
    convert_samples: tuple[float, ...] = ()   # conversion wall times in seconds, timed by the worker
    convert_reference: tuple[float, ...] = ()  # a fixed reference workload timed right after each of them
    convert_cpu: tuple[float, ...] = ()       # CPU seconds of the conversion process in each of them (user + sys)
    pass_iterations: int | None = None        # the pass's painting fixpoint iterations (its report)
    pass_converged: bool | None = None        # whether that painting reached its fixpoint (its report)

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


def compute_counts_comparable(base: CellSample, new: CellSample) -> bool:
    """Both samples carry measured compute counts of the same compute-op definition version, with at least
    one compute node each (no compute node: not applicable)."""
    return (base.compute_low is not None and new.compute_low is not None and bool(base.compute_nodes)
            and bool(new.compute_nodes) and base.compute_ops_version is not None
            and base.compute_ops_version == new.compute_ops_version)


def _compute_change(base: CellSample, new: CellSample, th: Thresholds) -> int:
    """-1: fewer low-precision compute nodes (by at least ``coverage_compute_drop``) and more kept fp32, not
    explained by compute nodes the conversion removed; +1: the reverse; 0: no change or not comparable."""
    if not compute_counts_comparable(base, new):
        return 0
    lb, ln = base.compute_low, new.compute_low
    kb, kn = base.compute_nodes - lb, new.compute_nodes - ln  # type: ignore[operator]
    if lb - ln >= th.coverage_compute_drop and kn > kb:  # type: ignore[operator]
        return -1
    if ln - lb >= th.coverage_compute_drop and kn < kb:  # type: ignore[operator]
        return 1
    return 0


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
    if compute < 0 or drop or more_casts:
        parts = [compute_txt] if compute < 0 else []
        if drop:
            parts.append(f"low-precision fraction {_g(fb)} -> {_g(fn)}")
        if more_casts:
            parts.append(casts_txt)
        if compute < 0:
            metric, bv, nv = "compute_low", float(base.compute_low), float(new.compute_low)  # type: ignore[arg-type]
        else:
            metric, bv, nv = ("low_precision_fraction", fb, fn) if drop else ("casts_inserted", cb, cn)
        severity = "major" if compute < 0 and new.compute_low == 0 else "minor"
        return [Finding("coverage", "regression", severity, metric, bv, nv, "; ".join(parts))]
    if compute > 0 or rise or fewer_casts:
        if compute > 0:
            metric, bv, nv, txt = ("compute_low", float(base.compute_low), float(new.compute_low),  # type: ignore[arg-type]
                                   compute_txt)
        elif rise:
            metric, bv, nv, txt = "low_precision_fraction", fb, fn, f"low-precision fraction {_g(fb)} -> {_g(fn)}"
        else:
            metric, bv, nv, txt = "casts_inserted", cb, cn, casts_txt
        return [Finding("coverage", "improvement", "info", metric, bv, nv, txt)]
    return []


def relative_latency(s: CellSample) -> tuple[float, ...]:
    """Each converted-model latency sample divided by the fp32 sample timed right after it in the same job
    (empty unless both lists are paired and positive).  The fp32 model does not change with the pass
    revision, so the ratio cancels what slows a whole job down (other load, clock changes) and keeps what the
    converted model itself costs."""
    a, b = s.latency_samples, s.fp32_latency_samples
    if not a or len(a) != len(b) or min(b) <= 0:
        return ()
    return tuple(x / y for x, y in zip(a, b, strict=True))


def relative_cpu_latency(s: CellSample) -> tuple[float, ...]:
    """Like :func:`relative_latency`, in CPU time of the timing thread (empty unless the converted and fp32 CPU
    samples are paired one to one with positive fp32 ones): waiting for the cores while other jobs run
    inflates wall time, not the work a model does, so these ratios hold on a busy machine (per-run
    converted/fp32 ratios spread 0.26-2.7 in wall time, 0.82-1.21 in CPU time at load average 15)."""
    a, b = s.cpu_latency_samples, s.fp32_cpu_latency_samples
    if not a or len(a) != len(b) or min(b) <= 0:
        return ()
    return tuple(x / y for x, y in zip(a, b, strict=True))


def latency_comparable(base: CellSample, new: CellSample, th: Thresholds) -> bool:
    """Same environment fingerprint (machine and runtime, not the pass revision) and at least
    ``latency_min_samples`` samples on each side."""
    return (base.env_fingerprint is not None and base.env_fingerprint == new.env_fingerprint
            and min(len(base.latency_samples), len(new.latency_samples)) >= th.latency_min_samples)


def timing_shift(base: Sequence[float], new: Sequence[float], ratio: float, change: float, ratio_limit: float,
                 floor: float, p_limit: float) -> tuple[str, float] | None:
    """``("regression"|"improvement", p)`` when timing samples ``new`` moved from ``base``: their median
    ``ratio`` beyond ``ratio_limit`` (below its inverse), the raw median ``change`` beyond ``floor`` in the
    same direction, and one-sided Mann-Whitney U p < ``p_limit``; None otherwise."""
    if ratio > ratio_limit and change > floor:
        category, alternative = "regression", "greater"
    elif ratio < 1 / ratio_limit and -change > floor:
        category, alternative = "improvement", "less"
    else:
        return None
    p = mann_whitney_p(new, base, alternative)
    return (category, p) if p < p_limit else None


def latency_rule(base: CellSample, new: CellSample, th: Thresholds, model: str, dtype: str) -> list[Finding]:
    """asv's rule, made robust to machine drift: same environment fingerprint, enough samples, and then

    * the samples compared are each job's converted/fp32 ratios in CPU time when both sides carry paired CPU
      samples (:func:`relative_cpu_latency`: the model's work, which other load does not inflate), else
      their converted/fp32 wall-time ratios when both carry paired fp32 samples (:func:`relative_latency`),
      else the raw milliseconds;
    * a regression (improvement) needs their median ratio beyond ``latency_ratio`` (below its inverse),
      one-sided Mann-Whitney U p < ``latency_p``, **and** a p50 change of more than ``latency_floor_ms`` in the
      same direction (a few microseconds are timer noise, whatever the ratio), measured as the relative change
      at the baseline's p50 (of CPU time, for CPU ratios) when the samples are relative (so a machine faster
      during the new job does not hide a slower model, nor a slower machine make one);
    * with CPU ratios, the converted model's own CPU p50 must have moved the same way too, for an improvement
      by more than half the margin (below ``1 / sqrt(latency_ratio)``; a tiny fp32 reference's CPU time grows
      when other processes thrash the caches: the ratio alone then "improves"; a regression is confirmed by
      timing the two converted models interleaved, so only its direction is checked here);
    * against a pooled baseline (several results), the new median must also lie outside the range of the
      baseline results' own medians (``run_medians``): samples of one job share its conditions, so the
      test alone over-trusts them, and a swing the baseline shows between its own runs is not a change.
    """
    if not latency_comparable(base, new, th):
        return []
    ca, cb = relative_cpu_latency(base), relative_cpu_latency(new)
    ra, rb = relative_latency(base), relative_latency(new)
    ma_raw, mb_raw = statistics.median(base.latency_samples), statistics.median(new.latency_samples)
    if ca and cb:
        a, b, unit, medians = ca, cb, "CPU time relative to fp32", base.run_medians_cpu
        scale = statistics.median(base.cpu_latency_samples)
    elif ra and rb:
        a, b, unit, medians, scale = ra, rb, "relative to fp32", base.run_medians, ma_raw
    else:
        a, b, unit, medians, scale = base.latency_samples, new.latency_samples, "ms", base.run_medians_ms, ma_raw
    ma, mb = statistics.median(a), statistics.median(b)
    if ma <= 0 or mb <= 0 or ma_raw <= 0 or mb_raw <= 0:
        return []
    ratio = mb / ma
    # the change in ms the floor is checked on: with paired fp32 samples, the relative change at the baseline's
    # p50 (the raw p50s of two jobs differ by whatever the machine did between them, either way)
    change = mb_raw - ma_raw if unit == "ms" else scale * (ratio - 1)
    shift = timing_shift(a, b, ratio, change, th.latency_ratio, th.latency_floor_ms, th.latency_p)
    if shift is None:
        return []
    category, p = shift
    if ca and cb:
        own = statistics.median(new.cpu_latency_samples) / statistics.median(base.cpu_latency_samples)
        margin = math.sqrt(th.latency_ratio)  # half the rule's margin (x1.049 for x1.10)
        # a regression only needs the same direction: its confirmation times the two converted models directly
        if (own <= 1) if category == "regression" else (own >= 1 / margin):
            # the ratio moved only because the fp32 reference's CPU time did (a 12 us fp32 model took 29 us of CPU
            # with other jobs' processes thrashing the caches, halving the ratio of an unchanged 0.84 ms model;
            # on a quiet machine an unchanged 0.80 ms model read x0.90 relative, its own CPU p50 x0.9994)
            return []
    if len(medians) >= 2 and (min(medians) <= mb <= max(medians)):
        # within the spread of the baseline's own results: samples of one job are not independent of that
        # job's conditions, so a run-to-run swing the baseline itself shows is not a change of the model
        return []
    severity = "info" if category == "improvement" else ("major" if ratio > 1.5 else "minor")
    # with CPU ratios, the converted model's CPU p50s too: the wall p50s of two jobs measured under different
    # load can move either way whatever the model did
    cpu = (f"; CPU {statistics.median(base.cpu_latency_samples):.4g} ms -> "
           f"{statistics.median(new.cpu_latency_samples):.4g} ms" if ca and cb else "")
    detail = (f"p50 {ma_raw:.4g} ms -> {mb_raw:.4g} ms{cpu} (x{ratio:.2f} {unit}, n={len(a)}/{len(b)}, "
              f"Mann-Whitney p={p:.2g})")
    return [Finding("latency", category, severity, "latency_p50_ms", ma_raw, mb_raw, detail, p)]


def pooled(base: CellSample, others: Sequence[CellSample]) -> CellSample:
    """``base`` with the timing samples of ``others`` (more results of the same revision and cell) appended,
    so a baseline measured several times is compared with all its samples: latency and conversion-time
    samples of results in ``base``'s environment only; latency samples stay paired with their fp32 samples
    only when every pooled result carries paired ones, and CPU-time latency samples are pooled only when every
    pooled result carries paired ones (else none: the rule then compares wall time)."""
    same = [o for o in others if o.env_fingerprint == base.env_fingerprint]
    if not same:
        return base
    timed = [base, *(o for o in same if o.latency_samples)]
    lat = tuple(x for s in timed for x in s.latency_samples)
    paired = all(len(s.fp32_latency_samples) == len(s.latency_samples) for s in timed)
    fp32 = tuple(x for s in timed for x in s.fp32_latency_samples) if paired else ()
    cpu_paired = all(s.cpu_latency_samples and len(s.cpu_latency_samples) == len(s.fp32_cpu_latency_samples)
                     for s in timed)
    cpu = tuple(x for s in timed for x in s.cpu_latency_samples) if cpu_paired else ()
    fp32_cpu = tuple(x for s in timed for x in s.fp32_cpu_latency_samples) if cpu_paired else ()
    conv = tuple(x for s in (base, *same) for x in s.convert_samples)
    refs_paired = all(len(s.convert_reference) == len(s.convert_samples) for s in (base, *same))
    conv_ref = tuple(x for s in (base, *same) for x in s.convert_reference) if refs_paired else ()
    conv_cpu_paired = all(len(s.convert_cpu) == len(s.convert_samples) for s in (base, *same))
    conv_cpu = tuple(x for s in (base, *same) for x in s.convert_cpu) if conv_cpu_paired else ()
    with_samples = [s for s in timed if s.latency_samples]
    run_ms = tuple(statistics.median(s.latency_samples) for s in with_samples)
    rel = [relative_latency(s) for s in with_samples]
    run_rel = tuple(statistics.median(r) for r in rel) if paired and all(rel) else ()
    rel_cpu = [relative_cpu_latency(s) for s in with_samples]
    run_cpu = tuple(statistics.median(r) for r in rel_cpu) if cpu_paired and all(rel_cpu) else ()
    many = len(with_samples) > 1
    return replace(base, latency_samples=lat, fp32_latency_samples=fp32, cpu_latency_samples=cpu,
                   fp32_cpu_latency_samples=fp32_cpu, convert_samples=conv, convert_reference=conv_ref,
                   convert_cpu=conv_cpu, run_medians=run_rel if many else (), run_medians_ms=run_ms if many else (),
                   run_medians_cpu=run_cpu if many else ())


def _can_reach(n: int, m: int, p: float) -> bool:
    """True when a one-sided Mann-Whitney U test with sample sizes ``n`` and ``m`` can give a p below ``p``
    (its smallest exact p-value is ``1 / C(n + m, n)``)."""
    return n > 0 and m > 0 and 1 / math.comb(n + m, n) < p


def _drifted(base_ref: Sequence[float], new_ref: Sequence[float], category: str, ratio_limit: float) -> bool:
    """The reference workload moved between the two jobs in ``category``'s direction (slower for a
    regression) by more than the square root of ``ratio_limit`` (half the rule's margin, x1.095 for x1.20)."""
    drift = statistics.median(new_ref) / statistics.median(base_ref)
    margin = math.sqrt(ratio_limit)
    return drift > margin if category == "regression" else drift < 1 / margin


def relative_conversion(s: CellSample) -> tuple[float, ...]:
    """Each conversion sample divided by the reference workload timed right after it in the same job (empty
    unless paired one to one and positive): what slows the whole machine slows both, what the pass itself
    costs does not slow the reference."""
    a, b = s.convert_samples, s.convert_reference
    if not a or len(a) != len(b) or min(b) <= 0:
        return ()
    return tuple(x / y for x, y in zip(a, b, strict=True))


def conversion_time_comparable(base: CellSample, new: CellSample, th: Thresholds) -> bool:
    """Both converted, same environment fingerprint, at least ``convert_time_min_samples`` conversion-time
    samples per side, and enough in all for the test to be able to reach ``convert_time_p``."""
    a, b = base.convert_samples, new.convert_samples
    return (base.converted and new.converted and base.env_fingerprint is not None
            and base.env_fingerprint == new.env_fingerprint
            and min(len(a), len(b)) >= th.convert_time_min_samples and _can_reach(len(a), len(b), th.convert_time_p))


def conversion_cpu(s: CellSample) -> tuple[float, ...]:
    """The conversion process's CPU seconds, one per conversion-time sample (empty unless paired one to one)."""
    return s.convert_cpu if s.convert_cpu and len(s.convert_cpu) == len(s.convert_samples) else ()


def conversion_time_rule(base: CellSample, new: CellSample, th: Thresholds, model: str,
                         dtype: str) -> list[Finding]:
    """Conversion wall time (the worker's samples of the conversion subprocess) compared like latency: only
    when :func:`conversion_time_comparable`; a regression (improvement) needs the median ratio beyond
    ``convert_time_ratio`` (below its inverse), the median to move by more than ``convert_time_floor_s``
    in the same direction, and one-sided Mann-Whitney U p < ``convert_time_p``; when both sides carry a
    reference workload timed after each sample (:func:`relative_conversion`) and that reference itself moved
    the same way between the two jobs (the machine was slower or faster: :func:`_drifted`), the same test
    must also hold on the samples relative to it (a slowdown of the whole machine is not the pass's).

    **CPU time.**  When both sides carry the conversion process's own CPU seconds beside each wall sample
    (:func:`conversion_cpu`), the wall change is judged by what explains it:

    * *CPU-backed*: the CPU time moved the same way by the same test (ratio beyond ``convert_time_ratio``,
      change beyond ``convert_time_floor_s``, Mann-Whitney p < ``convert_time_p``): the pass computes more
      (or less).  The finding stands without the reference-workload division, because CPU time is not
      inflated by the waiting a busy machine adds (a pass burning +0.5 s of arithmetic is flagged however
      noisy the reference was);
    * *wall-only* (the CPU time did not move): the guard.  The change stands only when it is still beyond the
      rule's margin after dividing out how much the reference workload's median slowed between the two jobs
      (``ratio / drift > convert_time_ratio`` and the change at the baseline's speed beyond the floor), and it
      needs a reference on both sides; the drift check above applies as well.

    Why a wall-only change is not simply dropped: a pass that starts sleeping, waiting on a lock, or doing
    blocking I/O (an fsync, a network fetch) is slower for every user, and it shows in wall time only, so a
    CPU-only rule would pass it silently (the verdict bench's injected ``BUG(slowdown)`` and the confirmation
    tests' slow revisions are sleeps).  What separates it from a busy machine is the reference workload timed
    right after each sample in the same job: load that inflates wall time without CPU time (process start-up,
    file I/O and fsyncs of other jobs, run-queue waits) slows the reference as well and divides out, the
    pass's own waiting does not.  The medians are divided, not each sample: a ~10 ms reference is too short
    for its per-sample ratios to be trusted on a busy machine.  Either kind is then confirmed by timing both
    revisions interleaved before it fails the gate (:mod:`service.regressions.confirm`)."""
    if not conversion_time_comparable(base, new, th):
        return []
    a, b = base.convert_samples, new.convert_samples
    ma, mb = statistics.median(a), statistics.median(b)
    if ma <= 0 or mb <= 0:
        return []
    ratio = mb / ma
    shift = timing_shift(a, b, ratio, mb - ma, th.convert_time_ratio, th.convert_time_floor_s, th.convert_time_p)
    if shift is None:
        return []
    ca, cb = conversion_cpu(base), conversion_cpu(new)
    ra, rb = relative_conversion(base), relative_conversion(new)
    cpu_note, cpu_backed, relative = "", False, ""
    if ca and cb:
        cma, cmb = statistics.median(ca), statistics.median(cb)
        cpu_shift = timing_shift(ca, cb, cmb / cma if cma > 0 else math.inf, cmb - cma, th.convert_time_ratio,
                                 th.convert_time_floor_s, th.convert_time_p)
        cpu_backed = cpu_shift is not None and cpu_shift[0] == shift[0]
        cpu_note = f", CPU {cma:.4g} s -> {cmb:.4g} s{'' if cpu_backed else ' (wall only)'}"
        if not cpu_backed:
            if not (ra and rb):
                return []  # CPU flat and nothing to tell the pass's waiting from the machine's
            drift = statistics.median(new.convert_reference) / statistics.median(base.convert_reference)
            adjusted = ratio / drift if drift > 0 else ratio
            change = ma * (adjusted - 1)
            if not (adjusted > th.convert_time_ratio and change > th.convert_time_floor_s
                    if shift[0] == "regression" else adjusted < 1 / th.convert_time_ratio
                    and -change > th.convert_time_floor_s):
                return []  # within what the machine itself did between the two jobs
            relative = f", x{adjusted:.2f} beyond the reference workload's x{drift:.2f}"
    if not cpu_backed and ra and rb and _drifted(base.convert_reference, new.convert_reference, shift[0],
                                                 th.convert_time_ratio):
        # the machine itself was slower (faster): divided out, the change must show relative to it too
        rel = statistics.median(rb) / statistics.median(ra)
        rel_shift = timing_shift(ra, rb, rel, mb - ma, th.convert_time_ratio, th.convert_time_floor_s,
                                 th.convert_time_p)
        if rel_shift is None or rel_shift[0] != shift[0]:
            return []
        relative = relative or f", x{rel:.2f} relative to the reference workload"
    category, p = shift
    severity = "info" if category == "improvement" else ("major" if ratio > 2 else "minor")
    return [Finding("conversion_time", category, severity, "convert_s", ma, mb,
                    f"conversion {ma:.4g} s -> {mb:.4g} s (x{ratio:.2f}{relative}{cpu_note}, n={len(a)}/{len(b)}, "
                    f"Mann-Whitney p={p:.2g})", p)]


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


Rule = Callable[[CellSample, CellSample, Thresholds, str, str], list[Finding]]
RULES: dict[str, Rule] = {"conversion": conversion_rule, "accuracy": accuracy_rule,
                          "convergence": convergence_rule, "coverage": coverage_rule, "latency": latency_rule,
                          "conversion_time": conversion_time_rule, "pass_convergence": pass_convergence_rule}


def drift_rule(base: CellSample, new: CellSample, th: Thresholds, model: str, dtype: str) -> list[Finding]:
    """``base`` an *older reference* of the cell (not its parent): the first regression, in KINDS order, that
    the rule of a drift-judged kind (:data:`DRIFT_METRICS`) finds between them, with that rule's own limits,
    as a ``drift`` finding of the same metric (its detail prefixed by the kind).  Improvements over a window
    are not drift.  Whether a drift is reported (the step that tips it, confirmation, not twice for one change)
    is :mod:`service.regressions.drift`'s."""
    for kind in dict.fromkeys(DRIFT_METRICS.values()):
        for f in RULES[kind](base, new, th, model, dtype):
            if f.category == "regression" and f.metric in DRIFT_METRICS:
                return [replace(f, kind="drift", detail=f"{kind}: {f.detail}")]
    return []


def source_kind(kind: str, metric: str | None) -> str:
    """The rule kind that judges a finding: its own kind, or for ``drift`` the kind of its metric."""
    return DRIFT_METRICS.get(metric or "", kind) if kind == "drift" else kind


def timing_kind(kind: str, metric: str | None) -> str | None:
    """The timing kind (:data:`TIMING_KINDS`) whose confirmation judges a finding of ``kind`` and ``metric``
    (a drift of conversion time or latency is confirmed as one); None for any other finding."""
    got = source_kind(kind, metric)
    return got if got in TIMING_KINDS else None


RULES["drift"] = drift_rule


def compare_cells(base: CellSample, new: CellSample, th: Thresholds, model: str, dtype: str,
                  kinds: tuple[str, ...] = PAIRWISE_KINDS) -> list[Finding]:
    """All findings of the selected rule kinds for one cell, in KINDS order (by default every kind judged
    against a parent: :data:`PAIRWISE_KINDS`)."""
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
            compute_counts_comparable(base, new)
            or base.low_precision_fraction is not None and new.low_precision_fraction is not None
            or base.casts_inserted is not None and new.casts_inserted is not None)
    if kind == "conversion_time":
        return conversion_time_comparable(base, new, th)
    if kind == "pass_convergence":
        return pass_convergence_comparable(base, new)
    if kind == "drift":
        return any(comparable(k, base, new, th, regressed) for k in dict.fromkeys(DRIFT_METRICS.values()))
    return latency_comparable(base, new, th)


def returned_to_baseline(kind: str, base: CellSample, new: CellSample, th: Thresholds, model: str,
                         dtype: str, regressed: CellSample | None = None) -> bool:
    """True when ``new`` is comparable with ``base`` for ``kind`` and shows no regression of that kind
    (``regressed``: see :func:`comparable`)."""
    if not comparable(kind, base, new, th, regressed):
        return False
    return not any(f.category == "regression" for f in RULES[kind](base, new, th, model, dtype))
