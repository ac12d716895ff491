"""The paired decisions of confirmation (:mod:`service.regressions.confirm`): pure functions of the per-pair
times a confirmation job measured interleaved (:mod:`workers.jobs.confirm`).

* :func:`paired_verdict`: a suspected slowdown is confirmed (candidate slower than baseline beyond the kind's
  ratio limit and floor, one-sided Wilcoxon signed-rank p < ``confirm_p`` on the log ratios);
* :func:`improvement_verdict`: a suspected improvement is confirmed (the mirror: faster beyond the inverse of
  the ratio limit and minus the floor);
* :func:`recovery_verdict`: a suspected recovery is confirmed (the new revision faster than the regressed one,
  mirrored the same way);
* :func:`min_pairs`: the fewest pairs with which the test can reach a significance level at all.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from service.regressions.kinds.registry import kind as finding_kind
from service.regressions.thresholds import Thresholds


@dataclass(frozen=True)
class PairedVerdict:
    """The decision on one suspected finding: ``confirmed``, the median per-pair ratio, the paired test's
    p-value, the median per-pair difference (seconds or ms), and a one-line ``detail``."""

    confirmed: bool
    ratio: float
    p_value: float
    difference: float
    detail: str


def limits(kind: str, th: Thresholds) -> tuple[float, float, float]:
    """(ratio limit, raw floor, p limit) of a timing ``kind``: the rule's own ratio and floor, ``confirm_p``
    (:attr:`FindingKind.confirm_limits <service.regressions.kinds.base.FindingKind>`).  ValueError for a kind that
    is not timed; :class:`~service.regressions.kinds.registry.UnknownKind` for one that is not registered."""
    return finding_kind(kind).limits(th)


def wilcoxon_greater(x: Sequence[float]) -> float:
    """One-sided Wilcoxon signed-rank p-value that ``x`` is centred above 0 (zeros dropped; 1.0 when
    nothing is left).  Exact for up to 25 non-zero values without ties, else scipy's approximation."""
    vals = [v for v in x if v != 0 and math.isfinite(v)]
    if not vals:
        return 1.0
    from scipy.stats import wilcoxon

    exact = len(vals) <= 25 and len({abs(v) for v in vals}) == len(vals)
    res = wilcoxon(vals, alternative="greater", method="exact" if exact else "approx")
    return float(res.pvalue)


def _pair_stats(first: Sequence[float], second: Sequence[float]
                ) -> tuple[list[tuple[float, float]], list[float], float, float]:
    """The pairs timed positive on both sides, their log ratios (second / first), the median ratio and the
    median per-pair difference (second - first); ratio 1.0 and difference 0.0 when no pair qualifies."""
    pairs = [(a, b) for a, b in zip(first, second, strict=False) if a > 0 and b > 0]
    if not pairs:
        return [], [], 1.0, 0.0
    logs = [math.log(b / a) for a, b in pairs]
    return pairs, logs, math.exp(statistics.median(logs)), statistics.median(b - a for a, b in pairs)


def paired_verdict(kind: str, baseline: Sequence[float], candidate: Sequence[float], th: Thresholds,
                   unit: str) -> PairedVerdict:
    """Confirmed when, over the pairs timed interleaved, the median candidate/baseline ratio exceeds the
    kind's ratio limit, the median per-pair difference exceeds its floor, and a one-sided Wilcoxon
    signed-rank test on the log ratios gives p < ``confirm_p``; dismissed otherwise (also when no pair
    has positive times on both sides)."""
    ratio_limit, floor, p_limit = limits(kind, th)
    pairs, logs, ratio, diff = _pair_stats(baseline, candidate)
    if not pairs:
        return PairedVerdict(False, 1.0, 1.0, 0.0, "no pair timed on both sides")
    p = wilcoxon_greater(logs)
    confirmed = ratio > ratio_limit and diff > floor and p < p_limit
    detail = (f"{'confirmed' if confirmed else 'dismissed'} by {len(pairs)} interleaved pairs: median ratio "
              f"x{ratio:.3f} (limit x{ratio_limit:g}), median difference {diff:+.4g} {unit} (floor {floor:g}), "
              f"Wilcoxon p={p:.2g} (limit {p_limit:g})")
    return PairedVerdict(confirmed, ratio, p, diff, detail)


def _faster(kind: str, slow: Sequence[float], fast: Sequence[float], th: Thresholds, unit: str
            ) -> tuple[int, PairedVerdict]:
    """(pairs, verdict): ``fast`` is faster than ``slow`` the way :func:`paired_verdict` demands of a slowdown,
    mirrored: median fast/slow ratio below ``1 / ratio_limit``, median difference below minus the floor,
    one-sided Wilcoxon p < ``confirm_p`` on the log ratios.  ``detail`` holds the figures only."""
    ratio_limit, floor, p_limit = limits(kind, th)
    pairs, logs, ratio, diff = _pair_stats(slow, fast)
    if not pairs:
        return 0, PairedVerdict(False, 1.0, 1.0, 0.0, "")
    p = wilcoxon_greater([-x for x in logs])
    confirmed = ratio < 1 / ratio_limit and diff < -floor and p < p_limit
    figures = (f"median ratio x{ratio:.3f} (limit x{1 / ratio_limit:.3g}), median difference {diff:+.4g} {unit} "
               f"(floor -{floor:g}), Wilcoxon p={p:.2g} (limit {p_limit:g})")
    return len(pairs), PairedVerdict(confirmed, ratio, p, diff, figures)


def improvement_verdict(kind: str, baseline: Sequence[float], candidate: Sequence[float], th: Thresholds,
                        unit: str) -> PairedVerdict:
    """A suspected timing improvement confirmed when, over the pairs timed interleaved, ``candidate`` is faster
    than ``baseline`` beyond the inverse of the kind's ratio limit and its floor with one-sided Wilcoxon
    p < ``confirm_p`` (:func:`paired_verdict` mirrored); dismissed otherwise."""
    n, v = _faster(kind, baseline, candidate, th, unit)
    if not n:
        return replace(v, detail="improvement dismissed: no pair timed on both sides")
    return replace(v, detail=f"improvement {'confirmed' if v.confirmed else 'dismissed'} by {n} interleaved "
                             f"pairs: {v.detail}")


def recovery_verdict(kind: str, regressed: Sequence[float], candidate: Sequence[float], th: Thresholds,
                     unit: str) -> PairedVerdict:
    """Recovery confirmed when, over the pairs timed interleaved, ``candidate`` (the new revision) is faster
    than ``regressed`` (the revision the regression was found at) the way :func:`paired_verdict` demands
    of a slowdown, mirrored: median candidate/regressed ratio below the inverse of the kind's ratio limit,
    median per-pair difference below minus its floor, one-sided Wilcoxon p < ``confirm_p`` on the log
    ratios.  ``ratio`` and ``difference`` are candidate vs regressed."""
    n, v = _faster(kind, regressed, candidate, th, unit)
    if not n:
        return replace(v, detail="recovery not confirmed: no pair timed on both sides")
    return replace(v, detail=f"recovery {'confirmed' if v.confirmed else 'not confirmed'} by {n} interleaved pairs "
                             f"against the regressed revision: {v.detail}")


def min_pairs(p: float) -> int:
    """The fewest pairs with which the one-sided Wilcoxon signed-rank test can give p < ``p`` (its smallest
    exact p-value with ``n`` pairs is ``2 ** -n``): fewer pairs could never confirm anything."""
    if not 0 < p < 1:
        raise ValueError(f"a significance level must lie in (0, 1), got {p!r}")
    n = 1
    while 0.5 ** n >= p:
        n += 1
    return n
