"""Timing helpers shared by the timing kinds (latency, conversion time) and by drift: the one-sided shift test,
per-job ratios to a reference timed interleaved, and pooling a baseline measured several times.  Pure."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import replace

from service.regressions.findings import CellSample
from service.regressions.stats import mann_whitney_p


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


def can_reach(n: int, m: int, p: float) -> bool:
    """True when a one-sided Mann-Whitney U test with sample sizes ``n`` and ``m`` can give a p below ``p``
    (its smallest exact p-value is ``1 / C(n + m, n)``)."""
    return n > 0 and m > 0 and 1 / math.comb(n + m, n) < p


def drifted(base_ref: Sequence[float], new_ref: Sequence[float], category: str, ratio_limit: float) -> bool:
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


def conversion_cpu(s: CellSample) -> tuple[float, ...]:
    """The conversion process's CPU seconds, one per conversion-time sample (empty unless paired one to one)."""
    return s.convert_cpu if s.convert_cpu and len(s.convert_cpu) == len(s.convert_samples) else ()
