"""Statistics behind the latency rules: Mann-Whitney U and a windowed change-point test.

Pure functions over numbers; scipy is imported lazily (only detection needs it).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def mann_whitney_p(new: Sequence[float], base: Sequence[float], alternative: str) -> float:
    """One-sided Mann-Whitney U p-value that ``new`` is ``greater``/``less`` than ``base``.

    Identical constant samples give p = 1 (no evidence of a shift).
    """
    if len(set(new) | set(base)) <= 1:
        return 1.0
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(new, base, alternative=alternative).pvalue)


def prediction_p(reference: Sequence[float], x: float, direction: int) -> float:
    """One-sided p-value that ``x`` comes from the population of ``reference`` (t prediction interval).

    ``direction`` +1 tests for ``x`` above, -1 below.  With a zero-spread reference any
    difference in that direction has p = 0.  Needs at least 2 reference points.
    """
    n = len(reference)
    if n < 2:
        raise ValueError("a prediction test needs at least 2 reference points")
    mean = statistics.fmean(reference)
    sd = statistics.stdev(reference)
    diff = (x - mean) * direction
    if sd == 0:
        return 0.0 if diff > 0 else 1.0
    from scipy.stats import t

    stat = diff / (sd * math.sqrt(1 + 1 / n))
    return float(t.sf(stat, df=n - 1))


def shift_violations(series: Sequence[float], window: int, p: float, floor: float, count: int,
                     direction: int = 1) -> list[tuple[float, float]]:
    """Test each of the last ``count`` points of ``series`` against the ``window`` points before them.

    Returns ``[(p_value, ratio_to_reference_mean), ...]`` for the points that violate (p below
    ``p`` and relative change beyond ``floor`` in ``direction``), or an empty list unless **all**
    ``count`` points violate (the "consecutive violations" rule).  The reference window ends
    before the first candidate, so a sustained shift is not absorbed into its own baseline.
    """
    if len(series) < count + 2:
        return []
    ref = list(series[-count - window:-count])
    if len(ref) < 2:
        return []
    mean = statistics.fmean(ref)
    if mean <= 0:
        return []
    out = []
    for x in series[-count:]:
        ratio = x / mean
        beyond = ratio > 1 + floor if direction > 0 else ratio < 1 / (1 + floor)
        pv = prediction_p(ref, x, direction)
        if not (beyond and pv < p):
            return []
        out.append((pv, ratio))
    return out


def count_flips(passed: Sequence[bool]) -> int:
    """How many times a sequence of pass/not-pass outcomes changes value."""
    return sum(1 for a, b in zip(passed, passed[1:], strict=False) if a != b)
