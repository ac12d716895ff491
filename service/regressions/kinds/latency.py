"""``latency``: the converted model's p50 moved beyond the limits (asv's rule, made robust to machine drift).
A timing kind: its regressions are suspected until confirmed (:mod:`service.regressions.confirm`)."""

from __future__ import annotations

import math
import statistics

from service.regressions.findings import CellSample, Finding
from service.regressions.kinds.base import Display, FindingKind
from service.regressions.thresholds import Thresholds
from service.regressions.timing import relative_cpu_latency, relative_latency, timing_shift


def latency_comparable(base: CellSample, new: CellSample, th: Thresholds) -> bool:
    """Same environment fingerprint (machine and runtime, not the pass revision) and at least
    ``latency_min_samples`` samples on each side."""
    return (base.env_fingerprint is not None and base.env_fingerprint == new.env_fingerprint
            and min(len(base.latency_samples), len(new.latency_samples)) >= th.latency_min_samples)


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


def latency_limits(th: Thresholds) -> tuple[float, float, float]:
    """The rule's own ratio and floor (ms), and ``confirm_p``."""
    return th.latency_ratio, th.latency_floor_ms, th.confirm_p


KIND = FindingKind("latency", latency_rule, lambda base, new, th, regressed: latency_comparable(base, new, th),
                   Display("reg-latency", "►", "slow", "latency regression",
                           ("#ffedb8", "#4d3800", "#a37a00")), bisection="rule",
                   confirm_limits=latency_limits, drift_metrics=("latency_p50_ms",))
